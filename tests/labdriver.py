"""Drive JupyterLab in headless Chromium: the machinery behind tests/test_browser.py.

Three pieces, each usable on its own:

- `LabServer`: a throw-away JupyterLab server from this Python environment, on 127.0.0.1, a free
  port and a random token, with its own config, data, runtime, settings and workspaces
  directories (nothing in ~/.jupyter or the project is written). Lab extensions are disabled
  the way `jupyter labextension disable --level=user NAME` does it, by writing
  `labconfig/page_config.json` into that private JUPYTER_CONFIG_DIR: the announcements pop-up
  always, plus whatever the user's own page_config.json disables (so `jupyter labextension
  disable` at any level reaches the test server, as it would reach the reader's JupyterLab).
- `launch_chromium`: Debian's /usr/bin/chromium through the Python `playwright` package
  (`executable_path`, no browser download), fresh profile directory.
- `LabPage`: one browser tab on a server. It opens a notebook, clears its outputs, runs all cells,
  waits for the kernel to go idle, then checks that no cell shows an error, that every widget
  output is drawn by the widget manager (not the text fallback such as `IntSlider(value=3, ...)`),
  and that moving one slider (keyboard) or choosing another dropdown entry changes what an Output
  (or HTML/Image) widget shows. Problems raise `NotebookCheckFailure` (an AssertionError).

The page talks to JupyterLab's own command registry (`window.jupyterapp`, exposed with
`--LabApp.expose_app_in_browser`): `docmanager:open`, `notebook:clear-all-cell-outputs` and
`notebook:run-all-cells` are the commands the File and Run menus call.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
ANNOUNCEMENTS = "@jupyterlab/apputils-extension:announcements"
WIDGET_MANAGER = "@jupyter-widgets/jupyterlab-manager"

# User settings for the private settings directory: every cell stays in the DOM (JupyterLab 4
# otherwise windows long notebooks, leaving off-screen cells unrendered), and nothing is saved.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
}


class NotebookCheckFailure(AssertionError):
    """A notebook did not pass in the browser; `cell` (index) is where, when known."""

    def __init__(self, message: str, cell: int | None = None):
        super().__init__(message)
        self.cell = cell


def _die_with_parent() -> None:
    """Runs in the child before exec: on Linux, SIGTERM it when the test process dies, even by
    SIGKILL (the server has a session of its own, so nothing else would reach it)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def user_disabled_extensions() -> list[str]:
    """Lab extensions and plugins disabled in the user's own labconfig/page_config.json."""
    try:
        from jupyter_core.paths import jupyter_config_dir

        path = Path(jupyter_config_dir()) / "labconfig" / "page_config.json"
        disabled = json.loads(path.read_text()).get("disabledExtensions", {})
    except (ImportError, OSError, ValueError, AttributeError):
        return []
    if isinstance(disabled, dict):
        return [name for name, off in disabled.items() if off]
    return [str(name) for name in disabled] if isinstance(disabled, list) else []


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------
class LabServer:
    """`python -m jupyterlab` in its own process group; call `stop()` (idempotent) when done."""

    def __init__(self, root_dir: Path, work_dir: Path, disabled_extensions=(ANNOUNCEMENTS,),
                 python: str = sys.executable):
        self.root_dir = Path(root_dir)
        self.work_dir = Path(work_dir)
        self.disabled_extensions = tuple(disabled_extensions)
        self.python = python
        self.token = secrets.token_hex(24)
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.log_path = self.work_dir / "server.log"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _prepare_dirs(self) -> dict[str, str]:
        dirs = {name: self.work_dir / name for name in
                ("config", "data", "runtime", "settings", "workspaces", "ipython")}
        for path in dirs.values():
            path.mkdir(parents=True, exist_ok=True)
        # What `jupyter labextension disable --level=user NAME` writes (JupyterLab 4). Extensions
        # disabled at user level outside (JUPYTER_CONFIG_DIR, else ~/.jupyter) stay disabled; the
        # sys-prefix and system levels are read by the server itself.
        disabled = {name: True for name in user_disabled_extensions()}
        disabled.update({name: True for name in self.disabled_extensions})
        (dirs["config"] / "labconfig").mkdir(exist_ok=True)
        page_config = {"disabledExtensions": disabled}
        (dirs["config"] / "labconfig" / "page_config.json").write_text(json.dumps(page_config))
        for rel, values in LAB_SETTINGS.items():
            path = dirs["settings"] / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        return {name: str(path) for name, path in dirs.items()}

    def start(self, timeout: float = 90.0) -> LabServer:
        dirs = self._prepare_dirs()
        env = dict(os.environ)
        env.update(
            JUPYTER_CONFIG_DIR=dirs["config"],
            JUPYTER_DATA_DIR=dirs["data"],
            JUPYTER_RUNTIME_DIR=dirs["runtime"],
            IPYTHONDIR=dirs["ipython"],
            JUPYTER_TOKEN=self.token,  # in the environment, not on the command line
        )
        env.pop("MPLBACKEND", None)  # the kernel must use the inline backend
        for _attempt in range(3):
            self.port = free_port()
            cmd = [
                self.python, "-m", "jupyterlab",
                "--no-browser",
                "--ip=127.0.0.1",
                f"--port={self.port}",
                "--ServerApp.port_retries=0",
                f"--ServerApp.root_dir={self.root_dir}",
                f"--LabApp.user_settings_dir={dirs['settings']}",
                f"--LabApp.workspaces_dir={dirs['workspaces']}",
                "--LabApp.expose_app_in_browser=True",
            ]
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                cmd.append("--allow-root")
            log = open(self.log_path, "ab")
            self.proc = subprocess.Popen(cmd, cwd=self.work_dir, env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True,
                                         preexec_fn=_die_with_parent if sys.platform == "linux" else None)
            log.close()
            if self._wait_ready(timeout):
                return self
            if self.proc.poll() is None:  # still running, never answered
                self.stop()
                break
            self.proc = None  # exited: most likely the port was taken meanwhile; try another
        raise RuntimeError(f"JupyterLab did not start; its log:\n{self.log_tail()}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                self.api("GET", "/api/status", timeout=2)
                return True
            except (OSError, urllib.error.URLError):
                time.sleep(0.2)
        return False

    def api(self, method: str, path: str, timeout: float = 10):
        request = urllib.request.Request(self.base_url + path, method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else None

    def _children(self) -> dict[int, bytes]:
        """The server's child processes (its kernels, each in a session of its own): pid -> cmdline."""
        children = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == self.proc.pid:
                    children[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes()
            except (OSError, IndexError, ValueError):
                continue
        return children

    def stop(self) -> None:
        """SIGTERM the server's process group (the server then shuts its kernels down), wait, then
        SIGKILL whatever is left of that group and of the kernels' own process groups."""
        proc = self.proc
        if proc is None:
            return
        kernels = self._children() if proc.poll() is None else {}
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid, cmdline in kernels.items():
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes() == cmdline:  # not a reused pid
                    os.killpg(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.proc = None

    def log_tail(self, n_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except OSError:
            return "(no server log)"


# --------------------------------------------------------------------------------------------
# The browser
# --------------------------------------------------------------------------------------------
def launch_chromium(playwright, profile_dir: Path, executable: str = CHROMIUM):
    """A persistent context on a fresh profile directory (playwright refuses --user-data-dir).

    XDG_CONFIG_HOME/XDG_CACHE_HOME point into the profile too: Chromium keeps its crash-report
    database under ~/.config/chromium whatever the profile directory is."""
    profile_dir = Path(profile_dir)
    env = dict(os.environ, XDG_CONFIG_HOME=str(profile_dir / "xdg-config"),
               XDG_CACHE_HOME=str(profile_dir / "xdg-cache"))
    return playwright.chromium.launch_persistent_context(
        str(profile_dir / "profile"),
        executable_path=executable,
        headless=True,
        args=list(CHROMIUM_FLAGS),
        env=env,
        viewport={"width": 1280, "height": 1024},
    )


# JavaScript run in the page.  `window.__tdNotebook` is the NotebookPanel under test.
_JS_OPEN = """async (path) => {
  const app = window.jupyterapp;
  const panel = await app.commands.execute('docmanager:open', {path, factory: 'Notebook'});
  await panel.context.ready;
  await panel.sessionContext.ready;
  app.shell.activateById(panel.id);
  window.__tdNotebook = panel;
  return panel.id;
}"""

_JS_RUN_ALL = """async (timeoutMs) => {
  const app = window.jupyterapp, panel = window.__tdNotebook;
  // The notebook commands act on the current notebook; activation settles asynchronously.
  for (let i = 0; app.shell.currentWidget !== panel; i++) {
    if (i === 100) return 'notebook did not become the current widget';
    app.shell.activateById(panel.id);
    await new Promise(resolve => setTimeout(resolve, 50));
  }
  await app.commands.execute('notebook:clear-all-cell-outputs');
  const timeout = new Promise(resolve => setTimeout(() => resolve('timeout'), timeoutMs));
  const done = app.commands.execute('notebook:run-all-cells').then(() => 'done');
  return await Promise.race([done, timeout]);
}"""

_JS_KERNEL_STATUS = """() => {
  const panel = window.__tdNotebook;
  const kernel = panel && panel.sessionContext.session && panel.sessionContext.session.kernel;
  return kernel ? kernel.status : 'no kernel';
}"""

# Per cell: the model's outputs (what the kernel sent) next to what the page shows for each.
_JS_CELLS = """() => {
  const panel = window.__tdNotebook;
  const WIDGET = 'application/vnd.jupyter.widget-view+json';
  return panel.content.widgets.map((cell, index) => {
    const model = cell.model;
    const info = {index, type: model.type, source: model.sharedModel.getSource().slice(0, 120),
                  tags: model.getMetadata('tags') || [], execution_count: null, outputs: [],
                  shown: []};
    if (model.type !== 'code') return info;
    info.execution_count = model.executionCount;
    info.outputs = model.outputs.toJSON().map(o => ({
      output_type: o.output_type, ename: o.ename || null, evalue: o.evalue || null,
      widget: !!(o.data && o.data[WIDGET]),
      text_plain: o.data && o.data['text/plain'] ? String(o.data['text/plain']).slice(0, 120) : null,
    }));
    const children = cell.outputArea.node.querySelectorAll(':scope > .jp-OutputArea-child');
    info.shown = Array.from(children).map(child => {
      const out = child.querySelector(':scope > .jp-OutputArea-output');
      if (!out) return {mime: null, has_widget: false, error_widget: false, text: ''};
      return {
        mime: out.getAttribute('data-mime-type'),
        has_widget: !!out.querySelector('.jupyter-widgets'),
        error_widget: !!out.querySelector('.jupyter-widgets-error-widget'),
        text: (out.innerText || '').slice(0, 200),
      };
    });
    // Tracebacks printed into Output widgets (an interact callback that raised, say).
    info.widget_errors = Array.from(cell.node.querySelectorAll(
        '.widget-output .jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'))
      .map(e => e.innerText || '')
      .filter(t => /Traceback|\\b\\w*(Error|Exception)\\b/.test(t))
      .map(t => t.slice(0, 300));
    return info;
  });
}"""

# Sliders and dropdowns a reader can use, tagged so that Python can find them again.  Those
# sitting in the same displayed widget as an Output widget come first.
_JS_SLIDER_VALUE = """(handle) => {
  const readout = handle.closest('.widget-slider').querySelector('.widget-readout');
  const shown = readout ? (readout.innerText || readout.value || '').trim() : '';
  return shown || handle.getAttribute('aria-valuetext');
}"""

_JS_CONTROLS = """() => {
  const sliderValue = """ + _JS_SLIDER_VALUE + """;
  const panel = window.__tdNotebook;
  const found = [];
  panel.content.widgets.forEach((cell, index) => {
    if (cell.model.type !== 'code') return;
    const outs = cell.outputArea.node.querySelectorAll(':scope > .jp-OutputArea-child > .jp-OutputArea-output');
    outs.forEach(out => {
      const withOutput = !!out.querySelector('.widget-output, .widget-html, .widget-image');
      out.querySelectorAll('.widget-slider, .widget-dropdown').forEach(box => {
        const label = box.querySelector('.widget-label');
        const description = label ? (label.innerText || '').trim() : '';
        let target = null, kind = null, value = null;
        if (box.classList.contains('widget-dropdown')) {
          const select = box.querySelector('select');
          if (!select || select.disabled || select.options.length < 2) return;
          target = select; kind = 'dropdown'; value = select.value;
        } else {
          const handle = box.querySelector('.noUi-handle');
          const base = box.querySelector('.noUi-target');
          if (!handle || (base && base.hasAttribute('disabled'))) return;
          target = handle; kind = 'slider'; value = sliderValue(handle);
        }
        const id = 'td-' + found.length;
        target.setAttribute('data-td-control', id);
        found.push({id, kind, cell: index, description, value, with_output: withOutput});
      });
    });
  });
  return found.filter(c => c.with_output).concat(found.filter(c => !c.with_output));
}"""

# What the widgets show a reader: Output widgets (text and figures), HTML and Image widgets —
# not the controls themselves (a slider's readout would change trivially).
_JS_SHOWN = """() => {
  const panel = window.__tdNotebook;
  const parts = [];
  panel.content.node.querySelectorAll('.widget-output, .widget-html-content, img.widget-image')
    .forEach(el => {
      parts.push(el.className + '|' + (el.innerText || ''));
      el.querySelectorAll('img').forEach(img => parts.push(img.src));
      if (el.tagName === 'IMG') parts.push(el.src);
      el.querySelectorAll('svg').forEach(svg => parts.push(svg.outerHTML));
    });
  const all = parts.join('\\n');
  let h1 = 0x811c9dc5, h2 = 0;
  for (let i = 0; i < all.length; i++) {
    const c = all.charCodeAt(i);
    h1 = Math.imul(h1 ^ c, 16777619) >>> 0;
    h2 = (h2 * 31 + c) >>> 0;
  }
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  return {digest: h1.toString(16) + h2.toString(16) + ':' + all.length,
          kernel: kernel ? kernel.status : 'no kernel'};
}"""

# Close the tab without saving, then ask the server (not the disposed tab) to shut the kernel down;
# the server does that while the next notebook opens.
_JS_CLOSE = """() => {
  const app = window.jupyterapp, panel = window.__tdNotebook;
  window.__tdNotebook = null;
  if (!panel) return null;
  const session = panel.sessionContext.session;
  const id = session ? session.id : null;
  panel.dispose();
  if (id) app.serviceManager.sessions.shutdown(id).catch(() => null);
  return id;
}"""


@dataclass
class ControlResult:
    description: str
    kind: str
    cell: int
    before: str
    after: str


@dataclass
class LabPage:
    """One tab of JupyterLab on `server`, reused for notebook after notebook."""

    context: object  # playwright BrowserContext
    server: LabServer
    page: object = None
    console: list = field(default_factory=list)
    run_timeout_s: float = 180.0
    change_timeout_s: float = 30.0

    # -- page life --------------------------------------------------------------------------
    def load(self) -> None:
        if self.page is not None and not self.page.is_closed():
            self.page.close()
        self.page = self.context.new_page()
        self.page.set_default_timeout(60_000)
        self.page.on("console", lambda m: self.console.append(f"[console.{m.type}] {m.text}"))
        self.page.on("pageerror", lambda e: self.console.append(f"[pageerror] {e}"))
        self.page.on("crash", lambda *_: self.console.append("[crash] the page crashed"))
        self.page.goto(f"{self.server.base_url}/lab?reset&token={self.server.token}")
        self.page.wait_for_function("() => !!window.jupyterapp")
        self.page.evaluate("async () => { await window.jupyterapp.started;"
                           " await window.jupyterapp.restored; }")

    def ensure_loaded(self) -> None:
        """(Re)load JupyterLab if the tab is gone, crashed or has a dialog left open."""
        try:
            ok = (self.page is not None and not self.page.is_closed()
                  and self.page.evaluate("() => !!window.jupyterapp"
                                         " && !document.querySelector('.jp-Dialog')"))
        except Exception:  # noqa: BLE001 - a crashed page raises playwright's Error
            ok = False
        if not ok:
            self.load()

    def close(self) -> None:
        if self.page is not None and not self.page.is_closed():
            self.page.close()
        self.page = None

    # -- one notebook -----------------------------------------------------------------------
    def open_notebook(self, path: str) -> None:
        self.ensure_loaded()
        self.page.evaluate(_JS_OPEN, path)

    def close_notebook(self) -> None:
        """Close the notebook's tab without saving and shut its kernel down."""
        if self.page is None or self.page.is_closed():
            return
        try:
            self.page.evaluate(_JS_CLOSE)
        except Exception:  # noqa: BLE001 - the server-side cleanup still removes the kernel
            pass

    def kernel_status(self) -> str:
        return self.page.evaluate(_JS_KERNEL_STATUS)

    def run_all(self) -> None:
        """Clear outputs, run all cells, wait until they are done and the kernel is idle."""
        result = self.page.evaluate(_JS_RUN_ALL, int(self.run_timeout_s * 1000))
        if result == "timeout":
            raise NotebookCheckFailure(f"run all cells: not finished after {self.run_timeout_s:.0f} s "
                                       f"(kernel {self.kernel_status()})")
        if result != "done":
            raise NotebookCheckFailure(f"run all cells: {result}")
        self.wait_idle()

    def wait_idle(self, timeout_s: float = 60.0) -> None:
        try:
            self.page.wait_for_function(f"() => ({_JS_KERNEL_STATUS})() === 'idle'",
                                        timeout=timeout_s * 1000)
        except Exception as exc:  # noqa: BLE001
            raise NotebookCheckFailure(f"kernel not idle after {timeout_s:.0f} s "
                                       f"(it is {self.kernel_status()})") from exc

    def cells(self) -> list[dict]:
        return self.page.evaluate(_JS_CELLS)

    def settled_cells(self, timeout_s: float = 5.0) -> list[dict]:
        """The cells, once every code cell shows an execution count: the kernel can be idle a
        moment before JupyterLab has applied the last replies (outputs, counts) to its model."""
        deadline = time.monotonic() + timeout_s
        while True:
            cells = self.cells()
            pending = [c for c in cells if c["type"] == "code" and c["source"].strip() and c["execution_count"] is None]
            if not pending or time.monotonic() > deadline:
                return cells
            time.sleep(0.25)

    def check_no_errors(self, cells: list[dict] | None = None) -> None:
        """No error output in any cell, none inside Output widgets, every code cell ran."""
        cells = self.settled_cells() if cells is None else cells
        for cell in cells:
            expected = "raises-exception" in cell["tags"]  # JupyterLab's Run All goes on past it
            for out in cell["outputs"]:
                if out["output_type"] == "error" and not expected:
                    hint = ""
                    if "NBVAL_RAISES_EXCEPTION" in cell["source"]:
                        hint = ("\n    (NBVAL_RAISES_EXCEPTION satisfies nbval, but Run All in "
                                "JupyterLab stops here: give the cell the tag 'raises-exception')")
                    raise NotebookCheckFailure(
                        f"cell {cell['index']} shows an error: {out['ename']}: {out['evalue']}\n"
                        f"    cell source: {cell['source']!r}{hint}", cell["index"])
            for text in cell.get("widget_errors", []):
                raise NotebookCheckFailure(
                    f"cell {cell['index']}: an Output widget shows a traceback:\n{text}",
                    cell["index"])
        for cell in cells:
            if cell["type"] == "code" and cell["source"].strip() and cell["execution_count"] is None:
                raise NotebookCheckFailure(f"cell {cell['index']} did not run "
                                           f"(source: {cell['source']!r})", cell["index"])

    def check_widgets_render(self, timeout_s: float = 20.0) -> int:
        """Every widget output is drawn by the widget manager; returns how many there are.

        Waits while any still says "Loading widget...". Fails on the text fallback (what
        JupyterLab shows without the widget extension), "Error displaying widget" and error views.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            cells = self.cells()
            problems, loading, n_widgets = [], False, 0
            for cell in cells:
                for i, out in enumerate(cell["outputs"]):
                    if not out["widget"]:
                        continue
                    n_widgets += 1
                    shown = cell["shown"][i] if i < len(cell["shown"]) else None
                    where = f"cell {cell['index']} output {i}"
                    if shown is None:
                        problems.append((cell["index"], f"{where}: widget output not on the page"))
                    elif shown["text"].startswith("Loading widget"):
                        loading = True
                    elif shown["mime"] and shown["mime"] != "application/vnd.jupyter.widget-view+json":
                        problems.append((cell["index"],
                                         f"{where}: widget shown as its text fallback ({shown['mime']}): "
                                         f"{shown['text'][:100]!r}"))
                    elif (not shown["has_widget"] or shown["error_widget"]
                          or shown["text"].startswith("Error displaying widget")):
                        problems.append((cell["index"],
                                         f"{where}: widget not rendered: {shown['text'][:100]!r} "
                                         f"(kernel repr {out['text_plain']!r})"))
            if problems:
                raise NotebookCheckFailure("\n".join(p for _, p in problems), problems[0][0])
            if not loading:
                return n_widgets
            if time.monotonic() > deadline:
                raise NotebookCheckFailure(f"widgets still 'Loading widget...' after {timeout_s:.0f} s")
            time.sleep(0.2)

    def controls(self) -> list[dict]:
        return self.page.evaluate(_JS_CONTROLS)

    def shown(self) -> dict:
        return self.page.evaluate(_JS_SHOWN)

    def settle(self, timeout_s: float, differ_from: str | None = None,
               quiet_s: float = 0.4) -> dict | None:
        """Wait until the kernel is idle and what the widgets show stays the same for `quiet_s`
        (and differs from `differ_from`, when given). None if that does not happen in time."""
        deadline = time.monotonic() + timeout_s
        last, since = None, time.monotonic()
        while time.monotonic() < deadline:
            now_shown = self.shown()
            if last is None or now_shown["digest"] != last["digest"]:
                last, since = now_shown, time.monotonic()
            elif (now_shown["kernel"] == "idle" and time.monotonic() - since >= quiet_s
                  and now_shown["digest"] != differ_from):
                return now_shown
            time.sleep(0.1)
        return None

    def _change(self, control: dict) -> tuple[bool, str]:
        """Change one control like a reader would; returns (whether it moved, its value shown)."""
        target = self.page.locator(f'[data-td-control="{control["id"]}"]')
        target.scroll_into_view_if_needed()
        if control["kind"] == "dropdown":
            n_options = target.evaluate("s => s.options.length")
            current = target.evaluate("s => s.selectedIndex")
            target.select_option(index=(current + 1) % n_options)
            return target.evaluate("s => s.selectedIndex") != current, target.evaluate("s => s.value")
        target.focus()
        position = target.get_attribute("aria-valuenow")
        moved = False
        for key in ("ArrowRight", "ArrowLeft"):  # ArrowLeft when it already sits at its maximum
            self.page.keyboard.press(key)
            moved = target.get_attribute("aria-valuenow") != position
            if moved:
                break
        return moved, target.evaluate(_JS_SLIDER_VALUE)

    def exercise(self, control: dict) -> ControlResult:
        """Change `control` and check that what the widgets show changes, without errors."""
        before = self.settle(self.change_timeout_s)
        if before is None:
            raise NotebookCheckFailure("widget outputs did not settle before the change",
                                       control["cell"])
        name = (f"{control['kind']} {control['description'] or '(no description)'!r} "
                f"in cell {control['cell']}")
        moved, new_value = self._change(control)
        if not moved:
            raise NotebookCheckFailure(f"{name}: its value did not move from {control['value']!r}",
                                       control["cell"])
        after = self.settle(self.change_timeout_s, differ_from=before["digest"])
        self.check_no_errors()
        if after is None:
            raise NotebookCheckFailure(
                f"{name}: changing it from {control['value']!r} to {new_value!r} did not change any "
                f"Output/HTML/Image widget within {self.change_timeout_s:.0f} s", control["cell"])
        return ControlResult(name, control["kind"], control["cell"],
                             str(control["value"]), str(new_value))

    def exercise_one(self) -> ControlResult:
        """Try the notebook's sliders and dropdowns in turn until one changes an output."""
        candidates = self.controls()
        if not candidates:
            raise NotebookCheckFailure("no slider or dropdown found on the page")
        failures = []
        for control in candidates:
            try:
                return self.exercise(control)
            except NotebookCheckFailure as exc:
                failures.append(exc)
                if "traceback" in str(exc) or "shows an error" in str(exc):
                    raise
        raise NotebookCheckFailure("no slider or dropdown changed an output:\n"
                                   + "\n".join(f"  - {f}" for f in failures), failures[0].cell)

    def check_notebook(self, path: str) -> tuple[int, ControlResult]:
        """The whole check for one notebook (already open or not); returns (widgets, control)."""
        self.open_notebook(path)
        self.run_all()
        cells = self.settled_cells()
        self.check_no_errors(cells)
        n_widgets = self.check_widgets_render()
        if n_widgets == 0:
            raise NotebookCheckFailure("the notebook displays no widget")
        return n_widgets, self.exercise_one()

    # -- evidence on failure ----------------------------------------------------------------
    def save_artifacts(self, directory: Path, name: str, console_from: int,
                       cell: int | None = None) -> list[Path]:
        directory.mkdir(parents=True, exist_ok=True)
        saved = []
        console_path = directory / f"{name}.console.log"
        console_path.write_text("\n".join(self.console[console_from:]) + "\n")
        saved.append(console_path)
        if self.server.log_path.exists():
            server_path = directory / f"{name}.server.log"
            shutil.copyfile(self.server.log_path, server_path)
            saved.append(server_path)
        try:
            shot = directory / f"{name}.png"
            self.screenshot(shot, cell)
            saved.insert(0, shot)
        except Exception as exc:  # noqa: BLE001 - the logs are still worth having
            self.console.append(f"[test] screenshot failed: {exc}")
            console_path.write_text("\n".join(self.console[console_from:]) + "\n")
        return saved

    def screenshot(self, path: Path, cell: int | None = None) -> None:
        """A screenshot of the tab, scrolled to `cell` of the open notebook when given."""
        if cell is not None:
            self.page.evaluate("(i) => { const p = window.__tdNotebook;"
                               " if (p) p.content.widgets[i].node.scrollIntoView(); }", cell)
        self.page.screenshot(path=str(path), timeout=15_000)
