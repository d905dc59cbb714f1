# SPDX-License-Identifier: Apache-2.0
"""Orbax through ckptio: a TypeHandler for jax.Array that stores a pytree's arrays as one
ckptio checkpoint inside the Orbax item directory.

>>> import ckptio.orbax
>>> ckptio.orbax.register()  # doctest: +SKIP
>>> ocp.StandardCheckpointer().save(path, state)  # arrays go through ckptio  # doctest: +SKIP

Why a TypeHandler: Orbax 0.12.8 documents three extension points. A CheckpointHandler (with
its CheckpointArgs) replaces the whole pytree logic and is used only by callers who name it in
``args=``; the v1 API (``orbax.checkpoint.experimental.v1``) is experimental and not what
``ocp.StandardCheckpointer`` or ``ocp.CheckpointManager`` run. A TypeHandler registered for
jax.Array in the global type-handler registry is what the standard pytree handler calls for
every jax.Array leaf, so existing StandardCheckpointer / CheckpointManager code stores its
arrays through ckptio unchanged, while Orbax keeps its own tree metadata, atomic directory
commit, multi-host barriers, step management and its handlers for other leaf types.

On disk: the pytree handler calls ``serialize`` once per save with every jax.Array leaf, so
they become one ckptio checkpoint, ``<item dir>/ckptio``, a flat dict keyed by Orbax's
parameter names ("params.dense.kernel"): ``ckptio.load(item_dir + "/ckptio")`` and
``ckptio.open`` read it without Orbax. ``serialize`` copies each process's own shards to host
memory (replica_id 0 only: a replicated box is written once, by the process holding replica
0) and returns a commit future that writes them with ``ckptio_save_dist`` (every process
writes its own data file; rank 0 merges the manifests and commits ``ckptio`` once all have
written). Orbax then waits for every process's commit future, syncs the processes with its
multihost barrier and only then finalizes and renames the step directory. ``deserialize``
reads, for each array, only the boxes of the target sharding's addressable devices, so any
saved sharding restores onto any other, in any number of processes.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from typing import Any, Sequence

import jax
import numpy as np
from orbax.checkpoint import future as ocp_future
from orbax.checkpoint import type_handlers as ocp_types
from orbax.checkpoint._src.metadata import sharding as ocp_sharding
from orbax.checkpoint._src.metadata import value as ocp_value

from . import _core
from ._errors import USAGE, CheckpointError, error
from ._load import Reader
from ._options import params
from ._tree import TREE_KEY
from .frameworks._jax import rebuild_sharding
from .frameworks._base import np_dtype
from .ranks import _dist
from .ranks._comm import JaxCommunicator, resolve

__all__ = ["ArrayHandler", "register", "unregister", "SUBDIR", "TYPESTR"]

#: The ckptio checkpoint's name inside the Orbax item directory.
SUBDIR = "ckptio"
#: The typestr Orbax records for arrays stored by this handler. It differs from Orbax's
#: "jax.Array" so that the default handler keeps reading Orbax's own checkpoints by name and
#: Orbax's tensorstore-specific metadata steps skip ours.
TYPESTR = "ckptio.jax.Array"


class ArrayHandler(ocp_types.TypeHandler):  # type: ignore[misc]
    """An Orbax TypeHandler storing jax.Array leaves through ckptio.

    ``timeout``: seconds a multi-process save waits for the other processes at each step.
    ``io_options``: as for ckptio.save / ckptio.load (backend, direct, checksums, ...).
    Checkpoints Orbax wrote itself (no ``ckptio`` directory) are read with Orbax's own
    ArrayHandler, so registering this one does not strand older checkpoints.
    """

    def __init__(self, *, timeout: float = _dist.DEFAULT_TIMEOUT, **io_options: Any) -> None:
        params(io_options)  # validates the names now rather than at the first save
        self._timeout = float(timeout)
        self._io = dict(io_options)
        self._fallback = ocp_types.ArrayHandler()
        # Orbax asks the jax.Array handler for its store of tensorstore write shapes; ckptio
        # has none, and saying so keeps Orbax from looking for one.
        self._array_metadata_store = None

    def typestr(self) -> str:
        return TYPESTR

    # ---- save ----

    async def serialize(
        self,
        values: Sequence[Any],
        infos: Sequence[Any],
        args: Sequence[Any] | None = None,
    ) -> list[Any]:
        args = args or [ocp_types.SaveArgs()] * len(values)
        ranks = resolve("jax", collective=False)
        multi = ranks is not None and ranks.size > 1
        tree: dict[str, Any] = {}
        for v, info, a in zip(values, infos, args):
            if multi and v.is_fully_addressable:
                raise error(
                    USAGE,
                    f"jax array '{info.name}' is local to process {ranks.rank} in a "
                    "multi-process save; make it a global array (jax.make_array_from_"
                    "process_local_data) so that each box has one owner",
                )
            if getattr(a, "dtype", None) is not None and np.dtype(a.dtype) != np.dtype(v.dtype):
                v = v.astype(a.dtype)
            tree[info.name] = v
        comm = _communicator(infos[0].parent_dir) if multi else _dist.SingleRank()
        staged: tuple[list[Any], bytes] | CheckpointError
        try:
            items, doc = _dist.stage(tree, int(comm.size))
            # Host copies taken now: once serialize returns, Orbax lets the caller donate or
            # delete the arrays while the commit future writes.
            staged = ([_owned(it) for it in items], doc)
        except CheckpointError as e:
            if not multi:
                raise
            staged = e  # the other processes learn it in the collective save below
        # Never overwrite: Orbax gives every save a fresh directory, and a second save into the
        # same one (Orbax's partial saves) would drop the arrays of the first.
        p = params(dict(self._io))
        timeout = self._timeout

        async def commit() -> None:
            for info in infos:
                await info.await_path_creation()
            path = _local_path(infos[0].parent_dir) + "/" + SUBDIR
            if isinstance(staged, CheckpointError):
                _dist.refuse(staged, comm, path, p, timeout)
                raise staged
            items, doc = staged
            meta = [(TREE_KEY, doc)] if comm.rank == 0 else []
            try:
                _core.save_dist(path, comm, items, meta, p, timeout)
            except CheckpointError as e:
                raise _dist._explain(e) from e.__cause__

        return [ocp_future.CommitFutureAwaitingContractedSignals(commit(), name="ckptio_array")]

    # ---- restore ----

    async def deserialize(
        self, infos: Sequence[Any], args: Sequence[Any] | None = None
    ) -> list[Any]:
        for info in infos:
            await info.await_path_creation()
        path = _local_path(infos[0].parent_dir) + "/" + SUBDIR
        if not os.path.isdir(path):
            return list(await self._fallback.deserialize(infos, args))
        args = args or [ocp_types.ArrayRestoreArgs()] * len(infos)
        return await asyncio.to_thread(self._read, path, infos, args)

    def _read(self, path: str, infos: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        from ._load import load

        with Reader(path, **self._io) as r:
            like = {info.name: self._like(r, path, info, a) for info, a in zip(infos, args)}
        out = load(path, like=like, **self._io)
        return [out[info.name] for info in infos]

    def _like(self, r: Reader, path: str, info: Any, a: Any) -> Any:
        if info.name not in r:
            raise error(
                USAGE,
                f"{path}: the checkpoint has no array '{info.name}' (it holds "
                f"{len(r)} arrays); restore with the tree it was saved with",
            )
        shape, saved_dtype, node = _saved(r, info.name)
        want = getattr(a, "global_shape", None) or getattr(a, "shape", None)
        if want is not None and tuple(want) != shape:
            raise error(
                USAGE,
                f"{path}: array '{info.name}' was saved with shape {shape} but the restore "
                f"asks for {tuple(want)}; ckptio restores arrays at their saved shape",
            )
        dtype = getattr(a, "dtype", None) or saved_dtype
        sharding = _target_sharding(a)
        if sharding is None:
            sharding = rebuild_sharding(node.get("sharding"))
        if sharding is None:
            ranks = resolve("jax", collective=False)
            if ranks is not None and ranks.size > 1:
                raise error(
                    USAGE,
                    f"{path}: no sharding to restore array '{info.name}' onto; pass a target "
                    "(jax.ShapeDtypeStruct with a sharding) or ArrayRestoreArgs(sharding=...)",
                )
            sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    async def metadata(self, infos: Sequence[Any]) -> list[Any]:
        for info in infos:
            await info.await_path_creation()
        path = _local_path(infos[0].parent_dir) + "/" + SUBDIR
        if not os.path.isdir(path):
            return list(await self._fallback.metadata(infos))
        out = []
        with Reader(path, **self._io) as r:
            for info in infos:
                shape, dtype, node = _saved(r, info.name)
                s = rebuild_sharding(node.get("sharding"))
                out.append(
                    ocp_value.ArrayMetadata(
                        name=info.name,
                        directory=info.parent_dir,
                        shape=shape,
                        sharding=ocp_sharding.from_jax_sharding(s) if s is not None else None,
                        dtype=dtype,
                    )
                )
        return out


def _saved(r: Reader, name: str) -> tuple[tuple[int, ...], np.dtype[Any], dict[str, Any]]:
    """Shape, dtype and tree node of array ``name`` as it was saved."""
    info = r.info(name)
    node = r._tensor_nodes().get(name, {})
    return Reader._elem_shape(node, info), np_dtype(node, info), node


def _target_sharding(a: Any) -> Any:
    """The jax Sharding an ArrayRestoreArgs asks for, or None."""
    s = getattr(a, "sharding", None)
    if s is not None and not isinstance(s, jax.sharding.Sharding):
        if isinstance(s, ocp_sharding.ShardingMetadata):
            s = s.to_jax_sharding()
        else:  # a jax Format (layout and sharding)
            s = getattr(s, "sharding", None)
    if s is None and getattr(a, "mesh", None) is not None and a.mesh_axes is not None:
        s = jax.sharding.NamedSharding(a.mesh, a.mesh_axes)
    return s


def _owned(it: tuple[Any, ...]) -> tuple[Any, ...]:
    data = it[3]
    if isinstance(data, np.ndarray):
        data = np.array(data, copy=True, order="C")
    return it[:3] + (data,) + it[4:]


def _local_path(p: Any) -> str:
    s = str(p)
    if _core.store_name(s) != "posix":  # an unknown scheme raises there, naming the known ones
        raise error(USAGE, f"{s}: ckptio's Orbax handler writes local (POSIX) file systems only")
    return os.path.abspath(s)


def _communicator(parent_dir: Any) -> Any:
    """A JAX communicator whose keys are named after the checkpoint directory (the same on
    every process), so that processes need not create communicators in the same order."""
    tag = hashlib.blake2b(_local_path(parent_dir).encode(), digest_size=8).hexdigest()
    return resolve(JaxCommunicator(f"orbax/{tag}"))


_previous: Any = None


def register(handler: ArrayHandler | None = None) -> ArrayHandler:
    """Make ``handler`` (default: ``ArrayHandler()``) Orbax's handler for jax.Array in the
    global type-handler registry: from now on StandardCheckpointer, PyTreeCheckpointer and
    CheckpointManager store jax arrays through ckptio. Returns the handler."""
    global _previous
    h = handler if handler is not None else ArrayHandler()
    current = ocp_types.get_type_handler(jax.Array)
    if not isinstance(current, ArrayHandler):
        _previous = current
        h._fallback = current  # Orbax's checkpoints are read as Orbax is configured to read them
    ocp_types.register_type_handler(jax.Array, h, override=True)
    return h


def unregister() -> None:
    """Give jax.Array back to the handler it had before register() (Orbax's own). Checkpoints
    saved through ckptio stay readable as long as a ckptio ArrayHandler is registered."""
    global _previous
    if _previous is not None:
        ocp_types.register_type_handler(jax.Array, _previous, override=True)
        _previous = None
