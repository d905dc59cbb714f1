# SPDX-License-Identifier: Apache-2.0
"""ckptio.torch.save / ckptio.torch.load: drop-ins for torch.save / torch.load at ckptio's speed.

The file is the standard torch zip archive (stock ``torch.load`` opens it, with
``weights_only=True`` too), with storage records aligned to 4096 bytes. It is written through
ckptio's file writer (staging ring, O_DIRECT where the file system allows it, several writes
in flight) and appears at its path only when complete and durable. Loading reads the whole
archive with one batched read into page-aligned memory and builds the tensors as views of it
(no second copy), the way ``torch.load(mmap=True)`` views a mapped file.

>>> import torch, ckptio.torch, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "model.pt")
>>> _ = ckptio.torch.save({"w": torch.ones(2, 3, dtype=torch.bfloat16)}, path)
>>> torch.load(path, weights_only=True)["w"].dtype
torch.bfloat16
>>> ckptio.torch.load(path)["w"].shape
torch.Size([2, 3])
"""

from __future__ import annotations

import inspect
import os
import pickle
import time
from typing import IO, Any

import torch as _torch

from . import _core
from ._options import Stats, params

__all__ = ["save", "load", "STORAGE_ALIGNMENT"]

#: Alignment of every storage record in archives written by ckptio.torch.save.
STORAGE_ALIGNMENT = 4096

_ZIP_MAGIC = b"PK\x03\x04"
_TRUE = ("1", "y", "yes", "true")


def _is_path(f: Any) -> bool:
    return isinstance(f, (str, os.PathLike))


def save(
    obj: object,
    f: str | os.PathLike[str] | IO[bytes],
    pickle_module: Any = pickle,
    pickle_protocol: int = 2,
    *,
    overwrite: bool = True,
    crc32: bool | None = None,
    **io_options: Any,
) -> Stats | None:
    """``torch.save(obj, f)`` written at ckptio's speed; returns Stats for a path.

    Like torch.save, an existing file at ``f`` is replaced (``overwrite=False`` refuses with
    CheckpointExists) — but only once the new file is complete: a failed or interrupted
    save (Ctrl-C) leaves the old file, and no temporary file. A file object ``f`` is passed
    to torch.save unchanged. ``io_options`` are ckptio.save's (backend, direct, fsync, ...).

    ``crc32``: None follows torch (``torch.serialization.set_crc32_options``, on by default).
    torch computes the zip CRC32s on one core at about 1.5 GB/s, which then bounds the save;
    ``crc32=False`` skips them: torch.load still opens the file, zip tools report bad CRCs.
    """
    if not _is_path(f):
        _torch.save(obj, f, pickle_module=pickle_module, pickle_protocol=pickle_protocol)  # type: ignore[arg-type]
        return None
    t0 = time.perf_counter()
    p = params(io_options, overwrite=overwrite)
    from torch.utils.serialization import config

    with _core.FileWriter(os.fspath(f), p) as fw:  # type: ignore[arg-type]
        try:
            patch: dict[str, Any] = {"save.storage_alignment": STORAGE_ALIGNMENT}
            if crc32 is not None:
                patch["save.compute_crc32"] = bool(crc32)
            with config.patch(patch):  # type: ignore[attr-defined]
                _torch.save(obj, fw, pickle_module=pickle_module, pickle_protocol=pickle_protocol)  # type: ignore[arg-type]
        except BaseException as e:
            # After Ctrl-C in write(), torch's own cleanup fails too and hides the
            # KeyboardInterrupt behind a RuntimeError: raise the interrupt itself.
            cause: BaseException | None = e
            while cause is not None and not isinstance(cause, KeyboardInterrupt):
                cause = cause.__context__
            if cause is not None and cause is not e:
                raise cause from None
            raise
        st = fw.commit()
    return Stats._from_core(st, time.perf_counter() - t0)


def _resolve_weights_only(weights_only: bool | None, pickle_module: Any) -> tuple[bool, Any]:
    """torch.load's rules for weights_only (its default and the TORCH_FORCE_* variables)."""
    not_set = weights_only is None
    if not_set:
        weights_only = _torch.serialization._default_to_weights_only(pickle_module)
    force = os.getenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0").lower() in _TRUE
    force_no = os.getenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0").lower() in _TRUE
    if force and force_no:
        raise RuntimeError(
            "Only one of TORCH_FORCE_WEIGHTS_ONLY_LOAD or TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD "
            "should be set"
        )
    if force:
        weights_only = True
    elif force_no and not_set:
        weights_only = False
    if weights_only:
        if pickle_module is not None:
            raise RuntimeError("Can not safely load weights when explicit pickle_module is specified")
    elif pickle_module is None:
        pickle_module = pickle
    return bool(weights_only), pickle_module


def _can_view_storage() -> bool:
    load_impl = getattr(_torch.serialization, "_load", None)
    if load_impl is None or not hasattr(_torch.serialization, "_open_zipfile_reader"):
        return False
    try:
        return "overall_storage" in inspect.signature(load_impl).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False


def load(
    f: str | os.PathLike[str] | IO[bytes],
    map_location: Any = None,
    pickle_module: Any = None,
    *,
    weights_only: bool | None = None,
    mmap: bool | None = None,
    io_options: dict[str, Any] | None = None,
    **pickle_load_args: Any,
) -> Any:
    """``torch.load(f, ...)`` with the archive read at ckptio's speed.

    Takes torch.load's arguments and follows its rules (``weights_only`` defaults to True).
    A path to a zip archive is read whole, with one batched read, into page-aligned memory
    that the tensors then view (they keep that memory alive, as with ``mmap=True``).
    File objects, ``mmap=True``, legacy (non-zip) files and TorchScript archives go to
    torch.load unchanged. ``io_options``: a dict of ckptio I/O options (backend, direct, ...).
    """
    if mmap is None:
        from torch.utils.serialization import config

        mmap = bool(config.load.mmap)
    passthrough: dict[str, Any] = dict(pickle_load_args)
    if not _is_path(f) or mmap or not _can_view_storage():
        return _torch.load(
            f,  # type: ignore[arg-type]
            map_location=map_location,
            pickle_module=pickle_module,
            weights_only=weights_only,
            mmap=mmap,
            **passthrough,
        )
    path = os.fspath(f)  # type: ignore[arg-type]
    size = os.path.getsize(path)
    p = params(io_options or {})
    buf = _core.Buffer(size)
    _core.file_read(path, [(0, size, buf, 0)], p)
    with memoryview(buf) as head:
        is_zip = size >= 4 and bytes(head[:4]) == _ZIP_MAGIC
    if not is_zip:
        del buf
        return _torch.load(
            path,
            map_location=map_location,
            pickle_module=pickle_module,
            weights_only=weights_only,
            **passthrough,
        )
    wo, pmod = _resolve_weights_only(weights_only, pickle_module)
    if "encoding" not in pickle_load_args:
        pickle_load_args["encoding"] = "utf-8"
    if wo and pickle_load_args != {"encoding": "utf-8"} and pickle_load_args:
        import warnings

        warnings.warn("pickle_load_args only works if `weights_only=False`.", stacklevel=2)
    ser = _torch.serialization
    overall = _torch.frombuffer(buf, dtype=_torch.uint8).untyped_storage()
    del buf  # the storage keeps the memory alive
    with ser._open_zipfile_reader(path) as zf:
        if zf.has_record("constants.pkl"):  # TorchScript: torch.load dispatches to jit.load
            return _torch.load(
                path,
                map_location=map_location,
                pickle_module=pickle_module,
                weights_only=weights_only,
                **passthrough,
            )
        if wo:
            try:
                return ser._load(
                    zf,
                    map_location,
                    ser._weights_only_unpickler,
                    overall_storage=overall,
                    **pickle_load_args,
                )
            except pickle.UnpicklingError as e:
                raise pickle.UnpicklingError(
                    f"Weights only load failed ({e}). ckptio.torch.load follows torch.load: "
                    "pass weights_only=False only for a file you trust."
                ) from None
        return ser._load(zf, map_location, pmod, overall_storage=overall, **pickle_load_args)
