# SPDX-License-Identifier: Apache-2.0
"""What fresh memory costs to fault in, in small (4 KiB) and in transparent huge (2 MiB)
pages: 1 GiB mapped, one byte written per 4 KiB page, unmapped; rounds alternating between
the two, the first of each kind first. On a VM whose balloon reports free memory to the host,
the first huge-page rounds pay for the host backing the memory again.

    .venv/bin/python bench/huge_pages.py --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import mmap
import time

import numpy as np


def fault_in(size: int, huge: bool) -> float:
    m = mmap.mmap(-1, size + (2 << 20), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    a = np.frombuffer(m, dtype=np.uint8)
    start = -a.ctypes.data % (2 << 20)  # 2 MiB aligned, so every piece can be a huge page
    if huge:
        m.madvise(mmap.MADV_HUGEPAGE, start, size)
    t0 = time.perf_counter()
    a[start : start + size : 4096] = 1
    dt = time.perf_counter() - t0
    del a
    m.close()
    return dt


def vmstat(keys: tuple[str, ...]) -> dict[str, int]:
    out = {}
    with open("/proc/vmstat") as f:
        for line in f:
            k, v = line.split()
            if k in keys:
                out[k] = int(v)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", type=int, default=1 << 30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    keys = ("thp_fault_alloc", "thp_fault_fallback", "compact_stall", "pgscan_direct", "allocstall_normal")
    before = vmstat(keys)
    res: dict[str, list[float]] = {"huge": [], "small": []}
    for _ in range(a.rounds):
        for kind in ("huge", "small"):
            res[kind].append(fault_in(a.size, kind == "huge"))
    after = vmstat(keys)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in keys}
    for kind, xs in res.items():
        print(f"{kind:5s} pages: {' '.join(f'{x:.3f}' for x in xs)} s per {a.size / 2**30:g} GiB")
    print("vmstat deltas:", delta)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"bytes": a.size, "seconds": res, "vmstat_delta": delta}, f, indent=1)


if __name__ == "__main__":
    main()
