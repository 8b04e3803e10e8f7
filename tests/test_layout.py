"""The package's shape, checked: sub-packages in layers whose imports point one way only, no
import cycles, no module past ~400 lines.

    core  <-  fast  <-  decoding  <-  algorithms  <-  checkpoint, serving  <-  perf  <-  lessons  <-  viz  <-  widgets
    <-  server, parallel  <-  course  <-  cli  <-  the package root (__main__)

A module may import from its own sub-package or from a lower layer; checkpoint and serving
(one layer) do not import each other. Imports inside functions count too, and so do imports
under `if TYPE_CHECKING:`: a cycle hidden from the interpreter is still a cycle for a reader."""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lib" / "tinydecoder"
LAYERS = {"core": 0, "fast": 1, "decoding": 2, "algorithms": 3, "checkpoint": 4, "serving": 4, "perf": 5, "lessons": 6,
          "viz": 7, "widgets": 8, "server": 9, "parallel": 9, "course": 10, "cli": 11, "": 12}
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sub_package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else ""


def imported_modules(path: Path, own: str | None = None) -> set:
    """tinydecoder modules imported by the file at `path` (module `own`, by default the
    module that path is in the package), anywhere in it."""
    tree = ast.parse(path.read_text())
    own = own or module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found = set()

    def visit(node):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("tinydecoder"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("tinydecoder"):
                for alias in node.names:  # `from . import viz` imports a module
                    candidate = f"{target}.{alias.name}"
                    found.add(candidate if resolve(candidate) else target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m != own}


def resolve(module: str) -> Path | None:
    rel = Path(*module.split(".")[1:])
    for candidate in (PACKAGE / rel.with_suffix(".py"), PACKAGE / rel / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


MODULES = sorted(PACKAGE.rglob("*.py"))
GRAPH = {module_name(p): {m for m in imported_modules(p) if resolve(m)} for p in MODULES}


def test_the_layers_exist():
    assert {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()} == set(LAYERS) - {""}


@pytest.mark.parametrize("path", MODULES, ids=[module_name(p) for p in MODULES])
def test_imports_point_down_or_sideways_within_a_package(path):
    own = module_name(path)
    own_pkg = sub_package(own)
    for target in GRAPH[own]:
        pkg = sub_package(target)
        if pkg == own_pkg or target == "tinydecoder":
            continue
        assert LAYERS[pkg] < LAYERS[own_pkg], (
            f"{own} (layer {own_pkg or 'top'}) imports {target} (layer {pkg or 'top'}): imports must point down "
            f"{' <- '.join(sorted(LAYERS, key=LAYERS.get))}")


def test_no_import_cycles():
    state, stack = {}, []

    def walk(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(GRAPH.get(node, ())):
            if nxt.endswith("__init__") or nxt not in GRAPH:
                continue
            if state.get(nxt) == "open":
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = "done"

    for module in sorted(GRAPH):
        if module not in state:
            walk(module)


@pytest.mark.parametrize("path", MODULES, ids=[module_name(p) for p in MODULES])
def test_no_module_is_too_long(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{module_name(path)} has {n} lines; split it (the limit is ~{MAX_LINES})"


def test_the_checker_sees_a_bad_import(tmp_path):
    """The walker finds upward imports, also inside functions and under TYPE_CHECKING."""
    probe = tmp_path / "_layout_probe.py"
    probe.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..widgets import base\n"
                     "def f():\n    from ..serving import paged\n    from . import ops\n")
    found = imported_modules(probe, own="tinydecoder.core._layout_probe")
    assert found == {"tinydecoder.widgets.base", "tinydecoder.serving.paged", "tinydecoder.core.ops"}


CORE = sorted((PACKAGE / "core").glob("*.py"))


@pytest.mark.parametrize("path", CORE, ids=[module_name(p) for p in CORE])
def test_core_is_the_reference_alone(path):
    """core/ reads like the math: it imports only from core itself, and nothing compiled (numba,
    llvmlite); the fast path's kernels live in fast/, which imports core, never the other way."""
    inside = {m for m in imported_modules(path) if not m.startswith("tinydecoder.core")}
    assert not inside, f"{module_name(path)} imports {sorted(inside)} from outside core"
    tree = ast.parse(path.read_text())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    roots |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
    assert not roots & {"numba", "llvmlite"}, f"{module_name(path)} imports {sorted(roots & {'numba', 'llvmlite'})}"


def test_the_fast_path_has_its_compiled_room():
    """The numba kernels sit in fast/compiled/, each named for what it computes, beside the JIT."""
    names = {p.stem for p in (PACKAGE / "fast" / "compiled").glob("*.py")}
    assert {"jit", "few_rows", "tiles", "few_queries", "prefill_attention", "vexp", "llvm"} <= names


MAX_FUNCTION_LINES = 80


@pytest.mark.parametrize("path", MODULES, ids=[module_name(p) for p in MODULES])
def test_no_function_is_too_long(path):
    """A function a reader can hold on one screen: none past MAX_FUNCTION_LINES lines."""
    tree = ast.parse(path.read_text())
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{module_name(path)}: {', '.join(long)}; split them (the limit is {MAX_FUNCTION_LINES})"
