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

import dataclasses
import os
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from . import _core, _dtypes
from ._errors import DTYPE, USAGE, CheckpointError, InvalidType, error
from ._load import prefaulting
from ._options import Stats, params

__all__ = ["save_file", "load_file", "safe_open", "last_stats", "DATA_ALIGNMENT"]

PathLike = str | os.PathLike[str]

#: Where the data of files written by save_file starts, and how large tensors are laid out.
DATA_ALIGNMENT = 4096

_ALIGN: int = _core.alignment
# Tensors smaller than this are read into memory of their own exact size (a copy through
# staging costs nothing at that size); larger ones into page-aligned buffers, in place.
_SMALL = 64 << 10

# safetensors dtype -> (bytes per element, torch dtype name, numpy dtype name; "ml_dtypes:"
# names need the ml_dtypes package). F4 and F6_* pack elements below a byte: not loadable.
DTYPES: dict[str, tuple[int, str, str]] = {
    "BOOL": (1, "bool", "bool"),
    "U8": (1, "uint8", "uint8"),
    "I8": (1, "int8", "int8"),
    "F8_E5M2": (1, "float8_e5m2", "ml_dtypes:float8_e5m2"),
    "F8_E4M3": (1, "float8_e4m3fn", "ml_dtypes:float8_e4m3fn"),
    "F8_E8M0": (1, "float8_e8m0fnu", "ml_dtypes:float8_e8m0fnu"),
    "F8_E4M3FNUZ": (1, "float8_e4m3fnuz", "ml_dtypes:float8_e4m3fnuz"),
    "F8_E5M2FNUZ": (1, "float8_e5m2fnuz", "ml_dtypes:float8_e5m2fnuz"),
    "I16": (2, "int16", "int16"),
    "U16": (2, "uint16", "uint16"),
    "F16": (2, "float16", "float16"),
    "BF16": (2, "bfloat16", "ml_dtypes:bfloat16"),
    "I32": (4, "int32", "int32"),
    "U32": (4, "uint32", "uint32"),
    "F32": (4, "float32", "float32"),
    "C64": (8, "complex64", "complex64"),
    "F64": (8, "float64", "float64"),
    "I64": (8, "int64", "int64"),
    "U64": (8, "uint64", "uint64"),
}

_FRAMEWORKS = {"pt": "pt", "torch": "pt", "np": "np", "numpy": "np", "jax": "jax", "flax": "jax"}


def _round_up(n: int, a: int = _ALIGN) -> int:
    return (n + a - 1) // a * a


# ---- dtypes ------------------------------------------------------------------------------


def torch_dtype(st: str, name: str, path: str) -> Any:
    """The torch dtype of safetensors dtype ``st`` (tensor ``name`` of ``path``)."""
    import torch

    dt = getattr(torch, DTYPES[st][1], None) if st in DTYPES else None
    if not isinstance(dt, torch.dtype):
        raise error(
            DTYPE, f"{path}: tensor '{name}' has safetensors dtype {st}, which ckptio cannot load "
            "as a torch tensor",
        )  # fmt: skip
    return dt


def np_dtype(st: str, name: str, path: str) -> np.dtype[Any]:
    """The numpy dtype of safetensors dtype ``st`` (bf16 and float8 through ml_dtypes)."""
    spec = DTYPES.get(st)
    if spec is not None:
        npname = spec[2]
        if not npname.startswith("ml_dtypes:"):
            return np.dtype(npname)
        try:
            import ml_dtypes

            found = getattr(ml_dtypes, npname[10:], None)
        except ImportError:  # pragma: no cover - ml_dtypes comes with our requirements
            found = None
        if found is not None:
            return np.dtype(found)
    raise error(
        DTYPE, f"{path}: tensor '{name}' has safetensors dtype {st}, which ckptio cannot load as "
        "a numpy array" + (" (install ml_dtypes)" if spec is not None else ""),
    )  # fmt: skip


def _st_of_torch(t: Any, name: str) -> str:
    want = str(t.dtype).removeprefix("torch.")
    for st, (_size, tname, _np) in DTYPES.items():
        if tname == want:
            return st
    raise error(DTYPE, f"tensor '{name}': torch.{want} has no safetensors dtype")


def _st_of_np(dt: np.dtype[Any], name: str) -> str:
    global _NP_ST
    if _NP_ST is None:
        table = {}
        for st in DTYPES:
            try:
                table[np_dtype(st, "", "")] = st
            except CheckpointError:  # pragma: no cover - without ml_dtypes
                pass
        _NP_ST = table
    found = _NP_ST.get(dt)
    if found is None:
        raise error(DTYPE, f"tensor '{name}': numpy dtype {dt} has no safetensors dtype")
    return found


_NP_ST: dict[np.dtype[Any], str] | None = None


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


# ---- reading -----------------------------------------------------------------------------


class _File:
    """One safetensors file open in the library's reader (``_core.open_foreign``): its
    tensors as Entry objects, read as regions, with the stats of each read apart."""

    __slots__ = ("path", "r", "entries", "index", "_last")

    def __init__(self, path: PathLike, p: dict[str, int]) -> None:
        self.path = os.fspath(path)
        try:
            self.r = _core.open_foreign(self.path, p)
        except CheckpointError as e:
            raise _with_path(e, self.path) if self.path not in str(e) else e from None
        recs = self.r.tensors()
        sts = self.r.st_dtypes()
        found = []
        for i, (t, st) in enumerate(zip(recs, sts)):
            c = self.r.chunks(i)[0]
            shape = tuple(t.shape)
            if t.dtype == _dtypes.BYTES:  # served as bytes: the safetensors shape is known
                shape = shape[:-1] if st in DTYPES else _st_shape(self.path, t.name)
            code = 0 if t.dtype == _dtypes.BYTES else t.dtype
            e = Entry(t.name, st, code, shape, c.file_offset, t.nbytes)
            found.append((c.file_offset, i, e))
        found.sort(key=lambda x: (x[0], x[1]))
        self.entries = {e.name: e for _off, _i, e in found}  # in file order
        self.index = {e.name: i for _off, i, e in found}
        self._last: tuple[int, int, int, float] = (0, 0, 0, 0.0)

    def entry(self, name: str) -> Entry:
        e = self.entries.get(name)
        if e is None:
            raise error("CKPTIO_E_NOT_FOUND", f"{self.path}: no tensor '{name}' in this file")
        return e

    def read(self, regions: list[Any], fresh: list[Any], fresh_bytes: int) -> Any:
        """Read the regions; the IOStats of this read alone."""
        prefaulting(fresh, fresh_bytes, self.r.read, regions)
        t = self.r.stats()
        b, io, n, sec = self._last
        self._last = (t.bytes, t.io_bytes, t.tensors, t.seconds)
        b, io, n, sec = t.bytes - b, t.io_bytes - io, t.tensors - n, t.seconds - sec
        gbps = b / sec / 1e9 if sec > 0 else 0.0
        return _core.IOStats((b, io, n, sec, gbps, t.backend, t.direct, t.alignment))

    def close(self) -> None:
        self.r.close()


def _st_shape(path: str, name: str) -> tuple[int, ...]:
    """The shape of a sub-byte tensor (F4, F6_*), which only the header says."""
    return read_header(path).entry(name).shape


def _whole(f: _File, e: Entry, regions: list[Any], fresh: list[Any]) -> tuple[Any, int]:
    """Memory for all of tensor ``e`` and its region: (buffer, offset of its first byte). A
    small tensor gets exact memory of its own (as stock safetensors gives each tensor its own
    storage: a slab shared with others would go whole into a torch.save of one of them); a big
    one the block the reader places it in (ckptio_reader_place: page-aligned, placed in its
    page as the tensor is in its file's, with room before it, so the read lands in place)."""
    n = e.nbytes
    i = f.index[e.name]
    if n == 0:
        return None, 0
    if n < _SMALL:
        small = np.empty(n, np.uint8)
        regions.append(_core.read_region(i, None, None, small, 0, n))
        return small, 0
    ((buf, at, cap, lead),) = f.r.place([(i, None, None)])
    fresh.append(buf)
    regions.append(_core.read_region(i, None, None, buf, at, cap, lead))
    return buf, at


def _tensor(fw: str, buf: Any, at: int, e: Entry, shape: tuple[int, ...], device: Any) -> Any:
    """The framework object of ``shape`` over ``buf`` at ``at`` (None: an empty tensor)."""
    count = 1
    for d in shape:
        count *= d
    if fw == "pt":
        import torch

        dt = torch_dtype(e.dtype, e.name, "")
        if buf is None or count == 0:
            t = torch.empty(shape, dtype=dt)
        else:
            t = torch.frombuffer(buf, dtype=dt, count=count, offset=at).reshape(shape)
        if device is not None and str(device) != "cpu":
            t = t.to(device)
        return t
    npdt = np_dtype(e.dtype, e.name, "")
    a = np.empty(shape, npdt) if buf is None else np.ndarray(shape, npdt, buf, at)
    if fw == "jax":
        import jax

        dev = device
        if isinstance(dev, str):
            dev = jax.devices(dev)[0] if dev != "cpu" else jax.devices("cpu")[0]
        return jax.device_put(a, dev)
    return a


def _check_dtype(fw: str, e: Entry, path: str) -> None:
    """Refuse, naming the tensor and file, a dtype the framework cannot hold, before reading."""
    if fw == "pt":
        torch_dtype(e.dtype, e.name, path)
    else:
        np_dtype(e.dtype, e.name, path)


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


def _record(st: Any, t0: float, nbytes: int | None = None) -> None:
    """Keep the stats of a read; ``nbytes``: the tensor bytes it delivered, where its ranges
    also covered the page edges around them (``io_bytes`` keeps what was moved)."""
    global _last
    if st is not None:
        s = Stats._from_core(st, time.perf_counter() - t0)
        if nbytes is not None:
            gbps = nbytes / s.seconds / 1e9 if s.seconds else 0.0
            s = dataclasses.replace(s, bytes=nbytes, gbps=gbps)
        _last = s


def _load(
    f: _File, names: Iterable[str], fw: str, device: Any, p: dict[str, int]
) -> dict[str, Any]:
    t0 = time.perf_counter()
    wanted = [f.entry(n) for n in names]
    for e in wanted:
        _check_dtype(fw, e, f.path)
    regions: list[Any] = []
    fresh: list[Any] = []
    placed = [_whole(f, e, regions, fresh) for e in wanted]
    if regions:
        try:
            st = f.read(regions, fresh, sum(len(b) for b in fresh))
        except CheckpointError as ex:
            raise _with_path(ex, f.path) if f.path not in str(ex) else ex from None
        _record(st, t0, sum(e.nbytes for e in wanted))
    return {e.name: _tensor(fw, b, at, e, e.shape, device) for e, (b, at) in zip(wanted, placed)}


def load_file(
    filename: PathLike,
    device: Any = "cpu",
    *,
    framework: str = "pt",
    io_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``safetensors.torch.load_file``: every tensor of ``filename``, by name.

    All tensors are read in one batched read, each into its own page-aligned memory (freed with
    its tensor). ``device``: where torch tensors go ("cpu", "cuda:0"; through host memory), or
    a jax device for ``framework="jax"``. ``framework``: "pt" (torch, the default), "np"
    (numpy; bf16 and float8 as ml_dtypes) or "jax". ``io_options``: ckptio's I/O options
    (backend, direct, ...). A dtype the framework cannot hold raises UnsupportedDtype naming
    the tensor; a damaged header CorruptCheckpoint naming the file.
    """
    fw = _framework(framework)
    p = params(io_options or {})
    f = _File(filename, p)
    try:
        return _load(f, list(f.entries), fw, device, p)
    finally:
        f.close()


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
        n = DTYPES[it[1]][0]
        for d in it[2]:
            n *= d
        return n

    sized = [(it, nbytes(it)) for it in items]
    first = [x for x in sized if x[1] % DATA_ALIGNMENT == 0]
    rest = [x for x in sized if x[1] % DATA_ALIGNMENT != 0]
    rest.sort(key=lambda x: -DTYPES[x[0][1]][0])
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
        self._p = params(io_options or {})
        self._f: _File | None = _File(filename, self._p)

    def _file(self) -> _File:
        if self._f is None:
            raise error("CKPTIO_E_STATE", "the file is closed")
        return self._f

    def __enter__(self) -> safe_open:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
        self._f = None

    def keys(self) -> list[str]:
        return sorted(self._file().entries)

    def offset_keys(self) -> list[str]:
        """The names in the order of their data in the file."""
        return list(self._file().entries)

    def metadata(self) -> dict[str, str] | None:
        m = self._file().r.meta()
        return {k: v.decode() for k, v in m.items()} if m else None

    def get_tensor(self, name: str) -> Any:
        return _load(self._file(), [name], self._fw, self._device, self._p)[name]

    def get_tensors(self) -> dict[str, Any]:
        f = self._file()
        return _load(f, list(f.entries), self._fw, self._device, self._p)

    def get_slice(self, name: str) -> _Slice:
        return _Slice(self, self._file().entry(name))

    def _read_slice(self, e: Entry, index: Any) -> Any:
        from ._load import _region_box

        f = self._file()
        _check_dtype(self._fw, e, f.path)
        t0 = time.perf_counter()
        # sl[None] adds a dimension, as in numpy and torch; None alone is read()'s "whole".
        off, size, inner = _region_box((None,) if index is None else index, e.shape, e.name)
        for o, s, d in zip(off, size, e.shape):
            if o + s > d:
                raise error(
                    "CKPTIO_E_RANGE",
                    f"{f.path}: tensor '{e.name}': index {o} is out of bounds for a dimension "
                    f"of {d}",
                )
        item = DTYPES[e.dtype][0]
        n = item
        for d in size:
            n *= d
        buf: Any = None
        if n:
            # The library plans the box's runs (coalescing near ones) and reads only them.
            buf = np.empty(n, np.uint8) if n < _SMALL else _core.Buffer(_round_up(n))
            cap = n if n < _SMALL else len(buf)
            raw = (0,) if e.code == 0 else ()  # served as bytes with a trailing 1 (F8_E8M0)
            reg = _core.read_region(f.index[e.name], off + raw, size + (1,) * len(raw), buf, 0, cap)
            fresh = [buf] if n >= _SMALL else []
            _record(f.read([reg], fresh, n if fresh else 0), t0)
        obj = _tensor(self._fw if self._fw != "jax" else "np", buf, 0, e, size, None)
        if inner:
            obj = obj[inner]
        return _place(self._fw, obj, self._device)


def _place(fw: str, obj: Any, device: Any) -> Any:
    if fw == "pt":
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
