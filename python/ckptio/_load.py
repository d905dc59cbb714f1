# SPDX-License-Identifier: Apache-2.0
"""ckptio.load and ckptio.open: plan every destination, read them in one batch, rebuild the tree."""

from __future__ import annotations

import dataclasses
import json
import operator
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from . import _core, _dtypes
from ._errors import NOT_FOUND, RANGE, SHAPE, STATE, USAGE, CheckpointError, InvalidType, TensorNotFound, error
from ._options import Stats, params, split_roots
from .frameworks import _gpu
from .frameworks import _registry as _adapters
from .frameworks._base import Target
from ._tree import (
    TREE_KEY,
    Node,
    decode_value,
    find,
    flatten,
    iter_leaves,
    leaf_name,
    parse_document,
    pause_gc,
    unflatten,
)

__all__ = ["load", "open", "Reader", "TensorInfo"]

PathLike = str | os.PathLike[str]
Region = Any  # a slice, an int, Ellipsis, None (a new axis), or a tuple of them (np.s_[...])

_ALIGN: int = _core.alignment
_region = _core.read_region
# Fresh memory costs a page fault per page (zeroing, page tables). "none": the read takes them
# (in the kernel, while other requests are in flight on the device); "prefault": another
# thread faults the buffers in, in order, while the read runs. Measured here
# (bench/fresh_memory.py, bench/results/fresh-20261201/, which also tried faulting each buffer
# in as it was allocated): "none" is the fastest, cold and warm, one tensor or many; the second
# thread contends with the read for the same page tables (1 GiB warm: 3.6 GB/s with "none",
# 2.5 with "prefault").
_FRESH = "none"
_PREFAULT_MIN = 16 << 20  # below this in all, a thread costs more than it saves


class TensorInfo:
    """What the checkpoint holds for one tensor: dtype name, shape, bytes, chunks."""

    __slots__ = ("name", "index", "code", "shape", "nbytes", "num_chunks")

    def __init__(
        self, name: str, index: int, code: int, shape: tuple[int, ...], nbytes: int, chunks: int
    ) -> None:
        self.name = name
        self.index = index
        self.code = code
        self.shape = shape
        self.nbytes = nbytes
        self.num_chunks = chunks

    @property
    def dtype(self) -> str:
        """ckptio's dtype name ("f32", "bf16", ...)."""
        return _dtypes.NAMES.get(self.code, str(self.code))

    def __repr__(self) -> str:
        return (
            f"TensorInfo({self.name!r}, dtype={self.dtype}, shape={self.shape}, "
            f"nbytes={self.nbytes}, chunks={self.num_chunks})"
        )


class _Piece:
    """One region to read: where it lands once allocated."""

    __slots__ = ("index", "offset", "shape", "nbytes", "buf", "at")

    def __init__(
        self, index: int, offset: tuple[int, ...] | None, shape: tuple[int, ...] | None, nbytes: int
    ) -> None:
        self.index = index
        self.offset = offset
        self.shape = shape
        self.nbytes = nbytes
        self.buf: Any = None
        self.at = 0


class _Alloc:
    """The regions of one batched read. Their memory is the library's choice
    (ckptio_reader_place: a page-aligned block for each region of 4 KiB or more, in place;
    64-byte-aligned slabs for the smaller ones; room before a safetensors tensor stored off the
    alignment), made when the read runs: until then place() hands back a claim on it, and
    landed() turns a claim into (buffer, offset)."""

    __slots__ = ("specs", "got")

    def __init__(self) -> None:
        self.specs: list[tuple[int, Any, Any]] = []
        self.got: list[tuple[Any, int]] = []

    def place(
        self, index: int, offset: tuple[int, ...] | None, shape: tuple[int, ...] | None, n: int
    ) -> tuple[Any, int]:
        """A claim on the memory region (index, offset, shape) of ``n`` bytes will land in."""
        if n == 0:
            return None, 0
        self.specs.append((index, offset, shape))
        return self, len(self.specs) - 1

    def landed(self, buf: Any, at: int) -> tuple[Any, int]:
        """(buffer, offset) of what place() returned, once read (other placers' answers as
        they are)."""
        return self.got[at] if buf is self else (buf, at)

    def read(self, r: Any, share: Any = None) -> None:
        if not self.specs:
            return
        if share is None and _FRESH != "prefault":  # placed and read in one call to the library
            self.got = [(p[0], p[1]) for p in r.place_read(self.specs)]
            self.specs = []
            return
        places = r.place(self.specs)
        regions = [
            _region(index, offset, shape, buf, at, cap, lead)
            for (index, offset, shape), (buf, at, cap, lead) in zip(self.specs, places)
        ]
        fresh = list({id(p[0]): p[0] for p in places if p[0] is not None}.values())  # each block once
        if share is not None:
            from .ranks import _share

            read: Any = lambda regions: _share.read(r, regions, share)  # noqa: E731
        else:
            read = r.read
        prefaulting(fresh, sum(len(b) for b in fresh), read, regions)
        self.got = [(p[0], p[1]) for p in places]
        self.specs = []


def prefaulting(fresh: list[Any], nbytes: int, read: Any, *args: Any) -> Any:
    """``read(*args)`` while, with _FRESH "prefault", another thread faults in the fresh
    buffers ``fresh`` (``nbytes`` in all) in order, ahead of the read."""
    if _FRESH != "prefault" or nbytes < _PREFAULT_MIN:
        return read(*args)
    import threading

    t = threading.Thread(target=_core.prefault, args=(fresh,), daemon=True)
    t.start()
    try:
        return read(*args)
    finally:
        t.join()


def _check_index(i: Any, name: str) -> None:
    """Refuse (InvalidType) an index that is not an int, a slice of ints, ``...`` or None: a
    boolean or an array would be an advanced index, whose result numpy shapes otherwise."""
    if i is None or i is Ellipsis:
        return
    for x in (i.start, i.stop, i.step) if isinstance(i, slice) else (i,):
        if x is None:
            continue
        if isinstance(x, (bool, np.bool_)):
            what = "a boolean"
        else:
            try:
                operator.index(x)
                continue
            except TypeError:
                what = f"a {type(x).__name__}"
        raise error(
            USAGE,
            f"tensor '{name}': {what} index is not supported; index with ints, slices, '...' "
            "and None (read the tensor and index it for the rest)",
            InvalidType,
        )


def empty(idx: tuple[Any, ...], shape: tuple[int, ...]) -> bool:
    """Whether the box of ``idx`` (Ellipsis expanded) has no bytes: the library then reads
    nothing, and refuses nothing either."""
    dims = iter(shape)
    for i in idx:
        if i is None:
            continue
        dim = next(dims)
        if dim == 0 or (isinstance(i, slice) and not len(range(*i.indices(dim)))):
            return True
    return any(d == 0 for d in dims)


def _region_box(
    region: Region, shape: tuple[int, ...], name: str
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[Any, ...]]:
    """(offset, shape) of the box a numpy-style index covers, and the index within that box.

    Basic indexing as numpy and torch do it: ints (negative from the end), slices with a step
    >= 1, one Ellipsis, and None (np.newaxis: a new dimension of 1, applied by the index within
    the box). ``region`` None itself is the whole tensor (read()'s default). Boolean and array
    (advanced) indices are refused, not guessed at."""
    if region is None:
        return (0,) * len(shape), shape, ()
    idx = region if isinstance(region, tuple) else (region,)
    for i in idx:
        _check_index(i, name)
    dims_used = sum(i is not None and i is not Ellipsis for i in idx)
    if sum(i is Ellipsis for i in idx) > 1:
        raise error(USAGE, f"tensor '{name}': an index can only have a single ellipsis ('...')")
    if dims_used > len(shape):
        raise error(RANGE, f"tensor '{name}' has {len(shape)} dimensions; got {dims_used} indices")
    if any(i is Ellipsis for i in idx):
        k = next(j for j, i in enumerate(idx) if i is Ellipsis)
        idx = idx[:k] + (slice(None),) * (len(shape) - dims_used) + idx[k + 1 :]
    off: list[int] = []
    size: list[int] = []
    inner: list[Any] = []
    dims = iter(shape)
    for i in idx:
        if i is None:
            inner.append(None)
            continue
        dim = next(dims)
        if isinstance(i, slice):
            if i.step is not None and operator.index(i.step) < 1:
                raise error(
                    USAGE,
                    f"tensor '{name}': a slice step must be 1 or more, got {i.step} (negative "
                    "steps are not supported; read and flip)",
                )
            start, stop, step = i.indices(dim)
            n = len(range(start, stop, step))
            if n == 0:
                off.append(min(start, dim))
                size.append(0)
                inner.append(slice(None))
            else:
                last = start + (n - 1) * step
                off.append(start)
                size.append(last + 1 - start)
                inner.append(slice(None, None, step) if step != 1 else slice(None))
        else:
            j = operator.index(i)  # an integer index drops the dimension
            if j < -dim or (j >= dim and empty(idx, shape)):
                raise error(
                    RANGE, f"tensor '{name}': index {j} is out of bounds for a dimension of {dim}"
                )
            if j < 0:
                j += dim
            # j >= dim: the library refuses the box, naming the file and tensor.
            off.append(j)
            size.append(1)
            inner.append(0)
    for dim in dims:
        off.append(0)
        size.append(dim)
        inner.append(slice(None))
    return tuple(off), tuple(size), tuple(inner)


class Reader:
    """A committed checkpoint open for reading: ``ckptio.open(path)``.

    ``keys()`` lists every leaf's key path; ``r[key]`` loads one leaf (or a subtree);
    ``r.read(key, region)`` reads part of a tensor; ``r.metadata`` holds the user metadata;
    ``r.load(...)`` is ckptio.load on this reader. Use it as a context manager. With
    ``mmap=True`` tensors are views of private mappings of the data files (see ckptio.load)
    and ``r[key]`` checks the checksums of the tensors it returns.

    >>> import numpy as np, ckptio, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt")
    >>> _ = ckptio.save({"w": np.arange(12.0).reshape(3, 4)}, path, metadata={"step": "5"})
    >>> with ckptio.open(path) as r:
    ...     print(r.keys(), r.metadata, r.read("w", np.s_[1:, 2]))
    ['w'] {'step': '5'} [ 6. 10.]
    """

    def __init__(self, path: PathLike, *, mmap: bool = False, _comm: Any = None,
                 _timeout: float = 0.0, **io_options: Any) -> None:  # fmt: skip
        # mmap=True: whole tensors are views of private mappings of the data files (_mapped).
        # _comm: a Communicator whose ranks open it together (ckptio_reader_open_comm: the
        # manifest read by rank 0, sent to the others), within _timeout seconds.
        p, roots = split_roots(params(io_options))
        self._gpu = p["gpu"]  # the gpu= option, for GPU destinations
        self._mapped: Any = None
        self._checksums = io_options.get("checksums", True) is not False
        if mmap:
            from ._mapped import Mapped

            self._r, self._mapped = Mapped.open_reader(os.fspath(path), p, roots)
        elif _comm is not None:
            self._r = _core.open_comm(os.fspath(path), p, _comm, _timeout)
        else:
            self._r = self._open_core(os.fspath(path), p)
        if roots:  # a striped checkpoint's stripes, moved from where it recorded them
            self._r.set_roots(roots)
        self._infos: dict[str, tuple[int, int, tuple[int, ...], int, int]] | None = None
        self._root: Node | None = None
        self._nodes: dict[str, Node] | None = None
        self._has_tree = False
        # The rank whose RankLocal values load gives (load(comm=...)); None: every rank's.
        self._rank: int | None = None
        # load(comm=...) of bytes other ranks of the host read too: ckptio.ranks._share.Share.
        self._share: Any = None

    @staticmethod
    def _open_core(path: str, p: dict[str, int]) -> Any:
        """The library's reader (safetensors readers bring their own: ckptio.formats._hf)."""
        return _core.Reader(path, p)

    # ---- context ----
    def close(self) -> None:
        self._r.close()
        if self._mapped is not None:
            self._mapped.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def path(self) -> str:
        return str(self._r.path)

    @property
    def closed(self) -> bool:
        return bool(self._r.closed)

    # ---- what is inside ----
    def _check_open(self) -> None:
        # What the reader caches must not outlive it: after close() every call raises, as the
        # ones that reach the library do.
        if self._r.closed:
            raise error(STATE, "reader is closed")

    def _raw(self) -> dict[str, tuple[int, int, tuple[int, ...], int, int]]:
        """name -> (index, dtype code, shape, nbytes, chunks), straight from the manifest."""
        self._check_open()
        if self._infos is None:
            self._infos = {
                t.name: (i, t.dtype, t.shape, t.nbytes, t.num_chunks)
                for i, t in enumerate(self._r.tensors())
            }
        return self._infos

    def _info(self, name: str) -> TensorInfo:
        t = self._raw().get(name)
        if t is None:
            raise error(
                NOT_FOUND, f"{self.path}: tensor '{name}' is in the tree but not in the checkpoint"
            )
        return TensorInfo(name, *t)

    def tensors(self) -> dict[str, TensorInfo]:
        """Every stored tensor by name (the names are the leaves' key paths)."""
        return {name: TensorInfo(name, *t) for name, t in self._raw().items()}

    def _tree(self) -> Node:
        self._check_open()
        if self._root is None:
            raw = self._r.get_meta(TREE_KEY)
            if raw is not None:
                self._root = parse_document(json.loads(raw))
                self._has_tree = True
            else:
                # Written without the Python layer: a flat dict of numpy arrays by name.
                names = list(self._raw())
                self._root = {
                    "t": "dict",
                    "k": names,
                    "v": [{"t": "tensor", "f": "numpy"} for _ in names],
                }
        return self._root

    def _tensor_nodes(self) -> dict[str, Node]:
        if self._nodes is None:
            self._nodes = {
                leaf_name(p): n for p, n in iter_leaves(self._tree()) if n["t"] == "tensor"
            }
        return self._nodes

    def keys(self) -> list[str]:
        """The key path of every leaf (tensors and plain values), in tree order."""
        return [p if p else "." for p, _ in iter_leaves(self._tree())]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and find(self._tree(), key) is not None

    @property
    def metadata(self) -> dict[str, str]:
        """The user metadata given to save (str -> str)."""
        return {
            k: v.decode("utf-8", "replace")
            for k, v in self._r.meta().items()
            if not k.startswith("ckptio.")
        }

    def info(self, key: str) -> TensorInfo:
        """The stored tensor behind leaf ``key``."""
        found = find(self._tree(), key)
        if found is None or found[1]["t"] != "tensor":
            raise self._not_found(key)
        name = found[1].get("alias", leaf_name(found[0]))
        return self._info(name)

    def _not_found(self, key: str) -> TensorNotFound:
        e = error(
            NOT_FOUND,
            f"{self.path}: no tensor or key {key!r} (keys are paths like 'model.layers.0.weight')",
        )
        assert isinstance(e, TensorNotFound)
        return e

    def __getitem__(self, key: str) -> Any:
        found = find(self._tree(), key)
        if found is None:
            raise self._not_found(key)
        path, node = found
        if node["t"] == "tensor":
            obj = self._build({path: (node, None)})[path]
            self._check_mapped([path])
            return obj
        if node["t"] in ("dict", "odict", "list", "tuple"):
            return self._subtree(path, node)
        return self._value(path, node)

    def _value(self, path: str, node: Node) -> Any:
        """A non-tensor leaf: a plain value, or rank-local state (ckptio.RankLocal)."""
        if node["t"] == "ranklocal":
            from .ranks import _dist

            return _dist.load_rank_local(self, path, node, self._rank)
        return decode_value(node)

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except TensorNotFound:
            return default

    def _subtree(self, path: str, node: Node) -> Any:
        wanted: dict[str, tuple[Node, Target | None]] = {}
        for p, n in iter_leaves(node, path):
            if n["t"] == "tensor":
                wanted[p] = (n, None)
        built = self._build(wanted)
        self._check_mapped(wanted)
        return unflatten(node, lambda p, n: built[p], base=path, value=self._value)

    def _check_mapped(self, paths: Iterable[str]) -> None:
        """mmap=True: verify the mapped bytes of these leaves' tensors (r[key] does)."""
        if self._mapped is None or not self._checksums:
            return
        for p in paths:
            self._mapped.check(self._r, self.info(p if p else ".").index)

    def verify(self) -> None:
        """Read every stored byte and check every checksum; raises CorruptCheckpoint if any
        is damaged (the message names the first damaged file, tensor and offset).

        Opened with ``mmap=True``, it checks the data files the reader holds open since it was
        opened, as the tensors map them (so also after a later save replaced the checkpoint),
        and first that none was written in place since (CorruptCheckpoint naming it)."""
        if self._mapped is not None:
            from ._mapped import verify_all

            verify_all(self._mapped, self._r)
            return
        self._r.verify()

    def stats(self) -> Stats:
        t = self._r.stats()
        gpu = _gpu.stats_text(self._r, _gpu.take_note())
        return dataclasses.replace(
            Stats._from_core(t, t.seconds), gpu=gpu, cache_bytes=_cache_bytes(self._r)
        )

    # ---- reading ----
    def read(self, key: str, region: Region = None, *, framework: str | None = None) -> Any:
        """Read part of tensor ``key``: ``region`` is a numpy-style basic index of slices (step
        >= 1), ints, ``...`` and None (a new dimension), e.g. ``np.s_[10:20, :]``; only the
        bytes of that box are read. ``region`` None itself reads the whole tensor.

        Returns an array of the kind the tensor was saved from (numpy, torch, jax) unless
        ``framework`` says otherwise.
        """
        found = find(self._tree(), key)
        if found is None or found[1]["t"] != "tensor":
            raise self._not_found(key)
        path, node = found
        info = self.info(key)
        real = self._tensor_nodes().get(info.name, node)
        shape = self._elem_shape(real, info)
        off, size, inner = _region_box(region, shape, info.name)
        tgt = self._target(real, info, None, framework, None, region=True)
        tgt.box = (off, size)
        obj = self._build({path: (node, tgt)})[path]
        return obj[inner] if inner else obj

    def load(
        self,
        *,
        like: Any = None,
        keys: Iterable[str] | None = None,
        device: Any = None,
        framework: str | None = None,
    ) -> Any:
        """ckptio.load on this reader (see ckptio.load)."""
        if framework is not None and framework not in _adapters.BY_NAME:
            raise error(
                USAGE,
                f"framework must be one of {', '.join(_adapters.BY_NAME)} or None, "
                f"got {framework!r}",
            )
        root = self._tree()
        if like is not None:
            if keys is not None:
                raise error(USAGE, "pass like= or keys=, not both: like= already selects the keys")
            return self._load_like(like, device, framework)
        keyset = None
        if keys is not None:
            if isinstance(keys, str):
                keys = [keys]
            keyset = {"" if k == "." else k for k in keys}
        wanted: dict[str, tuple[Node, Target | None]] = {}
        if keyset is None:
            for p, n in iter_leaves(root):
                if n["t"] == "tensor":
                    wanted[p] = (n, None)
        else:

            def collect(path: str, node: Node) -> None:
                wanted[path] = (node, None)

            unflatten(root, collect, keyset)  # learns which leaves the keys select
        built = self._build(wanted, device=device, framework=framework)
        return unflatten(root, lambda p, n: built[p], keyset, value=self._value)

    def _load_like(self, like: Any, device: Any, framework: str | None) -> Any:
        from .ranks._dist import classify_like

        like_root, like_leaves = flatten(like, classify=classify_like)
        targets = {
            (name if name != "." else ""): obj for name, obj, _ in like_leaves
        }  # path -> like leaf
        wanted: dict[str, tuple[Node, Target | None]] = {}
        saved: dict[str, Node] = {}
        for path, _lnode in iter_leaves(like_root):
            found = find(self._tree(), path if path else ".")
            if found is None or found[1]["t"] in ("dict", "odict", "list", "tuple"):
                raise self._not_found(path if path else ".")
            saved[path] = found[1]
            if found[1]["t"] == "tensor":
                tgt = None
                if path in targets and targets[path] is not None:
                    node = found[1]
                    info = self.info(path if path else ".")
                    real = self._tensor_nodes().get(info.name, node)
                    tgt = self._target(real, info, targets[path], framework, device)
                wanted[path] = (found[1], tgt)
        built = self._build(wanted, device=device, framework=framework)

        def leaf(path: str, node: Node) -> Any:
            if path in built:
                return built[path]
            return self._value(path, saved[path])

        return unflatten(like_root, leaf, value=leaf)

    # ---- planning ----
    @staticmethod
    def _elem_shape(node: Node, info: TensorInfo) -> tuple[int, ...]:
        """The tensor's shape as the user sees it (raw-byte dtypes carry one more dim)."""
        if info.code == _dtypes.BYTES and "dtype" in node:
            return info.shape[:-1]
        return info.shape

    def _target(
        self,
        node: Node,
        info: TensorInfo,
        like: Any,
        framework: str | None,
        device: Any,
        region: bool = False,
    ) -> Target:
        if like is not None:
            ad = _adapters.classify_like(like)
            assert ad is not None
            want_shape: tuple[int, ...] | None = ad.like_spec(like)[1]
        else:
            ad = _adapters.get(framework or node.get("f", "numpy"))
            want_shape = None
        shape = self._elem_shape(node, info)
        if want_shape is not None and want_shape != shape:
            raise error(
                SHAPE,
                f"{self.path}: tensor '{info.name}' has shape {shape} but like= asks for "
                f"{want_shape}",
            )
        tgt = Target(ad.name)
        ad.target(tgt, node, info, like, device, region)
        return tgt

    def _build(
        self,
        wanted: dict[str, tuple[Node, Target | None]],
        *,
        device: Any = None,
        framework: str | None = None,
    ) -> dict[str, Any]:
        """Read and build every wanted tensor leaf (path -> (node, target or None)) with one
        batched read."""
        raw = self._raw()
        alloc = _Alloc()
        place = alloc.place
        if self._mapped is not None:
            from ._mapped import placer

            place = placer(self._mapped, self._r, {t[0]: t[1:] for t in raw.values()}, alloc)
        out: dict[str, Any] = {}
        # Fast path: plain numpy leaves loaded as numpy (big flat state dicts).
        simple: dict[str, tuple[Any, int, np.dtype[Any], tuple[int, ...]]] = {}
        simple_leaves: list[tuple[str, str, bool]] = []  # (path, tensor name, needs a view)
        code_np = _dtypes.code_to_np()
        numpy_ok = framework is None or framework == "numpy"
        # General path: tensors by (name, target signature); aliases and repeats share a read.
        plans: dict[tuple[Any, ...], tuple[str, Node, TensorInfo, Target, list[_Piece]]] = {}
        leaf_plan: dict[str, tuple[tuple[Any, ...], Node]] = {}
        nodes: dict[str, Node] | None = None
        gpu_reads: list[tuple[_Piece, Any]] = []
        for path, (node, tgt) in wanted.items():
            alias = node.get("alias")
            if alias is None:
                name = path or "."
                real = node
            else:
                if nodes is None:
                    nodes = self._tensor_nodes()
                name = alias
                real = nodes.get(name, node)
            if tgt is None and numpy_ok and len(real) == 2 and real["f"] == "numpy":
                if name not in simple:
                    t = raw.get(name)
                    npdt = code_np.get(t[1]) if t is not None else None
                    if t is not None and npdt is not None:
                        buf, at = place(t[0], None, None, t[3])
                        simple[name] = (buf, at, npdt, t[2])
                if name in simple:
                    simple_leaves.append((path, name, alias is not None and not node.get("same")))
                    continue
            info = self._info(name)
            if tgt is None:
                tgt = self._target(real, info, None, framework, device)
            sig = (name, tgt.kind, tgt.dtype, tgt.place_key, tgt.cast, tgt.box, tgt.wrap)
            leaf_plan[path] = (sig, node)
            if sig in plans:
                continue
            ps = self._plan(real, info, tgt)
            with _gpu.asked(self._gpu):
                dev = _gpu.torch_dest(tgt, ps)
            if dev is not None:
                gpu_reads.append((ps[0], dev))  # read into GPU memory, not through the host
            else:
                for p in ps:
                    p.buf, p.at = place(p.index, p.offset, p.shape, p.nbytes)
            plans[sig] = (name, real, info, tgt, ps)
        alloc.read(self._r, getattr(self, "_share", None))
        landed = alloc.landed
        for name, (buf, at, npdt, shape) in simple.items():
            simple[name] = (*landed(buf, at), npdt, shape)
        for _name, _real, _info, _tgt, ps in plans.values():
            for p in ps:
                if p.buf is alloc:
                    p.buf, p.at = landed(p.buf, p.at)
        for p, dev in gpu_reads:
            _gpu.read_into(self._r, p, dev)
        ndarray = np.ndarray
        arrays = {
            name: ndarray(shape, npdt, buf, at) if buf is not None else np.empty(shape, npdt)
            for name, (buf, at, npdt, shape) in simple.items()
        }
        for path, name, view in simple_leaves:
            out[path] = arrays[name].view() if view else arrays[name]
        objs = {sig: self._make(*plan) for sig, plan in plans.items()}
        for path, (sig, node) in leaf_plan.items():
            base = objs[sig]
            if "alias" not in node or node.get("same"):
                out[path] = base
            else:
                out[path] = _adapters.BY_NAME[sig[1]].alias_view(base, node)
        return out

    def _plan(self, node: Node, info: TensorInfo, tgt: Target) -> list[_Piece]:
        raw = info.code == _dtypes.BYTES and "dtype" in node
        item = info.shape[-1] if raw else _dtypes.ITEMSIZE[info.code]
        full = self._elem_shape(node, info)

        def piece(box: tuple[tuple[int, ...], tuple[int, ...]] | None) -> _Piece:
            if box is None or box[1] == full and not any(box[0]):
                n = info.nbytes
                return _Piece(info.index, None, None, n)
            off, shape = box
            n = item
            for d in shape:
                n *= d
            if raw:
                off, shape = off + (0,), shape + (item,)
            return _Piece(info.index, off, shape, n)

        groups = _adapters.BY_NAME[tgt.kind].boxes(tgt, full)
        if groups is not None:
            return [piece(box) for box, _devices in groups]
        return [piece(tgt.box)]

    def _make(
        self, name: str, node: Node, info: TensorInfo, tgt: Target, pieces: list[_Piece]
    ) -> Any:
        full = self._elem_shape(node, info)
        obj = _adapters.BY_NAME[tgt.kind].build(node, tgt, full, pieces)
        return obj if tgt.wrap is None else tgt.wrap(obj)


def open(path: PathLike, *, mmap: bool = False, comm: Any = None, **io_options: Any) -> Reader:  # noqa: A001
    """Open the checkpoint at ``path`` for reading; see Reader.

    ``mmap=True``: tensors come back as views of private mappings of the data files, as from
    ``load(mmap=True)``; ``r[key]`` also verifies the checksums of the tensors it returns (which
    reads their pages), ``r.load()`` does not.
    ``comm``: every rank of a job opens a checkpoint in an object store at once (collective),
    the manifest read by rank 0 and sent to the others, as ``load(comm=)`` does.

    >>> import numpy as np, ckptio, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt")
    >>> _ = ckptio.save({"a": {"b": np.zeros(3)}, "lr": 0.1}, path)
    >>> with ckptio.open(path) as r:
    ...     print(r.keys(), r["lr"], r["a.b"].shape)
    ['a.b', 'lr'] 0.1 (3,)
    """
    opened = _opened_together(path, comm, mmap, io_options)
    if opened is not None:
        return opened
    return _reader_for(path, io_options.get("storage_options"))(path, mmap=mmap, **io_options)


#: Readers of layouts other than ckptio's own, tried in order: (handles(path), reader class).
#: The format front ends above this module add theirs as they load (ckptio.formats._hf: a
#: safetensors file or a Hugging Face directory).
FOREIGN_READERS: list[tuple[Callable[[PathLike, Any], bool], type[Reader]]] = []


def _reader_for(path: PathLike, storage_options: Any = None) -> type[Reader]:
    """Reader, or the foreign reader (FOREIGN_READERS) that handles ``path`` (in a store with
    these settings)."""
    for handles, reader in FOREIGN_READERS:
        if handles(path, storage_options):
            return reader
    return Reader


def load(
    path: PathLike,
    *,
    like: Any = None,
    keys: Iterable[str] | None = None,
    device: Any = None,
    framework: str | None = None,
    comm: Any = None,
    mmap: bool = False,
    into: Any = None,
    **io_options: Any,
) -> Any:
    """Load the tree saved at ``path``.

    Each tensor comes back as the kind it was saved from (numpy, torch, jax) unless
    ``framework`` ("numpy", "torch" or "jax") or ``like`` says otherwise. Each one is read
    straight into its own page-aligned memory, all in one batched read; tied tensors come
    back sharing memory.

    ``keys``: key paths to load ("model.layers.0.weight"); a path of a subtree loads all of
    it. Dicts keep only the selected keys; lists and tuples only the selected elements.
    ``like``: a tree of arrays, tensors or jax.ShapeDtypeStruct (with a sharding): the result
    has like's structure and each leaf like's kind, dtype, device or sharding (a jax array is
    read per device, only the box each device holds: any saved sharding loads into any other).
    ``device``: a torch device for torch tensors ("cpu", "cuda:0"; the GPU is reached through
    a host copy), or a jax Device or Sharding for jax arrays.
    ``comm``: on the ranks of a job (a torch.distributed ProcessGroup, an mpi4py communicator,
    "torch", "jax" or "mpi"), each rank gets its own ckptio.RankLocal values; without it, a
    ``like`` holding DTensors or jax arrays spanning processes takes the rank from their
    runtime, and otherwise RankLocal values come back as {rank: value}. Loading needs no
    exchange between ranks: each reads the boxes its ``like`` leaves hold (DTensors come back
    as DTensors with like's mesh and placements). When most of what this rank loads other ranks
    load too (replicated state, Replicate DTensors), it is read through the page cache, each
    rank of the host starting at its own 1/N, so that each byte comes off the device once
    (direct=True reads with O_DIRECT instead); the checkpoint then stays in the page cache.
    ``io_options``: as for ckptio.save (backend, direct, checksums, ...); ``roots``: where
    the stripes of a striped checkpoint are now, when not where the save recorded them.
    ``mmap=True``: return at once; each whole tensor is a view of a private (copy-on-write)
    mapping of its data file, read from disk when first touched; writes stay in this process.
    No checksum is checked (use ``ckptio.open(path, mmap=True)``: r[key] and verify() check).
    Tensors stored in pieces that are not back to back in one file are read eagerly. jax
    arrays are built from the mapping by jax.device_put, which copies on CPU devices.
    ``into``: a tree of the caller's numpy arrays and torch tensors (a state_dict()) to read
    into in place, with no new memory; every key, shape and dtype is checked before any byte
    is written. Checksums are checked as the bytes land: if the read then fails (a checksum
    mismatch, a damaged file, an I/O error, Ctrl-C), the exception's ``tensors`` lists the key
    paths of the leaves it read into directly (contiguous host memory), which may hold new,
    damaged or partly read bytes, and a CheckpointError's message names them; every other
    leaf holds what it held before (strided views and GPU tensors are copied in only after
    the whole read verified). Returns a tree of into's structure holding the same arrays and
    tensors (and the saved plain values).

    >>> import numpy as np, ckptio, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt")
    >>> _ = ckptio.save({"layers": [{"w": np.ones(2)}, {"w": np.zeros(2)}], "step": 3}, path)
    >>> ckptio.load(path, keys=["layers.1"])
    {'layers': [{'w': array([0., 0.])}]}
    """
    t0 = time.perf_counter()
    if into is not None and (mmap or like is not None or keys is not None):
        raise error(USAGE, "into= loads into the given tree: pass neither like=, keys= nor mmap=")
    share = None
    so = io_options.get("storage_options")
    opened = _opened_together(path, comm, mmap, io_options)
    if opened is None and (comm is not None or like is not None) and not mmap and into is None \
            and not _url(path):  # fmt: skip
        # (an object store has no page cache to share: each rank reads its own ranges)
        from .ranks import _share

        if _reader_for(path, so) is Reader:
            share = _share.plan(comm, like, io_options)
        if share is not None:
            io_options = dict(io_options, direct=False)  # the ranks share the page cache
    if opened is None:
        opened = _reader_for(path, so)(path, mmap=mmap, **io_options)
    with opened as r, pause_gc():
        if comm is not None or like is not None:
            from .ranks import _comm, _dist

            kind = comm if comm is not None else _dist.runtime_of(like)
            ranks = _comm.resolve(kind, collective=False) if kind != "local" else None
            r._rank = ranks.rank if ranks is not None else None
        r._share = share
        if into is not None:
            from ._into import load_into

            out = load_into(r, into)
        else:
            out = r.load(like=like, keys=keys, device=device, framework=framework)
        global _last_stats
        st = r._r.stats()
        gpu = _gpu.stats_text(r._r, _gpu.take_note())
        cache_bytes = _cache_bytes(r._r)
    _last_stats = dataclasses.replace(
        Stats._from_core(st, time.perf_counter() - t0), gpu=gpu, cache_bytes=cache_bytes
    )
    return out


def _url(path: PathLike) -> bool:
    p = os.fspath(path)
    return isinstance(p, str) and _core.store_name(p) != "posix"


def _opened_together(path: PathLike, comm: Any, mmap: bool, io_options: dict[str, Any]) -> Reader | None:
    """A checkpoint in an object store loaded with comm= by a job of several ranks: every rank
    of comm opens it at once (collective), the manifest read once by rank 0 and sent to the
    others, rather than once per rank. None to open it alone: a local path (each rank reads
    the manifest from the page cache), one process, a name that is no ckptio checkpoint's
    (safetensors), or a URL holding none (every rank is told by rank 0 and reads it as the
    foreign formats' reader does)."""
    if comm is None or comm == "local" or mmap or not _url(path):
        return None
    p = os.fspath(path)
    if p.endswith(".safetensors") or p.endswith(".safetensors.index.json"):
        return None
    from .ranks import _comm, _dist

    c = _comm.resolve(comm)
    if c is None or c.size < 2:
        return None
    try:
        return Reader(path, _comm=c, _timeout=_dist.DEFAULT_TIMEOUT, **io_options)
    except CheckpointError as e:
        if e.name == "CKPTIO_E_NOT_CHECKPOINT":
            return None
        raise


def _cache_bytes(handle: Any) -> int:
    """Bytes the library's reader took from the page cache (other readers: none)."""
    return int(handle.read_stats()[0]) if isinstance(handle, _core.Reader) else 0


_last_stats: Stats | None = None


def last_load_stats() -> Stats | None:
    """Stats of the most recent ckptio.load in this process (bytes, seconds, gbps, ...)."""
    return _last_stats
