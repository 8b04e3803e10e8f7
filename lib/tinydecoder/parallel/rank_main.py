"""What each rank runs under `mpiexec` (see launch.py): `python -m tinydecoder.parallel.rank_main FOLDER`.

Once MPI is up it marks so (FOLDER/started.RANK), reads FOLDER/job.pkl = ("module:function",
kwargs), calls function(MPI.COMM_WORLD, **kwargs) and writes ("ok", result) or ("error",
"Type: message") to FOLDER/rank<r>.pkl. After an error it aborts the
whole job, so no other rank waits for this one in a collective."""
from __future__ import annotations

import importlib
import os
import pickle
import sys
import traceback
from pathlib import Path


def write(folder: Path, rank: int, value) -> None:
    tmp = folder / f"rank{rank}.pkl.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(value, f)
    os.replace(tmp, folder / f"rank{rank}.pkl")  # whole or absent: never half a file


def main(folder: str) -> int:
    from mpi4py import MPI  # MPI_Init

    comm, where = MPI.COMM_WORLD, Path(folder)
    rank = comm.Get_rank()
    (where / f"started.{rank}").touch()  # MPI came up: the launcher tells a failed start from a failed rank
    try:
        with open(where / "job.pkl", "rb") as f:
            target, kwargs = pickle.load(f)
        module, name = target.split(":")
        result = getattr(importlib.import_module(module), name)(comm, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher, then the job ends
        message = f"{type(exc).__name__}: {exc}"
        write(where, rank, ("error", message))
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        comm.Abort(1)
        return 1
    write(where, rank, ("ok", result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
