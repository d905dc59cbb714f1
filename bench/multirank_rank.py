# SPDX-License-Identifier: Apache-2.0
"""One rank of the multi-rank cell (bench/multirank.py launches WORLD_SIZE of them): saves and cold-loads the same state with ckptio, torch DCP and DCP through ckptio.torch.dcp, timed between barriers, and writes what it measured as JSON."""

from __future__ import annotations

import argparse
import datetime
import gc
import glob
import json
import os
import resource
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.tensor import DTensor, Shard, init_device_mesh  # noqa: E402

import mechanisms as M  # noqa: E402
from common import raw_measure  # noqa: E402

MECHS = ("ckptio", "dcp", "ckptio-dcp")  # and "ckptio-direct" on request

# (what, start, end) of each step of ckptio's calls that Python sees: staging the tree, the C
# save_dist or read, and each collective the C library makes through the communicator.
TRACE: list[tuple[str, float, float]] = []


def _timed(obj: Any, attr: str, label: str) -> None:
    f = getattr(obj, attr)

    def wrapper(*args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return f(*args, **kw)
        finally:
            TRACE.append((label, t, time.perf_counter()))

    setattr(obj, attr, wrapper)


def trace_ckptio() -> None:
    """Time ckptio's steps from outside: the collectives mark the save's phases (the plan
    exchange, this rank's writes until it reports its manifest, the merge and publish)."""
    from ckptio import _core, _load
    from ckptio.ranks import _comm, _dist

    for op in ("barrier", "broadcast", "gather"):
        _timed(_comm.TorchCommunicator, op, op)
    _timed(_dist, "stage", "stage")
    _timed(_core, "save_dist", "save_dist")
    _timed(_load.Reader, "load", "read")


def spans(t0: float) -> list[list[Any]]:
    out = [[w, round(a - t0, 4), round(b - a, 4)] for w, a, b in TRACE]
    TRACE.clear()
    return out


def build_state(ntensors: int, tensor_bytes: int, layout: str, mesh: Any, rank: int, world: int) -> dict[str, Any]:
    """``ntensors`` bf16 tensors of ``tensor_bytes`` each, rows of 2048 elements, values from
    bench/mechanisms.py's N(0, 0.02) pool (a different offset per tensor, the same on every
    rank). ``replicated``: plain tensors, the whole state on every rank; ``shard0``: DTensors
    with Shard(0) over ``mesh``, each rank holding its rows."""
    pool = M._pool()
    cols = 2048
    rows = tensor_bytes // 2 // cols
    if rows % world:
        raise SystemExit(f"multirank: {rows} rows per tensor do not split over {world} ranks")
    st: dict[str, Any] = {}
    for i in range(ntensors):
        full = M._filled((rows, cols), pool, i + 1)
        if layout == "replicated":
            st[f"layers.{i}.weight"] = full
        else:
            k = rows // world
            local = full[rank * k : (rank + 1) * k].clone()
            del full
            st[f"layers.{i}.weight"] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
    return st


def empty_like_state(st: dict[str, Any]) -> dict[str, Any]:
    """The same layout with fresh, untouched memory (torch.empty): what a load is given, so that
    every mechanism pays for the pages it fills."""
    out: dict[str, Any] = {}
    for k, v in st.items():
        if isinstance(v, DTensor):
            loc = torch.empty_like(v.to_local())
            out[k] = DTensor.from_local(loc, v.device_mesh, v.placements, run_check=False, shape=v.shape, stride=v.stride())
        else:
            out[k] = torch.empty_like(v)
    return out


def local(v: Any) -> torch.Tensor:
    return v.to_local() if isinstance(v, DTensor) else v


def same(saved: dict[str, Any], loaded: Any) -> str:
    """'' when every tensor loaded equals the saved one (same layout, same bytes), else what differs."""
    if not isinstance(loaded, dict) or set(loaded) != set(saved):
        return f"keys differ: {sorted(set(saved) ^ set(loaded if isinstance(loaded, dict) else {}))[:4]}"
    for k, v in saved.items():
        w = loaded[k]
        if isinstance(v, DTensor) != isinstance(w, DTensor):
            return f"{k}: loaded as {type(w).__name__}, saved as {type(v).__name__}"
        if isinstance(v, DTensor) and (tuple(w.placements) != tuple(v.placements) or w.shape != v.shape):
            return f"{k}: loaded {w.placements} {tuple(w.shape)}, saved {v.placements} {tuple(v.shape)}"
        a, b = local(v), local(w)
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            return f"{k}: loaded bytes differ from the saved ones"
    return ""


def fsync_paths(paths: list[str]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def rank_files(mech: str, path: str, rank: int) -> list[str]:
    """The data files this rank wrote: ckptio's data/rNNNNN-*, DCP's __<rank>_*.distcp."""
    if mech in ("ckptio", "ckptio-dcp", "ckptio-direct"):
        return sorted(glob.glob(os.path.join(path, "data", f"r{rank:05d}-*")))
    return sorted(glob.glob(os.path.join(path, f"__{rank}_*.distcp")))


def save(mech: str, st: dict[str, Any], path: str, pg: Any, rank: int) -> dict[str, Any]:
    """One durable save, timed from a barrier before the call to a barrier after it."""
    rec: dict[str, Any] = {}
    dist.barrier(pg)
    TRACE.clear()
    t0 = time.perf_counter()
    if mech in ("ckptio", "ckptio-direct"):
        import ckptio

        stats = ckptio.save(st, path, comm=pg)  # fsyncs files and directories itself
        t1 = time.perf_counter()
        rec["trace"] = spans(t0)
        rec["stats"] = {"bytes": stats.bytes, "io_bytes": stats.io_bytes, "seconds": stats.seconds,
                        "io_seconds": stats.io_seconds, "backend": stats.backend, "direct": stats.direct}  # fmt: skip
        t2 = t1
    elif mech == "ckptio-dcp":
        from ckptio.torch.dcp import StorageWriter

        # Durable when dcp.save returns: ckptio fsyncs files and directories itself.
        dcp.save(st, storage_writer=StorageWriter(path, process_group=pg), process_group=pg)
        t1 = t2 = time.perf_counter()
    else:
        from torch.distributed.checkpoint import FileSystemWriter

        dcp.save(st, storage_writer=FileSystemWriter(path), process_group=pg)
        t1 = time.perf_counter()
        # FileSystemWriter fsyncs its data files (sync_files=True); durable also needs the
        # metadata file and the directories, which only rank 0 sees complete.
        own = rank_files(mech, path, rank)
        if rank == 0:
            own += [os.path.join(path, ".metadata"), path, os.path.dirname(os.path.abspath(path))]
        fsync_paths(own)
        t2 = time.perf_counter()
    dist.barrier(pg)
    t3 = time.perf_counter()
    files = rank_files(mech, path, rank)
    rec.update(seconds=t3 - t0, call_s=t1 - t0, fsync_s=t2 - t1, wait_s=t3 - t2,
               files=len(files), bytes_written=sum(os.path.getsize(f) for f in files))  # fmt: skip
    return rec


def load(mech: str, st: dict[str, Any], path: str, pg: Any) -> dict[str, Any]:
    """One cold load: every file of the checkpoint fsynced and dropped from the page cache on
    every rank, a barrier, then the time to a barrier after the load with every page touched."""
    M.evict(path)
    target = empty_like_state(st)
    gc.collect()
    dist.barrier(pg)
    TRACE.clear()
    from ckptio.ranks._share import storage_read

    read0 = storage_read()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    trace: list[list[Any]] = []
    if mech in ("ckptio", "ckptio-direct"):
        import ckptio

        # ckptio-direct: O_DIRECT even where the ranks would share the page cache.
        out = ckptio.load(path, like=target, comm=pg, **({"direct": True} if mech == "ckptio-direct" else {}))
        trace = spans(t0)
    elif mech == "ckptio-dcp":
        from ckptio.torch.dcp import StorageReader

        dcp.load(target, storage_reader=StorageReader(path), process_group=pg)
        out = target
    else:
        from torch.distributed.checkpoint import FileSystemReader

        dcp.load(target, storage_reader=FileSystemReader(path), process_group=pg)
        out = target
    t1 = time.perf_counter()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    device = storage_read() - read0 if read0 >= 0 else -1
    seen = M.touch([local(v) for v in out.values()], False)
    t2 = time.perf_counter()
    dist.barrier(pg)
    t3 = time.perf_counter()
    bad = same(st, out)
    del out, target
    gc.collect()
    return {"seconds": t3 - t0, "call_s": t1 - t0, "touch_s": t2 - t1, "wait_s": t3 - t2, "bytes_seen": seen, "error": bad, "trace": trace,
            "device_bytes": device,
            # CPU seconds of the call, all of this rank's threads: user, system (page faults).
            "cpu_user_s": ru1.ru_utime - ru0.ru_utime, "cpu_sys_s": ru1.ru_stime - ru0.ru_stime}  # fmt: skip


def save_and_load(mech: str, st: dict[str, Any], bench_dir: str, pg: Any, rank: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """One save and one cold load of ``st`` with ``mech`` into a fresh checkpoint under
    ``bench_dir``, removed again once every rank is done with it."""
    path = os.path.join(bench_dir, f"ckpt-{mech}")
    if rank == 0:
        M.remove(path)
        M.make_durable(bench_dir)
    gc.collect()
    sv = save(mech, st, path, pg, rank)
    ld = load(mech, st, path, pg)
    dist.barrier(pg)
    if rank == 0:
        M.remove(path)
    return sv, ld


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layout", choices=["replicated", "shard0"], required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--tensor-bytes", type=int, default=16 << 20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mechanisms", default=",".join(MECHS))
    ap.add_argument("--raw-size", type=int, default=1 << 30, help="raw device measurement before each round (0: none)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a collective waits")
    ap.add_argument("--out", required=True, help="JSON file this rank writes")
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.timeout))
    pg = dist.group.WORLD
    mesh = init_device_mesh("cpu", (world,)) if a.layout == "shard0" else None
    mechs = [m for m in a.mechanisms.split(",") if m]
    if "ckptio" in mechs:
        trace_ckptio()

    # Untimed warm-up: imports, the first collectives, each mechanism's first save and load.
    warm = build_state(2, 1 << 20, a.layout, mesh, rank, world)
    for m in mechs:
        p = os.path.join(a.dir, f"warm-{m}")
        save(m, warm, p, pg, rank)
        r = load(m, warm, p, pg)
        if r["error"]:
            raise SystemExit(f"multirank rank {rank}: {m} warm-up: {r['error']}")
        dist.barrier(pg)
        if rank == 0:
            M.remove(p)
    del warm

    t = time.perf_counter()
    st = build_state(a.tensors, a.tensor_bytes, a.layout, mesh, rank, world)
    doc: dict[str, Any] = {"rank": rank, "world": world, "layout": a.layout, "build_s": time.perf_counter() - t, "rounds": []}
    # One untimed full-size round first (kept in the JSON as "warm_round"): the first full-size
    # load after the state is built takes 3-7 s on every rank here, whichever mechanism runs
    # first (DCP's as much as ckptio's: 7.5 s against 3.3 s in its next round), then never
    # again. A cost of this VM, not of a loader: its balloon reports free 2 MiB blocks back to
    # the host (virtio-balloon free page reporting is on), and the first GiBs the guest takes
    # back fault on the host too (1 GiB of huge pages: 2.4 s the first time, 0.12 s by the
    # third; no reclaim or compaction counted in /proc/vmstat; bench/huge_pages.py). Without
    # this round, the rotation of mechanisms would charge it to whichever one round 0 starts
    # with.
    doc["warm_round"] = {}
    for m in mechs:
        sv, ld = save_and_load(m, st, a.dir, pg, rank)
        if ld["error"]:
            raise SystemExit(f"multirank rank {rank}: {m} warm round: {ld['error']}")
        doc["warm_round"][m] = {"save_s": sv["seconds"], "load_s": ld["seconds"]}
    for r in range(a.rounds):
        rnd: dict[str, Any] = {"loadavg_before": os.getloadavg()}
        if rank == 0 and a.raw_size:
            w, rd, _info = raw_measure(a.dir, a.raw_size)
            rnd["raw_write_gbps"], rnd["raw_read_gbps"] = w, rd
        order = mechs[r % len(mechs) :] + mechs[: r % len(mechs)]
        rnd["order"] = order
        for m in order:
            sv, ld = save_and_load(m, st, a.dir, pg, rank)
            rnd[m] = {"save": sv, "load": ld}
        rnd["loadavg_after"] = os.getloadavg()
        doc["rounds"].append(rnd)
    dist.barrier(pg)
    with open(a.out, "w") as f:
        json.dump(doc, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
