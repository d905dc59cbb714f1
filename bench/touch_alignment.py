# SPDX-License-Identifier: Apache-2.0
"""Why the benchmarks touch "one byte of every page" along a diagonal: the time to read one
byte in each 4 KiB page of 1 GiB of resident memory, with the byte at one fixed offset into
every page (0, 0x40, 0x240, 0x800, 0xfc0) and along the diagonal bench/mechanisms.touch uses
(the k-th page of every 64 at 64 * k). Memory already mapped and faulted in, so nothing but
the reads is timed.

    .venv/bin/python bench/touch_alignment.py --runs 9 --json out.json
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from mechanisms import _touch_pages  # noqa: E402

OFFSETS = (0x0, 0x40, 0x240, 0x800, 0xFC0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", type=int, default=1 << 30)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    m = mmap.mmap(-1, a.size)  # page-aligned, as a mapped tensor or an O_DIRECT buffer is
    buf = np.frombuffer(m, dtype=np.uint8)
    buf[::4096] = 1  # fault every page in first
    ways = {f"{o:#x}": (lambda o=o: int(buf[o::4096].sum())) for o in OFFSETS}
    ways["diagonal"] = lambda: _touch_pages(buf)
    ms: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(a.runs):
        for k, f in ways.items():
            t0 = time.perf_counter()
            f()
            ms[k].append((time.perf_counter() - t0) * 1e3)
    med = {k: statistics.median(v) for k, v in ms.items()}
    print(f"one byte per 4 KiB page of {a.size / 2**30:g} GiB resident memory, median of {a.runs}:")
    for k, v in med.items():
        print(f"  {k:>9}  {v:6.2f} ms   {a.size / v / 1e6:6.1f} GB/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"bytes": a.size, "runs": a.runs, "median_ms": med, "ms": ms}, f, indent=1)
    del buf
    m.close()


if __name__ == "__main__":
    main()
