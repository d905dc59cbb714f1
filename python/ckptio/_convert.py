# SPDX-License-Identifier: Apache-2.0
"""`ckptio convert` for torch files and DCP directories: `python -m ckptio._convert`.

The conversion itself (detection, streaming through a bounded buffer, atomic publish, progress)
is the library's convert engine (`ckptio_convert`, reached through `_core.convert`); the
`ckptio` command runs it directly for ckptio, safetensors and Hugging Face, and hands over here
when a side is a torch file or a torch.distributed.checkpoint (DCP) directory, which only torch
can parse. This module adds just that, as a source or a sink of the engine: a torch source is
opened with torch.load(mmap=True, weights_only=True) only to learn its structure and where each
storage lies in the file, then read with pread; a DCP source is read with pread from the
records of its items (dcp.load for layouts that are not runs of rows); a torch sink writes a
zip archive record after record, in the layout torch.load reads; a DCP sink is written by
FileSystemWriter. Any pair works, safetensors <-> torch too, in one pass.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import io
import json
import mmap
import os
import pickle
import re
import sys
import time
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from . import _core
from . import _dtypes as D
from ._errors import CheckpointError
from ._options import params, store
from ._stage import is_url
from .frameworks._registry import BY_NAME
from ._tree import TREE_KEY, flatten, make_document, parse_document, unflatten

FORMATS = ("ckptio", "safetensors", "hf", "torch", "dcp")
# Bytes of tensor data in flight at once: the engine's buffer, and the bound on what a DCP
# source loads at once through dcp.load (beyond one larger tensor).
PIECE_BYTES = max(4096, int(os.environ.get("CKPTIO_CONVERT_BUFFER", 32 << 20)) // 4096 * 4096)


class ConvertError(Exception):
    """A conversion that cannot be done; the message says why and what to do."""


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise ConvertError(
            "converting torch files and DCP directories needs PyTorch in this Python "
            f"({sys.executable}): pip install torch"
        ) from e
    return torch


@functools.cache
def _codes() -> dict[Any, int]:
    """torch dtype -> ckptio dtype code (every ckptio dtype but opaque bytes)."""
    torch = _torch()
    return {
        torch.bool: D.BOOL, torch.uint8: D.U8, torch.int8: D.I8, torch.uint16: D.U16,
        torch.int16: D.I16, torch.uint32: D.U32, torch.int32: D.I32, torch.uint64: D.U64,
        torch.int64: D.I64, torch.float16: D.F16, torch.bfloat16: D.BF16, torch.float32: D.F32,
        torch.float64: D.F64, torch.complex64: D.C64, torch.complex128: D.C128,
        torch.float8_e4m3fn: D.F8_E4M3FN, torch.float8_e5m2: D.F8_E5M2,
    }  # fmt: skip


def _torch_dtype(code: int, name: str) -> Any:
    for dt, c in _codes().items():
        if c == code:
            return dt
    raise ConvertError(f"tensor '{name}' has ckptio dtype code {code}, which torch has no dtype for")


def _code(dtype: Any, name: str) -> int:
    code = _codes().get(dtype)
    if code is None:
        raise ConvertError(f"tensor '{name}' has dtype {dtype}, which ckptio cannot store")
    return code


class Spec:
    """One tensor to copy: its name (key path), torch dtype, shape, and how to read it."""

    __slots__ = ("name", "dtype", "shape", "nbytes", "src")

    def __init__(self, name: str, dtype: Any, shape: tuple[int, ...], src: Any) -> None:
        self.name, self.dtype, self.shape, self.src = name, dtype, tuple(shape), src
        self.nbytes = dtype.itemsize * int(np.prod(self.shape, dtype=np.int64))


# ---- sources: what the engine reads through `read(index, offset, out)` -------------------------


class Source:
    """A tree whose tensor leaves are meta tensors standing for the source's tensors (specs,
    by id), read a contiguous byte range at a time."""

    path: str
    tree: Any
    specs: list[Spec]
    by_id: dict[int, Spec]
    names: dict[str, Spec]
    doc: Callable[[], bytes]  # the tree as ckptio's "ckptio.tree" metadata
    meta: dict[str, bytes]  # other metadata to carry over

    def read(self, spec: Spec, first: int, out: memoryview) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _Feed:
    """A Source as the engine sees one: its tensors (name, ckptio dtype, shape) in key-path
    order, its metadata (the tree document first), and bytes of tensor `index` on request."""

    def __init__(self, src: Source) -> None:
        self.src = src
        self.tensors = [(s.name, _code(s.dtype, s.name), s.shape) for s in src.specs]
        self.metadata = {TREE_KEY: src.doc(), **src.meta}

    def read(self, index: int, offset: int, out: memoryview) -> None:
        self.src.read(self.src.specs[index], offset, out)


def _pread_into(fd: int, out: memoryview, at: int, name: str) -> None:
    done = 0
    while done < len(out):
        n = os.preadv(fd, [out[done:]], at + done)
        if n <= 0:
            raise ConvertError(f"tensor '{name}': the file ends before its bytes do")
        done += n


def _index(tree: Any) -> tuple[list[Spec], dict[int, Spec], dict[str, Spec], Callable[[], bytes]]:  # fmt: skip
    """The tensors of a tree of meta tensors, in key-path order of the tree: one spec per
    tensor object, by id and by every key path that holds it (a tensor tied to an earlier one
    becomes an alias node naming it, as ckptio.save stores it), and the tree document."""
    torch = _torch()

    ad = BY_NAME["torch"]
    root, leaves = flatten(tree, classify=lambda o: ad if isinstance(o, torch.Tensor) else None)
    specs, by_id, names = [], {}, {}
    for name, t, node in leaves:
        node["dtype"] = str(t.dtype).removeprefix("torch.")
        if isinstance(t, torch.nn.Parameter):
            node["param"] = True
        spec = by_id.get(id(t))
        if spec is not None:
            node["alias"], node["same"] = spec.name, True
        else:
            spec = by_id[id(t)] = Spec(name, t.dtype, tuple(t.shape), t)
            specs.append(spec)
        names[name] = spec
    doc = make_document(root)
    return specs, by_id, names, lambda: json.dumps(doc, separators=(",", ":")).encode()


class TorchSource(Source):
    """torch.load(mmap=True, weights_only=True): the weights-only unpickler refuses any pickle
    that would import or call something outside torch's allowlist (os.system...), before it
    runs. Each storage's place in the file comes from the mapping's addresses, and its bytes
    are read with pread."""

    def __init__(self, path: str) -> None:
        torch = _torch()
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        records: dict[int, int] | None = {}
        try:
            with zipfile.ZipFile(path) as z:
                for zi in z.infolist():
                    parts = zi.filename.split("/")
                    if len(parts) == 3 and parts[1] == "data" and zi.file_size:
                        if zi.compress_type != zipfile.ZIP_STORED:
                            raise ConvertError(f"{path}: record {zi.filename} is compressed")
                        h = os.pread(self.fd, 30, zi.header_offset)
                        start = zi.header_offset + 30 + int.from_bytes(h[26:28], "little") + int.from_bytes(h[28:30], "little")  # fmt: skip
                        records[start] = zi.file_size
        except zipfile.BadZipFile:
            records = None  # the legacy format (torch < 1.6): read into memory whole
        obj = None
        if records is not None:
            try:
                obj = self._load(path, True)
            except RuntimeError:
                records = None  # records not aligned for a mapping (old writers)
        if obj is None:
            try:
                obj = self._load(path, False)
            except RuntimeError as e:
                raise ConvertError(f"{path}: torch cannot read it: {e}") from None
        tensors: list[Any] = []
        self._collect(obj, tensors)
        # The mapping covers the file from offset 0: base = lowest storage address minus the
        # lowest record offset, as the records lie in the mapping in file order. Every storage
        # must then land on a record's start, else its bytes are read through the tensor.
        ptrs = [t.untyped_storage().data_ptr() for t in tensors if t.untyped_storage().nbytes()]
        self.base: int | None = None
        if records and ptrs:
            base = min(ptrs) - min(records)
            if all(p - base in records for p in ptrs):
                self.base = base
        metas: dict[int, Any] = {}
        self.real: dict[int, Any] = {}
        self.tree = self._replace(obj, metas)
        self.specs, self.by_id, self.names, self.doc = _index(self.tree)
        self.meta: dict[str, bytes] = {}

    @staticmethod
    def _load(path: str, mmap: bool) -> Any:
        torch = _torch()
        try:
            return torch.load(path, mmap=mmap, weights_only=True, map_location="cpu")
        except pickle.UnpicklingError as e:
            raise ConvertError(
                f"{path}: refused: its pickle is not plain weights ({str(e).splitlines()[0]}); "
                "it was not run. Load it with torch.load(weights_only=False) only if you trust "
                "it, and save its state dict again"
            ) from None

    def _collect(self, obj: Any, out: list[Any]) -> None:
        torch = _torch()
        if isinstance(obj, torch.Tensor):
            out.append(obj)
        elif isinstance(obj, dict):
            for v in obj.values():
                self._collect(v, out)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                self._collect(v, out)

    def _replace(self, obj: Any, metas: dict[int, Any]) -> Any:
        """The tree with each tensor replaced by a meta tensor of its dtype and shape."""
        torch = _torch()
        if isinstance(obj, torch.Tensor):
            if id(obj) in metas:  # one object twice in the tree: tied
                return metas[id(obj)]
            m = torch.empty(obj.shape, dtype=obj.dtype, device="meta")
            if isinstance(obj, torch.nn.Parameter):
                m = torch.nn.Parameter(m, requires_grad=obj.requires_grad)
            self.real[id(m)] = obj
            metas[id(obj)] = m
            return m
        if isinstance(obj, dict):
            d = type(obj)() if type(obj) in (dict, OrderedDict) else dict()
            for k, v in obj.items():
                d[k] = self._replace(v, metas)
            if hasattr(obj, "_metadata"):
                d._metadata = obj._metadata  # type: ignore[attr-defined]
            return d
        if isinstance(obj, list):
            return [self._replace(v, metas) for v in obj]
        if isinstance(obj, tuple):
            return tuple(self._replace(v, metas) for v in obj)
        return obj

    def read(self, spec: Spec, first: int, out: memoryview) -> None:
        t = self.real[id(spec.src)]
        if not len(out):
            return
        if self.base is not None and t.is_contiguous():
            at = t.untyped_storage().data_ptr() - self.base + t.storage_offset() * t.element_size() + first  # fmt: skip
            _pread_into(self.fd, out, at, spec.name)
        else:
            # A strided view (rare in saved state) or a file read whole: through the tensor.
            torch = _torch()
            flat = t.contiguous().view(-1).view(torch.uint8).numpy()
            out[:] = memoryview(flat)[first : first + len(out)]

    def close(self) -> None:
        os.close(self.fd)


class _Slice(io.RawIOBase):
    """A byte range of an open file as a read-only seekable file (one .distcp item)."""

    def __init__(self, fd: int, start: int, length: int) -> None:
        super().__init__()
        self.fd, self.start, self.length, self.pos = fd, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = 0) -> int:
        base = (0, self.pos, self.length)[whence]
        self.pos = max(0, base + pos)
        return self.pos

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), self.length - self.pos))
        got = os.preadv(self.fd, [memoryview(b).cast("B")[:n]], self.start + self.pos) if n else 0
        self.pos += got
        return got


class DcpSource(Source):
    """A tensor stored whole in one item (what a single process saves) is streamed with pread
    from its record inside the item's torch.save archive, found with torch.load(map_location=
    "meta", weights_only=True), which reads no tensor bytes. Other tensors (chunks of several
    ranks, transformed items) are loaded a group of keys at a time (about PIECE_BYTES, or one
    larger tensor) into preallocated tensors with dcp.load. Plain values (torch.save bytes) are
    read weights-only."""

    def __init__(self, path: str) -> None:
        torch = _torch()
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

        self.path = path
        self.reader = FileSystemReader(path)
        md = self.reader.read_metadata()
        self.fds: dict[str, int] = {}
        self.direct: dict[str, list[tuple[int, int, int, int]]] = {}
        infos: dict[str, list[tuple[Any, Any]]] = {}
        for idx, info in md.storage_data.items():
            infos.setdefault(idx.fqn, []).append((idx, info))
        flat: dict[str, Any] = {}
        for key, m in md.state_dict_metadata.items():
            if isinstance(m, TensorStorageMetadata):
                flat[key] = t = torch.empty(tuple(m.size), dtype=m.properties.dtype, device="meta")
                segs = self._segments(key, m, infos, t)
                if segs is not None:
                    self.direct[key] = segs
            elif isinstance(m, BytesStorageMetadata):
                if len(infos.get(key, ())) != 1:
                    raise ConvertError(f"{path}: no stored bytes for '{key}' in .metadata")
                flat[key] = self._load_bytes(key, infos[key][0][1])
        self.tree = flat
        self.specs, self.by_id, self.names, self.doc = _index(self.tree)
        self.meta: dict[str, bytes] = {}
        self.loaded: dict[str, Any] = {}

    def _fd(self, rel: str) -> int:
        fd = self.fds.get(rel)
        if fd is None:
            full = os.path.join(self.path, rel)
            if os.path.dirname(os.path.normpath(rel)):
                raise ConvertError(f"{self.path}: .metadata names a file outside it: {rel}")
            fd = self.fds[rel] = os.open(full, os.O_RDONLY | os.O_CLOEXEC)
        return fd

    def _segments(self, key: str, m: Any, infos: dict[str, list[tuple[Any, Any]]], t: Any) -> list[tuple[int, int, int, int]] | None:  # fmt: skip
        """(first byte in the tensor, bytes, fd, file offset) of each chunk of `key`, when every
        chunk is a run of rows (contiguous in the tensor's row-major order: one tensor saved
        whole, or split along its first dimensions) stored as a plain record; else None."""
        torch = _torch()
        shape, es = tuple(m.size), t.element_size()
        by_off = {tuple(idx.offset): info for idx, info in infos.get(key, ()) if idx.offset is not None}  # fmt: skip
        segs = []
        for ch in m.chunks:
            off, box = tuple(ch.offsets), tuple(ch.sizes)
            diff = [d for d in range(len(shape)) if box[d] != shape[d]]
            if diff and (any(box[d] != 1 for d in range(diff[-1])) or any(off[diff[-1] + 1 :])):
                return None
            first = 0
            for d in range(len(shape)):
                first = first * shape[d] + off[d]
            n = es * int(np.prod(box, dtype=np.int64))
            info = by_off.get(off)
            if info is None:
                return None
            like = torch.empty(box, dtype=t.dtype, device="meta")
            where = self._locate(key, info, like)
            if where is None:
                return None
            segs.append((first * es, n, where[0], where[1]))
        segs.sort()
        at = 0
        for first, n, _, _ in segs:
            if first != at:
                return None
            at += n
        return segs if at == es * t.numel() else None

    def _locate(self, key: str, info: Any, like: Any) -> tuple[int, int] | None:
        """(fd, file offset) of the bytes of the whole tensor `key`, or None when its item is
        not a plain torch.save archive of one contiguous tensor."""
        torch = _torch()
        if getattr(info, "transform_descriptors", None):
            return None
        fd = self._fd(info.relative_path)
        sl = _Slice(fd, info.offset, info.length)
        try:
            t = torch.load(sl, map_location="meta", weights_only=True)
        except pickle.UnpicklingError as e:
            raise ConvertError(
                f"{self.path}: item '{key}' is a pickle that is not plain weights "
                f"({str(e).splitlines()[0]}); it was not run"
            ) from None
        except Exception:
            return None
        if not isinstance(t, torch.Tensor) or t.dtype != like.dtype or t.shape != like.shape:
            return None
        if not t.is_contiguous() or t.storage_offset() != 0:
            return None
        sl.seek(0)
        try:
            with zipfile.ZipFile(sl) as z:
                recs = [zi for zi in z.infolist() if zi.filename.split("/")[1:2] == ["data"]]
        except zipfile.BadZipFile:
            return None
        if len(recs) != 1 or recs[0].compress_type != zipfile.ZIP_STORED:
            return None
        zi = recs[0]
        if zi.file_size < like.element_size() * like.numel():
            return None
        h = os.pread(fd, 30, info.offset + zi.header_offset)
        start = zi.header_offset + 30 + int.from_bytes(h[26:28], "little") + int.from_bytes(h[28:30], "little")  # fmt: skip
        return fd, info.offset + start

    def _load_bytes(self, key: str, info: Any) -> Any:
        torch = _torch()
        data = os.pread(self._fd(info.relative_path), info.length, info.offset)
        try:
            return torch.load(io.BytesIO(data), weights_only=True)
        except pickle.UnpicklingError as e:
            raise ConvertError(
                f"{self.path}: value '{key}' is a pickle that is not plain data "
                f"({str(e).splitlines()[0]}); it was not run"
            ) from None

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)

    def read(self, spec: Spec, first: int, out: memoryview) -> None:
        if not len(out):
            return
        segs = self.direct.get(spec.name)
        if segs is not None:
            end = first + len(out)
            for sfirst, n, fd, at in segs:
                lo, hi = max(first, sfirst), min(end, sfirst + n)
                if lo < hi:
                    _pread_into(fd, out[lo - first : hi - first], at + lo - sfirst, spec.name)
            return
        t = self.loaded.get(spec.name)
        if t is None:
            self._load_group(spec)
            t = self.loaded[spec.name]
        torch = _torch()
        flat = memoryview(t.view(-1).view(torch.uint8).numpy())
        out[:] = flat[first : first + len(out)]
        if first + len(out) == spec.nbytes:
            del self.loaded[spec.name]

    def _load_group(self, spec: Spec) -> None:
        torch = _torch()
        import torch.distributed.checkpoint as dcp

        self.loaded.clear()
        i = self.specs.index(spec)
        group: dict[str, Any] = {}
        size = 0
        for s in self.specs[i:]:
            if group and size + s.nbytes > PIECE_BYTES:
                break
            group[s.name] = torch.empty(s.shape, dtype=s.dtype)
            size += s.nbytes
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*single process")
            dcp.load(group, storage_reader=self.reader, no_dist=True)  # type: ignore[call-arg]
        self.loaded.update(group)


# ---- sinks: what the engine writes through begin / write / end / abort ------------------------


def _sink_tree(tensors: list[tuple[str, int, tuple[int, ...]]], meta: dict[str, bytes]) -> tuple[Any, list[Any]]:  # fmt: skip
    """The tree a sink writes: the source's "ckptio.tree" document where it has one (its
    non-tensor leaves, ties and nesting), else a flat dict by name; each tensor leaf a meta
    tensor, the engine's tensor i being metas[i]."""
    torch = _torch()
    metas: OrderedDict[str, Any] = OrderedDict()
    for name, code, shape in tensors:
        metas[name] = torch.empty(shape, dtype=_torch_dtype(code, name), device="meta")
    doc = meta.get(TREE_KEY)
    if doc is None:
        return metas, list(metas.values())
    root = parse_document(json.loads(doc))
    return unflatten(root, lambda path, node: metas[node.get("alias", path or ".")]), list(metas.values())  # fmt: skip


def _nbytes(t: Any) -> int:
    return int(t.element_size()) * int(t.numel())


class _StorageRef:
    __slots__ = ("key", "dtype", "numel")

    def __init__(self, key: int, dtype: Any, numel: int) -> None:
        self.key, self.dtype, self.numel = key, dtype, numel


@functools.cache
def _storage_type(dtype: Any) -> Any:
    """The storage class torch.save names for a dtype's storages (torch.BFloat16Storage)."""
    torch = _torch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated, yet what data.pkl names
        return getattr(torch, torch.storage.TypedStorage(dtype=dtype, device="cpu")._pickle_storage_type())  # fmt: skip


def _data_pkl(tree: Any, index: dict[int, int]) -> bytes:
    """data.pkl of the tree, each tensor rebuilt (torch._utils._rebuild_tensor_v2) from storage
    data/<i>, i being its index among the engine's tensors (`index`, by id)."""
    torch = _torch()
    new_dtypes = torch.storage._new_dtypes()

    class P(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            if type(obj) is _StorageRef:
                if obj.dtype in new_dtypes:  # counted in bytes, as torch.save does
                    return ("storage", torch.UntypedStorage, str(obj.key), "cpu", obj.numel * obj.dtype.itemsize)  # fmt: skip
                return ("storage", _storage_type(obj.dtype), str(obj.key), "cpu", obj.numel)
            return None

        def reducer_override(self, obj: Any) -> Any:
            key = index.get(id(obj)) if isinstance(obj, torch.Tensor) else None
            if key is None:
                return NotImplemented
            stride = tuple(int(x) for x in torch.empty(obj.shape, device="meta").stride())
            ref = _StorageRef(key, obj.dtype, int(obj.numel()))
            args: tuple[Any, ...] = (ref, 0, torch.Size(obj.shape), stride, False, OrderedDict())
            if obj.dtype in new_dtypes:  # dtypes without a storage class of their own
                t = (torch._utils._rebuild_tensor_v3, (*args, obj.dtype))
            else:
                t = (torch._utils._rebuild_tensor_v2, args)
            if isinstance(obj, torch.nn.Parameter):
                return (torch._utils._rebuild_parameter, (_Rebuilt(t), obj.requires_grad, OrderedDict()))  # fmt: skip
            return t

    f = io.BytesIO()
    P(f, protocol=2).dump(tree)
    return f.getvalue()


class _Rebuilt:
    """Pickles as the call `fn(*args)` (a nested reduce inside _rebuild_parameter's args)."""

    def __init__(self, t: tuple[Any, Any]) -> None:
        self.t = t

    def __reduce__(self) -> Any:
        return self.t


class TorchSink:
    """A torch.save zip archive written into the engine's temporary file by ckptio's zip writer:
    the records ckptio.torch.save writes, in its order (formats/_torch_zip.records), with data.pkl
    made here from the tree (its tensors are not in memory: torch's own pickling needs them),
    each storage record streamed as its bytes arrive, at a multiple of 64 (torch.load(mmap=True)
    needs it), CRCs computed in C."""

    is_dir = False

    def __init__(self, dst: str) -> None:
        self.archive = os.path.splitext(os.path.basename(dst))[0] or "archive"
        self.zw: Any = None

    def begin(self, tensors: list[tuple[str, int, tuple[int, ...]]], meta: dict[str, bytes], tmp: str) -> None:  # fmt: skip
        from .formats._torch_zip import records

        tree, metas = _sink_tree(tensors, meta)
        self.sizes = [_nbytes(m) for m in metas]
        pkl = _data_pkl(tree, {id(m): i for i, m in enumerate(metas)})
        recs = records(pkl, {str(i): i for i in range(len(metas))}, False)
        last = [name for name, _ in recs].index("version")  # the storages end there
        head, self.tail = recs[: last - len(metas)], recs[last:]
        self.zw = _core.ZipWriter(tmp, {"staging_bytes": 16 << 20})
        for name, data in head:
            self.zw.add(f"{self.archive}/{name}", data)

    def write(self, index: int, offset: int, data: memoryview) -> None:
        if offset == 0:
            self.zw.begin(f"{self.archive}/data/{index}", self.sizes[index])
        if len(data):  # an empty tensor's record ends at its begin
            self.zw.append(data)

    def end(self) -> None:
        for name, data in self.tail:
            self.zw.add(f"{self.archive}/{name}", data)
        self.zw.commit()
        self.zw.close()

    def abort(self) -> None:
        if self.zw is not None:
            self.zw.close()  # uncommitted: its file goes


def _box(shape: tuple[int, ...], itemsize: int, first: int, n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:  # fmt: skip
    """(offset, shape) of the box that bytes [first, first + n) of a row-major tensor cover: the
    engine cuts a large tensor into runs of rows of its largest trailing block that fits."""
    for k in range(len(shape)):
        row = itemsize * int(np.prod(shape[k + 1 :], dtype=np.int64))
        if row == 0 or first % row or n % row:
            continue
        idx, count = first // row, n // row
        off = [0] * len(shape)
        for d in range(k, -1, -1):
            off[d] = idx % shape[d]
            idx //= shape[d]
        if off[k] + count <= shape[k]:
            return tuple(off), (1,) * k + (count,) + tuple(shape[k + 1 :])
    return (0,) * len(shape), tuple(shape)


class DcpSink:
    """A DCP directory written by FileSystemWriter into the engine's temporary directory.

    FileSystemWriter pulls: it asks for each item when it writes it, in an order of its own
    (largest first), while the engine pushes tensors in its order. So the bytes first go, as
    they arrive, into a spill file inside the temporary directory, and FileSystemWriter then
    reads each item from there, one at a time (each into an anonymous mapping whose pages are
    dropped once it asks for the next): memory stays at one piece, at the cost of writing the
    data twice. A tensor the engine sent in several pieces is saved as one chunk per piece
    (runs of rows), as the shards of a tensor saved by several ranks are: dcp.load assembles
    them. The spill file is removed before the directory is published."""

    is_dir = True

    def __init__(self, dst: str) -> None:
        self.fd = -1

    def begin(self, tensors: list[tuple[str, int, tuple[int, ...]]], meta: dict[str, bytes], tmp: str) -> None:  # fmt: skip
        self.tmp = tmp
        self.tree, self.metas = _sink_tree(tensors, meta)
        self.base: list[int] = []
        at = 0
        for m in self.metas:
            self.base.append(at)
            at += _nbytes(m)
        self.pieces: list[list[tuple[int, int]]] = [[] for _ in self.metas]
        self.spill = os.path.join(tmp, ".ckptio-spill")
        self.fd = os.open(self.spill, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)

    def write(self, index: int, offset: int, data: memoryview) -> None:
        self.pieces[index].append((offset, len(data)))
        done, at = 0, self.base[index] + offset
        while done < len(data):
            done += os.pwrite(self.fd, data[done:], at + done)

    def end(self) -> None:
        try:
            self._save()
        finally:
            os.close(self.fd)
            self.fd = -1
            os.unlink(self.spill)

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _save(self) -> None:
        torch = _torch()
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemWriter
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex
        from torch.distributed.checkpoint.planner import WriteItemType

        _, _, names, _ = _index(self.tree)
        which = {id(m): i for i, m in enumerate(self.metas)}
        # DCP keys are key paths: what DCP itself makes of a nested state dict; a tied tensor
        # is there under each of its keys.
        specs = {name: which[id(s.src)] for name, s in names.items()}
        state: dict[str, Any] = {}
        for name, i in specs.items():
            # Untouched allocations: the pages appear only if written, and they never are.
            state[name] = torch.empty(self.metas[i].shape, dtype=self.metas[i].dtype)
        for path, value in _plain_leaves(self.tree):
            state[path] = value
        held: list[mmap.mmap] = []
        chunks: dict[tuple[str, tuple[int, ...]], tuple[int, int, tuple[int, ...]]] = {}
        sink = self

        class Planner(DefaultSavePlanner):
            def create_local_plan(self) -> Any:
                plan = super().create_local_plan()
                items = []
                for it in plan.items:
                    i = specs.get(it.index.fqn)
                    m = sink.metas[i] if i is not None else None
                    if m is None or it.type == WriteItemType.BYTE_IO or len(sink.pieces[i]) <= 1:
                        items.append(it)
                        continue
                    for first, n in sink.pieces[i]:
                        off, box = _box(tuple(m.shape), m.element_size(), first, n)
                        o = torch.Size(off)
                        chunk = ChunkStorageMetadata(offsets=o, sizes=torch.Size(box))
                        items.append(
                            dataclasses.replace(
                                it,
                                index=MetadataIndex(it.index.fqn, o),
                                type=WriteItemType.SHARD,
                                tensor_data=dataclasses.replace(it.tensor_data, chunk=chunk),
                            )
                        )
                        chunks[(it.index.fqn, off)] = (first, n, box)
                self.plan = dataclasses.replace(plan, items=items)
                return self.plan

            def resolve_data(self, write_item: Any) -> Any:
                i = specs.get(write_item.index.fqn)
                if i is None or write_item.type == WriteItemType.BYTE_IO:
                    return super().resolve_data(write_item)
                m = sink.metas[i]
                off = tuple(int(x) for x in write_item.tensor_data.chunk.offsets)
                first, n, box = chunks.get((write_item.index.fqn, off), (0, _nbytes(m), tuple(m.shape)))  # fmt: skip
                for h in held:
                    h.madvise(mmap.MADV_DONTNEED)
                held.clear()
                if not n:
                    return torch.empty(box, dtype=m.dtype)
                h = mmap.mmap(-1, n)
                held.append(h)
                raw = np.frombuffer(h, np.uint8)
                _pread_into(sink.fd, memoryview(raw), sink.base[i] + first, write_item.index.fqn)
                return torch.from_numpy(raw).view(m.dtype).reshape(box)

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*single process")
            dcp.save(
                state,
                storage_writer=FileSystemWriter(self.tmp, thread_count=1, single_file_per_rank=True),
                planner=Planner(),
                no_dist=True,  # type: ignore[call-arg]
            )


def _plain_leaves(tree: Any) -> Iterator[tuple[str, Any]]:
    """(key path, value) of the tree's non-tensor leaves."""
    torch = _torch()

    def visit(obj: Any, path: str) -> Iterator[tuple[str, Any]]:
        if isinstance(obj, torch.Tensor):
            return
        if isinstance(obj, dict):
            for k, v in obj.items():
                yield from visit(v, f"{path}.{k}" if path else str(k))
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                yield from visit(v, f"{path}.{i}" if path else str(i))
        else:
            yield path, obj

    yield from visit(tree, "")


# ---- the command -----------------------------------------------------------------------------


def _run(src: str, dst: str, opts: dict[str, Any], source: Source | None, sink: Any) -> tuple[str, str, int, int]:  # fmt: skip
    return _core.convert(src, dst, {"piece_bytes": PIECE_BYTES, **opts}, _Feed(source) if source else None, sink)  # fmt: skip


def _compress(compress: str | bool | None) -> int:
    """compress as ckptio.save takes it, as the engine's enum (a usage error for another)."""
    return int(params({"compress": compress})["compress"])


def to_ckptio(src: Source, dst: str, overwrite: bool, compress: str | bool | None = None) -> None:
    """Copy an open torch or DCP source into a new ckptio checkpoint, through the engine
    (``compress`` as ckptio.save takes it)."""
    kind = "dcp" if isinstance(src, DcpSource) else "torch"
    opts = {"from": kind, "to": "ckptio", "overwrite": overwrite, "compress": _compress(compress)}  # fmt: skip
    _run(src.path, dst, opts, src, None)


def _detect(path: str, dst: bool, sharded: bool = False) -> str:
    try:
        return str(_core.convert_detect(path, dst, sharded))
    except CheckpointError as e:
        raise ConvertError(str(e)) from None


def _size(s: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([kKmMgGtT]?)[iI]?[bB]?\s*", s)
    if not m or not float(m.group(1)):
        raise ConvertError(f"--max-shard-size '{s}' is not a size (5G, 500M)")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " "))


def convert(src: str, dst: str, *, src_format: str | None = None, dst_format: str | None = None, overwrite: bool = False, max_shard_size: int | None = None, compress: str | bool | None = None, src_storage_options: Mapping[str, Any] | None = None, dst_storage_options: Mapping[str, Any] | None = None) -> str:  # fmt: skip
    """Convert ``src`` into a new ``dst``, any pair of ckptio, safetensors, hf, torch and dcp
    (the formats detected where not given); ``compress`` ("auto", "all", None) applies to a
    ckptio destination, as in ckptio.save; ``src_storage_options`` / ``dst_storage_options``:
    the settings of the object stores they are in (ckptio.save's storage_options), e.g. from
    one S3-compatible store to another. Returns a one-line summary."""
    dst = dst.rstrip("/") or dst
    # A URL is in an object store, which holds ckptio and safetensors checkpoints only: the
    # engine tells which, asking the store with its settings.
    f = src_format or (None if is_url(src) else _detect(src, False))
    t = dst_format or (None if is_url(dst) else _detect(dst, True, max_shard_size is not None))
    t0 = time.monotonic()
    source = TorchSource(src) if f == "torch" else DcpSource(src) if f == "dcp" else None
    sink = TorchSink(dst) if t == "torch" else DcpSink(dst) if t == "dcp" else None
    opts = {"from": f, "to": t, "overwrite": overwrite, "max_shard_bytes": max_shard_size, "progress": True, "compress": _compress(compress), "src_store": store(src_storage_options), "dst_store": store(dst_storage_options)}  # fmt: skip
    try:
        f, t, n, nbytes = _run(src, dst, opts, source, sink)
    finally:
        if source is not None:
            source.close()
    return f"converted {src} ({f}) -> {dst} ({t}): {n} tensors, {nbytes / 1e9:.2f} GB in {time.monotonic() - t0:.2f} s"  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ckptio convert", description="Convert between ckptio, safetensors, hf, torch and DCP checkpoints.")  # fmt: skip
    ap.add_argument("--from", dest="src_format", choices=FORMATS)
    ap.add_argument("--to", dest="dst_format", choices=FORMATS)
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--max-shard-size")
    ap.add_argument("--compress", nargs="?", const="auto", choices=("none", "auto", "all"))
    ap.add_argument("src")
    ap.add_argument("dst")
    a = ap.parse_args(argv)
    try:
        shard = _size(a.max_shard_size) if a.max_shard_size else None
        summary = convert(a.src, a.dst, src_format=a.src_format, dst_format=a.dst_format, overwrite=a.overwrite, max_shard_size=shard, compress=a.compress)  # fmt: skip
        if sys.stdout.isatty():
            print(summary)
    except (ConvertError, OSError) as e:
        print(f"ckptio convert: {e}", file=sys.stderr)
        print(f"ckptio convert: nothing was written at {a.dst}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # ckptio's errors say what to do; DCP's derive from BaseException
        print(f"ckptio convert: {type(e).__name__}: {e}", file=sys.stderr)
        print(f"ckptio convert: nothing was written at {a.dst}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
