# SPDX-License-Identifier: Apache-2.0
"""The numpy adapter: numpy arrays and scalars, saved from their own memory, loaded in place."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _dtypes
from ._base import Node, Target, np_dtype, np_view
from .._core import AddItem
from .._errors import DTYPE, USAGE, CheckpointError, InvalidType, error

_ndarray = np.ndarray


def contiguous(arr: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it turns 0-d arrays into 1-d ones.
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def raw_bytes(arr: np.ndarray) -> np.ndarray:
    """A C-contiguous array's bytes as a flat uint8 array (dtypes stored as raw bytes)."""
    return arr.reshape(-1).view(np.uint8) if arr.size else np.empty(0, np.uint8)


def dtype_error(name: str, dt: Any) -> CheckpointError:
    return error(
        DTYPE, f"tensor '{name}': dtype {dt} cannot be stored (object, structured or zero-size)"
    )


def stage_array(name: str, arr: np.ndarray, node: Node | None) -> Any:
    """The AddItem of a numpy array: as itself when its dtype has a code, else byte-swapped to
    native order, or as raw bytes with a trailing dimension of the item size (the dtype goes
    to ``node``)."""
    dt = arr.dtype
    code = _dtypes.np_to_code().get(dt)
    if code is not None:
        return AddItem((name, code, arr.shape, contiguous(arr), None, None))
    native = dt.newbyteorder("=")
    if dt.byteorder not in "=|" and native in _dtypes.np_to_code():
        arr = arr.astype(native)
        return AddItem((name, _dtypes.np_to_code()[native], arr.shape, arr, None, None))
    if dt.hasobject or dt.names is not None or dt.subdtype is not None or dt.itemsize == 0:
        raise dtype_error(name, dt)
    if node is not None:
        node["dtype"] = _dtypes.np_dtype_name(dt)
    arr = contiguous(arr)
    return AddItem((name, _dtypes.BYTES, arr.shape + (dt.itemsize,), raw_bytes(arr), None, None))


class NumpyAdapter:
    name = "numpy"
    value_tags: tuple[str, ...] = ()

    # ---- save ----
    def matches(self, obj: Any) -> bool:
        return isinstance(obj, (np.ndarray, np.generic))

    def encode_value(self, obj: Any) -> Node | None:
        return None

    def describe(self, name: str, obj: Any, node: Node) -> None:
        if isinstance(obj, np.generic):
            node["scalar"] = True
        elif isinstance(obj, (np.ma.MaskedArray, np.matrix)):
            raise error(
                USAGE,
                f"cannot store {type(obj).__name__} '{name}': convert it to a plain array",
                InvalidType,
            )

    def alias_key(self, obj: Any) -> int:
        # Identity: that of the object in the tree (alive throughout), never a temporary's.
        # ckptio._core.stage_arrays records the same key.
        return id(obj)

    def stage(self, name: str, obj: Any, node: Node) -> list[Any]:
        return [stage_array(name, obj if type(obj) is _ndarray else np.asarray(obj), node)]

    # ---- load ----
    def decode_value(self, node: Node) -> Any:
        raise AssertionError(node)

    def matches_like(self, obj: Any) -> bool:
        return isinstance(obj, (np.ndarray, np.generic))

    def like_spec(self, like: Any) -> tuple[Any, tuple[int, ...]]:
        return like.dtype, tuple(like.shape)

    def owns_device(self, device: Any) -> bool:
        return False

    def saved_np_dtype(self, node: Node) -> np.dtype[Any]:
        return _dtypes.np_dtype_from_name(node["dtype"])

    def target(
        self, tgt: Target, node: Node, info: Any, like: Any, device: Any, region: bool
    ) -> None:
        tgt.dtype = np_dtype(node, info)
        if like is not None and np.dtype(like.dtype) != tgt.dtype:
            tgt.cast = np.dtype(like.dtype)

    def boxes(self, tgt: Target, shape: tuple[int, ...]) -> None:
        return None

    def build(self, node: Node, tgt: Target, shape: tuple[int, ...], pieces: list[Any]) -> Any:
        a = np_view(pieces[0], tgt.dtype, tgt.box[1] if tgt.box else shape)
        if tgt.cast is not None:
            a = a.astype(tgt.cast)
        if node.get("scalar") and tgt.box is None:
            return a[()]
        return a

    def alias_view(self, base: Any, node: Node) -> Any:
        return base.view() if isinstance(base, np.ndarray) else base


NUMPY = NumpyAdapter()
