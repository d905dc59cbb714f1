# SPDX-License-Identifier: Apache-2.0
"""Framework adapters' common ground: the Adapter protocol and the records adapters exchange with
the save and load paths (Target, Deferred, Aliases), one adapter object per framework.

Saving asks each adapter, in REGISTRY order (ckptio.frameworks._registry), whether it
``matches`` a leaf; the one that does describes the leaf in its tree node, names its alias key (tied tensors), and stages it: host
buffers the writer streams from (AddItem records of ckptio._core). Loading asks the adapter
named by the caller (``framework=``, a ``like=`` leaf, or the saved node's "f") for a target
(dtype, placement) and builds the object from the bytes read. Adapters for torch and jax never
import their framework: a leaf can only be a torch tensor if torch is already imported.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .. import _dtypes
from .._errors import USAGE, error

Node = dict[str, Any]
Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offset, shape)


@dataclass
class Deferred:
    """Host buffers that are made only when written: ``make()`` returns the AddItem records
    (e.g. a device tensor's host copy, ``nbytes`` of memory that the writer releases after
    each batch, so a save never holds a second copy of a whole GPU model)."""

    nbytes: int
    make: Callable[[], list[Any]]


class Target:
    """How one tensor leaf is to be built: framework, dtype, placement, box.

    ``dtype`` is the framework's dtype (numpy for numpy and jax, torch for torch);
    ``place`` the torch device or jax sharding; ``place_key`` a hashable stand-in for it;
    ``cast`` a dtype to convert to after reading; ``box`` the region of the tensor to read;
    ``wrap`` a function applied to the built object (a DTensor made from the local box).
    """

    __slots__ = ("kind", "dtype", "place", "place_key", "cast", "box", "wrap")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.dtype: Any = None
        self.place: Any = None
        self.place_key: Any = None
        self.cast: Any = None
        self.box: Box | None = None
        self.wrap: Any = None


class Adapter(Protocol):
    """One framework (see the module's docstring)."""

    #: The framework's name, stored as the tensor node's "f".
    name: str
    #: Tags of the plain-value nodes this adapter encodes (e.g. "torch.Size").
    value_tags: tuple[str, ...]

    # ---- save ----
    def matches(self, obj: Any) -> bool:
        """Whether ``obj`` is a tensor of this framework (never imports it)."""

    def encode_value(self, obj: Any) -> Node | None:
        """The node of a non-tensor value of this framework (torch.Size), else None."""

    def describe(self, name: str, obj: Any, node: Node) -> None:
        """Check that tensor ``obj`` can be stored; record what rebuilding it needs in
        ``node`` (dtype, parameter, device, sharding...). Called for aliases too."""

    def alias_key(self, obj: Any) -> Hashable | None:
        """A key equal for two leaves that are the same view of the same memory, or None."""

    def stage(self, name: str, obj: Any, node: Node) -> list[Any] | Deferred:
        """The AddItem records to write ``obj`` from (host buffers), or a Deferred."""

    # ---- load ----
    def decode_value(self, node: Node) -> Any:
        """The value of a node tagged with one of ``value_tags``."""

    def matches_like(self, obj: Any) -> bool:
        """Whether ``obj`` is a like= leaf asking for this framework."""

    def like_spec(self, like: Any) -> tuple[Any, tuple[int, ...]]:
        """(dtype, shape) a like= leaf of this framework asks for."""

    def owns_device(self, device: Any) -> bool:
        """Whether load's ``device=`` is meant for this framework."""

    def saved_np_dtype(self, node: Node) -> np.dtype[Any]:
        """The numpy dtype of a tensor this adapter saved as raw bytes (node["dtype"])."""

    def target(
        self, tgt: Target, node: Node, info: Any, like: Any, device: Any, region: bool
    ) -> None:
        """Fill ``tgt``: dtype, cast (``like``'s dtype), placement (``like``, ``device``, or
        what the node saved); ``region``: a part of the tensor is read (Reader.read)."""

    def boxes(self, tgt: Target, shape: tuple[int, ...]) -> list[tuple[Box, Any]] | None:
        """The boxes to read separately (jax: one per group of devices), or None for one."""

    def build(self, node: Node, tgt: Target, shape: tuple[int, ...], pieces: list[Any]) -> Any:
        """The loaded object of full shape ``shape`` from the pieces read (``piece.buf`` at
        ``piece.at``: one per box of boxes(), or one)."""

    def alias_view(self, base: Any, node: Node) -> Any:
        """A second object sharing ``base``'s memory, for a tied tensor."""


class Aliases:
    """Tied tensors: the first leaf with a given alias key is stored; each later one becomes
    an alias node naming it (with "same" when it is the very same object).

    The C loop over dicts of numpy arrays (ckptio._core.stage_arrays) records its arrays here
    too, in ``first`` under the numpy adapter's key, id(array); it leaves a repeated array to
    Python, so tie() decides every alias.
    """

    __slots__ = ("first", "objs")

    def __init__(self) -> None:
        self.first: dict[Hashable, str] = {}
        self.objs: dict[Hashable, Any] = {}

    def tie(self, key: Hashable, name: str, obj: Any, node: Node) -> bool:
        """Whether leaf ``obj`` (tensor ``name``, alias key ``key``) repeats an earlier one; if
        so ``node`` names that one ("alias") and says whether it is the same object ("same")."""
        prev = self.first.setdefault(key, name)
        if prev is name:
            if type(key) is not int:  # identity keys (numpy's) stand for the object itself
                self.objs[key] = obj
            return False
        node["alias"] = prev
        if self.objs.get(key, obj) is obj:
            node["same"] = True
        return True


def np_view(piece: Any, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
    """A load piece's memory (``piece.buf`` at ``piece.at``) as a numpy array."""
    if piece.buf is None:
        return np.empty(shape, dtype)
    return np.ndarray(shape, dtype, piece.buf, piece.at)


#: Every adapter by name (a saved node's "f"): ckptio.frameworks._registry fills it as it loads.
BY_NAME: dict[str, Adapter] = {}


def get(name: str) -> Adapter:
    """The adapter of framework ``name`` (a saved node's "f")."""
    ad = BY_NAME.get(name)
    if ad is None:
        raise error(USAGE, f"unknown framework {name!r}; known: {', '.join(BY_NAME)}")
    return ad


def np_dtype(node: Node, info: Any) -> np.dtype[Any]:
    """The numpy dtype to load stored tensor ``info`` (tree node ``node``) as: a dtype stored
    as raw bytes is named in the node, as the adapter that saved it writes it."""
    if info.code == _dtypes.BYTES and node.get("dtype") is not None:
        return get(node.get("f", "numpy")).saved_np_dtype(node)
    return _dtypes.np_for_code(info.code)
