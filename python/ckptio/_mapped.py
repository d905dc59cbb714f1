# SPDX-License-Identifier: Apache-2.0
"""Mapped loads (``mmap=True``): tensors that are views of private mappings of the data files.

Each data file is mapped once, whole, MAP_PRIVATE (copy on write), a striped checkpoint's
from its stripe directory (found in the roots= given, then where the save recorded it): a
tensor whose stored bytes are one contiguous run of one file in the tensor's own order (one
chunk, or chunks split along the first dimension stored back to back) is a view of that
mapping, and its pages are read when first touched. Writes to such a tensor stay in this
process. Every other tensor (chunks split along another dimension or spread over files, a
stored offset that is not a multiple of the element size) is read into fresh memory as an
eager load reads it.

Replacement: the mapper holds the checkpoint's directory open, and a checkpoint that a later
save replaces (by a rename) keeps its files alive while they are mapped: the views keep the old
bytes. A data file written in place (ckptio never does so) is found by ``Reader.verify()``.
"""

from __future__ import annotations

import mmap as _mmap
import os
from typing import Any

from . import _core, _dtypes
from ._errors import STATE, Unsupported, error


class Mapped:
    """The mapped side of a Reader opened with ``mmap=True``."""

    __slots__ = ("mapper", "maps", "views", "checked")

    def __init__(self, mapper: Any) -> None:
        self.mapper = mapper
        self.maps: dict[int, _mmap.mmap] = {}  # data file descriptor -> its mapping
        # tensor index -> (mapping, offset) of its one view, or None: read it instead.
        self.views: dict[int, tuple[_mmap.mmap, int] | None] = {}
        self.checked: set[int] = set()

    @staticmethod
    def open_reader(path: str, params: Any, roots: list[str]) -> tuple[Any, Mapped]:
        """A C reader and a mapper of the same checkpoint, both looking for a striped
        checkpoint's stripes in ``roots`` first. The mapper opens the directory first; if
        ``path`` still names it once the reader has opened, the reader read the same manifest
        (a directory replaced at ``path`` never comes back: its inode stays held)."""
        for _ in range(3):
            mapper = _core.Mapper(path)
            if roots:
                mapper.set_roots(tuple(os.fsencode(p) for p in roots))
            r = _core.Reader(path, params)
            if mapper.same(path):
                return r, Mapped(mapper)
            r.close()
            mapper.close()
        raise error(STATE, f"{path}: the checkpoint was replaced three times while opening it")

    def close(self) -> None:
        # The mappings stay: the tensors that view them own them.
        self.mapper.close()

    def view(
        self,
        r: Any,
        index: int,
        code: int,
        shape: tuple[int, ...],
        nbytes: int = -1,
        n_chunks: int = 0,
    ) -> Any:
        """(mapping, offset) where tensor ``index`` lies as one view, or None. ``nbytes`` and
        ``n_chunks`` (from the manifest, when the caller has them) let a tensor stored as one
        chunk skip the chunk records."""
        if index in self.views:
            return self.views[index]
        item = shape[-1] if code == _dtypes.BYTES else _dtypes.ITEMSIZE[code]
        if n_chunks == 1 and nbytes >= 0:
            # The common case, one chunk holding the whole tensor: stored as is when its stored
            # size is the tensor's.
            try:
                fd, off, n = self.mapper.chunk(index, 0)
            except Unsupported:  # stored compressed: its file bytes are not its data
                self.views[index] = None
                return None
            got = (self._map(fd), off) if n == nbytes and off % min(item, 16) == 0 else None
            self.views[index] = got
            return got
        # (chunk position, record) in the tensor's order: by offset along the first dimension.
        chunks = sorted(enumerate(r.chunks(index)), key=lambda ic: ic[1].offset)
        ok = bool(chunks) and all(c.stored_bytes == c.nbytes for _, c in chunks)
        if ok and len(chunks) > 1:
            # Back to back in one file, each a slab of whole rows: the file holds the tensor.
            at = chunks[0][1].file_offset
            for _, c in chunks:
                if (
                    c.file != chunks[0][1].file
                    or c.file_offset != at
                    or tuple(c.shape[1:]) != tuple(shape[1:])
                    or any(c.offset[1:])
                ):
                    ok = False
                    break
                at += c.stored_bytes
        got = None
        if ok:
            try:
                fd, off, _n = self.mapper.chunk(index, chunks[0][0])
            except Unsupported:
                fd, off = -1, -1
            if fd >= 0 and off % min(item, 16) == 0:  # the format aligns extents to 64 bytes at least
                got = (self._map(fd), off)
        self.views[index] = got
        return got

    def _map(self, fd: int) -> _mmap.mmap:
        m = self.maps.get(fd)
        if m is None:
            m = _mmap.mmap(fd, 0, access=_mmap.ACCESS_COPY)
            self.maps[fd] = m
        return m

    def check(self, r: Any, index: int) -> None:
        """Verify tensor ``index``'s mapped bytes against its stored checksums, once."""
        if index in self.checked:
            return
        got = self.views.get(index)
        if got is None:
            return  # read, not mapped: checked as it was read
        mm = got[0]
        for c in range(len(r.chunks(index))):
            _fd, off, n = self.mapper.chunk(index, c)
            with memoryview(mm)[off : off + n] as v:
                self.mapper.check(index, c, v)
        self.checked.add(index)


def verify_all(mapped: Mapped, r: Any) -> None:
    """Check every chunk of every tensor through the descriptors the mapper holds (so a
    checkpoint replaced meanwhile is checked as it was mapped), each file mapped afresh
    read-only: the check is of the bytes on disk, not of writes made to the tensors."""
    mapped.mapper.unchanged()
    maps: dict[int, _mmap.mmap] = {}
    coded = False
    try:
        for index, t in enumerate(r.tensors()):
            for c in range(t.num_chunks):
                try:
                    fd, off, n = mapped.mapper.chunk(index, c)
                except Unsupported:  # compressed: verified by decoding, below
                    coded = True
                    continue
                if n == 0:
                    continue
                mm = maps.get(fd)
                if mm is None:
                    mm = maps[fd] = _mmap.mmap(fd, 0, access=_mmap.ACCESS_READ)
                with memoryview(mm)[off : off + n] as v:
                    mapped.mapper.check(index, c, v)
    finally:
        for mm in maps.values():
            mm.close()
    if coded:
        r.verify()


def placer(
    mapped: Mapped, r: Any, raw: dict[int, tuple[int, tuple[int, ...], int, int]], alloc: Any
) -> Any:
    """A replacement for _Alloc.place: whole tensors that can be views land in their mapping
    (nothing read), every other piece is placed for the batched read. ``raw``: tensor index
    -> (dtype code, shape, nbytes, number of chunks)."""
    place = alloc.place

    def place_mapped(
        index: int, offset: tuple[int, ...] | None, shape: tuple[int, ...] | None, n: int
    ) -> tuple[Any, int]:
        if offset is None and shape is None and n > 0:
            code, full, nbytes, n_chunks = raw[index]
            got = mapped.view(r, index, code, full, nbytes, n_chunks)
            if got is not None:
                return got
        return place(index, offset, shape, n)

    return place_mapped
