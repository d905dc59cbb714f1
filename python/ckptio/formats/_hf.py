# SPDX-License-Identifier: Apache-2.0
"""ckptio.load / ckptio.open on safetensors: one file, or a Hugging Face directory of shards.

A reader with ckptio._core.Reader's methods over safetensors headers (parsed by the C parser)
serves ckptio's own Reader, so keys=, like= (numpy, torch, jax leaves, dtypes, devices,
shardings, DTensors), Reader.read(key, region) and stats work as for a ckptio checkpoint.
Every box is turned into byte ranges of its file, and each file's ranges are read with one
batched ckptio_file_read.

The tree is flat, name -> tensor, as safetensors stores it and as ckptio.load returns a
checkpoint written without a tree (by the C API): key paths select the same leaves either way
("model.layers.0" selects every tensor below it), the result is what ``load_state_dict``
takes, and names like "a" and "a.b" that a nested tree could not hold both stay loadable.
Tensors load as torch tensors when the header's metadata says ``"format": "pt"``, as jax
arrays for "flax" or "jax", and as numpy arrays otherwise (``framework=`` overrides).
"""

from __future__ import annotations

import json
import os
from typing import Any

from .. import _core, _dtypes, _load
from .._errors import CORRUPT, DUPLICATE, DTYPE, RANGE, USAGE, error
from .._load import _SMALL as _OWN_MEMORY
from .._load import PathLike, Reader, TensorInfo
from .._tree import Node
from ..safetensors import DTYPES, Header, read_header, runs, span

__all__ = ["handles", "HFReader", "INDEX_NAME"]

#: The index of a sharded save_pretrained: {"metadata": {...}, "weight_map": {name: file}}.
INDEX_NAME = "model.safetensors.index.json"
_INDEX_SUFFIX = ".safetensors.index.json"
_FORMAT_FW = {"pt": "torch", "torch": "torch", "flax": "jax", "jax": "jax"}


def handles(path: Any) -> bool:
    """Whether ``path`` is a safetensors file, a ``*.safetensors.index.json``, or a directory
    of safetensors files that is not a ckptio checkpoint."""
    try:
        p = os.fspath(path)
    except TypeError:
        return False
    if isinstance(p, bytes):
        return False
    if os.path.isdir(p):
        if os.path.lexists(os.path.join(p, "manifest")):
            return False
        try:
            names = os.listdir(p)
        except OSError:
            return False
        return any(n.endswith(".safetensors") or n.endswith(_INDEX_SUFFIX) for n in names)
    if not os.path.isfile(p):
        return False
    if p.endswith(".safetensors") or p.endswith(_INDEX_SUFFIX):
        return True
    # A file by another name (a Hugging Face cache blob): its first bytes decide.
    try:
        with open(p, "rb") as f:
            head = f.read(9)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") <= size - 8


def _inside(root: str, name: Any, index: str) -> str:
    """The shard ``name`` of an index, refused unless it is a plain relative path below root."""
    if not isinstance(name, str) or not name or os.path.isabs(name):
        raise error(CORRUPT, f"{index}: weight_map names file {name!r}, not a relative path")
    norm = os.path.normpath(name)
    if norm == ".." or norm.startswith("../"):
        raise error(CORRUPT, f"{index}: weight_map names file {name!r} outside its directory")
    return os.path.join(root, norm)


def _read_index(index: str) -> tuple[dict[str, str], dict[str, str]]:
    """(tensor name -> shard path, the index's metadata as strings)."""
    try:
        with open(index, "rb") as f:
            doc = json.loads(f.read())
    except OSError as e:
        raise error(CORRUPT, f"cannot read the index '{index}': {e.strerror}") from None
    except ValueError as e:
        raise error(CORRUPT, f"the index '{index}' is not JSON: {e}") from None
    wmap = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wmap, dict):
        raise error(CORRUPT, f"the index '{index}' has no weight_map object")
    root = os.path.dirname(index)
    out = {}
    for name, shard in wmap.items():
        out[name] = _inside(root, shard, index)
    meta = doc.get("metadata") or {}
    return out, {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}


class _Record:
    """What Reader.tensors() reads of a stored tensor (ckptio._core.TensorRecord's fields)."""

    __slots__ = ("name", "dtype", "shape", "nbytes", "num_chunks", "entry", "file", "item")

    def __init__(self, name: str, entry: Any, file: int) -> None:
        self.name = name
        self.entry = entry
        self.file = file
        self.nbytes = entry.nbytes
        self.num_chunks = 1
        if entry.code:
            self.dtype = entry.code
            self.shape = entry.shape
            self.item = _dtypes.ITEMSIZE[entry.code]
        else:
            # No ckptio code (F8_E8M0, the FNUZ float8s; F4, F6 which cannot load): raw bytes
            # with a trailing dimension of the element size, the dtype named in the tree node.
            self.dtype = _dtypes.BYTES
            size = DTYPES[entry.dtype][0] if entry.dtype in DTYPES else 1
            self.shape = entry.shape + (size,) if entry.dtype in DTYPES else (entry.nbytes,)
            self.item = 1


class Core:
    """ckptio._core.Reader's methods over one safetensors file or a directory of shards."""

    def __init__(self, path: str, p: dict[str, int]) -> None:
        self.path = path
        self._p = p
        self.closed = False
        # bytes, io_bytes, tensors, seconds, backend, direct, alignment: IOStats summed over files
        self._stats: list[Any] = [0, 0, 0, 0.0, "", 0, 0]
        files, wmap, self._meta = self._resolve(path)
        self._headers: list[Header] = []
        by_path: dict[str, int] = {}
        for f in files:
            by_path[f] = len(self._headers)
            self._headers.append(read_header(f))
        recs: dict[str, _Record] = {}
        if wmap is not None:
            for name, f in wmap.items():
                h = self._headers[by_path[f]]
                e = h.entries.get(name)
                if e is None:
                    raise error(
                        CORRUPT, f"{path}: the index puts tensor '{name}' in '{f}', which does "
                        "not hold it: the download is incomplete or the index stale",
                    )  # fmt: skip
                recs[name] = _Record(name, e, by_path[f])
        else:
            for i, h in enumerate(self._headers):
                for name, e in h.entries.items():
                    if name in recs:
                        other = self._headers[recs[name].file].path
                        raise error(
                            DUPLICATE, f"{path}: tensor '{name}' is in both '{other}' and "
                            f"'{h.path}'; pass one file, or a directory with an index",
                        )  # fmt: skip
                    recs[name] = _Record(name, e, i)
        for h in self._headers:
            for k, v in (h.metadata or {}).items():
                self._meta.setdefault(k, v)
        self._list = [recs[n] for n in sorted(recs)]
        self._index = {r.name: i for i, r in enumerate(self._list)}
        # Buffers placed with room before a tensor at an unaligned offset (id -> buffer, held
        # until read): their whole-tensor reads start at the page boundary below.
        self._widen: dict[int, Any] = {}

    def lead(self, index: int) -> int:
        """Room to leave before tensor ``index`` in its memory so that reading it whole from
        the page boundary below its file offset lands with no copy (0: none needed)."""
        r = self._list[index]
        e = r.entry
        lo, _hi = span(e.offset, e.nbytes, e.dtype, self._headers[r.file].size)
        return e.offset - lo

    def widen(self, buf: Any) -> None:
        """``buf`` was placed with lead() bytes of room before its tensor."""
        self._widen[id(buf)] = buf

    @staticmethod
    def _resolve(path: str) -> tuple[list[str], dict[str, str] | None, dict[str, str]]:
        """(shard files, tensor -> file from an index or None, the index's metadata)."""
        index = None
        if os.path.isdir(path):
            names = sorted(os.listdir(path))
            if INDEX_NAME in names:
                index = os.path.join(path, INDEX_NAME)
            else:
                found = [n for n in names if n.endswith(_INDEX_SUFFIX)]
                if len(found) > 1:
                    raise error(
                        USAGE, f"{path} holds several indexes ({', '.join(found)}); pass the "
                        "one to load",
                    )  # fmt: skip
                if found:
                    index = os.path.join(path, found[0])
            if index is None:
                files = [os.path.join(path, n) for n in names if n.endswith(".safetensors")]
                return files, None, {}
        elif path.endswith(_INDEX_SUFFIX):
            index = path
        else:
            return [path], None, {}
        wmap, meta = _read_index(index)
        files = list(dict.fromkeys(wmap.values()))
        return files, wmap, meta

    # ---- what ckptio's Reader asks ----
    def tensors(self) -> list[_Record]:
        return self._list

    def find(self, name: str) -> int:
        return self._index.get(name, -1)

    def record(self, name: str) -> _Record:
        return self._list[self._index[name]]

    def meta(self) -> dict[str, bytes]:
        return {k: v.encode() for k, v in self._meta.items()}

    def get_meta(self, key: str) -> bytes | None:
        v = self._meta.get(key)
        return v.encode() if v is not None else None

    def framework(self) -> str:
        return _FORMAT_FW.get(self._meta.get("format", ""), "numpy")

    def verify(self) -> None:
        raise error(
            "CKPTIO_E_UNSUPPORTED",
            f"{self.path}: safetensors files carry no checksums to verify",
        )

    def read(self, regions: list[Any]) -> None:
        if self.closed:
            raise error("CKPTIO_E_STATE", "reader is closed")
        per_file: dict[int, list[tuple[int, int, Any, int]]] = {}
        extra: dict[int, int] = {}  # bytes read around tensors, per file
        widen, self._widen = self._widen, {}
        for reg in regions:
            r = self._list[reg.tensor]
            e = r.entry
            if e.dtype not in DTYPES:
                raise _unsupported(self._headers[r.file].path, r.name, e.dtype)
            full = r.shape
            off = tuple(reg.offset) if reg.offset is not None else (0,) * len(full)
            size = tuple(reg.shape) if reg.shape is not None else full
            if len(off) != len(full) or len(size) != len(full) or any(
                o + s > d for o, s, d in zip(off, size, full)
            ):
                raise error(
                    RANGE, f"{self._headers[r.file].path}: tensor '{r.name}' of shape {full}: "
                    f"region at {off} of shape {size} lies outside it",
                )  # fmt: skip
            run, starts = runs(full, r.item, off, size)
            ranges = per_file.setdefault(r.file, [])
            at = reg.dst_offset
            if widen.pop(id(reg.dst), None) is reg.dst and run == e.nbytes:
                lo, hi = span(e.offset, e.nbytes, e.dtype, self._headers[r.file].size)
                if at == e.offset - lo:
                    ranges.append((lo, hi - lo, reg.dst, 0))
                    extra[r.file] = extra.get(r.file, 0) + hi - lo - e.nbytes
                    continue
            ranges.extend(
                (e.offset + s, run, reg.dst, at + i * run) for i, s in enumerate(starts.tolist())
            )
        for f, ranges in per_file.items():
            ranges.sort(key=lambda x: x[0])
            st = _core.file_read(self._headers[f].path, ranges, self._p)
            acc = self._stats
            acc[0] += st.bytes - extra.get(f, 0)
            acc[1] += st.io_bytes
            acc[3] += st.seconds
            acc[4], acc[5], acc[6] = st.backend, st.direct, st.alignment
        self._stats[2] += len(regions)

    def stats(self) -> Any:
        b, io, n, s, backend, direct, align = self._stats
        return _core.IOStats((b, io, n, s, b / s / 1e9 if s > 0 else 0.0, backend, direct, align))

    def close(self) -> None:
        self.closed = True


def _unsupported(path: str, name: str, st: str) -> Exception:
    return error(
        DTYPE, f"{path}: tensor '{name}' has safetensors dtype {st}, which packs elements below a "
        "byte; ckptio cannot load it",
    )  # fmt: skip


class HFReader(Reader):
    """ckptio.open() of a safetensors file or a Hugging Face directory (see the module)."""

    _r: Core

    def __init__(self, path: PathLike, *, mmap: bool = False, **io_options: Any) -> None:
        if mmap:
            raise error(
                "CKPTIO_E_UNSUPPORTED",
                f"{os.fspath(path)}: mmap=True maps ckptio checkpoints only; load a safetensors "
                "file or Hugging Face directory without mmap= (its tensors are read straight "
                "into place)",
            )
        super().__init__(path, **io_options)

    @staticmethod
    def _open_core(path: str, p: dict[str, int]) -> Any:
        return Core(path, p)

    def _tree(self) -> Node:
        self._check_open()
        if self._root is None:
            fw = self._r.framework()
            names, nodes = [], []
            for r in self._r.tensors():
                node: Node = {"t": "tensor", "f": fw}
                e = r.entry
                if not e.code:
                    if e.dtype not in DTYPES:
                        node["unsupported"] = e.dtype
                    elif fw == "torch":
                        node["dtype"] = DTYPES[e.dtype][1]
                    else:
                        node["dtype"] = DTYPES[e.dtype][2]
                names.append(r.name)
                nodes.append(node)
            self._root = {"t": "dict", "k": names, "v": nodes}
        return self._root

    def _placer(self, alloc: Any) -> Any:
        core = self._r

        def place(
            index: int, offset: tuple[int, ...] | None, shape: tuple[int, ...] | None, n: int
        ) -> tuple[Any, int]:
            # Only a big tensor gets memory of its own, with room before it to spare.
            lead = core.lead(index) if offset is None and n >= _OWN_MEMORY else 0
            if not lead:
                return alloc.place(index, offset, shape, n)
            buf, at = alloc.place(index, offset, shape, n, lead)
            core.widen(buf)
            return buf, at

        return place

    def _target(
        self,
        node: Node,
        info: TensorInfo,
        like: Any,
        framework: str | None,
        device: Any,
        region: bool = False,
    ) -> Any:
        if "unsupported" in node:
            r = self._r.record(info.name)
            raise _unsupported(self._r._headers[r.file].path, info.name, node["unsupported"])
        return super()._target(node, info, like, framework, device, region)

    def verify(self) -> None:
        self._r.verify()


_load.FOREIGN_READERS.append((handles, HFReader))
