# SPDX-License-Identifier: Apache-2.0
"""A/B of cold checkpoint loads in one run: builds of bench/read_ab.c (or one build with other
params) alternate with the raw O_DIRECT read of the same data files, rounds rotated; each load
is reported as a fraction of the raw read of its own round (medians).

    .venv/bin/python bench/read_ab.py --dir /tmp/rp-bench/bench-state --rounds 7 \
        --variant base=/tmp/read_base --variant new=/tmp/read_new --json out.json

A variant is NAME=BINARY[,request,depth,verify_threads] (params passed to ckptio_params); a
BINARY is a tree's build/tools/ckptio-read-ab (copied aside to compare two trees).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys


def run(cmd: list[str]) -> dict[str, float]:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", required=True, help="a checkpoint (ckptio bench --keep leaves one)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    variants: dict[str, list[str]] = {}
    for v in a.variant:
        name, spec = v.split("=", 1)
        binary, *params = spec.split(",")
        variants[name] = [binary, "load", a.dir, *params]
    raw_bin = next(iter(variants.values()))[0]
    names = ["raw", *variants]
    cmds = {"raw": [raw_bin, "raw", a.dir], **variants}
    res: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for r in range(a.rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            res[n].append(run(cmds[n]))
    raw_gbps = [x["bytes"] / x["seconds"] / 1e9 for x in res["raw"]]
    rows: dict[str, object] = {"raw": {"gbps_median": round(statistics.median(raw_gbps), 3),
                                       "gbps": [round(g, 3) for g in raw_gbps]}}  # fmt: skip
    print(f"{a.rounds} rounds, load average after: {os.getloadavg()}")
    raw_med = statistics.median(raw_gbps)
    print(f"  raw read          {raw_med:6.2f} GB/s  {[round(g, 2) for g in raw_gbps]}")
    for n in variants:
        g = [x["bytes"] / x["seconds"] / 1e9 for x in res[n]]
        ratio = [gi / ri for gi, ri in zip(g, raw_gbps)]
        rows[n] = {
            "cmd": " ".join(cmds[n]),
            "gbps_median": round(statistics.median(g), 3),
            "of_raw_median": round(statistics.median(ratio), 3),
            "of_raw": [round(x, 3) for x in ratio],
            "runs": res[n],
        }
        med = statistics.median(ratio)
        print(f"  {n:16s}  {statistics.median(g):6.2f} GB/s  of raw {med:.3f}  "
              f"{[round(x, 2) for x in ratio]}")  # fmt: skip
    names_v = list(variants)
    for i in range(1, len(names_v)):
        b = [x["seconds"] / y["seconds"] for x, y in zip(res[names_v[0]], res[names_v[i]])]
        rows[f"{names_v[i]}_speedup_vs_{names_v[0]}"] = round(statistics.median(b), 3)
        med = statistics.median(b)
        print(f"  {names_v[i]} vs {names_v[0]}: {med:.3f}x faster (median of rounds)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "results": rows, "nproc": os.cpu_count(),
                       "loadavg_after": os.getloadavg()}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
