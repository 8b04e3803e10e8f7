"""The static site (`make site`, tools/classroom_site.py) in headless Chromium with the network
off: the index and three pages, their figures, a widget drawn as a control from its saved state,
MathJax, folded solutions and the links between pages (issue 15).

The site is built into a temporary folder from copies of the first three notebooks; one copy
gets an exercise with a solution cell and a link written as `NN_name.ipynb`, so the folding and
the link rewriting are checked whatever the notebooks carry today. The pages are opened from
file://; every request that is not file:// is aborted and recorded, and the test fails if there
is any. Needs Chromium, playwright and npm (or the tarballs in build/classroom-npm/); skipped
otherwise, a failure when TINYDECODER_REQUIRE_BROWSER=1.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(REPO / "tools"))
import classroom_site  # noqa: E402

from labdriver import CHROMIUM, launch_chromium  # noqa: E402

pytestmark = pytest.mark.browser

CHROMIUM_PATH = os.environ.get("TINYDECODER_CHROMIUM", CHROMIUM)
REQUIRE = os.environ.get("TINYDECODER_REQUIRE_BROWSER", "").strip().lower() in {"1", "true", "yes"}
NPM_CACHE = REPO / "build" / "classroom-npm"


def _missing() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "the Python package playwright is missing"
    if not os.access(CHROMIUM_PATH, os.X_OK):
        return f"Chromium not found at {CHROMIUM_PATH} (apt-get install -y chromium)"
    cached = all((NPM_CACHE / classroom_site._tarball_name(p, v)).exists()
                 for p, v, _ in classroom_site.ASSETS.values())
    if not cached and shutil.which("npm") is None:
        return "npm is missing (make site fetches the widget manager and MathJax with it)"
    return None


MISSING = _missing()
if MISSING and not REQUIRE:
    pytest.skip(f"site browser test skipped: {MISSING}", allow_module_level=True)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if MISSING:
        pytest.fail(f"site browser test: {MISSING} (TINYDECODER_REQUIRE_BROWSER is set)", pytrace=False)
    root = tmp_path_factory.mktemp("site")
    notebooks = sorted((REPO / "notebooks").glob("*.ipynb"))[:3]
    copies = []
    for i, path in enumerate(notebooks):
        nb = nbformat.read(str(path), as_version=4)
        if i == 0:
            nb.cells += [
                new_markdown_cell(f"Next: [the next notebook]({notebooks[1].name})."),
                new_code_cell("### BEGIN SOLUTION\nanswer = 14  # site-test-secret\n### END SOLUTION",
                              metadata={"tags": ["solution"], "jupyter": {"source_hidden": True}}),
            ]
        copies.append(root / path.name)
        nbformat.write(nb, str(copies[-1]))
    index = classroom_site.build_site(copies, root / "site", NPM_CACHE)
    return index, [c.stem for c in copies]


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = launch_chromium(playwright, tmp_path_factory.mktemp("chromium"), CHROMIUM_PATH)
        external = []

        def route(r):
            if r.request.url.startswith("file://"):
                r.continue_()
            else:
                external.append(r.request.url)
                r.abort()

        context.route("**/*", route)
        try:
            yield context, external
        finally:
            context.close()


def open_page(context, url: str):
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url)
    page.wait_for_load_state("load")
    return page, errors


IMAGES_LOADED = """() => Array.from(document.querySelectorAll('.jp-OutputArea-output img'))
    .map(img => ({complete: img.complete, width: img.naturalWidth, shown: img.offsetWidth}))"""


def test_index_lists_the_pages_and_its_links_work(site, browser):
    index, stems = site
    context, external = browser
    page, errors = open_page(context, index.as_uri())
    hrefs = page.eval_on_selector_all("section.td-part a", "as => as.map(a => a.getAttribute('href'))")
    assert hrefs == [f"{s}.html" for s in stems]
    assert page.locator("section.td-part h2").first.inner_text().startswith("Part I")
    assert page.locator("section.td-part td:nth-child(2)").first.inner_text().strip() != ""
    page.locator("section.td-part a").nth(1).click()
    page.wait_for_load_state("load")
    assert page.url.endswith(f"/{stems[1]}.html")
    assert page.locator("h1").first.inner_text().strip() != ""
    assert errors == [] and external == []
    page.close()


def test_pages_show_figures_widgets_math_and_folded_solutions(site, browser):
    index, stems = site
    context, external = browser
    n_controls = 0
    for stem in stems:
        page, errors = open_page(context, (index.parent / f"{stem}.html").as_uri())
        page.wait_for_function("() => !document.querySelector('script[type=\"application/vnd.jupyter.widget-view+json\"]')"
                               " || document.querySelector('.widget-box, .widget-slider, .widget-dropdown,"
                               " .widget-output, .jupyter-widgets-error-widget')", timeout=20_000)
        page.wait_for_timeout(500)
        images = page.evaluate(IMAGES_LOADED)
        assert images and all(i["complete"] and i["width"] > 0 and i["shown"] > 0 for i in images), (stem, images)
        assert page.locator(".jupyter-widgets-error-widget").count() == 0, stem
        n_controls += page.locator(".widget-slider, .widget-dropdown select, .widget-toggle-buttons").count()
        views = page.locator('script[type="application/vnd.jupyter.widget-view+json"]').count()
        assert page.locator("[data-td-widget-note]").count() == views, stem
        math = page.evaluate("() => document.body.innerText.includes('$')"
                             " ? document.querySelectorAll('mjx-container').length : -1")
        assert math != 0, f"{stem}: raw $...$ left but MathJax typeset nothing"
        for details in page.locator("details.td-solution").all():
            assert details.get_attribute("open") is None
            assert not details.locator("pre, .cm-editor").first.is_visible()
        assert errors == [], (stem, errors)
        page.close()
    assert n_controls > 0, "no widget was drawn as a control"
    assert external == [], f"the pages asked the network for: {external[:5]}"


def test_solution_is_folded_and_ipynb_links_point_to_pages(site, browser):
    index, stems = site
    context, external = browser
    page, errors = open_page(context, (index.parent / f"{stems[0]}.html").as_uri())
    solutions = page.locator("details.td-solution")
    own = sum("solution" in c.metadata.get("tags", []) for c in nbformat.read(str(REPO / "notebooks" / f"{stems[0]}.ipynb"),
                                                                             as_version=4).cells)
    assert solutions.count() == own + 1  # the notebook's exercises and the one this test added
    solution = solutions.last
    assert not page.get_by_text("site-test-secret").is_visible()
    solution.locator("summary").click()
    assert page.get_by_text("site-test-secret").is_visible()
    link = page.locator(f'a[href="{stems[1]}.html"]').filter(has_text="the next notebook")
    assert page.locator('a[href$=".ipynb"]').count() == 0
    link.click()
    page.wait_for_load_state("load")
    assert page.url.endswith(f"/{stems[1]}.html")
    page.locator("nav.td-nav a.td-nav-next").first.click()
    page.wait_for_load_state("load")
    assert page.url.endswith(f"/{stems[2]}.html")
    page.locator("nav.td-nav a.td-nav-index").first.click()
    page.wait_for_load_state("load")
    assert page.url.endswith("/index.html")
    assert errors == [] and external == []
    page.close()
