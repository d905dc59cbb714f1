# SPDX-License-Identifier: Apache-2.0
"""One rank of the ckptio.torch.dcp tests (gloo, CPU); MASTER_ADDR/PORT, RANK and WORLD_SIZE
come from the environment, the scenario and the folder from argv.

"save" (2 ranks): dcp.save of an FSDP2 model's state (get_state_dict: model and optimizer,
DTensors Shard(0)) plus plain DTensors, a replicated tensor and plain values through
ckptio's StorageWriter; dcp.async_save with the thread and the process executors; a
ckptio.save(comm=) checkpoint of DTensors; then a save over the first checkpoint in which
rank 1 raises inside write_data (its planner fails to give an item).
"load" (3 ranks): dcp.load of those checkpoints into DTensors of other placements (Shard(1),
Replicate) on a mesh of 3, resharded by DCP's planners."""

from __future__ import annotations

import datetime
import os
import sys
import traceback
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

sys.path.insert(0, os.path.dirname(__file__))
from _report import emit, leave_torch  # noqa: E402

import ckptio  # noqa: E402
from ckptio.torch.dcp import StorageReader, StorageWriter  # noqa: E402

TIMEOUT = 20.0
# Set by main(); the process executor of dcp.async_save spawns a process that imports this
# file without running main().
root = ""
rank = n = 0
mesh: Any = None


def full_w() -> torch.Tensor:
    return torch.arange(12 * 6, dtype=torch.float32).reshape(12, 6)


def full_e() -> torch.Tensor:
    return (torch.arange(6 * 9, dtype=torch.int64) - 20).reshape(6, 9).to(torch.bfloat16)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def plain_state(placement: Any) -> dict[str, Any]:
    return {
        "w": distribute_tensor(full_w(), mesh, [placement]),
        "e": distribute_tensor(full_e(), mesh, [placement]),
        "bias": torch.arange(5, dtype=torch.float64),
        "extra": {"step": 7, "name": "run-a"},
    }


def empty_state(placement: Any) -> dict[str, Any]:
    return {
        "w": distribute_tensor(torch.zeros(12, 6), mesh, [placement]),
        "e": distribute_tensor(torch.zeros(6, 9, dtype=torch.bfloat16), mesh, [placement]),
        "bias": torch.zeros(5, dtype=torch.float64),
        "extra": {"step": 0, "name": ""},
    }


def check(st: dict[str, Any]) -> dict[str, Any]:
    w, e = st["w"], st["e"]
    return {
        "w_ok": bool(torch.equal(w.full_tensor(), full_w())),
        "e_ok": bool(torch.equal(e.full_tensor(), full_e())),
        "w_placements": [str(p) for p in w.placements],
        "w_local": list(w.to_local().shape),
        "bias_ok": bool(torch.equal(st["bias"], torch.arange(5, dtype=torch.float64))),
        "extra": st["extra"],
    }


def failure(e: BaseException) -> dict[str, Any]:
    return {"rank": rank, "error": type(e).__name__, "code": getattr(e, "code", None),
            "message": str(e), "trace": traceback.format_exc()}


def run(tag: str, fn: Any) -> None:
    try:
        emit(tag, dict(rank=rank, **fn()))
    except BaseException as e:  # reported (DCP raises CheckpointException, a BaseException)
        emit(tag, failure(e))


def fsdp_state() -> tuple[torch.nn.Module, Any, dict[str, Any]]:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    m = model()
    for layer in (m[0], m[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.Adam(m.parameters(), lr=0.1)
    m(torch.ones(3, 8)).sum().backward()
    opt.step()
    msd, osd = get_state_dict(m, opt)
    return m, opt, {"model": msd, "optim": osd}


class FailingPlanner(DefaultSavePlanner):
    """Rank 1 cannot give its items: it raises inside the storage writer's write_data."""

    def resolve_data(self, write_item: Any) -> Any:
        if rank == 1:
            raise RuntimeError("rank 1 failed to stage its state")
        return super().resolve_data(write_item)


def save() -> None:
    def fsdp() -> dict[str, Any]:
        m, opt, st = fsdp_state()
        dcp.save(st, storage_writer=StorageWriter(os.path.join(root, "fsdp"), timeout=TIMEOUT))
        full = {k: v.full_tensor() for k, v in m.state_dict().items()}
        if rank == 0:
            torch.save(full, os.path.join(root, "fsdp-expected.pt"))
        return {"dtensor": isinstance(st["model"]["0.weight"], DTensor)}

    run("fsdp", fsdp)

    def plain() -> dict[str, Any]:
        w = StorageWriter(os.path.join(root, "plain"), timeout=TIMEOUT)
        dcp.save(plain_state(Shard(0)), storage_writer=w)
        return {"bytes": w.last_stats.bytes}

    run("plain", plain)

    def async_thread() -> dict[str, Any]:
        w = StorageWriter(os.path.join(root, "async-thread"), timeout=TIMEOUT)
        f = dcp.async_save(plain_state(Shard(0)), storage_writer=w,
                           async_checkpointer_type=AsyncCheckpointerType.THREAD)
        f.result(timeout=60)
        return {}

    run("async_thread", async_thread)

    def async_process() -> dict[str, Any]:
        w = StorageWriter(os.path.join(root, "async-process"), timeout=TIMEOUT)
        resp = dcp.async_save(plain_state(Shard(0)), storage_writer=w,
                              async_checkpointer_type=AsyncCheckpointerType.PROCESS)
        fut = getattr(resp, "upload_completion", resp)
        fut.result(timeout=60)
        return {}

    run("async_process", async_process)

    def native() -> dict[str, Any]:
        ckptio.save(plain_state(Shard(0)), os.path.join(root, "native"), comm="torch")
        return {}

    run("native", native)

    def solo() -> dict[str, Any]:
        # One rank saves alone (no_dist) while the job has two: a one-rank save.
        if rank == 0:
            w = StorageWriter(os.path.join(root, "solo"), timeout=TIMEOUT)
            dcp.save({"x": torch.arange(3.0)}, storage_writer=w, no_dist=True)
        return {}

    run("solo", solo)
    dist.barrier()

    def failed() -> dict[str, Any]:
        path = os.path.join(root, "plain")
        other = {"other": distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)]), "step": 8}
        dcp.save(other, storage_writer=StorageWriter(path, timeout=TIMEOUT),
                 planner=FailingPlanner())
        return {}

    run("failed", failed)
    dist.barrier()


def load() -> None:
    for name in ("plain", "async-thread", "async-process", "native"):
        for placement in (Shard(1), Replicate()):
            def one() -> dict[str, Any]:
                st = empty_state(placement)
                dcp.load(st, storage_reader=StorageReader(os.path.join(root, name)))
                return check(st)

            run(f"load-{name}-{placement}", one)

    def fsdp() -> dict[str, Any]:
        m, opt, st = fsdp_state()
        for v in st["model"].values():
            v.to_local().zero_()
        dcp.load(st, storage_reader=StorageReader(os.path.join(root, "fsdp")))
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(m, opt, model_state_dict=st["model"], optim_state_dict=st["optim"])
        expected = torch.load(os.path.join(root, "fsdp-expected.pt"))
        got = {k: v.full_tensor() for k, v in m.state_dict().items()}
        return {"same": all(torch.equal(got[k], expected[k]) for k in expected),
                "keys": sorted(got) == sorted(expected)}

    run("load-fsdp", fsdp)
    dist.barrier()


def main() -> None:
    global root, rank, n, mesh
    mode, root = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, n = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    if mode == "save":
        save()
    else:
        load()
    leave_torch()


if __name__ == "__main__":
    main()
