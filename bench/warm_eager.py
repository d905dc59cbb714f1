# SPDX-License-Identifier: Apache-2.0
"""Where a warm eager load's seconds go: 1 GiB bf16, files resident in the page cache before
each load, every page of the result touched; torch.load next to ckptio.load with checksums on and
off, one and N verify threads, and load(into=) (no fresh memory). Median of --runs by wall time,
with the process's user and system CPU seconds. JSON to --out.

    .venv/bin/python bench/warm_eager.py --dir /var/tmp/ckptio-warm --out bench/results/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import time
from typing import Any, Callable

import torch

import ckptio


def _resident(path: str) -> None:
    files = [path] if os.path.isfile(path) else [
        os.path.join(r, f) for r, _d, fs in os.walk(path) for f in fs]
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass


def _touch(t: torch.Tensor) -> int:
    return int(t.view(torch.uint8)[::4096].sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/var/tmp/ckptio-warm-eager")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    ck, tp = os.path.join(a.dir, "ck"), os.path.join(a.dir, "t.pt")
    x = torch.empty(1 << 29, dtype=torch.bfloat16).normal_()
    nbytes = x.numel() * x.element_size()
    ckptio.save({"x": x}, ck, overwrite=True)
    torch.save({"x": x}, tp)
    into = {"x": torch.empty_like(x)}
    cases: list[tuple[str, str, Callable[[], Any]]] = [
        ("torch.load", tp, lambda: torch.load(tp, weights_only=True)),
        ("ckptio.load", ck, lambda: ckptio.load(ck)),
        ("ckptio.load checksums=False", ck, lambda: ckptio.load(ck, checksums=False)),
        ("ckptio.load verify_threads=1", ck, lambda: ckptio.load(ck, verify_threads=1)),
        ("ckptio.load(into=)", ck, lambda: ckptio.load(ck, into=into)),
        ("ckptio.load(into=) checksums=False", ck, lambda: ckptio.load(ck, into=into, checksums=False)),
    ]  # fmt: skip
    rows = []
    for name, path, fn in cases:
        runs = []
        for _ in range(a.runs):
            _resident(path)
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            out = fn()
            _touch(out["x"])
            t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            st = ckptio.last_load_stats() if name.startswith("ckptio") else None
            runs.append({"seconds": t1 - t0, "user": r1.ru_utime - r0.ru_utime,
                         "sys": r1.ru_stime - r0.ru_stime,
                         "cache_bytes": st.cache_bytes if st else None})  # fmt: skip
            del out
        med = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
        rows.append({"load": name, "gbps": nbytes / med["seconds"] / 1e9, **med, "runs": runs})
        print(f"{name:36s} {rows[-1]['gbps']:6.2f} GB/s  user {med['user']:.3f} s  sys {med['sys']:.3f} s")
    shutil.rmtree(a.dir, ignore_errors=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"bytes": nbytes, "load_average": os.getloadavg(), "rows": rows,
                       "command": "bench/warm_eager.py " + " ".join(f"--{k} {v}" for k, v in vars(a).items())},
                      f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
