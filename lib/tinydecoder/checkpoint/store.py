"""The on-disk weight cache: a GGUF's float32 weights (and its tokenizer), written once.

Dequantising takes seconds, so the first load writes every float32 weight, already laid out
for `forward` (see `weights.py`), as a `.npy` file into a folder named by the GGUF's sha256
(`$TINYDECODER_CACHE`, else `$XDG_CACHE_HOME/tinydecoder`, else `~/.cache/tinydecoder`), with
the tokenizer (tokenizer.json, tokenizer_config.json) and a manifest.json. The folder is
written under a temporary name and renamed when complete, so a crash never leaves half a
cache, and under a lock (`build_lock`), so two processes loading at once build it once. Later
loads memory-map the `.npy` files (read-only; nothing is unpickled). Until a float32 load builds
it, the tokenizer alone is saved beside it (<sha256>.tokenizer, `tokenizer_from_cache`), so a run on
the file's own blocks (weights="q4_1", generate's default) dequantises nothing.

Damage. A load checks what it can without reading the weights: the manifest parses, every
`.npy` file is there with the shape and dtype the config implies, and holds that many bytes
(a memory map of a truncated file fails). A cache that fails this is rebuilt from the GGUF,
with one line on stderr. Corruption that keeps the size (a flipped byte) needs the bytes
read: the manifest records the sha256 of every file at build time (`"files"`), and
`verify_cache` (`python -m tinydecoder verify`) compares them; a normal load never hashes
the ~540 MB. Caches written before hashes were recorded (the same format 3, no `"files"`)
still load as they are; `record_hashes` adds the hashes of their current files.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.config import Config
from .gguf_file import (
    GGUFFormatError,
    UnsupportedModelError,
    check_tensors,
    config_from_gguf,
    file_sha256,
    open_gguf,
    verify_sha256,
)
from .tokenizer import Tokenizer, tokenizer_from_gguf
from .weights import array_order, array_shapes, write_weights

CACHE_FORMAT = 5  # 5: every matrix out-major (Fortran order, see weights.FORTRAN_ORDER); 3 and 4 are rebuilt
# (the optional "files" hashes did not change the format: caches without them load as they are)
MANIFEST = "manifest.json"


class CacheDamagedError(GGUFFormatError):
    """A cache folder with a missing, unreadable or wrongly shaped file (it can be rebuilt)."""


def default_cache_root() -> Path:
    """$TINYDECODER_CACHE, else $XDG_CACHE_HOME/tinydecoder, else ~/.cache/tinydecoder."""
    if os.environ.get("TINYDECODER_CACHE"):
        return Path(os.environ["TINYDECODER_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "tinydecoder"


def cache_dir_for(sha256: str, cache_root=None) -> Path:
    """The folder that holds (or will hold) a GGUF's float32 weights: <root>/<sha256>."""
    return (default_cache_root() if cache_root is None else Path(cache_root)) / sha256


# ---------------------------------------------------------------------------- building

def build_cache(path, cache_dir, *, progress: bool = True, sha256: str | None = None,
                reason: str | None = None) -> Path:
    """Dequantise a GGUF into `cache_dir` (weights in the "halves" layout, the tokenizer when the
    file has one, and manifest.json with every file's sha256). Written under a temporary name,
    then renamed. `reason`: why an existing cache is rebuilt (said on stderr, replacing it)."""
    path, cache_dir = Path(path), Path(cache_dir)
    if reason is not None:
        print(f"tinydecoder: rebuilding the weight cache {cache_dir} from {path.name} ({reason})",
              file=sys.stderr, flush=True)
    elif progress:
        print(f"first load of {path.name}: dequantising it to float32 into {cache_dir} (once per file)",
              file=sys.stderr, flush=True)
    reader = open_gguf(path)
    cfg = config_from_gguf(reader)
    check_tensors(reader, cfg)
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{cache_dir.name}.partial-", dir=cache_dir.parent))
    try:
        def allocate(name, shape, order):
            return np.lib.format.open_memmap(tmp / f"{name}.npy", mode="w+", dtype=np.float32, shape=shape,
                                             fortran_order=order == "F")

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
                    "tokenizer": has_tokenizer, "files": hash_files(tmp)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        if reason is not None:
            discard(cache_dir)
        try:
            os.rename(tmp, cache_dir)
        except OSError:
            if not (cache_dir / MANIFEST).is_file():  # not another process finishing first
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return cache_dir


def discard(cache_dir) -> None:
    """Remove a cache folder: renamed aside first, so no reader ever sees it half deleted."""
    cache_dir = Path(cache_dir)
    if not cache_dir.exists():
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{cache_dir.name}.old-", dir=cache_dir.parent))
    os.rename(cache_dir, aside / cache_dir.name)
    shutil.rmtree(aside, ignore_errors=True)


def hash_files(cache_dir) -> dict:
    """{file name: sha256} of every file of a cache folder but its manifest."""
    return {p.name: file_sha256(p) for p in sorted(Path(cache_dir).iterdir())
            if p.is_file() and p.name != MANIFEST}


# ---------------------------------------------------------------------------- loading

def read_manifest(cache_dir) -> dict:
    """The cache's manifest; CacheDamagedError saying why when it is missing, unreadable or of
    another format."""
    file = Path(cache_dir) / MANIFEST
    try:
        manifest = json.loads(file.read_text())
    except FileNotFoundError:
        raise CacheDamagedError(f"{MANIFEST}: missing") from None
    except (OSError, ValueError) as exc:
        raise CacheDamagedError(f"{MANIFEST}: unreadable ({type(exc).__name__}: {exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != CACHE_FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise CacheDamagedError(f"{MANIFEST}: format {found!r}, this version reads format {CACHE_FORMAT}")
    try:
        Config(**manifest["config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CacheDamagedError(f"{MANIFEST}: no valid config ({type(exc).__name__}: {exc})") from None
    return manifest


def array_problem(file, shape, order: str = "C") -> str | None:
    """What is wrong with a cached `.npy` file that a load can see without reading its data
    (missing, a bad header, fewer bytes than the header says, a wrong shape, dtype or memory
    order), or None."""
    try:
        array = np.load(file, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError) as exc:
        return f"unreadable ({exc})"
    if array.shape != tuple(shape) or array.dtype != np.float32:
        return f"holds {array.dtype} {array.shape}, expected float32 {tuple(shape)}"
    if len(shape) > 1 and not array.flags[f"{order}_CONTIGUOUS"]:
        return f"not stored in {order} order"
    return None


def load_cached_arrays(cache_dir, cfg: Config) -> dict:
    """Memory-map every weight of a cache (read-only, no pickle); CacheDamagedError naming the
    first file that is missing, truncated or of the wrong shape or dtype."""
    arrays = {}
    for name, shape in array_shapes(cfg).items():
        file = Path(cache_dir) / f"{name}.npy"
        problem = array_problem(file, shape, array_order(name))
        if problem is not None:
            raise CacheDamagedError(f"{file.name}: {problem}")
        array = np.load(file, mmap_mode="r", allow_pickle=False)
        arrays[name] = array.view(np.ndarray)  # a plain ndarray view of the map: no subclass overhead
    return arrays


def load_cached_tokenizer(cache_dir) -> Tokenizer:
    """The tokenizer saved in a cache; CacheDamagedError if its files are missing or unreadable."""
    try:
        return Tokenizer.load(cache_dir)
    except Exception as exc:  # the tokenizers library raises a bare Exception on a bad file
        raise CacheDamagedError(f"tokenizer files: unreadable ({type(exc).__name__}: {exc})") from None


@contextlib.contextmanager
def build_lock(cache_dir, progress: bool = True):
    """Held while a process builds `cache_dir`, so that two processes starting at once (two
    notebooks, two test workers) build it once: the second waits, then finds it built. An
    exclusive lock on the file `.<name>.lock` beside the folder, removed by the process that held
    it (POSIX; elsewhere no lock, and a second build is harmless: the first rename wins)."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    cache_dir = Path(cache_dir)
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    path = cache_dir.parent / f".{cache_dir.name}.lock"
    with open(path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                print(f"tinydecoder: another process is building {cache_dir}; waiting for it",
                      file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:  # removed while still held: a waiter holds it open, then finds the folder built
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_ino == os.fstat(lock.fileno()).st_ino:  # not a newer process's lock
                    path.unlink()


def ensure_cache(path, *, expected_sha256: str | None = None, cache_root=None, progress: bool = True,
                 verified_sha256: str | None = None):
    """Verify the GGUF file and return (cache folder, manifest), building the cache if needed
    (and rebuilding it, with a line on stderr, if its manifest is damaged or outdated).
    verified_sha256: the file's sha256 when the caller has just verified it (not hashed again)."""
    sha256 = verified_sha256 or verify_sha256(path, expected_sha256)
    cache_dir = cache_dir_for(sha256, cache_root)
    if not cache_dir.exists():
        with build_lock(cache_dir, progress):
            if not cache_dir.exists():  # another process may have built it while this one waited
                build_cache(path, cache_dir, progress=progress, sha256=sha256)
    else:
        try:
            return cache_dir, read_manifest(cache_dir)
        except CacheDamagedError as exc:
            build_cache(path, cache_dir, progress=progress, sha256=sha256, reason=str(exc))
    return cache_dir, read_manifest(cache_dir)


def weights_from_cache(path, **kw) -> tuple:
    """(Config, {array name: memory-mapped array}) of a GGUF file through its cache, built on
    first use and rebuilt when a file is missing or damaged. Keywords as `ensure_cache`."""
    cache_dir, manifest = ensure_cache(path, **kw)
    cfg = Config(**manifest["config"])
    try:
        return cfg, load_cached_arrays(cache_dir, cfg)
    except CacheDamagedError as exc:
        build_cache(path, cache_dir, progress=kw.get("progress", True), sha256=cache_dir.name,
                    reason=str(exc))
    cfg = Config(**read_manifest(cache_dir)["config"])
    return cfg, load_cached_arrays(cache_dir, cfg)


def tokenizer_from_cache(path, **kw) -> Tokenizer:
    """The tokenizer of a GGUF file through its cache: the weight cache's when that is built (or
    rebuilt when damaged, as `weights_from_cache`), else a folder of the tokenizer alone beside
    it, <root>/<sha256>.tokenizer (written on first use): a model read from the file's own blocks
    (weights="q4_1") needs no float32 weights, so its first run does not dequantise them."""
    sha256 = verify_sha256(path, kw.get("expected_sha256"))
    cache_dir = cache_dir_for(sha256, kw.get("cache_root"))
    if not cache_dir.exists():
        alone = cache_dir.with_name(cache_dir.name + ".tokenizer")
        with contextlib.suppress(CacheDamagedError):
            if alone.exists():
                return load_cached_tokenizer(alone)
        return _save_tokenizer_alone(path, alone)
    cache_dir, manifest = ensure_cache(path, **kw, verified_sha256=sha256)
    if not manifest.get("tokenizer"):
        raise UnsupportedModelError(f"{Path(path).name} carries no tokenizer (no tokenizer.ggml.tokens)")
    try:
        return load_cached_tokenizer(cache_dir)
    except CacheDamagedError as exc:
        build_cache(path, cache_dir, progress=kw.get("progress", True), sha256=cache_dir.name,
                    reason=str(exc))
    return load_cached_tokenizer(cache_dir)


def _save_tokenizer_alone(path, folder: Path) -> Tokenizer:
    """Parse the GGUF's tokenizer (~3 s) and save it in `folder` (written under a temporary name,
    then renamed: whole or absent); returns it."""
    reader = open_gguf(path)
    if "tokenizer.ggml.tokens" not in reader.fields:
        raise UnsupportedModelError(f"{Path(path).name} carries no tokenizer (no tokenizer.ggml.tokens)")
    tokenizer = tokenizer_from_gguf(reader)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.partial-", dir=folder.parent))
    try:
        tokenizer.save(tmp)
        discard(folder)  # a damaged one
        with contextlib.suppress(OSError):  # another process finishing first keeps its copy
            os.rename(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tokenizer


# ---------------------------------------------------------------------------- verifying

@dataclass
class CacheReport:
    """What `verify_cache` found: one line per damaged file, and how many files it hashed."""

    cache_dir: Path
    hashes_recorded: bool  # False for a cache built before the manifest recorded sha256s
    checked: int = 0  # files whose sha256 was compared with the manifest's
    problems: list = field(default_factory=list)  # "file: what is wrong", one per file


def verify_cache(cache_dir) -> CacheReport:
    """Check a cache folder: what a load checks (manifest, every array's shape and dtype, file
    lengths), then every file's sha256 against the manifest's (reads every byte: ~540 MB for
    SmolLM2, about a second), which catches damage that keeps a file's size."""
    cache_dir = Path(cache_dir)
    try:
        manifest = read_manifest(cache_dir)
    except CacheDamagedError as exc:
        return CacheReport(cache_dir, hashes_recorded=False, problems=[str(exc)])
    recorded = manifest.get("files")
    report = CacheReport(cache_dir, hashes_recorded=isinstance(recorded, dict))
    damaged = set()
    for name, shape in array_shapes(Config(**manifest["config"])).items():
        problem = array_problem(cache_dir / f"{name}.npy", shape, array_order(name))
        if problem is not None:
            report.problems.append(f"{name}.npy: {problem}")
            damaged.add(f"{name}.npy")
    for name, expected in sorted((recorded or {}).items()):
        file = cache_dir / name
        if name in damaged:
            continue
        if not file.is_file():
            report.problems.append(f"{name}: missing")
            continue
        actual = file_sha256(file)
        report.checked += 1
        if actual != expected:
            report.problems.append(f"{name}: sha256 {actual[:16]}... differs from the one recorded at build "
                                   f"time ({expected[:16]}...)")
    return report


def record_hashes(cache_dir) -> int:
    """Record the sha256 of every file of a cache in its manifest, trusting the files as they are
    now (for a cache built before hashes were recorded). Returns the number of files hashed."""
    cache_dir = Path(cache_dir)
    manifest = read_manifest(cache_dir)
    manifest["files"] = hash_files(cache_dir)
    tmp = cache_dir / f".{MANIFEST}.partial"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, cache_dir / MANIFEST)
    return len(manifest["files"])
