"""Load a Llama-architecture GGUF file (such as SmolLM2-135M) into a tinydecoder `Model`.

The `gguf` package parses the file and dequantises its tensors (Q4_1, Q8_0, ...) to numpy;
this module checks the file, builds the `Config` from the file's metadata, and lays the
weights out the way `forward` reads them. Two conventions meet here.

Orientation. GGUF lists a matrix's shape as [in, out] with `in` varying fastest in memory,
so the numpy array `gguf` returns is (out, in), one row per output feature, and llama.cpp
(like PyTorch) computes x @ W.T. tinydecoder computes x @ w with w laid out [in, out], so
every matrix is transposed once, when the float32 cache is written. The embedding stays
(V, D), a row per token, and a tied output head is its transpose (a view, not a copy).

RoPE layout. RoPE rotates pairs of a head's d coordinates by position-dependent angles.
Hugging Face Llama pairs coordinate i with i + d/2 ("halves", rotate_half); llama.cpp pairs
neighbours 2i and 2i + 1 ("interleaved"). So llama.cpp's converter reorders the rows of each
Q and K head, HF row j*d/2 + i -> GGUF row 2i + j (j = 0, 1):

    gguf_w = hf_w.reshape(H, 2, d // 2, n_in).swapaxes(1, 2).reshape(hf_w.shape)   # permute_qk
    hf_w = gguf_w.reshape(H, d // 2, 2, n_in).swapaxes(1, 2).reshape(gguf_w.shape)  # unpermute_qk

Both conventions give the same attention scores and logits, as long as the weights and the
rotation agree: the permutation renames the coordinates of q and k alike, and q . k sums
over all coordinates. V and the output projection are not permuted. By default the loader
undoes the permutation and sets `rope_layout="halves"` (the layout the notebooks explain);
`rope_layout="interleaved"` keeps the file's row order and rotates neighbouring pairs.

Cache. Dequantising takes seconds, so the first load writes every float32 weight, already
transposed, as a `.npy` file into a cache folder named by the GGUF's sha256
(`$TINYDECODER_CACHE`, else `$XDG_CACHE_HOME/tinydecoder`, else `~/.cache/tinydecoder`).
The folder is written under a temporary name and renamed when complete, so a crash never
leaves half a cache. Later loads verify the sha256 and memory-map the `.npy` files
(read-only; nothing is unpickled). The embedding is stored transposed, [D, V], and `embed` is
a [V, D] view of it, so that the tied output head `embed.T` is contiguous. Q, K and V of a
layer are stored side by side in one [D, (Hq + 2 Hkv) d] array and gate and up in one [D, 2F]
array; `wq`, `wk`, `wv`, `w_gate`, `w_up` are views into them, so a decode step runs one
matmul for each group (see `LayerWeights.w_qkv`). The weights exist once, in the cache.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

from ..core.config import Config
from ..core.model import LayerWeights, Model
from ..core.rope import with_layout

SUPPORTED_ARCHITECTURES = ("llama",)
CACHE_FORMAT = 3
_MISSING = object()


class GGUFError(ValueError):
    """A GGUF file that this loader cannot use (the subclasses say why)."""


class GGUFFormatError(GGUFError):
    """The file is not a readable GGUF file: truncated, corrupt, or something else entirely."""


class UnsupportedModelError(GGUFError):
    """A valid GGUF file holding a model this loader does not implement."""


class ChecksumError(GGUFError):
    """The file's sha256 is not the one expected: a damaged or different file."""


def _supported_types():
    from gguf import GGMLQuantizationType as T

    return (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)


# ---------------------------------------------------------------------------- the file itself

def file_sha256(path) -> str:
    """Hex sha256 of a file's bytes."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def verify_sha256(path, expected: str | None) -> str:
    """Return the file's sha256; raise ChecksumError when `expected` is given and differs."""
    path = _existing_file(path)
    actual = file_sha256(path)
    if expected is not None and actual != expected.lower():
        raise ChecksumError(
            f"{path.name} failed its checksum: sha256 is {actual}, expected {expected.lower()} "
            f"({path.stat().st_size:,} bytes on disk). The file is damaged, truncated or a different "
            f"version; reinstall it rather than use it.")
    return actual


def _existing_file(path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    return path


def open_gguf(path):
    """Parse a GGUF file with `gguf.GGUFReader`; raise GGUFFormatError if it is not a whole,
    readable GGUF file (bad magic, cut short, inconsistent offsets)."""
    import gguf

    path = _existing_file(path)
    size = path.stat().st_size
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as exc:  # gguf raises ValueError, IndexError, struct errors... on bad bytes
        raise GGUFFormatError(
            f"{path.name} is not a readable GGUF file ({size:,} bytes): it is truncated or corrupt "
            f"({type(exc).__name__}: {exc})") from None
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size or tensor.data.nbytes != tensor.n_bytes:
            raise GGUFFormatError(
                f"{path.name} is truncated: tensor {tensor.name!r} needs bytes up to {end:,} but the "
                f"file has {size:,}")
    return reader


def metadata_value(reader, key: str, default=_MISSING):
    """A metadata value as a Python object (str, int, float, bool or list)."""
    field = reader.fields.get(key)
    if field is None:
        if default is _MISSING:
            raise UnsupportedModelError(f"the GGUF metadata has no {key!r}, which a Llama model needs")
        return default
    value = field.contents()
    return value.item() if isinstance(value, np.generic) else value


# ---------------------------------------------------------------------------- the config

def config_from_gguf(reader, name: str | None = None, rope_layout: str = "halves") -> Config:
    """The model's shapes and constants, read from the GGUF metadata (`<arch>.*` keys)."""
    arch = metadata_value(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"architecture {arch!r} is not supported: this loader implements {SUPPORTED_ARCHITECTURES} "
            f"(pre-norm RMSNorm blocks, GQA attention with RoPE, SwiGLU feed-forward)")
    for key in (f"{arch}.expert_count", f"{arch}.rope.scaling.type", f"{arch}.attention.sliding_window"):
        value = metadata_value(reader, key, None)
        if value not in (None, 0, "none"):
            raise UnsupportedModelError(f"{key} = {value!r} is not supported (plain Llama blocks only)")

    def get(key, default=_MISSING):
        return metadata_value(reader, f"{arch}.{key}", default)

    d_model, n_heads = int(get("embedding_length")), int(get("attention.head_count"))
    n_kv_heads = int(get("attention.head_count_kv", n_heads))
    head_dim = int(get("attention.key_length", d_model // n_heads))
    rope_dim = int(get("rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise UnsupportedModelError(
            f"partial RoPE (rope.dimension_count {rope_dim} < head dim {head_dim}) is not supported")
    embd = _tensor_map(reader).get("token_embd.weight")
    vocab = get("vocab_size", None)
    if vocab is None:
        vocab = len(metadata_value(reader, "tokenizer.ggml.tokens", [])) or (
            int(embd.shape[-1]) if embd is not None else None)
    if vocab is None:
        raise UnsupportedModelError("cannot tell the vocabulary size: no vocab_size, tokens or token_embd")
    return Config(
        vocab_size=int(vocab), d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads,
        head_dim=head_dim, n_layers=int(get("block_count")), d_ff=int(get("feed_forward_length")),
        max_context=int(get("context_length")), position="rope",
        rope_base=_decimal(get("rope.freq_base", 10000.0)), rope_layout=rope_layout,
        norm_eps=_decimal(get("attention.layer_norm_rms_epsilon")), norm_scale=True,
        tied_embeddings="output.weight" not in _tensor_map(reader),
        name=name or str(metadata_value(reader, "general.name", "gguf-" + arch)))


def _decimal(value) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-05, not
    9.999999747378752e-06): the number the model's authors wrote."""
    value = np.float32(value)
    return float(np.format_float_positional(value, unique=True, trim="-")) if np.isfinite(value) else float(value)


def _tensor_map(reader) -> dict:
    return {t.name: t for t in reader.tensors}


def expected_tensors(cfg: Config) -> dict:
    """GGUF tensor name -> numpy shape (out, in) of every tensor a Llama file must hold."""
    D, F, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
    q_width, kv_width = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    shapes = {"token_embd.weight": (V, D), "output_norm.weight": (D,)}
    if not cfg.tied_embeddings:
        shapes["output.weight"] = (V, D)
    for l in range(cfg.n_layers):
        shapes.update({
            f"blk.{l}.attn_norm.weight": (D,), f"blk.{l}.ffn_norm.weight": (D,),
            f"blk.{l}.attn_q.weight": (q_width, D), f"blk.{l}.attn_k.weight": (kv_width, D),
            f"blk.{l}.attn_v.weight": (kv_width, D), f"blk.{l}.attn_output.weight": (D, q_width),
            f"blk.{l}.ffn_gate.weight": (F, D), f"blk.{l}.ffn_up.weight": (F, D),
            f"blk.{l}.ffn_down.weight": (D, F)})
    return shapes


def check_tensors(reader, cfg: Config) -> None:
    """Every tensor present, of a supported type and of the shape the config implies."""
    tensors, expected = _tensor_map(reader), expected_tensors(cfg)
    supported = _supported_types()
    for name, tensor in tensors.items():
        if name not in expected:
            raise UnsupportedModelError(
                f"unexpected tensor {name!r}: this loader implements plain Llama blocks "
                f"(no biases, no mixture of experts, no rope_freqs)")
        if tensor.tensor_type not in supported:
            raise UnsupportedModelError(
                f"tensor {name!r} is stored as {tensor.tensor_type.name}, which is not supported; "
                f"supported types: {', '.join(t.name for t in supported)}")
    for name, shape in expected.items():
        if name not in tensors:
            raise UnsupportedModelError(f"the file has no tensor {name!r}, which the config needs")
        got = tuple(int(n) for n in reversed(tensors[name].shape))  # GGUF lists [in, out]
        if got != shape:
            raise UnsupportedModelError(f"tensor {name!r} has shape {got} (out, in), the config needs {shape}")


# ---------------------------------------------------------------------------- the weights

def dequantize_tensor(tensor) -> np.ndarray:
    """A GGUF tensor as float32, shaped (out, in) for a matrix (row-major, `in` fastest)."""
    from gguf.quants import dequantize

    shape = tuple(int(n) for n in reversed(tensor.shape))
    return np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)


def permute_qk(w, n_heads: int) -> np.ndarray:
    """Hugging Face row order -> llama.cpp's: per head, row j*d/2 + i moves to row 2i + j.

    w is (n_heads * d, n_in), one row per output feature. (What llama.cpp's converter does.)"""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, -1).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w, n_heads: int) -> np.ndarray:
    """llama.cpp row order -> Hugging Face's (the inverse of `permute_qk`)."""
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def array_shapes(cfg: Config) -> dict:
    """Cache array name -> shape, in tinydecoder's [in, out] layout, fused where it helps."""
    D, F = cfg.d_model, cfg.d_ff
    q_width, kv_width = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    shapes = {"token_embd": (D, cfg.vocab_size), "output_norm": (D,)}  # stored transposed, see below
    if not cfg.tied_embeddings:
        shapes["output"] = (D, cfg.vocab_size)
    for l in range(cfg.n_layers):
        shapes.update({
            f"blk.{l}.attn_norm": (D,), f"blk.{l}.ffn_norm": (D,),
            f"blk.{l}.attn_qkv": (D, q_width + 2 * kv_width), f"blk.{l}.attn_output": (q_width, D),
            f"blk.{l}.ffn_gate_up": (D, 2 * F), f"blk.{l}.ffn_down": (F, D)})
    return shapes


def _destination(cfg: Config, gguf_name: str):
    """Where a GGUF tensor goes: (array name, column slice or None, transpose?)."""
    if not gguf_name.startswith("blk."):
        base = gguf_name.removesuffix(".weight")
        return base, None, base in ("output", "token_embd")
    _, l, part, _ = gguf_name.split(".")
    q_width, kv_width, F = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.d_ff
    columns = {"attn_q": ("attn_qkv", 0, q_width), "attn_k": ("attn_qkv", q_width, q_width + kv_width),
               "attn_v": ("attn_qkv", q_width + kv_width, q_width + 2 * kv_width),
               "ffn_gate": ("ffn_gate_up", 0, F), "ffn_up": ("ffn_gate_up", F, 2 * F)}
    if part in columns:
        name, a, b = columns[part]
        return f"blk.{l}.{name}", slice(a, b), True
    return f"blk.{l}.{part}", None, part in ("attn_output", "ffn_down")


def write_weights(reader, cfg: Config, allocate, progress: bool = True, desc: str = "dequantising") -> dict:
    """Dequantise every tensor into arrays from `allocate(name, shape)` (np.empty or a .npy
    memmap); one tensor at a time is held as a temporary. Returns {array name: array}."""
    from tqdm import tqdm

    arrays = {name: allocate(name, shape) for name, shape in array_shapes(cfg).items()}
    heads = {"attn_q": cfg.n_heads, "attn_k": cfg.n_kv_heads}
    for tensor in tqdm(reader.tensors, desc=desc, unit="tensor", file=sys.stderr,
                       disable=not progress, leave=False):
        w = dequantize_tensor(tensor)  # (out, in)
        part = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else None
        if part in heads and cfg.rope_layout == "halves":
            w = unpermute_qk(w, heads[part])
        name, columns, transpose = _destination(cfg, tensor.name)
        target = arrays[name] if columns is None else arrays[name][:, columns]
        target[...] = w.T if transpose else w
    return arrays


def assemble_model(cfg: Config, arrays: dict) -> Model:
    """A Model whose weights are views of `arrays` (see `array_shapes`)."""
    layers = [LayerWeights(w_qkv=arrays[f"blk.{l}.attn_qkv"], wo=arrays[f"blk.{l}.attn_output"],
                           w_gate_up=arrays[f"blk.{l}.ffn_gate_up"], w_down=arrays[f"blk.{l}.ffn_down"],
                           attn_norm=arrays[f"blk.{l}.attn_norm"], ffn_norm=arrays[f"blk.{l}.ffn_norm"])
              for l in range(cfg.n_layers)]
    # The embedding is stored [D, V] and used through its transpose: embed[ids] gathers rows of
    # a [V, D] view (a few microseconds a token), while the tied head, embed.T, is then a
    # contiguous [D, V] matrix, which a decode step's matrix-vector product reads ~1.5x faster.
    return Model(cfg, embed=arrays["token_embd"].T, layers=layers, final_norm=arrays["output_norm"],
                 lm_head=arrays.get("output"))


# ---------------------------------------------------------------------------- the cache

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
            from .tokenizer import tokenizer_from_gguf

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


def load_gguf_model(path, *, expected_sha256: str | None = None, rope_layout: str = "halves",
                    use_cache: bool = True, cache_root=None, progress: bool = True,
                    name: str | None = None) -> Model:
    """A float32 `Model` from a Llama GGUF file.

    expected_sha256: refuse a file whose sha256 differs (ChecksumError).
    rope_layout: "halves" (undo llama.cpp's Q/K permutation; the default) or "interleaved"
        (keep the file's row order). Both give the same logits; see the module docstring.
    use_cache: memory-map float32 weights from the cache folder (building it on first use,
        with a progress bar on stderr when `progress`); False dequantises into memory.
    Raises FileNotFoundError, GGUFFormatError, UnsupportedModelError or ChecksumError."""
    if rope_layout not in ("halves", "interleaved"):
        raise ValueError(f"rope_layout must be 'halves' or 'interleaved', got {rope_layout!r}")
    if use_cache:
        try:
            cache_dir, manifest = ensure_cache(path, expected_sha256=expected_sha256,
                                               cache_root=cache_root, progress=progress)
        except OSError as exc:  # e.g. a read-only home or a full disk: load into memory instead
            if isinstance(exc, FileNotFoundError) and not Path(path).is_file():
                raise
            warnings.warn(f"could not use the weight cache ({exc}); dequantising into memory",
                          RuntimeWarning, stacklevel=2)
            return load_gguf_model(path, expected_sha256=expected_sha256, rope_layout=rope_layout,
                                   use_cache=False, progress=progress, name=name)
        cfg = Config(**{**manifest["config"], **({"name": name} if name else {})})
        model = assemble_model(cfg, load_cached_arrays(cache_dir, cfg))
        return to_interleaved(model) if rope_layout == "interleaved" else model
    verify_sha256(path, expected_sha256)
    reader = open_gguf(path)
    cfg = config_from_gguf(reader, name=name, rope_layout=rope_layout)
    check_tensors(reader, cfg)
    arrays = write_weights(reader, cfg, lambda n, shape: np.empty(shape, np.float32), progress)
    return assemble_model(cfg, arrays)


def to_interleaved(model: Model) -> Model:
    """The same model with llama.cpp's Q/K row order and rope_layout "interleaved" (only Q and
    K are rearranged, into new arrays; everything else is shared with `model`). It is
    `rope.with_layout(model, "interleaved")`: per head, the column permutation that
    `permute_qk` applies to the GGUF's rows."""
    return with_layout(model, "interleaved")
