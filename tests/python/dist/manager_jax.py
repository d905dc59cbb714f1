# SPDX-License-Identifier: Apache-2.0
"""One process of the ckptio.Manager test on JAX: argv is PORT PROCESS_ID NUM_PROCESSES
FOLDER, 4 CPU devices per process (XLA_FLAGS). A Manager with keep=2 and async_save=True, no
comm= (the arrays' runtime), saves 4 steps of a global array sharded over all devices; every
process restores the last two steps."""

from __future__ import annotations

import os
import sys
import traceback

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

sys.path.insert(0, os.path.dirname(__file__))
from _report import emit, spy_removals  # noqa: E402

import ckptio  # noqa: E402

port, pid, n = (int(a) for a in sys.argv[1:4])
root = sys.argv[4]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=n,
                           process_id=pid, initialization_timeout=30)
removed = spy_removals()
sharding = NamedSharding(Mesh(np.array(jax.devices()), ("d",)), P("d"))


def full(step: int) -> np.ndarray:
    return np.arange(8 * 4, dtype=np.float32).reshape(8, 4) + 100 * step


try:
    m = ckptio.Manager(root, keep=2, async_save=True, timeout=30)
    for s in range(4):
        x = jax.make_array_from_callback((8, 4), sharding, lambda idx: full(s)[idx])
        m.save(s, {"x": x, "step": s})
    m.wait_until_finished()
    like = {"x": jax.ShapeDtypeStruct((8, 4), np.float32, sharding=sharding), "step": 0}
    back = []
    for s in m.all_steps():
        out = m.restore(s, like=like)
        back.append(out["step"] == s and all(
            np.array_equal(np.asarray(sh.data), full(s)[sh.index])
            for sh in out["x"].addressable_shards))
    emit("jax", {"rank": pid, "steps": m.all_steps(), "back": back, "removed": len(removed)})
    m.close()
except Exception as e:
    emit("jax", {"rank": pid, "error": type(e).__name__, "message": str(e),
                 "trace": traceback.format_exc()})
jax.distributed.shutdown()
