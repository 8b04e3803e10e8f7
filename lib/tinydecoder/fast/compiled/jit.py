"""The fast path's compiler: numba, its threads, and how a kernel module's names are bound.

Every kernel is plain Python in a module of this package (or of `tinydecoder.fast`) and runs
compiled: `compiled(fn)` returns numba's dispatcher of fn, compiled once per process (fastmath,
cached on disk beside the module). A kernel module declares, at its top, what its compiled
functions call, and `compiled` binds those names in the module before numba reads it:

    prange = range                    # numba.prange once compiled: loops split between threads
    INLINE = ("dot_rows", "compiled.vexp.exp_le0")   # helpers compiled into the caller
    CALLS = {"compiled.tiles._rows_times_tiles": True}  # kernels called (parallel or not)
    exp_le0 = None                    # placeholder for an INLINE name from another module

A name with dots is a module path relative to `tinydecoder.fast` ("compiled.llvm.tile1x64"),
imported only when a kernel is compiled (those modules import numba or llvmlite, which a
notebook on the toy models never pays for); until then its placeholder is None, so reading the
module shows every name a kernel will call and where it comes from.

Without numba, or without threadpoolctl (see `one_blas_thread`), `available()` is False and the
fast path uses numpy's BLAS for every product; the numbers are the same up to float rounding.
"""
from __future__ import annotations

import contextlib
import importlib.util

_BASE = __package__.rpartition(".")[0]  # tinydecoder.fast: dotted names in INLINE and CALLS are relative to it


def _fast_extra_installed() -> bool:
    """Whether both packages of the [fast] extra are installed: numba, and threadpoolctl to hold
    numpy's BLAS to one thread while numba's threads run. numba alone is not used: with BLAS's
    threads spinning beside numba's on the same cores, a 100-token SmolLM2 prefill took 1.1 s
    instead of 0.28 s (measured). numba is imported on the first product only, so that a
    notebook on the toy models never pays for importing it."""
    return all(importlib.util.find_spec(name) is not None for name in ("numba", "threadpoolctl"))


_HAVE_FAST = _fast_extra_installed()


def available() -> bool:
    """True when numba and threadpoolctl are installed (the [fast] extra), so `rows_times` runs."""
    return _HAVE_FAST


_blas = None


def one_blas_thread():
    """A context in which numpy's BLAS runs on one thread (threadpoolctl), for a pass that runs
    numba's kernels: two thread pools on the same cores otherwise wait on each other's spinning
    threads (measured on 2 cores: decode steps several times slower, see `perf.machine.settle`).
    Without threadpoolctl (then `available()` is False and no kernel runs), a no-op."""
    global _blas
    if _blas is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            _blas = False
        else:
            _blas = ThreadpoolController().select(user_api="blas")
    return _blas.limit(limits=1) if _blas else contextlib.nullcontext()


_threads = []


def threads() -> int:
    """How many threads numba's kernels use: numba's setting when first asked (a kernel's tasks
    are split for that many; numba.set_num_threads later changes how many run them, never the
    results), else 1. Asking numba costs a few microseconds, and a decode step asks 30 times."""
    if not available():
        return 1
    if not _threads:
        from numba import get_num_threads

        _threads.append(get_num_threads())
    return _threads[0]


_compiled = {}


def compiled(fn, parallel: bool = True):
    """`fn` compiled by numba (fastmath, cached on disk; parallel unless said), once per process.
    The functions it compiles are plain Python in this package whose module binds `prange = range`;
    compiled in parallel, their `prange` loops run on numba's threads (starting them costs a few
    microseconds a call: small work is compiled serial). Compile a function one way only: numba's
    disk cache does not tell a parallel compilation from a serial one. In a parallel function,
    write loops, not array expressions (numba starts threads for each of those). The helpers a
    module names in INLINE are compiled into the functions that call them. The first call
    compiles (seconds) or loads numba's disk cache, under a lock shared by this user's
    processes: two processes starting at once (two notebooks, two test workers) compile once,
    and the second loads. Later calls take no lock, through the function returned before the first
    call too (the lock's file cost ~16 us a call to a caller that kept it)."""
    key = (fn, parallel)
    if key not in _compiled:
        _bind(fn.__globals__)
        dispatcher = _dispatcher(fn, parallel)

        def first_call(*args):
            if _compiled.get(key) is dispatcher:  # compiled: a caller that kept this function calls numba too
                return dispatcher(*args)
            with _compile_lock():
                out = dispatcher(*args)
            _compiled[key] = dispatcher  # later calls go straight to numba
            return out

        _compiled[key] = first_call
    return _compiled[key]


_dispatchers = {}


def _dispatcher(fn, parallel: bool):
    """numba's dispatcher of `fn` (compiled as `compiled` says), one per (fn, parallel)."""
    key = (fn, parallel)
    if key not in _dispatchers:
        import numba

        _dispatchers[key] = numba.njit(parallel=parallel, fastmath=True, cache=True)(fn)
    return _dispatchers[key]


def _bind(names: dict) -> None:
    """Bind, in a module's namespace `names`, what its compiled functions call: numba.prange for
    `prange`, each helper named in its INLINE compiled to be inlined (a helper imported from
    another module is compiled there, with that module's own helpers; "module.name" names one of a
    module of this package that imports numba itself, imported now, as `vexp.exp_le0` or the
    intrinsic `llvm.tile1x64`), and each "module.name" of its CALLS ({name: parallel}) bound to
    that function's own dispatcher, called rather than inlined by numba (a kernel that runs other
    kernels in turn, as `fused._layer_rows` runs the products; a parallel one keeps its threads).
    A function is compiled one way only (see `compiled`): CALLS says the way its own module does."""
    import importlib

    import numba

    names["prange"] = numba.prange
    for name, parallel in names.get("CALLS", {}).items():
        module, name = name.rsplit(".", 1)
        fn = getattr(importlib.import_module(f"{_BASE}.{module}"), name)
        fn = getattr(fn, "py_func", fn)
        _bind(fn.__globals__)
        names[name] = _dispatcher(fn, parallel)
    for name in names.get("INLINE", ()):
        if "." in name:  # a module that needs numba to import: bound here, not by an import at the top
            module, name = name.rsplit(".", 1)
            names[name] = getattr(importlib.import_module(f"{_BASE}.{module}"), name)
        helper = names[name]
        if hasattr(helper, "py_func") or not hasattr(helper, "__globals__"):  # compiled already, or an intrinsic
            continue
        if helper.__globals__ is not names:
            _bind(helper.__globals__)
            names[name] = helper.__globals__[name]
        else:
            names[name] = numba.njit(fastmath=True, cache=True, inline="always")(helper)


@contextlib.contextmanager
def _compile_lock():
    """An exclusive lock on a file in the temporary folder (POSIX; elsewhere no lock)."""
    try:
        import fcntl
    except ImportError:  # Windows: two processes may both compile, which is only slower
        yield
        return
    import os
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"tinydecoder-numba-{os.getuid()}.lock")
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # the lock goes with the file's closing
