"""The static site's pieces without a browser or npm (tools/classroom_site.py): the index's part
and summary of each notebook, link rewriting, the notes under widgets, and a page's HTML."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import classroom_site as site  # noqa: E402

FIRST_CELL = """# 15 · Speculative decoding

*Part II — speed and memory.* Assumes 06 and 09.

## What you will learn
- A small **draft** model proposes $k$ tokens; the big model checks them in one pass. Then more.
- Second point.
"""


def test_info_reads_title_part_and_first_sentence():
    nb = new_notebook(cells=[new_markdown_cell(FIRST_CELL)])
    info = site.notebook_info(Path("15_speculative_decoding.ipynb"), nb)
    assert info.title == "15 · Speculative decoding"
    assert info.part == "II"
    assert info.summary == ("A small **draft** model proposes $k$ tokens; the big model checks them "
                            "in one pass.")


def test_part_stated_in_the_notebook_wins_over_the_course_map():
    nb = new_notebook(cells=[new_markdown_cell("# 08 · Sampling\n\nPart III — serving many requests\n\nText.")])
    assert site.notebook_info(Path("08_sampling.ipynb"), nb).part == "III"
    plain = new_notebook(cells=[new_markdown_cell("# 12 · Sampling\n\nHow tokens are chosen. More.")])
    info = site.notebook_info(Path("12_sampling.ipynb"), plain)
    assert info.part == "I" and info.summary == "How tokens are chosen."
    assert site.notebook_info(Path("99_unknown.ipynb"), plain).part is None


def test_every_notebook_today_has_a_part_and_a_summary():
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        info = site.notebook_info(path, nbformat.read(str(path), as_version=4))
        assert info.part in site.PARTS, path.name
        assert 10 < len(info.summary) <= 220 and "\n" not in info.summary, (path.name, info.summary)


def test_links_to_notebooks_of_the_site_become_pages():
    names = {"02_attention_by_hand.html", "03_one_decoder_layer.html"}
    text = ("[next](03_one_decoder_layer.ipynb), [anchor](./02_attention_by_hand.ipynb#The-mask), "
            '<a href="03_one_decoder_layer.ipynb">x</a>, [elsewhere](99_missing.ipynb), '
            "[web](https://example.org/03_one_decoder_layer.ipynb)")
    assert site.rewrite_links(text, names) == (
        "[next](03_one_decoder_layer.html), [anchor](./02_attention_by_hand.html#The-mask), "
        '<a href="03_one_decoder_layer.html">x</a>, [elsewhere](99_missing.ipynb), '
        "[web](https://example.org/03_one_decoder_layer.ipynb)")


STATE = {
    "box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_slider", "IPY_MODEL_out"]}},
    "slider": {"model_name": "IntSliderModel", "state": {"layout": "IPY_MODEL_layout"}},
    "layout": {"model_name": "LayoutModel", "state": {}},
    "out": {"model_name": "OutputModel", "state": {"outputs": [{"output_type": "stream", "text": "7"}]}},
    "empty_out": {"model_name": "OutputModel", "state": {"outputs": []}},
    "box2": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_slider", "IPY_MODEL_empty_out"]}},
    "broken": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_gone"]}},
}


def test_widget_view_status():
    assert site.widget_view_status("box", STATE) == "ok"
    assert site.widget_view_status("slider", STATE) == "ok"
    assert site.widget_view_status("box2", STATE) == "blank"
    assert site.widget_view_status("broken", STATE) == "missing"
    assert site.widget_view_status("never_saved", STATE) == "missing"


def _widget_output(model_id: str):
    return new_output("display_data", data={
        site.WIDGET_VIEW: {"model_id": model_id, "version_major": 2, "version_minor": 0},
        "text/plain": "VBox(...)"})


def test_each_widget_view_gets_the_note_that_fits():
    nb = new_notebook(cells=[new_code_cell("w", outputs=[_widget_output(m)], execution_count=1)
                             for m in ("box", "box2", "never_saved")])
    nb.metadata["widgets"] = {site.WIDGET_STATE: {"state": STATE, "version_major": 2, "version_minor": 0}}
    prepared = site.prepare_for_site(nb, set())
    notes = [c.outputs[1]["data"]["text/html"] for c in prepared.cells]
    assert [re.search(r'data-td-widget-note="(\w+)"', n).group(1) for n in notes] == ["ok", "blank", "missing"]
    assert "no kernel" in notes[1] and "not saved" in notes[2]
    assert all(len(c.outputs) == 1 for c in nb.cells)  # the original is untouched


def test_page_loads_only_local_scripts_and_folds_the_solution():
    nb = new_notebook(cells=[
        new_markdown_cell("# 01 · Fixture\n\nMath $a^2$, [next](02_next.ipynb)."),
        new_code_cell("### BEGIN SOLUTION\nsecret = 1\n### END SOLUTION",
                      metadata={"tags": ["solution"], "jupyter": {"source_hidden": True}}),
        new_code_cell("helper = 2", metadata={"jupyter": {"source_hidden": True}}),
        new_code_cell("w", outputs=[_widget_output("box")], execution_count=3),
    ])
    nb.metadata["widgets"] = {site.WIDGET_STATE: {"state": STATE, "version_major": 2, "version_minor": 0}}
    info = site.notebook_info(Path("01_fixture.ipynb"), nb)
    page = site.render_page(site.prepare_for_site(nb, {"02_next.html"}), info, "<nav>n</nav>")
    sources = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert not [s for s in sources if re.match(r"(https?:)?//", s)], sources
    assert "https://unpkg.com" not in page and "cdnjs" not in page
    assert f"{site.STATIC}/html-manager/dist/embed-amd.js" in page
    assert f'src="{site.STATIC}/mathjax/es5/tex-chtml-full.js"' in page
    assert 'href="02_next.html"' in page
    solution = re.search(r'<details class="td-solution">.*?</details>', page, re.S).group(0)
    assert "secret" in solution and "<details open" not in page
    assert re.search(r'<details class="td-hidden-input">.*helper.*?</details>', page, re.S)
    assert page.count("<nav>n</nav>") == 2


def test_an_appendix_gets_its_own_section_after_the_parts():
    nb = new_notebook(cells=[new_markdown_cell(
        "# A1 · Fixture\n\n*Appendix — optional, after Part II — speed and memory.*\n\n"
        "## What you will learn\n- How the library does it.")])
    info = site.notebook_info(Path("A1_fixture.ipynb"), nb)
    assert info.part == "A" and list(site.PARTS)[-1] == "A"  # not Part II, though the first cell names it
