# SPDX-License-Identifier: Apache-2.0
"""GPU tensors through ckptio's own GPU path (doc/gpu.md): device pointers and streams handed to
the library, which copies through a pinned ring on its own stream (or uses GPUDirect Storage),
instead of a host copy made by the framework."""

from __future__ import annotations

import os
import threading
from typing import Any

from .. import _core
from .._errors import CheckpointError, carry_values

__all__ = ["DeviceItem", "route", "take_note", "note", "stats_text"]

_OFF = 3
#: asked(HOST_ONLY): GPU arrays are copied by their framework whatever CKPTIO_GPU says (items
#: that outlive the call: a distributed save_async's, Orbax's).
HOST_ONLY = -1
_lock = threading.Lock()
_local = threading.local()


class DeviceItem:
    """One tensor (or chunk) in GPU memory for the writer: added by device pointer with the
    caller's CUDA stream; ``keep`` holds the framework object alive until then."""

    __slots__ = ("name", "code", "shape", "offset", "chunk_shape", "ptr", "nbytes", "stream", "keep")

    def __init__(
        self,
        name: str,
        code: int,
        shape: tuple[int, ...],
        ptr: int,
        nbytes: int,
        stream: int,
        keep: Any,
        offset: tuple[int, ...] | None = None,
        chunk_shape: tuple[int, ...] | None = None,
    ) -> None:
        self.name = name
        self.code = code
        self.shape = shape
        self.offset = offset
        self.chunk_shape = chunk_shape
        self.ptr = ptr
        self.nbytes = nbytes
        self.stream = stream
        self.keep = keep

    def add_to(self, w: Any) -> None:
        _core.gpu_add(
            w, self.name, self.code, self.shape, self.offset, self.chunk_shape, self.ptr,
            self.nbytes, self.stream,
        )  # fmt: skip


class OnDevice:
    """A shard in GPU memory (jax): its address, size and owner, for a DeviceItem."""

    __slots__ = ("ptr", "nbytes", "keep")

    def __init__(self, ptr: int, nbytes: int, keep: Any) -> None:
        self.ptr = ptr
        self.nbytes = nbytes
        self.keep = keep

    def item(
        self, name: str, code: int | None, dt: Any, shape: tuple[int, ...], box: Any, node: Any
    ) -> DeviceItem:
        from .. import _dtypes

        off, cs = (box[0], box[1]) if box else (None, None)
        if code is None:  # raw bytes with a trailing dimension of the item size
            node["dtype"] = _dtypes.np_dtype_name(dt)
            code, shape = _dtypes.BYTES, shape + (dt.itemsize,)
            if box:
                off, cs = off + (0,), cs + (dt.itemsize,)
        return DeviceItem(name, code, shape, self.ptr, self.nbytes, 0, self.keep, off, cs)


#: ckptio_gpu_route's answer, or the error it raised, per (gpu= asked, CKPTIO_GPU): the driver
#: is loaded once per process, so the answer changes only with those two.
_routes: dict[tuple[int, str], tuple[int, str] | CheckpointError] = {}


class asked:
    """``with asked(p["gpu"]):`` the gpu= I/O option of the save or load running on this
    thread (CKPTIO_GPU, when set, wins over it, as in the C library)."""

    def __init__(self, mode: int) -> None:
        self.mode = mode

    def __enter__(self) -> None:
        self.prev = getattr(_local, "mode", 0)
        _local.mode = self.mode

    def __exit__(self, *exc: object) -> None:
        _local.mode = self.prev


def route() -> bool:
    """Whether a GPU tensor goes through ckptio's GPU path (True) or the framework's host copy
    (False, noted for the stats), as the C library decides (ckptio_gpu_route): with
    CKPTIO_GPU=gds or staged (or gpu="gds"/"staged") and no usable driver, it raises
    Unsupported: the path asked for by name cannot run."""
    mode = getattr(_local, "mode", 0)
    if mode == HOST_ONLY:
        return False
    key = (mode, os.environ.get("CKPTIO_GPU", ""))
    with _lock:
        got = _routes.get(key)
        if got is None:
            try:
                got = _core.gpu_route(None, mode)
            except CheckpointError as e:
                got = e
            _routes[key] = got
    if isinstance(got, CheckpointError):  # a fresh exception each time, with the same parts
        raise carry_values(got, type(got)(str(got), got.code, got.name))
    code, why = got
    if code == _OFF:
        note(f"host copy ({why})")
        return False
    return True


def note(text: str) -> None:
    """Remember, for this thread's save or load in progress, why GPU tensors took a host copy."""
    _local.note = text


def take_note() -> str:
    """The note of this thread's save or load, cleared."""
    text = getattr(_local, "note", "")
    _local.note = ""
    return text


def stats_text(handle: Any, fallback: str) -> str:
    """What Stats.gpu says: the library's path ("staged", "gds", "gds+staged", with why GDS was
    not used where it could have been), else the host-copy note, else ""."""
    if not isinstance(handle, (_core.Reader, _core.Writer)):
        return fallback  # a safetensors reader (ckptio.formats._hf) reads host memory only
    path, _dev, _gds, _staging, reason = _core.gpu_stats(handle)
    if path == "none":
        return fallback
    if reason and path != "gds":
        return f"{path} (no GDS: {reason})"
    return path


def torch_stream(device: Any) -> int:
    """The current CUDA stream of torch ``device`` as a CUstream handle (0: legacy default)."""
    import torch

    return int(torch.cuda.current_stream(device).cuda_stream)


def torch_dest(tgt: Any, pieces: list[Any]) -> Any:
    """For a tensor to be built in GPU memory from one piece (a torch tensor on a CUDA device,
    or a CuPy array): an empty device buffer for ckptio to read into (the mirror of the save
    path), or None (read through host memory; noted when the GPU path is unusable)."""
    if len(pieces) != 1:
        return None
    p = pieces[0]
    if tgt.kind == "cupy":
        try:
            import cupy  # type: ignore[import-not-found]
        except ImportError:
            return None
        if not route():
            return None
        return cupy.empty(p.nbytes, dtype=cupy.uint8)
    if tgt.kind != "torch" or tgt.place is None:
        return None
    import torch

    dev = torch.device(tgt.place)
    if dev.type != "cuda" or not route():
        return None
    item = torch.empty((), dtype=tgt.dtype).element_size()
    return torch.empty(p.nbytes // item, dtype=tgt.dtype, device=dev)


def read_into(r: Any, piece: Any, dev: Any) -> None:
    """Read ``piece`` into device buffer ``dev`` (torch or CuPy); work queued on the current
    stream afterwards sees the bytes (ckptio makes that stream wait for its copies)."""
    if hasattr(dev, "data_ptr"):
        ptr, stream = dev.data_ptr(), torch_stream(dev.device)
    else:
        import cupy  # type: ignore[import-not-found]

        ptr, stream = dev.data.ptr, cupy.cuda.get_current_stream().ptr
    _core.gpu_read(r, piece.index, piece.offset, piece.shape, ptr, piece.nbytes, stream)
    piece.buf, piece.at = dev, 0

