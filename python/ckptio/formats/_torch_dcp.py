# SPDX-License-Identifier: Apache-2.0
"""ckptio.torch.dcp: torch.distributed.checkpoint storage that writes and reads ckptio
checkpoints (``dcp.save(sd, storage_writer=StorageWriter(path))``, ``dcp.load(sd,
storage_reader=StorageReader(path))``).

A DCP save is one ckptio distributed save (ckptio_save_dist) over the job's ranks, made inside
``write_data``: each rank's tensor chunks become boxes of their global tensors, byte items
(DCP's pickled objects) u8 tensors, and the coordinator adds DCP's Metadata (pickled) and a
tree document, so ckptio.load, ``ckptio verify`` and ``ckptio inspect`` read the result. The
checkpoint is published atomically when every rank's part is durable; a rank that fails makes
every rank fail and leaves what was at the path. Loading reads, for each of DCP's read items,
only the box it asks for; a checkpoint without DCP's Metadata (written by ckptio.save) gets
Metadata made from its manifest and tree.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import uuid
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint import storage as _storage
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.futures import Future

from .. import _core, _dtypes
from .._errors import NOT_FOUND, USAGE, CheckpointError, error
from .._load import Reader
from .._options import params
from .._stage import ensure_parent
from ..frameworks._torch import _host_item, stored_dtype, tables
from ..ranks import _comm, _dist
from .._tree import TREE_KEY, decode_value, iter_leaves, leaf_name, make_document

__all__ = ["StorageWriter", "StorageReader", "METADATA_KEY"]

#: The checkpoint metadata key holding DCP's Metadata, pickled.
METADATA_KEY = "ckptio.dcp.metadata"


def _comm_for(group: Any, nplans: int | None) -> Any:
    """The communicator of the save: the process group's ranks, or this process alone (no
    torch.distributed, or a coordinator that planned for itself only: dcp.save(no_dist=True)
    on one rank of a job)."""
    if _comm.running("torch") is None or nplans == 1:
        return _dist.SingleRank()

    comm = _comm.resolve(group if group is not None else "torch")
    if nplans is not None and nplans != comm.size:
        raise error(
            USAGE,
            f"dcp.save planned for {nplans} ranks but the StorageWriter's group has "
            f"{comm.size}: pass the process group given to dcp.save as "
            "StorageWriter(path, process_group=...)",
        )
    return comm


def _tree_document(md: Metadata) -> bytes:
    """A flat dict by FQN: tensors come back from ckptio.load as torch tensors, byte items as
    numpy u8 arrays (DCP's torch.save'd bytes)."""
    import json

    keys: list[str] = []
    nodes: list[dict[str, Any]] = []
    for fqn, m in md.state_dict_metadata.items():
        keys.append(fqn)
        if isinstance(m, TensorStorageMetadata):
            dt = str(m.properties.dtype).removeprefix("torch.")
            nodes.append({"t": "tensor", "f": "torch", "dtype": dt})
        else:
            nodes.append({"t": "tensor", "f": "numpy"})
    doc = make_document({"t": "dict", "k": keys, "v": nodes})
    return json.dumps(doc, separators=(",", ":")).encode()


class StorageWriter(_storage.StorageWriter):
    """Writes a DCP save as a ckptio checkpoint at ``path``.

    ``timeout``: seconds each step of the collective save waits for the other ranks.
    ``overwrite``: replace a checkpoint already at ``path`` (default True, as DCP's
    FileSystemWriter). ``process_group``: the group given to dcp.save, if not the default one.
    ``io_options``: ckptio's I/O options (backend, direct, fsync, ...).

    The writer pickles (for ``async_save`` in a separate process): the process group is not
    carried, the process's default group is used there.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        timeout: float = _dist.DEFAULT_TIMEOUT,
        overwrite: bool = True,
        process_group: Any = None,
        **io_options: Any,
    ) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.timeout = float(timeout)
        self.overwrite = bool(overwrite)
        self.io_options = dict(io_options)
        params(self.io_options)  # refuse unknown options now, not on the first save
        self.process_group = process_group
        self.save_id = uuid.uuid4().hex
        self.is_coordinator = False
        self.last_stats: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["process_group"] = None
        return state

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self.save_id = uuid.uuid4().hex

    @property
    def checkpoint_id(self) -> str:
        return self.path

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        self._nplans: int | None = None

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # Only the coordinator learns how many ranks take part; the others are in the group.
        self._nplans = len(plans)
        return plans

    def _stage(self, plan: SavePlan, planner: SavePlanner) -> list[_dist.DistItem]:
        items: list[_dist.DistItem] = []
        for wi in plan.items:
            data = planner.resolve_data(wi)
            fqn = wi.index.fqn
            if wi.type == WriteItemType.BYTE_IO:
                raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                arr = np.frombuffer(raw, np.uint8) if raw else np.empty(0, np.uint8)
                items.append((fqn, _dtypes.U8, (arr.size,), arr, None, None, 0))
                continue
            td = wi.tensor_data
            assert td is not None
            item = _host_item(fqn, data)
            items.append(_dist._from_add(item, tuple(td.size), tuple(td.chunk.offsets)))
        return items

    def _meta(self, planner: SavePlanner) -> list[tuple[str, bytes]]:
        """The coordinator's metadata: DCP's global Metadata, which the default planner keeps
        from create_global_plan (a planner that does not: the reader makes it from the
        manifest), and the tree document."""
        md = getattr(planner, "metadata", None) if self.is_coordinator else None
        if not isinstance(md, Metadata):
            return []
        md = dataclasses.replace(md, storage_data=None)
        return [(TREE_KEY, _tree_document(md)), (METADATA_KEY, pickle.dumps(md))]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[Any]]:
        comm = _comm_for(self.process_group, getattr(self, "_nplans", None))
        p = params(self.io_options, overwrite=self.overwrite)
        try:
            items = self._stage(plan, planner)
            meta = self._meta(planner)
            ensure_parent(self.path)
        except BaseException as e:
            # Still take part, refusing (ckptio_save_dist_refuse), so that the other ranks fail
            # at once naming this rank instead of at the timeout.
            why = e if isinstance(e, CheckpointError) else error(
                USAGE, f"cannot stage: {type(e).__name__}: {e}"
            )
            _dist.refuse(why, comm, self.path, p, self.timeout)
            raise
        try:
            self.last_stats = _core.save_dist(self.path, comm, items, meta, p, self.timeout)
        except CheckpointError as e:
            raise _dist._explain(e) from e.__cause__
        results = [
            _storage.WriteResult(index=wi.index, size_in_bytes=_nbytes(wi), storage_data=None)
            for wi in plan.items
        ]
        fut: Future[list[Any]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[Any]]) -> None:
        # write_data published the checkpoint, with this Metadata, once every rank had
        # written: nothing is left to do.
        return None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))


def _nbytes(wi: Any) -> int:
    td = wi.tensor_data
    if td is None:
        return 0
    n = td.properties.dtype.itemsize
    for d in td.chunk.sizes:
        n *= int(d)
    return n


# ---- reading ----


def _synthesize(r: Reader) -> tuple[Metadata, dict[str, str], dict[str, Any]]:
    """DCP Metadata for a checkpoint that has none (written by ckptio.save): a tensor per
    tensor leaf with the manifest's chunks, a byte item per plain value. Also FQN -> stored
    tensor name (tied tensors share one) and FQN -> plain value."""
    raw = r._raw()
    sdm: dict[str, Any] = {}
    names: dict[str, str] = {}
    values: dict[str, Any] = {}
    for path, node in iter_leaves(r._tree()):
        fqn = leaf_name(path)
        t = node["t"]
        if t == "tensor":
            name = node.get("alias", fqn)
            real = r._tensor_nodes().get(name, node)
            info = r._info(name)
            dt = stored_dtype(real, info)
            elem = r._elem_shape(real, info)
            chunks = [
                ChunkStorageMetadata(
                    offsets=torch.Size(c.offset[: len(elem)]), sizes=torch.Size(c.shape[: len(elem)])
                )
                for c in r._r.chunks(raw[name][0])
            ]
            sdm[fqn] = TensorStorageMetadata(
                properties=TensorProperties(dtype=dt), size=torch.Size(elem), chunks=chunks
            )
            names[fqn] = name
        elif t == "ranklocal":
            continue  # each rank's own state: not global state DCP could place
        else:
            values[fqn] = decode_value(node)
            sdm[fqn] = BytesStorageMetadata()
    return Metadata(state_dict_metadata=sdm), names, values


class StorageReader(_storage.StorageReader):
    """Reads a ckptio checkpoint at ``path`` for dcp.load: one written through StorageWriter,
    or by ckptio.save (its tensor leaves by key path, plain values as byte items).

    Each read item is read as a region of its stored tensor: only the bytes of its box, into
    the destination tensor's memory where that is a contiguous CPU tensor of the stored dtype.
    ``io_options``: ckptio's I/O options (backend, direct, checksums, ...).
    """

    def __init__(self, path: str | os.PathLike[str], **io_options: Any) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.io_options = dict(io_options)
        params(self.io_options)
        self.load_id = uuid.uuid4().hex
        self._names: dict[str, str] = {}
        self._values: dict[str, Any] = {}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self.load_id = uuid.uuid4().hex
        self._names, self._values = {}, {}

    @property
    def checkpoint_id(self) -> str:
        return self.path

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        with Reader(self.path, **self.io_options) as r:
            blob = r._r.get_meta(METADATA_KEY)
            if blob is not None:
                md = pickle.loads(blob)
                self._names, self._values = {}, {}
            else:
                md, self._names, self._values = _synthesize(r)
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        self.metadata = metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        with Reader(self.path, **self.io_options) as r:
            self._read(r, plan, planner)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _read(self, r: Reader, plan: LoadPlan, planner: LoadPlanner) -> None:
        raw = r._raw()
        regions: list[Any] = []
        # (read item, destination, staging tensor or None, byte buffer or None)
        done: list[tuple[Any, Any, Any, Any]] = []
        for req in plan.items:
            fqn = req.storage_index.fqn
            if req.type == LoadItemType.BYTE_IO and fqn in self._values:
                b = io.BytesIO()
                torch.save(self._values[fqn], b)
                b.seek(0)
                planner.load_bytes(req, b)
                continue
            name = self._names.get(fqn, fqn)
            t = raw.get(name)
            if t is None:
                raise error(NOT_FOUND, f"{self.path}: no tensor '{name}' in the checkpoint")
            index, code, shape = t[0], t[1], t[2]
            if req.type == LoadItemType.BYTE_IO:
                buf = np.empty(t[3], np.uint8)
                regions.append(_core.read_region(index, None, None, buf, 0, buf.nbytes))
                done.append((req, None, None, buf))
                continue
            off = tuple(int(a) + int(b) for a, b in zip(req.storage_index.offset, req.storage_offsets))
            box = tuple(int(n) for n in req.lengths)
            target = planner.resolve_tensor(req).detach()
            if tuple(target.shape) != box:
                raise error(
                    USAGE,
                    f"{self.path}: tensor '{name}': DCP asks for a box of shape {box} into a "
                    f"tensor of shape {tuple(target.shape)}",
                )
            dt = tables()[1].get(code) if code != _dtypes.BYTES else None
            direct = (
                dt is not None
                and target.dtype == dt
                and target.device.type == "cpu"
                and target.is_contiguous()
                and target.numel() > 0
            )
            stage = None if direct else torch.empty(box, dtype=self._dtype_of(r, name, target))
            dst = target if direct else stage
            if code == _dtypes.BYTES:  # raw bytes: a trailing dimension of the item size
                off, box = off + (0,), box + (int(shape[-1]),)
            n = dst.numel() * dst.element_size()
            if n:
                view = dst.reshape(-1).view(torch.uint8).numpy()
                regions.append(_core.read_region(index, off, box, view, 0, n))
            done.append((req, target, stage, None))
        if regions:
            r._r.read(regions)
        for req, target, stage, buf in done:
            if buf is not None:
                planner.load_bytes(req, io.BytesIO(buf.tobytes()))
                continue
            if stage is not None:
                target.copy_(stage)
            planner.commit_tensor(req, target)

    def _dtype_of(self, r: Reader, name: str, target: Any) -> Any:
        info = r._info(name)
        node = r._tensor_nodes().get(name, {"t": "tensor", "f": "numpy"})
        try:
            return stored_dtype(node, info)
        except CheckpointError:
            return target.dtype

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))
