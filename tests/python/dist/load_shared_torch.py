# SPDX-License-Identifier: Apache-2.0
"""One rank of the shared-read load tests (torch.distributed gloo, CPU; MASTER_ADDR/PORT, RANK
and WORLD_SIZE from the environment, the checkpoint folder from argv): rank 0 saves a state,
then every rank loads all of it with comm= (plain tensors, then Replicate DTensors, then
Shard(0) DTensors, then the same plain load with direct=True), each with the page cache
emptied first and this process's bytes read from storage counted (/proc/self/io); then every
rank loads a copy of the checkpoint with one corrupt byte."""

from __future__ import annotations

import glob
import os
import shutil
import sys
import traceback
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

sys.path.insert(0, os.path.dirname(__file__))
from _report import emit, leave_torch  # noqa: E402

import ckptio  # noqa: E402
from ckptio.ranks import _share  # noqa: E402
from ckptio.ranks._share import storage_read  # noqa: E402

root = sys.argv[1]
dist.init_process_group("gloo")
rank, n = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (n,))
path = os.path.join(root, "ckpt")
bad = os.path.join(root, "bad")
# Sizes in elements (f32): several share-sized tensors and a few small ones.
SIZES = [1 << 18, 3 << 16, 1 << 18, 5, 1 << 17, 1 << 18, 100, 1 << 18]


def state() -> dict[str, torch.Tensor]:
    g = np.random.default_rng(7)
    return {f"t{i}": torch.from_numpy(g.standard_normal(k, dtype=np.float32)) for i, k in enumerate(SIZES)}


def evict(p: str) -> None:
    """Drop the checkpoint's files from the page cache (rank 0), then a barrier."""
    if rank == 0:
        for f in glob.glob(os.path.join(p, "**"), recursive=True):
            if os.path.isfile(f):
                fd = os.open(f, os.O_RDONLY)
                try:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
    dist.barrier()


def local(v: Any) -> torch.Tensor:
    return v.to_local() if isinstance(v, DTensor) else v


def check(tag: str, like: dict[str, Any], **io: Any) -> None:
    want = state()
    try:
        evict(path)
        _share.last = None
        before = storage_read()
        out = ckptio.load(path, like=like, comm=dist.group.WORLD, **io)
        read = storage_read() - before
        st = ckptio.last_load_stats()
        exact = True
        for k, v in want.items():
            got = out[k]
            ref = local(like[k]) if isinstance(like[k], DTensor) else None
            if isinstance(got, DTensor):
                exp = local(distribute_tensor(v, mesh, like[k].placements))
                exact &= got.placements == like[k].placements and torch.equal(local(got), exp)
            else:
                exact &= ref is None and torch.equal(got, v)
        emit(tag, {"rank": rank, "exact": bool(exact), "share": _share.last, "read": read,
                   "direct": bool(st.direct), "bytes": int(st.bytes)})  # fmt: skip
    except Exception as e:
        emit(tag, {"rank": rank, "error": type(e).__name__, "message": str(e),
                   "trace": traceback.format_exc()})  # fmt: skip
    dist.barrier()


if rank == 0:
    ckptio.save(state(), path)
dist.barrier()
zeros = {k: torch.empty_like(v) for k, v in state().items()}
check("plain", zeros)
check("replicate", {k: distribute_tensor(v, mesh, [Replicate()]) for k, v in zeros.items()})
check("shard0", {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in zeros.items() if v.numel() >= n})
check("direct", zeros, direct=True)

# One corrupt byte in the data: every rank reads every byte, so every rank must say so.
if rank == 0:
    shutil.copytree(path, bad)
    files = sorted(f for f in glob.glob(os.path.join(bad, "data", "*")) if os.path.isfile(f))
    big = max(files, key=os.path.getsize)
    with open(big, "r+b") as f:
        f.seek(os.path.getsize(big) * 5 // 8)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x40]))
evict(bad)
try:
    ckptio.load(bad, like=zeros, comm=dist.group.WORLD)
    emit("corrupt", {"rank": rank, "error": None})
except ckptio.CheckpointError as e:
    emit("corrupt", {"rank": rank, "error": type(e).__name__, "message": str(e),
                     "share": _share.last})  # fmt: skip
leave_torch()
