# SPDX-License-Identifier: Apache-2.0
"""ckptio.safetensors: safetensors files read and written at the device's speed.

The same calls as the ``safetensors`` package (``save_file``, ``load_file``, ``safe_open``),
on the same file format: files written here are read by stock safetensors bit for bit, and
stock files read here bit for bit. Headers are parsed and written by ckptio's C parser and
encoder (strict: a hostile header is refused with a CorruptCheckpoint naming the file).
``load_file`` reads every tensor with one batched O_DIRECT read of the library's reader
(``_core.open_foreign``: the planner that reads checkpoints), each big tensor into its own
page-aligned memory, in place even where stock files leave it unaligned; ``save_file`` pads
the header so that the data starts on a 4096-byte boundary and streams the tensors through
ckptio's file writer (large aligned writes, fsync, atomic rename: the file appears complete
or not at all). ``get_slice(name)[rows]`` reads only the bytes of those rows.

>>> import torch, ckptio.safetensors as st, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
>>> st.save_file({"w": torch.arange(6.0).reshape(2, 3)}, path, metadata={"format": "pt"})
>>> st.load_file(path)["w"][1]
tensor([3., 4., 5.])
>>> with st.safe_open(path, framework="pt") as f:
...     print(f.keys(), f.metadata(), f.get_slice("w")[:, 1:])
['w'] {'format': 'pt'} tensor([[1., 2.],
        [4., 5.]])
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _core, _dtypes
from ._errors import DTYPE, USAGE, CheckpointError, InvalidType, error
from ._options import Stats, params
from .formats._hf import NO_CODE, HFReader

__all__ = ["save_file", "load_file", "safe_open", "last_stats", "DATA_ALIGNMENT"]

PathLike = str | os.PathLike[str]

#: Where the data of files written by save_file starts, and how large tensors are laid out.
DATA_ALIGNMENT = 4096

# safetensors dtype -> ckptio's dtype code, 0 where ckptio has none: the library's table.
_CODES: dict[str, int] = dict(_core.st_dtypes())
_ST_OF_CODE = {code: st for st, code in _CODES.items() if code}

_ST_OF_NAME = {name: st for st, name in NO_CODE.items()}

# safetensors' framework names -> ckptio's adapters
_FRAMEWORKS = {"pt": "torch", "torch": "torch", "np": "numpy", "numpy": "numpy", "jax": "jax",
               "flax": "jax"}  # fmt: skip


# ---- dtypes ------------------------------------------------------------------------------


def itemsize(st: str) -> int:
    """Bytes per element of a loadable safetensors dtype."""
    code = _CODES.get(st, 0)
    return _dtypes.ITEMSIZE[code] if code else 1


def loadable(st: str) -> bool:
    """Whether ckptio reads tensors of safetensors dtype ``st`` (not F4 and F6_*)."""
    return bool(_CODES.get(st)) or st in NO_CODE


def torch_dtype(st: str, name: str, path: str) -> Any:
    """The torch dtype of safetensors dtype ``st`` (tensor ``name`` of ``path``)."""
    import torch

    from .frameworks._torch import tables

    code = _CODES.get(st, 0)
    dt = tables()[1].get(code) if code else getattr(torch, NO_CODE.get(st, "-"), None)
    if not isinstance(dt, torch.dtype):
        raise error(
            DTYPE, f"{path}: tensor '{name}' has safetensors dtype {st}, which ckptio cannot load "
            "as a torch tensor",
        )  # fmt: skip
    return dt


def np_dtype(st: str, name: str, path: str) -> np.dtype[Any]:
    """The numpy dtype of safetensors dtype ``st`` (bf16 and float8 through ml_dtypes)."""
    code = _CODES.get(st, 0)
    found: Any = None
    if code:
        found = _dtypes.code_to_np().get(code)
    elif st in NO_CODE:
        m = _dtypes.ml_dtypes()
        found = getattr(m, NO_CODE[st], None) if m is not None else None
    if found is not None:
        return np.dtype(found)
    raise error(
        DTYPE, f"{path}: tensor '{name}' has safetensors dtype {st}, which ckptio cannot load as "
        "a numpy array" + (" (install ml_dtypes)" if loadable(st) else ""),
    )  # fmt: skip


def _st_of_torch(t: Any, name: str) -> str:
    from .frameworks._torch import tables

    code = tables()[0].get(t.dtype)
    want = str(t.dtype).removeprefix("torch.")
    st = _ST_OF_CODE.get(code) if code else _ST_OF_NAME.get(want)
    if st is None:
        raise error(DTYPE, f"tensor '{name}': torch.{want} has no safetensors dtype")
    return st


def _st_of_np(dt: np.dtype[Any], name: str) -> str:
    code = _dtypes.np_to_code().get(dt)
    st = _ST_OF_CODE.get(code) if code else None
    if st is None and dt.kind == "V" and dt.names is None:  # an ml_dtypes float8
        st = _ST_OF_NAME.get(dt.name)
    if st is None:
        raise error(DTYPE, f"tensor '{name}': numpy dtype {dt} has no safetensors dtype")
    return st


# ---- headers -----------------------------------------------------------------------------


class Entry:
    """One tensor of a safetensors file: dtype, shape, and where its bytes lie in the file."""

    __slots__ = ("name", "dtype", "code", "shape", "offset", "nbytes")

    def __init__(
        self, name: str, dtype: str, code: int, shape: tuple[int, ...], offset: int, nbytes: int
    ) -> None:
        self.name = name
        self.dtype = dtype  # the safetensors name ("BF16")
        self.code = code  # ckptio's dtype code, 0 where it has none
        self.shape = shape
        self.offset = offset  # absolute file offset of the first byte
        self.nbytes = nbytes


class Header:
    """The parsed header of one safetensors file (``read_header``)."""

    __slots__ = ("path", "size", "data_start", "entries", "metadata")

    def __init__(
        self,
        path: str,
        size: int,
        data_start: int,
        entries: dict[str, Entry],
        metadata: dict[str, str] | None,
    ) -> None:
        self.path = path
        self.size = size
        self.data_start = data_start
        self.entries = entries  # in file order
        self.metadata = metadata

    def entry(self, name: str) -> Entry:
        e = self.entries.get(name)
        if e is None:
            raise error("CKPTIO_E_NOT_FOUND", f"{self.path}: no tensor '{name}' in this file")
        return e


def _with_path(e: CheckpointError, path: str) -> CheckpointError:
    """``e`` again, its message prefixed with the file's path (the C parser does no I/O)."""
    out = type(e)(f"{path}: {e}", e.code, e.name)
    return out


def read_header(path: PathLike) -> Header:
    """Read and parse the header of the safetensors file at ``path`` (links followed)."""
    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise _os_error(e, p) from None
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 8, 0)
        if len(head) < 8:
            raise error(
                "CKPTIO_E_CORRUPT",
                f"{p}: {size} bytes, too short for a safetensors file (8-byte header length)",
            )
        n = int.from_bytes(head, "little")
        want = min(n, max(size - 8, 0), 100_000_001)
        chunks = []
        got = 0
        while got < want:  # pread may return less on some file systems
            b = os.pread(fd, want - got, 8 + got)
            if not b:
                break
            chunks.append(b)
            got += len(b)
        hdr = b"".join(chunks)
    finally:
        os.close(fd)
    try:
        tensors, meta = _core.st_parse(hdr, size, n)
    except CheckpointError as e:
        raise _with_path(e, p) from None
    start = 8 + n
    entries = {
        name: Entry(name, st, code, shape, start + b, e - b)
        for name, st, code, shape, b, e in tensors
    }
    return Header(p, size, start, entries, meta)


def _os_error(e: OSError, path: str) -> CheckpointError:
    import errno as _errno

    code = -(e.errno or _errno.EIO)
    name = _errno.errorcode.get(-code, "EIO")
    from ._errors import _from_code

    return _from_code(code, name, f"cannot open '{path}': {e.strerror}")


# ---- reading ----------------------------------------------------------------------------


def _open(filename: PathLike, io_options: dict[str, Any] | None) -> Any:
    """The reader of every ckptio load of safetensors (ckptio.formats._hf.HFReader: the
    library's foreign reader, the planner, placement in C)."""
    path = os.fspath(filename)
    try:
        return HFReader(path, **(io_options or {}))
    except CheckpointError as e:
        raise _with_path(e, path) if path not in str(e) else e from None


def _st_shape(path: str, name: str) -> tuple[int, ...]:
    """The shape of a sub-byte tensor (F4, F6_*), which only the header says."""
    return read_header(path).entry(name).shape


def _entries(r: Any) -> dict[str, Entry]:
    """The file's tensors as safetensors names them, in the order of their data in the file."""
    found = []
    for i, (t, st) in enumerate(zip(r._r.tensors(), r._r.st_dtypes())):
        c = r._r.chunks(i)[0]
        shape = tuple(t.shape)
        if t.dtype == _dtypes.BYTES:  # served as bytes: the safetensors shape is known
            shape = shape[:-1] if st in NO_CODE else _st_shape(r.path, t.name)
        code = 0 if t.dtype == _dtypes.BYTES else t.dtype
        found.append((c.file_offset, i, Entry(t.name, st, code, shape, c.file_offset, t.nbytes)))
    found.sort(key=lambda x: (x[0], x[1]))
    return {e.name: e for _off, _i, e in found}


def _framework(framework: str) -> str:
    fw = _FRAMEWORKS.get(framework)
    if fw is None:
        raise error(
            USAGE,
            f"framework must be one of {', '.join(_FRAMEWORKS)}, got {framework!r}",
        )
    return fw


_last: Stats | None = None


def last_stats() -> Stats | None:
    """Stats of the most recent load_file, get_tensor, get_tensors or slice read in this
    process: bytes asked for, ``io_bytes`` moved from the device, seconds, backend, O_DIRECT."""
    return _last


class _Reads:
    """The stats of each read of one reader, apart (the reader's own are cumulative)."""

    def __init__(self, r: Any) -> None:
        self.r = r
        self.seen = (0, 0, 0, 0.0)

    def record(self, t0: float, nbytes: int) -> None:
        """Keep the last read's stats; ``nbytes``: the tensor bytes it delivered (its ranges
        may also have covered the page edges around them: ``io_bytes`` keeps what was moved)."""
        global _last
        t = self.r._r.stats()
        b, io, n, sec = self.seen
        self.seen = (t.bytes, t.io_bytes, t.tensors, t.seconds)
        b, io, n, sec = t.bytes - b, t.io_bytes - io, t.tensors - n, t.seconds - sec
        if not b and not io:
            return  # nothing was read (empty tensors)
        gbps = nbytes / sec / 1e9 if sec > 0 else 0.0
        st = _core.IOStats((nbytes, io, n, sec, gbps, t.backend, t.direct, t.alignment))
        _last = Stats._from_core(st, time.perf_counter() - t0)


def _load(r: Any, reads: _Reads, names: list[str] | None, fw: str, device: Any) -> dict[str, Any]:
    """Tensors ``names`` (None: all) in one plan and one batched read, each where the library
    places it (a page-aligned block of its own for 4 KiB or more, in place)."""
    t0 = time.perf_counter()
    tensors = r.tensors()
    wanted = list(tensors) if names is None else names
    for n in wanted:
        if n not in tensors:
            raise error("CKPTIO_E_NOT_FOUND", f"{r.path}: no tensor '{n}' in this file")
    if names is None:
        out = r.load(framework=fw, device=device)
    else:
        out = {n: r.read(n, framework=fw) for n in wanted}
        out = {n: _place(fw, t, device) for n, t in out.items()}
    reads.record(t0, sum(tensors[n].nbytes for n in wanted))
    return dict(out)


def load_file(
    filename: PathLike,
    device: Any = "cpu",
    *,
    framework: str = "pt",
    io_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``safetensors.torch.load_file``: every tensor of ``filename``, by name.

    All tensors are planned and read in one batched read, each into its own page-aligned memory
    (small ones share aligned slabs), freed with its tensor. ``device``: where torch tensors go
    ("cpu", "cuda:0"), or a jax device for ``framework="jax"``. ``framework``: "pt" (torch, the
    default), "np" (numpy; bf16 and float8 as ml_dtypes) or "jax". ``io_options``: ckptio's
    I/O options (backend, direct, ...). A dtype the framework cannot hold raises
    UnsupportedDtype naming the tensor; a damaged header CorruptCheckpoint naming the file.
    """
    fw = _framework(framework)
    with _open(filename, io_options) as r:
        return _load(r, _Reads(r), None, fw, device)


# ---- writing -----------------------------------------------------------------------------


def _host_bytes(name: str, obj: Any) -> tuple[str, tuple[int, ...], Any]:
    """(safetensors dtype, shape, a function returning the C-contiguous host bytes) of one
    tensor: torch tensors on a device are copied to the host only when written."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided:
            raise error(
                USAGE, f"tensor '{name}' has layout {obj.layout}: make it dense first", InvalidType
            )
        st = _st_of_torch(obj, name)

        def get_t() -> Any:
            d = obj.detach()
            if d.device.type != "cpu":
                d = d.cpu()
            d = d.resolve_conj().resolve_neg().contiguous()
            if d.numel() == 0:
                return b""
            return d.reshape(-1).view(torch.uint8).numpy()

        return st, tuple(obj.shape), get_t
    if not isinstance(obj, (np.ndarray, np.generic)):
        if hasattr(obj, "__array__") and hasattr(obj, "dtype") and hasattr(obj, "shape"):
            obj = np.asarray(obj)  # jax arrays and other array-likes
        else:
            raise error(
                USAGE,
                f"tensor '{name}' is a {type(obj).__name__}: save_file takes torch tensors and "
                "numpy (or jax) arrays",
                InvalidType,
            )
    arr = np.asarray(obj)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    st = _st_of_np(arr.dtype, name)

    def get_a() -> Any:
        a = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
        return a.reshape(-1).view(np.uint8) if a.size else b""

    return st, tuple(arr.shape), get_a


def _layout(
    items: list[tuple[str, str, tuple[int, ...], Any]],
) -> list[tuple[str, str, tuple[int, ...], Any, int, int]]:
    """File order and data offsets: tensors whose sizes are multiples of DATA_ALIGNMENT first
    (each then starts aligned, so it can be read in place), then the rest by decreasing
    element size (each still starts on a multiple of its element size)."""

    def nbytes(it: tuple[str, str, tuple[int, ...], Any]) -> int:
        n = itemsize(it[1])
        for d in it[2]:
            n *= d
        return n

    sized = [(it, nbytes(it)) for it in items]
    first = [x for x in sized if x[1] % DATA_ALIGNMENT == 0]
    rest = [x for x in sized if x[1] % DATA_ALIGNMENT != 0]
    rest.sort(key=lambda x: -itemsize(x[0][1]))
    out = []
    at = 0
    for (name, st, shape, get), n in first + rest:
        out.append((name, st, shape, get, at, at + n))
        at += n
    return out


def save_file(
    tensors: Mapping[str, Any],
    filename: PathLike,
    metadata: Mapping[str, str] | None = None,
    *,
    io_options: dict[str, Any] | None = None,
) -> None:
    """``safetensors.torch.save_file``: write ``tensors`` (name -> torch tensor or numpy
    array) as a safetensors file that stock safetensors reads bit for bit.

    The header is padded with spaces so that the data starts on a 4096-byte boundary, and
    tensors whose sizes are multiples of 4096 come first, so each starts aligned; the file is
    written with large O_DIRECT writes, fsynced, and renamed into place: a failed or
    interrupted save leaves any older file at ``filename`` as it was. Unlike stock
    safetensors, tensors sharing memory are each written (stock refuses them) and
    non-contiguous tensors are written contiguous. ``metadata``: str -> str, stored as the
    header's ``__metadata__``. ``io_options``: ckptio's I/O options (backend, direct, fsync).
    """
    if not isinstance(tensors, Mapping):
        raise error(
            USAGE, f"save_file takes a dict of name -> tensor, got {type(tensors).__name__}",
            InvalidType,
        )  # fmt: skip
    meta: list[tuple[str, str]] | None = None
    if metadata is not None:
        meta = []
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise error(
                    USAGE, f"metadata must map str to str; got {k!r}: {type(v).__name__}",
                    InvalidType,
                )  # fmt: skip
            meta.append((k, v))
    items = []
    for name, obj in tensors.items():
        if not isinstance(name, str):
            raise error(USAGE, f"tensor names must be str, got {name!r}", InvalidType)
        if name == "__metadata__":
            raise error(USAGE, "'__metadata__' is reserved in safetensors; pass metadata=")
        st, shape, get = _host_bytes(name, obj)
        items.append((name, st, shape, get))
    laid = _layout(items)
    entries = [(n, st, s, b, e) for n, st, s, _g, b, e in laid]
    header = _core.st_encode(entries, meta, DATA_ALIGNMENT)
    p = params(dict(io_options or {}), overwrite=True)
    path = os.fspath(filename)
    with _core.FileWriter(path, p) as fw:
        fw.write(header)
        for _name, _st, _shape, get, _b, _e in laid:
            data = get()
            if len(data):
                fw.write(data)
            del data
        fw.commit()


# ---- safe_open ---------------------------------------------------------------------------


class _Slice:
    """One tensor of an open file, read in parts: ``sl[rows]``, ``sl[:, 10:20]``."""

    def __init__(self, f: safe_open, e: Entry) -> None:
        self._f = f
        self._e = e

    def get_shape(self) -> list[int]:
        return list(self._e.shape)

    def get_dtype(self) -> str:
        return self._e.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._e.shape

    def __len__(self) -> int:
        if not self._e.shape:
            raise TypeError("len() of a 0-d tensor")
        return self._e.shape[0]

    def __getitem__(self, index: Any) -> Any:
        return self._f._read_slice(self._e, index)


class safe_open:  # noqa: N801 - the name safetensors gives it
    """``safetensors.safe_open``: a safetensors file open for reading, as a context manager.

    ``keys()`` (sorted), ``metadata()``, ``get_tensor(name)``, ``get_tensors()`` (all of them in
    one batched read), and ``get_slice(name)`` whose ``[...]`` reads only the bytes of the
    slice (whole rows of a row-major tensor are one range of the file each). ``framework``:
    "pt"/"torch", "np"/"numpy", or "jax"/"flax"; ``device``: where tensors go.
    """

    def __init__(
        self,
        filename: PathLike,
        framework: str = "pt",
        device: Any = "cpu",
        *,
        io_options: dict[str, Any] | None = None,
        **_ignored: Any,  # stock's backend= (mmap or pread) has no meaning here
    ) -> None:
        self._fw = _framework(framework)
        self._device = device
        self._r: Any = _open(filename, io_options)
        self._reads = _Reads(self._r)
        self._entries = _entries(self._r)

    def _reader(self) -> Any:
        if self._r is None:
            raise error("CKPTIO_E_STATE", "the file is closed")
        return self._r

    def __enter__(self) -> safe_open:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._r is not None:
            self._r.close()
        self._r = None

    def keys(self) -> list[str]:
        self._reader()
        return sorted(self._entries)

    def offset_keys(self) -> list[str]:
        """The names in the order of their data in the file."""
        self._reader()
        return list(self._entries)

    def metadata(self) -> dict[str, str] | None:
        m = self._reader()._r.meta()
        return {k: v.decode() for k, v in m.items()} if m else None

    def get_tensor(self, name: str) -> Any:
        return _load(self._reader(), self._reads, [name], self._fw, self._device)[name]

    def get_tensors(self) -> dict[str, Any]:
        return _load(self._reader(), self._reads, None, self._fw, self._device)

    def get_slice(self, name: str) -> _Slice:
        self._reader()
        e = self._entries.get(name)
        if e is None:
            raise error("CKPTIO_E_NOT_FOUND", f"{self._r.path}: no tensor '{name}' in this file")
        return _Slice(self, e)

    def _read_slice(self, e: Entry, index: Any) -> Any:
        r = self._reader()
        t0 = time.perf_counter()
        # sl[None] adds a dimension, as in numpy and torch; None alone is read()'s "whole".
        region = (None,) if index is None else index
        # The library plans the box's runs (coalescing near ones) and reads only them.
        obj = r.read(e.name, region, framework="numpy" if self._fw == "jax" else self._fw)
        self._reads.record(t0, obj.nbytes if hasattr(obj, "nbytes") else 0)
        return _place(self._fw, obj, self._device)


def _place(fw: str, obj: Any, device: Any) -> Any:
    """``obj`` (read into host memory) on ``device``."""
    if fw == "torch":
        if device is not None and str(device) != "cpu":
            return obj.to(device)
        return obj
    if fw == "jax":
        import jax

        dev = device
        if isinstance(dev, str):
            dev = jax.devices("cpu")[0] if dev == "cpu" else jax.devices(dev)[0]
        return jax.device_put(np.ascontiguousarray(obj), dev)
    return obj
