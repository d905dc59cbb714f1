# SPDX-License-Identifier: Apache-2.0
"""load(into=tree): read straight into the arrays and tensors the caller already owns.

Every leaf is checked against the checkpoint first (key present, a tensor there, shape and
dtype equal, memory writable): nothing is written unless all of them match. Then one batched
read lands in the caller's memory: C-contiguous host memory is the read's destination as it is
(O_DIRECT into it where its address is aligned; otherwise, as for the memory torch and numpy
allocate, 64 and 16 bytes past a page, through the library's bounce buffers: one copy at
memory speed); other leaves (strided views, torch tensors on a GPU) are read into a
staging buffer and copied once the whole read has verified.

Checksums are checked as the bytes land, not before: a verified copy of the whole tree first
would double the memory of the load. So a read that fails (a checksum mismatch, a damaged
file, an I/O error, an interrupt) may leave new or damaged bytes in the leaves it reads into
directly; its exception's ``tensors`` names them (see _written_by_failure) and every other
leaf is untouched.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _core
from ._errors import SHAPE, USAGE, CheckpointError, error
from ._tree import Node, find, flatten, iter_leaves, unflatten
from .frameworks._base import np_dtype

_CONTAINERS = ("dict", "odict", "list", "tuple")


def _torch_bytes(t: Any) -> Any:
    """A contiguous CPU tensor's memory as a writable flat uint8 numpy array (no copy)."""
    import torch

    return t.detach().reshape(-1).view(torch.uint8).numpy()


def _kind(obj: Any) -> str:
    if isinstance(obj, np.ndarray):
        return "numpy"
    from .frameworks._jax import is_array
    from .frameworks._torch import TORCH

    if TORCH.matches(obj):
        return "torch"
    if is_array(obj):
        return "jax"
    return "other"


def _expected(kind: str, node: Node, info: Any) -> Any:
    """The dtype the checkpoint's tensor has, in the leaf's framework."""
    if kind == "torch":
        from .frameworks._torch import stored_dtype

        return stored_dtype(node, info)
    return np_dtype(node, info)


def load_into(r: Any, into: Any) -> Any:
    """Fill ``into``'s arrays and tensors from reader ``r``; see ckptio.load(into=)."""
    from .ranks._dist import classify_like

    root, leaves = flatten(into, classify=classify_like)
    objs = {(name if name != "." else ""): obj for name, obj, _ in leaves}
    saved: dict[str, Node] = {}
    jobs: list[tuple[str, Any, Any, int]] = []  # (path, leaf, info, nbytes)
    fresh: dict[str, tuple[Node, None]] = {}  # tensors saved where into holds a plain value
    bad: list[str] = []
    tree = r._tree()
    for path, _lnode in iter_leaves(root):
        key = path if path else "."
        found = find(tree, key)
        if found is None or found[1]["t"] in _CONTAINERS:
            raise r._not_found(key)
        saved[path] = found[1]
        if found[1]["t"] != "tensor":
            continue
        obj = objs.get(path)
        kind = _kind(obj) if obj is not None else "other"
        if kind == "other" or isinstance(obj, np.generic):
            fresh[path] = (found[1], None)
            continue
        if kind == "jax":
            raise error(
                USAGE,
                f"into=: '{key}' is a jax array, and jax arrays cannot be written in place; "
                "load with like= instead (ckptio.load(path, like=tree))",
            )
        info = r.info(key)
        real = r._tensor_nodes().get(info.name, found[1])
        want_shape = r._elem_shape(real, info)
        want_dtype = _expected(kind, real, info)
        shape = tuple(obj.shape)
        if shape != want_shape or obj.dtype != want_dtype:
            bad.append(
                f"'{key}': into= has {kind} {obj.dtype} {shape}, the checkpoint {want_dtype} "
                f"{want_shape}"
            )
            continue
        if kind == "numpy" and not obj.flags.writeable:
            raise error(USAGE, f"into=: array '{key}' is read-only")
        if kind == "torch" and (obj.is_conj() or obj.is_neg()):
            raise error(USAGE, f"into=: tensor '{key}' is a lazy conjugate or negation view")
        jobs.append((path, obj, info, info.nbytes))
    if bad:
        # ShapeMismatch for dtypes too: the caller's buffers do not fit the checkpoint.
        raise error(
            SHAPE,
            f"{r.path}: into= does not match the checkpoint, nothing was loaded: "
            + "; ".join(bad[:8])
            + (f"; and {len(bad) - 8} more" if len(bad) > 8 else ""),
        )

    regions = []
    copies: list[tuple[Any, Any, str]] = []  # (leaf, staging buffer, key path)
    written: list[str] = []  # key paths of the leaves the read lands in, in into's order
    for path, obj, info, n in jobs:
        if n == 0:
            continue
        dst = _direct_dst(obj)
        if dst is None:
            dst = _core.Buffer(n)
            copies.append((obj, dst, path))
        else:
            written.append(path)
        regions.append(_core.read_region(info.index, None, None, dst, 0, n))
    # Checked as they land: a staged copy of the whole tree first would double the memory of
    # the load. What a failure leaves is named instead: the leaves read into directly, and
    # those copied back before it; the other leaves were never touched.
    try:
        if regions:
            r._r.read(regions)
        for obj, buf, path in copies:
            written.append(path)
            _copy_back(obj, buf)
    except BaseException as e:
        raise _written_by_failure(e, written) from None
    built = r._build(fresh) if fresh else {}

    def leaf(path: str, node: Node) -> Any:
        if path in objs and path not in fresh:
            return objs[path]
        if path in built:
            return built[path]
        return r._value(path, saved[path])

    return unflatten(root, leaf, value=leaf)


def _written_by_failure(e: BaseException, written: list[str]) -> BaseException:
    """``e``, saying which leaves of into= it may have left changed: ``e.tensors`` holds their
    key paths, and a CheckpointError's message names them too (the first eight)."""
    keys = tuple(p if p else "." for p in written)
    if isinstance(e, CheckpointError):
        shown = ", ".join(f"'{k}'" for k in keys[:8])
        shown += f" and {len(keys) - 8} more" if len(keys) > 8 else ""
        held = (
            f"these leaves of into= may hold new, damaged or partly read bytes: {shown}; "
            "every other leaf holds what it held before"
            if keys
            else "no leaf of into= was written"
        )
        new = type(e)(f"{e}; {held}", e.code, e.name)
        new.__traceback__ = e.__traceback__
        e = new
    setattr(e, "tensors", keys)  # noqa: B010: no exception class declares it
    return e


def _direct_dst(obj: Any) -> Any:
    """The leaf's own memory as a writable flat byte buffer, or None when it needs a copy."""
    if isinstance(obj, np.ndarray):
        if obj.flags.c_contiguous and obj.flags.writeable:
            return obj.reshape(-1).view(np.uint8)
        return None
    if obj.device.type == "cpu" and obj.is_contiguous():
        return _torch_bytes(obj)
    return None


def _copy_back(obj: Any, buf: Any) -> None:
    if isinstance(obj, np.ndarray):
        np.copyto(obj, np.ndarray(obj.shape, obj.dtype, buf, 0))
        return
    import torch

    src = torch.frombuffer(buf, dtype=torch.uint8, count=len(buf))
    with torch.no_grad():
        obj.copy_(src.view(obj.dtype).view(obj.shape))
