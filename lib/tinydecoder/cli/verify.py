"""`python -m tinydecoder verify`: check a weight cache's files against the sha256 its manifest
recorded (checkpoint/store.py); --repair rebuilds a damaged cache, --record trusts an old one."""
from __future__ import annotations

from pathlib import Path


def add_parser(subparsers) -> None:
    verify = subparsers.add_parser(
        "verify", help="check every file of a weight cache against the sha256 its manifest recorded",
        description="Hash every file of a weight cache (SmolLM2's unless --gguf or --cache-dir) and compare "
                    "it with the sha256 recorded at build time, catching damage that keeps a file's size "
                    "(a normal load checks only shapes and sizes). One line per problem, then a summary. "
                    "Exit status: 0 every file matches; 1 a problem, no cache, or a cache without recorded "
                    "hashes (built by an older tinydecoder: see --record); 2 bad arguments.")
    where = verify.add_mutually_exclusive_group()
    where.add_argument("--gguf", metavar="PATH", help="the cache of this GGUF file (default: SmolLM2's)")
    where.add_argument("--cache-dir", metavar="PATH", help="this cache folder (<cache root>/<sha256 of the GGUF>)")
    action = verify.add_mutually_exclusive_group()
    action.add_argument("--repair", action="store_true",
                        help="rebuild a damaged (or hash-less) cache from its GGUF; with --cache-dir, remove "
                             "the folder so that the next load rebuilds it")
    action.add_argument("--record", action="store_true",
                        help="for a cache without recorded hashes: hash its files as they are now and record "
                             "them in the manifest")


def run(args) -> int:
    """Check a weight cache's files against the sha256 its manifest recorded (see checkpoint/store.py)."""
    from ..checkpoint import store
    from ..checkpoint.gguf_file import verify_sha256

    if args.cache_dir is not None:
        cache_dir, source, where = Path(args.cache_dir), None, f" --cache-dir {args.cache_dir}"
    elif args.gguf is not None:
        sha256 = verify_sha256(args.gguf, None)
        cache_dir, where = store.cache_dir_for(sha256), f" --gguf {args.gguf}"
        source = lambda: (Path(args.gguf), sha256)
    else:
        from ..checkpoint.smollm2 import SHA256, smollm2_path

        cache_dir, where = store.cache_dir_for(SHA256), ""
        source = lambda: (smollm2_path(), verify_sha256(smollm2_path(), SHA256))
    report = store.verify_cache(cache_dir) if cache_dir.is_dir() else None
    if args.record and report is not None and not report.hashes_recorded and not report.problems:
        n = store.record_hashes(cache_dir)
        print(f"{cache_dir}: recorded the sha256 of {n} files, trusting them as they are now "
              f"(--repair would rebuild them from the GGUF instead)")
        return 0
    if args.repair and (report is None or report.problems or not report.hashes_recorded):
        for problem in report.problems if report else ():
            print(f"{cache_dir / problem}")
        if source is None:  # a bare folder: its GGUF is not known here, the next load rebuilds it
            store.discard(cache_dir)
            print(f"{cache_dir}: removed; the next load of its GGUF rebuilds it")
            return 0
        path, sha256 = source()
        reason = f"{len(report.problems)} damaged file(s)" if report and report.problems else "verify --repair"
        store.build_cache(path, cache_dir, sha256=sha256, reason=reason)
        report = store.verify_cache(cache_dir)
    if report is None:
        print(f"{cache_dir}: no weight cache here, nothing to verify (the first load builds it; "
              f"--repair builds it now)")
        return 1
    for problem in report.problems:
        print(f"{cache_dir / problem}")
    if report.problems:
        print(f"{cache_dir}: {len(report.problems)} problem(s); rebuild the cache from its GGUF with: "
              f"python -m tinydecoder verify --repair{where}")
        return 1
    if not report.hashes_recorded:
        print(f"{cache_dir}: no sha256 recorded (a cache built before tinydecoder recorded them): shapes and "
              f"sizes are right, but same-size damage cannot be checked; --record hashes the files as they "
              f"are now, --repair rebuilds them from the GGUF")
        return 1
    print(f"{cache_dir}: all {report.checked} files match the sha256 recorded at build time")
    return 0
