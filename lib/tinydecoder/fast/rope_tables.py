"""RoPE on the fast path: the cos/sin tables of a pass computed once (`rope_tables`), applied by
numpy (`rotate_with_tables`) or in place by one compiled call (`rotate_heads`, with numba). The same rotation
as `core.ops.apply_rope`; `core.rope` has the two layouts it follows."""
from __future__ import annotations

import functools

import numpy as np

from ..core.config import Config
from ..core.ops import rope_angles
from .compiled import jit


class RopeTables:
    """RoPE's cos and sin for every row of a pass, computed once: cos and sin [N, d/2] for the
    compiled `rotate_heads`; cos2 and sin2 shaped for numpy's `rotate_with_tables`, made from them
    when first asked (a pass whose heads numba rotates never asks)."""

    def __init__(self, cos: np.ndarray, sin: np.ndarray, layout: str):
        self.cos, self.sin, self.layout = cos, sin, layout  # [N, d/2] each

    @functools.cached_property
    def cos2(self) -> np.ndarray:
        """[N, 1, 2, d/2] ("halves") or [N, 1, d/2, 2] ("interleaved")."""
        return np.stack([self.cos, self.cos], axis=self._axis)[:, None]

    @functools.cached_property
    def sin2(self) -> np.ndarray:
        """The same, signed: the pair's first member gets -x2 sin, the second +x1 sin."""
        return np.stack([-self.sin, self.sin], axis=self._axis)[:, None]

    @property
    def _axis(self) -> int:
        return 1 if self.layout == "halves" else 2  # where the pair's two members sit

    def take(self, rows) -> RopeTables:
        """The tables of some rows only."""
        return RopeTables(np.ascontiguousarray(self.cos[rows]), np.ascontiguousarray(self.sin[rows]), self.layout)


def rope_tables(config: Config, positions, dtype) -> RopeTables:
    """cos and sin for every row, once per pass (see RopeTables)."""
    cos, sin = rope_angles(positions, config.head_dim, config.rope_base)  # [N, d/2] each, float64
    return RopeTables(cos.astype(dtype), sin.astype(dtype), config.rope_layout)


def rotate_with_tables(x, tables: RopeTables, layout: str):
    """RoPE of x [N, H, d] (a view is fine) with rope_tables' (cos, sin): x cos + swap(x) sin,
    where swap exchanges the two members of every pair (a view).  -> new [N, H, d]."""
    N, H, d = x.shape
    cos2, sin2 = tables.cos2, tables.sin2
    pairs = x.reshape(N, H, 2, d // 2) if layout == "halves" else x.reshape(N, H, d // 2, 2)
    swapped = pairs[:, :, ::-1] if layout == "halves" else pairs[..., ::-1]
    out = pairs * cos2  # [N, H, 2, d/2] (or [N, H, d/2, 2])
    out += swapped * sin2
    return out.reshape(N, H, d)


def rotates_heads(x, tables: RopeTables) -> bool:
    """Whether `rotate_heads(x, ...)` applies: numba installed, x C-contiguous float32 [N, ...]."""
    return (jit.available() and x.dtype == tables.cos.dtype == np.float32 and x.ndim == 2
            and x.flags.c_contiguous and x.shape[0] == tables.cos.shape[0])


def rotate_heads(x, heads: int, tables: RopeTables, layout: str):
    """RoPE of the first `heads` heads of every row of x [N, >= heads*d] in place (a pass's fused
    q|k|v projection, where q and k lie first), in one compiled call (`_rope_rows`); see
    `rotates_heads`. The same rotation as `rotate_with_tables`, one pair at a time.  -> x"""
    jit.compiled(_rope_rows, parallel=False)(x, heads, tables.cos, tables.sin, layout == "halves")
    return x


def _rope_rows(x, heads, cos, sin, halves):  # pragma: no cover - runs compiled by numba
    """Rotate heads 0 .. heads-1 of every row n of x [N, ...] in place, by cos[n], sin[n] [d/2]:
    each pair (a, b) -> (a cos - b sin, b cos + a sin); the pairs are (i, i + d/2) ("halves")
    or (2i, 2i + 1)."""
    N, half = cos.shape
    d = 2 * half
    for n in range(N):
        c, s = cos[n], sin[n]
        for h in range(heads):
            y = x[n, h * d:(h + 1) * d]
            if halves:
                for i in range(half):
                    a, b = y[i], y[half + i]
                    y[i] = a * c[i] - b * s[i]
                    y[half + i] = b * c[i] + a * s[i]
            else:
                for i in range(half):
                    a, b = y[2 * i], y[2 * i + 1]
                    y[2 * i] = a * c[i] - b * s[i]
                    y[2 * i + 1] = b * c[i] + a * s[i]
