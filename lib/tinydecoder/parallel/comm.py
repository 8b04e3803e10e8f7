"""A communicator that counts: every collective a rank makes, its bytes and its time.

    comm = TracedComm(MPI.COMM_WORLD)
    comm.allreduce(x, "attn_out")        # x summed over ranks, in place
    comm.counts("allreduce"), comm.bytes("allreduce"), comm.seconds()

Bytes are the payload a rank hands to MPI (its buffer's size): an all-reduce of [S, D] float32
counts S*D*4 on every rank, whatever algorithm MPI picks to move it (a ring sends 2(p-1)/p
of it per rank; `ring_bytes` says so). `begin_step()` starts a new per-step tally."""
from __future__ import annotations

import time
from collections import Counter

import numpy as np


def ring_bytes(payload: int, ranks: int) -> float:
    """Bytes one rank sends in a ring all-reduce of `payload` bytes: 2 (p - 1) / p of it."""
    return 2 * (ranks - 1) / ranks * payload


class TracedComm:
    """mpi4py's communicator, with a tally of the collectives the tensor-parallel model uses."""

    def __init__(self, comm):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.log = []  # (step, kind, label, nbytes, seconds)
        self.step = 0

    def begin_step(self) -> None:
        self.step += 1

    def _record(self, kind, label, nbytes, start):
        self.log.append((self.step, kind, label, int(nbytes), time.perf_counter() - start))

    def allreduce(self, x: np.ndarray, label: str = "") -> np.ndarray:
        """Sum x over all ranks, in place (every rank ends with the same sum)."""
        from mpi4py import MPI

        if not (isinstance(x, np.ndarray) and x.flags.c_contiguous):
            raise TypeError("allreduce needs a C-contiguous numpy array (it sums in place)")
        start = time.perf_counter()
        self.comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
        self._record("allreduce", label, x.nbytes, start)
        return x

    def gather_columns(self, x: np.ndarray, label: str = "lm_head"):
        """Every rank's [S, n] block to rank 0, side by side: [S, size*n] there, None elsewhere."""
        x = np.ascontiguousarray(x)
        start = time.perf_counter()
        whole = np.empty((self.size,) + x.shape, x.dtype) if self.rank == 0 else None
        self.comm.Gather(x, whole, root=0)
        self._record("gather", label, x.nbytes, start)
        if whole is None:
            return None
        return np.concatenate(list(whole), axis=-1)

    def bcast_token(self, token, label: str = "token") -> int:
        """Rank 0's token id to every rank."""
        buf = np.array([-1 if token is None else token], np.int64)
        start = time.perf_counter()
        self.comm.Bcast(buf, root=0)
        self._record("bcast", label, buf.nbytes, start)
        return int(buf[0])

    # ------------------------------------------------------------------ the tally

    def counts(self, kind: str | None = None, step: int | None = None) -> Counter | int:
        """Calls per kind (or of one kind), over all steps or one."""
        c = Counter(k for s, k, *_ in self.log if step is None or s == step)
        return c if kind is None else c[kind]

    def bytes(self, kind: str | None = None, step: int | None = None) -> int:
        return sum(n for s, k, _, n, _ in self.log if (kind is None or k == kind) and (step is None or s == step))

    def seconds(self, step: int | None = None) -> float:
        """Time spent inside collectives (waiting for the others included)."""
        return sum(t for s, *_, t in self.log if step is None or s == step)

    def step_summary(self, step: int) -> dict:
        return {"allreduce": self.counts("allreduce", step), "allreduce_bytes": self.bytes("allreduce", step),
                "gather": self.counts("gather", step), "gather_bytes": self.bytes("gather", step),
                "bcast": self.counts("bcast", step), "comm_seconds": self.seconds(step)}
