# SPDX-License-Identifier: Apache-2.0
"""ckptio.save: flatten a tree and stream every tensor from its own memory into a checkpoint."""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from . import _core, _dtypes, _jax
from ._errors import DTYPE, USAGE, CheckpointError, InvalidType, _from_code, error
from ._options import Stats, params
from ._tree import NUMPY_LEAF, TREE_KEY, Node, flatten, make_document, pause_gc

__all__ = ["save", "RESERVED_PREFIX"]

#: Metadata keys starting with this are ckptio's own.
RESERVED_PREFIX = "ckptio."

# Host copies of device tensors are handed to the writer in batches of about this many bytes,
# then released after a flush, so a save never holds a second copy of a whole GPU model.
_TRANSIENT_BATCH = 256 << 20

PathLike = str | os.PathLike[str]


def _classify(obj: Any, path: str) -> str | None:
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(obj, torch.Tensor):
            return "torch"
        if type(obj) is torch.Size:
            return "torch.Size"
    if _jax.is_array(obj):
        return "jax"
    return None


def _numpy_item(name: str, arr: np.ndarray, node: Node) -> tuple[Any, ...]:
    """The add() tuple of a numpy array whose dtype is not stored as itself."""
    dt = arr.dtype
    if dt.byteorder not in "=|" and dt.newbyteorder("=") in _dtypes.np_to_code():
        arr = arr.astype(dt.newbyteorder("="))
        return (name, _dtypes.np_to_code()[arr.dtype], arr.shape, _contiguous(arr))
    if dt.hasobject or dt.names is not None or dt.subdtype is not None or dt.itemsize == 0:
        raise _dtypes_error(name, dt)
    # Stored as raw bytes with a trailing dimension of the item size; the tree keeps the dtype.
    node["dtype"] = _dtypes.np_dtype_name(dt)
    arr = _contiguous(arr)
    raw = arr.reshape(-1).view(np.uint8) if arr.size else np.empty(0, np.uint8)
    return (name, _dtypes.BYTES, arr.shape + (dt.itemsize,), raw)


def _contiguous(arr: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it turns 0-d arrays into 1-d ones.
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def _dtypes_error(name: str, dt: Any) -> CheckpointError:
    return error(
        DTYPE, f"tensor '{name}': dtype {dt} cannot be stored (object, structured or zero-size)"
    )


class _Torch:
    """Per-save state for torch tensors: the dtype tables and the views already stored."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.to_code, _, self.view_as = _dtypes.torch_tables()
        self.seen: dict[tuple[Any, ...], tuple[str, Any]] = {}

    def item(self, name: str, t: Any, node: Node) -> tuple[tuple[Any, ...] | None, int]:
        """(add() tuple or None for an alias, bytes of any host copy made)."""
        torch = self.torch
        if t.layout != torch.strided or t.is_quantized or t.is_nested:
            raise error(
                USAGE,
                f"tensor '{name}' has layout {t.layout}; ckptio stores dense tensors "
                "(call .to_dense() first)",
                InvalidType,
            )
        node["dtype"] = str(t.dtype).removeprefix("torch.")
        if isinstance(t, torch.nn.Parameter):
            node["param"] = True
        if t.requires_grad:
            node["grad"] = True
        if t.device.type != "cpu":
            node["device"] = str(t.device)
        if t.numel():
            # The same view of the same storage (tied weights) is stored once.
            key = (
                t.device,
                t.untyped_storage().data_ptr(),
                t.storage_offset(),
                tuple(t.shape),
                t.stride(),
                t.dtype,
            )
            first = self.seen.get(key)
            if first is not None:
                node["alias"] = first[0]
                if first[1] is t:
                    node["same"] = True
                return None, 0
            self.seen[key] = (name, t)
        d = t.detach()
        copied = 0
        if d.device.type != "cpu":
            d = d.cpu()
            copied = d.nbytes
        if d.is_conj():
            d = d.resolve_conj()
        if d.is_neg():
            d = d.resolve_neg()
        if not d.is_contiguous():
            d = d.contiguous()
        code = self.to_code.get(d.dtype)
        shape = tuple(d.shape)
        view = self.view_as.get(d.dtype)
        host = (d.view(view) if view is not None else d).numpy()
        if code is None:
            code = _dtypes.BYTES
            shape = shape + (d.element_size(),)
            host = host.reshape(-1).view(np.uint8) if host.size else np.empty(0, np.uint8)
        return (name, code, shape, host), copied


def _make_parent(parent: str, path: str) -> None:
    """Create ``parent``, refusing with ckptio's own error where a file stands in the way."""
    top = parent
    while not os.path.lexists(top):
        top = os.path.dirname(top)
    if not os.path.isdir(top):
        raise _from_code(
            -errno.ENOTDIR,
            "ENOTDIR",
            f"cannot save '{path}': '{top}' is a file, not a directory; choose another path",
        )
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        code = e.errno or errno.EIO
        raise _from_code(
            -code,
            errno.errorcode.get(code, "EIO"),
            f"cannot save '{path}': cannot create the directory '{parent}': {e.strerror}",
        ) from None


def _meta_items(metadata: Mapping[str, str] | None) -> list[tuple[str, bytes]]:
    if metadata is None:
        return []
    if not isinstance(metadata, Mapping):
        raise error(USAGE, "metadata must be a dict of str to str", InvalidType)
    out = []
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise error(
                USAGE,
                f"metadata {k!r}: keys and values must be str (got {type(v).__name__}); "
                "put other values in the tree itself",
                InvalidType,
            )
        if k.startswith(RESERVED_PREFIX):
            raise error(USAGE, f"metadata key {k!r}: keys starting with 'ckptio.' are reserved")
        out.append((k, v.encode()))
    return out


def save(
    tree: Any,
    path: PathLike,
    *,
    overwrite: bool = False,
    metadata: Mapping[str, str] | None = None,
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
    ``io_options``: backend ("auto", "io_uring", "psync", "buffered"), direct (None = O_DIRECT
    where allowed, True, False), fsync (True), checksums (True), queue_depth, io_threads,
    staging_bytes, request_bytes.

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
    meta = _meta_items(metadata)
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        _make_parent(parent, path)  # as checkpoint managers do: "ckpts/step-100"
    np_codes = _dtypes.np_to_code()
    items: list[tuple[Any, ...]] = []
    add = items.append
    seen_np: dict[int, str] = {}

    def on_array(name: str, arr: np.ndarray, owner: Any = None) -> Node | int:
        # Identity is that of the object in the tree (alive throughout), never a temporary's.
        prev = seen_np.setdefault(id(arr if owner is None else owner), name)
        if prev is not name:
            return {"t": "tensor", "f": "numpy", "alias": prev, "same": True}
        code = np_codes.get(arr.dtype)
        if code is None:
            node: Node = {"t": "tensor", "f": "numpy"}
            add(_numpy_item(name, arr, node))
            return node
        add((name, code, arr.shape, arr if arr.flags.c_contiguous else arr.copy(order="C")))
        return NUMPY_LEAF

    with pause_gc(), _core.Writer(path, p) as w:

        def add_arrays(d: dict[Any, Any], prefix: str, names: set[str]) -> Any:
            return w.add_arrays(d, prefix, np.ndarray, np_codes, names, seen_np)

        root, leaves = flatten(
            tree,
            classify=_classify,
            on_array=on_array,
            fast=(np_codes, items, seen_np),
            add_arrays=add_arrays,
        )
        torch_state: _Torch | None = None
        transient = 0
        for name, obj, node in leaves:
            kind = node["f"]
            if kind == "numpy":  # scalars and ndarray subclasses
                if isinstance(obj, np.generic):
                    node["scalar"] = True
                elif isinstance(obj, (np.ma.MaskedArray, np.matrix)):
                    raise error(
                        USAGE,
                        f"cannot store {type(obj).__name__} '{name}': convert it to a "
                        "plain array",
                        InvalidType,
                    )
                done = on_array(name, np.asarray(obj), obj)
                if isinstance(done, dict):
                    node.update(done)
            elif kind == "torch":
                if torch_state is None:
                    torch_state = _Torch()
                item, copied = torch_state.item(name, obj, node)
                if item is not None:
                    add(item)
                transient += copied
            else:  # jax
                _jax_items(name, obj, node, np_codes, add)
            if transient >= _TRANSIENT_BATCH:
                w.add_many(items)
                w.flush()  # the host copies may go now
                items.clear()
                transient = 0
        w.add_many(items)
        items.clear()
        doc = json.dumps(make_document(root), separators=(",", ":"))
        w.set_meta(TREE_KEY, doc.encode())
        for k, v in meta:
            w.set_meta(k, v)
        st = w.commit()
    return Stats._from_core(st, time.perf_counter() - t0)


def _jax_items(
    name: str, obj: Any, node: Node, np_codes: dict[Any, int], add: Callable[[Any], None]
) -> None:
    dt, chunks = _jax.save_chunks(obj, name)
    node["sharding"] = _jax.describe_sharding(obj.sharding)
    code = np_codes.get(dt)
    shape = tuple(obj.shape)
    for box, host in chunks:
        if code is None:
            # Stored as raw bytes with a trailing dimension of the item size.
            node["dtype"] = _dtypes.np_dtype_name(dt)
            raw = host.reshape(-1).view(np.uint8) if host.size else np.empty(0, np.uint8)
            off = box[0] + (0,) if box else None
            cs = box[1] + (dt.itemsize,) if box else None
            add((name, _dtypes.BYTES, shape + (dt.itemsize,), raw, off, cs))
        elif box is None:
            add((name, code, shape, host))
        else:
            add((name, code, shape, host, box[0], box[1]))
