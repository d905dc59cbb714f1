# SPDX-License-Identifier: Apache-2.0
"""ckptio.load / ckptio.open on safetensors: one file, or a Hugging Face directory of shards.

The library's reader opens them (``_core.open_foreign``: ckptio_reader_open_foreign parses
every header and the index in C and serves each tensor as one chunk), so keys=, like= (numpy,
torch, jax leaves, dtypes, devices, shardings, DTensors), Reader.read(key, region) and stats
work as for a ckptio checkpoint, through the same planner and reads.

The tree is flat, name -> tensor, as safetensors stores it and as ckptio.load returns a
checkpoint written without a tree (by the C API): key paths select the same leaves either way
("model.layers.0" selects every tensor below it), the result is what ``load_state_dict``
takes, and names like "a" and "a.b" that a nested tree could not hold both stay loadable.
Tensors load as torch tensors when the header's metadata says ``"format": "pt"``, as jax
arrays for "flax" or "jax", and as numpy arrays otherwise (``framework=`` overrides).
"""

from __future__ import annotations

import os
from typing import Any

from .. import _core, _dtypes, _load
from .._errors import DTYPE, error
from .._load import PathLike, Reader, TensorInfo
from .._options import store
from .._stage import is_url
from .._tree import Node

__all__ = ["handles", "HFReader", "INDEX_NAME"]

#: The index of a sharded save_pretrained: {"metadata": {...}, "weight_map": {name: file}}.
INDEX_NAME = "model.safetensors.index.json"
_INDEX_SUFFIX = ".safetensors.index.json"
_FORMAT_FW = {"pt": "torch", "torch": "torch", "flax": "jax", "jax": "jax"}

#: The 8-bit safetensors dtypes ckptio has no code for (its reader serves them as bytes), by
#: the name torch and ml_dtypes give each. F4 and F6_* pack elements below a byte: not loadable.
NO_CODE: dict[str, str] = {
    "F8_E8M0": "float8_e8m0fnu", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
}  # fmt: skip


def handles(path: Any, storage_options: Any = None) -> bool:
    """Whether ``path`` is a safetensors file, a ``*.safetensors.index.json``, or a directory
    of safetensors files that is not a ckptio checkpoint (in an object store: with these
    settings, ckptio.save's storage_options)."""
    try:
        p = os.fspath(path)
    except TypeError:
        return False
    if isinstance(p, bytes):
        return False
    if is_url(p):  # an object store: a file by its name, else a prefix
        if p.endswith(".safetensors") or p.endswith(_INDEX_SUFFIX):
            return True
        return not _core.is_checkpoint(p, store(storage_options))
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


def _unsupported(path: str, name: str, st: str) -> Exception:
    return error(
        DTYPE, f"{path}: tensor '{name}' has safetensors dtype {st}, which packs elements below a "
        "byte; ckptio cannot load it",
    )  # fmt: skip


class HFReader(Reader):
    """ckptio.open() of a safetensors file or a Hugging Face directory (see the module)."""

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
        return _core.open_foreign(path, p)

    def _tree(self) -> Node:
        self._check_open()
        if self._root is None:
            fmt = self._r.get_meta("format")
            fw = _FORMAT_FW.get(fmt.decode("utf-8", "replace") if fmt else "", "numpy")
            names, nodes = [], []
            for r, st in zip(self._r.tensors(), self._r.st_dtypes()):
                node: Node = {"t": "tensor", "f": fw}
                if r.dtype == _dtypes.BYTES:  # no ckptio code: raw bytes, the dtype named here
                    if st not in NO_CODE:
                        node["unsupported"] = st
                    elif fw == "torch":
                        node["dtype"] = NO_CODE[st]
                    else:
                        node["dtype"] = "ml_dtypes:" + NO_CODE[st]
                names.append(r.name)
                nodes.append(node)
            self._root = {"t": "dict", "k": names, "v": nodes}
        return self._root

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
            raise _unsupported(self.path, info.name, node["unsupported"])
        return super()._target(node, info, like, framework, device, region)


_load.FOREIGN_READERS.append((handles, HFReader))
