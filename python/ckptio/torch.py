# SPDX-License-Identifier: Apache-2.0
"""ckptio.torch.save / ckptio.torch.load: drop-ins for torch.save / torch.load at ckptio's speed.

The file is the standard torch zip archive (stock ``torch.load`` opens it, with
``weights_only=True`` too), with storage records aligned to 4096 bytes. It is written by
ckptio's zip writer (C: staging ring, O_DIRECT where the file system allows it, several writes
in flight, each record's CRC-32 computed on other threads while it is written) and appears at
its path only when complete and durable. Loading reads every
storage with one batched read, each into its own page-aligned buffer that its tensors use with
no second copy (and free with them). Both take torch's arguments; ckptio's own options go in
``io_options``.

>>> import torch, ckptio.torch, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "model.pt")
>>> _ = ckptio.torch.save({"w": torch.ones(2, 3, dtype=torch.bfloat16)}, path)
>>> torch.load(path, weights_only=True)["w"].dtype
torch.bfloat16
>>> ckptio.torch.load(path)["w"].shape
torch.Size([2, 3])
"""

from __future__ import annotations

import contextlib
import inspect
import os
import pickle
import time
from collections.abc import Iterator
from typing import IO, Any

import torch as _torch

from . import _async, _core
from ._async import _PROCESS, AsyncSave, HostPool, host_cap
from ._dtypes import U8
from ._errors import USAGE, CheckpointError, CheckpointExists, LimitExceeded, carry_values, error
from ._options import IO_OPTIONS, Stats, params
from .formats._torch_state import load_state_dict
from .formats._torch_zip import records as _records
from .frameworks import _gpu

__all__ = ["save", "save_async", "load", "load_state_dict", "STORAGE_ALIGNMENT", "SAVE_OPTIONS"]

#: Alignment of every storage record in archives written by ckptio.torch.save.
STORAGE_ALIGNMENT = 4096

#: Keys of ckptio.torch.save's ``io_options``: ckptio's I/O options, ``overwrite`` and ``crc32``.
SAVE_OPTIONS = (*IO_OPTIONS, "overwrite", "crc32")

_ZIP_MAGIC = b"PK\x03\x04"
# torch's own save and load, for what the drop-ins hand back to torch: taken from
# torch.serialization at import, so that a program that replaced torch.save/torch.load with
# the drop-ins (torch.save = ckptio.torch.save) does not send them back to themselves.
_TORCH_SAVE = _torch.serialization.save
_TORCH_LOAD = _torch.serialization.load
_TRUE = ("1", "y", "yes", "true")


def _is_path(f: Any) -> bool:
    return isinstance(f, (str, os.PathLike))


_AS_RUNTIME: dict[type[CheckpointError], type[CheckpointError]] = {}


def _as_runtime_error(e: CheckpointError) -> CheckpointError:
    """``e`` as an instance that is also a RuntimeError, which torch.save raises for I/O failures.

    A torch user's ``except RuntimeError`` keeps working; ``except ckptio.CheckpointError`` and
    the builtin class ckptio chose (FileNotFoundError, FileExistsError, ...) do too.
    """
    if isinstance(e, RuntimeError):
        return e
    cls = type(e)
    both = _AS_RUNTIME.get(cls)
    if both is None:
        attrs = {"__module__": cls.__module__, "__doc__": cls.__doc__}
        both = type(cls.__name__, (cls, RuntimeError), attrs)
        _AS_RUNTIME[cls] = both
    out = carry_values(e, both(str(e), e.code, e.name))
    out.__traceback__ = e.__traceback__
    return out


def _save_options(io_options: dict[str, Any] | None, legacy: dict[str, Any]) -> dict[str, Any]:
    """io_options merged with the keyword form older ckptio versions took (``crc32=False``)."""
    unknown = set(legacy) - set(SAVE_OPTIONS)
    if unknown:
        raise TypeError(f"save() got an unexpected keyword argument {sorted(unknown)[0]!r}")
    opts = dict(io_options or {})
    unknown = set(opts) - set(SAVE_OPTIONS)
    if unknown:
        raise TypeError(
            f"unknown io_options key(s) {', '.join(sorted(unknown))}; "
            f"known: {', '.join(SAVE_OPTIONS)}"
        )
    opts.update(legacy)
    for k in ("compress", "base"):
        if opts.get(k) not in (None, False, "none"):
            raise error(
                USAGE,
                f"ckptio.torch.save writes a zip file that stock torch.load reads: {k}= is for "
                "ckptio checkpoints; save with ckptio.save(..., compress=...) instead, or convert "
                "the file (ckptio convert --compress)",
            )
    return opts


def save(
    obj: object,
    f: str | os.PathLike[str] | IO[bytes],
    pickle_module: Any = pickle,
    pickle_protocol: int = _torch.serialization.DEFAULT_PROTOCOL,
    _use_new_zipfile_serialization: bool = True,
    _disable_byteorder_record: bool = False,
    *,
    io_options: dict[str, Any] | None = None,
    **legacy_options: Any,
) -> Stats | None:
    """``torch.save(obj, f, ...)`` written at ckptio's speed; returns Stats for a path.

    Takes torch.save's arguments, positional or keyword. Like torch.save, an existing file at
    ``f`` is replaced — but only once the new file is complete: a failed or interrupted save
    (Ctrl-C) leaves the old file, and no temporary file. The file keeps an existing file's
    permission bits; a new one gets the umask's. File objects, and the legacy format
    (``_use_new_zipfile_serialization=False``), go to torch.save unchanged.

    ``io_options``: a dict of ckptio's own options, kept apart from torch's keywords:
    ckptio.save's I/O options (backend, direct, fsync, ...), ``overwrite`` (default True;
    False refuses an existing file with CheckpointExists) and ``crc32``: None follows torch
    (``torch.serialization.set_crc32_options``, on by default). The CRC-32s are computed in C
    while each record is written, so they cost no time at device speed; ``crc32=False`` leaves
    them zero as torch's option does: torch.load still opens the file, zip tools report bad
    CRCs. (The same options given as
    keywords, as older versions took them, still work.)

    Errors: what torch.save raises; a ckptio I/O error (no such directory, a directory at
    ``f``, disk full) is a CheckpointError that is also a RuntimeError, as torch's are.
    """
    opts = _save_options(io_options, legacy_options)
    overwrite = bool(opts.pop("overwrite", True))
    crc32 = opts.pop("crc32", None)
    if not _is_path(f) or not _use_new_zipfile_serialization:
        if _is_path(f) and not overwrite and os.path.lexists(f):  # type: ignore[arg-type]
            msg = f"{os.fspath(f)!r} already exists and overwrite is off"  # type: ignore[arg-type]
            raise _as_runtime_error(CheckpointExists(msg, -4007, "CKPTIO_E_EXISTS"))
        _TORCH_SAVE(
            obj,
            f,  # type: ignore[arg-type]
            pickle_module,
            pickle_protocol,
            _use_new_zipfile_serialization,
            _disable_byteorder_record,
        )
        return None
    t0 = time.perf_counter()
    path = os.fspath(f)  # type: ignore[arg-type]
    p = params(opts, overwrite=overwrite)
    crc = _crc(crc32)
    with _torch_errors():
        try:
            if _direct():
                st = _save_zip(obj, path, p, crc, pickle_module, pickle_protocol,
                               _disable_byteorder_record)  # fmt: skip
            else:
                raise _Unhooked
        except _Unhooked:
            st = _save_through_torch(obj, path, p, crc, pickle_module, pickle_protocol,
                                     _disable_byteorder_record)  # fmt: skip
    return Stats._from_core(st, time.perf_counter() - t0)


def save_async(
    obj: object,
    f: str | os.PathLike[str],
    pickle_module: Any = pickle,
    pickle_protocol: int = _torch.serialization.DEFAULT_PROTOCOL,
    *,
    max_host_bytes: int | None = None,
    io_options: dict[str, Any] | None = None,
) -> AsyncSave:
    """``torch.save(obj, f)`` in the background: returns a ``ckptio.AsyncSave`` once ``obj``'s
    tensors may change; ``wait()`` gives the Stats once the file is durable at ``f``, or
    raises the save's error.

    During the call, torch pickles ``obj`` (as torch.save does) and the C engine copies every
    storage into its pool of host buffers (the one ``ckptio.save_async`` uses: reused across
    saves, freed by ``ckptio.release_buffers()``; CUDA storages are copied there straight from
    the GPU, page-locked, where ckptio's GPU path runs). A thread of the engine's then writes the
    archive (the same file ckptio.torch.save writes: stock torch.load reads it) and publishes
    it atomically. Storages passing ``max_host_bytes`` (default: a quarter of physical memory)
    are written during the call instead. One save runs at a time, shared with
    ckptio.save_async: a call while one is in flight waits for it first, and the error of one
    nobody waited for is raised by the next call. ``io_options`` as for save().
    """
    if not _is_path(f):
        raise TypeError(f"save_async writes a file at a path, got {type(f).__name__}")
    path = os.fspath(f)
    return _async.one_at_a_time(
        lambda: start_async(obj, path, io_options, _PROCESS, max_host_bytes, pickle_module,
                            pickle_protocol)  # fmt: skip
    )


def start_async(obj: object, path: str, io_options: dict[str, Any] | None, pool: HostPool,
                max_host_bytes: int | None, pickle_module: Any = pickle,
                pickle_protocol: int = _torch.serialization.DEFAULT_PROTOCOL) -> AsyncSave:  # fmt: skip
    """save_async's save, started on ``pool`` (one save in flight per pool: the pool's
    previous save is waited for first), with no rule of the process's: ckptio.deepspeed keeps
    a pool per file of a checkpoint, so that its files are written side by side."""
    opts = _save_options(io_options, {})
    overwrite = bool(opts.pop("overwrite", True))
    crc = _crc(opts.pop("crc32", None))
    cap = host_cap(max_host_bytes)
    p = params(opts, overwrite=overwrite)
    t0 = time.perf_counter()

    def start() -> tuple[Any, str, Any]:
        with _torch_errors():
            try:
                if _direct():
                    return _start_zip(obj, path, p, crc, pickle_module, pickle_protocol, False,
                                      pool, cap)  # fmt: skip
                raise _Unhooked
            except _Unhooked:  # written now
                return None, "", _save_through_torch(obj, path, p, crc, pickle_module,
                                                     pickle_protocol, False)  # fmt: skip

    return _async.started(path, t0, start)


def _start_zip_commit(snap: Any, zw: Any, records: list[tuple[str, Any, int, bool]]) -> Any:
    """ckptio_snapshot_zip_async: the one place a background archive starts (tests hold it
    here)."""
    return _core.zip_async(snap, zw, records)


def _crc(crc32: Any) -> bool:
    """The crc32 option: None follows torch (set_crc32_options, on by default)."""
    if crc32 is None:
        from torch.utils.serialization import config

        crc32 = config.save.compute_crc32  # type: ignore[attr-defined]
    return bool(crc32)


def _direct() -> bool:
    """Whether archives go through ckptio's zip writer: not inside
    torch.serialization.skip_data() (which writes no storage bytes: torch's own writer
    does that), and with a torch whose ``_save`` ckptio knows."""
    ser = _torch.serialization
    skip = getattr(getattr(ser, "_serialization_tls", None), "skip_data", False)
    return hasattr(ser, "_save") and not skip


@contextlib.contextmanager
def _torch_errors() -> Iterator[None]:
    """Errors as torch.save raises them: a ckptio error is also a RuntimeError, and Ctrl-C
    in a write is the KeyboardInterrupt itself (torch's own cleanup may fail after it and
    hide it behind a RuntimeError)."""
    try:
        try:
            yield
        except BaseException as e:
            cause: BaseException | None = e
            while cause is not None and not isinstance(cause, KeyboardInterrupt):
                cause = cause.__context__
            if cause is not None and cause is not e:
                raise cause from None
            raise
    except CheckpointError as e:
        raise _as_runtime_error(e) from None


def _archive_name(path: str) -> str:
    """The records' common prefix torch.save gives a file: its name up to the last dot."""
    stem = os.path.basename(path).rpartition(".")
    return (stem[0] if stem[1] else stem[2]) or "archive"


class _Pickled(Exception):
    """Raised into torch's ``_save`` at its first record after the pickle: the rest of the
    archive is ckptio's to write."""


class _Unhooked(Exception):
    """torch's ``_save`` pickled without a ``persistent_id`` ckptio could watch."""


def _pickle(obj: object, pickle_module: Any, pickle_protocol: int) -> tuple[bytes, dict[str, Any]]:
    """torch's own pickling of ``obj`` (its ``_save``: storage sharing, the dtype checks,
    location tags, accelerator storages left where they are): ``data.pkl``'s bytes, and the
    untyped storages it names, by key in torch's order. ``_save`` is stopped at its next
    record; ckptio writes the records that follow (:func:`_records`)."""
    ser = _torch.serialization
    if hasattr(ser, "_check_dill_version"):
        ser._check_dill_version(pickle_module)
    storages: dict[str, Any] = {}
    hooked = []
    subclasses: list[type] = []

    def watch(inner: Any) -> Any:
        hooked.append(True)

        def persistent_id(*args: Any) -> Any:
            pid = inner(*args)
            if pid is not None:  # ("storage", type, key, location, numel)
                o = args[-1]
                storages[pid[2]] = getattr(o, "_untyped_storage", o)
            return pid

        return persistent_id

    class Pickler(pickle_module.Pickler):  # type: ignore[name-defined,misc]
        def __init_subclass__(cls, **kw: Any) -> None:
            # torch's pickler is a subclass defining persistent_id (torch >= 2.5)
            super().__init_subclass__(**kw)
            if "persistent_id" in cls.__dict__:
                cls.persistent_id = watch(cls.__dict__["persistent_id"])
                subclasses.append(cls)

        def __setattr__(self, name: str, value: Any) -> None:
            # older torch assigns persistent_id to its pickler
            super().__setattr__(name, watch(value) if name == "persistent_id" else value)

    class Module:  # what _save takes of a pickle module
        pass

    module = Module()
    module.Pickler = Pickler  # type: ignore[attr-defined]
    pkl: list[bytes] = []

    class Records:
        def write_record(self, name: str, data: Any, size: int) -> None:
            if name != "data.pkl":
                raise _Pickled
            pkl.append(bytes(data))

    try:
        ser._save(obj, Records(), module, pickle_protocol, False)
    except _Pickled:
        pass
    finally:
        # torch's class would keep its closure, and every storage, alive until the next
        # garbage collection (torch deletes the closure's name after its pickling, which
        # the stop skipped)
        for cls in subclasses:
            del cls.persistent_id
    # the classes above are garbage in a cycle: what their closures hold is handed on
    out, found = dict(storages), bool(pkl and hooked)
    storages.clear()
    if not found:
        raise _Unhooked
    return pkl.pop(), out


def _host_bytes(storage: Any) -> Any:
    """An untyped storage's bytes in host memory: its own for a CPU storage, else a copy."""
    if storage.device.type != "cpu":
        storage = storage.cpu()
    return _torch.empty(0, dtype=_torch.uint8).set_(storage).numpy()


def _save_zip(obj: object, path: str, p: Any, crc: bool, pickle_module: Any, pickle_protocol: int,
              disable_byteorder: bool) -> Any:  # fmt: skip
    """torch.save's archive through ckptio's zip writer: torch's pickling, then the records."""
    pkl, storages = _pickle(obj, pickle_module, pickle_protocol)
    return _write_zip(pkl, storages, path, p, crc, disable_byteorder)


def _write_zip(pkl: bytes, storages: dict[str, Any], path: str, p: Any, crc: bool,
               disable_byteorder: bool) -> Any:  # fmt: skip
    """Every record into ckptio's zip writer as it comes (an accelerator's storage copied to
    the host one at a time, freed after its record); the stats tuple of the commit."""
    prefix = _archive_name(path)
    with _core.ZipWriter(path, p) as zw:
        for name, data in _records(pkl, storages, disable_byteorder):
            if not isinstance(data, bytes):
                data = _host_bytes(data)
            zw.add(f"{prefix}/{name}", data, STORAGE_ALIGNMENT, crc)
        return zw.commit()


def _start_zip(obj: object, path: str, p: Any, crc: bool, pickle_module: Any,
               pickle_protocol: int, disable_byteorder: bool, pool: HostPool,
               cap: int) -> tuple[Any, str, Any]:  # fmt: skip
    """The background save of :func:`save_async`: torch's pickling, the storages copied into
    ``pool``'s buffers (CUDA ones straight from the GPU where ckptio's GPU path runs), then
    ckptio_snapshot_zip_async. What _async.started takes: (Completion, Stats.gpu, None), or
    (None, "", stats) when the storages pass ``cap`` and the archive was written now."""
    pkl, storages = _pickle(obj, pickle_module, pickle_protocol)
    if sum(s.nbytes() for s in storages.values()) > cap:  # written now, from their memory
        return None, "", _write_zip(pkl, storages, path, p, crc, disable_byteorder)
    items: list[tuple[Any, ...]] = []
    device = False
    for key, s in storages.items():
        n = s.nbytes()
        if s.device.type == "cuda" and _gpu.route():
            device = True
            items.append((f"data/{key}", U8, (n,), s.data_ptr(), None, None, 0, n,
                          _gpu.torch_stream(s.device), s))  # fmt: skip
        else:
            items.append((f"data/{key}", U8, (n,), _host_bytes(s), None, None, 0))
    pl = pool.get(device)
    pl.set_max_bytes(max(cap, 1))
    try:
        snap = _core.take(pl, items, None)
    except LimitExceeded:  # the pool's room is less than the cap: written now instead
        return None, "", _write_zip(pkl, storages, path, p, crc, disable_byteorder)
    del items
    gpu = "snapshot" if snap.stats().device_bytes else ""
    prefix = _archive_name(path)
    index = {name: i for i, name in enumerate(f"data/{k}" for k in storages)}
    records = [(f"{prefix}/{name}", data if isinstance(data, bytes) else index[name],
                STORAGE_ALIGNMENT, crc) for name, data in _records(pkl, storages, disable_byteorder)]  # fmt: skip
    del storages
    zw = _core.ZipWriter(path, p)
    try:
        return _start_zip_commit(snap, zw, records), gpu, None
    except BaseException:
        zw.close()
        snap.free()
        raise


def _save_through_torch(obj: object, path: str, p: Any, crc32: bool, pickle_module: Any,
                        pickle_protocol: int, disable_byteorder: bool) -> Any:  # fmt: skip
    """torch.save's own archive writer into ckptio's file writer: the fallback for what the
    zip writer does not take (torch.serialization.skip_data(), which writes no storage bytes,
    or a torch whose pickling ckptio cannot watch); the archive is written during the call."""
    from torch.utils.serialization import config

    with _core.FileWriter(path, p) as fw:
        patch: dict[str, Any] = {"save.storage_alignment": STORAGE_ALIGNMENT,
                                 "save.compute_crc32": bool(crc32)}  # fmt: skip
        with config.patch(patch):  # type: ignore[attr-defined]
            _TORCH_SAVE(obj, fw, pickle_module, pickle_protocol, True, disable_byteorder)  # type: ignore[arg-type]
        return fw.commit()


def _resolve_weights_only(weights_only: bool | None, pickle_module: Any) -> tuple[bool, Any]:
    """torch.load's rules for weights_only: its default, the TORCH_FORCE_* variables, and the
    same errors and warning (with torch's wording: callers match on it)."""
    not_set = weights_only is None
    if not_set:
        weights_only = _torch.serialization._default_to_weights_only(pickle_module)
    force = os.getenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0").lower() in _TRUE
    force_no = os.getenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0").lower() in _TRUE
    if force and force_no:
        raise RuntimeError(
            "Only one of `TORCH_FORCE_WEIGHTS_ONLY_LOAD` or `TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD` "
            "should be set, but both were set."
        )
    if force:
        weights_only = True
    elif force_no and not_set:
        import warnings

        warnings.warn(
            "Environment variable TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected, since the "
            "`weights_only` argument was not explicitly passed to `torch.load`, forcing "
            "weights_only=False.",
            UserWarning,
            stacklevel=3,
        )
        weights_only = False
    if weights_only:
        if pickle_module is not None:
            raise RuntimeError("Can not safely load weights when explicit pickle_module is specified")
    elif pickle_module is None:
        pickle_module = pickle
    return bool(weights_only), pickle_module


def _can_preread() -> bool:
    """Whether this torch has the private pieces load() builds on (else it defers to torch.load)."""
    ser = _torch.serialization
    load_impl = getattr(ser, "_load", None)
    reader = getattr(_torch._C, "PyTorchFileReader", None)
    if load_impl is None or reader is None or not hasattr(ser, "_open_zipfile_reader"):
        return False
    needed = ("get_record_size", "get_record_offset", "get_all_records")
    if not all(hasattr(reader, m) for m in needed):
        return False
    try:
        return "zip_file" in inspect.signature(load_impl).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False


def _torch_reads_no_data(map_location: Any) -> bool:
    """torch.load builds storages without reading them (meta or fake tensors, skip_data)."""
    ser = _torch.serialization
    tls = getattr(ser, "_serialization_tls", None)
    if tls is not None and getattr(tls, "skip_data", False):
        return True
    try:
        if ser._is_meta_location(map_location):
            return True
    except Exception:  # pragma: no cover - a map_location torch itself will judge
        return True
    return _torch._guards.detect_fake_mode(None) is not None


class _PreRead:
    """The archive's reader, with every storage record already read into its own buffer.

    torch's ``_load`` asks it for each storage by record name; the rest (``data.pkl``,
    ``byteorder``, ...) comes from torch's own reader.
    """

    def __init__(self, zf: Any, storages: dict[str, _torch.Tensor]) -> None:
        self._zf = zf
        self._storages = storages

    def get_storage_from_record(self, name: str, numel: int, cls: Any) -> Any:
        t = self._storages.pop(name, None)  # handed out once: the tensors alone keep it alive
        if t is None or t.numel() != numel:
            return self._zf.get_storage_from_record(name, numel, cls)
        return t

    def __getattr__(self, name: str) -> Any:
        return getattr(self._zf, name)


def _read_storages(path: str, zf: Any, p: tuple[int, ...]) -> dict[str, _torch.Tensor]:
    """Every ``data/<key>`` record, in one batched read, each where the library places it
    (ckptio_file_place: a page-aligned block of its own for 4 KiB or more, which the read
    lands in; 64-byte-aligned places in shared slabs for the small ones, so that many small
    storages cost no page each). Each storage's memory is freed with its tensors: keeping a
    small tensor does not keep the file's large storages alive."""
    names = [n for n in zf.get_all_records() if n.startswith("data/")]
    spans = [(zf.get_record_offset(n), zf.get_record_size(n)) for n in names]
    ranges: list[tuple[int, int, Any, int]] = []
    out: dict[str, _torch.Tensor] = {}
    for name, (off, n), (buf, at, _cap, _lead) in zip(names, spans, _core.file_place(spans)):
        if buf is None:
            out[name] = _torch.empty(0, dtype=_torch.uint8)
            continue
        ranges.append((off, n, buf, at))
        out[name] = _torch.frombuffer(buf, dtype=_torch.uint8, count=n, offset=at)  # keeps buf
    if ranges:
        ranges.sort(key=lambda r: r[0])
        _core.file_read(path, ranges, p)
    return out


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
    From a path to a zip archive, every storage is read with one batched read, each into its
    own page-aligned buffer that its tensors then use with no further copy; each storage's
    memory is freed with its tensors, as with torch.load. File objects, ``mmap=True``, legacy
    (non-zip) files and TorchScript archives go to torch.load unchanged. A missing file or a
    directory raises FileNotFoundError or IsADirectoryError, as with torch.load.
    ``io_options``: a dict of ckptio I/O options (backend, direct, ...).
    """
    if mmap is None:
        from torch.utils.serialization import config

        mmap = bool(config.load.mmap)
    passthrough: dict[str, Any] = dict(pickle_load_args)

    def defer(target: Any) -> Any:
        return _TORCH_LOAD(
            target,
            map_location=map_location,
            pickle_module=pickle_module,
            weights_only=weights_only,
            mmap=mmap,
            **passthrough,
        )

    if not _is_path(f) or mmap or not _can_preread() or _torch_reads_no_data(map_location):
        return defer(f)
    path = os.fspath(f)  # type: ignore[arg-type]
    p = params(io_options or {})
    # open() raises what torch.load raises: FileNotFoundError, IsADirectoryError, ...
    with open(path, "rb") as fh:
        is_zip = fh.read(4) == _ZIP_MAGIC
    if not is_zip:
        return defer(path)
    wo, pmod = _resolve_weights_only(weights_only, pickle_module)
    if wo and pickle_load_args:
        import warnings

        warnings.warn("pickle_load_args only works if `weights_only=False`.", stacklevel=2)
    ser = _torch.serialization
    if hasattr(ser, "_check_dill_version"):
        ser._check_dill_version(pmod)
    if "encoding" not in pickle_load_args:
        pickle_load_args["encoding"] = "utf-8"
    with ser._open_zipfile_reader(path) as zf:
        if zf.has_record("constants.pkl"):  # TorchScript: torch.load dispatches to jit.load
            return defer(path)
        try:
            records = _PreRead(zf, _read_storages(path, zf, p))
        except CheckpointError as e:  # torch's reader raises RuntimeError for a bad archive
            raise _as_runtime_error(e) from None
        if not wo:
            return ser._load(records, map_location, pmod, **pickle_load_args)
        try:
            unpickler = ser._weights_only_unpickler
            return ser._load(records, map_location, unpickler, **pickle_load_args)
        except pickle.UnpicklingError:
            pass
    # A file weights_only refuses: torch.load raises the same error, with its own explanation.
    del records
    return defer(path)


def _dcp_module() -> Any:
    """ckptio.torch.dcp: a module whose public names come from ckptio.formats._torch_dcp on first use,
    so that importing ckptio.torch does not import torch.distributed. Only those names import
    it: torch inspects loaded modules' attributes (``__wrapped__``, ``__path__``...) while it
    imports itself, and a module that imported torch.distributed.checkpoint on any attribute
    access would do so in the middle of torch's own import."""
    import sys
    import types

    names = ("StorageWriter", "StorageReader", "METADATA_KEY")
    mod = types.ModuleType(__name__ + ".dcp", "torch.distributed.checkpoint storage through ckptio")

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {mod.__name__!r} has no attribute {name!r}")
        from .formats import _torch_dcp

        return getattr(_torch_dcp, name)

    mod.__getattr__ = __getattr__  # type: ignore[method-assign]
    mod.__all__ = list(names)
    sys.modules[mod.__name__] = mod
    return mod


dcp = _dcp_module()
