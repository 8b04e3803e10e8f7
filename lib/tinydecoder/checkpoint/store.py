"""The on-disk weight cache: a GGUF's float32 weights (and its tokenizer), written once.

Dequantising takes seconds, so the first load writes every float32 weight, already laid out
for `forward` (see `weights.py`), as a `.npy` file into a folder named by the GGUF's sha256
(`$TINYDECODER_CACHE`, else `$XDG_CACHE_HOME/tinydecoder`, else `~/.cache/tinydecoder`), with
the tokenizer (tokenizer.json, tokenizer_config.json) and a manifest.json. The folder is
written under a temporary name and renamed when complete, so a crash never leaves half a
cache. Later loads memory-map the `.npy` files (read-only; nothing is unpickled).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from ..core.config import Config
from .gguf_file import GGUFFormatError, check_tensors, config_from_gguf, file_sha256, open_gguf, verify_sha256
from .tokenizer import Tokenizer, tokenizer_from_gguf
from .weights import array_shapes, write_weights

CACHE_FORMAT = 3


def default_cache_root() -> Path:
    """$TINYDECODER_CACHE, else $XDG_CACHE_HOME/tinydecoder, else ~/.cache/tinydecoder."""
    if os.environ.get("TINYDECODER_CACHE"):
        return Path(os.environ["TINYDECODER_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "tinydecoder"


def cache_dir_for(sha256: str, cache_root=None) -> Path:
    """The folder that holds (or will hold) a GGUF's float32 weights: <root>/<sha256>."""
    return (default_cache_root() if cache_root is None else Path(cache_root)) / sha256


def build_cache(path, cache_dir, *, progress: bool = True, sha256: str | None = None) -> Path:
    """Dequantise a GGUF into `cache_dir` (weights in the "halves" layout, manifest.json, and
    the tokenizer when the file has one). Written under a temporary name, then renamed."""
    path, cache_dir = Path(path), Path(cache_dir)
    if progress:
        print(f"first load of {path.name}: dequantising it to float32 into {cache_dir} (once per file)",
              file=sys.stderr, flush=True)
    reader = open_gguf(path)
    cfg = config_from_gguf(reader)
    check_tensors(reader, cfg)
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{cache_dir.name}.partial-", dir=cache_dir.parent))
    try:
        def allocate(name, shape):
            return np.lib.format.open_memmap(tmp / f"{name}.npy", mode="w+", dtype=np.float32, shape=shape)

        arrays = write_weights(reader, cfg, allocate, progress,
                               desc=f"dequantising {path.name} (first load only)")
        for array in arrays.values():
            array.flush()
        del arrays
        has_tokenizer = "tokenizer.ggml.tokens" in reader.fields
        if has_tokenizer:
            tokenizer_from_gguf(reader).save(tmp)
        manifest = {"format": CACHE_FORMAT, "source": path.name, "source_bytes": path.stat().st_size,
                    "sha256": sha256 or file_sha256(path), "rope_layout": "halves",
                    "config": cfg.to_dict(), "arrays": {n: list(s) for n, s in array_shapes(cfg).items()},
                    "tokenizer": has_tokenizer}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
        try:
            os.rename(tmp, cache_dir)
        except OSError:
            if not (cache_dir / "manifest.json").is_file():  # not another process finishing first
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return cache_dir


def read_manifest(cache_dir) -> dict | None:
    """The cache's manifest, or None if the folder holds no complete cache of this format."""
    try:
        manifest = json.loads((Path(cache_dir) / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return manifest if manifest.get("format") == CACHE_FORMAT else None


def load_cached_arrays(cache_dir, cfg: Config) -> dict:
    """Memory-map every weight of a cache (read-only, no pickle)."""
    arrays = {}
    for name, shape in array_shapes(cfg).items():
        file = Path(cache_dir) / f"{name}.npy"
        try:
            array = np.load(file, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise GGUFFormatError(f"the weight cache {cache_dir} is damaged ({name}.npy: {exc}); "
                                  f"delete that folder and load again to rebuild it") from None
        if array.shape != shape or array.dtype != np.float32:
            raise GGUFFormatError(f"the weight cache {cache_dir} is damaged: {name}.npy holds "
                                  f"{array.dtype} {array.shape}, expected float32 {shape}; delete that "
                                  f"folder and load again to rebuild it")
        arrays[name] = array.view(np.ndarray)  # a plain ndarray view of the map: no subclass overhead
    return arrays


def ensure_cache(path, *, expected_sha256: str | None = None, cache_root=None, progress: bool = True):
    """Verify the file and return (cache folder, manifest), building the cache if needed."""
    sha256 = verify_sha256(path, expected_sha256)
    cache_dir = cache_dir_for(sha256, cache_root)
    manifest = read_manifest(cache_dir)
    if manifest is None:
        if cache_dir.exists():  # an older format or a damaged manifest: rebuild it
            shutil.rmtree(cache_dir)
        build_cache(path, cache_dir, progress=progress, sha256=sha256)
        manifest = read_manifest(cache_dir)
    return cache_dir, manifest


def load_cached_tokenizer(cache_dir) -> Tokenizer:
    """The tokenizer saved in a cache (tokenizer.json and tokenizer_config.json)."""
    return Tokenizer.load(cache_dir)
