# SPDX-License-Identifier: Apache-2.0
"""The A/B behind lazy-*.json: ckptio.load(mmap=True) before and after the one-chunk shortcut in
ckptio._mapped (before: every tensor's chunk records are listed and sorted), next to
safetensors.load_file, warm page cache (both files dropped and read back the same way, see
lazy_warm.recache), every page touched, rounds rotated, paired ratios.

    .venv/bin/python bench/results/read-20261201/lazy_ab.py --tensors 64 --runs 15 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
import lazy_warm as L  # noqa: E402
import mechanisms as M  # noqa: E402

import ckptio  # noqa: E402
from ckptio import _mapped  # noqa: E402


def before(path: str) -> object:
    """The mapped load as it was: Mapped.view without the manifest's size and chunk count."""
    view = _mapped.Mapped.view
    _mapped.Mapped.view = (  # type: ignore[method-assign]
        lambda self, r, i, code, shape, *_: view(self, r, i, code, shape)
    )
    try:
        return ckptio.load(path, mmap=True)
    finally:
        _mapped.Mapped.view = view  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default="/tmp/ckptio-lazy-ab")
    ap.add_argument("--size", type=int, default=1 << 30)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    state = L.tensors_state(a.size, a.tensors)
    nbytes = M.state_bytes(state)
    ck, st = os.path.join(a.dir, "ck"), os.path.join(a.dir, "st.safetensors")
    ckptio.save(state, ck, overwrite=True)
    import safetensors.torch

    safetensors.torch.save_file(state, st)
    del state
    gc.collect()
    L.recache(ck)
    L.recache(st)
    loads = {
        "safetensors.load_file": (st, lambda: safetensors.torch.load_file(st)),
        "ckptio.load(mmap) after": (ck, lambda: ckptio.load(ck, mmap=True)),
        "ckptio.load(mmap) before": (ck, lambda: before(ck)),
    }
    names = list(loads)
    res: dict[str, list[float]] = {n: [] for n in names}
    ret: dict[str, list[float]] = {n: [] for n in names}  # until the load returns, untouched
    for r in range(a.runs):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            path, load = loads[n]
            L.warm(path)
            t0 = time.perf_counter()
            out = load()
            ret[n].append(time.perf_counter() - t0)
            seen = M.touch(out, False)
            dt = time.perf_counter() - t0
            assert seen == nbytes
            res[n].append(dt)
            del out
            gc.collect()
    ref = res["safetensors.load_file"]
    rows = {}
    print(f"{a.tensors} bf16 tensors, {nbytes / 2**30:.2f} GiB, {a.runs} rounds")
    for n in names:
        # > 1: faster than safetensors.load_file in the same round.
        ratio = statistics.median(y / x for x, y in zip(res[n], ref))
        rows[n] = {"seconds_median": round(statistics.median(res[n]), 5),
                   "of_safetensors_median": round(ratio, 3),
                   "returned_median": round(statistics.median(ret[n]), 6),
                   "seconds": [round(x, 5) for x in res[n]]}  # fmt: skip
        print(f"  {n:26s} {statistics.median(res[n]) * 1e3:8.2f} ms  {ratio:5.2f}x safetensors"
              f"  (returns after {statistics.median(ret[n]) * 1e3:.2f} ms)")  # fmt: skip
    old, new = res["ckptio.load(mmap) before"], res["ckptio.load(mmap) after"]
    b = statistics.median(x / y for x, y in zip(old, new))
    old_r, new_r = ret["ckptio.load(mmap) before"], ret["ckptio.load(mmap) after"]
    c = statistics.median(x / y for x, y in zip(old_r, new_r))
    rows["after_speedup_vs_before"] = round(b, 3)  # type: ignore[assignment]
    rows["after_speedup_vs_before_until_return"] = round(c, 3)  # type: ignore[assignment]
    print(f"  after vs before: {b:.3f}x faster, {c:.3f}x until the load returns (medians)")
    doc = {"command": " ".join(sys.argv), "bytes": nbytes, "tensors": a.tensors, "results": rows}
    doc.update(nproc=os.cpu_count(), loadavg_after=os.getloadavg())
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
