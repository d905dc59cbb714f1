# SPDX-License-Identifier: Apache-2.0
"""Mapped loads from a warm page cache, every page touched: ckptio.load(mmap=True) next to
torch.load(mmap=True) and safetensors.load_file (and the eager ckptio.load), rounds rotated.

    .venv/bin/python bench/lazy_warm.py --dir /tmp/b --size 1G --runs 5 --json out.json
    .venv/bin/python bench/lazy_warm.py --tensors 64 --size 1G   (64 bf16 tensors of 16 MiB)

``--tensors N`` splits --size into N bf16 tensors of equal size; ``--loads`` picks which of the
loads run (comma-separated names as printed).
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


def recache(path: str) -> None:
    """Drop ``path``'s files from the page cache, then warm them: every loader then maps pages
    that came in the same way. Left as the save put them, a file written through the cache
    (safetensors) sits in 2 MiB folios, mapped a PMD per fault, while one written with O_DIRECT
    (ckptio) comes back through readahead in small folios, 16 pages per fault: touching 1 GiB
    then takes 5-7 ms against 45-50 ms on this machine, whatever the loader does."""
    M.evict(path)
    warm(path)


def tensors_state(nbytes: int, n: int) -> M.State:
    """``n`` bf16 tensors of nbytes / n each (rows of 4096 elements), or M.tensor_state."""
    if n <= 1:
        return M.tensor_state(nbytes)
    one = M.tensor_state(nbytes // n)["tensor"]
    return {f"t{i:04d}": one.clone() for i in range(n)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default="/tmp/ckptio-lazy-warm")
    ap.add_argument("--size", type=parse_size, default=parse_size("1G"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--tensors", type=int, default=1, help="split --size into this many tensors")
    ap.add_argument("--loads", default=None, help="comma-separated load names to run (default all)")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    ctx = M.Ctx(tensors_state(a.size, a.tensors))
    nbytes = M.state_bytes(ctx.state)
    loads = {
        "torch.load(mmap)": ("torch", M.MECHANISMS["torch"].loads["torch.load(mmap)"]),
        "safetensors.load_file": (
            "safetensors", M.MECHANISMS["safetensors"].loads["safetensors.load_file"]),
        "ckptio.load(mmap)": ("ckptio", M.MECHANISMS["ckptio"].loads["ckptio.load(mmap)"]),
        "ckptio.load": ("ckptio", M.MECHANISMS["ckptio"].loads["ckptio.load"]),
    }  # fmt: skip
    if a.loads:
        loads = {n: loads[n] for n in a.loads.split(",")}
    paths = {}
    for mech in {m for m, _ in loads.values()}:
        m = M.MECHANISMS[mech]
        paths[mech] = os.path.join(a.dir, mech) + (".file" if m.target == "file" else "")
        M.remove(paths[mech])
        m.save(ctx, paths[mech])
    del ctx
    gc.collect()
    for p in paths.values():
        recache(p)
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
    print(f"{nbytes / 2**30:.2f} GiB in {a.tensors} bf16 tensor(s), warm page cache, "
          f"every page touched, {a.runs} rounds (medians)")  # fmt: skip
    rows = {}
    ref = "safetensors.load_file" if "safetensors.load_file" in res else None
    for n in names:
        med = statistics.median(res[n])
        rows[n] = {"gbps": round(med, 3), "runs": [round(x, 3) for x in res[n]]}
        line = f"  {n:24s} {med:7.2f} GB/s"
        if ref and n != ref:
            # Paired: each round's load against safetensors' in the same round.
            ratio = statistics.median(x / y for x, y in zip(res[n], res[ref]))
            rows[n]["of_safetensors_median"] = round(ratio, 3)
            line += f"  {ratio:5.2f}x safetensors.load_file"
        print(f"{line}   {[round(x, 2) for x in res[n]]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "bytes": nbytes, "tensors": a.tensors,
                       "results": rows, "nproc": os.cpu_count(),
                       "loadavg_after": os.getloadavg()}, f, indent=1)  # fmt: skip
    for p in paths.values():
        M.remove(p)
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
