"""The static site (`python tools/classroom.py site`, `make site`): one HTML page per notebook
(nbconvert's HTML exporter, lab template, extended in tools/site_template/classroom/) and an index.

- Figures are the notebooks' stored PNG outputs, embedded as data URIs.
- Widgets show their stored state (nbconvert keeps it in the page), drawn by the HTML widget manager
  `@jupyter-widgets/html-manager` without a kernel. A note under each widget says that its
  controls need a running kernel; where the saved state has nothing to show (an interact whose
  Output was never captured, a model that was not saved) the note says so instead of a blank.
- The widget manager, RequireJS and MathJax come from the npm registry at build time (`npm pack`,
  versions pinned in ASSETS, tarballs cached in build/classroom-npm/) and are copied into
  site/_static/; the pages load nothing from the network.
- Solution cells are folded into <details> (closed); other hidden inputs too.
- Links to `NN_name.ipynb` between notebooks become `NN_name.html`; every page has a bar with the
  index and the previous and next notebook.
"""
from __future__ import annotations

import copy
import fnmatch
import html
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "site_template"
STATIC = "_static"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

# npm package, version, files to copy (globs inside the package). Bump together with ipywidgets 8
# (html-manager 1.x renders ipywidgets 8 state) and test with `make site` + the browser test.
ASSETS = {
    "html-manager": ("@jupyter-widgets/html-manager", "1.0.15",
                     ["LICENSE", "package.json", "dist/embed-amd.js", "dist/embed.js.LICENSE.txt",
                      "dist/*.woff", "dist/*.woff2", "dist/*.ttf", "dist/*.eot", "dist/*.svg"]),
    "requirejs": ("requirejs", "2.3.7", ["package.json", "README.md", "require.js"]),
    "mathjax": ("mathjax", "3.2.2", ["LICENSE", "package.json", "es5/tex-chtml-full.js",
                                     "es5/output/chtml/fonts/woff-v2/*.woff"]),
}

PARTS = {
    "I": "Part I — one request, step by step",
    "II": "Part II — speed and memory",
    "III": "Part III — serving many requests",
    "IV": "Part IV — beyond one process",
    "V": "Part V — what modern engines add",
    "A": "Appendix — optional, for readers who want the library's internals",
}
# The course map by notebook slug (the name without its number), for notebooks whose first cell
# does not yet say which part they belong to. What the first cell says wins.
COURSE_MAP = {
    "I": ["tokens_and_embeddings", "attention_by_hand", "one_decoder_layer", "rope",
          "grouped_query_attention", "prefill_vs_decode", "kv_cache_reuse", "a_real_model",
          "sampling", "decoding_strategies"],
    "II": ["roofline", "flash_attention", "quantization", "long_context", "speculative_decoding"],
    "III": ["kv_cache_capacity", "paged_cache", "prefix_caching", "chunked_prefill", "continuous_batching",
            "openai_server"],
    "IV": ["tensor_parallel", "disaggregated_prefill_decode"],
    "V": ["mixture_of_experts", "structured_output"],
}
PART_RE = re.compile(r"Part\s+(III|II|IV|I|V)\b\s*[—–-]")
LINK_RE = re.compile(r"""(\]\(\s*<?|href\s*=\s*["'])(\.?/?)([\w.-]+)\.ipynb(?=[#)"'>\s])""")

NOTE_LIVE = ("Saved widget state: this is what the widget showed when the notebook last ran. "
             "Its controls need a running Python kernel: run the notebook in JupyterLab or on "
             "Binder to move them.")
NOTE_BLANK = ("This widget draws its output with Python when you move it, and this static page "
              "has no kernel: its output is not shown here. Run the notebook in JupyterLab or on "
              "Binder to use it.")
NOTE_MISSING = ("This widget's state was not saved with the notebook, so it cannot be drawn "
                "without a running kernel. Run the notebook in JupyterLab or on Binder to see it.")


@dataclass
class NotebookInfo:
    path: Path
    stem: str
    title: str
    part: str | None  # "I", "II", "III", ..., "A" (an appendix) or None
    summary: str      # markdown, one line

    @property
    def html_name(self) -> str:
        return self.stem + ".html"


# -- what the index says about each notebook --------------------------------------------------
def notebook_info(path: Path, nb) -> NotebookInfo:
    first = next((c.source for c in nb.cells if c.cell_type == "markdown"), "")
    title = next((line[2:].strip() for line in first.splitlines() if line.startswith("# ")), path.stem)
    match = PART_RE.search(first)
    slug = re.sub(r"^\d+_", "", path.stem)
    part = match.group(1) if match else next((p for p, slugs in COURSE_MAP.items() if slug in slugs), None)
    if re.match(r"A\d+_", path.stem):  # A1_name.ipynb: an appendix, whatever part its first cell mentions
        part = "A"
    return NotebookInfo(path, path.stem, title, part, one_line_summary(first))


def one_line_summary(first_cell: str) -> str:
    """The first sentence of the first "What you will learn" item (else of the first paragraph
    that is not a heading or the part line), on one line."""
    learn = re.search(r"What you will learn[^\n]*\n+\s*[-*]\s+(.*?)(?=\n\s*[-*]\s|\n\s*\n|\Z)",
                      first_cell, re.S)
    if learn:
        text = learn.group(1)
    else:
        paragraphs = [p for p in re.split(r"\n\s*\n", first_cell)
                      if p.strip() and not p.lstrip().startswith("#") and not PART_RE.search(p)]
        text = paragraphs[0] if paragraphs else ""
    text = " ".join(text.split())
    sentence = re.match(r"(.+?[.!?])(?=\s+[A-Z*`$])", text)
    text = sentence.group(1) if sentence else text
    if len(text) > 200:
        for sep in (" — ", "; ", ": "):
            if sep in text[:200]:
                return text[: text.index(sep)] + "."
    return text


# -- notebook preprocessing ---------------------------------------------------------------------
def rewrite_links(markdown: str, html_names: set[str]) -> str:
    """`[x](NN_name.ipynb#anchor)` and `href="NN_name.ipynb"` -> `.html`, for pages of the site."""
    def repl(m):
        name = m.group(3)
        if f"{name}.html" not in html_names:
            return m.group(0)
        return f"{m.group(1)}{m.group(2)}{name}.html"

    return LINK_RE.sub(repl, markdown)


def _models_under(model_id: str, state: dict, seen: set) -> list[str]:
    if model_id in seen:
        return []
    seen.add(model_id)
    found = [model_id]
    stack = [state.get(model_id, {}).get("state", {})]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str) and value.startswith("IPY_MODEL_"):
            found += _models_under(value[len("IPY_MODEL_"):], state, seen)
    return found


def widget_view_status(model_id: str, state: dict) -> str:
    """'ok', 'blank' (an Output widget in the view has no saved output) or 'missing'."""
    models = _models_under(model_id, state, set())
    if any(m not in state for m in models):
        return "missing"
    for m in models:
        if state[m].get("model_name") == "OutputModel" and not state[m].get("state", {}).get("outputs"):
            return "blank"
    return "ok"


def _note_output(status: str):
    text, cls = {"ok": (NOTE_LIVE, "td-widget-note"), "blank": (NOTE_BLANK, "td-widget-note td-widget-blank"),
                 "missing": (NOTE_MISSING, "td-widget-note td-widget-missing")}[status]
    return nbformat.v4.new_output("display_data", data={
        "text/html": f'<div class="{cls}" data-td-widget-note="{status}">{html.escape(text)}</div>',
        "text/plain": text})


def prepare_for_site(nb, html_names: set[str]):
    """A copy of `nb` with its links rewritten and a note after each widget view."""
    nb = copy.deepcopy(nb)
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = rewrite_links(cell.source, html_names)
        if cell.cell_type != "code":
            continue
        outputs = []
        for output in cell.outputs:
            outputs.append(output)
            view = output.get("data", {}).get(WIDGET_VIEW)
            if view:
                outputs.append(_note_output(widget_view_status(view["model_id"], state)))
        cell.outputs = outputs
    return nb


# -- scripts from npm -------------------------------------------------------------------------
def _tarball_name(package: str, version: str) -> str:
    return f"{package.lstrip('@').replace('/', '-')}-{version}.tgz"


def fetch_assets(static_dir: Path, npm_cache: Path) -> list[str]:
    """Copy the pinned scripts into static_dir (npm pack into npm_cache first, once)."""
    import tarfile

    npm_cache.mkdir(parents=True, exist_ok=True)
    lines = []
    for folder, (package, version, patterns) in ASSETS.items():
        tarball = npm_cache / _tarball_name(package, version)
        if not tarball.exists():
            npm = shutil.which("npm")
            if npm is None:
                raise RuntimeError("make site needs npm (Node.js) to fetch "
                                   f"{package}@{version}: install nodejs/npm, or put {tarball.name} "
                                   f"into {npm_cache}")
            run = subprocess.run([npm, "pack", f"{package}@{version}", "--pack-destination",
                                  str(npm_cache), "--silent"], capture_output=True, text=True)
            if run.returncode != 0 or not tarball.exists():
                raise RuntimeError(f"npm pack {package}@{version} failed:\n{run.stderr[-2000:]}")
        target = static_dir / folder
        n_files = 0
        with tarfile.open(tarball) as tar:
            for member in tar.getmembers():
                name = member.name.split("/", 1)[1] if "/" in member.name else member.name
                if not member.isfile() or ".." in Path(name).parts:
                    continue
                if any(fnmatch.fnmatchcase(name, p) for p in patterns):
                    dest = target / name
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(tar.extractfile(member).read())
                    n_files += 1
        license_ = json.loads((target / "package.json").read_text()).get("license", "?")
        lines.append(f"{package}@{version} ({license_}, {n_files} files) -> {STATIC}/{folder}/")
    (static_dir / "ASSETS.txt").write_text(
        "Scripts bundled by tools/classroom_site.py (npm pack, then copied):\n" + "\n".join(lines) + "\n")
    return lines


# -- pages ------------------------------------------------------------------------------------
def _nav(infos: list[NotebookInfo], i: int) -> str:
    links = ['<a class="td-nav-index" href="index.html">Index</a>']
    if i > 0:
        links.append(f'<a class="td-nav-prev" href="{infos[i - 1].html_name}">← {html.escape(infos[i - 1].title)}</a>')
    if i + 1 < len(infos):
        links.append(f'<a class="td-nav-next" href="{infos[i + 1].html_name}">{html.escape(infos[i + 1].title)} →</a>')
    return '<nav class="td-nav">' + " · ".join(links) + "</nav>"


def render_page(nb, info: NotebookInfo, nav: str) -> str:
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="classroom", extra_template_basedirs=[str(TEMPLATES)])
    exporter.require_js_url = f"{STATIC}/requirejs/require.js"
    exporter.widget_renderer_url = f"{STATIC}/html-manager/dist/embed-amd.js"
    exporter.embed_images = True
    body, _ = exporter.from_notebook_node(nb, resources={
        "metadata": {"name": info.title}, "td_static": STATIC, "td_nav": nav})
    return body


def _markdown_inline(text: str) -> str:
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    rendered = markdown2html_mistune(text).strip()
    return re.sub(r"^<p>(.*)</p>$", r"\1", rendered, flags=re.S)


def render_index(infos: list[NotebookInfo], assets: list[str]) -> str:
    groups = {key: [i for i in infos if i.part == key] for key in PARTS}
    others = [i for i in infos if i.part not in PARTS]
    map_lines, sections = [], []
    for key, title in list(PARTS.items()) + ([("other", "Other notebooks")] if others else []):
        members = groups.get(key, others)
        if not members:
            continue
        map_lines.append(f"<li><strong>{html.escape(title)}</strong>: " + " → ".join(
            f'<a href="{i.html_name}">{html.escape(i.stem.split("_")[0])}</a>' for i in members) + "</li>")
        rows = "\n".join(
            f'<tr><td><a href="{i.html_name}">{html.escape(i.title)}</a></td>'
            f"<td>{_markdown_inline(i.summary)}</td></tr>" for i in members)
        sections.append(f'<section class="td-part" id="part-{key}"><h2>{html.escape(title)}</h2>\n'
                        f"<table><thead><tr><th>notebook</th><th>what you will learn</th></tr></thead>"
                        f"<tbody>\n{rows}\n</tbody></table></section>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>tinydecoder — how an LLM executes a request</title>
<script src="{STATIC}/mathjax-config.js"></script>
<script defer src="{STATIC}/mathjax/es5/tex-chtml-full.js"></script>
<link rel="stylesheet" href="{STATIC}/classroom.css">
</head><body class="td-index"><main>
<h1>tinydecoder — how an LLM executes a request</h1>
<p>A Jupyter course on a small numpy decoder that also runs SmolLM2-135M. These pages are the
notebooks with their stored outputs: read them without running anything. Widgets show their saved
state; to move them, run the notebooks in JupyterLab or on Binder. Solutions are folded:
open them after you have tried the exercise.</p>
<h2>Course map</h2>
<ul class="td-map">
{chr(10).join(map_lines)}
</ul>
{chr(10).join(sections)}
<footer><p>Built by <code>make site</code> from the notebooks' stored outputs. Scripts bundled
in <code>{STATIC}/</code>: {html.escape("; ".join(assets))}.</p></footer>
</main></body></html>
"""


# MathJax 3 configuration (loaded before MathJax itself). The widget manager typesets widget labels
# with the MathJax 2 call `MathJax.Hub.Queue(["Typeset", MathJax.Hub, element])`: a small shim
# forwards it to MathJax 3's typesetPromise.
MATHJAX_CONFIG = """window.MathJax = {
  tex: {inlineMath: [['$', '$'], ['\\\\(', '\\\\)']], displayMath: [['$$', '$$'], ['\\\\[', '\\\\]']],
        processEscapes: true, processEnvironments: true, tags: 'ams'},
  startup: {ready: function () { MathJax.startup.defaultReady(); MathJax.Hub = hub; }}
};
var hub = {Queue: function (job) {
  var element = job && job[2], mj = window.MathJax;
  if (!element || !mj) return;
  var ready = mj.startup && mj.startup.promise ? mj.startup.promise : Promise.resolve();
  ready.then(function () { return window.MathJax.typesetPromise([element]); }).catch(function () {});
}};
window.MathJax.Hub = hub;
"""

CSS = """
.td-nav { margin: 0.5em 0 1em; padding: 0.4em 0.8em; background: #f3f5f7; border-radius: 4px;
          font-family: var(--jp-ui-font-family, sans-serif); font-size: 0.95em; }
details.td-solution, details.td-hidden-input { margin: 0.3em 0; border-left: 3px solid #c8d3dc;
                                               padding-left: 0.5em; }
details.td-solution > summary, details.td-hidden-input > summary { cursor: pointer; color: #35617f;
    font-family: var(--jp-ui-font-family, sans-serif); font-size: 0.95em; }
.td-widget-note { font-size: 0.9em; color: #555; background: #fff8e1; border-left: 3px solid #e0b000;
                  padding: 0.3em 0.6em; margin: 0.2em 0; }
.td-widget-note.td-widget-blank, .td-widget-note.td-widget-missing { color: #333; font-weight: 600; }
body.td-index main { max-width: 60em; margin: 2em auto; font-family: sans-serif; line-height: 1.45; }
body.td-index table { border-collapse: collapse; width: 100%; }
body.td-index td, body.td-index th { border-bottom: 1px solid #ddd; padding: 0.35em 0.5em;
                                     text-align: left; vertical-align: top; }
body.td-index td:first-child { white-space: nowrap; }
"""


def build_site(notebooks: list[Path], out_dir: Path, npm_cache: Path) -> Path:
    """Write out_dir/index.html, one page per notebook and out_dir/_static/; returns the index."""
    nbs = [nbformat.read(str(p), as_version=4) for p in notebooks]
    infos = [notebook_info(p, nb) for p, nb in zip(notebooks, nbs)]
    order = {part: i for i, part in enumerate(PARTS)}
    pairs = sorted(zip(infos, nbs), key=lambda pair: (order.get(pair[0].part, len(PARTS)), pair[0].stem))
    infos, nbs = [p[0] for p in pairs], [p[1] for p in pairs]
    html_names = {i.html_name for i in infos}
    if out_dir.exists():
        shutil.rmtree(out_dir)
    static_dir = out_dir / STATIC
    static_dir.mkdir(parents=True)
    assets = fetch_assets(static_dir, npm_cache)
    (static_dir / "classroom.css").write_text(CSS)
    (static_dir / "mathjax-config.js").write_text(MATHJAX_CONFIG)
    for i, (info, nb) in enumerate(zip(infos, nbs)):
        page = render_page(prepare_for_site(nb, html_names), info, _nav(infos, i))
        (out_dir / info.html_name).write_text(page, encoding="utf-8")
    index = out_dir / "index.html"
    index.write_text(render_index(infos, assets), encoding="utf-8")
    return index
