# SPDX-License-Identifier: Apache-2.0
"""One process of the JAX distributed-save test: argv is PORT PROCESS_ID NUM_PROCESSES FOLDER,
4 CPU devices per process (XLA_FLAGS). Saves a global array sharded over a (4, 2) mesh of all
devices (rows over 4, columns over 2: each box held by one device) and a replicated one, without
comm= (jax's runtime is used); restores it with another sharding (rows over all 8 devices) and
replicated, and checks every addressable shard."""

from __future__ import annotations

import os
import sys
import traceback

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

sys.path.insert(0, os.path.dirname(__file__))
from _report import emit  # noqa: E402

import ckptio  # noqa: E402

port, pid, n = (int(a) for a in sys.argv[1:4])
root = sys.argv[4]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=n,
                           process_id=pid, initialization_timeout=30)
full = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
devs = np.array(jax.devices()).reshape(4, 2)
mesh = Mesh(devs, ("a", "b"))


def global_array(sharding: NamedSharding) -> jax.Array:
    return jax.make_array_from_callback(full.shape, sharding, lambda idx: full[idx])


try:
    x = global_array(NamedSharding(mesh, P("a", "b")))
    rep = global_array(NamedSharding(mesh, P()))  # replicated across both processes
    assert not x.is_fully_addressable
    ckptio.save({"x": x, "rep": rep, "step": 5}, os.path.join(root, "ckpt"), timeout=30)
    mesh8 = Mesh(np.array(jax.devices()), ("d",))
    like = {"x": jax.ShapeDtypeStruct(full.shape, full.dtype, sharding=NamedSharding(mesh8, P("d"))),
            "rep": jax.ShapeDtypeStruct(full.shape, full.dtype,
                                        sharding=NamedSharding(mesh8, P()))}
    out = ckptio.load(os.path.join(root, "ckpt"), like=like)
    ok = all(np.array_equal(np.asarray(s.data), full[s.index])
             for a in (out["x"], out["rep"]) for s in a.addressable_shards)
    ok = ok and out["x"].sharding == like["x"].sharding and len(out["x"].addressable_shards) == 4
    emit("jax", {"rank": pid, "restored_ok": bool(ok)})
except Exception as e:
    emit("jax", {"rank": pid, "error": type(e).__name__, "message": str(e),
                 "trace": traceback.format_exc()})
jax.distributed.shutdown()
