"""The fast path's hand-scheduled inner loops: numba intrinsics that build their loop in LLVM's
IR, since numba has no vector types and LLVM does not find these schedules in a loop over arrays.
Each is called from compiled code only (a module binds it with jit.compiled's INLINE).

- `make_tile(outputs, rows)`: a register tile of outputs x rows sums grown by outer products
  over k (tiles.py's products for more than a few rows; `tile1x64` .. `tile4x64`, `tile1x8`: few_queries'
  weighted values), prefetching the next task's weights.
- `make_kdots(outputs, rows)`: outputs x rows dot products with the sums along k in vectors,
  reduced at the end (`kdots2x4`: few_rows' products for 4 rows).
- `dots8`: one row against 8 rows (one_query's scores, 8 keys at a time).
- `transpose8`: an 8 x 8 block transposed in registers (tiles' packing, prefill_attention's layout).
- `prefetch`: ask the memory for a range of numbers (few_queries' keys ahead; where quant_planes' shares start).

All read and write float32 arrays as flat runs of numbers at offsets the caller gives; the
modules that call them say what each call computes and what it measured.
"""
from __future__ import annotations

import numba
from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .. import tunables


def has_avx512() -> bool:
    """Whether numba compiles for a CPU with AVX-512 (512-bit vectors, 32 of them; vpermps on 16 lanes): its NUMBA_CPU_NAME /
    NUMBA_CPU_FEATURES when set, else this machine's."""
    if numba.config.CPU_FEATURES:
        return "+avx512f" in numba.config.CPU_FEATURES.split(",")
    if numba.config.CPU_NAME and numba.config.CPU_NAME != "host":
        return False  # a named CPU without a feature list: not assumed
    return bool(llvm_binding.get_host_cpu_features().get("avx512f", False))


PREFETCH_TASKS = 1  # while a tile's task computes, fetch the weights of the task this many ahead
KDOTS_PREFETCH_ROWS = 6  # while the k-vector tiles compute, fetch the weight rows this many ahead


# The LLVM IR the intrinsics below share.
_F32, _I64, _I32, _I8P = ir.FloatType(), ir.IntType(64), ir.IntType(32), ir.IntType(8).as_pointer()
_VEC = ir.VectorType(_F32, 8)  # 8 float32: one AVX register


def _floats(builder, array):
    """An array's data as float*."""
    return builder.bitcast(array.data, _F32.as_pointer())


def _load_vec(builder, ptr):
    """8 floats from ptr (any alignment)."""
    return builder.load(builder.bitcast(ptr, _VEC.as_pointer()), align=4)


def _fma(builder):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC, [_VEC] * 3), "llvm.fma.v8f32")


def _prefetch_line(builder, ptr, locality: int = 3):
    """Ask the memory for the line holding ptr, for a read. locality: LLVM's hint, 3 = into every
    cache level (x86's prefetcht0), 1 = into L2 but not L1 (prefetcht2; tunables.STREAM_PREFETCH)."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [_I8P, _I32, _I32, _I32]),
                                        "llvm.prefetch.p0i8")
    builder.call(fn, [builder.bitcast(ptr, _I8P), ir.Constant(_I32, 0), ir.Constant(_I32, locality), ir.Constant(_I32, 1)])


def _shuffler(builder):
    """shuffle(a, b, lanes): lane i of the result is lane lanes[i] of a and b side by side (0-7: a,
    8-15: b), as LLVM's shufflevector takes it."""
    def shuffle(a, b, lanes):
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, 8), [ir.Constant(_I32, i) for i in lanes]))

    return shuffle


def _open_loop(builder, name: str, n_sums: int, vec=_VEC, init=None):
    """Start a loop over a counter from 0 with n_sums vectors (`vec`) of sums from zero (or from the
    values `init`): -> (loop, its counter, the sums' phis); the builder is then inside the loop's
    block. `_close_loop` ends it."""
    begin = builder.block
    loop = builder.append_basic_block(f"{name}.loop")
    builder.branch(loop)
    builder.position_at_end(loop)
    counter = builder.phi(_I64)
    counter.add_incoming(ir.Constant(_I64, 0), begin)
    sums = [builder.phi(vec) for _ in range(n_sums)]
    for i, phi in enumerate(sums):
        phi.add_incoming(ir.Constant(vec, None) if init is None else init[i], begin)
    return loop, counter, sums


def _close_loop(builder, loop, counter, step: int, stop, sums, new) -> None:
    """End `_open_loop`'s loop: counter += step and the sums become `new`, back to the loop while
    counter < stop; the builder is then after the loop."""
    latch = builder.block
    done = builder.append_basic_block(f"{loop.name}.done")
    counter_next = builder.add(counter, ir.Constant(_I64, step))
    builder.cbranch(builder.icmp_signed("<", counter_next, stop), loop, done)
    counter.add_incoming(counter_next, latch)
    for phi, value in zip(sums, new):
        phi.add_incoming(value, latch)
    builder.position_at_end(done)


def make_tile(outputs: int, rows: int, locality: int = 3, lanes: int = 8, accumulate: bool = False):
    """The tile intrinsic for `outputs` weight rows x `rows` input rows (a multiple of `lanes`: that
    many vectors of `lanes` sums per output; 16 needs AVX-512's registers, else LLVM splits each in
    two), prefetching the next task's weights with LLVM's `locality` hint. accumulate: the sums
    start from acc's numbers instead of zero (acc += ...), so that a run of k cut in pieces, one
    call each, adds the same products in the same order as one call."""
    if rows % lanes:
        raise ValueError(f"a tile's rows are whole vectors of {lanes} lanes, not {rows}")
    vectors = rows // lanes
    vec = ir.VectorType(_F32, lanes)

    @intrinsic
    def tile_(typingctx, wt, w_start, x, start, step, K, acc):
        """acc[r, j] (+)= sum_{k < K} wt.flat[w_start + r * N + k] * x.flat[start + k * step + j], r <
        outputs, j < rows, N = wt.shape[1] (compiled code only: row n of a weight [., N] from its
        column c is w_start = n * N + c). wt (2-D) and acc [outputs, rows]: C-contiguous float32; x:
        a C-contiguous float32 array, read as one flat run of numbers (a packed block of rows: step =
        rows; or a block of another array's rows, `rows` numbers of each, `step` apart); 0 < K.
        The numbers read must exist (the next rows of wt are prefetched: a prefetch never faults)."""
        f32 = types.float32
        if not all(isinstance(a, types.Array) and a.dtype == f32 and a.layout == "C" for a in (wt, x, acc)):
            return None  # numba reports that no signature matches
        sig = types.void(wt, w_start, x, start, step, K, acc)

        def codegen(context, builder, signature, args):
            arrays = [context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 2, 6)]  # wt, x, acc
            w_start_, start_, step_, K = (context.cast(builder, args[i], signature.args[i], types.intp) for i in (1, 3, 4, 5))

            def const(v):
                return ir.Constant(_I64, v)

            wa, xa, aa = arrays
            w_stride = cgutils.unpack_tuple(builder, wa.shape)[1]  # floats from one row of wt to the next
            w0 = builder.gep(_floats(builder, wa), [w_start_])
            w_rows = [builder.gep(w0, [builder.mul(const(r), w_stride)]) for r in range(outputs)]
            x_block = builder.gep(_floats(builder, xa), [start_])
            ahead = builder.gep(w_rows[0], [builder.mul(w_stride, const(outputs * PREFETCH_TASKS))])
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec] * 3), f"llvm.fma.v{lanes}f32")
            undef = ir.Constant(vec, ir.Undefined)
            broadcast = ir.Constant(ir.VectorType(_I32, lanes), None)  # shuffle mask of zeros: lane 0 everywhere

            acc_vec = [builder.bitcast(builder.gep(_floats(builder, aa), [const(lanes * i)]), vec.as_pointer())
                       for i in range(vectors * outputs)]
            init = [builder.load(p, align=4) for p in acc_vec] if accumulate else None
            # for k in range(K); sums [r][vector]: rows 0 .. lanes-1, lanes .., ...
            loop, k, sums = _open_loop(builder, "tile", vectors * outputs, vec, init)
            x_k = builder.gep(x_block, [builder.mul(k, step_)])
            xs = [builder.load(builder.bitcast(builder.gep(x_k, [const(lanes * v)]), vec.as_pointer()), align=4)
                  for v in range(vectors)]
            # the next task's weight rows (for a product: one block of 6K floats): `outputs` floats of it per k
            _prefetch_line(builder, builder.gep(ahead, [builder.mul(k, const(outputs))]), locality)
            new = []
            for r in range(outputs):
                w = builder.load(builder.gep(w_rows[r], [k]), align=4)
                w8 = builder.shuffle_vector(builder.insert_element(undef, w, ir.Constant(_I32, 0)), undef, broadcast)
                new += [builder.call(fma, [w8, xs[v], sums[vectors * r + v]]) for v in range(vectors)]
            _close_loop(builder, loop, k, 1, K, sums, new)
            # acc[r, lanes v : lanes (v + 1)] = the sums of vector v
            for p, value in zip(acc_vec, new):
                builder.store(value, p, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return tile_


@intrinsic
def prefetch(typingctx, x, start, count):
    """Ask the memory for x.flat[start : start + count], into L2 (tunables.STREAM_PREFETCH; one
    prefetch per 64-byte line; compiled code only; x C-contiguous float32 or uint8; a prefetch never
    faults, so the range may pass the array's end)."""
    if not (isinstance(x, types.Array) and x.dtype in (types.float32, types.uint8) and x.layout == "C"):
        return None
    sig = types.void(x, start, count)
    element = _F32 if x.dtype == types.float32 else ir.IntType(8)
    per_line = 64 // (4 if x.dtype == types.float32 else 1)

    def codegen(context, builder, signature, args):
        xa = context.make_array(signature.args[0])(context, builder, args[0])
        start_, count_ = (context.cast(builder, args[i], signature.args[i], types.intp) for i in (1, 2))
        first = builder.gep(builder.bitcast(xa.data, element.as_pointer()), [start_])
        with cgutils.for_range_slice(builder, ir.Constant(_I64, 0), count_, ir.Constant(_I64, per_line), inc=True) as (i, _):
            _prefetch_line(builder, builder.gep(first, [i]), tunables.STREAM_PREFETCH)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def transpose8(typingctx, x, x_start, x_step, out, out_start, out_step):
    """out.flat[out_start + c * out_step + i] = x.flat[x_start + i * x_step + c] for i, c < 8: an 8 x 8
    block transposed in registers (compiled code only; x, out C-contiguous float32): 8 rows of 8
    loaded, interleaved in three rounds of shuffles (pairs of rows, then pairs of pairs, then
    halves), 8 columns stored. `_pack` lays out a tile's rows with it."""
    if not all(isinstance(a, types.Array) and a.dtype == types.float32 and a.layout == "C" for a in (x, out)):
        return None
    sig = types.void(x, x_start, x_step, out, out_start, out_step)

    def codegen(context, builder, signature, args):
        xa, oa = (context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 3))
        x_start_, x_step_, out_start_, out_step_ = (
            context.cast(builder, args[i], signature.args[i], types.intp) for i in (1, 2, 4, 5))

        shuffle = _shuffler(builder)
        x0 = builder.gep(_floats(builder, xa), [x_start_])
        r = [_load_vec(builder, builder.gep(x0, [builder.mul(x_step_, ir.Constant(_I64, i))])) for i in range(8)]
        # rows a..h: t = [a0 b0 a1 b1 | a4 b4 a5 b5], [a2 b2 a3 b3 | a6 b6 a7 b7], then c, d; e, f; g, h
        t = [shuffle(r[i], r[i + 1], lanes) for i in range(0, 8, 2)
             for lanes in ([0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15])]
        # u = [a0 b0 c0 d0 | a4 b4 c4 d4], [a1 .. d1 | a5 .. d5], [a2 .. | a6 ..], [a3 .. | a7 ..], then e..h
        u = [shuffle(t[i + h], t[i + 2 + h], lanes) for i in (0, 4) for h in (0, 1)
             for lanes in ([0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15])]
        o0 = builder.gep(_floats(builder, oa), [out_start_])
        for c in range(4):  # column c from u[c] (a..d) and u[4 + c] (e..h); column c + 4 from their upper halves
            for column, lanes in ((c, [0, 1, 2, 3, 8, 9, 10, 11]), (c + 4, [4, 5, 6, 7, 12, 13, 14, 15])):
                ptr = builder.gep(o0, [builder.mul(out_step_, ir.Constant(_I64, column))])
                builder.store(shuffle(u[c], u[4 + c], lanes), builder.bitcast(ptr, _VEC.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


def make_kdots(outputs: int, rows: int):
    """The intrinsic for `outputs` weight rows x `rows` input rows (at most 8) with the sums along
    k in vectors: few_rows' products for a few rows (`few_rows._rows_times_rows`)."""

    @intrinsic
    def kdots_(typingctx, wt, w_start, x, x_start, x_step, K, acc):
        """acc.flat[8 * r + j] = sum_{k < K} wt.flat[w_start + r * N + k] * x.flat[x_start + j * x_step + k]
        for r < outputs, j < rows, N = wt.shape[1] (compiled code only; wt 2-D, x and acc [outputs, 8 or
        more] C-contiguous float32; K a positive multiple of 8). Each of the outputs x rows sums is a
        vector of 8 partial sums over k: per 8 k, `outputs` + `rows` loads feed outputs x rows
        multiply-adds, all in registers (2 x 4: 8 sums, 6 loads); at the end each output's vectors
        are reduced together, as dots8 reduces its eight."""
        f32 = types.float32
        if not all(isinstance(a, types.Array) and a.dtype == f32 and a.layout == "C" for a in (wt, x, acc)):
            return None
        sig = types.void(wt, w_start, x, x_start, x_step, K, acc)

        def codegen(context, builder, signature, args):
            wa, xa, aa = (context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 2, 6))
            w_start_, x_start_, x_step_, K_ = (context.cast(builder, args[i], signature.args[i], types.intp)
                                               for i in (1, 3, 4, 5))

            def const(v):
                return ir.Constant(_I64, v)

            w_stride = cgutils.unpack_tuple(builder, wa.shape)[1]
            w0 = builder.gep(_floats(builder, wa), [w_start_])
            w_rows = [builder.gep(w0, [builder.mul(const(r), w_stride)]) for r in range(outputs)]
            x0 = builder.gep(_floats(builder, xa), [x_start_])
            x_rows = [builder.gep(x0, [builder.mul(const(j), x_step_)]) for j in range(rows)]
            ahead = builder.gep(w0, [builder.mul(w_stride, const(KDOTS_PREFETCH_ROWS))])
            fma = _fma(builder)
            loop, k, sums = _open_loop(builder, "kdots", outputs * rows)  # for k in range(0, K, 8); sums [r][j]
            # the weight rows KDOTS_PREFETCH_ROWS ahead (contiguous: `outputs` x 8 floats of them per 8 k), into L2
            _prefetch_line(builder, builder.gep(ahead, [builder.mul(k, const(outputs))]), tunables.STREAM_PREFETCH)
            ws = [_load_vec(builder, builder.gep(w_rows[r], [k])) for r in range(outputs)]
            xs = [_load_vec(builder, builder.gep(x_rows[j], [k])) for j in range(rows)]
            new = [builder.call(fma, [ws[r], xs[j], sums[r * rows + j]]) for r in range(outputs) for j in range(rows)]
            _close_loop(builder, loop, k, 8, K_, sums, new)
            zero = ir.Constant(_VEC, None)
            for r in range(outputs):
                total = _reduce8(builder, new[r * rows:(r + 1) * rows] + [zero] * (8 - rows))
                builder.store(total, builder.bitcast(builder.gep(_floats(builder, aa), [const(8 * r)]), _VEC.as_pointer()),
                              align=4)
            return context.get_dummy_value()

        return sig, codegen

    return kdots_


def _reduce8(builder, vectors):
    """Eight vectors of 8 partial sums -> one vector of their 8 sums (pairwise shuffles and adds:
    7 adds for 8 sums, instead of a horizontal add for each)."""
    shuffle = _shuffler(builder)
    new = vectors
    # pairs: lanes [a0+a1 of row i, of row i+1, a2+a3 of row i, of row i+1, ...]
    pairs = [builder.fadd(shuffle(new[i], new[i + 1], [0, 8, 2, 10, 4, 12, 6, 14]),
                          shuffle(new[i], new[i + 1], [1, 9, 3, 11, 5, 13, 7, 15])) for i in range(0, 8, 2)]
    # quads: lanes [rows i..i+3: sums of lanes 0-3, then rows i..i+3: sums of lanes 4-7]
    quads = [builder.fadd(shuffle(pairs[i], pairs[i + 1], [0, 1, 8, 9, 4, 5, 12, 13]),
                          shuffle(pairs[i], pairs[i + 1], [2, 3, 10, 11, 6, 7, 14, 15])) for i in (0, 2)]
    return builder.fadd(shuffle(quads[0], quads[1], [0, 1, 2, 3, 8, 9, 10, 11]),
                        shuffle(quads[0], quads[1], [4, 5, 6, 7, 12, 13, 14, 15]))


@intrinsic
def dots8(typingctx, x, x_start, x_step, q, q_start, d, out, out_start):
    """out.flat[out_start + i] = sum_{c < d} x.flat[x_start + i * x_step + c] * q.flat[q_start + c]
    for i < 8: eight dot products of one row q with eight rows of x (compiled code only; x, q, out
    C-contiguous float32, d a positive multiple of 8). Each row's 8 partial sums stay in a vector;
    at the end, the eight vectors are reduced together (pairwise shuffles and adds: 7 adds for 8
    sums, instead of a horizontal add for each): attention's scores, 8 keys for one query row."""
    f32 = types.float32
    if not all(isinstance(a, types.Array) and a.dtype == f32 and a.layout == "C" for a in (x, q, out)):
        return None
    sig = types.void(x, x_start, x_step, q, q_start, d, out, out_start)

    def codegen(context, builder, signature, args):
        xa, qa, oa = (context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 3, 6))
        x_start_, x_step_, q_start_, d_, out_start_ = (
            context.cast(builder, args[i], signature.args[i], types.intp) for i in (1, 2, 4, 5, 7))

        x0 = builder.gep(_floats(builder, xa), [x_start_])
        x_rows = [builder.gep(x0, [builder.mul(x_step_, ir.Constant(_I64, i))]) for i in range(8)]
        q0 = builder.gep(_floats(builder, qa), [q_start_])
        fma = _fma(builder)
        loop, c, sums = _open_loop(builder, "dots8", 8)  # for c in range(0, d, 8)
        qv = _load_vec(builder, builder.gep(q0, [c]))
        new = [builder.call(fma, [_load_vec(builder, builder.gep(x_rows[i], [c])), qv, sums[i]]) for i in range(8)]
        _close_loop(builder, loop, c, 8, d_, sums, new)
        total = _reduce8(builder, new)
        builder.store(total, builder.bitcast(builder.gep(_floats(builder, oa), [out_start_]), _VEC.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


# 1 output x 64 rows, added to acc: few_queries' weighted values (a row's weights x 64 columns of V,
# over positions in pieces where a paged cache's blocks end); and 8 columns
tile1x64, tile1x8 = make_tile(1, 64, accumulate=True), make_tile(1, 8, accumulate=True)
# ... and 2-4 query rows at once (each V vector loaded once for them), on AVX-512's 16 lanes:
# 4 rows x 4 vectors of sums (AVX2's 16 registers would hold one row's 8)
tile2x64, tile3x64, tile4x64 = (make_tile(n, 64, lanes=16, accumulate=True) for n in (2, 3, 4))
VALUE_ROWS = 4 if has_avx512() else 1  # the most query rows few_queries weighs at once
kdots2x4 = make_kdots(2, 4)  # 2 outputs x 4 rows, sums along k: few_rows' products for 4 rows
