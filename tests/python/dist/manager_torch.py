# SPDX-License-Identifier: Apache-2.0
"""One rank of the ckptio.Manager tests on torch.distributed (gloo, CPU, 4 ranks);
MASTER_ADDR/PORT, RANK and WORLD_SIZE come from the environment, the run folder from argv.

"sync": a Manager with keep=2 and no comm= (the DTensors' runtime) saves 4 steps of a tree
with a Shard(0) DTensor and a plain replicated tensor; every rank lists the last two steps
and restores them with like= DTensors; only rank 0 removes anything (a spy on ckptio._core.remove_checkpoint).
"kill" (3 ranks): rank 0 is killed (SIGKILL) while it deletes an old step, after renaming it
out of the listing: the others fail within the timeout, and the listed step is loadable.
"async": the same with comm=WORLD and async_save=True; every rank changes its tensors as soon
as save() returns and runs its own all_reduce on WORLD while the save runs in the background
(ckptio's background collectives use a group of their own).
"incremental": Manager(full_every=3) in the background on every rank: deltas saved by all
ranks against the step before, chains kept short, bases kept while a kept step needs them."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

sys.path.insert(0, os.path.dirname(__file__))
from _report import emit, spy_removals  # noqa: E402

import ckptio  # noqa: E402

root, mode = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank, n = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (n,))

removed = spy_removals()


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
                   "notes": getattr(e, "__notes__", []), "trace": traceback.format_exc()})


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


def big(step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    base = torch.randn(4096, 64, generator=g)  # 1 MiB: each rank's shard is coded
    return base + 1e-3 * step * torch.randn(4096, 64, generator=torch.Generator().manual_seed(step))


def incremental() -> dict[str, Any]:
    """full_every=3 across ranks, in the background: saves 0 and 3 full, the others deltas on
    the step before; keep=2 keeps 4 and 5, and 3, their base."""
    m = ckptio.Manager(os.path.join(root, "incr"), keep=2, full_every=3, async_save=True,
                       comm=dist.group.WORLD, timeout=20)
    for s in range(6):
        m.save(s, {"w": distribute_tensor(big(s), mesh, [Shard(0)]), "step": s})
    m.wait_until_finished()
    steps = m.all_steps()
    bases = [m.base_step(s) for s in steps]
    ok = True
    for s in steps:
        out = m.restore(s, like={"w": distribute_tensor(torch.zeros(4096, 64), mesh,
                                                        [Replicate()]), "step": 0}, comm="torch")
        ok = ok and torch.equal(out["w"].to_local(), big(s)) and out["step"] == s
    m.close()
    return {"steps": steps, "bases": bases, "ok": ok}


def kill() -> dict[str, Any]:
    remove = ckptio._core.remove_checkpoint

    def die(path: Any, *store: Any) -> None:
        """Remove step 0, killed (SIGKILL) inside the library's removal: once the step is
        renamed out of the listing, before its files are gone (the pad gives the time)."""
        parent = os.path.dirname(os.fspath(path))

        def watch() -> None:
            deadline = time.monotonic() + 60  # then the test fails on what it finds, not hangs
            while time.monotonic() < deadline:
                if any(".deleting-" in e for e in os.listdir(parent)):
                    break
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, daemon=True).start()
        remove(path, *store)  # the library's removal runs without the GIL: the watcher sees it
        time.sleep(60)  # (never reached while the watcher works)

    m = ckptio.Manager(os.path.join(root, "kill"), keep=1, async_save=False, timeout=3)
    m.save(0, tree(0))
    if rank == 0:
        pad = os.path.join(m.step_path(0), "pad")  # 4,000 files: slow enough to be killed in
        os.mkdir(pad)
        for i in range(4000):
            open(os.path.join(pad, str(i)), "w").close()
        ckptio._core.remove_checkpoint = die  # type: ignore[assignment]
    dist.barrier()
    m.save(1, tree(1))  # rank 0 dies deleting step 0; the others wait for it, in vain
    return {}


if mode == "kill":
    run("kill", kill)
    if rank == 1:  # rank 0 is dead: this rank looks at what it left, as a new run would
        d = os.path.join(root, "kill")
        entries = sorted(os.listdir(d))
        # The dead rank's process is gone once the launcher has reaped it (a zombie still
        # counts as alive, and a live owner's deletion is never interfered with).
        dead = int(entries[0].rsplit("-", 1)[1]) if "deleting" in entries[0] else 0
        until = time.monotonic() + 20
        while dead and os.path.exists(f"/proc/{dead}") and time.monotonic() < until:
            time.sleep(0.05)
        m = ckptio.Manager(d, keep=1, async_save=False)  # removes the dead rank's leftovers
        out = ckptio.load(m.step_path(1))
        emit("after", {"rank": 1, "entries": entries, "steps": m.all_steps(),
                       "w_ok": torch.equal(out["w"], full_w(1)), "left": sorted(os.listdir(d))})
    os._exit(0)  # the group lost a rank: leave without teardown
run("sync", sync)
run("async", background)
run("incremental", incremental)
dist.barrier()
os._exit(0)
