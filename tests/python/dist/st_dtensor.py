# SPDX-License-Identifier: Apache-2.0
"""One rank of the safetensors DTensor test (gloo, CPU): load a safetensors file (argv[1]) with
like= DTensors, Shard(0) and Replicate on a 1-D mesh of all ranks, and report whether each
rank's local part equals that part of the file's tensor, and how many bytes it read."""

from __future__ import annotations

import os
import sys
import traceback

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

sys.path.insert(0, os.path.dirname(__file__))
from _report import emit, leave_torch  # noqa: E402

import ckptio  # noqa: E402
import ckptio.safetensors as cst  # noqa: E402

path = sys.argv[1]
dist.init_process_group("gloo")
rank, n = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (n,))
try:
    full = cst.load_file(path)
    like = {
        "w": distribute_tensor(torch.zeros(full["w"].shape, dtype=torch.float32), mesh, [Shard(0)]),
        "b": distribute_tensor(torch.zeros(full["b"].shape, dtype=torch.bfloat16), mesh, [Replicate()]),
    }
    got = ckptio.load(path, like=like)
    st = ckptio.last_load_stats()
    w, b = got["w"], got["b"]
    rows = full["w"].shape[0] // n
    emit("st", {
        "rank": rank,
        "dtensor": isinstance(w, DTensor) and isinstance(b, DTensor),
        "w_ok": bool(torch.equal(w.to_local(), full["w"][rank * rows:(rank + 1) * rows].float())),
        "b_ok": bool(torch.equal(b.to_local(), full["b"].to(torch.bfloat16))),
        "placements": [str(w.placements[0]), str(b.placements[0])],
        "bytes": st.bytes if st else -1,
        "want_bytes": rows * full["w"].shape[1] * full["w"].element_size() + full["b"].numel() * full["b"].element_size(),
    })  # fmt: skip
except Exception as e:  # reported, then judged by the test
    emit("st", {"rank": rank, "error": type(e).__name__, "message": str(e),
                "trace": traceback.format_exc()})  # fmt: skip
leave_torch()
