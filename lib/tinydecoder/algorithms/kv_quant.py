"""A quantised KV cache: integer codes plus per-group scales and zero-points (KIVI-style).

Asymmetric min/max quantisation of one group of numbers x with b bits (levels = 2^b - 1):

    zero  = min(x)                 scale = (max(x) - min(x)) / levels
    code  = round((x - zero) / scale)  in 0..levels
    x_hat = code * scale + zero    so that |x - x_hat| <= scale / 2

Which numbers form a group is the whole question. "token": one position's head vector, cut
into groups of `group_size` channels (one scale per position, KV head and group). "channel":
one channel over `group_size` consecutive positions (one scale per channel per block of
positions). Keys have a few channels that are large at every position (outlier channels), so
a per-token group is stretched by them and every other channel loses its resolution; grouping
keys per channel isolates them. Values have no such channels, and each output mixes values
row by row, so values are best grouped per token (KIVI, Liu et al. 2024).

A per-channel group is only quantised once `group_size` positions have arrived; until then
the not-yet-full group waits in a small float residual (counted in `nbytes`). Scales and
zero-points are stored as float16 (zero rounded down and scale up, so the bound still holds).
4-bit (and 2-bit) codes are packed 2 (4) to a byte.
"""
from __future__ import annotations

import numpy as np

from ..core.cache import check_made_for, common_length
from ..core.config import Config
from ..core.validate import is_int

ALLOWED_BITS = (2, 4, 8)
AXES = ("channel", "token")


# ---------------------------------------------------------------------------- one group rule

def quantize(x, bits: int, axis: int):
    """Asymmetric min/max quantisation of `x`, one group per slice along `axis`.

    Returns codes (uint8, shape of x), scale and zero (float16, x's shape with `axis` of size 1)
    such that |x - dequantize(codes, scale, zero)| <= scale / 2 (up to float rounding)."""
    bits = check_bits(bits)
    levels = 2 ** bits - 1
    x32 = np.asarray(x, dtype=np.float32)
    lo, hi = x32.min(axis=axis, keepdims=True), x32.max(axis=axis, keepdims=True)
    zero = lo.astype(np.float16)
    zero = np.where(zero.astype(np.float32) > lo, np.nextafter(zero, np.float16(-np.inf)), zero)
    scale = ((hi - zero.astype(np.float32)) / levels).astype(np.float16)
    short = scale.astype(np.float32) * levels + zero.astype(np.float32) < hi
    scale = np.where(short, np.nextafter(scale, np.float16(np.inf)), scale)  # top level reaches max
    s32 = scale.astype(np.float32)
    steps = (x32 - zero.astype(np.float32)) / np.where(s32 > 0, s32, np.float32(1))
    codes = np.clip(np.rint(steps), 0, levels).astype(np.uint8)
    return codes, scale, zero


def dequantize(codes, scale, zero, dtype=np.float32) -> np.ndarray:
    """codes * scale + zero, in `dtype` (scale and zero broadcast over their group)."""
    dtype = np.dtype(dtype)
    return codes.astype(dtype) * scale.astype(dtype) + zero.astype(dtype)


def pack(codes, bits: int) -> np.ndarray:
    """Put 8 // bits codes in each byte along the last axis (code j of a byte in bits j*b..)."""
    per = 8 // bits
    if per == 1:
        return codes
    parts = codes.reshape(codes.shape[:-1] + (codes.shape[-1] // per, per)).astype(np.uint8)
    shifts = (np.arange(per, dtype=np.uint8) * bits)  # [per]
    return np.bitwise_or.reduce(parts << shifts, axis=-1).astype(np.uint8)


def unpack(packed, bits: int) -> np.ndarray:
    """The inverse of `pack`: [..., n * bits / 8] bytes -> [..., n] codes."""
    per = 8 // bits
    if per == 1:
        return packed
    shifts = (np.arange(per, dtype=np.uint8) * bits)
    codes = (packed[..., None] >> shifts) & np.uint8(2 ** bits - 1)  # [..., n/per, per]
    return codes.reshape(packed.shape[:-1] + (packed.shape[-1] * per,))


# ---------------------------------------------------------------------------- checks

def check_bits(bits) -> int:
    if not is_int(bits) or int(bits) not in ALLOWED_BITS:
        raise ValueError(f"bits must be one of {ALLOWED_BITS} (codes per byte: 8 // bits), got {bits!r}")
    return int(bits)


def check_axis(name: str, axis) -> str:
    if axis not in AXES:
        raise ValueError(f"{name} must be 'channel' (a group is one channel over group_size positions) "
                         f"or 'token' (a group is group_size channels of one position), got {axis!r}")
    return axis


def check_group_size(group_size, head_dim: int, axes) -> int:
    if not is_int(group_size) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    if "token" in axes and head_dim % group_size:
        raise ValueError(f"group_size {group_size} must divide the head dim {head_dim} when an axis is "
                         f"'token' (groups cut each head vector into equal parts)")
    return int(group_size)


# ---------------------------------------------------------------------------- one stream

class QuantizedStream:
    """One layer's keys (or values): [T, Hkv, d] rows stored as codes, scales and zeros."""

    def __init__(self, n_kv_heads: int, head_dim: int, bits: int, axis: str, group_size: int, dtype):
        self.bits, self.axis, self.group_size, self.dtype = bits, axis, group_size, np.dtype(dtype)
        H, d, g = n_kv_heads, head_dim, group_size
        self.codes = np.zeros((0, H, d * bits // 8), np.uint8)  # [Tq, Hkv, d*bits/8], packed
        group_shape = (0, H, d // g, 1) if axis == "token" else (0, 1, H, d)
        self.scale = np.zeros(group_shape, np.float16)  # token: [T, Hkv, d/g, 1]; channel: [T/g, 1, Hkv, d]
        self.zero = np.zeros(group_shape, np.float16)
        self.residual = np.zeros((0, H, d), self.dtype)  # channel axis: the not-yet-full group

    def __len__(self) -> int:
        return self.codes.shape[0] + self.residual.shape[0]

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scale.nbytes + self.zero.nbytes + self.residual.nbytes

    def _store(self, rows) -> None:
        """Quantise whole groups of rows [n, Hkv, d] and append their codes and scales."""
        n, H, d = rows.shape
        g = self.group_size
        if self.axis == "token":  # groups of g channels: [n, Hkv, d/g, g]
            codes, scale, zero = quantize(rows.reshape(n, H, d // g, g), self.bits, axis=3)
        else:  # groups of g positions: [n/g, g, Hkv, d]
            codes, scale, zero = quantize(rows.reshape(n // g, g, H, d), self.bits, axis=1)
        self.codes = np.concatenate([self.codes, pack(codes.reshape(n, H, d), self.bits)])
        self.scale = np.concatenate([self.scale, scale])
        self.zero = np.concatenate([self.zero, zero])

    def append(self, rows) -> None:
        rows = np.asarray(rows, self.dtype)  # [S, Hkv, d]
        if self.axis == "token":
            self._store(rows)
            return
        waiting = np.concatenate([self.residual, rows])
        full = len(waiting) // self.group_size * self.group_size
        if full:
            self._store(waiting[:full])
        self.residual = waiting[full:].copy()

    def values(self) -> np.ndarray:
        """Every position, dequantised: [T, Hkv, d] in the model dtype."""
        codes = unpack(self.codes, self.bits)  # [Tq, Hkv, d]
        Tq, H, d = codes.shape
        g = self.group_size
        if self.axis == "token":
            deq = dequantize(codes.reshape(Tq, H, d // g, g), self.scale, self.zero, self.dtype)
        else:
            deq = dequantize(codes.reshape(Tq // g, g, H, d), self.scale, self.zero, self.dtype)
        return np.concatenate([deq.reshape(Tq, H, d), self.residual])

    def truncate(self, length: int) -> None:
        """Keep the first `length` positions. A cut through a quantised per-channel group puts
        that group's kept rows, dequantised, back into the residual (to be quantised again)."""
        if self.axis == "token":
            self.codes, self.scale, self.zero = self.codes[:length], self.scale[:length], self.zero[:length]
            return
        if length >= self.codes.shape[0]:
            self.residual = self.residual[:length - self.codes.shape[0]].copy()
            return
        rows = self.values()[:length]
        keep = length // self.group_size  # whole groups kept as codes
        self.codes = self.codes[:keep * self.group_size]
        self.scale, self.zero = self.scale[:keep], self.zero[:keep]
        self.residual = rows[keep * self.group_size:].copy()

    def copy(self) -> QuantizedStream:
        other = object.__new__(QuantizedStream)
        other.__dict__.update(self.__dict__)  # the arrays are never modified in place: sharing is safe
        return other


# ---------------------------------------------------------------------------- the cache

class QuantizedKVCache:
    """A KV cache that stores integer codes; usable wherever a KVCache is (forward, generate).

    bits: 8, 4 or 2. key_axis / value_axis: "channel" or "token" (see the module docstring).
    group_size: channels per group ("token") and positions per group ("channel").
    `append` returns the dequantised K, V of all positions [T, Hkv, d] in `dtype`; `nbytes`
    counts what is stored: packed codes, float16 scales and zeros, and the float residual."""

    def __init__(self, config: Config, bits: int = 8, key_axis: str = "channel",
                 value_axis: str = "token", group_size: int = 32, dtype=np.float32):
        self.config = config
        self.bits = check_bits(bits)
        self.key_axis = check_axis("key_axis", key_axis)
        self.value_axis = check_axis("value_axis", value_axis)
        self.group_size = check_group_size(group_size, config.head_dim, (key_axis, value_axis))
        if (config.head_dim * self.bits) % 8:
            raise ValueError(f"head dim {config.head_dim} cannot be packed at {bits} bits per code")
        self.dtype = np.dtype(dtype)
        if self.dtype.kind != "f":
            raise ValueError(f"dtype must be a float type (the model's), got {self.dtype}")
        H, d = config.n_kv_heads, config.head_dim
        self.k = [QuantizedStream(H, d, self.bits, key_axis, self.group_size, self.dtype)
                  for _ in range(config.n_layers)]
        self.v = [QuantizedStream(H, d, self.bits, value_axis, self.group_size, self.dtype)
                  for _ in range(config.n_layers)]

    def __repr__(self) -> str:
        return (f"QuantizedKVCache(bits={self.bits}, key_axis={self.key_axis!r}, value_axis="
                f"{self.value_axis!r}, group_size={self.group_size}, positions={len(self)})")

    def __len__(self) -> int:
        return common_length([len(s) for s in self.k], "quantized KV cache", "rebuild the cache")

    def check(self, config: Config, dtype=None) -> None:
        check_made_for("quantized KV cache", self.config, self.dtype, config, dtype,
                       "make a new QuantizedKVCache for this model (config=model.config, dtype=model.dtype)")

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.k) + sum(s.nbytes for s in self.v)

    def append(self, layer: int, k_new, v_new):
        """Quantise S new rows for `layer`; return its dequantised K, V for all T positions."""
        self.k[layer].append(k_new)
        self.v[layer].append(v_new)
        return self.k[layer].values(), self.v[layer].values()  # [T, Hkv, d] each

    def truncate(self, length: int) -> None:
        if not 0 <= length <= len(self):
            raise ValueError(f"cannot truncate a cache of {len(self)} positions to {length}")
        for stream in self.k + self.v:
            stream.truncate(length)

    def copy(self, extra: int = 0) -> QuantizedKVCache:
        """An independent copy (`extra` is accepted for KVCache's signature; nothing is preallocated)."""
        other = object.__new__(QuantizedKVCache)
        other.__dict__.update(self.__dict__)
        other.k, other.v = [s.copy() for s in self.k], [s.copy() for s in self.v]
        return other


# ---------------------------------------------------------------------------- measurements

def round_trip(x, bits: int = 8, axis: str = "token", group_size: int = 32, dtype=np.float32):
    """x [T, Hkv, d] through one stream: (dequantised x [T', Hkv, d], per-element scale).

    The scale of each element's group, broadcast to x's shape, is the bound's yardstick:
    |x - x_hat| <= scale / 2. Float rows still in the residual come back exact (scale 0)."""
    x = np.asarray(x)
    T, H, d = x.shape
    stream = QuantizedStream(H, d, check_bits(bits), check_axis("axis", axis),
                             check_group_size(group_size, d, (axis,)), dtype)
    stream.append(x)
    Tq, g = stream.codes.shape[0], stream.group_size
    if axis == "token":
        scale = np.broadcast_to(stream.scale, (Tq, H, d // g, g)).reshape(Tq, H, d)
    else:
        scale = np.broadcast_to(stream.scale, (Tq // g, g, H, d)).reshape(Tq, H, d)
    scale = np.concatenate([scale.astype(np.float32), np.zeros((T - Tq, H, d), np.float32)])
    return stream.values(), scale


def attention_error(q, k, v, bits: int = 8, key_axis: str = "channel", value_axis: str = "token",
                    group_size: int = 32) -> float:
    """Relative error ||o - o_hat|| / ||o|| of causal attention when K and V are quantised."""
    from ..core.ops import attention

    k_hat, _ = round_trip(k, bits, key_axis, group_size, k.dtype)
    v_hat, _ = round_trip(v, bits, value_axis, group_size, v.dtype)
    exact, approx = attention(q, k, v), attention(q, k_hat, v_hat)
    return float(np.linalg.norm(approx - exact) / np.linalg.norm(exact))


def quantized_bytes_per_token(config: Config, bits: int = 8, group_size: int = 32) -> float:
    """Bytes a position costs once its groups are full: codes plus a float16 scale and zero per
    group of `group_size` numbers, for K and V of every layer and KV head (either axis)."""
    bits, d = check_bits(bits), config.head_dim
    per_head = d * bits / 8 + 2 * 2 * d / check_group_size(group_size, d, ())
    return 2 * config.n_layers * config.n_kv_heads * per_head
