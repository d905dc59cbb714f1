# SPDX-License-Identifier: Apache-2.0
"""One rank of the peer-tier test on mpi4py, under mpirun (4 ranks as 2 simulated nodes of 2,
given by node= rather than the environment): argv is a JSON object with "persist", "roots"
(one root per node), "lose" (the node whose root is deleted between saving and restoring) and
"first_of_lost" (the rank that deletes it); see tier_parts.save_lose_restore."""

from __future__ import annotations

import json
import os
import sys
import traceback

from mpi4py import MPI

sys.path.insert(0, os.path.dirname(__file__))
from _report import emit  # noqa: E402
from tier_parts import save_lose_restore  # noqa: E402

world = MPI.COMM_WORLD
rank = world.Get_rank()
run = json.loads(sys.argv[1])
try:
    res = save_lose_restore(world, rank, rank // 2, world.Barrier, run)
    res.pop("m").close()
except Exception as e:
    res = {"error": type(e).__name__, "message": str(e), "trace": traceback.format_exc()}
emit("mpi", json.loads(json.dumps(dict(rank=rank, **res), default=str)))
