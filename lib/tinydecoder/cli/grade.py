"""`python -m tinydecoder grade NOTEBOOK_OR_FOLDER...`: run notebooks headless and grade their
`implement` exercises (course/grading.py does the work; `make grade` writes a CSV)."""
from __future__ import annotations

import json
from pathlib import Path


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("grade", help="run notebooks headless and grade their `implement` exercises")
    parser.add_argument("notebooks", nargs="+", metavar="NOTEBOOK",
                        help="notebooks to run and grade; a folder: every notebook under it")
    parser.add_argument("--json", action="store_true", help="print one JSON list of rows instead of lines")
    parser.add_argument("--csv", metavar="FILE", help="also write the rows to this CSV file")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per notebook (default 600)")


def run(args) -> int:
    from ..course.grading import format_row, grade, write_csv

    try:
        import nbclient  # noqa: F401
        import nbformat  # noqa: F401
    except ImportError:
        raise ValueError("grade runs notebooks with nbclient: pip install 'tinydecoder[grade]'") from None
    paths = []
    for given in map(Path, args.notebooks):  # a folder stands for every notebook under it
        paths += sorted(p for p in given.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts) \
            if given.is_dir() else [given]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"no such notebook: {', '.join(missing)}")
    if not paths:
        raise ValueError("no notebook found in the folders given")
    if not args.timeout > 0:
        raise ValueError(f"--timeout must be a number of seconds > 0, got {args.timeout}")
    rows = grade(paths, args.timeout, on_row=None if args.json else lambda r: print(format_row(r), flush=True))
    if args.json:
        print(json.dumps(rows, indent=2))
    if args.csv:
        write_csv(rows, args.csv)
    ok = all(r["ran_to_end"] and r["status"] in ("passed", "no exercises") for r in rows)
    return 0 if ok else 1
