# SPDX-License-Identifier: Apache-2.0
"""The peer-tier cell of `make bench`: 4 gloo ranks as 2 simulated nodes save 1 GiB through Manager(local=, replicas=1), then restore it after losing one node's local tier (from the peer) and after losing every local tier (from the persistent directory): save stall next to save_async's, replication rate, restore times with their breakdown."""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import datetime
import json
import mmap
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
import time
import zlib
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import ROOT, human, machine, med, parse_size, raw_measure, version, write_results  # noqa: E402

# What issue 23 asks of this cell.
TARGET_STALL_X_ASYNC = 1.0  # Manager(local=).save stall <= save_async's
TARGET_PERSISTENT_X_PEER = 3.0  # a lost node's parts: from the peer >= 3x faster than from the persistent tier
BREAKDOWN = ("plan", "fetch", "load", "agree")
COLS = 4096  # float32 columns of every tensor


# ------------------------------------------------------------------------------------------------
# One rank (this file run with `rank` first: the cell starts --ranks of them per phase)
# ------------------------------------------------------------------------------------------------


def rank_state(rank: int, rank_bytes: int, tensors: int) -> dict[str, Any]:
    """``tensors`` float32 tensors of about rank_bytes / tensors each (rows of COLS), their
    values from bench/mechanisms.py's N(0, 0.02) pool at an offset set by rank and tensor."""
    import torch

    import mechanisms as M

    pool = M._pool()
    rows = max(1, rank_bytes // tensors // 4 // COLS)
    return {f"layers.{i}.weight": M._filled((rows, COLS), pool, rank * tensors + i).to(torch.float32) for i in range(tensors)}


def crc(tree: dict[str, Any]) -> str:
    """CRC-32 over the names and bytes of a tree of tensors or arrays, names in order."""
    import numpy as np

    c = 0
    for k in sorted(tree):
        v = tree[k]
        a = v.detach().contiguous().numpy() if hasattr(v, "detach") else np.ascontiguousarray(v)
        c = zlib.crc32(f"{k}{tuple(a.shape)}{a.dtype}".encode(), c)
        c = zlib.crc32(a.reshape(-1).view(np.uint8).data, c)
    return f"{c:08x}"


def plain(x: Any) -> Any:
    """A dict from the Manager (last_save, last_restore) as JSON can hold it."""
    return json.loads(json.dumps(x, default=str)) if x is not None else None


def tier_thread_rchar() -> int | None:
    """Bytes the Manager's job thread ("ckptio-tiers") has read so far, by /proc's per-thread
    rchar (every read, pread, sendfile and copy_file_range counts the bytes it moves); None
    before the thread exists or where /proc has no such file."""
    import threading

    t = next((t for t in threading.enumerate() if t.name == "ckptio-tiers"), None)
    if t is None or t.native_id is None:
        return None
    try:
        with open(f"/proc/self/task/{t.native_id}/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
    except (OSError, StopIteration, ValueError):
        return None


def rank_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="tier_cell.py rank")
    ap.add_argument("--phase", choices=("save", "restore"), required=True)
    ap.add_argument("--persistent", required=True)
    ap.add_argument("--local", required=True)
    ap.add_argument("--async-path", default="")
    ap.add_argument("--warm-path", default="")
    ap.add_argument("--rank-bytes", type=int, required=True)
    ap.add_argument("--tensors", type=int, required=True)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--order", default="manager,async")
    ap.add_argument("--saves", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=a.timeout))
    import ckptio

    def manager() -> Any:
        return ckptio.Manager(a.persistent, keep=2, comm="torch", local=a.local, replicas=a.replicas,
                              persist_every=1, local_keep=2, timeout=a.timeout)  # fmt: skip

    doc: dict[str, Any] = {"rank": rank, "node": os.environ.get("CKPTIO_NODE", ""), "loadavg_before": os.getloadavg()}
    if a.phase == "save":
        t = time.perf_counter()
        tree = rank_state(rank, a.rank_bytes, a.tensors)
        doc["build_s"] = time.perf_counter() - t
        doc["bytes"] = sum(v.numel() * v.element_size() for v in tree.values())
        doc["crc"] = crc(tree)
        m = manager()
        # Untimed: one save of each kind first, which makes the staging buffers both reuse.
        m.save(1, tree)
        m.wait_until_finished()
        ckptio.save_async(tree, a.async_path, overwrite=True).wait()
        dist.barrier()
        doc["manager"], doc["async"] = [], []
        kinds = a.order.split(",")
        for i in range(a.saves):  # pairs of saves, the order alternating
            for kind in kinds if i % 2 == 0 else kinds[::-1]:
                dist.barrier()  # every rank's background work of the save before has ended
                t0 = time.perf_counter()
                if kind == "manager":
                    read0 = tier_thread_rchar()
                    m.save(2 + i, tree)
                    t1 = time.perf_counter()
                    m.wait_until_finished()
                    read1 = tier_thread_rchar()
                    rec = {"last_save": plain(m.last_save),
                           "tier_read_bytes": read1 - read0 if read0 is not None and read1 is not None else None}
                else:
                    h = ckptio.save_async(tree, a.async_path, overwrite=True)
                    t1 = time.perf_counter()
                    h.wait()
                    rec = {"stall_seconds": h.stall_seconds}
                doc[kind].append({"stall_s": t1 - t0, "background_s": time.perf_counter() - t1, **rec})
        dist.barrier()
        m.close()
    else:
        # Untimed: the first I/O call of a process sets up the engine (threads, rings), about
        # half a second here; what the restore is timed for is the tiers, not that.
        import torch

        ckptio.save({"warm": torch.ones(1 << 18)}, a.warm_path, overwrite=True)
        ckptio.load(a.warm_path)
        m = manager()
        dist.barrier()
        t0 = time.perf_counter()
        tree = m.restore()
        t1 = time.perf_counter()
        doc["restore_s"] = t1 - t0
        doc["last_restore"] = plain(m.last_restore)
        doc["crc"] = crc(tree)  # untimed: reads every byte it returned
        doc["crc_s"] = time.perf_counter() - t1
        dist.barrier()
        m.close()
    doc["loadavg_after"] = os.getloadavg()
    dist.destroy_process_group()
    with open(a.out, "w") as f:
        json.dump(doc, f)


# ------------------------------------------------------------------------------------------------
# The cell
# ------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_of(rank: int, a: argparse.Namespace) -> str:
    """Ranks in blocks: with 4 ranks on 2 nodes, 0 and 1 on n0, 2 and 3 on n1."""
    return f"n{rank * a.nodes // a.ranks}"


class LaunchFailed(Exception):
    """A rank of a launch failed or the launch ran out of time; the message has every rank's log tail."""


def launch(phase: str, label: str, a: argparse.Namespace, roots: dict[str, str], work: str, extra: list[str]) -> list[dict[str, Any]]:
    """Start ``a.ranks`` ranks of ``phase``, each with its simulated node's id and local root;
    every rank is killed once one fails or ``a.timeout`` seconds pass. Each rank's JSON."""
    port = free_port()
    procs: list[tuple[subprocess.Popen[bytes], str, str]] = []
    for r in range(a.ranks):
        node = node_of(r, a)
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(a.ranks),
                   GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", CKPTIO_NODE=node, CKPTIO_PEER_ADDR="127.0.0.1")  # fmt: skip
        out, log = os.path.join(work, f"{phase}-rank{r}.json"), os.path.join(work, f"{phase}-rank{r}.log")
        for f in (out, log):
            if os.path.exists(f):
                os.remove(f)
        cmd = [sys.executable, os.path.abspath(__file__), "rank", "--phase", phase, "--persistent", a.persistent,
               "--local", roots[node], "--rank-bytes", str(a.size // a.ranks), "--tensors", str(a.tensors),
               "--replicas", str(a.replicas), "--timeout", str(a.collective_timeout), "--out", out, *extra]  # fmt: skip
        if phase == "save":
            cmd += ["--async-path", os.path.join(roots["async"], f"rank{r}")]
        else:
            cmd += ["--warm-path", os.path.join(work, f"warm-rank{r}")]
        with open(log, "wb") as lf:
            procs.append((subprocess.Popen(cmd, env=env, stdout=lf, stderr=subprocess.STDOUT, cwd=ROOT), out, log))
    end = time.monotonic() + a.timeout
    why = ""
    while not why and any(p.poll() is None for p, _o, _l in procs):
        dead = [i for i, (p, _o, _l) in enumerate(procs) if p.returncode not in (None, 0)]
        why = f"rank {dead[0]} exited with {procs[dead[0]][0].returncode}" if dead else ""
        if not why and time.monotonic() > end:
            why = f"timed out after {a.timeout:.0f} s"
        time.sleep(0.1)
    for p, _o, _l in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    why = why or next((f"rank {i} exited with {p.returncode}" for i, (p, _o, _l) in enumerate(procs) if p.returncode), "")
    if why:
        raise LaunchFailed(f"tier cell, {label}: {why}\n" + "\n".join(
            f"--- rank {i} ({node_of(i, a)}) ---\n{tail(log, 3000)}" for i, (_p, _o, log) in enumerate(procs)))
    docs = []
    for _p, out, log in procs:
        with open(out) as fo:
            d = json.load(fo)
        d["log"] = tail(log, 2000)  # warnings (a failed replication is one)
        docs.append(d)
    return docs


def tail(path: str, n: int) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-n:]


def drop_cache(path: str) -> dict[str, Any]:
    """Every file under ``path`` fsynced and dropped from the page cache
    (posix_fadvise DONTNEED); what stayed resident after that, counted with mincore."""
    import mechanisms as M

    M.evict(path)
    files = [os.path.join(d, f) for d, _s, fs in os.walk(path) for f in fs]
    pages = resident = 0
    for p in files:
        n, r = resident_pages(p)
        pages, resident = pages + n, resident + r
    return {"files": len(files), "pages": pages, "resident_pages": resident,
            "resident_fraction": round(resident / pages, 4) if pages else 0.0}  # fmt: skip


def resident_pages(path: str) -> tuple[int, int]:
    """(pages of ``path``, how many of them are in the page cache), by mincore on a mapping."""
    size = os.path.getsize(path)
    page = mmap.PAGESIZE
    n = -(-size // page)
    if n == 0:
        return 0, 0
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return n, -1
        try:
            vec = ctypes.create_string_buffer(n)
            if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                return n, -1
            return n, sum(b & 1 for b in vec.raw)
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _s, fs in os.walk(path) for f in fs)


def clear(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path, exist_ok=True)


def one_round(r: int, a: argparse.Namespace, roots: dict[str, str], work: str) -> dict[str, Any]:
    """Save (stall vs save_async, replication), lose the last node's local tier and restore
    (peer), lose every local tier and restore (persistent, page cache dropped)."""
    for p in (a.persistent, *roots.values()):
        clear(p)
    rec: dict[str, Any] = {"round": r + 1, "loadavg_start": os.getloadavg()}
    if a.raw_size:
        w, rd, _info = raw_measure(a.dir, a.raw_size)
        rec["raw_write_gbps"], rec["raw_read_gbps"] = w, rd
    order = ("manager", "async") if r % 2 == 0 else ("async", "manager")
    rec["order"] = list(order)
    t = time.perf_counter()
    rec["save"] = launch("save", "save", a, roots, work, ["--order", ",".join(order), "--saves", str(a.saves)])
    rec["save_launch_s"] = time.perf_counter() - t
    crcs = [d["crc"] for d in rec["save"]]
    shutil.rmtree(roots["async"], ignore_errors=True)
    rec["tier_bytes"] = {"local": {n: dir_bytes(roots[n]) for n in nodes(a)}, "persistent": dir_bytes(a.persistent)}
    lost = nodes(a)[-1]
    shutil.rmtree(roots[lost])
    rec["lost_node"] = lost
    restore(rec, "peer", f"restore after losing {lost}'s local tier", a, roots, work, crcs)
    for n in nodes(a):
        shutil.rmtree(roots[n], ignore_errors=True)
    rec["persistent_cache"] = drop_cache(a.persistent)
    restore(rec, "persistent", "restore after losing every local tier", a, roots, work, crcs)
    return rec


def restore(rec: dict[str, Any], kind: str, label: str, a: argparse.Namespace, roots: dict[str, str], work: str,
            crcs: list[str]) -> None:  # fmt: skip
    """One restore launch into rec[kind] (each rank's JSON, its bytes checked against the
    save's), or its failure into rec[kind + "_error"]: the other figures still count."""
    try:
        rec[kind] = launch("restore", label, a, roots, work, [])
    except LaunchFailed as e:
        rec[kind], rec[kind + "_error"] = [], str(e)
        if not a.quiet:
            print(str(e)[:3000], file=sys.stderr, flush=True)
    for d in rec[kind]:
        d["crc_ok"] = d["crc"] == crcs[d["rank"]]


def nodes(a: argparse.Namespace) -> list[str]:
    return list(dict.fromkeys(node_of(r, a) for r in range(a.ranks)))


def run(a: argparse.Namespace) -> dict[str, Any]:
    t_start = time.time()
    a.size = parse_size(a.size) if isinstance(a.size, str) else a.size
    a.raw_size = parse_size(a.raw_size) if isinstance(a.raw_size, str) else a.raw_size
    if a.ranks % a.nodes or a.nodes < 2:
        raise SystemExit("tier cell: --ranks must be a multiple of --nodes, and --nodes >= 2")
    made = not os.path.exists(a.dir)
    os.makedirs(a.dir, exist_ok=True)
    a.persistent = os.path.join(a.dir, "persistent")
    base = os.path.join(a.local_base, f"ckptio-tier-{os.getpid()}")
    roots = {n: os.path.join(base, n) for n in nodes(a)} | {"async": os.path.join(base, "async")}
    work = os.path.join(a.dir, "work")
    os.makedirs(work, exist_ok=True)
    rounds = []
    try:
        for r in range(a.rounds):
            rec = one_round(r, a, roots, work)
            rounds.append(rec)
            if not a.quiet:
                print(round_line(rec, a), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)  # the local tiers live in memory (tmpfs)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(a.persistent, ignore_errors=True)
        if made:
            shutil.rmtree(a.dir, ignore_errors=True)
    versions = {"python": platform.python_version(), "torch": version("torch"), "ckptio": version("ckptio")}
    return {
        "cell": "tier", "command": shlex.join([os.path.basename(sys.executable), *sys.argv]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(a.dir, local_base=os.path.abspath(a.local_base)),
        "versions": versions, "args": vars(a), "how": HOW, "seconds": round(time.time() - t_start, 1),
        "summary": summarize_rounds(rounds, a), "rounds": rounds,
    }  # fmt: skip


HOW = {
    "save": "each rank: Manager(persistent, comm='torch', local=<its node's root>, replicas, persist_every=1, local_keep=2); "
            "an untimed save of each kind first; then --saves pairs, the order alternating: m.save(step, tree) timed "
            "until it returns (the stall) and waited for (wait_until_finished: local write, replication, persistent "
            "copy), and ckptio.save_async(tree, <tmpfs path>, overwrite=True) timed until it returns, then waited for; "
            "a barrier before each, so no background work of another rank overlaps; a save's job stall is its slowest "
            "rank's",
    "replication": "each rank's last_save['replicate_bytes'] / last_save['replicate_s'] of the timed save (since the "
                   "persistent copy goes in the pushes' pass, replicate_s is that pass's seconds: the copy's bytes "
                   "are written in it too)",
    "background": "a Manager save's wait_until_finished after it returned (local write, pushes, persistent copy, "
                  "retention), the slowest rank's per save; tier_reads_of_state: the bytes its ckptio-tiers thread read "
                  "(/proc/self/task/<tid>/io rchar, which counts read, pread, sendfile and copy_file_range alike) over "
                  "the rank's state, median over ranks and saves",
    "peer": "the last node's local root deleted, every rank relaunched (an untimed 1 MiB ckptio.save and load first: "
            "the first I/O call of a process sets up the engine): m.restore() timed on each rank; its ranks fetch "
            "their parts from the other node's root (tmpfs), the others load their own",
    "persistent": "every local root deleted, the persistent files fsynced and dropped from the page cache "
                  "(posix_fadvise DONTNEED, residency counted after with mincore), every rank relaunched: m.restore()",
    "job": "the whole job's restore time: the slowest rank's m.restore() wall time; its breakdown is that rank's "
           "last_restore['seconds']",
}  # fmt: skip


def summarize_rounds(rounds: list[dict[str, Any]], a: argparse.Namespace) -> dict[str, Any]:
    """Medians over rounds: the job's stall (slowest rank), replication rate, restore times of
    the lost node's ranks and of the job, and the targets."""
    if not rounds:
        return {}
    lost = rounds[0]["lost_node"]
    s: dict[str, Any] = {}
    for kind in ("manager", "async"):
        # Per save (every round's a.saves of each kind), the job's stall: its slowest rank's.
        job = [max(d[kind][i]["stall_s"] for d in rr["save"]) for rr in rounds for i in range(a.saves)]
        s[f"{kind}_stall_s"] = round(med(job), 4)
        s[f"{kind}_stall_s_runs"] = [round(x, 4) for x in job]
        s[f"{kind}_stall_s_per_rank"] = [round(med([x["stall_s"] for rr in rounds for x in rr["save"][k][kind]]), 4)
                                         for k in range(a.ranks)]  # fmt: skip
    saves = [x["last_save"] or {} for rr in rounds for d in rr["save"] for x in d["manager"]]
    own = [max((d["manager"][i]["last_save"] or {}).get("stall_s", 0.0) for d in rr["save"]) for rr in rounds for i in range(a.saves)]
    s["manager_own_stall_s"] = round(med(own), 4)  # last_save["stall_s"], the slowest rank's per save
    rates = [x["replicate_bytes"] / x["replicate_s"] / 1e9 for x in saves if x.get("replicate_s")]
    s["replicate_gbps"] = round(med(rates), 4)
    s["replicate_gbps_runs"] = [round(x, 4) for x in rates]
    s["replicate_bytes_per_rank"] = med([x.get("replicate_bytes", 0) for x in saves])
    for k in ("stall_s", "local_s", "replicate_s", "persist_s"):
        xs = [x[k] for x in saves if isinstance(x.get(k), (int, float))]
        s[f"last_save_{k}"] = round(med(xs), 4) if xs else None
    s["save_errors"] = sorted({e for x in saves for e in x.get("errors", [])})
    # The background of a Manager save (local write, pushes, persistent copy, retention): the
    # job's slowest rank's, per save; and what its job thread read, over the rank's state.
    bg = [max(d["manager"][i]["background_s"] for d in rr["save"]) for rr in rounds for i in range(a.saves)]
    s["manager_background_s"] = round(med(bg), 4)
    s["manager_background_s_runs"] = [round(x, 4) for x in bg]
    reads = [x["tier_read_bytes"] / d["bytes"] for rr in rounds for d in rr["save"] for x in d["manager"]
             if x.get("tier_read_bytes") is not None and d.get("bytes")]  # fmt: skip
    s["tier_reads_of_state"] = round(med(reads), 3) if reads else None
    s["stall_x_async"] = round(s["manager_stall_s"] / s["async_stall_s"], 3) if s["async_stall_s"] else 0.0
    # Each Manager save against the save_async next to it (same round, same pair).
    s["stall_x_async_pairs"] = [round(x / y, 3) if y else 0.0 for x, y in zip(s["manager_stall_s_runs"], s["async_stall_s_runs"], strict=True)]
    s["stall_target"] = f"<= {TARGET_STALL_X_ASYNC}x save_async"
    s["stall_met"] = s["stall_x_async"] <= TARGET_STALL_X_ASYNC
    for kind in ("peer", "persistent"):
        s[kind] = restore_summary([rr for rr in rounds if rr[kind]], kind, lost)
        s[kind]["errors"] = [rr[kind + "_error"].splitlines()[0] for rr in rounds if rr.get(kind + "_error")]
    pl, ql = s["persistent"].get("lost_node_s_rounds"), s["peer"].get("lost_node_s_rounds")
    if pl and ql and len(pl) == len(ql) == len(rounds):
        s["persistent_x_peer"] = round(s["persistent"]["lost_node_s"] / s["peer"]["lost_node_s"], 3)
        s["persistent_x_peer_rounds"] = [round(p / q, 3) for p, q in zip(pl, ql, strict=True)]
    else:
        s["persistent_x_peer"], s["persistent_x_peer_rounds"] = None, []
    s["restore_target"] = f"persistent_s / peer_s >= {TARGET_PERSISTENT_X_PEER} for the ranks of {lost}"
    s["restore_met"] = s["persistent_x_peer"] is not None and s["persistent_x_peer"] >= TARGET_PERSISTENT_X_PEER
    fr = [rr["persistent_cache"]["resident_fraction"] for rr in rounds]
    s["persistent_cache"] = (f"cold for this machine: fsync + posix_fadvise DONTNEED per file, then {max(fr):.1%} of their pages "
                             "resident at most (mincore); a cache below a virtual disk, on its host, is beyond reach")
    if a.raw_size:
        s["raw_write_gbps"] = round(med([rr["raw_write_gbps"] for rr in rounds]), 4)
        s["raw_read_gbps"] = round(med([rr["raw_read_gbps"] for rr in rounds]), 4)
    return s


def restore_summary(rounds: list[dict[str, Any]], kind: str, lost: str) -> dict[str, Any]:
    """One kind of restore ("peer", "persistent") over the rounds where it ran: the lost node's
    ranks' time (the slowest of them) and breakdown, the job's (the slowest rank's), sources,
    copies that failed, and whether every byte came back as saved."""
    if not rounds:
        return {"rounds": 0}
    out: dict[str, Any] = {"rounds": len(rounds)}

    def secs(d: dict[str, Any]) -> dict[str, float]:
        return {k: float(v) for k, v in ((d["last_restore"] or {}).get("seconds") or {}).items()}

    lost_s = [max(d["restore_s"] for d in rr[kind] if d["node"] == lost) for rr in rounds]
    out["lost_node_s"], out["lost_node_s_rounds"] = round(med(lost_s), 4), [round(x, 4) for x in lost_s]
    out["lost_node_breakdown"] = {k: round(med([max(secs(d).get(k, 0.0) for d in rr[kind] if d["node"] == lost)
                                                for rr in rounds]), 4) for k in (*BREAKDOWN, "total")}  # fmt: skip
    slow = [max(rr[kind], key=lambda d: d["restore_s"]) for rr in rounds]
    out["job_s"], out["job_s_rounds"] = round(med([d["restore_s"] for d in slow]), 4), [round(d["restore_s"], 4) for d in slow]
    out["job_breakdown"] = {k: round(med([secs(d).get(k, 0.0) for d in slow]), 4) for k in (*BREAKDOWN, "total")}
    out["slowest_rank_rounds"] = [d["rank"] for d in slow]
    srcs: dict[str, dict[str, int]] = {}
    for rr in rounds:
        for d in rr[kind]:
            src = str((d["last_restore"] or {}).get("source"))
            srcs.setdefault(d["node"], {})[src] = srcs.get(d["node"], {}).get(src, 0) + 1
    out["sources"] = srcs
    out["bytes_per_rank"] = med([float((d["last_restore"] or {}).get("bytes", 0)) for rr in rounds for d in rr[kind]])
    out["failed"] = [f for rr in rounds for d in rr[kind] for f in (d["last_restore"] or {}).get("failed", [])]
    out["exact"] = all(d["crc_ok"] for rr in rounds for d in rr[kind])
    out["steps"] = sorted({(d["last_restore"] or {}).get("step") for rr in rounds for d in rr[kind]}, key=str)
    return out


def round_line(rec: dict[str, Any], a: argparse.Namespace) -> str:
    lost = rec["lost_node"]
    st = {k: med([max(d[k][i]["stall_s"] for d in rec["save"]) for i in range(a.saves)]) for k in ("manager", "async")}
    res = {k: f"{max(d['restore_s'] for d in rec[k] if d['node'] == lost):.2f} s" if rec[k] else "FAILED"
           for k in ("peer", "persistent")}  # fmt: skip
    return (f"tier round {rec['round']}: stall Manager {st['manager']:.3f} s, save_async {st['async']:.3f} s; "
            f"{lost}'s restore from peer {res['peer']}, from persistent {res['persistent']}")  # fmt: skip


def bd(x: dict[str, float]) -> str:
    return " + ".join(f"{k} {x.get(k, 0.0):.2f}" for k in BREAKDOWN) + f" (total {x.get('total', 0.0):.2f} s)"


def summarize(doc: dict[str, Any]) -> str:
    s, a = doc["summary"], doc["args"]
    if not s:
        return "\ntier cell: no rounds"
    lost = doc["rounds"][0]["lost_node"]
    lines = [
        f"\nPeer-tier cell: {a['ranks']} ranks as {a['nodes']} simulated nodes, {human(a['size'])} float32 in all "
        f"({human(a['size'] // a['ranks'])} per rank, {a['tensors']} tensors), replicas={a['replicas']}, local roots "
        f"in {doc['machine']['local_base']}, persistent tier in {doc['machine']['dir']}; medians of {a['rounds']} rounds"
        + (f"; raw device write {s['raw_write_gbps']:.2f} / read {s['raw_read_gbps']:.2f} GB/s" if "raw_write_gbps" in s else ""),
        (f"  {'save stall (slowest rank)':42s} Manager(local=).save {s['manager_stall_s']:.3f} s, save_async "
         f"{s['async_stall_s']:.3f} s: {s['stall_x_async']:.2f}x (target {s['stall_target']}: {'met' if s['stall_met'] else 'MISSED'}; "
         f"each pair {' '.join(f'{x:.2f}' for x in s['stall_x_async_pairs'])})"),
        (f"  {'after the stall (per rank, medians)':42s} local write {fmt(s['last_save_local_s'])}, replication "
         f"{fmt(s['last_save_replicate_s'])}, persistent copy {fmt(s['last_save_persist_s'])}"),
        (f"  {'background of a save (slowest rank)':42s} {s['manager_background_s']:.3f} s; the job thread read "
         + (f"{s['tier_reads_of_state']:.2f}x the rank's state" if s.get("tier_reads_of_state") is not None else "(no /proc figure)")),
        (f"  {'replication rate per byte':42s} {s['replicate_gbps']:.3f} GB/s (replicate_bytes / replicate_s, "
         f"{human(int(s['replicate_bytes_per_rank']))} per rank)"),
    ]  # fmt: skip
    p, q = s["peer"], s["persistent"]
    for what, x in ((f"{lost} lost: its ranks restore from the peer", p), ("every local tier lost: from persistent", q)):
        lines.append(f"  {what:42s} " + (f"{x['lost_node_s']:.3f} s: {bd(x['lost_node_breakdown'])}" if x["rounds"] else "FAILED")
                     + (f"; {len(x['errors'])} failed launches: {x['errors'][0]}" if x["errors"] else ""))  # fmt: skip
    lines.append(f"  {'page cache of the persistent files':42s} {s['persistent_cache']}")
    if s["persistent_x_peer"] is not None:
        lines.append(f"  {'persistent / peer for ' + lost + ' ranks':42s} {s['persistent_x_peer']:.2f}x (rounds "
                     f"{' '.join(f'{v:.2f}' for v in s['persistent_x_peer_rounds'])}; target >= {TARGET_PERSISTENT_X_PEER}: "
                     f"{'met' if s['restore_met'] else 'MISSED'})")  # fmt: skip
    else:
        lines.append(f"  {'persistent / peer for ' + lost + ' ranks':42s} not measured: a restore failed (target MISSED)")
    for what, x in (("job restore, peer (slowest rank)", p), ("job restore, persistent (slowest rank)", q)):
        if x["rounds"]:
            srcs = "; ".join(f"{n}: " + ", ".join(f"{k} x{c}" for k, c in v.items()) for n, v in x["sources"].items())
            lines.append(f"  {what:42s} {x['job_s']:.3f} s: {bd(x['job_breakdown'])}; sources {srcs}; "
                         f"every byte as saved: {x['exact']}")  # fmt: skip
    if s["save_errors"] or p.get("failed") or q.get("failed"):
        lines.append(f"  errors: save {s['save_errors'][:2]}, restore {(p.get('failed', []) + q.get('failed', []))[:2]}")
    if not s["stall_met"]:
        lines.append(f"  stall MISSED: median of the pairs {med(s['stall_x_async_pairs']):.2f}x; where it goes: the tiers' own "
                     f"last_save['stall_s'] {s['manager_own_stall_s']:.3f} s of the call's {s['manager_stall_s']:.3f} s "
                     f"(slowest rank, median), against save_async's {s['async_stall_s']:.3f} s")  # fmt: skip
    if not s["restore_met"] and p["rounds"] and q["rounds"]:
        pb, qb = p["lost_node_breakdown"], q["lost_node_breakdown"]
        lines.append("  restore MISSED: where the seconds go, peer vs persistent: "
                     + ", ".join(f"{k} {pb.get(k, 0):.2f} vs {qb.get(k, 0):.2f}" for k in BREAKDOWN))  # fmt: skip
    return "\n".join(lines)


def fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f} s"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", default="1G", help="bytes of state in all, split evenly over the ranks")
    ap.add_argument("--tensors", type=int, default=4, help="float32 tensors per rank")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--nodes", type=int, default=2, help="simulated nodes (CKPTIO_NODE n0, n1, ...), ranks in blocks")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="rounds (figures are medians), each with fresh ranks and tiers")
    ap.add_argument("--saves", type=int, default=3, help="timed pairs of saves (Manager, save_async) per round")
    ap.add_argument("--raw-size", default="1G", help="file size of each round's raw device measurement in --dir ('0': none)")
    ap.add_argument("--dir", default=os.path.join(ROOT, "bench-data", "tier"), help="the persistent tier's disk directory (removed afterwards if made)")
    ap.add_argument("--local-base", default="/dev/shm", help="where the nodes' local roots go (a folder of the cell's own, removed afterwards)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one launch of the ranks may take before all are killed")
    ap.add_argument("--collective-timeout", type=float, default=300, help="the Manager's and gloo's timeout")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "tier-" + time.strftime("%Y%m%d")),
                    help="where tier-latest.json and a timestamped copy go ('' for nowhere)")  # fmt: skip
    ap.add_argument("--quiet", action="store_true")
    return ap


def write(doc: dict[str, Any], out: str) -> None:
    if out:
        print(f"results: {write_results(doc, out, 'tier-')}")


def main() -> None:
    if sys.argv[1:2] == ["rank"]:
        rank_main(sys.argv[2:])
        return
    a = parser().parse_args()
    doc = run(a)
    print(summarize(doc))
    write(doc, a.out)


if __name__ == "__main__":
    main()
