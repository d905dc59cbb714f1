# SPDX-License-Identifier: Apache-2.0
"""Trees: flattening nested dicts/lists/tuples into key paths and the JSON "ckptio.tree" spec.

A tree is any nesting of dict (str or int keys), OrderedDict, list and tuple whose leaves are
tensors (numpy arrays and scalars, torch tensors, jax arrays) or plain values (int, float, bool,
str, None, bytes, complex). Each leaf has a key path: the keys and indices from the root joined
with "." ("model.layers.0.weight"). A tensor is stored under its key path ("." for a tree that
is a single tensor). Key paths must be unique: {"a.b": x, "a": {"b": y}} is refused, since
both leaves would be "a.b".

The structure and the plain values are stored as JSON in the metadata entry "ckptio.tree",
never pickled: floats exactly (float.hex, including nan and inf), bools apart from ints, dict
key types kept (int keys come back as ints).
"""

from __future__ import annotations

import base64
import gc
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from ._errors import CORRUPT, DUPLICATE, FORMAT, NOT_FOUND, USAGE, InvalidType, error

TREE_KEY = "ckptio.tree"
TREE_VERSION = 1

Node = dict[str, Any]

#: The framework adapters whose own values (torch.Size) a tree may hold, in the order they are
#: asked, and by the tag of their value nodes: ckptio.frameworks._registry fills both as it
#: loads, since the tree walk sits below the adapters.
VALUE_ADAPTERS: list[Any] = []
BY_VALUE_TAG: dict[str, Any] = {}


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class pause_gc:
    """Pause the cyclic garbage collector: saving or loading a big tree creates many objects
    and no cycles, and repeated full collections over them cost more than the I/O."""

    def __enter__(self) -> None:
        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self.was:
            gc.enable()


def leaf_name(path: str) -> str:
    """The tensor name a leaf at ``path`` is stored under."""
    return path if path else "."


def _key_str(key: Any, path: str) -> str:
    tp = type(key)
    if tp is str:
        return key  # type: ignore[no-any-return]
    if tp is int:
        return str(key)
    where = f" at '{path}'" if path else ""
    raise error(
        USAGE,
        f"dict key {key!r}{where} has type {tp.__name__}: ckptio trees take str or int keys",
        InvalidType,
    )


def _encode_value(obj: Any, path: str) -> Node | None:
    """JSON node of a plain value, or None if ``obj`` is not one."""
    tp = type(obj)
    if tp is bool:
        return {"t": "bool", "v": obj}
    if tp is int:
        return {"t": "int", "v": obj}
    if tp is float:
        return {"t": "float", "v": obj.hex()}
    if tp is str:
        return {"t": "str", "v": obj}
    if obj is None:
        return {"t": "none"}
    if tp is bytes:
        return {"t": "bytes", "v": base64.b64encode(obj).decode("ascii")}
    if tp is complex:
        return {"t": "complex", "v": [obj.real.hex(), obj.imag.hex()]}
    return None


def decode_value(node: Node) -> Any:
    """The plain value of a non-tensor leaf node."""
    t = node["t"]
    if t in ("int", "bool", "str"):
        return node["v"]
    if t == "float":
        return float.fromhex(node["v"])
    if t == "none":
        return None
    if t == "bytes":
        return base64.b64decode(node["v"])
    if t == "complex":
        return complex(float.fromhex(node["v"][0]), float.fromhex(node["v"][1]))
    ad = BY_VALUE_TAG.get(t)
    if ad is not None:
        return ad.decode_value(node)
    raise error(CORRUPT, f"unknown value node {t!r} in the checkpoint's tree")


def framework_value(obj: Any) -> Node | None:
    """The node of a framework's own non-tensor value (torch.Size), else None."""
    for ad in VALUE_ADAPTERS:
        node = ad.encode_value(obj)
        if node is not None:
            return node
    return None


def encode_plain(obj: Any) -> Node:
    """Encode a tree of plain values only (no tensors), e.g. OrderedDict._metadata."""
    node, _ = flatten(obj, _plain_only=True)
    return node


def flatten(
    tree: Any,
    *,
    classify: Callable[[Any], Any] | None = None,
    on_array: Callable[[str, np.ndarray], Node | int] | None = None,
    stage_dict: Callable[
        [dict[Any, Any], str, set[str]], tuple[list[Any], list[Any], list[Any], list[Any]]
    ]
    | None = None,
    _plain_only: bool = False,
) -> tuple[Any, list[tuple[str, Any, Node]]]:
    """Flatten ``tree`` into (spec root node, [(tensor name, leaf, node)]).

    ``classify(obj)`` gives the framework adapter (ckptio.frameworks) of a tensor leaf, whose
    name becomes the node's "f", or None for an object ckptio cannot store (a TypeError
    naming the path follows); exact numpy arrays are numpy's without asking.
    ``on_array(name, array)``, if given, takes every exact numpy.ndarray leaf (the saver's fast
    path) and returns its node (or NUMPY_LEAF); such leaves are not listed in the result.
    ``stage_dict(d, prefix, names)`` (the saver's C walk, ckptio._core.stage_arrays) goes
    further for dicts: it stages their arrays, and walks the plain dicts nested in them, itself,
    and returns (the keys and values it saw, children, and the entries left to Python as
    (children list, index, key, value, key prefix)); the node takes those keys, even if another
    thread changed the dict.
    """
    tensors: list[tuple[str, Any, Node]] = []
    names: set[str] = set()
    ndarray = np.ndarray

    def claim(path: str) -> str:
        name = leaf_name(path)
        if _plain_only:
            return name
        if name in names:
            raise error(
                DUPLICATE,
                f"two leaves have the key path '{name}' (a dict key containing '.' collides "
                "with a nested path); rename one of the keys",
            )
        names.add(name)
        return name

    def visit(obj: Any, path: str) -> Any:
        tp = type(obj)
        if tp is ndarray and not _plain_only:
            if on_array is not None:
                return on_array(claim(path), obj)
            node: Node = {"t": "tensor", "f": "numpy"}
            tensors.append((claim(path), obj, node))
            return node
        if tp is dict or tp is OrderedDict:
            prefix = path + "." if path else ""
            children: list[Any] = []
            append = children.append
            if stage_dict is not None and not _plain_only:
                keys, vals, children, todo = stage_dict(obj, prefix, names)
                for lst, i, k, v, pre in todo:  # nested dicts' entries too
                    lst[i] = visit(v, pre + _key_str(k, pre[:-1]))
            else:
                keys = list(obj.keys())
                for k in keys:
                    v = obj[k]
                    p = prefix + (k if type(k) is str else _key_str(k, path))
                    if on_array is not None and type(v) is ndarray:
                        # The common case of big flat state dicts, kept short.
                        if p and p not in names:
                            names.add(p)
                        else:
                            p = claim(p)
                        append(on_array(p, v))
                    else:
                        append(visit(v, p))
            if tp is dict:
                return {"t": "dict", "k": keys, "v": children}
            node = {"t": "odict", "k": keys, "v": children}
            meta = getattr(obj, "_metadata", None)
            if meta is not None:  # torch's state_dict() keeps module versions here
                node["m"] = encode_plain(meta)
            return node
        if tp is list or tp is tuple:
            prefix = path + "." if path else ""
            return {
                "t": "list" if tp is list else "tuple",
                "v": [visit(v, prefix + str(i)) for i, v in enumerate(obj)],
            }
        value = _encode_value(obj, path)
        if value is None and not _plain_only:
            value = framework_value(obj)  # a framework's own values: torch.Size
        if value is not None:
            claim(path)
            return value
        where = f"'{path}'" if path else "the root"
        if _plain_only:
            raise error(
                USAGE, f"cannot store {tp.__module__}.{tp.__qualname__} at {where}", InvalidType
            )
        ad = classify(obj) if classify is not None else None
        if ad is None:
            if isinstance(obj, tuple) and hasattr(obj, "_fields"):
                hint = "; convert the namedtuple with ._asdict()"
            elif isinstance(obj, (dict, list, tuple)):
                hint = f"; convert the {tp.__name__} subclass to a plain dict/list/tuple"
            else:
                hint = " (ckptio never pickles; store tensors and plain values)"
            raise error(
                USAGE, f"cannot store {tp.__module__}.{tp.__qualname__} at {where}{hint}", InvalidType
            )
        node = {"t": "tensor", "f": ad.name}
        tensors.append((claim(path), obj, node))
        return node

    try:
        root = visit(tree, "")
    finally:
        del visit  # it refers to itself: break the cycle so what it reached goes with the call
    return root, tensors


# A numpy array leaf with nothing else to say is written as the JSON number 0 instead of
# {"t": "tensor", "f": "numpy"}: big flat state dicts encode and parse several times faster.
# parse_document() turns it back into this node.
NUMPY_LEAF = 0
NUMPY_NODE: Node = {"t": "tensor", "f": "numpy"}


def make_document(root: Node | int) -> dict[str, Any]:
    return {"format": TREE_KEY, "version": TREE_VERSION, "root": root}


def _expand(node: Any) -> Node:
    if type(node) is int:
        if node != NUMPY_LEAF:
            raise error(CORRUPT, f"unknown leaf code {node} in the checkpoint's tree")
        return NUMPY_NODE
    if not isinstance(node, dict) or not isinstance(node.get("t"), str):
        raise error(CORRUPT, "the checkpoint's tree holds a node that is not an object")
    t = node["t"]
    if t in _CONTAINERS:
        v = node.get("v")
        if not isinstance(v, list) or (t in ("dict", "odict") and len(node.get("k", ())) != len(v)):
            raise error(CORRUPT, f"the checkpoint's tree has a malformed {t} node")
        node["v"] = [
            NUMPY_NODE if type(c) is int and c == NUMPY_LEAF else _expand(c) for c in v
        ]
    return node


def parse_document(doc: Any) -> Node:
    if not isinstance(doc, dict) or doc.get("format") != TREE_KEY or "root" not in doc:
        raise error(CORRUPT, "metadata 'ckptio.tree' is not a ckptio tree")
    if int(doc.get("version", 0)) > TREE_VERSION:
        raise error(
            FORMAT,
            f"the checkpoint's tree is version {doc['version']}; this ckptio reads up to "
            f"{TREE_VERSION}: upgrade ckptio",
        )
    return _expand(doc["root"])


_CONTAINERS = frozenset(("dict", "odict", "list", "tuple"))


def iter_leaves(root: Node, path: str = "") -> Iterator[tuple[str, Node]]:
    """(key path, node) of every leaf, tensors and values, in tree order."""
    out: list[tuple[str, Node]] = []
    append = out.append

    def visit(node: Node, p: str) -> None:
        t = node["t"]
        prefix = p + "." if p else ""
        if t == "dict" or t == "odict":
            pairs: Iterable[tuple[Any, Node]] = zip(node["k"], node["v"])
        else:
            pairs = enumerate(node["v"])
        for k, v in pairs:
            if v["t"] in _CONTAINERS:
                visit(v, prefix + str(k))
            else:
                append((prefix + str(k), v))

    try:
        if root["t"] in _CONTAINERS:
            visit(root, path)
        else:
            append((path, root))
    finally:
        del visit  # see flatten()
    return iter(out)


def find(root: Node, key: str) -> tuple[str, Node] | None:
    """The node at key path ``key`` (a leaf or a container), or None."""
    if key == "" or key == ".":
        return "", root
    node = root
    path = ""
    rest = key
    while True:
        t = node["t"]
        if t in ("dict", "odict"):
            children = zip((str(k) for k in node["k"]), node["v"])
        elif t in ("list", "tuple"):
            children = zip((str(i) for i in range(len(node["v"]))), node["v"])
        else:
            return None
        # Keys may contain "."; try every child whose key is a prefix of what is left.
        for k, child in children:
            if rest == k:
                return (path + "." + k if path else k), child
            if rest.startswith(k + "."):
                found = find(child, rest[len(k) + 1 :])
                if found is not None:
                    sub, n = found
                    full = path + "." + k if path else k
                    return (full + "." + sub if sub else full), n
        return None


def unflatten(
    root: Node,
    leaf: Callable[[str, Node], Any],
    keys: set[str] | None = None,
    *,
    base: str = "",
    value: Callable[[str, Node], Any] | None = None,
) -> Any:
    """Rebuild the tree; ``leaf(path, node)`` makes each tensor leaf.

    ``base`` is the key path of ``root``; ``value(path, node)``, if given, makes the
    non-tensor leaves too. With ``keys``, only leaves whose path is in ``keys`` or below
    one of them are kept: dicts drop the other keys, lists and tuples the other elements (so their indices shift).
    Raises TensorNotFound naming keys that matched nothing.
    """
    matched: set[str] = set()

    def visit(node: Node, path: str, selected: bool) -> Any:
        if not selected and keys is not None and path in keys:
            selected = True
            matched.add(path)
        t = node["t"]
        if t in ("dict", "odict"):
            prefix = path + "." if path else ""
            out: dict[Any, Any] = {} if t == "dict" else OrderedDict()
            for k, v in zip(node["k"], node["v"]):
                if selected and v["t"] == "tensor":  # the common leaf, without a call
                    out[k] = leaf(prefix + str(k), v)
                    continue
                val = visit(v, prefix + str(k), selected)
                if val is not MISSING:
                    out[k] = val
            if t == "odict" and "m" in node:
                out._metadata = unflatten(node["m"], _no_tensor)  # type: ignore[attr-defined]
            if not out and not selected:
                return MISSING
            return out
        if t in ("list", "tuple"):
            prefix = path + "." if path else ""
            items = [visit(v, prefix + str(i), selected) for i, v in enumerate(node["v"])]
            items = [v for v in items if v is not MISSING]
            if not items and not selected:
                return MISSING
            return items if t == "list" else tuple(items)
        if not selected:
            # A key may also name a prefix inside one leaf's path, e.g. "model.layers.0" in a
            # flat dict keyed "model.layers.0.w" (checkpoints written without a tree).
            i = path.find(".")
            while i >= 0 and not selected:
                if path[:i] in keys:  # type: ignore[operator]
                    selected = True
                    matched.add(path[:i])
                i = path.find(".", i + 1)
            if not selected:
                return MISSING
        if t == "tensor":
            return leaf(path, node)
        if value is not None:
            return value(path, node)
        return decode_value(node)

    try:
        result = visit(root, base, keys is None)
    finally:
        # visit refers to itself, and through `leaf` to every loaded tensor: without this the
        # result stays in memory after the caller drops it, until the cycle collector runs.
        del visit
    if keys is not None:
        missing = keys - matched
        if missing:
            raise error(
                NOT_FOUND,
                "no key path "
                + ", ".join(repr(k) for k in sorted(missing))
                + " in the checkpoint (keys are paths like 'model.layers.0.weight')",
            )
    if result is MISSING:
        return {}
    return result


def _no_tensor(path: str, node: Node) -> Any:
    raise error(CORRUPT, f"unexpected tensor at {path!r}")
