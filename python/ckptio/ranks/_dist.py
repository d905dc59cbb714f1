# SPDX-License-Identifier: Apache-2.0
"""Saving one checkpoint from many processes: the leaf wrappers (Shard, RankLocal), the staging
of a rank's part of the tree as ckptio_save_dist items, and the rank-local state on load."""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import numpy as np

from .. import _core, _dtypes
from .. import _stage as _staging
from .._errors import NOT_FOUND, USAGE, CheckpointError, InvalidType, carry_values, error
from .._stage import ensure_parent
from .._tree import (
    TREE_KEY,
    flatten,
    iter_leaves,
    leaf_name,
    make_document,
    parse_document,
    unflatten,
)
from ..frameworks import _gpu
from ..frameworks import _registry as _adapters
from ..frameworks._base import Deferred, Node
from ..frameworks._jax import JAX, index_box
from ..frameworks._torch import TORCH, _device_item, _dtensor_type, _host_item
from ._comm import resolve, running

__all__ = ["Shard", "RankLocal", "DEFAULT_TIMEOUT"]

#: Seconds a distributed save waits for the other ranks at each step.
DEFAULT_TIMEOUT = 300.0
RANK_LOCAL = 1  # CKPTIO_DIST_RANK_LOCAL
#: A digest of each rank's tree document, saved as a plain (replicated) tensor: ranks whose
#: trees differ fail the save with the C plan's diverging-replica check, at no extra exchange.
TREE_DIGEST = "ckptio.tree-digest"
#: Within a RankLocal leaf at path P: the subtree's document is tensor "P/#tree", its tensors
#: "P/<name>"; the C library stores each as "<name>@rank<R>".
LOCAL_TREE = "#tree"

# Set once a Shard or RankLocal exists, so that plain saves never walk the tree looking for them.
_wrappers_used = False


def _shape_of(data: Any) -> tuple[int, ...]:
    """An array's shape; a GPU array known only by its __cuda_array_interface__ has one too."""
    shape = getattr(data, "shape", None)
    if shape is None and hasattr(type(data), "__cuda_array_interface__"):
        shape = data.__cuda_array_interface__["shape"]
    return tuple(int(d) for d in (shape or ()))


class Shard:
    """A box of a global array: ``data`` (a numpy array, a torch tensor...) is the part at
    ``offset`` of an array of shape ``global_shape``. In ``ckptio.save(..., comm=...)`` every
    rank passes its own boxes; together they must cover the global array exactly (boxes held
    by several ranks must be equal). Loading gives the global array."""

    __slots__ = ("data", "offset", "global_shape")

    def __init__(self, data: Any, offset: tuple[int, ...], global_shape: tuple[int, ...]) -> None:
        global _wrappers_used
        _wrappers_used = True
        self.data = data
        self.offset = tuple(int(o) for o in offset)
        self.global_shape = tuple(int(d) for d in global_shape)
        shape = _shape_of(data)
        if len(self.offset) != len(shape) or len(self.global_shape) != len(shape):
            raise error(
                USAGE,
                f"Shard: data of shape {shape} needs an offset and a global_shape of "
                f"{len(shape)} dimensions (got {self.offset} and {self.global_shape})",
            )
        for o, n, g in zip(self.offset, shape, self.global_shape):
            if o < 0 or o + n > g:
                raise error(
                    USAGE,
                    f"Shard: the box at offset {self.offset} of shape {shape} is not inside "
                    f"the global shape {self.global_shape}",
                )

    def __repr__(self) -> str:
        shape = _shape_of(self.data)
        return f"Shard(shape={shape}, offset={self.offset}, global_shape={self.global_shape})"


class RankLocal:
    """State that is each rank's own (an RNG state, a data loader position): any subtree of
    tensors and plain values, saved per rank and never compared between ranks. Loading it on
    the ranks of a communicator gives each rank its own value (None on a rank the save did not
    have); loading it in one process without ``comm=`` gives a dict {rank: value}."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        global _wrappers_used
        _wrappers_used = True
        self.value = value

    def __repr__(self) -> str:
        return f"RankLocal({self.value!r})"


# ---- finding what needs a distributed save ----


def _is_global_jax(obj: Any) -> bool:
    j = sys.modules.get("jax")
    return j is not None and isinstance(obj, j.Array) and not obj.is_fully_addressable


def runtime_of(tree: Any) -> str | None:
    """The communicator a save without ``comm=`` needs: "torch" for a DTensor on a mesh of
    several processes, "jax" for a jax.Array that is not fully addressable, "local" for Shard
    and RankLocal leaves only (a one-rank distributed save), None for a plain save."""
    dtensor = _dtensor_type()
    multi = False
    if dtensor is not None:
        torch_ranks = running("torch")
        multi = torch_ranks is not None and torch_ranks.size > 1
    jax_ranks = running("jax")
    jax_multi = jax_ranks is not None and jax_ranks.size > 1
    if dtensor is None and not jax_multi and not _wrappers_used:
        return None
    found: list[str] = []

    def visit(obj: Any) -> None:
        tp = type(obj)
        if tp is dict or isinstance(obj, dict):
            for v in obj.values():
                visit(v)
        elif tp is list or tp is tuple or isinstance(obj, (list, tuple)):
            for v in obj:
                visit(v)
        elif isinstance(obj, (Shard, RankLocal)):
            found.append("local")
        elif dtensor is not None and isinstance(obj, dtensor):
            # A mesh of this process alone is a one-rank save.
            found.append("torch" if multi and obj.device_mesh.size() > 1 else "local")
        elif jax_multi and _is_global_jax(obj):
            found.append("jax")

    visit(tree)
    for kind in ("torch", "jax", "local"):
        if kind in found:
            return kind
    return None


def save_comm(tree: Any, comm: Any, p: Any, timeout: float | None) -> tuple[Any, float]:
    """The communicator a save of ``tree`` runs over and its timeout: (None, 0.0) for a save
    of this process alone, SingleRank for a one-rank collective save (Shard and RankLocal
    leaves), else ``comm`` (or the runtime the tree's arrays span) resolved. Refuses, before
    anything is staged, roots= (striping is per process) and a timeout that is not > 0."""
    kind = runtime_of(tree) if comm is None else "comm"
    if kind is None:
        return None, 0.0
    if "roots" in p:
        raise error(USAGE, "roots= (striping) is not supported for a multi-rank save")
    t = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    if not t > 0:
        raise error(USAGE, f"timeout must be > 0 seconds, got {timeout!r}")
    if kind == "local":
        return SingleRank(), t
    return resolve(comm if comm is not None else kind), t


class SingleRank:
    """The communicator of a one-rank distributed save (Shard and RankLocal without comm=)."""

    rank = 0
    size = 1

    def barrier(self, timeout: float) -> None:
        return None

    def broadcast(self, root: int, data: bytes | None, timeout: float) -> bytes:
        return bytes(data or b"")

    def gather(self, root: int, data: bytes, timeout: float) -> list[bytes]:
        return [bytes(data)]


# ---- staging ----


class _Kind:
    """What flatten() records as a leaf's "f" for the wrappers and distributed arrays."""

    def __init__(self, name: str) -> None:
        self.name = name


_RANK_LOCAL = _Kind("ranklocal")
_SHARD = _Kind("shard")
_DTENSOR = _Kind("torch")
_GLOBAL_JAX = _Kind("jax")

Dims = tuple[int, ...]
# (name, dtype code, global shape, data, offset or None, box or None, flags); for GPU memory
# (doc/gpu.md) data is the device pointer, followed by (nbytes, CUstream, owner kept alive).
DistItem = tuple[Any, ...]


def _from_add(
    it: Any,
    gshape: tuple[int, ...] | None = None,
    offset: tuple[int, ...] | None = None,
    name: str | None = None,
    flags: int = 0,
) -> DistItem:
    """A save_dist item from an AddItem (name, code, shape, data, chunk offset, chunk shape);
    with ``gshape``/``offset``: the AddItem holds the whole of a box at ``offset`` of a global
    tensor of shape ``gshape`` (raw-byte dtypes get their trailing item-size dimension). A
    DeviceItem (GPU memory) gives the same fields with its device pointer as data, then its
    size, stream and owner."""
    dev = it if isinstance(it, _gpu.DeviceItem) else None
    if dev is not None:
        it = (dev.name, dev.code, dev.shape, dev.ptr, dev.offset, dev.chunk_shape)
    nm, code, shape, data, off, cshape = it
    if shape is None:  # the data's own
        shape = tuple(data.shape) if hasattr(data, "shape") else memoryview(data).shape
    shape = tuple(shape)
    if gshape is not None:
        assert off is None
        extra = shape[len(gshape) :]  # (itemsize,) for raw bytes
        box: tuple[int, ...] | None = shape
        off = tuple(offset or (0,) * len(gshape)) + (0,) * len(extra)
        shape = tuple(gshape) + extra
    else:
        box = tuple(cshape) if cshape is not None else None
        off = tuple(off) if off is not None else None
    if dev is not None:
        return (name or nm, code, shape, data, off, box, flags, dev.nbytes, dev.stream, dev.keep)
    return (name or nm, code, shape, data, off, box, flags)


def _items_of(staged: Any) -> list[Any]:
    return staged.make() if type(staged) is Deferred else staged


def _stage_dtensor(name: str, t: Any, node: Node) -> list[DistItem]:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor import Shard as TShard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset


    for p in t.placements:
        if type(p) is not TShard and type(p) is not Replicate:
            raise error(
                USAGE,
                f"tensor '{name}': DTensor placement {p!r} is not a plain box of the global "
                "tensor; ckptio saves Shard(dim) and Replicate placements (redistribute it "
                "first, e.g. t.redistribute(placements=[Shard(0)]))",
                InvalidType,
            )
    TORCH.describe(name, t, node)
    node.pop("device", None)  # each rank's own; load places tensors by like= or device=
    node["dist"] = [str(p) for p in t.placements]
    local = t.to_local()
    gshape = tuple(t.shape)
    lshape, goff = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    lshape, goff = tuple(lshape), tuple(goff)
    if tuple(local.shape) != lshape:
        raise error(
            USAGE,
            f"tensor '{name}': the local shard has shape {tuple(local.shape)} but its placements "
            f"{node['dist']} on this rank give {lshape}; ckptio saves evenly chunked shards "
            "(torch.chunk's split) only",
            InvalidType,
        )
    if local.device.type == "cuda" and _gpu.route():  # by device pointer, no .cpu()
        return [_from_add(_device_item(name, local), gshape, goff)]
    return [_from_add(_host_item(name, local), gshape, goff)]


def _stage_global_jax(name: str, x: Any, node: Node) -> list[DistItem]:

    JAX.describe(name, x, node)
    try:
        dt = np.dtype(x.dtype)
    except TypeError:
        raise error(
            USAGE, f"jax array '{name}' has dtype {x.dtype}, which has no fixed byte layout"
        ) from None
    code = _dtypes.np_to_code().get(dt)
    shape = tuple(x.shape)
    out: list[DistItem] = []
    seen: set[Any] = set()
    for shard in x.addressable_shards:
        if shard.replica_id != 0:  # the replica with id 0 is on exactly one process
            continue
        box = index_box(shard.index, shape)
        if box in seen:
            continue
        seen.add(box)
        data = shard.data
        if getattr(shard.device, "platform", "cpu") in ("gpu", "cuda") and _gpu.route():
            # From its device buffer once ready; the (immutable) array stays alive in the item.
            data.block_until_ready()
            ondev = _gpu.OnDevice(int(data.unsafe_buffer_pointer()), data.nbytes, data)
            out.append(_from_add(ondev.item(name, code, dt, shape, box, node)))
            continue
        host = np.ascontiguousarray(np.asarray(data))
        if code is None:
            node["dtype"] = _dtypes.np_dtype_name(dt)
            raw = host.reshape(-1).view(np.uint8) if host.size else np.empty(0, np.uint8)
            out.append((name, _dtypes.BYTES, shape + (dt.itemsize,), raw,
                        box[0] + (0,), box[1] + (dt.itemsize,), 0))  # fmt: skip
        else:
            out.append((name, code, shape, host, box[0], box[1], 0))
    return out


def _stage_shard(name: str, s: Shard, node: Node) -> list[DistItem]:
    ad = _adapters.classify(s.data)
    if ad is None:
        raise error(USAGE, f"Shard at '{name}': data must be an array or tensor", InvalidType)
    node["f"] = ad.name
    ad.describe(name, s.data, node)
    node.pop("device", None)
    node.pop("sharding", None)
    staged = _items_of(ad.stage(name, s.data, node))
    one = staged[0] if len(staged) == 1 else None
    if one is None or (one.offset if isinstance(one, _gpu.DeviceItem) else one[4]) is not None:
        raise error(USAGE, f"Shard at '{name}': data must be one array held by this process")
    return [_from_add(staged[0], s.global_shape, s.offset)]


def _stage_rank_local(name: str, r: RankLocal, node: Node, nranks: int) -> list[DistItem]:

    sub = _staging._stage(r.value)
    out: list[DistItem] = []
    for it in sub.items:
        for a in it.make() if type(it) is Deferred else [it]:
            out.append(_from_add(a, name=f"{name}/{a[0]}", flags=RANK_LOCAL))
    doc = np.frombuffer(sub.tree, np.uint8)
    out.append((f"{name}/{LOCAL_TREE}", _dtypes.U8, (doc.size,), doc, None, None, RANK_LOCAL))
    node.clear()
    node.update({"t": "ranklocal", "n": nranks})
    return out


def stage(tree: Any, nranks: int, gpu: int | None = None) -> tuple[list[DistItem], bytes]:
    """This rank's items for ckptio_save_dist and the tree document (rank 0's is stored).
    ``gpu``: the gpu= I/O option, for a save that writes the items before it returns: GPU
    arrays are then given by device pointer (doc/gpu.md); None (save_async, Orbax, which keep
    the items past the call): host copies."""
    with _gpu.asked(_gpu.HOST_ONLY if gpu is None else gpu):
        return _stage(tree, nranks)


def _stage(tree: Any, nranks: int) -> tuple[list[DistItem], bytes]:
    dtensor = _dtensor_type()

    def classify(obj: Any) -> Any:
        if isinstance(obj, RankLocal):
            return _RANK_LOCAL
        if isinstance(obj, Shard):
            return _SHARD
        if dtensor is not None and isinstance(obj, dtensor):
            return _DTENSOR
        if _is_global_jax(obj):
            return _GLOBAL_JAX
        return _adapters.classify(obj)

    root, leaves = flatten(tree, classify=classify)
    items: list[DistItem] = []
    for name, obj, node in leaves:
        if isinstance(obj, RankLocal):
            items.extend(_stage_rank_local(name, obj, node, nranks))
        elif isinstance(obj, Shard):
            items.extend(_stage_shard(name, obj, node))
        elif dtensor is not None and isinstance(obj, dtensor):
            items.extend(_stage_dtensor(name, obj, node))
        elif _is_global_jax(obj):
            items.extend(_stage_global_jax(name, obj, node))
        else:
            ad = _adapters.BY_NAME[node["f"]]
            ad.describe(name, obj, node)
            node.pop("device", None)
            for a in _items_of(ad.stage(name, obj, node)):
                items.append(_from_add(a))
    doc = json.dumps(make_document(root), separators=(",", ":")).encode()
    digest = np.frombuffer(hashlib.blake2b(doc, digest_size=16).digest(), np.uint8)
    items.append((TREE_DIGEST, _dtypes.U8, (16,), digest, None, None, 0))
    return items, doc


def stage_or_refuse(
    tree: Any, comm: Any, path: str, p: Any, timeout: float, gpu: int | None = None
) -> tuple[list[tuple[Any, ...]], bytes]:
    """stage(tree) for a collective save over ``comm``; when this rank cannot stage, it still
    takes part, refusing (refuse()), so the other ranks fail at once naming this rank instead of
    at the timeout; then it raises its own error."""
    try:
        return stage(tree, int(comm.size), gpu)
    except CheckpointError as e:
        refuse(e, comm, path, p, timeout)
        raise


def refuse(e: CheckpointError, comm: Any, path: str, p: Any, timeout: float) -> None:
    """Take part in the collective save of ``path`` refusing it (ckptio_save_dist_refuse) with
    this rank's staging error ``e``: the other ranks fail at once with its code, its message and
    this rank's number (their exception's ``rank``, with ``refused`` set). ``e`` gets the same
    values, so that every rank's exception says who refused."""
    try:
        _core.save_dist_refuse(path, comm, e.code, str(e), p, timeout)
    except CheckpointError:
        pass
    if e.rank is None:
        e.rank, e.refused = int(comm.rank), True
    if e.path is None:
        e.path = path


def save(
    tree: Any,
    path: str,
    comm: Any,
    meta: list[tuple[str, bytes]],
    p: Any,
    timeout: float,
) -> Any:
    """ckptio_save_dist of ``tree`` over ``comm`` (a ckptio.ranks._comm.Communicator): collective.
    Afterwards, _gpu.take_note() says how GPU arrays went (for Stats.gpu)."""

    if not timeout > 0:
        raise error(USAGE, f"timeout must be > 0 seconds, got {timeout!r}")
    _gpu.take_note()
    items, doc = stage_or_refuse(tree, comm, path, p, timeout, p["gpu"])
    if any(len(it) > 7 for it in items):
        _gpu.note(GPU_NOTE)
    ensure_parent(path)
    meta_items = [(TREE_KEY, doc)] + meta if comm.rank == 0 else []
    try:
        return _core.save_dist(path, comm, items, meta_items, p, timeout)
    except CheckpointError as e:
        raise _explain(e) from e.__cause__


#: Stats.gpu of a distributed save that gave GPU arrays by device pointer: each rank's writer
#: chose staged or GDS for its own files (not reported back through ckptio_save_dist).
GPU_NOTE = "device (staged or gds, per rank)"

def _explain(e: CheckpointError) -> CheckpointError:
    """The plan's error, said in the terms of the Python layer where it comes from it: read
    from the exception's values (rank, refused, tensor, other_rank), never from its text."""
    if e.refused and e.rank is not None:
        out = type(e)(
            f"rank {e.rank} could not stage its part of the tree, so nothing was saved ({e})",
            e.code,
            e.name,
        )
        return carry_values(e, out)
    if e.tensor == TREE_DIGEST:
        both = e.rank is not None and e.other_rank is not None
        who = f"ranks {e.rank} and {e.other_rank}" if both else "the ranks"
        out = type(e)(
            f"{who} saved different trees (structure, plain values or dtypes), so nothing was "
            "saved: every rank must pass the same tree, with rank-specific values wrapped in "
            "ckptio.RankLocal",
            e.code,
            e.name,
        )
        return carry_values(e, out)
    return e


# ---- loading rank-local state ----


def load_rank_local(reader: Any, path: str, node: Node, rank: int | None) -> Any:
    """The value of the RankLocal leaf at ``path``: rank ``rank``'s, or {rank: value} for all
    ranks when ``rank`` is None."""
    n = int(node.get("n", 0))
    if rank is None:
        return {r: _load_one(reader, path, r) for r in range(n)}
    if rank >= n:
        return None
    return _load_one(reader, path, rank)


def _load_one(reader: Any, path: str, rank: int) -> Any:

    base = leaf_name(path)
    suffix = f"@rank{rank}"
    raw = reader._raw()
    doc_name = f"{base}/{LOCAL_TREE}{suffix}"
    if doc_name not in raw:
        raise error(
            NOT_FOUND, f"{reader.path}: rank-local state '{base}' of rank {rank} is missing"
        )
    doc = reader._build({doc_name: ({"t": "tensor", "f": "numpy"}, None)})[doc_name]
    sub = parse_document(json.loads(bytes(np.asarray(doc))))
    wanted: dict[str, tuple[Node, Any]] = {}
    stored: dict[str, str] = {}
    for p, n in iter_leaves(sub):
        if n["t"] != "tensor":
            continue
        name = f"{base}/{n.get('alias', leaf_name(p))}{suffix}"
        plain = {k: v for k, v in n.items() if k not in ("alias", "same")}
        stored[p] = name
        wanted[name] = (plain, None)
    built = reader._build(wanted)
    return unflatten(sub, lambda p, n: built[stored[p]])


def classify_like(obj: Any) -> Any:
    """load's like= leaves: a framework's arrays, or a RankLocal (its saved value comes back)."""
    if isinstance(obj, RankLocal):
        return _RANK_LOCAL
    return _adapters.classify_like(obj)
