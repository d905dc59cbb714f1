# SPDX-License-Identifier: Apache-2.0
"""The jax adapter: shards of jax.Array as chunks on save, per-device regions and sharding on load."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .. import _dtypes
from . import _gpu
from ._base import Box, Node, Target, np_dtype, np_view
from .._core import AddItem
from .._errors import DTYPE, USAGE, error


def jax() -> Any:
    import jax as j

    return j


def is_array(obj: Any) -> bool:
    j = sys.modules.get("jax")
    return j is not None and isinstance(obj, j.Array)


def is_abstract(obj: Any) -> bool:
    j = sys.modules.get("jax")
    return j is not None and isinstance(obj, j.ShapeDtypeStruct)


def index_box(index: tuple[Any, ...], shape: tuple[int, ...]) -> Box:
    """(offset, shape) of a shard index (a tuple of slices with step 1) in a global shape."""
    off, size = [], []
    for sl, dim in zip(index, shape):
        start, stop, step = sl.indices(dim)
        if step != 1:
            raise error(USAGE, f"shard index {index} has a step; ckptio stores boxes")
        off.append(start)
        size.append(max(stop - start, 0))
    for dim in shape[len(index) :]:
        off.append(0)
        size.append(dim)
    return tuple(off), tuple(size)


def describe_sharding(s: Any) -> dict[str, Any]:
    """A JSON description of a sharding, enough to rebuild it on the same devices."""
    j = jax()
    if isinstance(s, j.sharding.NamedSharding):
        mesh = s.mesh
        spec = []
        for p in s.spec:
            spec.append(list(p) if isinstance(p, tuple) else p)
        return {
            "kind": "named",
            "axes": list(mesh.axis_names),
            "shape": list(mesh.devices.shape),
            "devices": [int(d.id) for d in mesh.devices.flat],
            "spec": spec,
        }
    if isinstance(s, j.sharding.SingleDeviceSharding):
        (dev,) = s.device_set
        return {"kind": "single", "device": int(dev.id)}
    return {"kind": type(s).__name__}


def rebuild_sharding(desc: dict[str, Any] | None) -> Any:
    """The sharding ``desc`` describes if this process has its devices, else None."""
    if not desc:
        return None
    j = jax()
    by_id = {d.id: d for d in j.devices()}
    kind = desc.get("kind")
    try:
        if kind == "named":
            devs = np.array([by_id[i] for i in desc["devices"]], dtype=object)
            mesh = j.sharding.Mesh(devs.reshape(desc["shape"]), tuple(desc["axes"]))
            spec = [tuple(p) if isinstance(p, list) else p for p in desc["spec"]]
            return j.sharding.NamedSharding(mesh, j.sharding.PartitionSpec(*spec))
        if kind == "single":
            return j.sharding.SingleDeviceSharding(by_id[desc["device"]])
    except (KeyError, ValueError):
        return None
    return None


def default_sharding(device: Any = None) -> Any:
    j = jax()
    if device is None:
        device = j.devices()[0]
    return j.sharding.SingleDeviceSharding(device)


def save_chunks(x: Any, name: str) -> tuple[np.dtype[Any], list[tuple[Box | None, np.ndarray]]]:
    """The distinct shards of jax.Array ``x`` as (box or None for the whole array, host view)."""
    if not x.is_fully_addressable:
        raise error(
            USAGE,
            f"jax array '{name}' is not fully addressable: multi-process saves need the "
            "distributed API",
        )
    try:
        dt = np.dtype(x.dtype)
    except TypeError:
        raise error(
            DTYPE,
            f"jax array '{name}' has dtype {x.dtype}, which has no fixed byte layout "
            "(for PRNG keys, save jax.random.key_data(key))",
        ) from None
    shape = tuple(x.shape)
    out: list[tuple[Box | None, np.ndarray]] = []
    for shard in x.addressable_shards:
        if shard.replica_id != 0:
            continue
        box = index_box(shard.index, shape)
        data = shard.data
        if getattr(shard.device, "platform", "cpu") in ("gpu", "cuda") and _gpu.route():
            # Written by ckptio from GPU memory; the array is ready once block_until_ready
            # returns, so no stream is needed, and it stays alive (immutable) in the item.
            data.block_until_ready()
            dev = _gpu.OnDevice(int(data.unsafe_buffer_pointer()), data.nbytes, data)
            out.append((None if box[1] == shape else box, dev))  # type: ignore[arg-type]
            continue
        host = np.asarray(data)  # no copy on CPU devices
        out.append((None if box[1] == shape else box, host))
    return dt, out


def plan_devices(sharding: Any, shape: tuple[int, ...]) -> list[tuple[Box, list[Any]]]:
    """For each distinct box of ``shape`` under ``sharding``: (box, devices needing it)."""
    groups: dict[Box, list[Any]] = {}
    for dev, index in sharding.addressable_devices_indices_map(shape).items():
        groups.setdefault(index_box(index, shape), []).append(dev)
    return list(groups.items())


def assemble(
    shape: tuple[int, ...], sharding: Any, pieces: list[tuple[list[Any], np.ndarray]]
) -> Any:
    """A jax.Array from host pieces, each put on the devices that hold that box."""
    j = jax()
    arrays = []
    for devices, host in pieces:
        for dev in devices:
            # On CPU devices an aligned host buffer is adopted without a copy.
            arrays.append(j.device_put(host, dev))
    return j.make_array_from_single_device_arrays(shape, sharding, arrays)


class JaxAdapter:
    name = "jax"
    value_tags: tuple[str, ...] = ()

    # ---- save ----
    def matches(self, obj: Any) -> bool:
        return is_array(obj)

    def encode_value(self, obj: Any) -> Node | None:
        return None

    def describe(self, name: str, obj: Any, node: Node) -> None:
        node["sharding"] = describe_sharding(obj.sharding)

    def alias_key(self, obj: Any) -> None:
        return None

    def stage(self, name: str, obj: Any, node: Node) -> list[Any]:
        dt, chunks = save_chunks(obj, name)
        code = _dtypes.np_to_code().get(dt)
        shape = tuple(obj.shape)
        items = []
        for box, host in chunks:
            if isinstance(host, _gpu.OnDevice):
                items.append(host.item(name, code, dt, shape, box, node))
                continue
            if code is None:
                # Stored as raw bytes with a trailing dimension of the item size.
                node["dtype"] = _dtypes.np_dtype_name(dt)
                raw = host.reshape(-1).view(np.uint8) if host.size else np.empty(0, np.uint8)
                off = box[0] + (0,) if box else None
                cs = box[1] + (dt.itemsize,) if box else None
                items.append(AddItem((name, _dtypes.BYTES, shape + (dt.itemsize,), raw, off, cs)))
            elif box is None:
                items.append(AddItem((name, code, shape, host, None, None)))
            else:
                items.append(AddItem((name, code, shape, host, box[0], box[1])))
        return items

    # ---- load ----
    def decode_value(self, node: Node) -> Any:
        raise AssertionError(node)

    def matches_like(self, obj: Any) -> bool:
        return is_array(obj) or is_abstract(obj)

    def like_spec(self, like: Any) -> tuple[Any, tuple[int, ...]]:
        return np.dtype(like.dtype), tuple(like.shape)

    def owns_device(self, device: Any) -> bool:
        j = sys.modules.get("jax")
        return j is not None and isinstance(device, (j.Device, j.sharding.Sharding))

    def saved_np_dtype(self, node: Node) -> np.dtype[Any]:
        return _dtypes.np_dtype_from_name(node["dtype"])

    def target(
        self, tgt: Target, node: Node, info: Any, like: Any, device: Any, region: bool
    ) -> None:
        tgt.dtype = np_dtype(node, info)
        if like is not None and np.dtype(like.dtype) != tgt.dtype:
            tgt.cast = np.dtype(like.dtype)
        if region:
            tgt.place = default_sharding()
        elif like is not None:
            tgt.place = getattr(like, "sharding", None) or default_sharding()
        elif self.owns_device(device):
            tgt.place = device if not hasattr(device, "platform") else default_sharding(device)
        else:
            tgt.place = None
            if node.get("f", "numpy") == "jax":
                tgt.place = rebuild_sharding(node.get("sharding"))
            if tgt.place is None:
                tgt.place = default_sharding()
        tgt.place_key = id(tgt.place)

    def boxes(self, tgt: Target, shape: tuple[int, ...]) -> list[tuple[Box, Any]] | None:
        if tgt.box is not None:
            return None
        return plan_devices(tgt.place, shape)

    def build(self, node: Node, tgt: Target, shape: tuple[int, ...], pieces: list[Any]) -> Any:
        if tgt.box is not None:
            a = np_view(pieces[0], tgt.dtype, tgt.box[1])
            if tgt.cast is not None:
                a = a.astype(tgt.cast)
            return jax().device_put(a, tgt.place)
        parts = []
        for (box, devices), p in zip(plan_devices(tgt.place, shape), pieces):
            a = np_view(p, tgt.dtype, box[1])
            if tgt.cast is not None:
                a = a.astype(tgt.cast)
            parts.append((devices, a))
        return assemble(shape, tgt.place, parts)

    def alias_view(self, base: Any, node: Node) -> Any:
        return base


JAX = JaxAdapter()
