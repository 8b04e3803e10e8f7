"""quant_rows' inner loop written in LLVM's IR (a numba intrinsic; this module imports numba):
one output's row of GGUF blocks against R input rows, the blocks decoded in registers.

numba's own loop over a block's 16 code bytes widened the codes to 64-bit integers and kept a
scalar copy of the loop beside the vector one (it could not rule out that the sums alias the
inputs); written here, a block is one 16- or 32-byte load, a mask and a shift (Q4_1), one
conversion to 32 floats, one multiply by d and, per input row, one fused multiply-add into 32
lane-wise sums (`<32 x float>`, which LLVM splits into the machine's vectors).

    make_dots("Q4_1", R)(raw, w_start, x, x_start, K, sx, sx_start, acc)

For b < K / 32, the block at raw.flat[w_start + b * bytes]: acc[r, 0:32] += (d q) * x.flat[x_start
+ r K + 32 b : ... + 32] (lane-wise), and for Q4_1 acc[r, 32] += m * sx.flat[sx_start + r K/32 + b]
(sx: the rows' block sums). acc: C-contiguous float32 [R, 33], written (not added to).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_F32, _I64, _I32, _I16, _I8 = ir.FloatType(), ir.IntType(64), ir.IntType(32), ir.IntType(16), ir.IntType(8)
_V32 = ir.VectorType(_F32, 32)
BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}


def _splat(builder, value, lanes: int, type_):
    undef = ir.Constant(ir.VectorType(type_, lanes), ir.Undefined)
    one = builder.insert_element(undef, value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, undef, ir.Constant(ir.VectorType(_I32, lanes), None))


def _half_at(builder, ptr):
    """The float16 at ptr (bytes, little-endian) as float."""
    bits = builder.load(builder.bitcast(ptr, _I16.as_pointer()), align=1)
    return builder.fpext(builder.bitcast(bits, ir.HalfType()), _F32)


def _decoded(builder, kind, p):
    """A block's d * q as <32 x float>, and its m (Q4_1; else None)."""
    c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
    m = None
    if kind == "Q4_1":  # d and m side by side: one 4-byte load, one conversion
        dm = builder.fpext(builder.load(builder.bitcast(p, ir.VectorType(ir.HalfType(), 2).as_pointer()), align=1),
                           ir.VectorType(_F32, 2))
        d, m = builder.extract_element(dm, ir.Constant(_I32, 0)), builder.extract_element(dm, ir.Constant(_I32, 1))
    else:
        d = _half_at(builder, p)
    if kind == "Q4_1":
        codes = builder.load(builder.bitcast(builder.gep(p, [c64(4)]), ir.VectorType(_I8, 16).as_pointer()), align=1)
        lo = builder.and_(codes, ir.Constant(ir.VectorType(_I8, 16), [ir.Constant(_I8, 15)] * 16))
        hi = builder.lshr(codes, ir.Constant(ir.VectorType(_I8, 16), [ir.Constant(_I8, 4)] * 16))
        lanes = ir.Constant(ir.VectorType(_I32, 32), [ir.Constant(_I32, i) for i in range(32)])
        qf = builder.uitofp(builder.shuffle_vector(lo, hi, lanes), _V32)  # weights 0-15: low nibbles, 16-31: high
    else:
        codes = builder.load(builder.bitcast(builder.gep(p, [c64(2)]), ir.VectorType(_I8, 32).as_pointer()), align=1)
        qf = builder.sitofp(codes, _V32)
    return builder.fmul(_splat(builder, d, 32, _F32), qf), m


def _block(builder, kind, p, b, nb, K, x_p, s_p, sums, msums, fma):
    """One block at p against each row: -> the new lane-wise sums and m-term sums."""
    c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
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


def make_dots(kind: str, R: int):
    """The intrinsic for `kind` blocks ("Q4_1" or "Q8_0") against R input rows (module docstring)."""
    block_bytes = BLOCK_BYTES[kind]

    @intrinsic
    def dots_(typingctx, raw, w_start, x, x_start, K, sx, sx_start, acc):
        ok = (isinstance(raw, types.Array) and raw.dtype == types.uint8 and raw.layout == "C"
              and all(isinstance(a, types.Array) and a.dtype == types.float32 and a.layout == "C" for a in (x, sx, acc)))
        if not ok:
            return None
        sig = types.void(raw, w_start, x, x_start, K, sx, sx_start, acc)

        def codegen(context, builder, signature, args):
            ra, xa, sa, aa = (context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 2, 5, 7))
            w0, x0, K_, s0 = (context.cast(builder, args[i], signature.args[i], types.intp) for i in (1, 3, 4, 6))
            c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
            raw_p = builder.gep(builder.bitcast(ra.data, _I8.as_pointer()), [w0])
            x_p = builder.gep(builder.bitcast(xa.data, _F32.as_pointer()), [x0])
            s_p = builder.gep(builder.bitcast(sa.data, _F32.as_pointer()), [s0])
            acc_p = builder.bitcast(aa.data, _F32.as_pointer())
            nb = builder.sdiv(K_, c64(32))
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V32, [_V32] * 3), "llvm.fma.v32f32")
            begin = builder.block
            loop = builder.append_basic_block("qdots.loop")
            done = builder.append_basic_block("qdots.done")
            builder.cbranch(builder.icmp_signed(">", nb, c64(0)), loop, done)
            builder.position_at_end(loop)
            b = builder.phi(_I64)
            b.add_incoming(c64(0), begin)
            sums = [builder.phi(_V32) for _ in range(R)]
            msums = [builder.phi(_F32) for _ in range(R)]
            for phi in sums:
                phi.add_incoming(ir.Constant(_V32, None), begin)
            for phi in msums:
                phi.add_incoming(ir.Constant(_F32, 0.0), begin)
            new, new_m = _block(builder, kind, builder.gep(raw_p, [builder.mul(b, c64(block_bytes))]), b, nb, K_,
                                x_p, s_p, sums, msums, fma)
            latch = builder.block
            b_next = builder.add(b, c64(1))
            builder.cbranch(builder.icmp_signed("<", b_next, nb), loop, done)
            b.add_incoming(b_next, latch)
            for phi, value in zip(sums + msums, new + new_m):
                phi.add_incoming(value, latch)
            builder.position_at_end(done)
            final = [builder.phi(_V32) for _ in range(R)]
            final_m = [builder.phi(_F32) for _ in range(R)]
            for phi, value in zip(final + final_m, new + new_m):
                phi.add_incoming(value, latch)
                phi.add_incoming(ir.Constant(phi.type, None if phi.type == _V32 else 0.0), begin)
            for r in range(R):
                row = builder.gep(acc_p, [c64(33 * r)])
                builder.store(final[r], builder.bitcast(row, _V32.as_pointer()), align=4)
                builder.store(final_m[r], builder.gep(row, [c64(32)]), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return dots_


q41_dots1, q41_dots2, q41_dots3, q41_dots4 = (make_dots("Q4_1", R) for R in (1, 2, 3, 4))
q80_dots1, q80_dots2, q80_dots3, q80_dots4 = (make_dots("Q8_0", R) for R in (1, 2, 3, 4))


def make_dequant(kind: str):
    """dequant(raw, w_start, K, out, out_start): out.flat[out_start : out_start + K] = the K weights of
    the blocks at raw.flat[w_start:] (d * q + m), 32 per block."""
    block_bytes = BLOCK_BYTES[kind]

    @intrinsic
    def dequant_(typingctx, raw, w_start, K, out, out_start):
        if not (isinstance(raw, types.Array) and raw.dtype == types.uint8 and raw.layout == "C"
                and isinstance(out, types.Array) and out.dtype == types.float32 and out.layout == "C"):
            return None
        sig = types.void(raw, w_start, K, out, out_start)

        def codegen(context, builder, signature, args):
            ra, oa = (context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 3))
            w0, K_, o0 = (context.cast(builder, args[i], signature.args[i], types.intp) for i in (1, 2, 4))
            c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
            raw_p = builder.gep(builder.bitcast(ra.data, _I8.as_pointer()), [w0])
            out_p = builder.gep(builder.bitcast(oa.data, _F32.as_pointer()), [o0])
            nb = builder.sdiv(K_, c64(32))
            with cgutils.for_range(builder, nb) as loop:
                b = loop.index
                w, m = _decoded(builder, kind, builder.gep(raw_p, [builder.mul(b, c64(block_bytes))]))
                if m is not None:
                    w = builder.fadd(w, _splat(builder, m, 32, _F32))
                dst = builder.gep(out_p, [builder.mul(b, c64(32))])
                builder.store(w, builder.bitcast(dst, _V32.as_pointer()), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return dequant_


q41_dequant, q80_dequant = make_dequant("Q4_1"), make_dequant("Q8_0")
