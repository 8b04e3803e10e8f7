"""The cores' arithmetic roof: how many fused multiply-adds a second they retire when nothing
else is asked of them (this module imports numba).

`chains(n)`, an intrinsic: CHAINS independent running values, each updated n times by
v = v * b + c on vectors of the machine's widest floats (16 on AVX-512, 8 on AVX2), so that no
multiply-add waits for another's result and nothing is read from memory. `fma_gflops()` runs it
on every numba thread at once and counts 2 FLOPs a lane a multiply-add.

Why it exists: bench's "matmul" roof is numpy's float32 GEMM, which is only as fast as its
OpenBLAS build. On 2 vCPUs of an AMD EPYC (Zen 5, December 2026) OpenBLAS ran its Haswell (AVX2)
kernels at 240 GFLOP/s while these chains ran 526: the least a pass over n rows can cost
(perf.weights_bench.pass_floor) is set by this roof, not by numpy's.
"""
from __future__ import annotations

import time

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import jit
from .llvm import has_avx512

CHAINS = 12  # independent values: a multiply-add's latency (4 cycles) x its throughput (2 a cycle), and some
LANES = 16 if has_avx512() else 8  # the widest vector of float32 the target has (12 of them fit its registers)
prange = range  # numba.prange once compiled (jit.compiled)
INLINE = ("compiled.fma_peak.chains",)

_F32, _I64 = ir.FloatType(), ir.IntType(64)
_VEC = ir.VectorType(_F32, LANES)


@intrinsic
def chains(typingctx, n):
    """CHAINS x LANES running values, each multiplied and added n times; returns one lane of
    their sum (so that the work is used)."""
    if not isinstance(n, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC, [_VEC] * 3), f"llvm.fma.v{LANES}f32")
        count = context.cast(builder, args[0], signature.args[0], types.int64)
        splat = lambda v: ir.Constant(_VEC, [ir.Constant(_F32, v)] * LANES)  # noqa: E731
        entry = builder.block
        loop, done = builder.append_basic_block("fma.loop"), builder.append_basic_block("fma.done")
        builder.cbranch(builder.icmp_signed(">", count, ir.Constant(_I64, 0)), loop, done)
        builder.position_at_end(loop)
        i = builder.phi(_I64)
        i.add_incoming(ir.Constant(_I64, 0), entry)
        values = [builder.phi(_VEC) for _ in range(CHAINS)]
        for c, v in enumerate(values):
            v.add_incoming(splat(0.001 * c), entry)  # chain c starts at 0.001 c
        new = [builder.call(fma, [v, splat(0.9999), splat(1e-4)]) for v in values]
        i_next, latch = builder.add(i, ir.Constant(_I64, 1)), builder.block
        i.add_incoming(i_next, latch)
        for v, w in zip(values, new):
            v.add_incoming(w, latch)
        builder.cbranch(builder.icmp_signed("<", i_next, count), loop, done)
        builder.position_at_end(done)
        final = [builder.phi(_VEC) for _ in range(CHAINS)]
        for c, (f, w) in enumerate(zip(final, new)):
            f.add_incoming(w, latch)
            f.add_incoming(splat(0.001 * c), entry)  # n = 0: the starting values
        total = final[0]
        for f in final[1:]:
            total = builder.fadd(total, f)
        return builder.extract_element(total, ir.Constant(ir.IntType(32), 0))

    return types.float32(n), codegen


def _run(n, threads, out):  # pragma: no cover - runs compiled by numba
    """out[t] = thread t's chains(n), every thread at once."""
    for t in prange(threads):
        out[t] = chains(n)


def fma_gflops(seconds: float = 0.05, repeat: int = 3) -> float:
    """The best of `repeat` runs of `chains` on every numba thread, each ~`seconds` long, in
    GFLOP/s (2 FLOPs a lane a multiply-add)."""
    threads = jit.threads()
    out = np.empty(threads, np.float32)
    run = jit.compiled(_run)
    run(1000, threads, out)  # compiled (or loaded from numba's cache) and the threads started
    n = 1 << 16
    while True:  # grow the count until one run takes a measurable time
        start = time.perf_counter()
        run(n, threads, out)
        elapsed = time.perf_counter() - start
        if elapsed > seconds / 4 or n >= 1 << 34:
            break
        n *= 4
    n = max(1, int(n * seconds / max(elapsed, 1e-9)))
    best = 0.0
    for _ in range(repeat):
        start = time.perf_counter()
        run(n, threads, out)
        best = max(best, 2.0 * LANES * CHAINS * n * threads / (time.perf_counter() - start) / 1e9)
    return best
