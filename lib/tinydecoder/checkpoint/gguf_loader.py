"""Load a Llama-architecture GGUF file (such as SmolLM2-135M) into a tinydecoder `Model`,
and its tokenizer: the entry points above the parts that do the work.

    gguf_file.py   the file: checks, errors, the Config from its metadata, dequantising, Q/K row orders
    weights.py     the tensors laid out as `forward` reads them (transposed, fused), the Model on them
    tokenizer.py   the byte-level BPE tokenizer the file carries
    store.py       the on-disk float32 cache of both, keyed by the file's sha256

By default the loader undoes llama.cpp's Q/K permutation and sets `rope_layout="halves"` (the
layout the notebooks explain); `rope_layout="interleaved"` keeps the file's row order and
rotates neighbouring pairs. Both give the same logits (see gguf_file.py).
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from ..core.config import Config
from ..core.model import Model
from .gguf_file import (
    ChecksumError,
    GGUFError,
    GGUFFormatError,
    UnsupportedModelError,
    check_tensors,
    config_from_gguf,
    open_gguf,
    permute_qk,
    unpermute_qk,
    verify_sha256,
)
from .store import tokenizer_from_cache, weights_from_cache
from .tokenizer import Tokenizer, tokenizer_from_gguf
from .weights import assemble_model, to_interleaved, write_weights

__all__ = ["load_gguf_model", "load_gguf_tokenizer", "permute_qk", "unpermute_qk", "to_interleaved",
           "GGUFError", "GGUFFormatError", "UnsupportedModelError", "ChecksumError"]


def load_gguf_model(path, *, expected_sha256: str | None = None, rope_layout: str = "halves",
                    use_cache: bool = True, cache_root=None, progress: bool = True,
                    name: str | None = None) -> Model:
    """A float32 `Model` from a Llama GGUF file.

    expected_sha256: refuse a file whose sha256 differs (ChecksumError).
    rope_layout: "halves" (undo llama.cpp's Q/K permutation; the default) or "interleaved"
        (keep the file's row order). Both give the same logits; see the module docstring.
    use_cache: memory-map float32 weights from the cache folder (building it on first use,
        with a progress bar on stderr when `progress`, and rebuilding it, with a line on
        stderr, when a file is missing or damaged); False dequantises into memory.
    Raises FileNotFoundError, GGUFFormatError, UnsupportedModelError or ChecksumError."""
    if rope_layout not in ("halves", "interleaved"):
        raise ValueError(f"rope_layout must be 'halves' or 'interleaved', got {rope_layout!r}")
    if use_cache:
        try:
            cfg, arrays = weights_from_cache(path, expected_sha256=expected_sha256, cache_root=cache_root,
                                             progress=progress)
        except OSError as exc:  # e.g. a read-only home or a full disk: load into memory instead
            if isinstance(exc, FileNotFoundError) and not Path(path).is_file():
                raise
            warnings.warn(f"could not use the weight cache ({exc}); dequantising into memory",
                          RuntimeWarning, stacklevel=2)
            return load_gguf_model(path, expected_sha256=expected_sha256, rope_layout=rope_layout,
                                   use_cache=False, progress=progress, name=name)
        if name:
            cfg = Config(**{**cfg.to_dict(), "name": name})
        model = assemble_model(cfg, arrays)
        return to_interleaved(model) if rope_layout == "interleaved" else model
    verify_sha256(path, expected_sha256)
    reader = open_gguf(path)
    cfg = config_from_gguf(reader, name=name, rope_layout=rope_layout)
    check_tensors(reader, cfg)
    arrays = write_weights(reader, cfg, lambda n, shape, order: np.empty(shape, np.float32, order=order), progress)
    return assemble_model(cfg, arrays)


def load_gguf_tokenizer(path, *, expected_sha256: str | None = None, use_cache: bool = True,
                        cache_root=None, progress: bool = True) -> Tokenizer:
    """The tokenizer of a GGUF file: read from the weight cache (built on first use and rebuilt
    when damaged, see `store.py`), or parsed from the file itself with use_cache=False."""
    if not use_cache:
        verify_sha256(path, expected_sha256)
        return tokenizer_from_gguf(path)
    return tokenizer_from_cache(path, expected_sha256=expected_sha256, cache_root=cache_root, progress=progress)
