# SPDX-License-Identifier: Apache-2.0
"""Benchmark of the Python layer against the C path (`ckptio bench`), in one run; not a test.

    .venv/bin/python tests/python/bench_python.py [--dir D] [--size 2G] [--runs 3] [--tiny 100000]

1. `ckptio bench --keep` saves and loads its synthetic training state (bf16 weights, f32 Adam
   moments) and reports the C path's GB/s; 2. the same state, loaded as numpy arrays, is saved
   and loaded through ckptio.save / ckptio.load (timed from the call to its return, saves
   durable, loads from a cold page cache); 3. peak memory of a load in a fresh process;
   4. 100,000 tiny arrays through Python against the C figure; 5. ckptio.torch.save/load
   against torch.save (+fsync) and torch.load on the same state as torch tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

import ckptio


def evict(path: str) -> None:
    """Drop a checkpoint's pages from the page cache (cold-cache loads)."""
    for root, _dirs, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    if os.path.isfile(path):
        evict_file(path)


def evict_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def ckptio_cmd() -> str:
    for c in (os.path.join(sys.prefix, "bin", "ckptio"), "build-py/tools/ckptio", "build/tools/ckptio"):
        if os.access(c, os.X_OK):
            return c
    found = shutil.which("ckptio")
    if not found:
        raise SystemExit("no ckptio command: run make first")
    return found


def c_bench(cmd: str, d: str, size: str, runs: int, tiny: int) -> dict[str, Any]:
    out = subprocess.run(
        [cmd, "bench", "--dir", d, "--size", size, "--runs", str(runs), "--json", "--keep",
         "--tiny", str(tiny)],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return json.loads(out[out.index("{") :])


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="ckptio-pybench")
    ap.add_argument("--size", default="2G")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tiny", type=int, default=100000)
    ap.add_argument("--no-torch", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    cmd = ckptio_cmd()

    print(f"C path: {cmd} bench --size {a.size} --runs {a.runs} --tiny {a.tiny}", flush=True)
    cb = c_bench(cmd, os.path.join(a.dir, "c"), a.size, a.runs, a.tiny)
    c_save, c_load = cb["save_gbps"], cb["load_gbps"]
    print(f"  raw write {cb['raw_write_gbps']:.2f} GB/s, raw read {cb['raw_read_gbps']:.2f} GB/s")
    print(f"  ckptio save {c_save:.2f} GB/s  load {c_load:.2f} GB/s  (runs: save "
          f"{cb['save_gbps_runs']}, load {cb['load_gbps_runs']})")
    print(f"  tiny: save {cb['tiny_save_seconds']:.3f} s, load {cb['tiny_load_seconds']:.3f} s")

    kept = [p for p in os.listdir(os.path.join(a.dir, "c")) if os.path.isfile(os.path.join(a.dir, "c", p, "manifest"))]
    src = os.path.join(a.dir, "c", sorted(kept)[0])
    state = ckptio.load(src)  # the same tensors the C bench wrote, as numpy arrays
    nbytes = sum(v.nbytes for v in state.values())
    print(f"Python: {len(state)} tensors, {nbytes / 1e9:.2f} GB (from {src})", flush=True)

    path = os.path.join(a.dir, "py")
    saves, loads = [], []
    for _ in range(a.runs):
        shutil.rmtree(path, ignore_errors=True)
        st = ckptio.save(state, path)
        saves.append(st.gbps)
        evict(path)
        t = time.perf_counter()
        out = ckptio.load(path)
        loads.append(nbytes / (time.perf_counter() - t) / 1e9)
        del out
    print(f"  ckptio.save {median(saves):.2f} GB/s  ckptio.load {median(loads):.2f} GB/s  "
          f"(runs: save {[round(x, 3) for x in saves]}, load {[round(x, 3) for x in loads]})")
    print(f"  Python / C: save {median(saves) / c_save:.3f}, load {median(loads) / c_load:.3f}")

    # Peak memory of a load in a fresh process: one copy of each tensor, no staging copies.
    evict(path)
    probe = (
        "import resource, ckptio, sys\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "out = ckptio.load(sys.argv[1])\n"
        "peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(base * 1024, peak * 1024, sum(v.nbytes for v in out.values()))\n"
    )
    base, peak, held = map(int, subprocess.check_output([sys.executable, "-c", probe, path]).split())
    print(f"  load peak RSS growth {(peak - base) / 1e9:.3f} GB for {held / 1e9:.3f} GB of tensors "
          f"(ratio {(peak - base) / held:.3f})")

    # Tiny tensors: the C figure is 100,000 f32 tensors of 1..64 elements.
    rng = np.random.default_rng(0)
    tiny = {f"tiny.{i:06d}": rng.standard_normal(1 + (i * 7919) % 64).astype(np.float32) for i in range(a.tiny)}
    tpath = os.path.join(a.dir, "tiny")
    ts, tl = [], []
    for _ in range(a.runs):
        shutil.rmtree(tpath, ignore_errors=True)
        t = time.perf_counter()
        ckptio.save(tiny, tpath)
        ts.append(time.perf_counter() - t)
        evict(tpath)
        t = time.perf_counter()
        ckptio.load(tpath)
        tl.append(time.perf_counter() - t)
    print(f"  tiny ({a.tiny}): ckptio.save {median(ts):.3f} s ({median(ts) / cb['tiny_save_seconds']:.2f}x C), "
          f"ckptio.load {median(tl):.3f} s ({median(tl) / cb['tiny_load_seconds']:.2f}x C)")

    if not a.no_torch:
        torch_bench(state, nbytes, a.dir, a.runs)
    shutil.rmtree(a.dir, ignore_errors=True)


def torch_bench(state: dict[str, np.ndarray], nbytes: int, d: str, runs: int) -> None:
    import torch

    import ckptio.torch

    def to_torch(v: np.ndarray) -> torch.Tensor:
        if v.dtype.name == "bfloat16":
            return torch.from_numpy(v.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(v)

    tstate = {k: to_torch(v) for k, v in state.items()}
    a, b = os.path.join(d, "ckptio.pt"), os.path.join(d, "torch.pt")
    rows: dict[str, list[float]] = {k: [] for k in ("ckptio.torch.save", "torch.save+fsync", "ckptio.torch.load", "torch.load", "torch.load(mmap)+touch")}
    for _ in range(runs):
        for p in (a, b):
            if os.path.exists(p):
                os.remove(p)
        t = time.perf_counter()
        ckptio.torch.save(tstate, a)
        rows["ckptio.torch.save"].append(time.perf_counter() - t)
        t = time.perf_counter()
        with open(b, "wb") as f:
            torch.save(tstate, f)
            f.flush()
            os.fsync(f.fileno())
        rows["torch.save+fsync"].append(time.perf_counter() - t)
        for name, fn in (
            ("ckptio.torch.load", lambda: ckptio.torch.load(a)),
            ("torch.load", lambda: torch.load(a, weights_only=True)),
            ("torch.load(mmap)+touch", lambda: {k: v.sum() for k, v in torch.load(a, mmap=True, weights_only=True).items()}),
        ):
            evict_file(a)
            t = time.perf_counter()
            out = fn()
            rows[name].append(time.perf_counter() - t)
            del out
    for name, xs in rows.items():
        print(f"  {name:24s} {nbytes / median(xs) / 1e9:6.2f} GB/s  (median of {[round(x, 2) for x in xs]} s)")


if __name__ == "__main__":
    main()
