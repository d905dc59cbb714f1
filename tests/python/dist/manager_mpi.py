# SPDX-License-Identifier: Apache-2.0
"""One rank of the ckptio.Manager test on mpi4py, under mpirun: argv is the run folder. A
Manager with keep=2, async_save=True and comm=COMM_WORLD saves 4 steps of a tree whose rows
of a global (8, 3) array are each rank's ckptio.Shard; every rank changes its array as soon as
save() returns and runs its own allreduce on COMM_WORLD while the save runs in the background."""

from __future__ import annotations

import os
import sys
import traceback
import warnings

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(__file__))
from _report import emit, spy_removals  # noqa: E402

import ckptio  # noqa: E402

world = MPI.COMM_WORLD
rank, n = world.Get_rank(), world.Get_size()
rows = 8 // n
removed = spy_removals()


def full(step: int) -> np.ndarray:
    return np.arange(24, dtype=np.int64).reshape(8, 3) + 100 * step


try:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = ckptio.Manager(sys.argv[1], keep=2, async_save=True, comm=world, timeout=20)
        for s in range(4):
            mine = full(s)[rank * rows : (rank + 1) * rows].copy()
            m.save(s, {"x": ckptio.Shard(mine, (rank * rows, 0), (8, 3)), "step": s})
            mine += 10_000  # the snapshot was taken
            assert world.allreduce(1) == n  # the caller's own collective meanwhile
        m.wait_until_finished()
    back = [bool(np.array_equal(m.restore(s)["x"], full(s))) for s in m.all_steps()]
    emit("mpi", {"rank": rank, "steps": m.all_steps(), "back": back, "removed": len(removed),
                 "multiple": MPI.Query_thread() == MPI.THREAD_MULTIPLE,
                 "warnings": [str(w.message) for w in caught]})
    m.close()
except Exception as e:
    emit("mpi", {"rank": rank, "error": type(e).__name__, "message": str(e),
                 "trace": traceback.format_exc()})
