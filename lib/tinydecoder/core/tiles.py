"""Many rows times a weight matrix at the CPU's arithmetic rate: the fast path's kernel for more
than tunables.SWEEPS_UP_TO_ROWS rows (a batch's decode step, a prefill). Needs numba; imported by
`fast.project` the first time it gets that many rows.

Why. With M rows a product does 2*M FLOPs per weight. From ~8 rows on, that arithmetic, not the
read of the weights, sets the time, and what counts is how many multiply-adds each load feeds.
skinny's sweeps are dot products along k (one running sum per input row and weight row, each a
vector of 8 partial sums): each vector multiply-add needs a load or two of its own, and each of
the M x N sums ends in a horizontal add. A BLAS GEMM instead keeps a small tile
of the output in registers and grows it by outer products:

    acc[r, j] += w[n + r, k] * x[m + j, k]       for k = 0 .. K-1,  r < 6, j < 16

Here a tile is 6 outputs x 16 input rows: 12 AVX registers of 8 sums. At each k, two loads
bring x[m:m+16, k] (the rows are packed so that these 16 numbers lie together), six broadcasts
bring w[n:n+6, k], and 12 fused multiply-adds follow: 8 loads feed 96 multiply-adds, and no sum
needs a horizontal add. The weights are read where they lie (out-major: the 6 rows of a task are
one contiguous block of memory, read front to back), and while a task computes, it asks the
memory for the next task's block (a prefetch), so the read overlaps the arithmetic.

numba has no vector types, and LLVM does not find this schedule in a loop over arrays: the tile
is written as a numba intrinsic that builds the loop in LLVM's IR (`tile`, ~40 lines). The rest
is plain numba: `_rows_times_tiles` gives each thread its share of the outputs, and each task
(6 outputs) runs the tile over every block of 16 rows while its weights sit in cache; a last
block of 1-8 rows runs in a tile of 8 rows (`tile8`, one vector of sums per output), which does
half the multiply-adds of a padded 16-row tile (100 rows, one 576 x 3,072 matrix in cache:
3.1-3.3 ms against 3.4-3.8).

Measured (tunables.py, SmolLM2's 121 matrices, nothing in cache, 2 threads): 16 rows in 46-48 ms,
against 71-87 ms for the sweeps it replaced (two weight rows against four input rows, eight
running sums); 500 rows in 1.13-1.16 s against 1.55-1.60 s (numpy's GEMM: 1.0-1.14 s). The sums
run in another order than numpy's, so the numbers equal the reference up to float32 rounding
(tests bound it).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import skinny
from .skinny import dot_rows

prange = range  # numba.prange once compiled (skinny.compiled)
INLINE = ("dot_rows",)  # compiled into `_rows_times_tiles` (skinny.compiled)

OUTPUTS = 6  # outputs (weight rows) per tile: one broadcast each per k
ROWS = 16  # input rows per tile: two vectors of 8 float32
PREFETCH_TASKS = 1  # while a task computes, fetch the weights of the task this many ahead


def pack_rows(x: np.ndarray, rows: int = ROWS) -> np.ndarray:
    """x [M, K] -> [ceil(M/rows), K, rows]: block b holds rows b*rows .. b*rows + rows-1 with the
    values of one k side by side (rows past M are zeros), as `tile` (rows = 16) and `tile8` load them."""
    M, K = x.shape
    blocks = -(-M // rows)
    padded = np.zeros((blocks * rows, K), np.float32)
    padded[:M] = x
    return np.ascontiguousarray(padded.reshape(blocks, rows, K).transpose(0, 2, 1))


def rows_times(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = x @ w for x [M, K] float32 and w [K, N] float32 in Fortran order (out-major), as
    `skinny.rows_times` takes them; out [M, N] float32, C-contiguous, written in place and returned."""
    skinny.check_rows_times(x, w, out)
    return product(x, w, out)


def product(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> np.ndarray:
    """`rows_times` without its checks, for a caller that has made them (`fast.project`)."""
    x = np.ascontiguousarray(x)
    if x.shape[1] == 0:  # no k: zeros (the tile's loop runs at least once)
        out[:] = 0.0
        return out
    M = x.shape[0]
    tail = M % ROWS if M % ROWS <= 8 else 0  # a last block of 1-8 rows runs in tile8 (half the work)
    full, last = pack_rows(x[:M - tail]), pack_rows(x[M - tail:], 8)  # [blocks, K, 16], [0 or 1, K, 8]
    skinny.compiled(_rows_times_tiles)(full, last, x, w.T, out, skinny.threads())  # w.T: [N, K]
    return out


def _rows_times_tiles(full, last, x, wt, out, threads):  # pragma: no cover - runs compiled by numba
    """out = x @ wt.T, x packed as `full` [blocks, K, 16] and, when a last block of 1-8 rows
    remains, `last` [1, K, 8]; each thread takes a contiguous share of the tasks (6 outputs
    each) and keeps one tile's sums."""
    blocks = full.shape[0]
    M, K = x.shape
    N = wt.shape[0]
    tasks = N // OUTPUTS
    for t in prange(threads):
        acc = np.empty((OUTPUTS, ROWS), np.float32)  # one tile's sums, [outputs, rows]
        acc8 = np.empty((OUTPUTS, 8), np.float32)
        for p in range(t * tasks // threads, (t + 1) * tasks // threads):
            n = OUTPUTS * p
            for b in range(blocks):
                tile(wt, n, full, b, K, acc)
                m = ROWS * b
                for j in range(min(ROWS, M - m)):
                    for r in range(OUTPUTS):
                        out[m + j, n + r] = acc[r, j]
            if last.shape[0]:
                tile8(wt, n, last, 0, K, acc8)
                m = ROWS * blocks
                for j in range(M - m):
                    for r in range(OUTPUTS):
                        out[m + j, n + r] = acc8[r, j]
    for n in range(OUTPUTS * tasks, N):  # the last N % 6 outputs: skinny's dot products
        dot_rows(x, wt[n], out, n, K)
    return out


def _make_tile(rows: int):
    """The tile intrinsic for `rows` = 16 or 8 input rows (two vectors of 8 sums per output, or one)."""
    vectors = rows // 8

    @intrinsic
    def tile_(typingctx, wt, n, xp, b, K, acc):
        """acc[r, j] = sum_{k < K} wt[n + r, k] * xp[b, k, j], r < 6, j < rows (compiled code only).
        wt [N, >= K], xp [blocks, >= K, rows] and acc [6, rows]: C-contiguous float32 arrays; 0 < K.
        Rows n .. n + 5 of wt must exist (the next 6 are prefetched: a prefetch never faults)."""
        f32 = types.float32
        if not all(isinstance(a, types.Array) and a.dtype == f32 and a.layout == "C" for a in (wt, xp, acc)):
            return None  # numba reports that no signature matches
        sig = types.void(wt, n, xp, b, K, acc)

        def codegen(context, builder, signature, args):
            arrays = [context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 2, 5)]  # wt, xp, acc
            n_, b_, K = (context.cast(builder, args[i], signature.args[i], types.intp) for i in (1, 3, 4))
            float_ = ir.FloatType()
            vec = ir.VectorType(float_, 8)
            i64, i32 = ir.IntType(64), ir.IntType(32)

            def const(v):
                return ir.Constant(i64, v)

            def floats(a):  # an array's data as float*
                return builder.bitcast(a.data, float_.as_pointer())

            def load_vec(ptr):
                return builder.load(builder.bitcast(ptr, vec.as_pointer()), align=4)

            wa, xa, aa = arrays
            w_stride = cgutils.unpack_tuple(builder, wa.shape)[1]  # floats from one row of wt to the next
            x_stride = builder.mul(cgutils.unpack_tuple(builder, xa.shape)[1], const(rows))  # from block to block
            w_rows = [builder.gep(floats(wa), [builder.mul(builder.add(n_, const(r)), w_stride)]) for r in range(OUTPUTS)]
            x_block = builder.gep(floats(xa), [builder.mul(b_, x_stride)])
            ahead = builder.gep(w_rows[0], [builder.mul(w_stride, const(OUTPUTS * PREFETCH_TASKS))])
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec] * 3), "llvm.fma.v8f32")
            prefetch = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32]),
                "llvm.prefetch.p0i8")
            undef = ir.Constant(vec, ir.Undefined)
            broadcast = ir.Constant(ir.VectorType(i32, 8), None)  # shuffle mask of zeros: lane 0 everywhere

            start = builder.block
            loop = builder.append_basic_block("tile.k")
            done = builder.append_basic_block("tile.done")
            builder.branch(loop)
            builder.position_at_end(loop)  # for k in range(K):
            k = builder.phi(i64)
            sums = [builder.phi(vec) for _ in range(vectors * OUTPUTS)]  # [r][vector]: rows 0-7 (, 8-15)
            x_k = builder.gep(x_block, [builder.mul(k, const(rows))])
            xs = [load_vec(builder.gep(x_k, [const(8 * v)])) for v in range(vectors)]
            # the next task's 6 weight rows (one block of 6K floats): 6 floats of it per k
            builder.call(prefetch, [builder.bitcast(builder.gep(ahead, [builder.mul(k, const(OUTPUTS))]),
                                                    ir.IntType(8).as_pointer()),
                                    ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
            new = []
            for r in range(OUTPUTS):
                w = builder.load(builder.gep(w_rows[r], [k]), align=4)
                w8 = builder.shuffle_vector(builder.insert_element(undef, w, ir.Constant(i32, 0)), undef, broadcast)
                new += [builder.call(fma, [w8, xs[v], sums[vectors * r + v]]) for v in range(vectors)]
            k_next = builder.add(k, const(1))
            builder.cbranch(builder.icmp_signed("<", k_next, K), loop, done)
            k.add_incoming(const(0), start)
            k.add_incoming(k_next, loop)
            for phi, value in zip(sums, new):
                phi.add_incoming(ir.Constant(vec, None), start)
                phi.add_incoming(value, loop)

            builder.position_at_end(done)  # acc[r, 8v:8v+8] = the sums of vector v
            for i, value in enumerate(new):
                builder.store(value, builder.bitcast(builder.gep(floats(aa), [const(8 * i)]), vec.as_pointer()), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return tile_


tile = _make_tile(ROWS)  # 6 outputs x 16 rows
tile8 = _make_tile(8)  # 6 outputs x 8 rows: a last block of 1-8 rows
