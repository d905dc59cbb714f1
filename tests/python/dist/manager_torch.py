# SPDX-License-Identifier: Apache-2.0
"""One rank of the ckptio.Manager tests on torch.distributed (gloo, CPU, 4 ranks);
MASTER_ADDR/PORT, RANK and WORLD_SIZE come from the environment, the run folder from argv.

"sync": a Manager with keep=2 and no comm= (the DTensors' runtime) saves 4 steps of a tree
with a Shard(0) DTensor and a plain replicated tensor; every rank lists the last two steps
and restores them with like= DTensors; only rank 0 removes anything (a spy on shutil.rmtree).
"async": the same with comm=WORLD and async_save=True; every rank changes its tensors as soon
as save() returns and runs its own all_reduce on WORLD while the save runs in the background
(ckptio's background collectives use a group of their own)."""

from __future__ import annotations

import os
import shutil
import sys
import traceback
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

sys.path.insert(0, os.path.dirname(__file__))
from _report import emit  # noqa: E402

import ckptio  # noqa: E402

root = sys.argv[1]
dist.init_process_group("gloo")
rank, n = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (n,))

removed: list[str] = []
_rmtree = shutil.rmtree


def spy(path: Any, *a: Any, **k: Any) -> None:
    removed.append(os.path.basename(os.fspath(path)))
    _rmtree(path, *a, **k)


shutil.rmtree = spy  # type: ignore[assignment]


def full_w(step: int) -> torch.Tensor:
    return torch.arange(48, dtype=torch.float32).reshape(8, 6) + 100 * step


def tree(step: int) -> dict[str, Any]:
    return {"w": distribute_tensor(full_w(step), mesh, [Shard(0)]),
            "b": torch.full((5,), float(step), dtype=torch.float64), "step": step}


def like() -> dict[str, Any]:
    return {"w": distribute_tensor(torch.zeros(8, 6), mesh, [Replicate()]),
            "b": torch.zeros(5, dtype=torch.float64), "step": 0}


def check(m: ckptio.Manager, steps: list[int]) -> bool:
    for s in steps:
        out = m.restore(s, like=like(), comm="torch")
        w = out["w"]
        assert isinstance(w, DTensor) and w.placements == (Replicate(),)
        assert torch.equal(w.to_local(), full_w(s)), (s, w.to_local())
        assert torch.equal(out["b"], torch.full((5,), float(s), dtype=torch.float64))
        assert out["step"] == s
    return True


def run(tag: str, fn: Any) -> None:
    try:
        emit(tag, dict(rank=rank, **fn()))
    except Exception as e:
        emit(tag, {"rank": rank, "error": type(e).__name__, "message": str(e),
                   "trace": traceback.format_exc()})


def sync() -> dict[str, Any]:
    removed.clear()
    m = ckptio.Manager(os.path.join(root, "sync"), keep=2, async_save=False, timeout=20)
    seen = []
    for s in range(4):
        m.save(s, tree(s))
        seen.append(m.all_steps())  # the same on every rank as soon as save() returns
    ok = check(m, [2, 3])
    m.close()
    return {"seen": seen, "steps": m.all_steps(), "ok": ok, "removed": sorted(removed),
            "pid": os.getpid()}


def background() -> dict[str, Any]:
    removed.clear()
    m = ckptio.Manager(os.path.join(root, "async"), keep=2, async_save=True,
                       comm=dist.group.WORLD, timeout=20)
    for s in range(4):
        t = tree(s)
        m.save(s, t)
        t["w"].to_local().add_(10_000)  # the snapshot was taken: the checkpoint keeps step s
        t["b"].add_(10_000)
        x = torch.ones(1)
        dist.all_reduce(x)  # the caller's own collective on WORLD, while the save runs
        assert x.item() == n
    m.wait_until_finished()
    steps = m.all_steps()
    ok = check(m, [2, 3])
    m.close()
    return {"steps": steps, "ok": ok, "removed": sorted(removed)}


run("sync", sync)
run("async", background)
dist.barrier()
os._exit(0)
