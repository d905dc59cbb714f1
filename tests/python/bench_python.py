# SPDX-License-Identifier: Apache-2.0
"""Benchmark of the Python layer against the C path (`ckptio bench`), in one run; not a test.

    .venv/bin/python tests/python/bench_python.py [--dir D] [--size 2G] [--runs 3] [--tiny 100000]

Rounds alternate `ckptio bench --runs 1` (the C path: its synthetic training state, bf16
weights and f32 Adam moments) with ckptio.save / ckptio.load of the same tensors (loaded from
the bench's kept checkpoint as numpy arrays), so both see the same disk weather. Saves are
durable; loads start from a cold page cache; each Python figure is timed from the call to its
return, and the Python layer's own share of that time (wall time minus the library's
open-to-commit / open-to-last-read time) is printed too. Then: peak memory of a load in a fresh
process, 100,000 tiny arrays against the C figure, and ckptio.torch.save/load against
torch.save (+fsync) and torch.load on the same state as torch tensors.
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

    # Rounds alternate the C bench and the Python layer, so both see the same disk weather.
    c_saves, c_loads, saves, loads, raw_w, raw_r = [], [], [], [], [], []
    shares: list[tuple[float, float]] = []
    state: dict[str, np.ndarray] | None = None
    nbytes = 0
    path = os.path.join(a.dir, "py")
    for rnd in range(a.runs):
        cb = c_bench(cmd, os.path.join(a.dir, "c"), a.size, 1, 0)
        c_saves.append(cb["save_gbps"])
        c_loads.append(cb["load_gbps"])
        raw_w.append(cb["raw_write_gbps"])
        raw_r.append(cb["raw_read_gbps"])
        if state is None:
            cdir = os.path.join(a.dir, "c")
            kept = [p for p in os.listdir(cdir) if os.path.isfile(os.path.join(cdir, p, "manifest"))]
            state = ckptio.load(os.path.join(cdir, sorted(kept)[0]))  # the C bench's tensors
            nbytes = sum(v.nbytes for v in state.values())
            print(f"state: {len(state)} tensors, {nbytes / 1e9:.2f} GB (the C bench's own)")
        shutil.rmtree(path, ignore_errors=True)
        st = ckptio.save(state, path)
        saves.append(st.gbps)
        evict(path)
        t = time.perf_counter()
        out = ckptio.load(path)
        loads.append(nbytes / (time.perf_counter() - t) / 1e9)
        ls = ckptio.last_load_stats()
        assert ls is not None
        # The Python layer's own share of the wall time (the rest is the C library's calls).
        shares.append((1 - st.io_seconds / st.seconds, 1 - ls.io_seconds / ls.seconds))
        del out
        print(f"round {rnd + 1}: raw write {raw_w[-1]:.2f} read {raw_r[-1]:.2f} | C save "
              f"{c_saves[-1]:.2f} load {c_loads[-1]:.2f} | Python save {saves[-1]:.2f} load "
              f"{loads[-1]:.2f} GB/s; Python's share of the wall time: save "
              f"{shares[-1][0]:.2%}, load {shares[-1][1]:.2%}", flush=True)
    print(f"median GB/s: C save {median(c_saves):.2f} load {median(c_loads):.2f}; Python save "
          f"{median(saves):.2f} load {median(loads):.2f}")
    print(f"Python / C (medians): save {median(saves) / median(c_saves):.3f}, load "
          f"{median(loads) / median(c_loads):.3f}; per round: save "
          f"{[round(p / c, 3) for p, c in zip(saves, c_saves)]}, load "
          f"{[round(p / c, 3) for p, c in zip(loads, c_loads)]}")
    assert state is not None

    # Peak memory of a load in a fresh process: one copy of each tensor, no staging copies.
    evict(path)
    # VmHWM, not ru_maxrss: the latter carries the parent's peak across exec.
    probe = (
        "import ckptio, sys\n"
        "def hwm():\n"
        "    s = open('/proc/self/status').read()\n"
        "    return int(s.split('VmHWM:')[1].split()[0]) * 1024\n"
        "base = hwm()\n"
        "out = ckptio.load(sys.argv[1])\n"
        "print(base, hwm(), sum(v.nbytes for v in out.values()))\n"
    )
    base, peak, held = map(int, subprocess.check_output([sys.executable, "-c", probe, path]).split())
    print(f"  load peak RSS growth {(peak - base) / 1e9:.3f} GB for {held / 1e9:.3f} GB of tensors "
          f"(ratio {(peak - base) / held:.3f})")

    # Tiny tensors: the C figure is 100,000 f32 tensors of 1..64 elements.
    cb = c_bench(cmd, os.path.join(a.dir, "c"), "16M", 1, a.tiny)
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
