# SPDX-License-Identifier: Apache-2.0
"""One rank of the peer-tier tests on torch.distributed (gloo, CPU): argv is a JSON object
(the run), MASTER_ADDR/PORT, RANK, WORLD_SIZE, CKPTIO_NODE and CKPTIO_PEER_ADDR come from the
environment.

The run's keys: "mode" ("save", "restore" or "dtensor": see dtensors()), "persist" (the
Manager's directory), "local" (this rank's node root), "kw" (more Manager arguments: replicas,
persist_every, local_keep, keep, timeout), "steps" (saved in order), "sizes" (bytes of "w" per
step and rank, see tier_parts.size_of), "kill" ({"rank", "step", "when": "before" | "after"}:
that rank SIGKILLs itself before save(step) is called, or as soon as it returns),
"steps_to_restore" (restore these steps by number as well as the newest one), "barrier"
(false: a rank of the job will be killed from outside, so no barrier after the saves),
"deleter" (dtensor: the rank that deletes its node's root), "loader" (iterate a torch DataLoader
with that many worker processes after each save: they fork this process, as a training loop's
do every epoch). Mode "serve" saves "steps", then writes its server's address and port as
serving-RANK.json in $CKPTIO_TEST_OUT (rank 0 also the job's key with its last byte changed,
as key-off-by-one: what a test's outsider tries), and keeps serving until the file "go"
appears there (60 s at most). Each rank writes what happened
(with "removed": what it removed through shutil.rmtree) as TAG-RANK.json (TAG: the mode) in
$CKPTIO_TEST_OUT."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import sys
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from _report import emit  # noqa: E402
from tier_parts import part, same, size_of  # noqa: E402

import ckptio  # noqa: E402

run: dict[str, Any] = json.loads(sys.argv[1])
removed: list[str] = []  # every folder removed through shutil.rmtree, as an absolute path
_rmtree = shutil.rmtree


def spy(path: Any, *a: Any, **k: Any) -> None:
    removed.append(os.path.abspath(os.fspath(path)))
    _rmtree(path, *a, **k)


shutil.rmtree = spy  # type: ignore[assignment]
mode = run["mode"]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, n = dist.get_rank(), dist.get_world_size()
sizes = run.get("sizes", {})
kill = run.get("kill") or {}


def plain(v: Any) -> Any:
    """A JSON-able copy of ``v`` (last_save and last_restore hold only plain values, but a
    float('inf') or a path object must not lose the whole report)."""
    return json.loads(json.dumps(v, default=str))


def torch_part(step: int) -> dict[str, Any]:
    t = part(rank, step, size_of(sizes, rank, step))
    return {k: torch.from_numpy(v) if hasattr(v, "dtype") else v for k, v in t.items()}


def manager() -> ckptio.Manager:
    kw = dict(run.get("kw", {}))
    kw.setdefault("timeout", 20)
    return ckptio.Manager(run["persist"], comm="torch", local=run["local"], **kw)


def failure(e: BaseException) -> dict[str, Any]:
    return {"error": type(e).__name__, "message": str(e),
            "notes": getattr(e, "__notes__", []), "trace": traceback.format_exc()}


def die_if(step: int, when: str) -> None:
    if kill.get("rank") == rank and kill.get("step") == step and kill.get("when") == when:
        os.kill(os.getpid(), signal.SIGKILL)


def save() -> dict[str, Any]:
    m = manager()
    saved = []
    res: dict[str, Any] = {}
    try:
        for s in run["steps"]:
            die_if(s, "before")
            m.save(s, torch_part(s))
            die_if(s, "after")
            saved.append(s)
            if run.get("loader"):
                loader = torch.utils.data.DataLoader(range(8), batch_size=2,
                                                     num_workers=run["loader"])
                assert sum(int(b.sum()) for b in loader) == 28
        m.wait_until_finished()
    except Exception as e:
        res = failure(e)
    res.update(saved=saved, last_save=plain(m.last_save))
    if not kill and run.get("barrier", True):
        # Every rank's pushes have ended before any rank stops serving its peers.
        dist.barrier()
    try:
        m.close()
    except Exception as e:
        res.setdefault("close_error", f"{type(e).__name__}: {e}")
    return res


def serve() -> dict[str, Any]:
    m = manager()
    for s in run["steps"]:
        m.save(s, torch_part(s))
    m.wait_until_finished()
    dist.barrier()
    t = m._tiers
    assert t is not None
    out = os.environ["CKPTIO_TEST_OUT"]
    if rank == 0:
        off = bytearray(t._key)
        off[-1] ^= 1
        with open(os.path.join(out, "key-off-by-one"), "w") as f:
            f.write(off.hex())
    with open(os.path.join(out, f"serving-{rank}.json.tmp"), "w") as f:
        json.dump({"addr": t.peers[rank]["addr"], "port": t.server.port}, f)
    os.rename(os.path.join(out, f"serving-{rank}.json.tmp"), os.path.join(out, f"serving-{rank}.json"))
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(out, "go")) and time.monotonic() < deadline:
        time.sleep(0.05)
    dist.barrier()
    m.close()
    return {"saved": run["steps"]}


def restore() -> dict[str, Any]:
    m = manager()
    t0 = time.monotonic()
    out = m.restore()
    res: dict[str, Any] = {"wall_s": time.monotonic() - t0, "last_restore": plain(m.last_restore)}
    step = out.get("step") if isinstance(out, dict) else None
    res["step"] = step
    res["ok"] = isinstance(step, int) and same(out, rank, step, size_of(sizes, rank, step))
    by_number = {}
    for s in run.get("steps_to_restore", []):
        got = m.restore(step=s)
        by_number[str(s)] = {"ok": same(got, rank, s, size_of(sizes, rank, s)),
                             "last_restore": plain(m.last_restore)}
    res["by_number"] = by_number
    dist.barrier()  # every rank has fetched what it needed before peers stop serving
    m.close()
    return res


def dtensors() -> dict[str, Any]:
    """DTensors in the tiers, in one launch: steps 1 and 2 of {"w": a Shard(0) DTensor, "step"}
    saved; rank run["deleter"] deletes its node's root; restored without like= (this rank's
    shard as a plain tensor) and with like= (the DTensor rebuilt)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (n,))

    def full(step: int) -> torch.Tensor:
        return torch.arange(8 * n * 3, dtype=torch.float32).reshape(8 * n, 3) + 100 * step

    def tree(step: int) -> dict[str, Any]:
        return {"w": distribute_tensor(full(step), mesh, [Shard(0)]), "step": step}

    mine = slice(8 * rank, 8 * (rank + 1))
    m = manager()
    for s in (1, 2):
        m.save(s, tree(s))
    m.wait_until_finished()
    dist.barrier()
    m.close()
    dist.barrier()
    if rank == run["deleter"]:
        shutil.rmtree(run["local"])
    dist.barrier()
    m = manager()
    out = m.restore()
    plain_ok = (type(out["w"]) is torch.Tensor and torch.equal(out["w"], full(2)[mine])
                and out["step"] == 2)  # fmt: skip
    source = m.last_restore["source"]
    out = m.restore(like=tree(0))
    w = out["w"]
    like_ok = (isinstance(w, DTensor) and w.placements == (Shard(0),) and w.shape == full(2).shape
               and torch.equal(w.to_local(), full(2)[mine]) and out["step"] == 2)  # fmt: skip
    dist.barrier()
    m.close()
    return {"plain_ok": plain_ok, "like_ok": like_ok, "source": source}


try:
    result = {"save": save, "restore": restore, "dtensor": dtensors, "serve": serve}[mode]()
except Exception as e:
    result = failure(e)
emit(mode, dict(rank=rank, pid=os.getpid(), node=os.environ.get("CKPTIO_NODE"), removed=removed,
                **result))
sys.stdout.flush()
os._exit(0)  # a rank may be gone (the kill tests): leave without the group's teardown
