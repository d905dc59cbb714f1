# SPDX-License-Identifier: Apache-2.0
"""ckptio.save_async: snapshot a tree into the C engine's pool of host buffers, save it there.

The call stages the tree as save() does and hands its tensors to ckptio_snapshot_take, which
copies them into exact-size, aligned host buffers of a pool reused across saves (device
tensors land there straight from the GPU) and writes what does not fit under
``max_host_bytes`` through the writer before returning; ckptio_snapshot_commit_async (or
ckptio_snapshot_save_dist_async) then writes the copies and commits on a thread of the
library's. Python only adapts: the pool, the copies, the thread and the error rule are C's.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from . import _core
from ._errors import STATE, USAGE, CheckpointError, InvalidType, LimitExceeded, error
from ._options import Stats, params
from ._save import _open
from ._stage import PathLike, StagedSave, ensure_parent, _meta_items, _stage
from ._tree import TREE_KEY, pause_gc
from .frameworks._base import Deferred
from .frameworks import _gpu
from .frameworks._gpu import DeviceItem
from .ranks import _comm, _dist

__all__ = ["save_async", "AsyncSave", "release_buffers", "default_max_host_bytes"]

# AsyncSave.wait() waits in slices of this many seconds, checking for Ctrl-C in between.
_WAIT_SLICE = 0.2
# The writer's staging memory when part of a state is written during the call: a quarter of
# the cap, within these bounds (the library's default is the upper one).
_MIN_STAGING = 16 << 20
_MAX_STAGING = 64 << 20


def default_max_host_bytes() -> int:
    """The default ``max_host_bytes``: a quarter of the machine's physical memory."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")) // 4
    except (ValueError, OSError):
        return 4 << 30


def host_cap(max_host_bytes: Any) -> int:
    """A ``max_host_bytes`` argument checked (an InvalidType, also a TypeError, if it is not
    an int >= 0 or None); None is default_max_host_bytes()."""
    if max_host_bytes is None:
        return default_max_host_bytes()
    if not isinstance(max_host_bytes, int) or isinstance(max_host_bytes, bool) or max_host_bytes < 0:
        raise error(USAGE, f"max_host_bytes must be an int >= 0 or None, got {max_host_bytes!r}",
                    InvalidType)  # fmt: skip
    return max_host_bytes


class HostPool:
    """A ckptio_pool made at first use: plain memory (OFF) until a save holds device tensors,
    then AUTO, page-locked where CUDA works (AUTO makes the process's CUDA context, which a
    host-only job should not pay for). A replaced pool lives on in C until the save holding its
    buffers ends."""

    def __init__(self) -> None:
        self.pool: _core.Pool | None = None
        self._auto = False

    def get(self, device: bool) -> _core.Pool:
        if self.pool is None or (device and not self._auto):
            if self.pool is not None:
                self.pool.release()
            self.pool = _core.Pool(pinned=_core.SWITCH_AUTO if device else _core.SWITCH_OFF)
            self._auto = device
        return self.pool

    def release(self) -> int:
        """Free the idle buffers; the bytes freed."""
        return 0 if self.pool is None else self.pool.release()

    def held(self) -> int:
        """Bytes of every buffer the pool holds, lent or idle."""
        return 0 if self.pool is None else self.pool.stats().held


# The process's one pool, made at the first save; the previous save is always waited for first.
_PROCESS = HostPool()


def _pool(device: bool) -> _core.Pool:
    return _PROCESS.get(device)


def release_buffers() -> int:
    """Free the host buffers save_async keeps for reuse (they are kept between saves so that
    the next snapshot allocates nothing); returns the bytes freed. Buffers of a save still in
    flight are kept. Called at interpreter exit too."""
    return _PROCESS.release()


def _held_bytes() -> int:
    """Bytes of every buffer the pool holds, lent or idle (for tests and stats)."""
    return _PROCESS.held()


def _start_commit(s: _core.Snapshot, w: _core.Writer) -> Any:
    """ckptio_snapshot_commit_async: the one place a single-process background save starts
    (tests hold it here)."""
    return _core.commit_async(s, w)


def _start_dist(s: _core.Snapshot, path: str, c: Any, meta: Any, p: Any, t: float) -> Any:
    """ckptio_snapshot_save_dist_async, as _start_commit."""
    return _core.save_dist_async(s, path, c, meta, p, t)


class AsyncSave:
    """A save running in the background (what ckptio.save_async returns).

    ``wait()`` blocks until the checkpoint is committed and returns its Stats, or raises the
    save's error; ``done()`` says whether it has finished; ``path`` is the checkpoint's path;
    ``stall_seconds`` is how long the save_async call blocked the caller."""

    def __init__(self, path: str, t0: float) -> None:
        self.path = path
        self.stall_seconds = 0.0
        self._t0 = t0
        self._completion: Any = None  # ckptio._core.Completion while unseen
        self._comm: Any = None  # the communicator a collective save ran on
        self._after: Callable[[Any], None] | None = None
        self._stats: Stats | None = None
        self._gpu = ""  # what Stats.gpu says
        self._error: BaseException | None = None
        self._observed = False
        self._finished = False
        self._lock = threading.Lock()  # one thread finishes the save (runs ``after``)
        self._pid = os.getpid()  # the process whose engine runs the save

    def done(self) -> bool:
        if self._finished or os.getpid() != self._pid:
            return True
        c = self._completion
        return c is None or bool(c.done())

    def wait(self, timeout: float | None = None) -> Stats:
        """The save's Stats once it is committed; raises its error, or TimeoutError when
        ``timeout`` seconds pass first."""
        if not self._finish(timeout):
            raise TimeoutError(f"the async save to '{self.path}' is still running")
        self._observed = True
        if self._error is not None:
            raise self._error
        assert self._stats is not None
        return self._stats

    def _fail(self, err: BaseException) -> None:
        self._error = err
        self._finished = True

    def _finish(self, timeout: float | None = None) -> bool:
        """Wait for the completion and take its outcome, once; run ``after`` on success.
        False if still running after ``timeout`` seconds. The wait runs in slices with the
        GIL released, so that Ctrl-C interrupts it (the save then stays pending)."""
        if os.getpid() != self._pid:
            self._orphan()
        with self._lock:
            if self._finished:
                return True
            c = self._completion
            end = None if timeout is None else time.monotonic() + max(timeout, 0.0)
            while True:
                left = _WAIT_SLICE if end is None else min(_WAIT_SLICE, end - time.monotonic())
                try:
                    st = c.wait(max(left, 0.0))
                except Exception as e:  # the save's error, raised by wait()
                    if isinstance(e, CheckpointError) and self._comm is not None:
                        e = _dist._explain(e)
                    self._error = e
                    break
                if st is not None:
                    self._stats = Stats._from_core(st, time.perf_counter() - self._t0)
                    if self._gpu:
                        self._stats = dataclasses.replace(self._stats, gpu=self._gpu)
                    break
                if end is not None and time.monotonic() >= end:
                    return False
            self._completion = None
            c.close()
            if self._stats is not None and self._after is not None:
                try:
                    self._after(self._comm)
                except Exception as e:  # its error is the save's
                    self._error, self._stats = e, None
            self._finished = True
            return True

    def _orphan(self) -> None:
        """In a forked child, for a save that was in flight at the fork: the engine runs it in
        the parent only (its completion reports CKPTIO_E_STATE here), so here it is finished
        with an error saying so (and counted as seen)."""
        if self._finished:
            return
        self._lock = threading.Lock()  # the parent's may have been held at the fork
        self._completion = None  # the parent's: freeing it in the child touches nothing
        self._observed = True
        self._fail(error(STATE,
            f"the async save to '{self.path}' runs in process {self._pid}, which forked this "
            "one: a forked process inherits no pending save and cannot wait for it (the "
            "parent's wait() gives its outcome)",
        ))  # fmt: skip

    def __repr__(self) -> str:
        state = "running" if not self.done() else ("failed" if self._error else "committed")
        return f"<ckptio.AsyncSave '{self.path}' {state}>"


def started(path: str, t0: float, start: Callable[[], tuple[Any, str, Any]]) -> AsyncSave:
    """The AsyncSave of ``start()``, which returns (a Completion, what Stats.gpu says, None),
    or (None, what Stats.gpu says, a stats tuple) for a save made during the call. An I/O
    error it raises (opening the file, writing what the cap could not hold) is the save's,
    raised by wait(); other errors (in the tree itself) are raised here."""
    h = AsyncSave(path, t0)
    try:
        c, h._gpu, st = start()
    except (OSError, CheckpointError) as e:
        h._fail(e)
        return h
    if c is None:
        h._stats = Stats._from_core(st, time.perf_counter() - t0)
        if h._gpu:
            h._stats = dataclasses.replace(h._stats, gpu=h._gpu)
        h._finished = True
    else:
        h._completion = c
    return h


# The one save in flight (a second waits for it).
_LOCK = threading.Lock()
_pending: AsyncSave | None = None


def _wait_previous() -> None:
    """Wait for the save in flight; raise its error if nobody has seen it."""
    h = _pending
    if h is None:
        return
    h._finish()
    if h._observed or h._error is None:
        return
    h._observed = True
    err = h._error
    err.add_note(
        f"ckptio: this is the error of the earlier async save to '{h.path}', which nobody "
        "waited for; that checkpoint was not written, and the save_async call raising "
        "it did not start"
    )
    raise err


def save_async(
    tree: Any,
    path: PathLike,
    *,
    max_host_bytes: int | None = None,
    overwrite: bool = False,
    metadata: Mapping[str, str] | None = None,
    comm: Any = None,
    timeout: float | None = None,
    **io_options: Any,
) -> AsyncSave:
    """Save ``tree`` as ckptio.save does, in the background; returns an AsyncSave once the
    tree's tensors may be changed.

    The checkpoint holds the values as they were at the call: every tensor is copied into a
    host buffer before the call returns (jax arrays too, so they may be donated right away).
    ``max_host_bytes`` caps the host memory these copies take (default:
    default_max_host_bytes(), a quarter of physical memory); tensors beyond it are written from
    their own memory during the call, which then blocks for their write only. The buffers are
    kept for the next save (ckptio.release_buffers() frees them); the first save makes them,
    faulted in at once on a few threads (about 0.2 s per GB on two cores), so that no copy
    ever page-faults and later saves only copy, at memory bandwidth.

    One save runs at a time: a call while one is in flight waits for it. Errors of the
    background part (I/O, an existing ``path`` without ``overwrite``) are raised by
    ``wait()``; one nobody waited for is raised by the next save_async call, or printed at
    interpreter exit, which also waits for a save in flight. Errors in the tree itself (types,
    options) are raised by the call.

    ``comm``, ``timeout``: a distributed save, as ckptio.save(comm=...) (and, without
    ``comm``, a tree of DTensors on a multi-process mesh or of jax arrays spanning processes):
    every rank calls save_async with its part of the tree, each snapshots its part, and the
    collective save runs in every rank's background thread. Its collectives never use the
    caller's group, so the training loop may keep using its own at the same time: with
    torch.distributed the first such call creates a gloo group over the same ranks
    (torch.distributed.new_group, collective over the whole default group: every rank of the
    job must make that first call), with JAX a key space of its own, with mpi4py a duplicate
    communicator. MPI allows calls from two threads only at MPI_THREAD_MULTIPLE: below it the
    collective save runs during the call, with a RuntimeWarning. A ckptio Communicator of your
    own is called from the background thread. A rank's part that does not fit under
    ``max_host_bytes`` is saved during the call (the others' background saves take part).
    """
    return _save_async(
        tree, path, max_host_bytes=max_host_bytes, overwrite=overwrite, metadata=metadata,
        io_options=io_options, comm=comm, timeout=timeout,
    )  # fmt: skip


def _save_async(
    tree: Any,
    path: PathLike,
    *,
    max_host_bytes: int | None,
    overwrite: bool,
    metadata: Mapping[str, str] | None,
    io_options: dict[str, Any],
    comm: Any = None,
    timeout: float | None = None,
    after: Callable[[Any], None] | None = None,
) -> AsyncSave:
    """save_async; ``after`` runs once the checkpoint is committed and the save is seen
    finished (by wait(), the next save, or exit), given the communicator the save used (None
    for a save of this process alone); its error is the save's error."""
    cap = host_cap(max_host_bytes)
    p = dict(params(io_options, overwrite=overwrite))
    spath = os.fspath(path)
    c, t = _dist.save_comm(tree, comm, p, timeout)  # as save() decides, before any staging

    def begin() -> AsyncSave:
        if c is not None:
            return _dist_async(tree, spath, c, p, cap, metadata, t)
        t0 = time.perf_counter()
        with pause_gc():
            staged = _stage(tree, metadata=metadata, gpu=p["gpu"])
        return started(spath, t0, lambda: (*_snapshot(staged, spath, p, cap), None))

    return one_at_a_time(begin, after)


def one_at_a_time(begin: Callable[[], AsyncSave],
                  after: Callable[[Any], None] | None = None) -> AsyncSave:  # fmt: skip
    """Once the process's save in flight has finished (its error raised if nobody saw it),
    ``begin()`` starts the next save, which becomes the one in flight; ``after`` as for
    _save_async."""
    global _pending
    with _LOCK:
        _wait_previous()
        h = begin()
        h._after = after
        if h._finished and h._error is None and after is not None:
            try:  # saved during the call: committed already
                after(h._comm)
            except BaseException as e:
                h._fail(e)
                h._stats = None
        h.stall_seconds = time.perf_counter() - h._t0
        _pending = h
        return h


def _as_array(data: Any) -> np.ndarray:
    return data if isinstance(data, np.ndarray) else np.asarray(memoryview(data))


def _snapshot(staged: StagedSave, path: str, p: Any, cap: int) -> tuple[Any, str]:
    """Open the writer, take the snapshot (what does not fit under ``cap`` written through
    the writer now), set the metadata and start the commit: its Completion, and what
    Stats.gpu says ("snapshot": GPU tensors copied by ckptio into the pool's pinned buffers;
    else why the framework copied them, or "")."""
    items: list[tuple[Any, ...]] = []
    deferred: list[Deferred] = []
    host: list[Any] = []  # written from the caller's memory now (a cap of 0)
    total = 0
    device = False
    for it in staged.items:
        if type(it) is Deferred:
            deferred.append(it)
        elif type(it) is DeviceItem:
            device = True
            total += it.nbytes
            items.append((it.name, it.code, it.shape, it.ptr, it.offset, it.chunk_shape, 0,
                          it.nbytes, it.stream, it.keep))  # fmt: skip
        else:
            a = _as_array(it.data)
            total += a.nbytes
            shape = it.shape if it.shape is not None else a.shape
            items.append((it.name, it.dtype, shape, a, it.offset, it.chunk_shape, 0))
            host.append(it)
    if deferred or total > cap:
        # Part of the state is written during the call, through the writer's staging memory
        # (caller's buffers are rarely aligned): that memory counts against the cap too.
        if not p["staging_bytes"]:
            p["staging_bytes"] = min(max(cap // 4, _MIN_STAGING), _MAX_STAGING)
        cap = max(cap - p["staging_bytes"], 0)
    pool = _pool(device)
    w = _open(path, p)
    try:
        for d in deferred:  # device tensors' host copies, made and written one at a time
            w.add_many(d.make())
            w.flush()
        if cap == 0 and host:  # the pool's 0 means its default: nothing may be copied here
            w.add_many(host)
            w.flush()
            items = [x for x in items if len(x) > 7]
        pool.set_max_bytes(max(cap, 1))
        snap = _core.take(pool, items, w)
        del items, host
        gpu = "snapshot" if snap.stats().device_bytes else _gpu.take_note()
        w.set_meta(TREE_KEY, staged.tree)
        for k, v in staged.meta:
            w.set_meta(k, v)
        return _start_commit(snap, w), gpu
    except BaseException:
        w.close()  # nothing started: the writer aborts (a no-op once the commit owns it)
        raise


# ---- distributed saves ----

# The communicator each of the caller's communicators has for background saves (keyed by id,
# the caller's kept alive with it): the save thread's collectives must never interleave with
# the caller's own on the same group or key space.
_bg_comms: dict[int, tuple[Any, Any]] = {}


def _background_comm(c: Any) -> Any:
    """``c``'s counterpart for collectives issued from the save thread, or None where the
    runtime does not allow them (MPI below MPI_THREAD_MULTIPLE). Collective on first use."""
    if isinstance(c, _dist.SingleRank) or c.size == 1:
        return c
    hit = _bg_comms.get(id(c))
    if hit is not None and hit[0] is c:
        return hit[1]
    bg: Any
    if isinstance(c, _comm.TorchCommunicator):
        group = c._dist.new_group(
            ranks=c._global, backend="gloo", timeout=_comm.GLOO_GROUP_TIMEOUT
        )
        bg = _comm.TorchCommunicator(group)
    elif isinstance(c, _comm.JaxCommunicator):
        bg = _comm.JaxCommunicator()
    elif isinstance(c, _comm.MPICommunicator):
        MPI = c._MPI
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            warnings.warn(
                "ckptio.save_async(comm=<MPI>): MPI was initialized below "
                "MPI_THREAD_MULTIPLE, so the collective save cannot run in a background "
                "thread; it runs during the call instead (initialize MPI with "
                "MPI_THREAD_MULTIPLE, e.g. mpi4py.rc.thread_level = 'multiple' before "
                "importing mpi4py.MPI, to save in the background)",
                RuntimeWarning,
                stacklevel=4,
            )
            return None
        bg = _comm.MPICommunicator(c._comm)
    else:
        bg = c  # a Communicator of the caller's: documented to be called from the thread
    _bg_comms[id(c)] = (c, bg)
    return bg


def _dist_async(
    tree: Any,
    path: str,
    c: Any,
    p: Any,
    cap: int,
    metadata: Mapping[str, str] | None,
    timeout: float,
) -> AsyncSave:
    """save_async of a distributed save over ``c``: this rank's part copied into the pool,
    then ckptio_snapshot_save_dist_async (during the call, ckptio_save_dist, where the runtime
    forbids background collectives or the part exceeds ``cap``)."""
    t0 = time.perf_counter()
    h = AsyncSave(path, t0)
    meta = _meta_items(metadata)
    bg = _background_comm(c)
    blocking = bg is None
    if blocking:
        bg = c
    h._comm = bg
    with pause_gc():
        items, doc = _dist.stage_or_refuse(tree, bg, path, p, timeout)
    ensure_parent(path)
    meta_items = [(TREE_KEY, doc)] + meta if bg.rank == 0 else []
    snap = None
    if not blocking and cap > 0:
        pool = _pool(any(len(it) > 7 for it in items))
        pool.set_max_bytes(cap)
        try:
            snap = _core.take(pool, items, None)
        except LimitExceeded:
            snap = None  # this rank's part does not fit: saved during the call
    if snap is not None:
        del items
        h._completion = _start_dist(snap, path, bg, meta_items, p, timeout)
        return h
    # Saved during the call: on the background communicator all the same, since the other
    # ranks' saves of this step may be running in their engines' threads.
    try:
        try:
            st = _core.save_dist(path, bg, items, meta_items, p, timeout)
        except CheckpointError as e:
            raise _dist._explain(e) from e.__cause__
        h._stats = Stats._from_core(st, time.perf_counter() - t0)
        h._finished = True
    except (OSError, CheckpointError) as e:
        h._fail(e)
    return h


def _at_exit() -> None:
    h = _pending
    if h is not None and not h.done():
        print(f"ckptio: waiting for the async save to '{h.path}' to finish...", file=sys.stderr)
        try:
            h._finish()
        except KeyboardInterrupt:
            print(
                f"ckptio: interrupted; the async save to '{h.path}' was NOT committed (an "
                "older checkpoint at that path, if any, is intact)",
                file=sys.stderr,
            )
            return
    if h is not None:
        h._finish()
        if not h._observed and h._error is not None:
            h._observed = True
            print(
                f"ckptio: the async save to '{h.path}' FAILED and nobody waited for it: "
                f"{h._error}",
                file=sys.stderr,
            )
    release_buffers()


def _after_fork_in_child() -> None:
    """A forked child inherits no pending save: the engine's thread that would finish the
    parent's save exists only in the parent, and a lock may have been held by a thread at the
    fork. The child starts with a fresh lock and nothing pending (so its exit waits for
    nothing and reports nothing of the parent's); the C pool sees to its own buffers."""
    global _LOCK, _pending
    _LOCK = threading.Lock()
    h, _pending = _pending, None
    if h is not None:
        h._orphan()


atexit.register(_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)
