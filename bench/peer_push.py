# SPDX-License-Identifier: Apache-2.0
"""The peer tier's transport alone: N pushes of one part each (from tmpfs to servers whose
roots are on tmpfs, over 127.0.0.1) at once, every part verified by its receiver before it is
published; wall time and per-push seconds, medians of --rounds, JSON to --out."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import threading
import time

import numpy as np

import ckptio
from ckptio import _core


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pushes", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--part-mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--root", default=f"/dev/shm/ckptio-peer-push-{os.getpid()}")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    doc: dict[str, object] = {"cell": "peer_push", "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
                              "args": vars(a), "loadavg_before": os.getloadavg(), "runs": {}}
    try:
        n_max = max(a.pushes)
        for i in range(n_max):
            part = np.random.default_rng(i).random((a.part_mib << 20) // 8)
            ckptio.save({"w": part}, f"{a.root}/src{i}", overwrite=True)
        key = os.urandom(32)  # the job's key, as a Manager's rank 0 draws it
        servers = [_core.PeerServer(f"{a.root}/recv{j}", "127.0.0.1", 0, key) for j in range(2)]
        for n in a.pushes:
            walls, each = [], []
            for r in range(a.rounds):
                took = [0.0] * n

                def push(i: int, r: int = r, took: list[float] = took) -> None:
                    t = time.perf_counter()
                    _core.peer_push(f"{a.root}/src{i}", "127.0.0.1", servers[i % 2].port,
                                    f"{r}/rank{i}", 60.0, 0, key)
                    took[i] = time.perf_counter() - t

                t0 = time.perf_counter()
                threads = [threading.Thread(target=push, args=(i,)) for i in range(n)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                walls.append(time.perf_counter() - t0)
                each.append(took)
                for j in range(2):
                    shutil.rmtree(f"{a.root}/recv{j}/{r}", ignore_errors=True)
            wall = statistics.median(walls)
            doc["runs"][str(n)] = {"wall_s": walls, "push_s": each, "median_wall_s": wall,  # type: ignore[index]
                                   "aggregate_gbps": n * (a.part_mib << 20) / wall / 1e9}
            print(f"{n} push(es) of {a.part_mib} MiB at once: {wall:.3f} s, "
                  f"{n * (a.part_mib << 20) / wall / 1e9:.2f} GB/s in all (median of {a.rounds})")
        for s in servers:
            s.close()
    finally:
        shutil.rmtree(a.root, ignore_errors=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"peer-push-{time.strftime('%Y%m%d-%H%M%S')}.json"), "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
