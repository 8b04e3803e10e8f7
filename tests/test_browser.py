"""Every notebook in JupyterLab, in headless Chromium: runs without errors, its widgets render as
widgets, and moving one of them changes what it draws (issue 7).

nbval checks the kernel side only; this checks what a reader sees. Machinery: tests/labdriver.py.

- Needs Debian's Chromium (`apt-get update && apt-get install -y chromium`) and the Python
  `playwright` package (no `playwright install`: the browser is /usr/bin/chromium). Without them
  the suite is skipped with one line; TINYDECODER_REQUIRE_BROWSER=1 (set by CI) makes that a failure.
  TINYDECODER_CHROMIUM overrides the browser's path.
- The notebooks are copied into a temporary root: the files in notebooks/ are never opened by the
  server, saved or checkpointed. One server and one browser tab serve all notebooks; each
  notebook's kernel is shut down after its test. Server and browser stop at the end, also on failure.
- On failure, a screenshot, the page's console log and the server log go to
  test-artifacts/browser/ (or TINYDECODER_BROWSER_ARTIFACTS); the failure message gives the paths.
  TINYDECODER_BROWSER_SCREENSHOTS=1 also saves NAME.passed.png, scrolled to the widget it moved.
- Without the widget extension the suite fails, as it should. test_fails_without_widget_extension
  checks that on every run (a second server, extension disabled, on a small notebook of its own).
  To see it on every notebook, disable the extension in a throw-away config directory:
      export JUPYTER_CONFIG_DIR=$(mktemp -d)
      .venv/bin/jupyter labextension disable --level=user @jupyter-widgets/jupyterlab-manager
      .venv/bin/python -m pytest -q tests/test_browser.py
  or set TINYDECODER_BROWSER_DISABLE_EXTENSIONS=@jupyter-widgets/jupyterlab-manager (names to
  disable, comma-separated, in the test server only).
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

import pytest

if str(Path(__file__).resolve().parent) not in sys.path:  # also under --import-mode=importlib
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from labdriver import ANNOUNCEMENTS, CHROMIUM, WIDGET_MANAGER, LabPage, LabServer, NotebookCheckFailure, launch_chromium

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
ARTIFACTS = Path(os.environ.get("TINYDECODER_BROWSER_ARTIFACTS", REPO / "test-artifacts" / "browser"))
CHROMIUM_PATH = os.environ.get("TINYDECODER_CHROMIUM", CHROMIUM)
REQUIRE = os.environ.get("TINYDECODER_REQUIRE_BROWSER", "").strip().lower() in {"1", "true", "yes"}
SCREENSHOTS = os.environ.get("TINYDECODER_BROWSER_SCREENSHOTS", "") not in {"", "0"}
EXTRA_DISABLED = tuple(name.strip() for name in
                       os.environ.get("TINYDECODER_BROWSER_DISABLE_EXTENSIONS", "").split(",")
                       if name.strip())


def _missing() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return ("the Python package playwright is missing: install it with "
                "`.venv/bin/pip install playwright` (no `playwright install` needed)")
    if not os.access(CHROMIUM_PATH, os.X_OK):
        return (f"Chromium not found at {CHROMIUM_PATH}: install it with "
                "`apt-get update && apt-get install -y chromium`")
    if importlib.util.find_spec("jupyterlab") is None:
        return "jupyterlab is missing: install it with `.venv/bin/pip install -e '.[lab,test]'`"
    return None


MISSING = _missing()
if MISSING and not REQUIRE:  # one line for the whole module
    pytest.skip(f"browser suite skipped: {MISSING} "
                "(TINYDECODER_REQUIRE_BROWSER=1 makes this a failure)", allow_module_level=True)


@pytest.fixture(scope="module")
def browser_available():
    """With TINYDECODER_REQUIRE_BROWSER set, a missing browser fails every selected test."""
    if MISSING:
        pytest.fail(f"browser suite: {MISSING} (TINYDECODER_REQUIRE_BROWSER is set)", pytrace=False)


# --- small notebooks that prove the checker itself can pass and fail --------------------------
_IMPORTS = "import ipywidgets as W\nimport matplotlib.pyplot as plt\nimport numpy as np"
_SLIDER_PLOT = """\
@W.interact(n=W.IntSlider(value=3, min=1, max=10, description='points'))
def draw(n):
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot(np.arange(n) ** 2, marker='o')
    plt.show()"""
_DROPDOWN_TEXT = """\
letter = W.Dropdown(options=['a', 'b', 'c'], description='letter')
out = W.Output()
def show(change=None):
    out.clear_output()
    with out:
        print('chosen:', letter.value)
letter.observe(show, 'value')
show()
W.VBox([letter, out])"""
_INERT = """\
frozen = W.IntSlider(value=3, min=1, max=10, description='ignored')
still = W.Output()
with still:
    print('this never changes')
W.VBox([frozen, still])"""
_SELECTION_HTML = """\
size = W.SelectionSlider(options=['small', 'medium', 'large'], value='medium', description='size')
label = W.HTML()
def describe(change=None):
    label.value = f'<b>{size.value}</b> has {len(size.value)} letters'
size.observe(describe, 'value')
describe()
W.HBox([size, label])"""
SELFTEST = {
    "widgets.ipynb": [_IMPORTS, _SLIDER_PLOT, _DROPDOWN_TEXT, _INERT, _SELECTION_HTML],
    "raises.ipynb": ["print('before')", "raise ValueError('expected')", "1 / 0",
                     "print('not reached')"],
}
EXPECTED_ERROR = {"raises.ipynb": 1}  # cell index tagged raises-exception


def _write_selftest(directory: Path) -> None:
    import nbformat

    directory.mkdir(parents=True)
    for name, sources in SELFTEST.items():
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                     "language": "python"}
        nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
        if name in EXPECTED_ERROR:
            nb.cells[EXPECTED_ERROR[name]].metadata["tags"] = ["raises-exception"]
        nbformat.write(nb, directory / name)


# --- fixtures: one root, one server, one browser, one tab for the whole module ----------------
@pytest.fixture(scope="module")
def lab_root(browser_available, tmp_path_factory):
    root = tmp_path_factory.mktemp("lab_root")
    if (REPO / "notebooks").is_dir():
        shutil.copytree(REPO / "notebooks", root / "notebooks",
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    _write_selftest(root / "_selftest")
    return root


def _start_server(request, root: Path, work: Path, disabled) -> LabServer:
    server = LabServer(root, work, disabled_extensions=disabled)
    request.addfinalizer(server.stop)  # before start(): a half-started server is stopped too
    return server.start()


@pytest.fixture(scope="module")
def lab_server(request, lab_root, tmp_path_factory):
    return _start_server(request, lab_root, tmp_path_factory.mktemp("lab_server"),
                         (ANNOUNCEMENTS, *EXTRA_DISABLED))


@pytest.fixture(scope="module")
def chromium(browser_available, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = launch_chromium(playwright, tmp_path_factory.mktemp("chromium_profile"),
                                  CHROMIUM_PATH)
        try:
            yield context
        finally:
            context.close()


@pytest.fixture(scope="module")
def lab(chromium, lab_server):
    page = LabPage(chromium, lab_server)
    try:
        page.load()
        yield page
    finally:
        page.close()


@contextlib.contextmanager
def evidence(lab: LabPage, name: str):
    """Close the notebook afterwards; on failure save screenshot and logs, name them in the message."""
    for old in ARTIFACTS.glob(f"{name}.*"):
        old.unlink()
    console_from = len(lab.console)
    failure = None
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - every failure gets its evidence
        if isinstance(exc, NotebookCheckFailure):
            failure, cell = str(exc), exc.cell
        else:  # a timeout or a broken page: the traceback says where
            failure, cell = "".join(traceback.format_exception(exc)).rstrip(), None
        try:
            saved = lab.save_artifacts(ARTIFACTS, name, console_from, cell)
            failure += "".join(f"\n  saved: {path}" for path in saved)
        except Exception as save_exc:  # noqa: BLE001
            failure += f"\n  (could not save screenshot and logs: {save_exc})"
    finally:
        lab.close_notebook()
    if failure is not None:
        pytest.fail(f"{name}: {failure}", pytrace=False)


# --- the tests ---------------------------------------------------------------------------------
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[nb.stem for nb in NOTEBOOKS])
def test_notebook_in_browser(lab, notebook):
    start = time.monotonic()
    with evidence(lab, notebook.stem):
        n_widgets, moved = lab.check_notebook(f"notebooks/{notebook.name}")
        if SCREENSHOTS:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            lab.screenshot(ARTIFACTS / f"{notebook.stem}.passed.png", moved.cell)
    print(f"{notebook.name}: {n_widgets} widget(s) rendered; moved {moved.description} "
          f"{moved.before!r} -> {moved.after!r}; {time.monotonic() - start:.1f} s")


def test_checker_passes_working_widgets_and_catches_an_inert_one(lab):
    """A slider redrawing a figure, a dropdown reprinting text and a selection slider rewriting an
    HTML widget count as working; a slider whose Output never changes does not."""
    with evidence(lab, "selftest_widgets"):
        n_widgets, first = lab.check_notebook("_selftest/widgets.ipynb")
        assert n_widgets == 4
        assert first.kind == "slider" and "points" in first.description
        controls = {c["description"]: c for c in lab.controls()}
        assert sorted(controls) == ["ignored", "letter", "points", "size"]
        assert lab.exercise(controls["points"]).after == "5"  # 3 -> 4 earlier, now 4 -> 5
        assert lab.exercise(controls["letter"]).after == "b"
        assert lab.exercise(controls["size"]).after == "large"
        lab.change_timeout_s, saved = 2.0, lab.change_timeout_s
        try:
            with pytest.raises(NotebookCheckFailure, match=r"'ignored'.*did not change any Output"):
                lab.exercise(controls["ignored"])
        finally:
            lab.change_timeout_s = saved


def test_checker_reports_cell_errors(lab):
    """Cell 1 raises too, but is tagged raises-exception: Run All goes on, and cell 2 is reported."""
    with evidence(lab, "selftest_raises"):
        with pytest.raises(NotebookCheckFailure, match=r"cell 2 shows an error: ZeroDivisionError"):
            lab.check_notebook("_selftest/raises.ipynb")


def test_fails_without_widget_extension(request, chromium, lab_root, tmp_path_factory):
    """With @jupyter-widgets/jupyterlab-manager disabled (in a second, private server) the page
    shows `interactive(children=(IntSlider(value=3, ...` as text, and the check must say so."""
    server = _start_server(request, lab_root, tmp_path_factory.mktemp("lab_server_no_widgets"),
                           (ANNOUNCEMENTS, WIDGET_MANAGER))
    page = LabPage(chromium, server)
    try:
        with evidence(page, "selftest_no_widget_extension"):
            page.load()
            with pytest.raises(NotebookCheckFailure, match=r"text fallback.*IntSlider\(value=3"):
                page.check_notebook("_selftest/widgets.ipynb")
    finally:
        page.close()
        server.stop()
