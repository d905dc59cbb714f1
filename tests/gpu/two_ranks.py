# SPDX-License-Identifier: Apache-2.0
"""One rank of the bench's two-rank phase (tests/gpu/bench.py starts two; RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT come from the environment; torch.distributed over gloo).

Each rank puts its rows of a bf16 matrix of about --bytes (blocks of rows, each made by a
generator seeded with its block number, so any box can be rebuilt anywhere) on its device
(cuda:{rank % device_count}: one GPU shared by both ranks, or one each), wraps them in
ckptio.Shard, and saves them with a replicated f32 tensor with ckptio.save(comm="torch") from
device memory, --runs times. Then every rank loads the checkpoint resharded (its column half,
through a like= DTensor Shard(1) on a mesh of the ranks' devices: read straight into device
memory) and rank 0 loads the whole matrix in one piece; each checks every byte against the
generated values. Writes its figures as JSON (--out); exit status 1 on any failure or
difference. --device cpu does the same with CPU tensors.

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
        python3 tests/gpu/two_ranks.py --dir D --bytes 1G --out rank0.json &
    RANK=1 ... python3 tests/gpu/two_ranks.py --dir D --bytes 1G --out rank1.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from typing import Any

import ckptio
import torch
import torch.distributed as dist

from bench import (  # this script's folder is on sys.path
    _drop_caches,
    median,
    parse_size,
)

COLS = 4096
BLOCK_ROWS = 256


class Matrix:
    """The global bf16 matrix, rows in blocks of BLOCK_ROWS, block b from a generator seeded
    with 1000 + b on ``dev``; and the replicated f32 tensor (seed 7)."""

    def __init__(self, nbytes: int, n: int, dev: torch.device) -> None:
        per_block = BLOCK_ROWS * COLS * 2
        self.blocks = max(n, nbytes // per_block // n * n)  # whole blocks per rank
        self.rows = self.blocks * BLOCK_ROWS
        self.shape = (self.rows, COLS)
        self.dev = dev

    def block(self, b: int) -> torch.Tensor:
        g = torch.Generator(device=self.dev).manual_seed(1000 + b)
        return torch.randn(BLOCK_ROWS, COLS, generator=g, device=self.dev).to(torch.bfloat16)

    def rows_of(self, rank: int, n: int) -> tuple[int, int]:
        per = self.blocks // n * BLOCK_ROWS
        return rank * per, (rank + 1) * per

    def make(self, r0: int, r1: int) -> torch.Tensor:
        return torch.cat([self.block(b) for b in range(r0 // BLOCK_ROWS, r1 // BLOCK_ROWS)])

    def replicated(self) -> torch.Tensor:
        g = torch.Generator(device=self.dev).manual_seed(7)
        return torch.randn(1 << 20, generator=g, device=self.dev)

    def box_equal(self, got: torch.Tensor, r0: int, r1: int, c0: int, c1: int) -> bool:
        """``got`` is the box rows r0:r1, columns c0:c1, on this rank's device, bit for bit."""
        if tuple(got.shape) != (r1 - r0, c1 - c0) or got.dtype != torch.bfloat16:
            return False
        if got.device != self.dev:
            return False
        for b in range(r0 // BLOCK_ROWS, -(-r1 // BLOCK_ROWS)):
            lo, hi = max(r0, b * BLOCK_ROWS), min(r1, (b + 1) * BLOCK_ROWS)
            want = self.block(b)[lo - b * BLOCK_ROWS : hi - b * BLOCK_ROWS, c0:c1]
            if not torch.equal(got[lo - r0 : hi - r0], want):
                return False
        return True


def run(args: argparse.Namespace, res: dict[str, Any], rank: int, n: int) -> None:
    cuda = args.device == "cuda"
    if cuda:
        dev = torch.device(f"cuda:{rank % torch.cuda.device_count()}")
        torch.cuda.set_device(dev)  # before the DeviceMesh, which would pick one itself
    else:
        dev = torch.device("cpu")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    def settle() -> None:
        """Page cache emptied (rank 0, root only), then every rank lines up."""
        if rank == 0:
            res["cache_dropped"] = _drop_caches()
        dist.barrier()

    m = Matrix(args.bytes, n, dev)
    r0, r1 = m.rows_of(rank, n)
    local = m.make(r0, r1)
    rep = m.replicated()
    sync()
    res.update(device=str(dev), global_shape=list(m.shape), dtype="bfloat16",
               rows=[r0, r1], local_bytes=local.numel() * 2,
               global_bytes=m.rows * COLS * 2, replicated_bytes=rep.numel() * 4)  # fmt: skip
    tree = {"w": ckptio.Shard(local, (r0, 0), m.shape), "rep": rep, "step": 7}
    path = os.path.join(args.dir, "ckpt")
    save_s: list[float] = []
    for _ in range(args.runs):
        settle()
        t0 = time.perf_counter()
        st = ckptio.save(tree, path, comm="torch", overwrite=True, timeout=120)
        sync()
        save_s.append(time.perf_counter() - t0)
        res["save_gpu"] = st.gpu
        res["save_stats"] = {"bytes": st.bytes, "io_bytes": st.io_bytes, "gbps": st.gbps,
                             "backend": st.backend, "direct": st.direct}  # fmt: skip
    res["save_s_runs"] = [round(s, 4) for s in save_s]
    res["save_gbps"] = round(res["local_bytes"] / median(save_s) / 1e9, 4)
    res["save_gbps_note"] = "this rank's rows / seconds of the collective save"
    del tree, local
    reshard(args, res, m, rank, n, rep, path, settle, sync)
    dist.barrier()
    if rank == 0:
        whole(args, res, m, path, sync)
    dist.barrier()
    checks = [res.get("reshard_equal"), res.get("rep_equal")]
    if rank == 0:
        checks.append(res.get("whole_equal"))
    res["equal"] = all(x is True for x in checks)
    if cuda:  # every load of device memory went through ckptio's GPU path (staged or GDS)
        into = [res.get("reshard_into_device")] + ([res.get("whole_into_device")] if rank == 0
                                                   else [])  # fmt: skip
        res["straight_into_gpu"] = all(x is True for x in into)
        # a distributed save's Stats.gpu: "device (...)" when handed over by device pointer
        res["saved_from_device"] = str(res.get("save_gpu", "")).startswith("device")


def device_path(gpu: str) -> bool:
    """Stats.gpu says ckptio's GPU path moved the bytes (not a host copy)."""
    return gpu.startswith(("staged", "gds"))


def reshard(args: argparse.Namespace, res: dict[str, Any], m: Matrix, rank: int, n: int,
            rep: torch.Tensor, path: str, settle: Any, sync: Any) -> None:  # fmt: skip
    """Every rank loads its column half straight into device memory (a like= DTensor with
    Shard(1) on a mesh of the ranks' devices), --runs times; equal on every run. Should that
    fail, the error is kept and the half is read with Reader.read (through host memory), so
    that the resharded values are still checked."""
    cw = COLS // n
    c0, c1 = rank * cw, (rank + 1) * cw
    load_s: list[float] = []
    checks: list[bool] = []
    rep_checks: list[bool] = []
    gpu: list[str] = []
    cuda = m.dev.type == "cuda"
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor import Shard as TShard

        mesh = init_device_mesh(m.dev.type, (n,))
        like_w = DTensor.from_local(
            torch.empty(m.rows, cw, dtype=torch.bfloat16, device=m.dev), mesh, [TShard(1)],
            run_check=False, shape=torch.Size(m.shape), stride=(COLS, 1),
        )  # fmt: skip
        like = {"w": like_w, "rep": torch.empty_like(rep)}
        for _ in range(args.runs):
            settle()
            t0 = time.perf_counter()
            out = ckptio.load(path, like=like, comm="torch")
            sync()
            load_s.append(time.perf_counter() - t0)
            st = ckptio.last_load_stats()
            gpu.append(st.gpu if st else "")
            w = out["w"]
            checks.append(isinstance(w, DTensor) and m.box_equal(w.to_local(), 0, m.rows, c0, c1))
            rep_checks.append(bool(torch.equal(out["rep"], rep)))
            del out, w
        via = "like= DTensor Shard(1) on a mesh of " + (
            "GPUs: read straight into device memory" if cuda else "CPUs")
    except Exception as e:  # noqa: BLE001 - kept in the result; the values are still checked
        res["reshard_dtensor_error"] = f"{type(e).__name__}: {e}"
        res["reshard_dtensor_trace"] = traceback.format_exc()[-2000:]
        load_s, checks, rep_checks, gpu = [], [], [], []
        for _ in range(args.runs):  # no barrier here: the other rank may not have failed
            t0 = time.perf_counter()
            with ckptio.open(path) as r:
                got = r.read("w", (slice(None), slice(c0, c1)), framework="torch").to(m.dev)
                rep_got = r.read("rep", framework="torch").to(m.dev)
            sync()
            load_s.append(time.perf_counter() - t0)
            gpu.append("host copy (Reader.read, then .to(device))")
            checks.append(m.box_equal(got, 0, m.rows, c0, c1))
            rep_checks.append(bool(torch.equal(rep_got, rep)))
            del got, rep_got
        via = "Reader.read of the box, then .to(device): the like= DTensor load failed"
    nbytes = m.rows * cw * 2 + rep.numel() * 4
    res.update(reshard_box={"rows": [0, m.rows], "cols": [c0, c1]}, reshard_via=via,
               reshard_load_s_runs=[round(s, 4) for s in load_s],
               reshard_load_gbps=round(nbytes / median(load_s) / 1e9, 4),
               reshard_load_gpu=gpu[0] if gpu else "", reshard_equal_runs=checks,
               reshard_equal=all(checks), rep_equal=all(rep_checks),
               reshard_into_device=all(device_path(g) for g in gpu) if cuda else None)  # fmt: skip


def whole(args: argparse.Namespace, res: dict[str, Any], m: Matrix, path: str, sync: Any) -> None:
    """Rank 0 loads the whole matrix in one piece into device memory (like= a plain tensor)."""
    _drop_caches()
    like = {"w": torch.empty(m.shape, dtype=torch.bfloat16, device=m.dev)}
    t0 = time.perf_counter()
    out = ckptio.load(path, like=like)
    sync()
    dt = time.perf_counter() - t0
    st = ckptio.last_load_stats()
    res.update(whole_load_gbps=round(m.rows * COLS * 2 / dt / 1e9, 4),
               whole_load_gpu=st.gpu if st else "",
               whole_into_device=device_path(st.gpu if st else "") if m.dev.type == "cuda" else None,
               whole_equal=m.box_equal(out["w"], 0, m.rows, 0, COLS))  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--bytes", type=parse_size, default=1 << 30)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    args.runs = max(args.runs, 1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, n = dist.get_rank(), dist.get_world_size()
    res: dict[str, Any] = {"rank": rank, "world_size": n}
    t0 = time.perf_counter()
    try:
        run(args, res, rank, n)
    except Exception as e:  # noqa: BLE001 - reported in the JSON, the exit status says so
        res["error"] = f"{type(e).__name__}: {e}"
        res["trace"] = traceback.format_exc()[-3000:]
        traceback.print_exc()
    res["seconds"] = round(time.perf_counter() - t0, 2)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    try:
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - the result is written; leaving is best effort
        print(f"two_ranks: destroy_process_group: {e}", file=sys.stderr)
    return 1 if "error" in res or res.get("equal") is not True else 0


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's finalization: gloo's threads can still hold work whose
    # destruction at exit dies in std::terminate (seen in CI after a rank had written all its
    # results), which would turn a correct result into a failed exit status here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
