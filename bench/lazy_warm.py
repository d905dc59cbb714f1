# SPDX-License-Identifier: Apache-2.0
"""Mapped loads from a warm page cache, every page touched: ckptio.load(mmap=True) next to
torch.load(mmap=True) and safetensors.load_file (and the eager ckptio.load), rounds rotated.

    .venv/bin/python bench/lazy_warm.py --dir /tmp/b --size 1G --runs 5 --json out.json
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

sys.path.insert(0, os.path.dirname(__file__))
import mechanisms as M  # noqa: E402
from common import parse_size  # noqa: E402


def warm(path: str) -> None:
    """Read every file of ``path`` once through the page cache."""
    for p in M._files_and_dirs(path)[0]:
        with open(p, "rb", buffering=0) as f:
            while f.read(16 << 20):
                pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default="/tmp/ckptio-lazy-warm")
    ap.add_argument("--size", type=parse_size, default=parse_size("1G"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    ctx = M.Ctx(M.tensor_state(a.size))
    nbytes = M.state_bytes(ctx.state)
    loads = {
        "torch.load(mmap)": ("torch", M.MECHANISMS["torch"].loads["torch.load(mmap)"]),
        "safetensors.load_file": ("safetensors", M.MECHANISMS["safetensors"].loads["safetensors.load_file"]),
        "ckptio.load(mmap)": ("ckptio", M.MECHANISMS["ckptio"].loads["ckptio.load(mmap)"]),
        "ckptio.load": ("ckptio", M.MECHANISMS["ckptio"].loads["ckptio.load"]),
    }  # fmt: skip
    paths = {}
    for mech in {m for m, _ in loads.values()}:
        m = M.MECHANISMS[mech]
        paths[mech] = os.path.join(a.dir, mech) + (".file" if m.target == "file" else "")
        M.remove(paths[mech])
        m.save(ctx, paths[mech])
    del ctx
    gc.collect()
    names = list(loads)
    res: dict[str, list[float]] = {n: [] for n in names}
    for r in range(a.runs):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            mech, load = loads[n]
            warm(paths[mech])
            t0 = time.perf_counter()
            out = load(None, paths[mech])  # type: ignore[arg-type]
            seen = M.touch(out, False)
            dt = time.perf_counter() - t0
            assert seen == nbytes, (n, seen, nbytes)
            res[n].append(nbytes / dt / 1e9)
            del out
            gc.collect()
    print(f"{nbytes / 2**30:.2f} GiB bf16 tensor, warm page cache, every page touched, "
          f"{a.runs} rounds (medians)")  # fmt: skip
    rows = {}
    for n in names:
        med = statistics.median(res[n])
        rows[n] = {"gbps": round(med, 3), "runs": [round(x, 3) for x in res[n]]}
        print(f"  {n:24s} {med:7.2f} GB/s   {[round(x, 2) for x in res[n]]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "bytes": nbytes, "results": rows,
                       "nproc": os.cpu_count(), "loadavg_after": os.getloadavg()}, f, indent=1)  # fmt: skip
    for p in paths.values():
        M.remove(p)
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
