"""A GGUF block decoded in LLVM's IR (numba intrinsics' pieces; this module imports numba): the
helpers quant_dots' kernels build their loops from, and `make_dequant`, which writes the weights out.

    _decoded(builder, kind, p)   -> a block's 32 weights d * q as <32 x float>, and Q4_1's m
    _by_table(builder, p)        -> a Q4_1 block's 32 weights fl(d q + m), each picked from the 16
                                    possible (AVX-512's vpermps: `TABLE`)
    make_dequant(kind)(raw, w_start, K, out, out_start)   # K weights of blocks into float32s

A Q4_1 block is d and m (float16) and 16 bytes of 4-bit codes (weights 0-15 in the low nibbles,
16-31 in the high ones); a Q8_0 block is d and 32 signed bytes. By table, the block's 16 possible
weights d * q + m are one vector, built by one fused multiply-add from d, m and 0..15, and each
code picks its weight from it (x86's vpermps takes a code's low 4 bits as the lane): each weight is
then exactly float32's dequantisation of it, the f32 path's weight.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .llvm import has_avx512
from .quant_matrix import BLOCK_BYTES

_F32, _I64, _I32, _I16, _I8 = ir.FloatType(), ir.IntType(64), ir.IntType(32), ir.IntType(16), ir.IntType(8)
_V32 = ir.VectorType(_F32, 32)
_V16 = ir.VectorType(_F32, 16)


TABLE = has_avx512()  # Q4_1 blocks by table (module docstring) where the CPU has vpermps on 16 lanes


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


def _by_table(builder, p, dm_p=None):
    """A Q4_1 block's 32 weights fl(d q + m) as <32 x float>, each picked from the 16 possible. dm_p:
    where the block's d and m lie as two float32s (quant_rows.scales: each broadcast by its load),
    else None (the block's own float16s, converted and broadcast in registers)."""
    c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
    i32s = lambda v: ir.Constant(ir.VectorType(_I32, 16), [ir.Constant(_I32, v)] * 16)  # noqa: E731
    if dm_p is None:
        dm = builder.fpext(builder.load(builder.bitcast(p, ir.VectorType(ir.HalfType(), 2).as_pointer()), align=1),
                           ir.VectorType(_F32, 2))
        d, m = builder.extract_element(dm, ir.Constant(_I32, 0)), builder.extract_element(dm, ir.Constant(_I32, 1))
    else:
        d, m = builder.load(dm_p, align=4), builder.load(builder.gep(dm_p, [c64(1)]), align=4)
    fma16 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16, [_V16] * 3), "llvm.fma.v16f32")
    levels = ir.Constant(_V16, [ir.Constant(_F32, float(q)) for q in range(16)])
    table = builder.call(fma16, [_splat(builder, d, 16, _F32), levels, _splat(builder, m, 16, _F32)])
    codes = builder.load(builder.bitcast(builder.gep(p, [c64(4)]), ir.VectorType(_I8, 16).as_pointer()), align=1)
    wide = builder.zext(codes, ir.VectorType(_I32, 16))
    pick = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16, [_V16, ir.VectorType(_I32, 16)]),
                                          "llvm.x86.avx512.permvar.sf.512")
    lo = builder.call(pick, [table, builder.and_(wide, i32s(15))])  # weights 0-15: low nibbles
    hi = builder.call(pick, [table, builder.lshr(wide, i32s(4))])  # weights 16-31: high nibbles
    return builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, 32), [ir.Constant(_I32, i) for i in range(32)]))


def make_dequant(kind: str):
    """dequant(raw, w_start, K, out, out_start): out.flat[out_start : out_start + K] = the K weights of
    the blocks at raw.flat[w_start:] (d * q + m), 32 per block. (By table it took 6.7 ms for the 30
    layers against 6.3 converted: the writes, not the decoding, set its pace.)"""
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
