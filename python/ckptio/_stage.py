# SPDX-License-Identifier: Apache-2.0
"""Staging a tree for a save: walk it, check and describe every leaf through its framework's
adapter, and make the host buffers its tensors are written from (one rank's or many's)."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _core, _dtypes
from ._errors import USAGE, InvalidType, _from_code, error
from ._tree import NUMPY_LEAF, Node, flatten, make_document
from .frameworks import _gpu
from .frameworks import _registry as _adapters
from .frameworks._base import Aliases
from .frameworks._gpu import DeviceItem
from .frameworks._numpy import NUMPY, stage_array

__all__ = ["RESERVED_PREFIX", "StagedSave"]

#: Metadata keys starting with this are ckptio's own.
RESERVED_PREFIX = "ckptio."

PathLike = str | os.PathLike[str]


@dataclass
class StagedSave:
    """A tree ready to write: what _stage() returns and _write() consumes.

    ``items``: the writer's records in order: ckptio._core.AddItem (name, dtype code, shape
    or None for the data's own, data: a C-contiguous buffer, chunk offset, chunk shape) or
    Deferred (device tensors: the host copy is made by _write, in batches). ``tree``: the
    tree's JSON document; ``meta``: the user metadata; ``deferred``: whether any item is a
    Deferred.

    Between _stage() and the end of _write() the caller may change the tree itself (its
    structure and plain values are already encoded; the items keep the tensors alive), but
    must not write into the memory of its tensors: numpy arrays and CPU torch tensors are
    staged as views of their own memory (copies are made only of non-contiguous or
    byte-swapped arrays and of conjugate or negative torch views), and device torch tensors
    are copied to the host only during _write, in batches. Jax arrays cannot be written to;
    those on accelerators are copied to the host by _stage.
    """

    items: list[Any]
    tree: bytes
    meta: list[tuple[str, bytes]]
    deferred: bool = False


def is_url(path: str) -> bool:
    """Whether ``path`` names a checkpoint in an object store ("s3://bucket/key") rather than
    a directory: the library's URL parser answers (an unknown "<scheme>://" raises)."""
    return _core.store_name(path) != "posix"


def ensure_parent(path: str) -> None:
    """Create the missing parent directories of the checkpoint ``path`` (an object store has
    none to create), as checkpoint managers expect of "ckpts/step-100"."""
    if is_url(path):
        return
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        _make_parent(parent, path)


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


def _stage(
    tree: Any, *, metadata: Mapping[str, str] | None = None, gpu: int = 0
) -> StagedSave:
    """Walk ``tree``, check and describe every leaf, and make the host buffers its tensors
    are written from; nothing is written. See StagedSave for what the caller may change
    afterwards. ``gpu``: the gpu= I/O option (params()["gpu"])."""
    with _gpu.asked(gpu):
        return _stage_tree(tree, metadata)


def _stage_tree(tree: Any, metadata: Mapping[str, str] | None) -> StagedSave:
    meta = _meta_items(metadata)
    items: list[Any] = []
    add = items.append
    aliases = Aliases()
    tie = aliases.tie
    numpy_key = NUMPY.alias_key
    deferred = False

    def on_array(name: str, arr: np.ndarray) -> Node | int:
        # Exact numpy arrays outside the C loop's dicts (in lists, tuples, the root).
        node: Node = {"t": "tensor", "f": "numpy"}
        if not tie(numpy_key(arr), name, arr, node):
            add(stage_array(name, arr, node))
            if len(node) == 2:
                return NUMPY_LEAF
        return node

    np_codes = _dtypes.np_to_code()
    ndarray = np.ndarray

    def stage_dict(d: dict[Any, Any], prefix: str, names: set[str]) -> Any:
        return _core.stage_arrays(d, prefix, ndarray, np_codes, names, aliases.first, items)

    root, leaves = flatten(
        tree, classify=_adapters.classify, on_array=on_array, stage_dict=stage_dict
    )
    by_name = _adapters.BY_NAME
    for name, obj, node in leaves:
        ad = by_name[node["f"]]
        ad.describe(name, obj, node)
        key = ad.alias_key(obj)
        if key is not None and tie(key, name, obj, node):
            continue
        staged = ad.stage(name, obj, node)
        if type(staged) is list:
            items.extend(staged)
            if any(type(x) is DeviceItem for x in staged):
                deferred = True  # written one by one by _write, not by add_many
        else:
            add(staged)
            deferred = True
    doc = json.dumps(make_document(root), separators=(",", ":")).encode()
    return StagedSave(items, doc, meta, deferred)
