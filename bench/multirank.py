# SPDX-License-Identifier: Apache-2.0
"""The multi-rank cell of `make bench`: WORLD_SIZE local ranks (gloo, CPU) save and cold-load one state, replicated and Shard(0), with ckptio (comm=), torch DCP (FileSystemWriter/Reader) and DCP through ckptio.torch.dcp's StorageWriter/Reader, next to the raw device bandwidth measured in the same run."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import ROOT, machine, med, parse_size, version, write_results  # noqa: E402

LAYOUTS = ("replicated", "shard0")
MECHS = ("ckptio", "dcp", "ckptio-dcp")
# On request (--mechanisms): ckptio.load with direct=True, O_DIRECT where replicated loads would
# share the page cache.
EXTRA = ("ckptio-direct",)
NAMES = {"ckptio": ("ckptio.save(comm=)", "ckptio.load(like=)"), "dcp": ("dcp.save FileSystemWriter", "dcp.load FileSystemReader"),
         "ckptio-dcp": ("dcp.save ckptio StorageWriter", "dcp.load ckptio StorageReader"),
         "ckptio-direct": ("ckptio.save(comm=)", "ckptio.load(direct=True)")}
# What issue 10 asks of this cell.
TARGET_X_DCP = 1.5
TARGET_OF_RAW = 0.9
TARGET_SPREAD_PCT = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(layout: str, a: argparse.Namespace, work: str) -> list[dict[str, Any]]:
    """Run ``a.ranks`` copies of bench/multirank_rank.py for ``layout``; returns each rank's
    JSON. Every rank is killed when one fails or when ``a.timeout`` seconds have passed."""
    port = free_port()
    procs: list[tuple[subprocess.Popen[bytes], str, str]] = []
    for rank in range(a.ranks):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(a.ranks), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(a.ranks),
                   OMP_NUM_THREADS="1",
                   # Every tensor-sized allocation a fresh mapping (no heap reuse after frees):
                   # each load, whichever mechanism, pays for the pages it fills.
                   MALLOC_MMAP_THRESHOLD_="131072")  # fmt: skip
        out = os.path.join(work, f"{layout}-rank{rank}.json")
        log = os.path.join(work, f"{layout}-rank{rank}.log")
        cmd = [sys.executable, os.path.join(HERE, "multirank_rank.py"), "--layout", layout, "--dir", a.dir,
               "--tensors", str(a.tensors), "--tensor-bytes", str(a.size // a.tensors), "--rounds", str(a.rounds),
               "--mechanisms", a.mechanisms, "--raw-size", str(a.raw_size), "--timeout", str(a.collective_timeout),
               "--out", out]  # fmt: skip
        with open(log, "wb") as lf:
            procs.append((subprocess.Popen(cmd, env=env, stdout=lf, stderr=subprocess.STDOUT, cwd=ROOT), out, log))
    deadline = time.monotonic() + a.timeout
    failed = ""
    while True:
        codes = [p.poll() for p, _o, _l in procs]
        if all(c is not None for c in codes):
            break
        bad = next((i for i, c in enumerate(codes) if c not in (None, 0)), None)
        if bad is not None:
            failed = f"rank {bad} exited with {codes[bad]}"
        elif time.monotonic() > deadline:
            failed = f"timed out after {a.timeout:.0f} s"
        if failed:
            for p, _o, _l in procs:
                if p.poll() is None:
                    p.kill()
            for p, _o, _l in procs:
                p.wait()
            break
        time.sleep(0.2)
    if not failed:
        bad = next((i for i, (p, _o, _l) in enumerate(procs) if p.returncode != 0), None)
        if bad is not None:
            failed = f"rank {bad} exited with {procs[bad][0].returncode}"
    if failed:
        tails = []
        for i, (_p, _o, log) in enumerate(procs):
            with open(log, errors="replace") as f:
                tails.append(f"--- rank {i} ---\n" + "".join(f.readlines()[-15:]))
        raise SystemExit(f"multirank {layout}: {failed}\n" + "\n".join(tails))
    docs = []
    for _p, out, _l in procs:
        with open(out) as f:
            docs.append(json.load(f))
    return docs


# ckptio_save_dist's collectives in order (an agreement is a gather then a broadcast): holdings
# to the coordinator, the plan back, the temporary directory; after this rank's writes the
# agreement and the gather of partial manifests; after rank 0's merge and publish, the last
# agreement.
SAVE_COLLECTIVES = ["gather", "broadcast", "broadcast", "gather", "broadcast", "gather", "gather", "broadcast"]
PHASES = ("stage", "hash", "plan", "open", "write", "wait_writers", "publish", "total")


def save_phases(trace: list[list[Any]]) -> dict[str, float] | None:
    """Seconds per step of one rank's ckptio save from its trace: staging the tree (Python),
    hashing every box this rank holds (so the coordinator can compare replicas), the plan
    (holdings gathered, checked, broadcast), the temporary directory, this rank's own
    writes and fsyncs, waiting for every rank's writes (agreement + partial manifests), and
    rank 0's merge, manifest and atomic publish (other ranks wait for it there)."""
    tr = sorted(trace, key=lambda x: x[1])
    coll = [x for x in tr if x[0] in ("gather", "broadcast", "barrier")]
    st = next((x for x in tr if x[0] == "stage"), None)
    sd = next((x for x in tr if x[0] == "save_dist"), None)
    if [x[0] for x in coll] != SAVE_COLLECTIVES or st is None or sd is None:
        return None

    def end(x: list[Any]) -> float:
        return float(x[1] + x[2])

    return {"stage": st[2], "hash": coll[0][1] - sd[1], "plan": end(coll[1]) - coll[0][1], "open": end(coll[2]) - end(coll[1]),
            "write": coll[3][1] - end(coll[2]), "wait_writers": end(coll[5]) - coll[3][1],
            "publish": end(sd) - end(coll[5]), "total": end(sd)}  # fmt: skip


def summarize(layout: str, docs: list[dict[str, Any]], nbytes: int, mechs: list[str]) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    """Rows (one per mechanism x op) from every rank's rounds: a round's time is the slowest
    rank's barrier-to-barrier time; GB/s = the global state's bytes / that time."""
    raw = {"write": [r["raw_write_gbps"] for r in docs[0]["rounds"] if "raw_write_gbps" in r],
           "read": [r["raw_read_gbps"] for r in docs[0]["rounds"] if "raw_read_gbps" in r]}  # fmt: skip
    rows = []
    for m in mechs:
        for op in ("save", "load"):
            secs = [max(d["rounds"][i][m][op]["seconds"] for d in docs) for i in range(len(docs[0]["rounds"]))]
            xs = [nbytes / s / 1e9 for s in secs]
            row: dict[str, Any] = {
                "benchmark": f"multirank {len(docs)} ranks {layout}", "layout": layout, "mechanism": NAMES[m][op == "load"],
                "mech": m, "op": op, "durable": True, "cold": op == "load", "bytes": nbytes,
                "gbps": round(med(xs), 4), "gbps_min": round(min(xs), 4), "gbps_max": round(max(xs), 4),
                "runs": [round(x, 4) for x in xs], "seconds_runs": [round(s, 4) for s in secs],
                "errors": sorted({d["rounds"][i][m][op].get("error", "") for d in docs for i in range(len(d["rounds"]))} - {""}),
                # Where the time went, per rank (medians over rounds): call, fsync/touch, barrier wait.
                "per_rank": [{k: round(med([rd[m][op][k] for rd in d["rounds"]]), 4)
                              for k in ("seconds", "call_s", "fsync_s", "touch_s", "wait_s") if k in d["rounds"][0][m][op]}
                             for d in docs],
            }  # fmt: skip
            if m == "ckptio":
                # The last round's steps per rank: [what, start (s after the opening barrier), seconds].
                row["trace_per_rank"] = [d["rounds"][-1][m][op].get("trace", []) for d in docs]
                if op == "save":
                    ph = [[save_phases(rd[m][op].get("trace", [])) for rd in d["rounds"]] for d in docs]
                    if all(p is not None for per in ph for p in per):
                        row["phases_per_rank"] = [{k: round(med([p[k] for p in per if p]), 4) for k in PHASES} for per in ph]
            if op == "load":
                # Bytes each rank took off the device (/proc/self/io read_bytes; medians over rounds).
                row["device_bytes_per_rank"] = [int(med([rd[m]["load"].get("device_bytes", -1) for rd in d["rounds"]])) for d in docs]
                # Per round, all ranks together: above the state's bytes when some were read twice.
                row["device_bytes_runs"] = [sum(d["rounds"][i][m]["load"].get("device_bytes", -1) for d in docs) for i in range(len(docs[0]["rounds"]))]
                row["call_s_per_rank_runs"] = [[round(d["rounds"][i][m]["load"]["call_s"], 3) for d in docs] for i in range(len(docs[0]["rounds"]))]
                # CPU seconds of the call per rank, user + system (medians over rounds): with
                # more ranks than cores, what the ranks together ask of the CPUs.
                row["cpu_s_per_rank"] = [[round(med([rd[m]["load"].get(k, 0.0) for rd in d["rounds"]]), 3)
                                          for k in ("cpu_user_s", "cpu_sys_s")] for d in docs]  # fmt: skip
            if op == "save":
                per = [d["rounds"][-1][m]["save"]["bytes_written"] for d in docs]
                row["bytes_written_per_rank"] = per
                row["files_per_rank"] = [d["rounds"][-1][m]["save"]["files"] for d in docs]
                row["spread_pct"] = round((max(per) / min(per) - 1) * 100, 2) if min(per) > 0 else None
                if m == "ckptio":
                    row["stats_per_rank"] = [d["rounds"][-1][m]["save"].get("stats") for d in docs]
            rows.append(row)
    return rows, raw


def print_table(rows: list[dict[str, Any]], raw_w: float, raw_r: float) -> list[str]:
    print(f"\nraw device: write {raw_w:.2f} GB/s, read {raw_r:.2f} GB/s (medians, measured before each round)")
    for lay in dict.fromkeys(r["layout"] for r in rows):
        x = next(r for r in rows if r["layout"] == lay)
        print(f"  before the {lay} rounds: write {x['raw_write_gbps']:.2f}, read {x['raw_read_gbps']:.2f} GB/s ('of raw' below)")
    print("GB/s = the global state's bytes / time from a barrier before the call to a barrier after it (slowest rank)")
    print("saves durable (ckptio fsyncs itself; DCP's files, .metadata and directories fsynced); loads cold, every page touched\n")
    hdr = (f"{'benchmark':30s} {'mechanism':27s} {'op':4s} {'GB/s':>6s} {'min - max':>13s} {'x DCP':>6s} {'of raw':>7s}"
           f"   {'MiB written/read per rank':>25s} {'spread':>7s}")  # fmt: skip
    print(hdr)
    print("-" * len(hdr))
    verdicts = []
    for r in rows:
        ref = next((x["gbps"] for x in rows if x["layout"] == r["layout"] and x["mech"] == "dcp" and x["op"] == r["op"]), 0)
        raw = r["raw_write_gbps"] if r["op"] == "save" else r["raw_read_gbps"]
        x = r["gbps"] / ref if ref else 0
        r["x_dcp"] = round(x, 3)
        r["of_raw"] = round(r["gbps"] / raw, 3) if raw else 0
        per = ""
        spread = ""
        if r["op"] == "load" and min(r.get("device_bytes_per_rank", [-1])) >= 0:
            per = " ".join(f"{v / 2**20:.0f}" for v in r["device_bytes_per_rank"])
        if r["op"] == "save":
            b = r["bytes_written_per_rank"]
            per = " ".join(f"{v / 2**20:.0f}" for v in b)
            spread = f"{r['spread_pct']:.1f}%" if r["spread_pct"] is not None else "-"
        mm = f"{r['gbps_min']:.2f} - {r['gbps_max']:.2f}"
        print(f"{r['benchmark']:30s} {r['mechanism']:27s} {r['op']:4s} {r['gbps']:6.2f} {mm:>13s} {x:5.2f}x "
              f"{r['of_raw']:7.2f}   {per:>25s} {spread:>7s}" + ("  WRONG: " + r["errors"][0] if r["errors"] else ""))  # fmt: skip
        if r["mech"] == "ckptio":
            verdicts.append(f"{r['layout']} {r['op']}: {x:.2f}x DCP (target >= {TARGET_X_DCP}): {'met' if x >= TARGET_X_DCP else 'MISSED'}")
            if r["op"] == "save":
                verdicts.append(f"{r['layout']} save: {r['of_raw']:.2f} of raw write (target >= {TARGET_OF_RAW}): "
                                f"{'met' if r['of_raw'] >= TARGET_OF_RAW else 'MISSED'}")  # fmt: skip
                if r["layout"] == "replicated" and r["spread_pct"] is not None:
                    verdicts.append(f"replicated bytes per rank spread {r['spread_pct']:.1f}% (target <= {TARGET_SPREAD_PCT:.0f}%): "
                                    f"{'met' if r['spread_pct'] <= TARGET_SPREAD_PCT else 'MISSED'}")  # fmt: skip
            if r["errors"]:
                verdicts.append(f"{r['layout']} {r['op']}: loaded state differs from the saved one: {r['errors'][0]}")
    print()
    for v in verdicts:
        print("  " + v)
    for r in rows:
        if r["mech"] == "ckptio" and r["op"] == "load" and r.get("trace_per_rank"):
            # Opening the checkpoint (manifest) is the time before the read starts.
            opened = [next((x[1] for x in tr if x[0] == "read"), None) for tr in r["trace_per_rank"]]
            reads = [next((x[2] for x in tr if x[0] == "read"), None) for tr in r["trace_per_rank"]]
            if None not in opened and None not in reads:
                print(f"\n{r['benchmark']} {r['mechanism']} (last round): open " + " ".join(f"{x:.3f}" for x in opened)
                      + " s, read " + " ".join(f"{x:.3f}" for x in reads) + " s per rank")  # fmt: skip
        if r.get("phases_per_rank"):
            print(f"\n{r['benchmark']} {r['mechanism']}: seconds per step (medians over rounds)")
            print("  rank " + " ".join(f"{k:>12s}" for k in PHASES))
            for i, ph in enumerate(r["phases_per_rank"]):
                print(f"  {i:4d} " + " ".join(f"{ph[k]:12.3f}" for k in PHASES))
    return verdicts


def run(a: argparse.Namespace) -> dict[str, Any]:
    """The whole cell: each layout in its own launch of the ranks. Returns the JSON document."""
    mechs = [m for m in a.mechanisms.split(",") if m]
    for m in mechs:
        if m not in MECHS + EXTRA:
            raise SystemExit(f"multirank: unknown mechanism {m!r}; known: {', '.join(MECHS)}")
    made = not os.path.exists(a.dir)
    os.makedirs(a.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="ckptio-multirank-")
    rows: list[dict[str, Any]] = []
    raw: dict[str, list[float]] = {"write": [], "read": []}
    loadavg: dict[str, Any] = {"start": os.getloadavg()}
    t_start = time.time()
    try:
        for layout in [x for x in a.layouts.split(",") if x]:
            if layout not in LAYOUTS:
                raise SystemExit(f"multirank: unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
            t = time.time()
            docs = launch(layout, a, work)
            r, rw = summarize(layout, docs, a.size // a.tensors * a.tensors, mechs)
            for x in r:
                # Each layout runs in its own launch: its rows compare with the raw device
                # measured before its own rounds (the same disk weather).
                x["raw_write_gbps"], x["raw_read_gbps"] = round(med(rw["write"]), 4), round(med(rw["read"]), 4)
            rows += r
            raw["write"] += rw["write"]
            raw["read"] += rw["read"]
            loadavg[layout] = [rd["loadavg_before"] for rd in docs[0]["rounds"]] + [docs[0]["rounds"][-1]["loadavg_after"]]
            if not a.quiet:
                print(f"multirank {layout}: {time.time() - t:.0f} s", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if made:
            shutil.rmtree(a.dir, ignore_errors=True)
    raw_w, raw_r = med(raw["write"]), med(raw["read"])
    verdicts = print_table(rows, raw_w, raw_r)
    elapsed = time.time() - t_start
    print(f"\n{a.ranks} ranks, {a.rounds} rounds per layout, mechanisms interleaved; {elapsed:.0f} s")
    loadavg["end"] = os.getloadavg()
    import torch

    return {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(a.dir, loadavg=loadavg),
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "ckptio": version("ckptio")},
        "args": {k: v for k, v in vars(a).items()}, "seconds": round(elapsed, 1),
        "raw_write_gbps": round(raw_w, 4), "raw_read_gbps": round(raw_r, 4),
        "raw_write_runs": [round(x, 4) for x in raw["write"]], "raw_read_runs": [round(x, 4) for x in raw["read"]],
        "targets": {"x_dcp": TARGET_X_DCP, "of_raw_write": TARGET_OF_RAW, "replicated_spread_pct": TARGET_SPREAD_PCT},
        "verdicts": verdicts, "rows": rows,
    }  # fmt: skip


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--ranks", type=int, default=4, help="local ranks (gloo, CPU)")
    ap.add_argument("--size", default="1G", help="global state bytes (bf16)")
    ap.add_argument("--tensors", type=int, default=64, help="tensors in the state (64 x 16 MiB by default)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per layout")
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help=f"subset of {','.join(LAYOUTS)}")
    ap.add_argument("--mechanisms", default=",".join(MECHS), help=f"subset of {','.join(MECHS)}")
    ap.add_argument("--timeout", type=float, default=900, help="seconds one layout's launch may take before every rank is killed")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    add_args(ap)
    ap.add_argument("--dir", default=os.path.join(ROOT, "bench-data"), help="bench directory (removed afterwards if made)")
    ap.add_argument("--raw-size", type=parse_size, default=parse_size("1G"), help="file size of each raw device measurement (0: none)")
    ap.add_argument("--collective-timeout", type=float, default=300, help="seconds a rank waits in one collective")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="where multirank-<time>.json and multirank-latest.json go ('' for nowhere)")
    ap.add_argument("--quiet", action="store_true")
    return ap


def defaults(**over: Any) -> argparse.Namespace:
    """The cell's default arguments with ``over`` replacing some (for bench/run.py --multirank)."""
    a = parser().parse_args([])
    for k, v in over.items():
        setattr(a, k, v)
    a.size = parse_size(a.size) if isinstance(a.size, str) else a.size
    return a


def main() -> None:
    a = parser().parse_args()
    a.size = parse_size(a.size)
    write(run(a), a.out)


def write(doc: dict[str, Any], out: str) -> None:
    if not out:
        return
    print(f"results: {write_results(doc, out, 'multirank-')}")


if __name__ == "__main__":
    main()
