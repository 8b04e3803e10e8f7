"""A Llama-architecture GGUF file (such as SmolLM2-135M): open and check it, read the `Config`
from its metadata, dequantise a tensor, and convert between two Q/K row orders.

The `gguf` package parses the file and dequantises its tensors (Q4_1, Q8_0, ...) to numpy.
GGUF lists a matrix's shape as [in, out] with `in` varying fastest in memory, so the numpy
array `gguf` returns is (out, in), one row per output feature (llama.cpp, like PyTorch,
computes x @ W.T); `weights.py` transposes them into tinydecoder's [in, out].

RoPE layout. RoPE rotates pairs of a head's d coordinates by position-dependent angles.
Hugging Face Llama pairs coordinate i with i + d/2 ("halves", rotate_half); llama.cpp pairs
neighbours 2i and 2i + 1 ("interleaved"). So llama.cpp's converter reorders the rows of each
Q and K head, HF row j*d/2 + i -> GGUF row 2i + j (j = 0, 1):

    gguf_w = hf_w.reshape(H, 2, d // 2, n_in).swapaxes(1, 2).reshape(hf_w.shape)   # permute_qk
    hf_w = gguf_w.reshape(H, d // 2, 2, n_in).swapaxes(1, 2).reshape(gguf_w.shape)  # unpermute_qk

Both conventions give the same attention scores and logits, as long as the weights and the
rotation agree: the permutation renames the coordinates of q and k alike, and q . k sums
over all coordinates. V and the output projection are not permuted.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numpy as np

from ..core.config import Config

SUPPORTED_ARCHITECTURES = ("llama",)
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


def open_gguf(path, *, keep: bool = True):
    """Parse a GGUF file with `gguf.GGUFReader`; raise GGUFFormatError if it is not a whole,
    readable GGUF file (bad magic, cut short, inconsistent offsets).

    Parsing SmolLM2's file takes ~2 s (its 49,152-token vocabulary is metadata), so the last
    file opened is kept: opening the same path again, unchanged (same size and modification
    time, same inode), returns the same read-only reader. keep=False parses it afresh and keeps
    nothing (the parsed metadata, ~180 MB for SmolLM2, goes with the reader)."""
    path = _existing_file(path)
    stat = path.stat()
    opener = _open_gguf if keep else _open_gguf.__wrapped__
    return opener(path.resolve(), stat.st_size, stat.st_mtime_ns, stat.st_ino)


@functools.lru_cache(maxsize=1)
def _open_gguf(path: Path, size: int, mtime_ns: int, inode: int):
    import gguf

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
    embd = tensor_map(reader).get("token_embd.weight")
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
        tied_embeddings="output.weight" not in tensor_map(reader),
        name=name or str(metadata_value(reader, "general.name", "gguf-" + arch)))


def _decimal(value) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-05, not
    9.999999747378752e-06): the number the model's authors wrote."""
    value = np.float32(value)
    return float(np.format_float_positional(value, unique=True, trim="-")) if np.isfinite(value) else float(value)


def tensor_map(reader) -> dict:
    """GGUF tensor name -> the reader's tensor."""
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
    tensors, expected = tensor_map(reader), expected_tensors(cfg)
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


# ---------------------------------------------------------------------------- tensors and row orders

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
