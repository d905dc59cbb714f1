# SPDX-License-Identifier: Apache-2.0
"""One process of the Orbax test: argv is PORT PROCESS_ID NUM_PROCESSES FOLDER, 4 CPU devices
per process (XLA_FLAGS). With ckptio.orbax registered, saves a global array sharded over a (4, 2)
mesh of all devices and a replicated one with ocp.StandardCheckpointer, restores them onto other
shardings (rows over all 8 devices), and runs a CheckpointManager over 3 steps keeping 2."""

from __future__ import annotations

import os
import sys
import traceback

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

sys.path.insert(0, os.path.dirname(__file__))
from _report import emit, start_jax  # noqa: E402

pid, n, (root,) = start_jax()

import orbax.checkpoint as ocp  # noqa: E402

import ckptio.orbax  # noqa: E402

full = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("a", "b"))
mesh8 = Mesh(np.array(jax.devices()), ("d",))


def global_array(value: np.ndarray, sharding: NamedSharding) -> jax.Array:
    return jax.make_array_from_callback(value.shape, sharding, lambda idx: value[idx])


def check(tree: dict[str, jax.Array], want: dict[str, np.ndarray]) -> bool:
    return all(np.array_equal(np.asarray(s.data), want[k][s.index])
               for k, a in tree.items() for s in a.addressable_shards)


try:
    ckptio.orbax.register(ckptio.orbax.ArrayHandler(timeout=30))
    want = {"x": full, "rep": full * 2}
    tree = {"x": global_array(want["x"], NamedSharding(mesh, P("a", "b"))),
            "rep": global_array(want["rep"], NamedSharding(mesh, P()))}  # on both processes
    assert not tree["x"].is_fully_addressable
    path = os.path.join(root, "ckpt")
    with ocp.StandardCheckpointer() as c:
        c.save(path, tree)
        c.wait_until_finished()
    own = os.path.join(path, ckptio.orbax.SUBDIR, "data", f"r{pid:05d}-000000.ckd")
    written = os.path.getsize(own)

    rows = NamedSharding(mesh8, P("d"))
    like = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=rows) for k, v in want.items()}
    with ocp.StandardCheckpointer() as c:
        out = c.restore(path, like)
    read = ckptio.last_load_stats().bytes  # this process's devices' rows only
    ok = check(out, want) and all(out[k].sharding == rows for k in out)
    ok = ok and len(out["x"].addressable_shards) == 4

    opts = ocp.CheckpointManagerOptions(max_to_keep=2)
    with ocp.CheckpointManager(os.path.join(root, "run"), options=opts) as mgr:
        for step in range(3):
            mgr.save(step, args=ocp.args.StandardSave({k: v + step for k, v in tree.items()}))
        mgr.wait_until_finished()
        steps = [int(s) for s in mgr.all_steps()]
        got = mgr.restore(2, args=ocp.args.StandardRestore(like))
    ok = ok and check(got, {k: v + 2 for k, v in want.items()})
    emit("orbax", {"rank": pid, "restored_ok": bool(ok), "manager_steps": steps,
                   "written": written, "read": read})

    # The last process cannot stage its part: every process fails with its message.
    if pid == n - 1:
        def refuse(tree: object, nranks: int) -> None:
            raise ckptio.orbax.error(ckptio.orbax.USAGE, "injected staging failure")

        ckptio.orbax._dist.stage = refuse  # type: ignore[assignment]
    try:
        with ocp.StandardCheckpointer() as c:
            c.save(os.path.join(root, "refused"), tree)
            c.wait_until_finished()
        emit("refused", {"rank": pid, "saved": True})
    except Exception as e:
        emit("refused", {"rank": pid, "error": type(e).__name__, "message": str(e)})
except Exception as e:
    emit("orbax", {"rank": pid, "error": type(e).__name__, "message": str(e),
                   "trace": traceback.format_exc()})
jax.distributed.shutdown()
