# SPDX-License-Identifier: Apache-2.0
"""The Manager's tiers: each rank's part in its node's local tier (host memory or local NVMe),
copies on peer nodes, every k-th step in the persistent directory; restore from the nearest
verified copy, the same step on every rank. The transport (servers, pushes, fetches, copies
published only once complete and verified) is the C engine's (ckptio_peer_*)."""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import os
import queue
import re
import secrets
import socket
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

from . import _core
from ._async import AsyncSave, _background_comm, _save_async
from ._errors import USAGE, CheckpointError, InvalidType, _from_code, error
from ._load import load
from ._options import params as _params
from ._options import store
from ._stage import is_url
from .ranks import _comm, _dist
from .ranks._comm import Communicator

__all__ = ["Tiers"]

_STEP = re.compile(r"0|[1-9][0-9]*")
_PART = re.compile(r"rank(0|[1-9][0-9]*)")
# In an object store a persistent part is "<step>.rank<R>": a checkpoint directly under the
# prefix, which is what an object store's listing of checkpoints finds.
_OBJ_PART = re.compile(r"(0|[1-9][0-9]*)\.rank(0|[1-9][0-9]*)")
_OBJ_RECORD = re.compile(r"(0|[1-9][0-9]*)\.record")
# A step's record, beside its parts: "<step>/record" (in an object store "<step>.record"), a
# checkpoint of no tensors whose metadata holds {"job", "step", "world", "time", "digests"}: the
# job's id, and the SHA-256 of each rank's manifest (ckptio_reader_digest) in that tier. It is
# written once the ranks agree the step is complete (in the persistent tier: complete there),
# committed as any checkpoint (whole or absent, its manifest checked when read). A restore
# takes a part only when its digest is the record's.
_RECORD_KEY = "ckptio_tier.record"
# The job's id: a checkpoint "ckptio-job" in the persistent tier, made by the job's first
# Manager. A restarted job reads it again; another job (another persistent tier) has its own.
_JOB_NAME = "ckptio-job"


def _retire(path: str) -> None:
    """Remove the part, or the step directory of parts, at ``path``: each part whole
    (ckptio_remove_checkpoint: out of every listing durably, then its data), then what killed
    saves left there (ckptio_sweep), then the emptied directory. A crash midway leaves whole
    parts, or leftovers the next sweep takes."""
    if _core.is_checkpoint(path):
        _core.remove_checkpoint(path)
        return
    try:
        for name in _core.list_checkpoints(path):
            _core.remove_checkpoint(os.path.join(path, name))
        _core.sweep(path)
        os.rmdir(path)
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as e:  # something that is no part of ours is there: it stays
        if e.errno != errno.ENOTEMPTY:
            raise


def _job_host(comm: Communicator | None) -> str | None:
    """The host of the job's rendezvous, which every rank reaches: JAX's coordinator, or
    MASTER_ADDR (torchrun, and the launchers that follow it); None when neither is known."""
    if isinstance(comm, _comm.JaxCommunicator):
        with contextlib.suppress(Exception):
            from jax._src import distributed

            addr = distributed.global_state.coordinator_address
            if addr:
                return str(addr).rsplit(":", 1)[0].strip("[]")
    return os.environ.get("MASTER_ADDR") or None


def _default_addr(comm: Communicator | None) -> str:
    """The address this rank's server listens on and the other ranks reach it at:
    CKPTIO_PEER_ADDR, else this host's address on the interface that routes to the job's
    rendezvous host (no packet is sent: a UDP socket is only connected), else the host name's.
    Never every interface: a server is reachable where the job talks, no further."""
    a = os.environ.get("CKPTIO_PEER_ADDR")
    if a:
        return a
    host = _job_host(comm)
    if host:
        with contextlib.suppress(OSError), socket.socket(
            socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM
        ) as s:
            s.connect((host, 9))
            return str(s.getsockname()[0])
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _private_dir(path: str) -> None:
    """Make ``path`` (and what is missing above it) a directory of its owner's only (0700),
    whatever the umask: what the tiers hold below it is no one else's to read."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if st.st_mode & 0o077 and st.st_uid == os.geteuid():
        os.chmod(path, 0o700)


def _rp(so: Any) -> dict[str, Any] | None:
    """A reader's parameters for a part in the store with settings ``so`` (a StoreOptions, or
    None: the environment's)."""
    return {"store": so} if so is not None else None


def _wp(so: Any, overwrite: bool = False) -> dict[str, Any]:
    """A writer's parameters, the same way."""
    p = _params({}, overwrite=overwrite)
    if so is not None:
        p["store"] = so
    return p


def _persist(src: str, dst: str, so: Any = None) -> None:
    """Copy the committed part ``src`` to ``dst`` on its own (the pushes' pass takes it where it
    can): a directory (ckptio_part_copy) or an object store URL (the convert engine, ckptio to ckptio: every block read is verified, the tree and
    metadata kept, the manifest written last)."""
    if is_url(dst):
        _core.convert(src, dst, {"from": "ckptio", "to": "ckptio", "overwrite": True,
                                 "progress": False, "dst_store": so})  # fmt: skip
    else:
        _core.part_copy(src, dst, False)


def _part_world(path: str, so: Any = None) -> int | None:
    """The number of ranks of the job that saved the part at ``path`` (None: no readable part)."""
    try:
        with _core.Reader(path, _rp(so)) as r:
            w = r.get_meta("ckptio_tier.world")
    except (OSError, CheckpointError):
        return None
    try:
        return int(w) if w is not None else None
    except ValueError:
        return None


def _digest(path: str, so: Any = None) -> str:
    """The SHA-256 of the manifest of the part at ``path`` (ckptio_reader_digest), in hex."""
    with _core.Reader(path, _rp(so)) as r:
        return r.digest().hex()


def _record_path(root: str, step: int) -> str:
    return f"{root}/{step}.record" if is_url(root) else os.path.join(root, str(step), "record")


def _write_record(path: str, rec: dict[str, Any], so: Any = None) -> None:
    """Commit ``rec`` at ``path`` as a checkpoint of no tensors (whole or absent), replacing
    an older one (in a local tier, inside its owner-only step folder)."""
    with _core.Writer(path, _wp(so, overwrite=True)) as w:
        w.set_meta(_RECORD_KEY, json.dumps(rec, sort_keys=True).encode())
        w.commit()


def _read_record(path: str, so: Any = None) -> dict[str, Any] | None:
    """The record at ``path``, or None (none there, or not one that reads back whole)."""
    try:
        with _core.Reader(path, _rp(so)) as r:
            raw = r.get_meta(_RECORD_KEY)
        rec = json.loads(raw) if raw is not None else None
    except (OSError, CheckpointError, ValueError):
        return None
    ok = (isinstance(rec, dict) and isinstance(rec.get("step"), int)
          and isinstance(rec.get("digests"), list) and isinstance(rec.get("world"), int)
          and isinstance(rec.get("time"), (int, float)))  # fmt: skip
    return rec if ok else None


def _records_in(root: str, job: str, world: int, others: list[int] | None = None,
                so: Any = None) -> dict[int, Any]:
    """{step: record} of the records under ``root`` that job ``job`` of ``world`` ranks
    wrote; the steps of records written by another job (or of another size) are appended to
    ``others``."""
    out: dict[int, Any] = {}
    if is_url(root):
        steps = [int(m.group(1)) for n in _core.list_checkpoints(root, so)
                 if (m := _OBJ_RECORD.fullmatch(n))]  # fmt: skip
    else:
        try:
            steps = [int(n) for n in os.listdir(root) if _STEP.fullmatch(n)]
        except FileNotFoundError:
            steps = []
    for st in steps:
        rec = _read_record(_record_path(root, st), so)
        if rec is None:
            continue
        if rec.get("job") == job and rec["world"] == world and rec["step"] == st \
                and len(rec["digests"]) == world:  # fmt: skip
            out[st] = rec
        elif others is not None:
            others.append(st)
    return out


def _job_id(directory: str, so: Any = None) -> str:
    """This job's id (see _JOB_NAME): read from the persistent tier, or made there."""
    path = f"{directory}/{_JOB_NAME}" if is_url(directory) else os.path.join(directory, _JOB_NAME)
    rec = None
    with contextlib.suppress(OSError, CheckpointError, ValueError):
        with _core.Reader(path, _rp(so)) as r:
            raw = r.get_meta("ckptio_tier.job")
        rec = raw.decode() if raw else None
    if rec:
        return rec
    job = secrets.token_hex(16)
    try:
        with _core.Writer(path, _wp(so)) as w:  # never replaces one made meanwhile
            w.set_meta("ckptio_tier.job", job.encode())
            w.commit()
    except CheckpointError as e:
        if e.name != "CKPTIO_E_EXISTS":
            raise
        with _core.Reader(path, _rp(so)) as r:  # another Manager of this job made it first
            return (r.get_meta("ckptio_tier.job") or b"").decode() or job
    return job


def _steps_in(root: str, world: int | None = None, so: Any = None) -> dict[int, list[int]]:
    """{step: [ranks whose committed part is under root/<step>/]}; with ``world``, only the
    parts a job of that many ranks saved (each part is one rank's state: a job of another size
    must not take them for its own)."""
    out: dict[int, list[int]] = {}
    if is_url(root):
        for name in _core.list_checkpoints(root, so):
            m = _OBJ_PART.fullmatch(name)
            if m and (world is None or _part_world(f"{root}/{name}", so) == world):
                out.setdefault(int(m.group(1)), []).append(int(m.group(2)))
        return {k: sorted(v) for k, v in out.items()}
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return out
    for s in names:
        if not _STEP.fullmatch(s):
            continue
        try:
            parts = os.listdir(os.path.join(root, s))
        except (FileNotFoundError, NotADirectoryError):
            continue
        ranks = []
        for p in parts:
            m = _PART.fullmatch(p)
            path = os.path.join(root, s, p)
            if m is None or not _core.is_checkpoint(path):
                continue
            if world is not None and _part_world(path) != world:
                continue
            ranks.append(int(m.group(1)))
        if ranks:
            out[int(s)] = sorted(ranks)
    return out


def _remove_step(root: str, step: int, so: Any = None) -> None:
    """Remove root/<step> (_retire). In an object store, each part of the step goes whole (its
    manifest first)."""
    if is_url(root):
        for name in _core.list_checkpoints(root, so):
            m = _OBJ_PART.fullmatch(name) or _OBJ_RECORD.fullmatch(name)
            if m and int(m.group(1)) == step:
                _core.remove_checkpoint(f"{root}/{name}", so)
        return
    _retire(os.path.join(root, str(step)))


def _sweep(root: str) -> None:
    """Remove what dead processes left under root: step directories being removed, and
    unfinished parts (<step>/rank<R>.tmp-<pid>.<n>), by ckptio_sweep's rules."""
    _core.sweep(root)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    for n in names:
        if _STEP.fullmatch(n) and os.path.isdir(os.path.join(root, n)):
            _core.sweep(os.path.join(root, n))


def _places(all_: list[dict[str, Any]], order: list[str] | None = None) -> dict[tuple[str, str], int]:
    """A place is a local root of a node, named by the lowest rank using it (``all_``: every
    rank's {"rank", "node", "root", "held"}); places in node order."""
    nodes = order if order is not None else sorted({a["node"] for a in all_})
    places: dict[tuple[str, str], int] = {}
    for a in sorted(all_, key=lambda a: (nodes.index(a["node"]), a["rank"])):
        places.setdefault((a["node"], a["root"]), a["rank"])
    return places


def _holders(all_: list[dict[str, Any]],
             order: list[str] | None = None) -> dict[int, dict[int, list[int]]]:  # fmt: skip
    """holders[step][rank]: the places (_places) holding that rank's part of that step."""
    places = _places(all_, order)
    holders: dict[int, dict[int, list[int]]] = {}
    for a in all_:
        if places[(a["node"], a["root"])] != a["rank"]:
            continue  # the same root as a lower rank reported
        for st, rs in a["held"].items():
            for r in rs:
                holders.setdefault(int(st), {}).setdefault(int(r), []).append(a["rank"])
    return holders


def _bg_comm(c: Communicator) -> Any:
    """The background counterpart of ``c`` that async saves use, or None (MPI below
    MPI_THREAD_MULTIPLE: the agreement then runs in the next save() call)."""
    if isinstance(c, _comm.MPICommunicator) and c._MPI.Query_thread() < c._MPI.THREAD_MULTIPLE:
        return None
    return _background_comm(c)


# ---- DTensors: the local tier holds each rank's own shards ----


def _is_dtensor(x: Any) -> bool:
    t = type(x)
    return t.__name__ == "DTensor" and t.__module__.startswith("torch.distributed")


def _localize(tree: Any) -> Any:
    """``tree`` with each DTensor replaced by its local shard and each jax array spanning
    processes by the list of this process's shards (this rank's part)."""
    if _is_dtensor(tree):
        return tree.to_local()
    if _dist._is_global_jax(tree):
        return [s.data for s in tree.addressable_shards]
    if isinstance(tree, Mapping):
        return type(tree)((k, _localize(v)) for k, v in tree.items())
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        return type(tree)(_localize(v) for v in tree)
    return tree


def _globalize(got: Any, like: Any) -> Any:
    """``got`` (loaded with _localize(like)) with like's DTensors rebuilt around their shards."""
    if _is_dtensor(like):
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(got, like.device_mesh, like.placements, run_check=False,
                                  shape=like.shape, stride=like.stride())  # fmt: skip
    if _dist._is_global_jax(like):
        import jax

        shards = like.addressable_shards
        return jax.make_array_from_single_device_arrays(like.shape, like.sharding,
            [jax.device_put(g, s.device) for g, s in zip(got, shards)])  # fmt: skip
    if isinstance(like, Mapping) and isinstance(got, Mapping):
        return type(got)({k: _globalize(v, like[k]) if k in like else v for k, v in got.items()})
    if isinstance(like, (list, tuple)) and isinstance(got, (list, tuple)) and len(like) == len(got):
        return type(got)(_globalize(g, l) for g, l in zip(got, like))
    return got


def _decide_saved(all_: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank 0's verdict on the ranks' reports of a save: the step if it is complete for the
    whole job (every rank wrote and replicated its part), and if complete in the persistent
    tier."""
    steps = {a["step"] for a in all_}
    if len(steps) != 1 or None in steps:
        return {"complete": None, "persisted": None, "time": time.time(), "digests": None,
                "pdigests": None}  # fmt: skip
    s = all_[0]["step"]
    whole = all(a["local"] and a["replicated"] and a["digest"] for a in all_)
    pers = all(a["persisted"] and a["pdigest"] for a in all_)
    return {"complete": s if whole else None, "persisted": s if pers else None, "time": time.time(),
            "digests": [a["digest"] for a in all_] if whole else None,
            "pdigests": [a["pdigest"] for a in all_] if pers else None}  # fmt: skip


class _Job:
    """The background part of one save on this rank: the local write's commit, the pushes to
    the peers, the persistent copy. One Python thread sequences these C calls."""

    def __init__(self, step: int, handle: AsyncSave, complete: int | None,
                 persisted: int | None) -> None:  # fmt: skip
        self.step = step
        self.handle = handle
        # What was known complete when the save began: what its retention may rely on.
        self.complete = complete
        self.persisted = persisted
        self.report: dict[str, Any] = {"step": step, "stall_s": 0.0, "local_s": None,
            "replicate_s": 0.0, "replicate_bytes": 0, "replicated_to": [], "persist_s": None,
            "errors": []}  # fmt: skip
        self.local_ok = False
        self.replicated_ok = False
        self.persisted_ok: bool | None = None  # None: not a persisted save
        self.digest: str | None = None  # of the local part's manifest, once committed
        self.pdigest: str | None = None  # of the persistent part's
        self.settled = False  # the ranks agreed on it (and its records are written)
        self.error: BaseException | None = None  # the local save's: raised by wait
        self.agreed: dict[str, Any] | None = None  # the ranks' verdict, from the job's thread
        self.done = threading.Event()
        self.waited = False  # finish() took its outcome


class Tiers:
    """One rank's view of the tiers of a Manager (see Manager's ``local=``)."""

    def __init__(
        self,
        directory: str,
        local: Any,
        comm: Communicator | None,
        *,
        replicas: int,
        persist_every: int | None,
        local_keep: int,
        keep: int | None,
        node: str | None,
        timeout: float,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        for name, v, lo in (("replicas", replicas, 0), ("local_keep", local_keep, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise error(USAGE, f"{name} must be an int >= {lo}, got {v!r}", InvalidType)
        if persist_every is not None and (not isinstance(persist_every, int)
                                          or isinstance(persist_every, bool) or persist_every < 1):
            raise error(USAGE, f"persist_every must be None or an int >= 1, got {persist_every!r}",
                        InvalidType)  # fmt: skip
        self.directory = directory
        # The persistent tier's store settings (storage_options): an object store's endpoint
        # and credentials, for every part, record and listing there.
        self.storage_options = storage_options
        self.store = store(storage_options)
        self.local = os.path.abspath(os.fspath(local))
        self.comm = comm
        self.rank = comm.rank if comm is not None else 0
        self.size = comm.size if comm is not None else 1
        self.replicas = replicas
        self.persist_every = persist_every
        self.local_keep = local_keep
        self.keep = keep
        self.timeout = timeout
        self.node = node or os.environ.get("CKPTIO_NODE") or socket.gethostname()
        self.max_rate = int(os.environ.get("CKPTIO_PEER_MAX_RATE", "0") or 0)
        _private_dir(self.local)
        if not is_url(self.directory):
            os.makedirs(self.directory, exist_ok=True)
        # The job's key, drawn by rank 0 and sent over the job's communicator: every
        # connection between two ranks' peer tiers proves both hold it (ckptio_peer_*). It is
        # kept in this object only, never written or printed. The job's id comes with it.
        first: dict[str, Any] = {}
        if self.rank == 0:
            try:
                first = {"job": _job_id(self.directory, self.store), "key": secrets.token_hex(32)}
            except (OSError, CheckpointError) as e:
                first = {"error": f"rank 0 cannot read or make the job's id in '{directory}': {e}"}
        if comm is not None and self.size > 1:
            data = json.dumps(first).encode() if self.rank == 0 else None
            first = json.loads(comm.broadcast(0, data, self.timeout))
        if "error" in first:
            raise _from_code(-errno.EIO, "EIO", str(first["error"]))
        self.job_id: str = first["job"]
        self._key: bytes = bytes.fromhex(first["key"])
        del first
        addr = _default_addr(comm)
        self.server: Any = None  # a job of one process has no peers to serve
        if self.size > 1:
            self.server = _core.PeerServer(self.local, addr,
                                           int(os.environ.get("CKPTIO_PEER_PORT", "0")), self._key)
        others: list[int] = []
        me = {"rank": self.rank, "node": self.node, "addr": addr,
              "port": self.server.port if self.server else 0, "root": self.local,
              "held": _steps_in(self.local),
              "records": _records_in(self.local, self.job_id, self.size, others)}  # fmt: skip
        directory, size, job_id, so = self.directory, self.size, self.job_id, self.store

        def exchange(all_: list[dict[str, Any]]) -> dict[str, Any]:
            # The addresses, and the newest steps complete on disk when the job (re)starts:
            # what the first save's retention may rely on (a step counts only with its record).
            holders = _holders(all_)
            recorded = {int(s) for a in all_ for s in a["records"]}
            pers_recs = _records_in(directory, job_id, size, so=so)
            pers = _steps_in(directory, so=so)
            whole = [s for s in recorded | set(pers_recs)
                     if all(holders.get(s, {}).get(r) or r in pers.get(s, []) for r in range(size))]
            return {"peers": [{k: a[k] for k in ("rank", "node", "addr", "port", "root")}
                              for a in all_],
                    "complete": max(whole, default=None),
                    "persisted": max((s for s in pers_recs if len(set(pers.get(s, []))) >= size),
                                     default=None)}  # fmt: skip

        known = self._decide(me, exchange)
        self.peers: list[dict[str, Any]] = known["peers"]
        # The communicator of the background jobs' agreement (made now: collective the first
        # time), or None where the runtime allows no collectives off the caller's thread.
        self.bg: Any = _bg_comm(comm) if comm is not None and self.size > 1 else None
        self.nodes = sorted({p["node"] for p in self.peers})
        self.node_ranks = {n: sorted(p["rank"] for p in self.peers if p["node"] == n)
                           for n in self.nodes}  # fmt: skip
        self.leader = self.node_ranks[self.node][0] == self.rank  # tends the node's root
        # writes the step records of its root: the lowest rank using it
        self.recorder = _places(self.peers, self.nodes)[(self.node, self.local)] == self.rank
        self.targets = self._targets()
        self.saves = 0
        self.complete: int | None = known["complete"]  # newest step complete for the whole job
        self.persisted: int | None = known["persisted"]  # ... and in the persistent tier
        self.job: _Job | None = None
        self.queue: queue.SimpleQueue[_Job] | None = None  # the job thread's
        self.queue_pid = 0
        self.last_save: dict[str, Any] | None = None
        self.last_restore: dict[str, Any] | None = None
        _LIVE.add(self)
        if self.leader:
            _sweep(self.local)
        if self.rank == 0 and not is_url(self.directory):
            _sweep(self.directory)

    # ---- collectives (the caller's thread) ----
    def _decide(self, obj: Any, fn: Any, comm: Any = None) -> Any:
        """Gather ``obj`` from every rank to rank 0 (over ``comm``, default the Manager's),
        which computes fn(list); every rank gets the result."""
        c = comm if comm is not None else self.comm
        if c is None or self.size == 1:  # the same JSON round trip as several ranks
            return json.loads(json.dumps(fn(json.loads(json.dumps([obj])))))
        got = c.gather(0, json.dumps(obj).encode(), self.timeout)
        data = json.dumps(fn([json.loads(g) for g in got])).encode() if got is not None else None
        return json.loads(c.broadcast(0, data, self.timeout))

    def _targets(self) -> list[dict[str, Any]]:
        """The ranks this rank's part is pushed to: on the next ``replicas`` nodes, the rank at
        this rank's position among its node's ranks (modulo that node's count)."""
        i = self.nodes.index(self.node)
        pos = self.node_ranks[self.node].index(self.rank)
        out = []
        for k in range(1, min(self.replicas, len(self.nodes) - 1) + 1):
            ranks = self.node_ranks[self.nodes[(i + k) % len(self.nodes)]]
            out.append(self.peers[ranks[pos % len(ranks)]])
        return out

    # ---- listing ----
    def persistent_steps(self) -> list[int]:
        return sorted(s for s, rs in _steps_in(self.directory, self.size, self.store).items()
                      if len(rs) >= self.size)  # fmt: skip

    def local_steps(self) -> list[int]:
        return sorted(s for s, rs in _steps_in(self.local).items() if self.rank in rs)

    # ---- paths ----
    def part(self, root: str, step: int, rank: int | None = None) -> str:
        r = self.rank if rank is None else rank
        if is_url(root):
            return f"{root}/{step}.rank{r}"
        return os.path.join(root, str(step), f"rank{r}")

    # ---- save ----
    def save(self, step: int, tree: Any, metadata: Mapping[str, str] | None,
             max_host_bytes: int | None, options: dict[str, Any]) -> None:  # fmt: skip
        t0 = time.perf_counter()
        self._settle()
        meta = dict(metadata or {})
        meta.update({"ckptio_tier.world": str(self.size), "ckptio_tier.rank": str(self.rank),
                     "ckptio_tier.step": str(step), "ckptio_tier.node": self.node})  # fmt: skip
        persist = self.persist_every is not None and self.saves % self.persist_every == 0
        self.saves += 1
        path = self.part(self.local, step)
        _private_dir(os.path.dirname(path))
        h = _save_async(_localize(tree), path, max_host_bytes=max_host_bytes, overwrite=True,
                        metadata=meta, io_options=options)  # fmt: skip
        job = _Job(step, h, self.complete, self.persisted)
        job.persisted_ok = False if persist else None
        self.job = job
        self._worker().put(job)  # a thread of this Manager's, started once
        job.report["stall_s"] = time.perf_counter() - t0

    def _worker(self) -> queue.SimpleQueue[_Job]:
        """The queue of this Manager's job thread (started at the first save, and again in a
        forked child, which has no threads of the parent's)."""
        if self.queue is None or self.queue_pid != os.getpid():
            q: queue.SimpleQueue[_Job] = queue.SimpleQueue()

            def loop() -> None:
                while True:
                    job = q.get()
                    try:
                        self._run(job)
                    finally:
                        job.done.set()

            threading.Thread(target=loop, name="ckptio-tiers", daemon=True).start()
            self.queue, self.queue_pid = q, os.getpid()
        return self.queue

    def _run(self, job: _Job) -> None:
        try:
            self._work(job)
        finally:
            if self.bg is not None or self.size == 1:  # every rank's job, a failed one too
                try:
                    got = self._decide(self._mine(job), _decide_saved, self.bg)
                    job.settled = True
                except Exception as e:
                    job.report["errors"].append(f"the ranks could not agree whether step "
                                                f"{job.step} is complete: {e}")  # fmt: skip
                else:
                    job.agreed = self._record(job, got)

    def _settle(self) -> None:
        """finish(); and where the background job could not agree (no background
        communicator), the ranks agree here on the last save, a failed rank too (its step
        counts incomplete) before it raises, and its records are written."""
        try:
            self.finish()
        finally:
            job = self.job
            if self.bg is None and self.size > 1 and not (job and job.settled):
                got = self._decide(self._mine(job), _decide_saved)
                if job is not None:
                    job.settled = True
                    n = len(job.report["errors"])
                    got = self._record(job, got)
                    for e in job.report["errors"][n:]:  # finish() printed the others
                        print(f"ckptio.Manager: rank {self.rank}: {e}", file=sys.stderr)
                self._apply(got)

    def _record(self, job: _Job, got: dict[str, Any]) -> dict[str, Any]:
        """Write the step records the verdict ``got`` on ``job``'s step calls for: in this
        rank's local root (its recorder), once the step is complete for the whole job; in the
        persistent tier (rank 0), once complete there. Returns the verdict this rank may act
        on: a record that could not be written leaves its step uncounted here (so this rank's
        retention keeps the older steps it tends), and says so in the save's errors."""
        got = dict(got)
        base = {"job": self.job_id, "step": job.step, "world": self.size, "time": got["time"]}
        for tier, root, digests, mine, so in (
                ("complete", self.local, "digests", self.recorder, None),
                ("persisted", self.directory, "pdigests", self.rank == 0, self.store)):  # fmt: skip
            if got[tier] != job.step or not mine:
                continue
            try:
                _write_record(_record_path(root, job.step), dict(base, digests=got[digests]), so)
            except (OSError, CheckpointError) as e:
                got[tier] = None
                job.report["errors"].append(f"writing the step record of step {job.step} in "
                                            f"'{root}' failed: {e}")  # fmt: skip
        return got

    def _work(self, job: _Job) -> None:
        r = job.report
        t = time.perf_counter()
        try:
            job.handle.wait()
        except BaseException as e:
            job.error = e
            return
        src = self.part(self.local, job.step)
        try:
            job.digest = _digest(src)
        except (OSError, CheckpointError) as e:
            job.error = e
            return
        job.local_ok = True
        r["local_s"] = time.perf_counter() - t
        persist_to = self.part(self.directory, job.step) if job.persisted_ok is not None else None
        # The pushes and the persistent copy go in one pass over the part (ckptio_part_spread:
        # each file read once). Not the copy into an object store (the convert engine writes
        # it after), nor one under max_rate, which paces the network, not the disk.
        in_pass = persist_to is not None and not is_url(persist_to) and not self.max_rate
        dests: list[Any] = [(p["addr"], int(p["port"])) for p in self.targets]
        if in_pass:
            dests.append(persist_to)
        t = time.perf_counter()
        try:
            outcome = _core.part_spread(src, f"{job.step}/rank{self.rank}", dests, self.timeout,
                                        self.max_rate, False, self._key) if dests else []  # fmt: skip
        except (OSError, CheckpointError) as e:
            outcome = [(-1, 0, None, str(e))] * len(dests)
        pass_s = time.perf_counter() - t
        ok = True
        for p, (rc, nbytes, _name, msg) in zip(self.targets, outcome):
            if rc == 0:
                r["replicate_bytes"] += nbytes
                r["replicated_to"].append(p["node"])
            else:
                ok = False
                r["errors"].append(f"replicating step {job.step} of rank {self.rank} to node "
                                   f"{p['node']} (rank {p['rank']}) failed: {msg}")  # fmt: skip
        r["replicate_s"] = pass_s if self.targets else 0.0
        job.replicated_ok = ok
        if persist_to is not None:
            t = time.perf_counter()
            try:
                if in_pass:
                    rc, _n, name, msg = outcome[-1]
                    if rc:
                        raise _from_code(rc, name or "", msg)
                    job.pdigest = job.digest  # a copy of the part's files, the manifest's too
                else:
                    _persist(src, persist_to, self.store)
                    job.pdigest = _digest(persist_to, self.store)  # converted: a manifest of its own
                job.persisted_ok = True
            except (OSError, CheckpointError) as e:
                r["errors"].append(f"copying step {job.step} of rank {self.rank} to the "
                                   f"persistent tier failed: {e}")  # fmt: skip
            r["persist_s"] = pass_s if in_pass else time.perf_counter() - t
        local_doomed, persistent_doomed = self._prune_plan(job)
        for s in local_doomed:
            _remove_step(self.local, s)
        for s in persistent_doomed:
            _remove_step(self.directory, s, self.store)

    def finish(self) -> None:
        """Wait for the background part of the last save; raise its local save's error (the
        replication's and persistent copy's are listed in last_save and warned of)."""
        job = self.job
        if job is None or job.waited:
            return
        job.done.wait()
        job.waited = True
        self.last_save = job.report
        if job.agreed is not None:
            self._apply(job.agreed)
        if job.report["errors"]:
            print("ckptio.Manager: " + "; ".join(job.report["errors"]), file=sys.stderr)
        if job.error is not None:
            err, job.error = job.error, None
            raise err

    @staticmethod
    def _mine(job: _Job | None) -> dict[str, Any]:
        return {"step": job.step if job else None, "local": bool(job and job.local_ok),
                "replicated": bool(job and job.replicated_ok),
                "persisted": None if job is None else job.persisted_ok,
                "digest": job.digest if job else None,
                "pdigest": job.pdigest if job else None}  # fmt: skip

    def _apply(self, got: dict[str, Any]) -> None:
        if got["complete"] is not None:
            self.complete = max(got["complete"], self.complete or -1)
        if got["persisted"] is not None:
            self.persisted = max(got["persisted"], self.persisted or -1)

    def _prune_plan(self, job: _Job) -> tuple[list[int], list[int]]:
        """Steps to delete once ``job``'s step is written (in the job's thread, off the
        caller's): of the node's local root (its leader deletes), keeping the newest local_keep
        (the job's step among them) and the newest step known complete when the save began,
        never a step newer than that one; of the persistent tier (rank 0), keeping the newest
        ``keep`` complete ones and never an unfinished step newer than the newest complete one."""
        local: list[int] = []
        if self.leader and job.complete is not None:
            held = sorted(set(_steps_in(self.local)) | {job.step})
            keep = set(held[-self.local_keep:]) | {job.complete}
            local = [s for s in held if s < job.complete and s not in keep]
        pers: list[int] = []
        if self.rank == 0 and job.persisted is not None and self.keep is not None:
            have = _steps_in(self.directory, so=self.store)
            complete = sorted(s for s, rs in have.items() if len(rs) >= self.size
                              and s <= job.persisted)  # fmt: skip
            keep = set(complete[-self.keep:]) | {job.persisted}
            pers = [s for s in have if s < job.persisted and s not in keep]
        return local, pers

    # ---- restore ----
    def restore(self, step: int | None, like: Any, load_options: dict[str, Any]) -> Any:
        t_all = time.perf_counter()
        try:
            self._settle()
        except (OSError, CheckpointError) as e:  # that step is incomplete: restore says why
            print(f"ckptio.Manager: rank {self.rank}: the last save failed: {e}", file=sys.stderr)
        secs = {"plan": 0.0, "fetch": 0.0, "load": 0.0, "agree": 0.0}
        t = time.perf_counter()
        others: list[int] = []
        mine = {"rank": self.rank, "node": self.node, "root": self.local,
                "held": _steps_in(self.local),
                "records": _records_in(self.local, self.job_id, self.size, others),
                "others": others}  # fmt: skip
        size = self.size
        directory, so = self.directory, self.store
        order = self.nodes
        job_id = self.job_id

        def plan(all_: list[dict[str, Any]]) -> dict[str, Any]:
            # A step is a candidate only with its record (the newest of the roots', and the
            # persistent tier's): each rank's part must then have the digest it names.
            places = _places(all_, order)
            holders = _holders(all_, order)
            pers = _steps_in(directory, so=so)
            pothers: list[int] = []
            pers_recs = _records_in(directory, job_id, size, pothers, so)
            recs: dict[int, Any] = {}
            for a in all_:
                for st, rec in a["records"].items():
                    if int(st) not in recs or rec["time"] > recs[int(st)]["time"]:
                        recs[int(st)] = rec
            cands = []
            for st in sorted(set(recs) | set(pers_recs), reverse=True):
                if step is not None and st != step:
                    continue
                lr, pr = recs.get(st), pers_recs.get(st)
                per = {r: {"holders": sorted(holders.get(st, {}).get(r, []) if lr else [],
                                             key=lambda h: (order.index(all_[h]["node"]), h)),
                           "digest": lr["digests"][r] if lr else None,
                           "persistent": pr is not None and r in pers.get(st, []),
                           "pdigest": pr["digests"][r] if pr else None} for r in range(size)}
                if all(v["holders"] or v["persistent"] for v in per.values()):
                    cands.append({"step": st, "ranks": per})
            held = set(holders) | set(pers)
            # steps whose parts no record of this job vouches for: another job's, or saves
            # that never completed
            foreign = sorted({int(x) for a in all_ for x in a["others"]} | set(pothers)
                             | (held - set(recs) - set(pers_recs)))  # fmt: skip
            return {"candidates": cands, "unrecorded": foreign,
                    "place": {str(a["rank"]): places[(a["node"], a["root"])] for a in all_}}

        decided = self._decide(mine, plan)
        secs["plan"] = time.perf_counter() - t
        failed: list[dict[str, Any]] = []
        for cand in decided["candidates"]:
            s = cand["step"]
            v = cand["ranks"][str(self.rank)]
            v["place"] = decided["place"][str(self.rank)]
            out, source, path, nbytes, f_s, l_s = self._restore_part(s, v, like, load_options, failed)
            secs["fetch"] += f_s
            secs["load"] += l_s
            t = time.perf_counter()
            ok = self._decide(out is not _MISSING, lambda all_: all(all_))
            secs["agree"] += time.perf_counter() - t
            if ok:
                self.complete = max(s, self.complete or -1)
                secs["total"] = time.perf_counter() - t_all
                self.last_restore = {"step": s, "source": source, "path": path,
                    "failed": failed, "unrecorded": decided["unrecorded"], "seconds": secs,
                    "bytes": nbytes}  # fmt: skip
                return out
        what = f"step {step}" if step is not None else "any step"
        unrecorded = decided["unrecorded"]
        raise _from_code(-errno.ENOENT, "ENOENT",
            f"rank {self.rank}: no complete copy of {what} for all {size} ranks in the local "
            f"tiers ('{self.local}' on node {self.node} and its peers) or the persistent tier "
            f"('{directory}'); a step counts only with its record, written once every rank's "
            f"part of it was complete, naming this job ({self.job_id}) and {size} ranks"
            + (f"; steps held without one (another job's, or unfinished): {unrecorded}"
               if unrecorded else "")
            + (f"; copies that failed: {failed}" if failed else ""),
        )  # fmt: skip

    def _restore_part(self, step: int, v: dict[str, Any], like: Any,
                      load_options: dict[str, Any], failed: list[dict[str, Any]]) -> Any:  # fmt: skip
        """This rank's part of ``step`` from its sources in order: (tree or _MISSING, source,
        path, bytes, fetch seconds, load seconds)."""
        fetch_s = load_s = 0.0
        local = self.part(self.local, step)
        sources: list[tuple[str, Any]] = []
        for h in v["holders"]:  # this rank's own root first, then the peers' in node order
            if h == v["place"]:
                sources.insert(0, ("local", local))
            else:
                sources.append(("peer", self.peers[h]))
        if v["persistent"]:
            sources.append(("persistent", self.part(self.directory, step)))
        for kind, where in sources:
            path = local if kind == "peer" else where
            nbytes = 0
            try:
                if kind == "peer":
                    t = time.perf_counter()
                    try:
                        nbytes = _core.peer_fetch(where["addr"], int(where["port"]),
                            f"{step}/rank{self.rank}", local, self.timeout, True,
                            self._key)  # fmt: skip
                    finally:
                        fetch_s += time.perf_counter() - t
                want = v["pdigest"] if kind == "persistent" else v["digest"]
                got = _digest(path, self.store if kind == "persistent" else None)
                if got != want:
                    raise _from_code(-errno.EBADMSG, "EBADMSG",
                        f"rank {self.rank}'s part of step {step} at '{path}' is not the one this "
                        f"job committed: its manifest's SHA-256 is {got[:16]}..., the step "
                        f"record's {str(want)[:16]}... (another job's part, an earlier "
                        f"attempt's, or a forgery); not used")  # fmt: skip
                t = time.perf_counter()
                try:
                    out = self._load(path, like, load_options)
                finally:
                    load_s += time.perf_counter() - t
                return out, kind, path, nbytes, fetch_s, load_s
            except (OSError, CheckpointError) as e:
                rec = {"step": step, "source": kind, "error": f"{type(e).__name__}: {e}"}
                rec["peer" if kind == "peer" else "path"] = (
                    f"{where['node']} ({where['addr']}:{where['port']})" if kind == "peer" else path)
                failed.append(rec)
                print(f"ckptio.Manager: rank {self.rank}: the {kind} copy of step {step} is "
                      f"unusable, trying the next source: {rec['error']}", file=sys.stderr)  # fmt: skip
                foreign = isinstance(e, CheckpointError) and e.code == -errno.EBADMSG
                if kind != "persistent" and os.path.isdir(path) and not (kind == "local" and foreign):
                    # a damaged copy is neither served nor listed again (a local part that is
                    # only not this job's is not removed here: it may be another job's; a fetch
                    # of this job's part from a peer replaces it)
                    _retire(path)
        return _MISSING, None, None, 0, fetch_s, load_s

    def _load(self, path: str, like: Any, load_options: dict[str, Any]) -> Any:
        if self.storage_options and is_url(path):  # a part in the persistent tier's store
            load_options = {"storage_options": self.storage_options, **load_options}
        out = load(path, like=None if like is None else _localize(like), **load_options)
        return out if like is None else _globalize(out, like)

    def close(self) -> None:
        try:
            self.finish()
        finally:
            if self.server is not None:
                self.server.close()


_MISSING = object()

# Every Tiers of this process: at exit their background work is waited for (a save() just
# before the end of a script is still written, replicated and persisted); a forked child has
# none of it.
_LIVE: weakref.WeakSet[Tiers] = weakref.WeakSet()


def _at_exit() -> None:
    for t in list(_LIVE):
        job = t.job
        if job is not None and not job.done.is_set():
            print(f"ckptio.Manager: waiting for the background part of the save of step "
                  f"{job.step} (local write, replication, persistent copy)...", file=sys.stderr)
            job.done.wait()


def _after_fork_in_child() -> None:
    """The child inherits neither the job threads nor the server's threads: it forgets both.
    Dropping the server closes the child's copy only (the engine knows it was forked: the
    parent's server goes on serving, and the child keeps neither its port nor its
    connections)."""
    for t in list(_LIVE):
        t.job = None
        t.server = None


atexit.register(_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)

