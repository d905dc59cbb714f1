# SPDX-License-Identifier: Apache-2.0
"""ckptio.save_async: snapshot a tree into a bounded pool of host buffers, write it in a thread.

The call stages the tree as save() does, copies every tensor into an exact-size, aligned host
buffer from a pool that is reused across saves, and returns; a background thread streams the
buffers to the writer and commits. Tensors that do not fit under ``max_host_bytes`` are
written from the caller's memory before the call returns, so host memory stays bounded and the
stall is only what the cap cannot absorb.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from . import _core
from ._core import AddItem
from ._errors import USAGE, CheckpointError, InvalidType, error
from ._options import Stats, params
from ._save import _open, _write
from ._stage import PathLike, StagedSave, _make_parent, _meta_items, _stage
from ._tree import TREE_KEY, pause_gc
from .frameworks import _gpu
from .frameworks._base import Deferred
from .frameworks._gpu import DeviceItem
from .ranks import _comm, _dist

__all__ = ["save_async", "AsyncSave", "release_buffers", "default_max_host_bytes"]

# Copies are cut into pieces of about this size and spread over _COPY_THREADS threads
# (Buffer.copy_from releases the GIL while it copies).
_COPY_PIECE = 64 << 20
_COPY_THREADS = 2
# The writer's staging memory when part of a state is written during the call: a quarter of
# the cap, within these bounds (the library's default is the upper one).
_MIN_STAGING = 16 << 20
_MAX_STAGING = 64 << 20
# A tensor that does not fit is split (part copied, part written during the call) only if at
# least this much of it fits.
_MIN_SPLIT = 1 << 20


def default_max_host_bytes() -> int:
    """The default ``max_host_bytes``: a quarter of the machine's physical memory."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")) // 4
    except (ValueError, OSError):
        return 4 << 30


class _Pool:
    """Host buffers (ckptio._core.Buffer: aligned, exact size) kept between saves, by size.

    ``held`` counts every buffer the pool owns, lent or free; a save never makes it exceed its
    cap (free buffers of sizes it does not need are released first)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.free: dict[int, list[_core.Buffer]] = {}
        self.held = 0

    def take(self, sizes: list[int], cap: int) -> list[_core.Buffer]:
        """Buffers of exactly ``sizes`` (sum(sizes) <= cap), reusing free ones."""
        with self.lock:
            out: list[_core.Buffer | None] = []
            missing = 0
            for n in sizes:
                lst = self.free.get(n)
                if lst:
                    out.append(lst.pop())
                else:
                    out.append(None)
                    missing += n
            # Release what this save does not reuse until the new buffers fit under the cap.
            for n in sorted(self.free, reverse=True):
                lst = self.free[n]
                while lst and self.held + missing > cap:
                    lst.pop()
                    self.held -= n
                if not lst:
                    del self.free[n]
            bufs: list[_core.Buffer] = []
            try:
                for n, b in zip(sizes, out):
                    if b is None:
                        # Faulted in now, once: the copies of later saves never page-fault.
                        b = _core.Buffer(n, populate=True)
                        self.held += n
                    bufs.append(b)
            except BaseException:  # MemoryError: keep what was made for the next save
                for b in bufs + [b for b in out[len(bufs) :] if b is not None]:
                    self.free.setdefault(len(b), []).append(b)
                raise
            return bufs

    def give(self, bufs: list[_core.Buffer]) -> None:
        with self.lock:
            for b in bufs:
                self.free.setdefault(len(b), []).append(b)

    def forget(self) -> None:
        """In a forked child: a fresh lock and no buffers. Those lent to the parent's save in
        flight never come back here, and the free ones are only a copy-on-write image of the
        parent's memory, so the child starts empty rather than count what it cannot reuse."""
        self.lock = threading.Lock()
        self.free = {}
        self.held = 0

    def release(self) -> int:
        """Free every buffer not lent to a save; returns the bytes freed."""
        with self.lock:
            freed = 0
            for n, lst in self.free.items():
                freed += n * len(lst)
            self.held -= freed
            self.free.clear()
            return freed


_POOL = _Pool()
_COPIER: ThreadPoolExecutor | None = None


def release_buffers() -> int:
    """Free the host buffers save_async keeps for reuse (they are kept between saves so that
    the next snapshot allocates nothing); returns the bytes freed. Buffers of a save still in
    flight are kept. Called at interpreter exit too."""
    return _POOL.release()


def _as_array(data: Any) -> np.ndarray:
    return data if isinstance(data, np.ndarray) else np.asarray(memoryview(data))


def _copy_into(pairs: list[tuple[_core.Buffer, np.ndarray]]) -> None:
    """Copy each (dst, src) pair (src: a flat uint8 array of len(dst) bytes), in pieces, on up
    to _COPY_THREADS threads (Buffer.copy_from releases the GIL)."""
    global _COPIER
    pieces: list[tuple[_core.Buffer, np.ndarray, int]] = []
    total = 0
    for dst, src in pairs:
        n = src.size
        total += n
        for a in range(0, n, _COPY_PIECE):
            pieces.append((dst, src[a : a + _COPY_PIECE], a))
    if total < 2 * _COPY_PIECE or _COPY_THREADS < 2:
        for d, s, a in pieces:
            d.copy_from(s, a)
        return
    if _COPIER is None:
        _COPIER = ThreadPoolExecutor(_COPY_THREADS - 1, thread_name_prefix="ckptio-copy")
    # Pieces are taken from a shared iterator, so a thread slowed down by other work on the
    # machine takes fewer of them.
    it = iter(pieces)
    lock = threading.Lock()
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            with lock:
                nxt = next(it, None)
            if nxt is None:
                return
            nxt[0].copy_from(nxt[1], nxt[2])

    futs = [_COPIER.submit(run) for _ in range(_COPY_THREADS - 1)]
    try:
        run()
    except BaseException:  # Ctrl-C: the other threads finish the piece they hold, no more
        stop.set()
        raise
    finally:  # no copy may still be running once the buffers are someone else's
        wait(futs)
    for f in futs:
        f.result()


class AsyncSave:
    """A save running in the background (what ckptio.save_async returns).

    ``wait()`` blocks until the checkpoint is committed and returns its Stats, or raises the
    save's error; ``done()`` says whether it has finished; ``path`` is the checkpoint's path;
    ``stall_seconds`` is how long the save_async call blocked the caller."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.stall_seconds = 0.0
        self._done = threading.Event()
        self._stats: Stats | None = None
        self._error: BaseException | None = None
        self._observed = False
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()  # the process whose thread runs the save

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Stats:
        """The save's Stats once it is committed; raises its error, or TimeoutError when
        ``timeout`` seconds pass first."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the async save to '{self.path}' is still running")
        self._observed = True
        if self._error is not None:
            raise self._error
        assert self._stats is not None
        return self._stats

    def _finish(self, stats: Stats | None, err: BaseException | None) -> None:
        self._stats = stats
        self._error = err
        self._done.set()

    def _orphan(self) -> None:
        """In a forked child, for a save that was in flight at the fork: its thread runs in
        the parent only, so here it is finished with an error saying so (and counted as
        seen). A new Event, since the parent's may have been locked at the fork."""
        self._done = threading.Event()
        self._observed = True
        self._finish(None, error(USAGE,
            f"the async save to '{self.path}' runs in process {self._pid}, which forked this "
            "one: a forked process inherits no pending save and cannot wait for it (the "
            "parent's wait() gives its outcome)",
        ))  # fmt: skip

    def __repr__(self) -> str:
        state = "running" if not self.done() else ("failed" if self._error else "committed")
        return f"<ckptio.AsyncSave '{self.path}' {state}>"


# The one save in flight (a second waits for it) and the last save whose error nobody saw.
_LOCK = threading.Lock()
_pending: AsyncSave | None = None


def _unreported(h: AsyncSave | None) -> BaseException | None:
    if h is None or not h.done() or h._observed or h._error is None:
        return None
    h._observed = True
    return h._error


def _wait_previous() -> None:
    """Wait for the save in flight; raise its error if nobody has seen it."""
    h = _pending
    if h is None:
        return
    h._done.wait()
    err = _unreported(h)
    if err is not None:
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
    """save_async; ``after`` runs in the background thread once the checkpoint is committed
    (ckptio.Manager's retention), given the communicator the save used (None for a save of
    this process alone); its error is the save's error."""
    global _pending
    cap = default_max_host_bytes() if max_host_bytes is None else max_host_bytes
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 0:
        raise error(USAGE, f"max_host_bytes must be an int >= 0, got {cap!r}", InvalidType)
    p = dict(params(io_options, overwrite=overwrite))
    spath = os.fspath(path)
    c, t = _dist.save_comm(tree, comm, p, timeout)  # as save() decides, before any staging
    if c is not None:
        with _LOCK:
            _wait_previous()
            h = _dist_async(tree, spath, c, p, cap, metadata, t, after)
            _pending = h
            return h
    with _LOCK:
        _wait_previous()
        t0 = time.perf_counter()
        with pause_gc():
            staged = _stage(tree, metadata=metadata, gpu=p["gpu"])
        h = AsyncSave(spath)
        writer: _core.Writer | None = None
        bufs: list[_core.Buffer] = []
        try:
            items, writer = _snapshot(staged, spath, p, cap, bufs)
        except (OSError, CheckpointError) as e:
            _POOL.give(bufs)
            # An I/O error while writing what the cap could not hold: the save has failed,
            # and says so on wait() like any other I/O error.
            h.stall_seconds = time.perf_counter() - t0
            h._finish(None, e)
            _pending = h
            return h
        except BaseException:  # KeyboardInterrupt, MemoryError: no save, the pool whole
            _POOL.give(bufs)
            raise
        snap = StagedSave(items, staged.tree, staged.meta, False)
        del staged
        th = threading.Thread(
            target=_background, args=(h, snap, spath, p, t0, writer, bufs, after),
            name="ckptio-save-async", daemon=True,
        )  # fmt: skip
        h._thread = th
        try:
            th.start()
        except BaseException:  # no thread: nothing is pending, and the buffers go back
            if writer is not None:
                writer.close()
            _POOL.give(bufs)
            raise
        _pending = h
        h.stall_seconds = time.perf_counter() - t0
        return h


def _snapshot(
    staged: StagedSave, path: str, p: Any, cap: int, bufs: list[_core.Buffer]
) -> tuple[list[Any], _core.Writer | None]:
    """The staged items re-pointed at pooled copies (those within ``cap``; the buffers taken
    are appended to ``bufs``), and the writer that already wrote the rest (None when
    everything fit)."""
    plan: list[tuple[int, Any, np.ndarray]] = []  # (index in out, item, source array)
    out: list[Any] = []
    overflow: list[Any] = []
    deferred: list[Deferred] = []
    used = 0
    total = 0
    devices: list[Any] = []  # GPU tensors written now, through ckptio's GPU path
    for it in staged.items:
        total += it.nbytes if type(it) in (Deferred, DeviceItem) else _as_array(it.data).nbytes
    if total > cap:
        # Part of the state is written during the call, through the writer's staging memory
        # (caller's buffers are rarely aligned): that memory counts against the cap too.
        if not p["staging_bytes"]:
            p["staging_bytes"] = min(max(cap // 4, _MIN_STAGING), _MAX_STAGING)
        cap = max(cap - p["staging_bytes"], 0)
    pinned: list[Any] = []
    for it in staged.items:
        if type(it) is Deferred:
            deferred.append(it)
            continue
        if type(it) is DeviceItem:
            snap = _gpu.pinned_copy(it) if used + it.nbytes <= cap else None
            if snap is None:
                devices.append(it)
            else:
                used += it.nbytes
                pinned.append(snap)
                out.append(snap[0])
            continue
        src = _as_array(it.data)
        n = src.nbytes
        if n == 0:
            out.append(AddItem((it.name, it.dtype, it.shape, np.empty(src.shape, src.dtype),
                                it.offset, it.chunk_shape)))  # fmt: skip
        elif used + n <= cap:
            used += n
            plan.append((len(out), it, src))
            out.append(None)
        else:
            head, tail = _split(it, src, cap - used)
            if head is not None:
                used += head[1].nbytes
                plan.append((len(out), head[0], head[1]))
                out.append(None)
            overflow.append(tail)
    bufs.extend(_POOL.take([src.nbytes for _, _, src in plan], cap))
    pairs = []
    for (i, it, src), b in zip(plan, bufs):
        dst = np.ndarray(src.shape, src.dtype, b)
        pairs.append((b, src.reshape(-1).view(np.uint8)))
        out[i] = AddItem((it.name, it.dtype, it.shape, dst, it.offset, it.chunk_shape))
    del plan
    _gpu.pinned_wait(pinned)  # the snapshot is complete once the device copies are
    writer = None
    if overflow or deferred or devices:
        # What the cap cannot hold is written now, from the caller's memory; device tensors'
        # host copies are made (and written) one batch at a time, as save() does.
        writer = _open(path, p)
        try:
            _copy_into(pairs)
            pairs.clear()
            if overflow:
                writer.add_many(overflow)
                writer.flush()
            for d in deferred:
                writer.add_many(d.make())
                writer.flush()
            for dv in devices:
                dv.add_to(writer)
        except BaseException:
            writer.close()
            raise
    else:
        _copy_into(pairs)
    return out, writer


def _split(it: Any, src: np.ndarray, room: int) -> tuple[tuple[Any, np.ndarray] | None, Any]:
    """Cut item ``it`` (data ``src``) along its first dimension so that the head fits in
    ``room`` bytes: ((head item, head's bytes) or None, tail item). Head and tail are chunks
    of the tensor, written from a copy and from the caller's memory."""
    shape = it.shape if it.shape is not None else src.shape
    chunk = it.chunk_shape if it.chunk_shape is not None else shape
    rows = chunk[0] if chunk else 0
    if rows < 2 or src.nbytes % rows or room < _MIN_SPLIT:
        return None, it
    row_bytes = src.nbytes // rows
    k = min(room // row_bytes, rows - 1)
    if k < 1:
        return None, it
    off = it.offset if it.offset is not None else (0,) * len(shape)
    u8 = src.reshape(-1).view(np.uint8)
    cut = k * row_bytes
    head = AddItem((it.name, it.dtype, shape, u8[:cut], off, (k,) + tuple(chunk[1:])))
    tail = AddItem((it.name, it.dtype, shape, u8[cut:], (off[0] + k,) + tuple(off[1:]),
                    (rows - k,) + tuple(chunk[1:])))  # fmt: skip
    return (head, u8[:cut]), tail


def _background(
    h: AsyncSave,
    snap: StagedSave,
    path: str,
    p: Any,
    t0: float,
    writer: _core.Writer | None,
    bufs: list[_core.Buffer],
    after: Callable[[], None] | None,
) -> None:
    stats: Stats | None = None
    err: BaseException | None = None
    try:
        stats = _write(snap, path, p, t0, writer)
        del snap
        if after is not None:
            after(None)
    except BaseException as e:  # every error is the save's, raised by wait()
        err = e
    _POOL.give(bufs)
    h._finish(stats, err)


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
    after: Callable[[Any], None] | None,
) -> AsyncSave:
    """save_async of a distributed save over ``c``: this rank's part copied into pooled
    buffers, then ckptio_save_dist in the background thread (during the call where the
    runtime forbids background collectives or the part exceeds ``cap``)."""
    t0 = time.perf_counter()
    h = AsyncSave(path)
    meta = _meta_items(metadata)
    bg = _background_comm(c)
    blocking = bg is None
    if blocking:
        bg = c
    with pause_gc():
        items, doc = _dist.stage_or_refuse(tree, bg, path, p, timeout)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        _make_parent(parent, path)
    meta_items = [(TREE_KEY, doc)] + meta if bg.rank == 0 else []
    srcs = [np.ascontiguousarray(_as_array(it[3])) for it in items]
    total = sum(a.nbytes for a in srcs)
    bufs: list[_core.Buffer] = []
    if not blocking and total <= cap:
        sized = [a for a in srcs if a.nbytes]
        bufs = _POOL.take([a.nbytes for a in sized], cap)
        try:  # until the thread owns them, an exception (Ctrl-C too) gives the buffers back
            pairs = [(b, a.reshape(-1).view(np.uint8)) for a, b in zip(sized, bufs)]
            _copy_into(pairs)
            del pairs
            it_bufs = iter(bufs)
            snap = []
            for it, a in zip(items, srcs):
                data = np.ndarray(a.shape, a.dtype, next(it_bufs)) if a.nbytes else a.copy()
                snap.append(it[:3] + (data,) + it[4:])
            del items, srcs
            th = threading.Thread(
                target=_dist_background, args=(h, snap, path, bg, meta_items, p, timeout, t0,
                                               bufs, after),
                name="ckptio-save-async", daemon=True,
            )  # fmt: skip
            h._thread = th
            th.start()
        except BaseException:
            _POOL.give(bufs)
            raise
        h.stall_seconds = time.perf_counter() - t0
        return h
    # Saved during the call: on the background communicator all the same, since the other
    # ranks' saves of this step may be running in their save threads.
    _dist_background(h, items, path, bg, meta_items, p, timeout, t0, bufs, after)
    h.stall_seconds = time.perf_counter() - t0
    return h


def _dist_background(
    h: AsyncSave,
    items: list[Any],
    path: str,
    c: Any,
    meta_items: list[tuple[str, bytes]],
    p: Any,
    timeout: float,
    t0: float,
    bufs: list[_core.Buffer],
    after: Callable[[Any], None] | None,
) -> None:
    stats: Stats | None = None
    err: BaseException | None = None
    try:
        try:
            st = _core.save_dist(path, c, items, meta_items, p, timeout)
        except CheckpointError as e:
            raise _dist._explain(e) from e.__cause__
        del items
        stats = Stats._from_core(st, time.perf_counter() - t0)
        if after is not None:
            after(c)
    except BaseException as e:  # every error is the save's, raised by wait()
        err = e
    _POOL.give(bufs)
    h._finish(stats, err)


def _at_exit() -> None:
    h = _pending
    if h is not None and not h.done():
        print(f"ckptio: waiting for the async save to '{h.path}' to finish...", file=sys.stderr)
        try:
            h._done.wait()
        except KeyboardInterrupt:
            print(
                f"ckptio: interrupted; the async save to '{h.path}' was NOT committed (an "
                "older checkpoint at that path, if any, is intact)",
                file=sys.stderr,
            )
            return
    err = _unreported(h)
    if err is not None and h is not None:
        print(
            f"ckptio: the async save to '{h.path}' FAILED and nobody waited for it: {err}",
            file=sys.stderr,
        )
    release_buffers()


def _after_fork_in_child() -> None:
    """A forked child inherits no pending save and no thread: the threads that would finish
    the parent's save, and the copy threads, exist only in the parent, and a lock may have
    been held by one of them at the fork. The child starts with fresh locks, an empty pool,
    no copy threads and nothing pending (so its exit waits for nothing and reports nothing
    of the parent's)."""
    global _LOCK, _COPIER, _pending
    _LOCK = threading.Lock()
    _POOL.forget()
    _COPIER = None
    h, _pending = _pending, None
    if h is not None and not h._done.is_set():
        h._orphan()


atexit.register(_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)
