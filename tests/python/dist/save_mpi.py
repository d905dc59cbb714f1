# SPDX-License-Identifier: Apache-2.0
"""One rank of the mpi4py distributed-save test, under mpirun: argv is the folder. Each rank
saves its rows of a global (8, 3) array as a ckptio.Shard, a replicated plain array, a plain
value and its own counter as ckptio.RankLocal, with comm= the mpi4py COMM_WORLD."""

from __future__ import annotations

import os
import sys
import traceback

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(__file__))
from _report import emit  # noqa: E402

import ckptio  # noqa: E402

world = MPI.COMM_WORLD
rank, n = world.Get_rank(), world.Get_size()
rows = 8 // n
full = np.arange(8 * 3, dtype=np.int64).reshape(8, 3)
try:
    tree = {
        "x": ckptio.Shard(full[rank * rows:(rank + 1) * rows], (rank * rows, 0), full.shape),
        "bias": np.ones(3),
        "epoch": 2,
        "count": ckptio.RankLocal(np.int64(rank * 10)),
    }
    ckptio.save(tree, os.path.join(sys.argv[1], "ckpt"), comm=world, timeout=30)
    mine = ckptio.load(os.path.join(sys.argv[1], "ckpt"), comm=world)
    assert int(mine["count"]) == rank * 10 and mine["epoch"] == 2
    emit("mpi", {"rank": rank})
except Exception as e:
    emit("mpi", {"rank": rank, "error": type(e).__name__, "message": str(e),
                 "trace": traceback.format_exc()})
