"""quant_rows' inner loops written in LLVM's IR (numba intrinsics; this module imports numba): rows
of GGUF blocks against input rows, the blocks decoded in registers. Two shapes:

    make_outputs(kind, O, table, R)(raw, w_start, x, x_start, K, sx, sx_start, acc)   # O outputs x R rows
    make_dots(kind, R, table)(raw, w_start, x, x_start, K, sx, sx_start, acc)         # 1 output x R rows

`outputs` (a decode step's products, and Q4_1's few-row passes): acc[o * R + r] = the dot of input
row r with output row o, for O consecutive output rows, each summed in registers (its docstring
says why). `dots` (the rows `outputs` leaves): for b < K / 32, the block at raw.flat[w_start + b *
bytes]: acc[r, 0:32] += (d q) * x.flat[x_start + r K + 32 b : ... + 32] (lane-wise), and for Q4_1
acc[r, 32] += m * sx.flat[sx_start + r K/32 + b] (sx: the rows' block sums); acc: C-contiguous
float32 [R, 33], written (not added to). numba's own loop over a block's code bytes widened them to
64-bit integers and kept a scalar copy of the loop; written here, a block is one 16- or 32-byte
load, a mask and a shift (Q4_1), one conversion to 32 floats, one multiply by d and, per input row,
one fused multiply-add into 32 lane-wise sums (`<32 x float>`, split into the machine's vectors).

Q4_1 by table (`make_dots("Q4_1", R, table=True)`, where the machine has AVX-512: `TABLE`): each
weight picked from its block's 16 possible ones (quant_decode's `_by_table`), exactly float32's
dequantisation of it; the m term is in the weights (acc[r, 32] is 0). quant_decode decodes the
blocks and writes them out (`make_dequant`).
"""
from __future__ import annotations

from typing import NamedTuple

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .llvm import _prefetch_line
from .quant_decode import TABLE, _by_table, _decoded, has_avx512  # noqa: F401 - TABLE, has_avx512: this module's interface too
from .quant_matrix import BLOCK_BYTES

_F32, _I64, _I32, _I16, _I8 = ir.FloatType(), ir.IntType(64), ir.IntType(32), ir.IntType(16), ir.IntType(8)
_V32 = ir.VectorType(_F32, 32)
_V16 = ir.VectorType(_F32, 16)


def _block(builder, kind, p, b, nb, K, x_p, s_p, sums, msums, fma, table=False):
    """One block at p against each row: -> the new lane-wise sums and m-term sums (by table: the
    weights include m, and the m-term sums stay as they are)."""
    c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
    if table:
        w = _by_table(builder, p)
        new = []
        for r, acc in enumerate(sums):
            xr = builder.gep(x_p, [builder.add(builder.mul(c64(r), K), builder.mul(b, c64(32)))])
            new.append(builder.call(fma, [w, builder.load(builder.bitcast(xr, _V32.as_pointer()), align=4), acc]))
        return new, list(msums)
    w, m = _decoded(builder, kind, p)
    new, new_m = [], []
    for r, (acc, macc) in enumerate(zip(sums, msums)):
        xr = builder.gep(x_p, [builder.add(builder.mul(c64(r), K), builder.mul(b, c64(32)))])
        new.append(builder.call(fma, [w, builder.load(builder.bitcast(xr, _V32.as_pointer()), align=4), acc]))
        if kind == "Q4_1":
            s = builder.load(builder.gep(s_p, [builder.add(builder.mul(c64(r), nb), b)]), align=4)
            fma1 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [_F32] * 3), "llvm.fma.f32")
            macc = builder.call(fma1, [m, s, macc])
        new_m.append(macc)
    return new, new_m


# Blocks in flight per loop step, by rows: each has its own sums, so that a sum waits for no fused
# multiply-add but its own (a chain of them, one per block, would wait out each one's latency).
UNROLL = {1: 4, 2: 2, 3: 2, 4: 2}


def _loop(builder, start, stop, step: int, init: list, body) -> list:
    """The IR of `for b in range(start, stop, step): state = body(b, state)` ((stop - start) a
    multiple of step); returns the state after it (init when it runs no step)."""
    c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
    entry = builder.block
    loop, done = builder.append_basic_block("qdots.loop"), builder.append_basic_block("qdots.done")
    builder.cbranch(builder.icmp_signed("<", start, stop), loop, done)
    builder.position_at_end(loop)
    b = builder.phi(_I64)
    b.add_incoming(start, entry)
    state = [builder.phi(v.type) for v in init]
    for phi, v in zip(state, init):
        phi.add_incoming(v, entry)
    new = body(b, state)
    latch, b_next = builder.block, builder.add(b, c64(step))
    builder.cbranch(builder.icmp_signed("<", b_next, stop), loop, done)
    b.add_incoming(b_next, latch)
    for phi, v in zip(state, new):
        phi.add_incoming(v, latch)
    builder.position_at_end(done)
    final = [builder.phi(v.type) for v in init]
    for phi, v, v0 in zip(final, new, init):
        phi.add_incoming(v, latch)
        phi.add_incoming(v0, entry)
    return final


class _Args(NamedTuple):
    """What a block kernel's body gets (LLVM values): its arguments as pointers at their offsets."""
    raw: ir.Value  # i8*: the first block, raw.flat[w_start]
    x: ir.Value  # float*: x.flat[x_start]
    sx: ir.Value  # float*: sx.flat[sx_start]
    acc: ir.Value  # float*: acc's data
    K: ir.Value  # i64: inputs per row
    nb: ir.Value  # i64: blocks per row, K / 32
    dm: ir.Value = None  # float*: dm.flat[dm_start], the output rows' (d, m) as float32 (`make_outputs`)


def _blocks_intrinsic(emit, scales: bool = False):
    """The numba intrinsic f(raw, w_start, x, x_start, K, sx, sx_start, acc) (raw C-contiguous uint8;
    x, sx, acc C-contiguous float32) whose body `emit(builder, _Args)` writes; scales: with two more
    arguments before acc, f(..., sx_start, dm, dm_start, acc) (dm C-contiguous float32)."""
    arrays = (0, 2, 5, 7, 9) if scales else (0, 2, 5, 7)  # raw, x, sx, (dm,) acc
    offsets = (1, 3, 4, 6, 8) if scales else (1, 3, 4, 6)  # w_start, x_start, K, sx_start, (dm_start)

    def check(*args):  # the arrays' types: raw uint8, the others float32, all C-contiguous
        return all(isinstance(args[i], types.Array) and args[i].layout == "C"
                   and args[i].dtype == (types.uint8 if i == 0 else types.float32) for i in arrays)

    def codegen(context, builder, signature, args):
        ra, xa, sa, *da, aa = (context.make_array(signature.args[i])(context, builder, args[i]) for i in arrays)
        w0, x0, K_, s0, *d0 = (context.cast(builder, args[i], signature.args[i], types.intp) for i in offsets)
        f32 = lambda a, at: builder.gep(builder.bitcast(a.data, _F32.as_pointer()), [at])  # noqa: E731
        emit(builder, _Args(builder.gep(builder.bitcast(ra.data, _I8.as_pointer()), [w0]), f32(xa, x0), f32(sa, s0),
                            builder.bitcast(aa.data, _F32.as_pointer()), K_, builder.sdiv(K_, ir.Constant(_I64, 32)),
                            f32(da[0], d0[0]) if scales else None))
        return context.get_dummy_value()

    if scales:
        @intrinsic
        def kernel(typingctx, raw, w_start, x, x_start, K, sx, sx_start, dm, dm_start, acc):
            args = (raw, w_start, x, x_start, K, sx, sx_start, dm, dm_start, acc)
            return (types.void(*args), codegen) if check(*args) else None
    else:
        @intrinsic
        def kernel(typingctx, raw, w_start, x, x_start, K, sx, sx_start, acc):
            args = (raw, w_start, x, x_start, K, sx, sx_start, acc)
            return (types.void(*args), codegen) if check(*args) else None

    return kernel


def _block_bytes(kind: str, table: bool) -> int:
    """The bytes of a `kind` block, once `table` is known to apply to it (Q4_1 only)."""
    if table and kind != "Q4_1":
        raise ValueError(f"only Q4_1 blocks are read by table, not {kind}")
    return BLOCK_BYTES[kind]


def make_dots(kind: str, R: int, table: bool = False):
    """The intrinsic for `kind` blocks ("Q4_1" or "Q8_0") against R input rows (module docstring);
    table: Q4_1 by table (needs AVX-512)."""
    block_bytes = _block_bytes(kind, table)

    def emit(builder, a: _Args) -> None:
        raw_p, x_p, s_p, acc_p, K_, nb, _ = a
        c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V32, [_V32] * 3), "llvm.fma.v32f32")
        U = UNROLL[R]

        def blocks(b, state, n):  # n blocks from b on, each with its own sums: state [n][2R]
            out = []
            for line in range(0, n * block_bytes, 64):  # the bytes PREFETCH_BYTES ahead, asked for
                _prefetch_line(builder, builder.gep(raw_p, [builder.add(builder.mul(b, c64(block_bytes)),
                                                                        c64(PREFETCH_BYTES + line))]))
            for u in range(n):
                bu = builder.add(b, c64(u))
                new, new_m = _block(builder, kind, builder.gep(raw_p, [builder.mul(bu, c64(block_bytes))]), bu, nb,
                                    K_, x_p, s_p, state[u * 2 * R:u * 2 * R + R], state[u * 2 * R + R:(u + 1) * 2 * R],
                                    fma, table)
                out += new + new_m
            return out

        zero = [ir.Constant(_V32, None)] * R + [ir.Constant(_F32, 0.0)] * R
        main_end = builder.sub(nb, builder.srem(nb, c64(U)))
        state = _loop(builder, c64(0), main_end, U, zero * U, lambda b, st: blocks(b, st, U))
        sums = state[:2 * R]  # the U sets of sums added: one set for the last blocks
        for u in range(1, U):
            sums = [builder.fadd(s1, s2) for s1, s2 in zip(sums, state[u * 2 * R:(u + 1) * 2 * R])]
        final_all = _loop(builder, main_end, nb, 1, sums, lambda b, st: blocks(b, st, 1))
        final, final_m = final_all[:R], final_all[R:]
        for r in range(R):
            row = builder.gep(acc_p, [c64(33 * r)])
            builder.store(final[r], builder.bitcast(row, _V32.as_pointer()), align=4)
            builder.store(final_m[r], builder.gep(row, [c64(32)]), align=4)

    return _blocks_intrinsic(emit)


def _reduce(builder, v):
    """The sum of a float vector's lanes (halves added until one lane is left)."""
    n = v.type.count
    while n > 1:
        n //= 2
        low, high = (ir.Constant(ir.VectorType(_I32, n), [ir.Constant(_I32, first + i) for i in range(n)]) for first in (0, n))
        v = builder.fadd(builder.shuffle_vector(v, v, low), builder.shuffle_vector(v, v, high))
    return builder.extract_element(v, ir.Constant(_I32, 0))


def make_outputs(kind: str, O: int, table: bool = False, R: int = 1, pair: bool = False, scales: bool = False):
    """R input rows against O output rows (a decode step's products, or a few rows'): the intrinsic

        outputs(raw, w_start, x, x_start, K, sx, sx_start, dm, dm_start, acc)

    writes acc[o * R + r] = x.flat[x_start + r K : ... + K] . W_o for the O consecutive rows of
    blocks at raw.flat[w_start + o * K/32 * bytes] (Q4_1's m term included, from the rows' block
    sums sx.flat[sx_start + r K/32:]). scales (by table): each block's d and m are read as float32
    from dm.flat[dm_start + 2 (o K/32 + b):] (quant_rows.scales), each broadcast to the table's 16
    lanes by its load, where the file's two float16s took a conversion and three shuffles a block
    (one thread, in cache, a 1536 x 576 matrix, ns a block: 3 rows 1.43 -> 1.25, 4 rows 1.76 ->
    1.54, 8 rows 2.84 -> 2.75, the same numbers bit for bit; SCALES_ROWS says which kernels do);
    without scales no dm is read (an empty array will do). The output rows are read one after
    another, in the file's order (4 rows read side by side, without the prefetch, left the hardware
    prefetcher behind: the 30 MB head ran at a third of the speed), each block decoded once for the
    R rows, with OUTPUT_UNROLL[R] blocks' sums in flight, and each sum is added up in registers: no
    call, no store and reload per output row, which at K = 576 (18 blocks a row) cost as much as
    1.7 blocks' work a block.

    pair: two output rows side by side (both prefetched), so that each input row's 32 numbers,
    loaded once, serve both rows' blocks: half the loads of the input rows, which bind the loop
    once R rows' sums keep the multiply-adds busy. Up to 4 rows, each output's sums stay 32 lanes
    wide (the same sums in the same order as one output at a time); for 8 rows, 2 x 8 x 32 lanes
    would not fit AVX-512's 32 registers, so each sum is 16 lanes wide and a block adds its two
    halves into it one after the other (another order of the same float32 additions)."""
    block_bytes = _block_bytes(kind, table)
    if pair and O % 2:
        raise ValueError(f"pair takes output rows two at a time, not O = {O}")
    narrow = pair and R > 4  # 16-lane sums (the docstring)

    def emit(builder, a: _Args) -> None:
        raw_p, x_p, s_p, acc_p, K_, nb, _ = a
        c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
        row_bytes = builder.mul(nb, c64(block_bytes))
        U = OUTPUT_UNROLL[R]

        def weights(o, b):  # output o's block b: its 32 weights (d q, or by table d q + m) and m (or None)
            p = builder.gep(raw_p, [builder.add(builder.mul(c64(o), row_bytes), builder.mul(b, c64(block_bytes)))])
            if not table:
                return _decoded(builder, kind, p)
            dm_p = builder.gep(a.dm, [builder.mul(builder.add(builder.mul(c64(o), nb), b), c64(2))]) if scales else None
            return _by_table(builder, p, dm_p), None

        def block(outs, b, st):  # outputs `outs`' block b against the R rows: st = per output, R sums and R m-sums
            return _against_rows(builder, a, [weights(o, b) for o in outs], b, st, R, narrow)

        def ahead(o, b):  # ask for the bytes PREFETCH_BYTES past this step's blocks (a line per 64)
            p = builder.gep(raw_p, [builder.add(builder.mul(c64(o), row_bytes), builder.mul(b, c64(block_bytes)))])
            for line in range(0, U * block_bytes, 64):
                _prefetch_line(builder, builder.gep(p, [c64(PREFETCH_BYTES + line)]))
            if scales:  # and the scales as far ahead in blocks (8 bytes a block)
                at = builder.mul(builder.add(builder.mul(c64(o), nb), b), c64(2))
                _prefetch_line(builder, builder.gep(a.dm, [builder.add(at, c64(2 * PREFETCH_BYTES // block_bytes))]))
            return []

        lanes = _V16 if narrow else _V32
        group = 2 if pair else 1
        zero = ([ir.Constant(lanes, None)] * R + [ir.Constant(_F32, 0.0)] * R) * group
        width = 2 * R * group  # the state of one block in flight
        main_end = builder.sub(nb, builder.srem(nb, c64(U)))
        for o in range(0, O, group):  # one output (or pair) after another: the blocks are read in the file's order
            outs = list(range(o, o + group))

            def step(b, st, outs=outs):  # U blocks, each with its own sums
                return sum((ahead(oi, b) for oi in outs), []) + sum(
                    (block(outs, builder.add(b, c64(u)), st[width * u:width * (u + 1)]) for u in range(U)), [])

            state = _loop(builder, c64(0), main_end, U, zero * U, step)
            sums = state[:width]
            for u in range(1, U):
                sums = [builder.fadd(s1, s2) for s1, s2 in zip(sums, state[width * u:width * (u + 1)])]
            final = _loop(builder, main_end, nb, 1, sums, lambda b, st, outs=outs: block(outs, b, st))
            for i, oi in enumerate(outs):
                for r in range(R):
                    builder.store(builder.fadd(_reduce(builder, final[2 * R * i + r]), final[2 * R * i + R + r]),
                                  builder.gep(acc_p, [c64(oi * R + r)]), align=4)

    return _blocks_intrinsic(emit, scales=True)


def _against_rows(builder, a: _Args, decoded: list, b, st: list, R: int, narrow: bool) -> list:
    """`make_outputs`' step for block b of one or two output rows (`decoded`: each its 32 weights and
    m or None) against the R input rows: st holds, per output row, R lane-wise sums then R m-term
    sums; -> the new ones. Each input row's 32 numbers are loaded once for all the output rows;
    narrow: 16-lane sums, the block's two halves added into them in turn."""
    c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V32, [_V32] * 3), "llvm.fma.v32f32")
    fma16 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16, [_V16] * 3), "llvm.fma.v16f32")
    fma1 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [_F32] * 3), "llvm.fma.f32")
    halves = [ir.Constant(ir.VectorType(_I32, 16), [ir.Constant(_I32, first + i) for i in range(16)]) for first in (0, 16)]
    sums = [list(st[2 * R * i:2 * R * i + R]) for i in range(len(decoded))]
    msums = [list(st[2 * R * i + R:2 * R * (i + 1)]) for i in range(len(decoded))]
    for r in range(R):
        at = builder.add(builder.mul(c64(r), a.K), builder.mul(b, c64(32)))
        xv = builder.load(builder.bitcast(builder.gep(a.x, [at]), _V32.as_pointer()), align=4)
        s = None  # row r's block sum, loaded once where an m term needs it
        for i, (w, m) in enumerate(decoded):
            if narrow:
                for h in halves:
                    sums[i][r] = builder.call(fma16, [builder.shuffle_vector(w, w, h), builder.shuffle_vector(xv, xv, h),
                                                      sums[i][r]])
            else:
                sums[i][r] = builder.call(fma, [w, xv, sums[i][r]])
            if m is not None:
                if s is None:
                    s = builder.load(builder.gep(a.sx, [builder.add(builder.mul(c64(r), a.nb), b)]), align=4)
                msums[i][r] = builder.call(fma1, [m, s, msums[i][r]])
    return sum((sums[i] + msums[i] for i in range(len(decoded))), [])


OUTPUTS = 4  # output rows per call of the `outputs` kernels below
PREFETCH_BYTES = 8192  # how far ahead of the blocks it reads an `outputs` or `dots` kernel asks the memory for more
# Blocks in flight in an `outputs` kernel, by input rows (as UNROLL; 3 divides SmolLM2's 18 and 48
# blocks a row; with more rows, each block has more sums to keep the adders busy).
OUTPUT_UNROLL = {1: 3, 2: 2, 3: 1, 4: 1, 8: 1}
# From this many input rows, the output rows go in pairs (`make_outputs`' pair). SmolLM2's 120 layer
# products (Q4_1) and its head (Q8_0), 2 threads, medians of 9 alternating rounds, ms, one output at
# a time / pairs: Q4_1 2 rows 3.12 / 3.23, 3 rows 3.50 / 3.43, 4 rows 3.94 / 3.89, 8 rows 6.37 / 5.63;
# Q8_0 2 rows 0.89 / 0.74, 3 rows 1.05 / 0.72, 4 rows 1.28 / 0.90, 8 rows 1.71 / 1.34 (a Q4_1 block's
# decoding by table costs more than its input rows' loads; a Q8_0 block's conversion less). AVX-512
# only: two outputs' 32-lane sums for 2-4 rows fill AVX2's 16 registers twice over.
PAIR_FROM = {"Q4_1": 3, "Q8_0": 2} if has_avx512() else {"Q4_1": 9, "Q8_0": 9}
# Input rows whose `outputs` kernels read a Q4_1 block's d and m from quant_rows.scales (by table).
SCALES_ROWS = (3, 4) if TABLE else ()
q41_outputs1, q41_outputs2, q41_outputs3, q41_outputs4, q41_outputs8 = (
    make_outputs("Q4_1", OUTPUTS, TABLE, R, pair=R >= PAIR_FROM["Q4_1"], scales=R in SCALES_ROWS) for R in (1, 2, 3, 4, 8))
q80_outputs1, q80_outputs2, q80_outputs3, q80_outputs4, q80_outputs8 = (
    make_outputs("Q8_0", OUTPUTS, False, R, pair=R >= PAIR_FROM["Q8_0"]) for R in (1, 2, 3, 4, 8))
# Input rows an `outputs` call takes while that many are left (quant_rows._rows; fewer: 1-4 a call).
# 8 decodes each block once for 16 fused multiply-adds a row pair, with 8 x 32 lane sums: AVX-512's 32
# vector registers hold them; x86's 16 of AVX2 would not, so there it stays 4.
ROWS_A_CALL = 8 if TABLE else 4


def make_over_outputs(outputs, R: int):
    """The loop around an `outputs` kernel of R input rows, compiled into quant_rows' `_rows`:

        n = over(raw, dm, cols, n0, n1, x, m0, m1, sx, acc, out)

    runs the kernel on one part's output rows n0, n0 + 1, ..., OUTPUTS a call while OUTPUTS are
    left before n1, against the input rows m0 .. m1 (x [M, K], R at a time, each group of output
    rows' blocks in cache for all of them; dm: the part's quant_rows.scales, [rows, 2 K/32] or
    empty), writing out[m, cols[n]] = x[m] . W_n; -> the first output row it left (`dots` takes
    the rest). One loop per kernel, chosen once by the caller: a
    loop that chose among the ten kernels at each call (LLVM's code for a loop around all ten)
    ran 20-29% slower than this one at 3 to 8 rows (one thread, a 3072 x 576 Q4_1 matrix: 3 rows
    2.02 against 1.44 ns a block, 4 rows 2.33 / 1.74, 8 rows 3.52 / 2.81; Zen 5, December 2026)."""

    @numba.njit(fastmath=True, inline="always")
    def over(raw, dm, cols, n0, n1, x, m0, m1, sx, acc, out):  # pragma: no cover - compiled only
        K = x.shape[1]
        nb = K // 32
        row_bytes = raw.shape[1]
        while n0 + OUTPUTS <= n1:
            for m in range(m0, m1, R):
                outputs(raw, n0 * row_bytes, x, m * K, K, sx, m * nb, dm, n0 * dm.shape[1], acc)
                for o in range(OUTPUTS):
                    for r in range(R):
                        out[m + r, cols[n0 + o]] = acc[o * R + r]
            n0 += OUTPUTS
        return n0

    return over


q41_over1, q41_over2, q41_over3, q41_over4, q41_over8 = (
    make_over_outputs(k, R) for k, R in zip((q41_outputs1, q41_outputs2, q41_outputs3, q41_outputs4, q41_outputs8),
                                            (1, 2, 3, 4, 8)))
q80_over1, q80_over2, q80_over3, q80_over4, q80_over8 = (
    make_over_outputs(k, R) for k, R in zip((q80_outputs1, q80_outputs2, q80_outputs3, q80_outputs4, q80_outputs8),
                                            (1, 2, 3, 4, 8)))
q41_dots1, q41_dots2, q41_dots3, q41_dots4 = (make_dots("Q4_1", R, TABLE) for R in (1, 2, 3, 4))
q80_dots1, q80_dots2, q80_dots3, q80_dots4 = (make_dots("Q8_0", R) for R in (1, 2, 3, 4))
