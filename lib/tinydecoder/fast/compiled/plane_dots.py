"""quant_planes' inner loop in LLVM's IR (a numba intrinsic; this module imports numba): 16 output
rows of Q4_1 weights, stored as bit planes, against one input row, by table lookups.

    lookup16(planes, p_start, T, sx, nb, acc)      # one input row; make_lookup(R): R rows, acc [R, 16]

writes acc[0:16] = the dot products of the input row with 16 consecutive output rows, whose nb
blocks of 32 weights are planes.flat[p_start:] as quant_planes lays them out (GROUP_BYTES a block:
four planes of 16 words, then the 16 rows' d and their m as float16). T [K/4, 16]: for every 4
inputs x_4g..x_4g+3, the 16 sums of its subsets (T[g, s] = sum of x_4g+i over the bits i of s);
sx [K/32]: the input's block sums.

Per block: plane p's word of row r holds, in its nibble j, bit p of the codes of weights 4j..4j+3,
so x86's vpermps, which reads a lane's low 4 bits as its index, picks from T[8b + j] the sum of
those of the 4 inputs whose weight has bit p set, for 16 rows at once; the word shifted right 4j
bits gives nibble j. Summed over j and p with 2^p, that is sum q x for the block: 32 lookups and
28 shifts for 16 rows' 32 weights, against one table build and two picks per row in
quant_dots' `outputs`. Then acc += d (sum q x) + m (sum x), in two fused multiply-adds.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .llvm import _prefetch_line

GROUP = 16  # output rows a lookup serves: the 16 lanes of an AVX-512 register
GROUP_BYTES = 320  # a block of GROUP rows: 4 planes x 16 words (256 bytes), 16 d and 16 m (float16, 64 bytes)
PREFETCH_BYTES = 8192  # how far ahead of its blocks a lookup asks the memory for more (2,048: 43, 8,192: 50 GB/s)

_F32, _I64, _I32, _I8 = ir.FloatType(), ir.IntType(64), ir.IntType(32), ir.IntType(8)
_V16, _W16 = ir.VectorType(_F32, 16), ir.VectorType(_I32, 16)
_H16 = ir.VectorType(ir.HalfType(), 16)


def _splat(builder, value):
    undef = ir.Constant(_V16, ir.Undefined)
    one = builder.insert_element(undef, value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, undef, ir.Constant(_W16, None))


def _pairwise(builder, vectors):
    """Their sum, added in pairs ((a + b) + (c + d)): half the waiting of a chain."""
    while len(vectors) > 1:
        vectors = [builder.fadd(vectors[i], vectors[i + 1]) for i in range(0, len(vectors), 2)]
    return vectors[0]


def _block(builder, base, tbs, sxbs, totals):
    """One block of the 16 rows (bytes at base) against R input rows (row r's 8 tables from tbs[r],
    its block sum sxbs[r]): -> each totals[r] + d sum(q x_r) + m sum(x_r). The plane words and their
    shifted copies (the tables' indices) are computed once for the R rows."""
    c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
    pick = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16, [_V16, _W16]),
                                          "llvm.x86.avx512.permvar.sf.512")
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16, [_V16] * 3), "llvm.fma.v16f32")
    R = len(tbs)
    two, four = (ir.Constant(_V16, [ir.Constant(_F32, v)] * 16) for v in (2.0, 4.0))
    planes = [[None] * 4 for _ in range(R)]
    low = [None] * R
    for p in range(4):
        word = builder.load(builder.bitcast(builder.gep(base, [c64(64 * p)]), _W16.as_pointer()), align=4)
        index = [word if j == 0 else builder.lshr(word, ir.Constant(_W16, [ir.Constant(_I32, 4 * j)] * 16))
                 for j in range(8)]
        for r in range(R):
            tables = [builder.load(builder.bitcast(builder.gep(tbs[r], [c64(16 * j)]), _V16.as_pointer()), align=4)
                      for j in range(8)]
            planes[r][p] = _pairwise(builder, [builder.call(pick, [tables[j], index[j]]) for j in range(8)])
            if p == 1:
                low[r] = builder.call(fma, [planes[r][1], two, planes[r][0]])  # bits 0-1: p0 + 2 p1
    d, m = (builder.fpext(builder.load(builder.bitcast(builder.gep(base, [c64(at)]), _H16.as_pointer()), align=2), _V16)
            for at in (256, 288))
    out = []
    for r in range(R):
        high = builder.call(fma, [planes[r][3], two, planes[r][2]])  # bits 2-3, over 4: p2 + 2 p3
        qx = builder.call(fma, [high, four, low[r]])  # sum q x (the powers of two are exact)
        out.append(builder.call(fma, [m, _splat(builder, sxbs[r]), builder.call(fma, [d, qx, totals[r]])]))
    return out


def make_lookup(R: int):
    """The intrinsic lookup(planes, p_start, T, sx, nb, acc) for R input rows: acc[r, 0:16] = row r's
    dot products with the 16 rows (module docstring) for T [R, K/4, 16], sx [R, K/32], acc [R, 16]
    (C-contiguous float32). Row r's numbers are those of one row alone (`lookup16`), bit for bit:
    the same operations in the same order, the planes' indices shared."""

    @intrinsic
    def lookup(typingctx, planes, p_start, T, sx, nb, acc):
        ok = (isinstance(planes, types.Array) and planes.dtype == types.uint8 and planes.layout == "C"
              and all(isinstance(a, types.Array) and a.dtype == types.float32 and a.layout == "C" for a in (T, sx, acc)))
        if not ok:
            return None
        sig = types.void(planes, p_start, T, sx, nb, acc)

        def codegen(context, builder, signature, args):
            pa, ta, sa, aa = (context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 2, 3, 5))
            p0, nb_ = (context.cast(builder, args[i], signature.args[i], types.intp) for i in (1, 4))
            c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
            first = builder.gep(builder.bitcast(pa.data, _I8.as_pointer()), [p0])
            t_p, s_p = (builder.bitcast(a.data, _F32.as_pointer()) for a in (ta, sa))
            row_tables = builder.mul(nb_, c64(128))  # a row's tables: K/4 x 16 floats
            entry = builder.block
            loop, done = builder.append_basic_block("lookup.loop"), builder.append_basic_block("lookup.done")
            builder.branch(loop)
            builder.position_at_end(loop)
            b = builder.phi(_I64)
            totals = [builder.phi(_V16) for _ in range(R)]
            b.add_incoming(c64(0), entry)
            for t in totals:
                t.add_incoming(ir.Constant(_V16, None), entry)
            base = builder.gep(first, [builder.mul(b, c64(GROUP_BYTES))])
            for line in range(0, GROUP_BYTES, 64):  # the bytes PREFETCH_BYTES ahead (a prefetch never faults)
                _prefetch_line(builder, builder.gep(base, [c64(PREFETCH_BYTES + line)]))
            tbs = [builder.gep(t_p, [builder.add(builder.mul(c64(r), row_tables), builder.mul(b, c64(128)))])
                   for r in range(R)]
            sxbs = [builder.load(builder.gep(s_p, [builder.add(builder.mul(c64(r), nb_), b)]), align=4) for r in range(R)]
            new = _block(builder, base, tbs, sxbs, totals)
            b_next, latch = builder.add(b, c64(1)), builder.block
            b.add_incoming(b_next, latch)
            for t, v in zip(totals, new):
                t.add_incoming(v, latch)
            builder.cbranch(builder.icmp_signed("<", b_next, nb_), loop, done)
            builder.position_at_end(done)
            out = builder.bitcast(builder.bitcast(aa.data, _F32.as_pointer()), _V16.as_pointer())
            for r, v in enumerate(new):
                builder.store(v, builder.gep(out, [c64(r)]), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return lookup


lookup16 = make_lookup(1)  # one input row: a decode step's products (quant_planes)
lookup2 = make_lookup(2)  # two (quant_planes.ROWS_UP_TO)
