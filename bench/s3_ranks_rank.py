# SPDX-License-Identifier: Apache-2.0
"""One rank of the four-rank S3 cell (bench/s3_ranks.py launches WORLD_SIZE of them): saves and loads a Shard(0) DTensor state to s3:// with ckptio, torch DCP over s3torchconnector and DCP through ckptio's StorageWriter/Reader, timed between barriers, and writes what it measured as JSON."""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import sys
import time
import zlib
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))  # s3servers.py

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.tensor import DTensor, Shard, init_device_mesh  # noqa: E402

import mechanisms as M  # noqa: E402
import s3servers as S3  # noqa: E402
from common import reset_peak_rss, status_kib  # noqa: E402

MECHS = ("ckptio", "dcp-s3tc", "ckptio-dcp")
DTYPES = {"bf16": torch.bfloat16, "float32": torch.float32}
# Columns of every weight; each layer also has a bias of this many elements (a small tensor,
# 1/world of it per rank), as a model has.
COLS = 2048


def build_state(tensors: int, tensor_bytes: int, dtype: torch.dtype, mesh: Any, rank: int, world: int) -> dict[str, DTensor]:
    """``tensors`` weights of about ``tensor_bytes`` each (rows of COLS elements) and as many
    biases, all DTensors with Shard(0) over ``mesh``. Only this rank's rows are made; their
    values come from bench/mechanisms.py's N(0, 0.02) pool at an offset set by tensor and
    rank, so every run of the cell saves the same global state."""
    pool = M._pool()
    esize = torch.empty(0, dtype=dtype).element_size()
    rows = max(world, tensor_bytes // esize // COLS // world * world)
    k = rows // world
    st: dict[str, DTensor] = {}
    for i in range(tensors):
        for name, shape, full in ((f"layers.{i}.weight", (k, COLS), (rows, COLS)), (f"layers.{i}.bias", (COLS // world,), (COLS,))):
            loc = M._filled(shape, pool, 2 * i * world + rank + (name.endswith("bias") * world)).to(dtype)
            st[name] = DTensor.from_local(loc, mesh, [Shard(0)], run_check=False, shape=torch.Size(full),
                                          stride=torch.empty(full, device="meta").stride())  # fmt: skip
    return st


def empty_like_state(st: dict[str, DTensor]) -> dict[str, DTensor]:
    """The same layout over fresh, untouched memory: what a load is given, so that every
    mechanism pays for the pages it fills."""
    out = {}
    for k, v in st.items():
        loc = torch.empty_like(v.to_local())
        out[k] = DTensor.from_local(loc, v.device_mesh, v.placements, run_check=False, shape=v.shape, stride=v.stride())
    return out


def checksum(st: dict[str, Any]) -> str:
    """CRC-32 of this rank's local bytes, tensors in name order, with each name, shape and
    dtype: equal for two states only when this rank holds the same shards of the same values."""
    c = 0
    for k in sorted(st):
        v = st[k]
        loc = v.to_local() if isinstance(v, DTensor) else v
        c = zlib.crc32(f"{k}{tuple(loc.shape)}{loc.dtype}{tuple(v.shape)}{tuple(v.placements)}".encode(), c)
        c = zlib.crc32(memoryview(loc.contiguous().view(torch.uint8).numpy()), c)
    return f"{c:08x}"


def _s3tc_config() -> Any:
    """Path-style addressing, as a local server needs; the endpoint comes from
    AWS_ENDPOINT_URL, which the connector's client reads from the environment."""
    from s3torchconnector import S3ClientConfig

    return S3ClientConfig(force_path_style=True)


def _s3tc_writer(url: str, threads: int) -> Any:
    from s3torchconnector.dcp import S3StorageWriter

    return S3StorageWriter(S3.REGION, url, s3client_config=_s3tc_config(), thread_count=threads)


def _s3tc_reader(url: str) -> Any:
    from s3torchconnector.dcp import S3StorageReader

    return S3StorageReader(S3.REGION, url, s3client_config=_s3tc_config())


def server_cpu() -> float:
    """User + system seconds the S3 server (its pid in S3RANKS_SERVER_PID) has used so far,
    -1 where unknown: on one machine its work competes with the clients' for the cores."""
    try:
        with open(f"/proc/{int(os.environ['S3RANKS_SERVER_PID'])}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime
    except (KeyError, ValueError, OSError):
        return -1.0


def _cpu() -> tuple[float, float]:
    t = os.times()
    return t.user, t.system


def save(mech: str, st: dict[str, DTensor], url: str, pg: Any, a: argparse.Namespace) -> dict[str, Any]:
    """One save, timed from a barrier before the call to a barrier after it."""
    import ckptio

    rss0 = status_kib("VmRSS")
    hwm = reset_peak_rss()
    dist.barrier(pg)
    s0, c0, t0 = server_cpu(), _cpu(), time.perf_counter()
    if mech == "ckptio":
        ckptio.save(st, url, comm=pg)
    elif mech == "ckptio-dcp":
        from ckptio.torch.dcp import StorageWriter

        dcp.save(st, storage_writer=StorageWriter(url, process_group=pg), process_group=pg)
    else:
        dcp.save(st, storage_writer=_s3tc_writer(url, a.dcp_threads), process_group=pg)
    t1, c1 = time.perf_counter(), _cpu()
    dist.barrier(pg)
    t2, s2 = time.perf_counter(), server_cpu()
    return {"seconds": t2 - t0, "call_s": t1 - t0, "wait_s": t2 - t1, "cpu_s": sum(c1) - sum(c0), "cpu_user_s": c1[0] - c0[0],
            "cpu_sys_s": c1[1] - c0[1], "server_cpu_s": s2 - s0 if s0 >= 0 else -1,
            "rss_before_kib": rss0, "peak_rss_kib": status_kib("VmHWM") if hwm else -1}  # fmt: skip


def load(mech: str, st: dict[str, DTensor], want: str, url: str, pg: Any, a: argparse.Namespace) -> dict[str, Any]:
    """One load into fresh memory, timed from a barrier before the call to a barrier after
    it; then (untimed) this rank's checksum against the saved state's."""
    import ckptio

    target = empty_like_state(st)
    gc.collect()
    rss0 = status_kib("VmRSS")
    hwm = reset_peak_rss()
    dist.barrier(pg)
    s0, c0, t0 = server_cpu(), _cpu(), time.perf_counter()
    if mech == "ckptio":
        out = ckptio.load(url, like=target, comm=pg)
    elif mech == "ckptio-dcp":
        from ckptio.torch.dcp import StorageReader

        dcp.load(target, storage_reader=StorageReader(url), process_group=pg)
        out = target
    else:
        dcp.load(target, storage_reader=_s3tc_reader(url), process_group=pg)
        out = target
    t1, c1 = time.perf_counter(), _cpu()
    peak = status_kib("VmHWM") if hwm else -1
    dist.barrier(pg)
    t2, s2 = time.perf_counter(), server_cpu()
    got = checksum(out) if isinstance(out, dict) and set(out) == set(st) else "keys differ"
    del out, target
    gc.collect()
    return {"seconds": t2 - t0, "call_s": t1 - t0, "wait_s": t2 - t1, "cpu_s": sum(c1) - sum(c0), "cpu_user_s": c1[0] - c0[0],
            "cpu_sys_s": c1[1] - c0[1], "server_cpu_s": s2 - s0 if s0 >= 0 else -1,
            "rss_before_kib": rss0, "peak_rss_kib": peak, "checksum": got,
            "error": "" if got == want else f"rank checksum {got}, saved {want}"}  # fmt: skip


def remove(prefix: str) -> None:
    """Delete every object under ``prefix`` (rank 0, untimed), so that each save starts alike."""
    c = S3.boto3_client(os.environ["AWS_ENDPOINT_URL"])
    keys = S3.list_keys(c, S3.BUCKET, prefix)
    for i in range(0, len(keys), 1000):
        c.delete_objects(Bucket=S3.BUCKET, Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True})


def save_and_load(mech: str, st: dict[str, DTensor], want: str, prefix: str, pg: Any, rank: int,
                  a: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    """One save and one load of ``st`` with ``mech`` at a fresh key under ``prefix``, whose
    objects are deleted again once every rank is done with them. An exception in one rank's
    save or load is recorded, not raised, so that the other mechanisms still run (a rank
    whose peers failed then fails too, at the next collective, naming them)."""
    url = f"s3://{S3.BUCKET}/{prefix}/ckpt"
    gc.collect()
    try:
        sv = save(mech, st, url, pg, a)
    except Exception as e:  # noqa: BLE001 (reported as this mechanism's result)
        sv = {"error": f"{type(e).__name__}: {str(e)[:600]}"}
    if "error" in sv:
        ld: dict[str, Any] = {"error": "not loaded: the save failed"}
    else:
        try:
            ld = load(mech, st, want, url, pg, a)
        except Exception as e:  # noqa: BLE001
            ld = {"error": f"{type(e).__name__}: {str(e)[:600]}"}
    dist.barrier(pg)
    if rank == 0:
        remove(prefix + "/")
    dist.barrier(pg)
    return sv, ld


def one_round(r: int, mechs: list[str], st: dict[str, DTensor], want: str, pg: Any, rank: int,
              a: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    """Round ``r``: every mechanism saves and loads once, starting one further along the list
    each round, so that none always runs first (or right after another's cleanup)."""
    k = r % len(mechs)
    rnd: dict[str, Any] = {"loadavg_before": os.getloadavg(), "order": mechs[k:] + mechs[:k]}
    for m in rnd["order"]:
        sv, ld = save_and_load(m, st, want, f"{a.prefix}/{r}-{m}", pg, rank, a)
        rnd[m] = {"save": sv, "load": ld}
    rnd["loadavg_after"] = os.getloadavg()
    return rnd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--tensor-bytes", type=int, default=16 << 20)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mechanisms", default=",".join(MECHS))
    ap.add_argument("--prefix", required=True, help="key prefix in the bucket for this launch")
    ap.add_argument("--dcp-threads", type=int, default=1, help="S3StorageWriter's thread_count")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a collective waits")
    ap.add_argument("--out", required=True, help="JSON file this rank writes")
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.timeout))
    pg = dist.group.WORLD
    mesh = init_device_mesh("cpu", (world,))
    mechs = [m for m in a.mechanisms.split(",") if m]
    dtype = DTYPES[a.dtype]

    # Untimed warm-up: imports, each client's first connections, the first collectives.
    warm = build_state(2, 1 << 20, dtype, mesh, rank, world)
    wsum = checksum(warm)
    for m in mechs:
        sv, ld = save_and_load(m, warm, wsum, f"{a.prefix}/warm-{m}", pg, rank, a)
        if sv.get("error") or ld.get("error"):
            print(f"s3_ranks rank {rank}: {m} warm-up: {sv.get('error') or ld.get('error')}", file=sys.stderr, flush=True)
    del warm

    t = time.perf_counter()
    st = build_state(a.tensors, a.tensor_bytes, dtype, mesh, rank, world)
    want = checksum(st)
    local_bytes = sum(v.to_local().nbytes for v in st.values())
    doc: dict[str, Any] = {"rank": rank, "world": world, "build_s": time.perf_counter() - t, "checksum": want,
                           "local_bytes": local_bytes, "global_bytes": sum(v.numel() * v.element_size() for v in st.values()),
                           "tensors": len(st)}  # fmt: skip
    doc["rounds"] = [one_round(r, mechs, st, want, pg, rank, a) for r in range(a.runs)]
    dist.barrier(pg)
    with open(a.out, "w") as f:
        json.dump(doc, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
