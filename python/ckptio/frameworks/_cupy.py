# SPDX-License-Identifier: Apache-2.0
"""Arrays in GPU memory that speak the CUDA array interface (CuPy, Numba, ...): saved by device
pointer through ckptio's GPU path, loaded back as CuPy arrays where CuPy is installed (read
straight into GPU memory), else as numpy arrays."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from .. import _dtypes
from . import _gpu
from ._base import Node, Target, np_view
from .._core import AddItem
from .._errors import USAGE, InvalidType, error
from ._numpy import NUMPY


def _cupy() -> Any:
    try:
        import cupy  # type: ignore[import-not-found]

        return cupy
    except ImportError:
        return None


def _iface(obj: Any) -> dict[str, Any]:
    return obj.__cuda_array_interface__  # type: ignore[no-any-return]


def _contiguous(cai: dict[str, Any]) -> bool:
    strides = cai.get("strides")
    if strides is None:
        return True
    step = np.dtype(cai["typestr"]).itemsize
    for dim, st in zip(reversed(cai["shape"]), reversed(strides)):
        if dim > 1 and st != step:
            return False
        step *= dim
    return True


class CudaArrayAdapter:
    name = "cupy"
    value_tags: tuple[str, ...] = ()

    # ---- save ----
    def matches(self, obj: Any) -> bool:
        return hasattr(type(obj), "__cuda_array_interface__")

    def encode_value(self, obj: Any) -> Node | None:
        return None

    def describe(self, name: str, obj: Any, node: Node) -> None:
        dt = np.dtype(_iface(obj)["typestr"])
        if dt not in _dtypes.np_to_code():
            node["dtype"] = _dtypes.np_dtype_name(dt)

    def alias_key(self, obj: Any) -> Hashable | None:
        cai = _iface(obj)
        if not int(np.prod(cai["shape"], dtype=np.int64)):
            return None
        return ("cuda", cai["data"][0], tuple(cai["shape"]), cai.get("strides"), cai["typestr"])

    def stage(self, name: str, obj: Any, node: Node) -> list[Any]:
        cai = _iface(obj)
        if not _contiguous(cai):
            cp = _cupy()
            if cp is None or not isinstance(obj, cp.ndarray):
                raise error(
                    USAGE,
                    f"GPU array '{name}' is not C-contiguous; make it contiguous first",
                    InvalidType,
                )
            obj = cp.ascontiguousarray(obj)
            cai = _iface(obj)
        dt = np.dtype(cai["typestr"])
        shape = tuple(int(d) for d in cai["shape"])
        code = _dtypes.np_to_code().get(dt)
        if code is None:
            code, shape = _dtypes.BYTES, shape + (dt.itemsize,)
        nbytes = int(np.prod(shape, dtype=np.int64)) * (1 if code == _dtypes.BYTES else dt.itemsize)
        if _gpu.route():
            # The producer's stream (interface version 3): 1 and 2 are the legacy and per-thread
            # default streams, whose handles are those same values; absent: the legacy one.
            stream = cai.get("stream") or 0
            return [_gpu.DeviceItem(name, code, shape, int(cai["data"][0]), nbytes, stream, obj)]
        if not hasattr(obj, "get"):
            raise error(
                "CKPTIO_E_UNSUPPORTED",
                f"GPU array '{name}': no usable CUDA driver and no .get() to copy it to the host",
            )
        host = np.ascontiguousarray(obj.get())
        if code == _dtypes.BYTES:
            host = host.reshape(-1).view(np.uint8)
        return [AddItem((name, code, shape, host, None, None))]

    # ---- load ----
    def decode_value(self, node: Node) -> Any:
        raise AssertionError(node)

    def matches_like(self, obj: Any) -> bool:
        return self.matches(obj)

    def like_spec(self, like: Any) -> tuple[Any, tuple[int, ...]]:
        cai = _iface(like)
        return np.dtype(cai["typestr"]), tuple(cai["shape"])

    def owns_device(self, device: Any) -> bool:
        return False

    def saved_np_dtype(self, node: Node) -> np.dtype[Any]:
        return NUMPY.saved_np_dtype(node)

    def target(
        self, tgt: Target, node: Node, info: Any, like: Any, device: Any, region: bool
    ) -> None:
        NUMPY.target(tgt, node, info, None, device, region)
        if like is not None and np.dtype(_iface(like)["typestr"]) != tgt.dtype:
            tgt.cast = np.dtype(_iface(like)["typestr"])

    def boxes(self, tgt: Target, shape: tuple[int, ...]) -> None:
        return None

    def build(self, node: Node, tgt: Target, shape: tuple[int, ...], pieces: list[Any]) -> Any:
        if tgt.box:
            shape = tgt.box[1]
        cp = _cupy()
        p = pieces[0]
        if cp is not None and isinstance(p.buf, cp.ndarray):  # read into GPU memory
            a = p.buf.view(tgt.dtype).reshape(shape)
        else:
            a = np_view(p, tgt.dtype, shape)
            if cp is not None:
                a = cp.asarray(a)
        if tgt.cast is not None:
            a = a.astype(tgt.cast)
        return a

    def alias_view(self, base: Any, node: Node) -> Any:
        return base.view()


CUPY = CudaArrayAdapter()
