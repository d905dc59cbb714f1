# SPDX-License-Identifier: Apache-2.0
"""The framework plugins' saves, timed as a training loop sees them: how long each call blocks and when the checkpoint is durable, for Lightning (its TorchCheckpointIO, ckptio's CheckpointIO sync and async) and DeepSpeed (ckptio's CheckpointEngine sync and decoupled), next to the raw device write of the same bytes in the same run.

    python bench/plugins_cell.py --dir /var/tmp/b --size 512M --runs 3 --out bench/results/x

Each cell saves a checkpoint of 16 float32 tensors ``--runs`` times after one untimed save
(the first background save of a process allocates the buffers later ones reuse; its time is
reported apart) and reports medians. The page cache is dropped before every save where the
machine allows it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from common import machine, med, parse_size, raw_measure, version, write_results  # noqa: E402


def _drop_caches() -> None:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
    except OSError:
        pass


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _checkpoint(size: int, step: int) -> dict[str, Any]:
    n = size // 16 // 4
    g = torch.Generator().manual_seed(step)
    return {"state_dict": {f"layer{i}.weight": torch.rand(n, generator=g) for i in range(16)},
            "global_step": step, "epoch": 0}  # fmt: skip


# A cell: (name, save) where save(checkpoint, path) returns (blocked, durable) seconds.
Cell = tuple[str, Callable[[dict[str, Any], str], tuple[float, float]]]


def _lightning_cells() -> list[Cell]:
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    import ckptio.lightning

    def torch_io(ck: dict[str, Any], path: str) -> tuple[float, float]:
        t0 = time.perf_counter()
        TorchCheckpointIO().save_checkpoint(ck, path)
        _fsync(path)  # Lightning's own plugin does not make the file durable
        t = time.perf_counter() - t0
        return t, t

    def ckptio_io(async_save: bool) -> Callable[[dict[str, Any], str], tuple[float, float]]:
        io = ckptio.lightning.CheckpointIO(async_save=async_save)

        def save(ck: dict[str, Any], path: str) -> tuple[float, float]:
            t0 = time.perf_counter()
            io.save_checkpoint(ck, path)
            blocked = time.perf_counter() - t0
            io.teardown()  # waits for the background save
            return blocked, time.perf_counter() - t0

        return save

    return [("lightning TorchCheckpointIO +fsync", torch_io),
            ("lightning ckptio CheckpointIO()", ckptio_io(False)),
            ("lightning ckptio CheckpointIO(async_save=True)", ckptio_io(True))]  # fmt: skip


def _deepspeed_cells() -> list[Cell]:
    try:
        from deepspeed.runtime.checkpoint_engine import CheckpointCommitInfo

        import ckptio.deepspeed
    except ImportError as e:
        print(f"DeepSpeed cells skipped: {e}", file=sys.stderr)
        return []

    def engine(decoupled: bool) -> Callable[[dict[str, Any], str], tuple[float, float]]:
        ce = ckptio.deepspeed.CheckpointEngine(decoupled=decoupled)

        def save(ck: dict[str, Any], path: str) -> tuple[float, float]:
            d = os.path.dirname(path)
            info = CheckpointCommitInfo(tag=os.path.basename(d), save_dir=os.path.dirname(d),
                                        save_latest=True)  # fmt: skip
            t0 = time.perf_counter()
            ce.create(info)
            ce.save(ck, path)
            blocked = time.perf_counter() - t0
            ce.commit(info)  # every file durable, then `latest`
            return blocked, time.perf_counter() - t0

        return save

    return [("deepspeed ckptio CheckpointEngine()", engine(False)),
            ("deepspeed ckptio CheckpointEngine(decoupled=True)", engine(True))]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/var/tmp/ckptio-plugins")
    ap.add_argument("--size", type=parse_size, default=parse_size("512M"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "plugins"))
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    cells = _lightning_cells() + _deepspeed_cells()
    raw = [raw_measure(args.dir, args.size)[0] for _ in range(args.runs)]
    rows = []
    for name, save in cells:
        root = os.path.join(args.dir, "cell")
        shutil.rmtree(root, ignore_errors=True)
        times: list[tuple[float, float]] = []
        for i in range(args.runs + 1):
            d = os.path.join(root, f"step{i}")
            os.makedirs(d, exist_ok=True)
            ck = _checkpoint(args.size, i)
            _drop_caches()
            times.append(save(ck, os.path.join(d, "model.ckpt")))
            del ck
        first, rest = times[0], times[1:]
        blocked, durable = med([t[0] for t in rest]), med([t[1] for t in rest])
        row = {"cell": name, "blocked_s": blocked, "durable_s": durable,
               "gbps": args.size / durable / 1e9, "first_blocked_s": first[0],
               "first_durable_s": first[1], "runs": [list(t) for t in rest]}  # fmt: skip
        rows.append(row)
        print(f"{name:50s} blocks {blocked:6.3f} s  durable {durable:6.3f} s  "
              f"{row['gbps']:5.2f} GB/s  (first: {first[0]:.3f} / {first[1]:.3f} s)", flush=True)
        shutil.rmtree(root, ignore_errors=True)
    raw_gbps = med(raw)
    print(f"{'raw O_DIRECT write (ckptio bench --raw-only)':50s} {raw_gbps:5.2f} GB/s", flush=True)
    doc = {"bench": "plugins", "size": args.size, "runs": args.runs, "raw_write_gbps": raw_gbps,
           "raw_write_runs": raw, "rows": rows, "machine": machine(args.dir),
           "versions": {k: version(k) for k in ("torch", "lightning", "deepspeed", "ckptio")}}  # fmt: skip
    print(write_results(doc, args.out))


if __name__ == "__main__":
    main()
