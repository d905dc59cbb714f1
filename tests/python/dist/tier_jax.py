# SPDX-License-Identifier: Apache-2.0
"""One process of the peer-tier test on JAX (2 processes as 2 simulated nodes of one, given by
node=): argv is PORT PROCESS_ID NUM_PROCESSES RUN, RUN a JSON object as tier_mpi.py's; the
barrier between the phases is the distributed client's own."""

from __future__ import annotations

import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(__file__))
from _report import emit, start_jax  # noqa: E402
from tier_parts import save_lose_restore  # noqa: E402

pid, n, args = start_jax()
run = json.loads(args[0])
phase = [0]


def barrier() -> None:
    from jax._src import distributed

    phase[0] += 1
    distributed.global_state.client.wait_at_barrier(f"tier-test-{phase[0]}", 30_000)


try:
    res = save_lose_restore("jax", pid, pid, barrier, run)
except Exception as e:
    res = {"error": type(e).__name__, "message": str(e), "trace": traceback.format_exc()}
emit("jax", json.loads(json.dumps(dict(rank=pid, **res), default=str)))
import jax  # noqa: E402

jax.distributed.shutdown()
