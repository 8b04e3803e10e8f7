"""Strict nbval of every notebook (or those named) under the settings that change float rounding,
one after another, without pinning anything else: the stored outputs must hold on a learner's
machine, not only under this one's BLAS.

    python tools/nbval_matrix.py [notebooks/NN_x.ipynb ...]

Settings: one BLAS thread; three BLAS threads; OpenBLAS's Sandybridge kernels (AVX without FMA,
so other rounding); numpy with its dispatched SIMD paths above its baseline disabled
(NPY_DISABLE_CPU_FEATURES, the names this numpy dispatches). Exit status 1 if any run failed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBVAL = ["--nbval", "--nbval-current-env", "--nbval-sanitize-with", "tests/nbval_sanitize.cfg"]


def numpy_dispatched() -> str:
    """The SIMD targets this numpy dispatches to at run time (its baseline cannot be disabled)."""
    from numpy._core._multiarray_umath import __cpu_dispatch__

    return " ".join(__cpu_dispatch__)


def settings() -> dict:
    return {"1 BLAS thread": {"OPENBLAS_NUM_THREADS": "1"},
            "3 BLAS threads": {"OPENBLAS_NUM_THREADS": "3"},
            "OpenBLAS Sandybridge kernels": {"OPENBLAS_CORETYPE": "Sandybridge"},
            "numpy without dispatched SIMD": {"NPY_DISABLE_CPU_FEATURES": numpy_dispatched()}}


def main(argv=None) -> int:
    notebooks = (argv if argv is not None else sys.argv[1:]) or sorted(str(p) for p in (ROOT / "notebooks").glob("*.ipynb"))
    base = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE",
                                                               "NPY_DISABLE_CPU_FEATURES")}
    failed = []
    for name, extra in settings().items():
        print(f"=== {name}: {' '.join(f'{k}={v}' for k, v in extra.items())}", flush=True)
        code = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *NBVAL, *notebooks],
                              cwd=ROOT, env=base | extra).returncode
        if code:
            failed.append(name)
    print("nbval matrix:", "all passed" if not failed else "FAILED under " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
