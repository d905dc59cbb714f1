# SPDX-License-Identifier: Apache-2.0
"""What fresh memory costs a cold load, and what each way of paying for it buys: ckptio.load
with its buffers faulted in by the read itself ("none", the default) or by a second thread
while the read runs ("prefault"); load(into=) into memory the caller already owns; and the raw
device read, all in one run, rounds rotated. (Faulting each buffer in as it was allocated,
"populate" in bench/results/fresh-20261201/, went when the reader came to allocate the
destinations itself.)

    .venv/bin/python bench/fresh_memory.py --dir /tmp/b --size 1G --runs 3 --json out.json
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

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import ckptio  # noqa: E402
import ckptio._load as L  # noqa: E402
from common import ckptio_cmd, make_resident, parse_size  # noqa: E402
from mechanisms import evict, touch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default="/tmp/ckptio-fresh")
    ap.add_argument("--size", type=parse_size, default=parse_size("1G"))
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--model", default=None, help="instead of --size/--tensors: that save_model state of bench/mechanisms.py (e.g. 1.3b; its bf16 bytes as int16)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warm", action="store_true", help="files resident in the page cache before each load (raw: still the device)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    path = os.path.join(a.dir, "ckpt")
    shutil.rmtree(path, ignore_errors=True)
    if a.model:
        import torch
        from mechanisms import MODELS, model_state

        state = {k: v.view(torch.int16).numpy() for k, v in model_state(MODELS[a.model], False).items()}
        a.tensors = len(state)
    else:
        n = a.size // a.tensors // 4
        rng = np.random.default_rng(0)
        state = {f"t{i:03d}": rng.random(n, dtype=np.float32) for i in range(a.tensors)}
    nbytes = sum(v.nbytes for v in state.values())
    ckptio.save(state, path, fsync=False)
    into = {k: np.empty_like(v) for k, v in state.items()}
    for v in into.values():
        v.fill(0)  # the caller's memory: resident already
    del state
    modes = ["raw", "none", "prefault", "into"]
    res: dict[str, list[float]] = {m: [] for m in modes}
    # CPU seconds of the loading thread (its own page faults land here, a second thread's
    # do not): less at the mercy of other processes on the machine than the wall clock.
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(a.runs):
        for m in modes[r % len(modes) :] + modes[: r % len(modes)]:
            if m == "raw":
                out = subprocess.run(
                    [ckptio_cmd(), "bench", "--raw-only", "--json", "--runs", "1",
                     "--size", str(nbytes), "--dir", a.dir],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                res[m].append(json.loads(out.stdout)["raw_read_gbps"])
                continue
            if a.warm:
                make_resident(path)
            else:
                evict(path)
            c0 = time.thread_time()
            t0 = time.perf_counter()
            if m == "into":
                got = ckptio.load(path, into=into)
            else:
                L._FRESH = m
                got = ckptio.load(path)
            seen = touch(got, False)
            dt = time.perf_counter() - t0
            cpu[m].append(time.thread_time() - c0)
            assert seen == nbytes, (seen, nbytes)
            res[m].append(nbytes / dt / 1e9)
            del got
    L._FRESH = "none"
    raw = statistics.median(res["raw"])
    print(f"{nbytes / 2**30:.2f} GiB in {a.tensors} tensors, {'warm' if a.warm else 'cold'}, {a.runs} rounds (medians)")
    rows = {}
    for m in modes:
        med = statistics.median(res[m])
        c = statistics.median(cpu[m]) if cpu[m] else 0.0
        rows[m] = {"gbps": round(med, 3), "of_raw": round(med / raw, 3), "runs": [round(x, 3) for x in res[m]],
                   "thread_cpu_s": round(c, 3)}  # fmt: skip
        print(f"  {m:9s} {med:6.2f} GB/s  {med / raw:5.2f} of raw  loading thread {c:5.2f} s CPU"
              f"   {[round(x, 2) for x in res[m]]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "bytes": nbytes, "tensors": a.tensors, "warm": a.warm,
                       "results": rows, "nproc": os.cpu_count(),
                       "loadavg_after": os.getloadavg()}, f, indent=1)  # fmt: skip
    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
