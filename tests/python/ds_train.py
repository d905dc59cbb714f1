# SPDX-License-Identifier: Apache-2.0
"""A tiny DeepSpeed training job for tests/python/test_deepspeed.py: trains, saves through ckptio.deepspeed, resumes.

Run as one rank of a job (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set by the
test): ``ds_train.py JOBS.json OUT_PREFIX``. JOBS is a list of runs done one after another in
this process, each a dict: ``stage`` (ZeRO stage), ``dir`` (checkpoint directory), ``steps``
(train until this global step), ``save_at`` (steps after which to save), ``resume`` (load the
newest checkpoint first), ``decoupled``, ``kill`` ({"step": s, "after_bytes": n}: SIGKILL this
process once n bytes of the save at step s are written), ``fp32_check`` (compare DeepSpeed's
zero_to_fp32 reading of the checkpoint with the engine's weights), ``universal`` (first convert
the checkpoint ``dir/<universal>`` with DeepSpeed's ds_to_universal, then resume from the
universal checkpoint; ZeRO 1 and 2). Each rank writes
``OUT_PREFIX.<rank>.json``: per job, the losses by step as float.hex (bitwise comparable).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import deepspeed
import deepspeed.comm.torch  # noqa: F401 (patched through sys.modules below)
import torch

import ckptio._core
import ckptio.deepspeed


class _KillingWriter:
    """ckptio's zip writer that SIGKILLs the process once ``after`` bytes went through it (in
    the middle of a record)."""

    def __init__(self, real: Any, after: int) -> None:
        self._real = real
        self._left = after

    def add(self, name: str, data: Any, *args: Any) -> None:
        n = memoryview(data).nbytes
        if n >= self._left:
            self._real.begin(name, n, *args)
            if self._left:
                self._real.append(memoryview(data).cast("B")[: self._left])
            os.kill(os.getpid(), signal.SIGKILL)
        self._left -= n
        self._real.add(name, data, *args)

    def __enter__(self) -> _KillingWriter:
        self._real.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._real.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _arm_kill(tag: str, after: int) -> None:
    real = ckptio._core.ZipWriter

    def writer(path: Any, p: Any = None) -> Any:
        fw = real(path, p)
        return _KillingWriter(fw, after) if f"{os.sep}{tag}{os.sep}" in os.fspath(path) else fw

    ckptio._core.ZipWriter = writer  # type: ignore[misc,assignment]
    real_async = ckptio._core.zip_async

    def zip_async(snap: Any, zw: Any, records: Any) -> Any:
        # A decoupled save of the step: SIGKILL once the engine's thread has started on it.
        if not isinstance(zw, _KillingWriter):
            return real_async(snap, zw, records)
        real_async(snap, zw._real, records)
        os.kill(os.getpid(), signal.SIGKILL)

    ckptio._core.zip_async = zip_async  # type: ignore[assignment]


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)


def _to_universal(save_dir: str, tag: str) -> None:
    """DeepSpeed's converter, as its command line runs it, on ``save_dir/tag``."""
    from deepspeed.checkpoint import ds_to_universal

    src = os.path.join(save_dir, tag)
    argv = sys.argv
    sys.argv = ["ds_to_universal", "--input_folder", src, "--output_folder",
                f"{src}_universal", "--num_extract_workers", "1", "--num_merge_workers", "1",
                "--inject_missing_state"]  # a model's own universal info is the client's part
    try:
        ds_to_universal.main(ds_to_universal.parse_arguments())
    finally:
        sys.argv = argv


def run(job: dict[str, Any], rank: int) -> dict[str, Any]:
    if job.get("universal"):
        _to_universal(job["dir"], job["universal"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 1),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": job["stage"]},
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10**9,
        "checkpoint": {"load_universal": bool(job.get("universal"))},
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=opt, lr_scheduler=sched, config=cfg
    )
    ce = ckptio.deepspeed.install(engine, decoupled=bool(job.get("decoupled")))
    out: dict[str, Any] = {"losses": {}, "loaded": None}
    if job.get("resume"):
        path, client = engine.load_checkpoint(job["dir"])
        out["loaded"] = path
        out["client"] = client.get("marker") if client else None
    kill = job.get("kill")
    while engine.global_steps < job["steps"]:
        step = engine.global_steps + 1
        x, y = _batch(step, rank)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        out["losses"][str(step)] = float(loss.item()).hex()
        if step in job.get("save_at", ()):
            if kill and kill["step"] == step:
                _arm_kill(f"global_step{step}", kill["after_bytes"])
            engine.save_checkpoint(job["dir"], client_state={"marker": step})
    ce.wait()
    if job.get("fp32_check"):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        sd = get_fp32_state_dict_from_zero_checkpoint(job["dir"])
        mine = {k: v.detach().float() for k, v in engine.module.state_dict().items()}
        if job["stage"] == 3:  # partitioned: gathered by DeepSpeed's own helper
            from deepspeed.runtime.zero import GatheredParameters

            with GatheredParameters(list(engine.module.parameters())):
                mine = {k: v.detach().float().clone() for k, v in engine.module.state_dict().items()}
        out["fp32_equal"] = sorted(sd) == sorted(mine) and all(
            torch.equal(sd[k], mine[k]) for k in sd
        )
    engine.destroy()
    return out


def main() -> None:
    # DeepSpeed's CPU backend JIT-builds a shared-memory all-reduce op at init (minutes on a
    # fresh machine, under a lock other processes share); gloo's all-reduce serves these tests,
    # as it does wherever DeepSpeed finds the op incompatible.
    # (deepspeed.comm.torch, as an attribute, is the torch package: the module is taken by name.)
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # type: ignore[attr-defined]
    jobs = json.load(open(sys.argv[1]))
    rank = int(os.environ["RANK"])
    results = [run(job, rank) for job in jobs]
    with open(f"{sys.argv[2]}.{rank}.json", "w") as f:
        json.dump(results, f)
    # Leave together, the process group torn down: a rank that exits while gloo's threads still
    # serve the other's last collective can die in std::terminate at interpreter exit (seen
    # once in a full run on a loaded machine: "terminate called without an active exception").
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
