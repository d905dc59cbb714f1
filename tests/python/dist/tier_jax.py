# SPDX-License-Identifier: Apache-2.0
"""One process of the peer-tier test on JAX (2 processes as 2 simulated nodes of one, given by
node=): argv is PORT PROCESS_ID NUM_PROCESSES RUN, RUN a JSON object as tier_mpi.py's; the
barrier between the phases is the distributed client's own. Each process's tree holds its
numpy part and "g", a jax array spanning both processes (rows sharded over their devices):
restored without like= as this process's shards, with like= as the global array again."""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _report import emit, start_jax  # noqa: E402
from tier_parts import part, same, save_lose_restore  # noqa: E402

pid, n, args = start_jax()
run = json.loads(args[0])
phase = [0]

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

sharding = NamedSharding(Mesh(np.array(jax.devices()), ("d",)), P("d"))


def barrier() -> None:
    from jax._src import distributed

    phase[0] += 1
    distributed.global_state.client.wait_at_barrier(f"tier-test-{phase[0]}", 30_000)


def full(step: int) -> np.ndarray:
    return np.arange(4 * len(jax.devices()) * 3, dtype=np.float32).reshape(-1, 3) + 100 * step


def glob(step: int) -> jax.Array:
    return jax.make_array_from_callback(full(step).shape, sharding, lambda i: full(step)[i])


def tree(step: int) -> dict[str, Any]:
    return {"part": part(pid, step), "g": glob(step)}


def shards_ok(got: Any, step: int) -> bool:
    """``got`` holds this process's shards of glob(step) (a list of arrays, in the order of the
    array's addressable shards)."""
    want = [full(step)[s.index] for s in glob(step).addressable_shards]
    return isinstance(got, list) and len(got) == len(want) and all(
        np.array_equal(np.asarray(g), w) for g, w in zip(got, want))


def check(out: Any) -> tuple[int, bool]:
    step = out["part"]["step"]
    return step, same(out["part"], pid, step) and shards_ok(out["g"], step)


try:
    res = save_lose_restore("jax", pid, pid, barrier, run, tree, check)
    m = res.pop("m")
    try:
        out = m.restore(like=tree(0))
        g = out["g"]
        res["like_ok"] = (isinstance(g, jax.Array) and g.shape == full(2).shape
                          and g.sharding == sharding and same(out["part"], pid, 2)
                          and all(np.array_equal(np.asarray(s.data), full(2)[s.index])
                                  for s in g.addressable_shards))
        res["like_source"] = m.last_restore["source"]
    finally:
        barrier()
        m.close()
except Exception as e:
    res = {"error": type(e).__name__, "message": str(e), "trace": traceback.format_exc()}
emit("jax", json.loads(json.dumps(dict(rank=pid, **res), default=str)))
jax.distributed.shutdown()
