"""Every module path the docs and docstrings name exists: dotted paths (`tinydecoder.fast`,
`tinydecoder.serving.paged.PagedKVPool`) import, and file paths (`fast/forward_pass.py`, `paged.py`) name a
file of the package (or of tests/ and tools/). Moving a module without mending its mentions fails here."""
import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lib" / "tinydecoder"
DOTTED = re.compile(r"\btinydecoder(?:\.[A-Za-z_]\w*)+")
FILE = re.compile(r"(?<![\w/.-])((?:[A-Za-z_]\w*/)*[A-Za-z_]\w*\.py)\b")
KNOWN_FILES = {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py")
               if not any(part.startswith(".venv") for part in p.parts)}
BASENAMES = {Path(p).name for p in KNOWN_FILES}
# files that are not ours, named where the docs cite where an idea comes from
CITED = {"run.c", "setup.py", "nbgrader_config.py", "modeling_llama.py", "convert_hf_to_gguf.py", "radix_cache.py",
         "block_manager.py", "scheduler.py", "llama.py", "model.py"}


def docstrings(path: Path) -> str:
    tree = ast.parse(path.read_text())
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return "\n".join(filter(None, (ast.get_docstring(n, clean=False) for n in nodes)))


def texts():
    for p in sorted(PACKAGE.rglob("*.py")):
        yield p.relative_to(ROOT).as_posix(), docstrings(p) + "\n" + "\n".join(
            line.split("#", 1)[1] for line in p.read_text().splitlines() if "#" in line)
    for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        yield p.relative_to(ROOT).as_posix(), p.read_text()


TEXTS = dict(texts())


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    as_path = PACKAGE.parent.joinpath(*parts)
    if as_path.with_suffix(".py").is_file() or (as_path / "__init__.py").is_file():
        return True  # a module of ours (its optional dependencies, e.g. the server's, may be absent)
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def file_exists(name: str) -> bool:
    if "/" not in name:
        return name in BASENAMES or name in CITED
    return any(known == name or known.endswith("/" + name) for known in KNOWN_FILES)


@pytest.mark.parametrize("where", sorted(TEXTS))
def test_named_paths_exist(where):
    text = TEXTS[where]
    bad = sorted({d.rstrip(".") for d in DOTTED.findall(text) if not resolves(d.rstrip("."))})
    bad += sorted({f for f in FILE.findall(text) if not file_exists(f)})
    assert not bad, f"{where} names paths that do not exist: {bad}"


def test_the_check_catches_a_stale_path():
    assert resolves("tinydecoder.fast.forward") and not resolves("tinydecoder.core.generate")
    assert file_exists("decoding/generate.py") and not file_exists("core/generate.py") and not file_exists("nope.py")
