"""Quantised weights as the GGUF file stores them: one Q4_1 block decoded by hand.

A Q4_1 block holds 32 consecutive weights of a row in 20 bytes:

    bytes 0-1    d, the scale (float16, little-endian)
    bytes 2-3    m, the minimum (float16)
    bytes 4-19   16 bytes of 4-bit codes q in 0..15: byte j holds weight j in its low
                 nibble and weight j + 16 in its high nibble (llama.cpp's order)

and weight i = d * q_i + m. That is 20 * 8 / 32 = 5 bits per weight instead of float32's 32.
The rule that made it is the min/max one of tinydecoder.algorithms.kv_quant: m = min, d = (max - min) / 15,
q = round((w - m) / d), so every weight is within d / 2 of the number it stands for.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

Q4_1_BLOCK_SIZE = 32  # weights per block
Q4_1_BLOCK_BYTES = 20  # 2 (d) + 2 (m) + 16 (32 codes of 4 bits)


@dataclass
class Q41Block:
    scale: float  # d
    min: float  # m
    codes: np.ndarray  # [32] uint8 in 0..15, in weight order
    values: np.ndarray  # [32] float32: scale * codes + min


def decode_q4_1_block(raw) -> Q41Block:
    """Decode one 20-byte Q4_1 block from its raw bytes (bytes or a uint8 array)."""
    raw = np.frombuffer(bytes(raw), dtype=np.uint8) if isinstance(raw, (bytes, bytearray)) else np.asarray(raw)
    if raw.dtype != np.uint8 or raw.shape != (Q4_1_BLOCK_BYTES,):
        raise ValueError(f"a Q4_1 block is {Q4_1_BLOCK_BYTES} bytes (uint8), got shape {raw.shape}, "
                         f"dtype {raw.dtype}")
    scale = raw[0:2].view("<f2")[0]  # float16 d
    minimum = raw[2:4].view("<f2")[0]  # float16 m
    packed = raw[4:20]  # [16]
    codes = np.concatenate([packed & 0x0F, packed >> 4])  # low nibbles: weights 0..15; high: 16..31
    values = np.float32(scale) * codes.astype(np.float32) + np.float32(minimum)
    return Q41Block(float(scale), float(minimum), codes.astype(np.uint8), values)


def _reader(source):
    """A gguf.GGUFReader for a path (opened and checked), or the reader itself."""
    if isinstance(source, (str, Path)):
        from .gguf_loader import open_gguf

        return open_gguf(source)
    return source


def tensor_info(source, name: str):
    """The GGUF tensor called `name` (a gguf ReaderTensor: name, tensor_type, shape, data)."""
    reader = _reader(source)
    for tensor in reader.tensors:
        if tensor.name == name:
            return tensor
    names = [t.name for t in reader.tensors]
    raise KeyError(f"no tensor {name!r} in the GGUF file; it has {len(names)} tensors, e.g. {names[:4]}")


def q4_1_blocks(source, name: str) -> np.ndarray:
    """The raw bytes of a Q4_1 tensor, one row per block: [n_blocks, 20] uint8 (a view of the file).

    Blocks follow the weights in memory order: row by row of the (out, in) matrix, 32 `in`
    weights at a time. source: a GGUF path or a gguf.GGUFReader."""
    tensor = tensor_info(source, name)
    if tensor.tensor_type.name != "Q4_1":
        raise ValueError(f"tensor {name!r} is stored as {tensor.tensor_type.name}, not Q4_1")
    return np.asarray(tensor.data).reshape(-1, Q4_1_BLOCK_BYTES)


def gguf_dequantize_blocks(raw_blocks, type_name: str = "Q4_1") -> np.ndarray:
    """The `gguf` package's own dequantisation of raw blocks [n, bytes] -> [n, block size]."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType[type_name]
    block_size, _ = GGML_QUANT_SIZES[qtype]
    return np.asarray(dequantize(np.asarray(raw_blocks), qtype), np.float32).reshape(-1, block_size)


def bits_per_weight(type_name: str) -> float:
    """Storage bits per weight of a GGML type: 8 * bytes per block / weights per block."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        qtype = GGMLQuantizationType[type_name]
    except KeyError:
        raise ValueError(f"unknown GGML type {type_name!r}; e.g. F32, F16, Q8_0, Q4_1") from None
    block_size, block_bytes = GGML_QUANT_SIZES[qtype]
    return 8 * block_bytes / block_size


def size_breakdown(path) -> dict:
    """Where a GGUF file's bytes go, and how it compares with the same weights in float32.

    Returns {"types": {type: {"tensors", "weights", "bytes", "bits_per_weight"}}, "weights",
    "tensor_bytes", "file_bytes", "float32_bytes", "ratio_tensors", "ratio_file"}."""
    path = Path(path)
    reader = _reader(path)
    types = {}
    for tensor in reader.tensors:
        row = types.setdefault(tensor.tensor_type.name, {"tensors": 0, "weights": 0, "bytes": 0})
        row["tensors"] += 1
        row["weights"] += int(tensor.n_elements)
        row["bytes"] += int(tensor.n_bytes)
    for name, row in types.items():
        row["bits_per_weight"] = bits_per_weight(name)
    weights = sum(r["weights"] for r in types.values())
    tensor_bytes = sum(r["bytes"] for r in types.values())
    file_bytes = path.stat().st_size
    return {"types": types, "weights": weights, "tensor_bytes": tensor_bytes, "file_bytes": file_bytes,
            "float32_bytes": 4 * weights, "ratio_tensors": 4 * weights / tensor_bytes,
            "ratio_file": 4 * weights / file_bytes}


def q4_1_round_trip(weights) -> tuple:
    """Quantise float weights [n * 32] to Q4_1's rule (4 bits, groups of 32, float16 scale and
    min) and back. Returns (values [n * 32] float32, scale per weight [n * 32])."""
    from ..algorithms.kv_quant import dequantize, quantize

    w = np.asarray(weights, np.float32)
    if w.ndim != 1 or w.size % Q4_1_BLOCK_SIZE:
        raise ValueError(f"weights must be a flat array whose length is a multiple of {Q4_1_BLOCK_SIZE}, "
                         f"got shape {w.shape}")
    blocks = w.reshape(-1, Q4_1_BLOCK_SIZE)  # [n, 32]
    codes, scale, zero = quantize(blocks, bits=4, axis=1)
    values = dequantize(codes, scale, zero).reshape(-1)
    return values, np.broadcast_to(scale.astype(np.float32), blocks.shape).reshape(-1)
