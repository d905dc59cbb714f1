# SPDX-License-Identifier: Apache-2.0
"""The torch adapter (internal; the public torch.save drop-in is ckptio.torch): dtype tables,
staging of tensors (device tensors through host copies made at write time), loading."""

from __future__ import annotations

import sys
from collections.abc import Hashable
from functools import cache
from typing import Any

import numpy as np

from .. import _dtypes
from . import _gpu
from ._base import Deferred, Node, Target
from ._jax import JAX
from .._core import AddItem
from .._dtypes import (
    BF16, BOOL, BYTES, C64, C128, F8_E4M3FN, F8_E5M2, F16, F32, F64, I8, I16, I32, I64, U8, U16,
    U32, U64,
)  # fmt: skip
from .._errors import DTYPE, USAGE, InvalidType, error


@cache
def tables() -> tuple[dict[Any, int], dict[int, Any], dict[Any, Any]]:
    """(torch dtype -> code, code -> torch dtype, torch dtype -> same-size integer view dtype
    for dtypes numpy cannot hold)."""
    import torch

    to_code = {
        torch.bool: BOOL, torch.uint8: U8, torch.int8: I8, torch.int16: I16,
        torch.int32: I32, torch.int64: I64, torch.float16: F16, torch.bfloat16: BF16,
        torch.float32: F32, torch.float64: F64, torch.complex64: C64, torch.complex128: C128,
    }  # fmt: skip
    for name, code in (("uint16", U16), ("uint32", U32), ("uint64", U64),
                       ("float8_e4m3fn", F8_E4M3FN), ("float8_e5m2", F8_E5M2)):  # fmt: skip
        if hasattr(torch, name):
            to_code[getattr(torch, name)] = code
    from_code = {code: dt for dt, code in to_code.items()}
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    numpy_ok = {
        torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
        torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128,
    }  # fmt: skip
    for name in ("uint16", "uint32", "uint64"):
        if hasattr(torch, name):
            numpy_ok.add(getattr(torch, name))
    view_as: dict[Any, Any] = {}
    for name in dir(torch):
        dt = getattr(torch, name)
        if isinstance(dt, torch.dtype) and dt not in numpy_ok and dt.itemsize in ints:
            view_as[dt] = ints[dt.itemsize]
    return to_code, from_code, view_as


def dtype_from_name(name: str) -> Any:
    import torch

    dt = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise error(DTYPE, f"this torch has no dtype {name}")
    return dt


def for_np(dt: np.dtype[Any]) -> Any:
    """The torch dtype holding numpy dtype ``dt``, or None."""
    _, from_code, _ = tables()
    code = _dtypes.np_to_code().get(dt)
    if code is not None:
        return from_code.get(code)
    m = _dtypes.ml_dtypes()
    if m is not None and dt.kind == "V":
        import torch

        return getattr(torch, dt.name, None)
    return None


def stored_dtype(node: Node, info: Any) -> Any:
    """The torch dtype to load a stored tensor as."""
    name = node.get("dtype")
    if node.get("f") == "torch" and name is not None:
        return dtype_from_name(name)
    if info.code == BYTES and name is not None:
        dt = for_np(_dtypes.np_dtype_from_name(name))
        if dt is None:
            raise error(DTYPE, f"tensor '{info.name}': numpy dtype {name} has no torch equivalent")
        return dt
    dt = tables()[1].get(info.code)
    if dt is None:
        raise error(DTYPE, f"tensor '{info.name}': dtype {info.dtype} has no torch equivalent")
    return dt


def _plain(d: Any) -> Any:
    """``d`` with its conjugate and negative bits resolved and its memory contiguous, where
    it is (host or GPU)."""
    if d.is_conj():
        d = d.resolve_conj()
    if d.is_neg():
        d = d.resolve_neg()
    return d if d.is_contiguous() else d.contiguous()


def _host_item(name: str, t: Any) -> Any:
    """The AddItem of tensor ``t`` from host memory (a copy for device tensors)."""
    to_code, _, view_as = tables()
    d = t.detach()
    if d.device.type != "cpu":
        d = d.cpu()
    d = _plain(d)
    code = to_code.get(d.dtype)
    shape = tuple(d.shape)
    view = view_as.get(d.dtype)
    host = (d.view(view) if view is not None else d).numpy()
    if code is None:
        code = BYTES
        shape = shape + (d.element_size(),)
        host = host.reshape(-1).view(np.uint8) if host.size else np.empty(0, np.uint8)
    return AddItem((name, code, shape, host, None, None))


def _device_item(name: str, t: Any) -> Any:
    """The DeviceItem of CUDA tensor ``t``: written by ckptio from GPU memory, after the work
    queued on the current stream (no host copy by torch)."""
    to_code, _, _ = tables()
    d = _plain(t.detach())  # on the GPU, queued on the current stream like the rest
    code = to_code.get(d.dtype)
    shape = tuple(d.shape)
    if code is None:
        code = BYTES
        shape = shape + (d.element_size(),)
    return _gpu.DeviceItem(
        name, code, shape, d.data_ptr(), d.numel() * d.element_size(),
        _gpu.torch_stream(d.device), d,
    )  # fmt: skip


class TorchAdapter:
    name = "torch"
    value_tags: tuple[str, ...] = ("torch.Size",)

    # ---- save ----
    def matches(self, obj: Any) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and isinstance(obj, torch.Tensor)

    def encode_value(self, obj: Any) -> Node | None:
        torch = sys.modules.get("torch")
        if torch is not None and type(obj) is torch.Size:
            return {"t": "torch.Size", "v": [int(d) for d in obj]}
        return None

    def describe(self, name: str, t: Any, node: Node) -> None:
        import torch

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

    def alias_key(self, t: Any) -> Hashable | None:
        # The same view of the same storage (tied weights) is stored once.
        if not t.numel():
            return None
        return (
            t.device,
            t.untyped_storage().data_ptr(),
            t.storage_offset(),
            tuple(t.shape),
            t.stride(),
            t.dtype,
        )

    def stage(self, name: str, t: Any, node: Node) -> list[Any] | Deferred:
        if t.device.type == "cuda" and _gpu.route():
            return [_device_item(name, t)]
        if t.device.type != "cpu":
            return Deferred(t.numel() * t.element_size(), lambda: [_host_item(name, t)])
        return [_host_item(name, t)]

    # ---- load ----
    def decode_value(self, node: Node) -> Any:
        import torch

        return torch.Size(node["v"])

    def matches_like(self, obj: Any) -> bool:
        return self.matches(obj)

    def like_spec(self, like: Any) -> tuple[Any, tuple[int, ...]]:
        return like.dtype, tuple(like.shape)

    def owns_device(self, device: Any) -> bool:
        return False  # any device= no other adapter owns is torch's

    def saved_np_dtype(self, node: Node) -> np.dtype[Any]:
        m = _dtypes.ml_dtypes()
        base = node["dtype"].removeprefix("torch.")
        if m is not None and hasattr(m, base):
            return np.dtype(getattr(m, base))
        raise error(DTYPE, f"torch.{base} has no numpy equivalent; load it with framework='torch'")

    def target(
        self, tgt: Target, node: Node, info: Any, like: Any, device: Any, region: bool
    ) -> None:
        tgt.dtype = stored_dtype(node, info)
        if like is not None:
            if like.dtype != tgt.dtype:
                tgt.cast = like.dtype
            tgt.place = like.device
            if not region and dtensor_target(tgt, node, like):
                return
        elif device is not None and not JAX.owns_device(device):  # jax is the only other owner
            tgt.place = device
        tgt.place_key = str(tgt.place)

    def boxes(self, tgt: Target, shape: tuple[int, ...]) -> None:
        return None

    def build(self, node: Node, tgt: Target, shape: tuple[int, ...], pieces: list[Any]) -> Any:
        import torch

        if tgt.box:
            shape = tgt.box[1]
        p = pieces[0]
        count = 1
        for d in shape:
            count *= d
        if isinstance(p.buf, torch.Tensor):  # read straight into GPU memory (_gpu_target)
            t = p.buf.view(shape)
        elif count == 0 or p.buf is None:
            t = torch.empty(shape, dtype=tgt.dtype)
        else:
            t = torch.frombuffer(p.buf, dtype=tgt.dtype, count=count, offset=p.at).view(shape)
        if tgt.cast is not None:
            t = t.to(tgt.cast)
        if tgt.place is not None and str(tgt.place) != "cpu" and t.device != torch.device(tgt.place):
            t = t.to(tgt.place)
        if node.get("param"):
            return torch.nn.Parameter(t, requires_grad=bool(node.get("grad")))
        if node.get("grad"):
            t.requires_grad_(True)
        return t

    def alias_view(self, base: Any, node: Node) -> Any:
        import torch

        t = base.detach()
        if node.get("param"):
            return torch.nn.Parameter(t, requires_grad=bool(node.get("grad")))
        if node.get("grad"):
            t.requires_grad_(True)
        return t


TORCH = TorchAdapter()


def _dtensor_type() -> Any:
    if "torch" not in sys.modules:
        return None
    mod = sys.modules.get("torch.distributed.tensor")
    return getattr(mod, "DTensor", None) if mod is not None else None


def dtensor_target(tgt: Any, node: Node, like: Any) -> bool:
    """For a like= DTensor: read only this rank's box and make a DTensor with like's mesh,
    placements, global shape and stride. False if ``like`` is not a DTensor."""
    dtensor = _dtensor_type()
    if dtensor is None or not isinstance(like, dtensor):
        return False
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor import Shard as TShard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    for p in like.placements:
        if type(p) is not TShard and type(p) is not Replicate:
            raise error(
                USAGE,
                f"like= DTensor placement {p!r} is not a plain box of the global tensor; "
                "ckptio loads into Shard(dim) and Replicate placements",
                InvalidType,
            )
    lshape, goff = compute_local_shape_and_global_offset(
        like.shape, like.device_mesh, like.placements
    )
    tgt.box = (tuple(int(o) for o in goff), tuple(int(d) for d in lshape))
    tgt.place = like.to_local().device
    tgt.place_key = str(tgt.place)
    mesh, placements = like.device_mesh, tuple(like.placements)
    shape, stride = like.shape, like.stride()
    param, grad = bool(node.get("param")), bool(node.get("grad"))

    def wrap(t: Any) -> Any:
        import torch

        d = dtensor.from_local(
            t.detach(), mesh, placements, run_check=False, shape=shape, stride=stride
        )
        if param:
            return torch.nn.Parameter(d, requires_grad=grad)
        if grad:
            d.requires_grad_(True)
        return d

    tgt.wrap = wrap
    return True
