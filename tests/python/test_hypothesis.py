# SPDX-License-Identifier: Apache-2.0
"""Property tests: random trees of random arrays, tensors and values round trip exactly."""

from __future__ import annotations

import math
import pathlib
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import jax
import ml_dtypes
import numpy as np
import torch
from hypothesis import HealthCheck, assume, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import ckptio

NP_DTYPES = [
    np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64, np.int64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128, ml_dtypes.bfloat16,
    ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
]  # fmt: skip
TORCH_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
    torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.float8_e4m3fn,
    torch.float8_e5m2, torch.uint16,
]  # fmt: skip

PROFILE = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=9)


@st.composite
def np_arrays(draw: st.DrawFn) -> np.ndarray:
    dt = np.dtype(draw(st.sampled_from(NP_DTYPES)))
    shape = draw(shapes)
    raw = draw(st.binary(min_size=dt.itemsize * math.prod(shape), max_size=dt.itemsize * math.prod(shape)))
    a = np.frombuffer(raw, dtype=np.uint8).view(dt).reshape(shape).copy() if raw else np.zeros(shape, dt)
    if dt == np.bool_:
        a = np.asarray(a.view(np.uint8) % 2 == 1)
    if a.ndim >= 2 and draw(st.booleans()):
        a = a.swapaxes(0, 1)  # non-contiguous
    elif a.ndim >= 1 and a.shape[0] > 2 and draw(st.booleans()):
        a = a[::2]
    return a


@st.composite
def torch_tensors(draw: st.DrawFn) -> torch.Tensor:
    dt = draw(st.sampled_from(TORCH_DTYPES))
    shape = draw(shapes)
    n = math.prod(shape) * dt.itemsize
    raw = draw(st.binary(min_size=n, max_size=n))
    if dt == torch.bool:
        t = torch.tensor(list(raw), dtype=torch.uint8).reshape(shape) % 2 == 1
    else:
        t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dt).reshape(shape) if n else torch.zeros(shape, dtype=dt)
    if t.ndim >= 2 and draw(st.booleans()):
        t = t.transpose(0, 1)
    return t


@st.composite
def jax_arrays(draw: st.DrawFn) -> jax.Array:
    a = np.ascontiguousarray(draw(np_arrays()))
    if a.dtype in (np.uint64, np.int64, np.float64, np.complex128):  # jax defaults to 32 bits
        with np.errstate(all="ignore"):
            a = a.astype({"u": np.uint32, "i": np.int32, "f": np.float32, "c": np.complex64}[a.dtype.kind])
    return jax.device_put(a, jax.devices()[draw(st.integers(0, 7))])


values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.complex_numbers(allow_nan=False),
)
leaves = st.one_of(values, np_arrays(), torch_tensors(), jax_arrays())
keys = st.one_of(
    st.text(alphabet="abcxyz_0123", min_size=0, max_size=4), st.integers(-3, 50)
)


def trees() -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.lists(children, max_size=4).map(tuple),
            st.dictionaries(keys, children, max_size=4),
        ),
        max_leaves=12,
    )


def paths(tree: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(tree, dict):
        items: Any = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        yield prefix
        return
    for k, v in items:
        yield from paths(v, f"{prefix}.{k}" if prefix else str(k))


def unique_paths(tree: Any) -> bool:
    ps = list(paths(tree))
    return len(ps) == len(set(ps))


def bits(x: Any) -> tuple[Any, ...]:
    if isinstance(x, torch.Tensor):
        c = x.contiguous()
        b = c.numpy().tobytes() if c.dtype == torch.bool else c.reshape(-1).view(torch.uint8).numpy().tobytes()
        return ("torch", c.dtype, tuple(c.shape), b)
    if isinstance(x, jax.Array):
        return ("jax", x.dtype, x.shape, np.asarray(x).tobytes(), x.sharding)
    if isinstance(x, np.ndarray):
        return ("numpy", x.dtype, x.shape, np.ascontiguousarray(x).tobytes())
    if isinstance(x, float):
        return ("float", x.hex() if not math.isnan(x) else "nan")
    if isinstance(x, complex):
        return ("complex", x.real.hex(), x.imag.hex())
    return (type(x), x)


def assert_same(a: Any, b: Any) -> None:
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert bits(a) == bits(b), (a, b)


def scratch() -> pathlib.Path:
    return pathlib.Path(tempfile.mkdtemp(prefix="ckptio-hyp-")) / "ckpt"


@PROFILE
@given(trees())
def test_random_trees_round_trip(tree: Any) -> None:
    assume(unique_paths(tree))  # key-path collisions are refused; test_numpy covers that
    path = scratch()
    try:
        ckptio.save(tree, path, fsync=False)
        assert_same(ckptio.load(path), tree)
    finally:
        shutil.rmtree(path.parent)


@PROFILE
@given(st.dictionaries(st.text(alphabet="abc", min_size=1, max_size=3), np_arrays(), min_size=1, max_size=6), st.data())
def test_random_key_subsets(tree: dict[str, np.ndarray], data: st.DataObject) -> None:
    chosen = data.draw(st.lists(st.sampled_from(sorted(tree)), min_size=1, unique=True))
    path = scratch()
    try:
        ckptio.save(tree, path, fsync=False)
        out = ckptio.load(path, keys=chosen)
        assert list(out) == [k for k in tree if k in chosen]
        for k in chosen:
            assert_same(out[k], tree[k].copy(order="C"))
    finally:
        shutil.rmtree(path.parent)


@st.composite
def array_and_region(draw: st.DrawFn) -> tuple[np.ndarray, tuple[Any, ...]]:
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=12))
    a = np.arange(math.prod(shape), dtype=np.int32).reshape(shape)
    region = []
    for dim in shape:
        if draw(st.booleans()):
            region.append(draw(st.integers(-dim, dim - 1)))
        else:
            start = draw(st.one_of(st.none(), st.integers(-dim - 2, dim + 2)))
            stop = draw(st.one_of(st.none(), st.integers(-dim - 2, dim + 2)))
            step = draw(st.one_of(st.none(), st.integers(1, 4)))
            region.append(slice(start, stop, step))
    return a, tuple(region)


@PROFILE
@given(array_and_region())
def test_reader_read_matches_numpy_indexing(case: tuple[np.ndarray, tuple[Any, ...]]) -> None:
    a, region = case
    path = scratch()
    try:
        ckptio.save({"a": a}, path, fsync=False)
        with ckptio.open(path) as r:
            got = r.read("a", region)
        assert np.array_equal(got, a[region]) and got.shape == a[region].shape
    finally:
        shutil.rmtree(path.parent)
