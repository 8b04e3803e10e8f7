"""Record what every prediction exercise of the notebooks expects, for tests/test_exercise_leaks.py.

    PYTHONPATH=lib python tools/record_checks.py                  # every notebook (several minutes)
    PYTHONPATH=lib python tools/record_checks.py notebooks/11_roofline.ipynb ...   # just these
    PYTHONPATH=lib python tools/record_checks.py --write notebooks/11_roofline.ipynb   # and store its outputs

Each notebook runs top to bottom in a fresh kernel, in memory (with --write the executed notebook is
stored, as by nbconvert --execute --inplace, so a changed notebook runs once for both), with
TINYDECODER_CHECK_LOG set, so that every `check(name, answer, expected=..., hint=...)` call appends
its name, expected value and hint to a log (course/exercises.py). The first record of each name
(the question's call; the solution cell calls `check` again with the same expectation) goes into
tests/fixtures/exercise_checks.json, {notebook file name: [{"name", "expected", "hint"}, ...]};
notebooks not named on the command line keep their entries. Re-run it for a notebook whose
exercises changed: the test checks that the fixture's names are the notebook's `check` names.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "exercise_checks.json"
LOG_ENV = "TINYDECODER_CHECK_LOG"  # course.exercises.CHECK_LOG_ENV (not imported: no numpy here)


def record(path: Path, timeout: float, write: bool = False) -> list:
    """[{"name", "expected", "hint"}, ...] of the notebook at `path`, first call of each name."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(str(path), as_version=4)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "checks.jsonl"
        env = dict(os.environ, **{LOG_ENV: str(log)})
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "lib"), env.get("PYTHONPATH")) if p)
        client = NotebookClient(nb, kernel_name="python3", timeout=timeout,
                                resources={"metadata": {"path": str(path.parent)}})
        client.execute(env=env)  # in memory; env goes to the kernel
        if write:  # like jupyter nbconvert --execute --inplace
            nbformat.write(nb, str(path))
        lines = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
    seen, out = set(), []
    for line in lines:
        item = json.loads(line)
        if item["name"] not in seen:
            seen.add(item["name"])
            out.append(item)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebooks/*.ipynb")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per cell")
    parser.add_argument("--write", action="store_true",
                        help="also store the executed notebook (as nbconvert --execute --inplace): one run for both")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    fixture = json.loads(FIXTURE.read_text(encoding="utf-8")) if FIXTURE.exists() else {}

    failed = 0
    for path in paths:  # one at a time: kernels run side by side hung now and then on a busy machine
        try:
            fixture[path.name] = record(path.resolve(), args.timeout, args.write)
        except Exception as exc:  # one notebook that fails to run: the others are still recorded
            print(f"{path.name}: NOT recorded ({type(exc).__name__}: {exc})", file=sys.stderr)
            failed += 1
            continue
        print(f"{path.name}: {len(fixture[path.name])} exercises", file=sys.stderr)
        FIXTURE.write_text(json.dumps(dict(sorted(fixture.items())), indent=1, ensure_ascii=False) + "\n",
                           encoding="utf-8")  # after each notebook, so an interrupted run keeps them
    print(f"wrote {FIXTURE.relative_to(ROOT)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
