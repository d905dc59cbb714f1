# SPDX-License-Identifier: Apache-2.0
"""ckptio.save: *stage* a tree (walk it, make the host buffers), then *write* them (stream,
commit). Tensors are written from their own memory wherever they allow it."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _core
from ._options import Stats, params, split_roots
from ._stage import RESERVED_PREFIX, PathLike, StagedSave, ensure_parent, _meta_items, _stage
from ._tree import TREE_KEY, pause_gc
from .frameworks import _gpu
from .frameworks._base import Deferred
from .frameworks._gpu import DeviceItem
from .ranks import _dist

__all__ = ["save", "RESERVED_PREFIX", "StagedSave"]

# Host copies of device tensors are handed to the writer in batches of about this many bytes,
# then released after a flush, so a save never holds a second copy of a whole GPU model.
_TRANSIENT_BATCH = 256 << 20


def _open(path: PathLike, p: Any) -> _core.Writer:
    """A writer for the checkpoint ``path`` (``p``: ckptio._options.params()), its missing
    parent directories created."""
    path = os.fspath(path)
    ensure_parent(path)
    p, roots = split_roots(p)
    w = _core.Writer(path, p)
    if roots:
        try:
            w.set_roots(roots)
        except BaseException:
            w.close()
            raise
    return w


def _write(
    staged: StagedSave,
    path: PathLike,
    p: Any,
    t0: float | None = None,
) -> Stats:
    """Write a staged tree as the checkpoint ``path`` (``p``: ckptio._options.params()) and
    commit it; Stats' seconds count from ``t0`` (default: now)."""
    if t0 is None:
        t0 = time.perf_counter()
    on_gpu = False
    with _open(path, p) as w:
        if not staged.deferred:
            w.add_many(staged.items)
        else:
            batch: list[Any] = []
            transient = 0
            for it in staged.items:
                if type(it) is DeviceItem:
                    w.add_many(batch)  # in order; host buffers stay exported until close
                    batch.clear()
                    it.add_to(w)
                    on_gpu = True
                elif type(it) is Deferred:
                    batch.extend(it.make())
                    transient += it.nbytes
                    if transient >= _TRANSIENT_BATCH:
                        w.add_many(batch)
                        w.flush()  # the host copies may go now
                        batch.clear()
                        transient = 0
                else:
                    batch.append(it)
            w.add_many(batch)
            batch.clear()
        w.set_meta(TREE_KEY, staged.tree)
        for k, v in staged.meta:
            w.set_meta(k, v)
        st = w.commit()
        note = _gpu.take_note()
        gpu = _gpu.stats_text(w, note) if on_gpu else note
    return dataclasses.replace(Stats._from_core(st, time.perf_counter() - t0), gpu=gpu)


def save(
    tree: Any,
    path: PathLike,
    *,
    overwrite: bool = False,
    metadata: Mapping[str, str] | None = None,
    comm: Any = None,
    timeout: float | None = None,
    **io_options: Any,
) -> Stats:
    """Save a tree of tensors and plain values as a checkpoint directory at ``path``.

    ``tree`` is any nesting of dict (str or int keys), list and tuple holding numpy arrays,
    torch tensors, jax arrays and plain values (int, float, bool, str, None, bytes, complex).
    Each tensor is written from its own memory (non-contiguous ones are made contiguous first;
    GPU tensors are copied to the host in batches). Nothing appears at ``path`` until the
    checkpoint is complete and durable (missing parent directories are created); an existing
    checkpoint is replaced only with ``overwrite=True``, and stays intact if the new save
    fails. Ctrl-C aborts the save and leaves no temporary directory behind.

    ``metadata``: str -> str entries stored with the checkpoint (``Reader.metadata``).
    ``comm``: save one checkpoint from every rank of a job, each passing its own part (DTensor
    shards, jax arrays spanning processes, ckptio.Shard boxes, ckptio.RankLocal state): a
    torch.distributed ProcessGroup, an mpi4py communicator, or "torch", "jax", "mpi". Every
    rank calls save with the same path and tree structure; only rank 0's plain values and
    metadata are stored (the ranks' trees are compared). Without ``comm``, a tree holding
    DTensors on a multi-process mesh or jax arrays that are not fully addressable uses their
    runtime; any other tree is saved by this process alone. ``timeout``: seconds a distributed
    save waits for the other ranks at each step (default 300): a rank that fails or dies makes
    the others fail within it, and nothing is published.
    ``io_options``: backend ("auto", "io_uring", "psync", "buffered"), direct (None = O_DIRECT
    where allowed, True, False), fsync (True), checksums (True), queue_depth, io_threads,
    staging_bytes, request_bytes, roots (a list of directories, say one per NVMe drive, to
    spread the data over besides ``path``'s own; see doc/format.md section 10),
    compress (None/"none"; "auto": tensors of 64 KiB or more compressed block by block where that
    saves 2 %, floats by a coder that knows their exponent field, and never slower than
    without, as blocks are left as they are while the device would wait on the coder; "all":
    every block tried), base (an older checkpoint: tensors it holds are stored as XOR deltas
    where that is smaller, an incremental checkpoint; loading needs the base where it was,
    unchanged). Such checkpoints are format 3.0 (doc/format.md section 11).

    Returns a Stats(bytes, seconds, gbps, backend, direct, ...).

    >>> import numpy as np, ckptio, tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> st = ckptio.save({"w": np.ones((2, 3)), "step": 7}, os.path.join(d, "ckpt"))
    >>> st.bytes
    48
    >>> ckptio.load(os.path.join(d, "ckpt"))["step"]
    7
    """
    t0 = time.perf_counter()
    p = params(io_options, overwrite=overwrite)
    c, t = _dist.save_comm(tree, comm, p, timeout)
    if c is not None:
        with pause_gc():
            st = _dist.save(tree, os.fspath(path), c, _meta_items(metadata), p, t)
        stats = Stats._from_core(st, time.perf_counter() - t0)
        return dataclasses.replace(stats, gpu=_gpu.take_note())
    with pause_gc():
        return _write(_stage(tree, metadata=metadata, gpu=p["gpu"]), path, p, t0)
