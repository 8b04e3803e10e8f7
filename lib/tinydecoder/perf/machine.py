"""This machine's two roofs and the timers every measurement here uses.

- Memory bandwidth: `bandwidth_probe` times one float32 matrix-vector product over a 268 MB
  matrix (a decode step's access pattern: every weight read once), run as the fast path runs
  it or as numpy does; `measure_bandwidth` is the best of a few runs of both (a roof is the best
  the machine does), with a plain copy beside it. `settle` waits out numpy's spinning BLAS threads.
- Matmul FLOP/s: `measure_matmul`, a float32 2048 x 2048 product, best of a few runs: what
  numpy's BLAS reaches. `measure_fma_peak`: what the cores reach, a compiled loop of independent
  fused multiply-adds (numba; an OpenBLAS build that runs AVX2 kernels on an AVX-512 CPU reaches
  about half of it).
- `gemm_times`: one weight matrix times M rows, numpy's matmul against the fast path's `project`.
- `ridge_point`, `attainable_gflops`: the roofline from the two roofs; `H100_SXM` a GPU's
  published figures for comparison.
- `cpu_description`: which CPU ran the measurements (the kernels' best choices, and so every
  ratio bench reports, differ from one CPU generation to the next).

Timings use time.perf_counter; nothing here asserts a speed. `perf.bench` builds the
model's measurements on these.
"""
from __future__ import annotations

import os
import platform
import time

import numpy as np

from .. import fast
from ..core.validate import is_int
from ..fast import tunables
from ..fast.compiled import jit


def attainable_gflops(intensity, bandwidth_gbps: float, peak_gflops: float):
    """The roofline: min(peak, bandwidth * intensity), in GFLOP/s (intensity in FLOP/byte)."""
    return np.minimum(peak_gflops, bandwidth_gbps * np.asarray(intensity, dtype=np.float64))


def ridge_point(bandwidth_gbps: float, peak_gflops: float) -> float:
    """The intensity (FLOP/byte) where the two roofs meet."""
    return peak_gflops / bandwidth_gbps


def run_times(fn, repeat: int = 5, warmup: int = 1, after=None, before=None) -> list:
    """Wall times (seconds) of `repeat` calls of fn(), after `warmup` untimed calls; `after()`
    (untimed) runs after every call, e.g. to truncate a cache back, and `before()` (untimed)
    before every call."""
    if not is_int(repeat) or repeat < 1:
        raise ValueError(f"repeat must be an integer >= 1, got {repeat!r}")
    times = []
    for i in range(warmup + repeat):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        if after is not None:
            after()
        if i >= warmup:
            times.append(elapsed)
    return times


def median_seconds(fn, repeat: int = 5, warmup: int = 1, after=None) -> float:
    """Median wall time of fn() over `repeat` calls (see run_times): a typical run."""
    return float(np.median(run_times(fn, repeat, warmup, after)))


def paired_share(amount: float, times, probes) -> float:
    """Median over pairs of (amount / time) / (probe rate * 1e9): the share of a roof reached by
    runs that each followed a probe (GB/s or GFLOP/s); `probes` may hold extra warm-up probes
    first, the last len(times) are paired with `times`."""
    pairs = zip(times, list(probes)[-len(times):])
    return float(np.median([amount / t / (rate * 1e9) for t, rate in pairs]))


def best_seconds(fn, repeat: int = 5, warmup: int = 1) -> float:
    """Shortest wall time of fn() over `repeat` calls: for a roof, what the machine can do
    (other programs running at the same time can only make a run slower)."""
    return float(np.min(run_times(fn, repeat, warmup)))


PROBE_INPUTS = 576  # the bandwidth probe's K: SmolLM2's width, the input size of most of its weight bytes


def bandwidth_probe(nbytes: int = 2**28, kernel: str = "fast"):
    """A callable that runs one float32 matrix-vector product x[1, K] @ W[K, N], W of `nbytes`
    (default 268 MB, far larger than any cache), and returns the GB/s it read W at: the access
    pattern of a decode step, which reads every weight once. W has PROBE_INPUTS rows (K), as a
    model's matrices do, and as many columns as `nbytes` allows. The fast path's kernel read a
    square W (16,384 inputs per output: the input row does not fit the core's first-level cache)
    at 0.55-0.85x the rate it read W of 576 rows (a 2-core Zen 4 machine, December 2026), and
    SmolLM2's decode steps ran at up to 115% of that "roof". W is allocated (every page
    touched) when the probe is made, not when it runs. kernel="fast": W is out-major and the
    product runs as the fast path runs a decode step's (`forward_pass.project`: numba's kernel when it
    is installed, numpy's otherwise); "numpy": numpy's matrix-vector product."""
    if kernel not in ("fast", "numpy"):
        raise ValueError(f"kernel must be 'fast' or 'numpy', got {kernel!r}")
    k = PROBE_INPUTS
    n = max(64, nbytes // (4 * k))
    w = np.full((k, n), 0.5, dtype=np.float32, order="F" if kernel == "fast" else "C")  # [K, N]
    x = np.ones((1, k), dtype=np.float32)
    y = np.empty((1, n), dtype=np.float32)

    def probe() -> float:
        start = time.perf_counter()
        if kernel == "fast":
            with jit.one_blas_thread():
                fast.project(x, w, y)
        else:
            np.matmul(x, w, out=y)
        return w.nbytes / (time.perf_counter() - start) / 1e9

    probe.nbytes, probe.matrix = int(w.nbytes), w
    return probe


def measure_bandwidth(nbytes: int = 2**28, repeat: int = 5) -> dict:
    """Memory bandwidth from `bandwidth_probe` (a decode step's access pattern), the fastest
    of `repeat` runs after one warm-up, with numpy's product and with the fast path's, the
    larger being the roof (a roof is the best the machine does); also a plain copy (read +
    write) for comparison.  -> {"bandwidth_gbps", "by_kernel", "copy_gbps", "bytes", "seconds"}."""
    by_kernel = {}
    for kernel in ("numpy", "fast"):
        probe = bandwidth_probe(nbytes, kernel)
        probe()
        by_kernel[kernel] = max(probe() for _ in range(repeat))
        if kernel == "numpy":
            settle()  # numpy's BLAS threads stop spinning before the fast path's kernel runs
    best = max(by_kernel.values())
    w = probe.matrix  # the copy reads the probe's own matrix: one 268 MB source, not two
    dst = np.empty_like(w)
    copy_seconds = best_seconds(lambda: np.copyto(dst, w), repeat)
    return {"bandwidth_gbps": best, "by_kernel": by_kernel, "copy_gbps": 2 * w.nbytes / copy_seconds / 1e9,
            "bytes": probe.nbytes, "seconds": probe.nbytes / best / 1e9}


def cpu_description() -> str:
    """This machine's CPU in one line, for a benchmark's report: `describe_cpu` of /proc/cpuinfo
    (Linux), else of what the platform module knows."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        text = ""
    return describe_cpu(text, os.cpu_count() or 1, platform.machine(), platform.processor())


def describe_cpu(cpuinfo: str, cores: int, machine: str = "", processor: str = "") -> str:
    """"<model name> (family F model M), N cores, <widest vector extension>" from the text of
    /proc/cpuinfo (its first processor's fields); without one, the processor or machine name."""
    fields = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's fields only
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or processor or machine or "unknown CPU"
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']} model {fields['model']})"
    flags = set(fields.get("flags", "").split())
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "AVX" if "avx" in flags else ""
    return f"{name}, {cores} core{'s' if cores != 1 else ''}" + (f", {vector}" if vector else "")


def settle(seconds: float = tunables.BLAS_SPIN_SECONDS) -> None:
    """Wait until numpy's BLAS threads have stopped spinning. After a product that OpenBLAS runs
    on several threads, its idle threads keep their cores busy for ~0.1 s (OpenBLAS's thread
    timeout); numba's kernels started in that time share those cores and run 2-6x slower
    (measured on this 2-core machine). The fast path never wakes them while numba is in use (it
    holds BLAS to one thread, and its products run in numba, `few_rows.rows_times`);
    a benchmark settles after numpy's own multi-threaded products (its probes, the reference
    path's traces) before timing the fast path."""
    time.sleep(seconds)


def matmul_probe(n: int = 2048):
    """A callable that runs one float32 [n, n] @ [n, n] product (2 n^3 FLOPs) and returns the
    GFLOP/s it ran at; its matrices are allocated (every page touched) when the probe is made."""
    a = np.full((n, n), 0.5, dtype=np.float32)
    b = np.full((n, n), 0.25, dtype=np.float32)
    c = np.full((n, n), 0.0, dtype=np.float32)

    def probe() -> float:
        start = time.perf_counter()
        np.matmul(a, b, out=c)
        return 2 * n**3 / (time.perf_counter() - start) / 1e9

    probe.n = int(n)
    return probe


def measure_matmul(n: int = 2048, repeat: int = 3) -> dict:
    """Matmul FLOP/s from `matmul_probe`, the fastest of `repeat` runs after one warm-up.
    -> {"matmul_gflops", "n", "seconds"}."""
    probe = matmul_probe(n)
    probe()
    best = max(probe() for _ in range(repeat))
    return {"matmul_gflops": best, "n": int(n), "seconds": 2 * n**3 / best / 1e9}


def measure_fma_peak() -> float | None:
    """The cores' float32 FLOP/s in fused multiply-adds on every numba thread (fast.compiled.fma_peak),
    in GFLOP/s; None without numba."""
    if not jit.available():
        return None
    from ..fast.compiled import fma_peak

    return fma_peak.fma_gflops()


def gemm_times(k: int, n: int, rows=(1, 2, 3, 4, 8, 16, 32), repeat: int = 5) -> list:
    """Median seconds of x[M, k] @ W[k, n] (float32, W out-major as SmolLM2's weights are stored)
    for each M in `rows`, as numpy's plain matmul and as the fast path's `project` (numba's kernel
    when it is installed, reading W once for all M rows; else numpy's, with 2 or 3 rows as GEMVs and
    4-7 rows padded to 8), each after the machine settled (`settle`). weights_gbps: W's bytes /
    seconds, the rate the weights stream at.
    -> [{"rows", "plain_seconds", "project_seconds", "plain_weights_gbps", "project_weights_gbps"}]."""
    if any(not is_int(m) or m < 1 for m in rows):
        raise ValueError(f"rows must be integers >= 1, got {rows!r}")
    w = np.full((k, n), 0.5, dtype=np.float32, order="F")  # [k, n] out-major, every page touched
    out = []
    for m in rows:
        x = np.ones((m, k), dtype=np.float32)
        y = np.empty((m, n), dtype=np.float32)
        settle()
        with jit.one_blas_thread():  # as fast.forward runs it
            proj = median_seconds(lambda: fast.project(x, w, y), repeat)
        plain = median_seconds(lambda: np.matmul(x, w, out=y), repeat)
        out.append({"rows": int(m), "plain_seconds": plain, "project_seconds": proj,
                    "plain_weights_gbps": w.nbytes / plain / 1e9, "project_weights_gbps": w.nbytes / proj / 1e9})
    return out


# Published peak figures of one GPU, for a ridge point beside the CPU's (NVIDIA H100 SXM5
# datasheet: dense BF16 tensor-core FLOP/s, without sparsity; HBM3 bandwidth).
H100_SXM = {"name": "NVIDIA H100 SXM", "peak_gflops": 989e3, "bandwidth_gbps": 3.35e3,
            "source": "NVIDIA H100 Tensor Core GPU datasheet (dense BF16, HBM3)"}


def keep_freed_memory(trim_bytes: int = tunables.TRIM_BYTES, mmap_bytes: int = tunables.MMAP_BYTES) -> bool:
    """Ask glibc's malloc to keep freed memory for reuse (True if it could: Linux with glibc).

    A long prefill allocates hundreds of MB of short-lived numpy temporaries; by default glibc
    returns much of it to the OS between layers and page-faults it back in the next one. This
    keeps up to `trim_bytes` of freed heap and serves allocations below `mmap_bytes` from it.
    It changes the whole process's allocator, so nothing calls it behind your back: `bench` and
    the command line opt in (and say so on stderr); a notebook or a library user may call it."""
    import ctypes
    import ctypes.util
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, int(mmap_bytes))) and \
            bool(libc.mallopt(M_TRIM_THRESHOLD, int(trim_bytes)))
    except (OSError, AttributeError):
        return False
