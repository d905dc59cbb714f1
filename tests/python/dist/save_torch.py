# SPDX-License-Identifier: Apache-2.0
"""One rank of the torch.distributed (gloo, CPU) distributed-save tests; MASTER_ADDR/PORT, RANK
and WORLD_SIZE come from the environment, the scenario and the checkpoint folder from argv.

"four" (4 ranks): save DTensors (Shard(0), Replicate on a 1-D mesh of 4), plain replicated
tensors, plain values and RankLocal state without comm= (the DTensors' runtime is used); load
them back on the 4 ranks with like= DTensors of other placements; save diverging replicas
(every rank must fail naming the tensor); then the last rank raises before calling save and
the others must fail within the timeout, publishing nothing.
"one" (1 rank): DTensors on a mesh of one process.
"three" (3 ranks): load the "four" checkpoint with Shard(1)/Replicate like= DTensors; save a
checkpoint, then save over it while rank 1 is killed (SIGKILL) in the middle of the save: the
others must fail within the timeout and the first checkpoint stay intact."""

from __future__ import annotations

import os
import signal
import time
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
from ckptio.ranks import _comm  # noqa: E402

mode, root = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank, n = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (n,))


def full_w() -> torch.Tensor:
    return torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)


def full_b() -> torch.Tensor:
    return torch.arange(6, dtype=torch.float64) * 0.5


def failure(e: BaseException) -> dict[str, Any]:
    return {"rank": rank, "error": type(e).__name__, "code": getattr(e, "code", None),
            "message": str(e), "cause": type(e.__cause__).__name__ if e.__cause__ else None}


def run(tag: str, fn: Any) -> None:
    try:
        emit(tag, dict(rank=rank, **fn()))
    except ckptio.CheckpointError as e:
        emit(tag, failure(e))
    except Exception as e:
        emit(tag, dict(failure(e), trace=traceback.format_exc()))


class Killing:
    """A communicator over another that kills this process (SIGKILL) at its call `at`."""

    def __init__(self, inner: Any, at: int) -> None:
        self.inner, self.at, self.calls = inner, at, 0
        self.rank, self.size = inner.rank, inner.size

    def _step(self) -> None:
        self.calls += 1
        if self.calls == self.at:
            os.kill(os.getpid(), signal.SIGKILL)

    def barrier(self, timeout: float) -> None:
        self._step()
        self.inner.barrier(timeout)

    def broadcast(self, root: int, data: bytes | None, timeout: float) -> bytes:
        self._step()
        return self.inner.broadcast(root, data, timeout)

    def gather(self, root: int, data: bytes, timeout: float) -> list[bytes] | None:
        self._step()
        return self.inner.gather(root, data, timeout)


if mode == "four":
    path = os.path.join(root, "ckpt")

    def save() -> dict[str, Any]:
        tree = {
            "model": {
                "w": distribute_tensor(full_w(), mesh, [Shard(0)]),
                "b": distribute_tensor(full_b(), mesh, [Replicate()]),
                "e": torch.ones(3, dtype=torch.int32),  # plain, the same on every rank (DDP)
            },
            "step": 7,
            "lr": 0.5,
            "rng": ckptio.RankLocal({"seed": torch.tensor([100 + rank]), "n": rank}),
        }
        st = ckptio.save(tree, path, timeout=20)  # no comm=: the DTensors' runtime
        return {"bytes": st.bytes}

    run("save", save)

    def load_like() -> dict[str, Any]:
        like = {
            "model": {
                "w": distribute_tensor(torch.zeros(8, 6), mesh, [Replicate()]),
                "b": distribute_tensor(torch.zeros(6, dtype=torch.float64), mesh, [Shard(0)]),
                "e": torch.zeros(3, dtype=torch.int32),
            },
            "step": 0,
            "rng": None,
        }
        out = ckptio.load(path, like=like, comm="torch")
        w, b = out["model"]["w"], out["model"]["b"]
        assert isinstance(w, DTensor) and isinstance(b, DTensor)
        assert w.placements == (Replicate(),) and b.placements == (Shard(0),)
        return {
            "w_ok": torch.equal(w.to_local(), full_w()),
            "b_local": b.to_local().tolist(),
            "b_ok": torch.equal(b.full_tensor(), full_b()),
            "e": out["model"]["e"].tolist(),
            "step": out["step"],
            "rng": [out["rng"]["seed"].tolist(), out["rng"]["n"]],
        }

    run("load4", load_like)

    def diverge() -> dict[str, Any]:
        tree = {"w": distribute_tensor(full_w(), mesh, [Shard(0)]),
                "stats": torch.full((4,), float(rank == 2))}
        ckptio.save(tree, os.path.join(root, "diverge"), comm="torch", timeout=20)
        return {}

    run("diverge", diverge)

    if rank == 0:  # a plain tree saved by one rank alone: a one-process save, no waiting
        run("rank0", lambda: {"bytes": ckptio.save(
            {"e": torch.ones(3), "step": 1}, os.path.join(root, "rank0")).bytes})

    tree = {"w": distribute_tensor(full_w(), mesh, [Shard(0)])}  # collective: before the fault

    def raise_before() -> dict[str, Any]:
        if rank == n - 1:
            raise RuntimeError("this rank's own code failed before the save")
        ckptio.save(tree, os.path.join(root, "absent"), comm="torch", timeout=3)
        return {}

    run("absent", raise_before)
    if rank == n - 1:
        time.sleep(5)  # still alive (handling its error) while the others time out
    emit("published", {"rank": rank, "absent": os.path.exists(os.path.join(root, "absent"))})
    os._exit(0)  # abandoned gloo operations keep the group busy; leave without teardown

if mode == "one":
    # A mesh of this process alone, no comm=: a one-rank save; like= gives a DTensor back.
    def one() -> dict[str, Any]:
        path = os.path.join(root, "one")
        ckptio.save({"w": distribute_tensor(full_w(), mesh, [Shard(0)]),
                     "p": torch.nn.Parameter(torch.ones(2))}, path)
        out = ckptio.load(path)
        like = {"w": distribute_tensor(torch.zeros(8, 6), mesh, [Shard(1)])}
        back = ckptio.load(path, like=like)["w"]
        return {"full_ok": torch.equal(out["w"], full_w()),
                "param": isinstance(out["p"], torch.nn.Parameter),
                "dtensor": isinstance(back, DTensor) and back.placements == (Shard(1),)
                and torch.equal(back.to_local(), full_w())}

    run("one", one)
    os._exit(0)

if mode == "three":
    src = os.path.join(root, "ckpt")

    def load_like() -> dict[str, Any]:
        like = {"model": {"w": distribute_tensor(torch.zeros(8, 6), mesh, [Shard(1)]),
                          "b": distribute_tensor(torch.zeros(6, dtype=torch.float64), mesh,
                                                 [Replicate()])},
                "rng": None}
        out = ckptio.load(src, like=like)  # no comm=: the DTensors' runtime gives the rank
        w = out["model"]["w"]
        assert isinstance(w, DTensor) and w.placements == (Shard(1),)
        return {"w_local": w.to_local().tolist(), "w_ok": torch.equal(w.full_tensor(), full_w()),
                "b_ok": torch.equal(out["model"]["b"].to_local(), full_b()),
                "rng": [out["rng"]["seed"].tolist(), out["rng"]["n"]]}

    run("load3", load_like)
    path = os.path.join(root, "killed")
    comm = _comm.resolve("torch")

    def first() -> dict[str, Any]:
        ckptio.save({"w": distribute_tensor(full_w(), mesh, [Shard(0)]), "step": 1}, path,
                    comm=comm, timeout=20)
        return {}

    run("first", first)

    def killed() -> dict[str, Any]:
        # Rank 1 dies at its fourth collective call: every rank has written its data files into
        # the temporary directory and is about to agree on the outcome.
        c = Killing(comm, 4 if rank == 1 else 0)
        ckptio.save({"w": distribute_tensor(full_w() * 2, mesh, [Shard(0)]), "step": 2}, path,
                    comm=c, timeout=5, overwrite=True)
        return {}

    run("killed", killed)
    if rank == 0:
        out = ckptio.load(path)
        emit("after", {"rank": 0, "step": out["step"], "w_ok": torch.equal(out["w"], full_w()),
                       "entries": sorted(os.listdir(root))})
    os._exit(0)
