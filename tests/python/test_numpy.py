# SPDX-License-Identifier: Apache-2.0
"""numpy trees and plain values through ckptio.save / ckptio.load / ckptio.open."""

from __future__ import annotations

import collections
import math
import pathlib

import ml_dtypes
import numpy as np
import pytest

import ckptio

from conftest import leftovers

NUMERIC = [
    np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64,
    np.int64, np.float16, np.float32, np.float64, np.complex64, np.complex128,
    ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
]  # fmt: skip


def sample(dtype: object, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    return (rng.standard_normal(shape) * 4).astype(dt)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality (nan-safe), dtype and shape included."""
    return (
        type(a) is type(b)
        and a.dtype == b.dtype
        and a.shape == b.shape
        and a.tobytes() == b.tobytes()
    )


@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: np.dtype(d).name)
def test_every_numeric_dtype_round_trips(ckpt: pathlib.Path, dtype: object) -> None:
    tree = {"scalar": sample(dtype, ()), "vec": sample(dtype, (7,)), "big": sample(dtype, (64, 129))}
    ckptio.save(tree, ckpt)
    out = ckptio.load(ckpt)
    for k in tree:
        assert same(out[k], tree[k]), k


def test_loaded_arrays_are_aligned_writeable_and_own_one_copy(ckpt: pathlib.Path) -> None:
    tree = {"a": np.arange(100_000, dtype=np.float32), "b": np.ones((3, 5000))}
    ckptio.save(tree, ckpt)
    out = ckptio.load(ckpt)
    for v in out.values():
        assert v.ctypes.data % 4096 == 0
        assert v.flags.writeable and v.flags.c_contiguous
        # The array views the memory the read landed in: no second copy is held anywhere.
        assert isinstance(v.base, ckptio._core.Buffer)
        assert len(v.base) == v.nbytes
    out["a"][0] = 42
    assert out["a"][0] == 42


def test_values_round_trip_exactly(ckpt: pathlib.Path) -> None:
    values = {
        "int": 3,
        "big": 2**100,
        "neg": -(2**70),
        "true": True,
        "false": False,
        "zero": 0,
        "float": 0.1,
        "nzero": -0.0,
        "tiny": 5e-324,
        "inf": math.inf,
        "ninf": -math.inf,
        "nan": math.nan,
        "none": None,
        "str": "héllo ☃\n\x00",
        "empty": "",
        "bytes": b"\x00\xffab",
        "complex": 1.5 - 2j,
        "tuple": (1, (2.5, None), []),
        "list": [[], {}, ()],
        5: "int key",
        -1: "negative int key",
    }
    ckptio.save(values, ckpt)
    out = ckptio.load(ckpt)
    assert list(out) == list(values)
    for k, v in values.items():
        assert type(out[k]) is type(v), k
        if isinstance(v, float) and math.isnan(v):
            assert math.isnan(out[k])
        elif isinstance(v, float):
            assert out[k].hex() == v.hex()
        else:
            assert out[k] == v, k


def test_containers_keep_their_types(ckpt: pathlib.Path) -> None:
    od = collections.OrderedDict([("b", np.zeros(2)), ("a", 1)])
    od._metadata = {"": {"version": 2}}  # type: ignore[attr-defined]
    tree = [od, (np.ones(1), [np.arange(3)]), {}]
    ckptio.save(tree, ckpt)
    out = ckptio.load(ckpt)
    assert type(out) is list and type(out[0]) is collections.OrderedDict
    assert list(out[0]) == ["b", "a"] and out[0]._metadata == {"": {"version": 2}}
    assert type(out[1]) is tuple and type(out[1][1]) is list
    assert out[2] == {}


def test_single_array_tree(ckpt: pathlib.Path) -> None:
    a = np.arange(10)
    ckptio.save(a, ckpt)
    assert same(ckptio.load(ckpt), a)
    with ckptio.open(ckpt) as r:
        assert r.keys() == ["."]
        assert same(r["."], a)


def test_noncontiguous_byteswapped_and_scalars(ckpt: pathlib.Path) -> None:
    base = np.arange(60, dtype=np.float64).reshape(6, 10)
    tree = {
        "strided": base[::2, 1::3],
        "transposed": base.T,
        "fortran": np.asfortranarray(base),
        "bigendian": np.arange(5, dtype=">i4"),
        "np_scalar": np.float32(1.5),
        "np_int": np.int64(-3),
        "zero_size": np.zeros((0, 4), np.int16),
    }
    ckptio.save(tree, ckpt)
    out = ckptio.load(ckpt)
    for k in ("strided", "transposed", "fortran"):
        assert np.array_equal(out[k], tree[k]) and out[k].flags.c_contiguous
    assert out["bigendian"].dtype == np.dtype("<i4")
    assert np.array_equal(out["bigendian"], tree["bigendian"])
    assert type(out["np_scalar"]) is np.float32 and out["np_scalar"] == 1.5
    assert type(out["np_int"]) is np.int64 and out["np_int"] == -3
    assert out["zero_size"].shape == (0, 4) and out["zero_size"].dtype == np.int16


def test_other_fixed_size_dtypes_are_stored_as_bytes(ckpt: pathlib.Path) -> None:
    tree = {
        "dates": np.array(["2024-01-01", "1970-01-02"], dtype="datetime64[D]"),
        "delta": np.array([1, -5], dtype="timedelta64[ms]"),
        "text": np.array(["ab", "ĉde"]),
        "raw": np.array([b"xy", b"z"]),
        "int4": np.array([1, -2, 7], dtype=ml_dtypes.int4),
        "longdouble": np.array([1.0, 2.5], dtype=np.longdouble),
    }
    ckptio.save(tree, ckpt)
    out = ckptio.load(ckpt)
    for k, v in tree.items():
        assert out[k].dtype == v.dtype, k
        assert out[k].tobytes() == v.tobytes(), k


def test_object_arrays_are_refused(ckpt: pathlib.Path) -> None:
    with pytest.raises(ckptio.UnsupportedDtype, match="'obj'"):
        ckptio.save({"obj": np.array([{}, None])}, ckpt)
    assert not ckpt.exists() and not leftovers(ckpt.parent)


def test_same_array_twice_is_stored_once(ckpt: pathlib.Path) -> None:
    a = np.arange(5000, dtype=np.float32)
    st = ckptio.save({"x": a, "y": [a]}, ckpt)
    assert st.bytes == a.nbytes
    out = ckptio.load(ckpt)
    assert out["x"] is out["y"][0]
    with ckptio.open(ckpt) as r:
        assert list(r.tensors()) == ["x"]
        assert same(r["y.0"], a)


def test_key_path_collisions_are_refused(ckpt: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="'a.b'"):
        ckptio.save({"a.b": np.zeros(1), "a": {"b": np.ones(1)}}, ckpt)
    with pytest.raises(ValueError, match="'1'"):
        ckptio.save({1: 0, "1": 2}, ckpt)
    assert not ckpt.exists()


def test_dots_in_keys_without_collision_work(ckpt: pathlib.Path) -> None:
    tree = {"layer.0": {"w": np.ones(2)}, "layer": {"1": {"w": np.zeros(2)}}}
    ckptio.save(tree, ckpt)
    out = ckptio.load(ckpt)
    assert np.array_equal(out["layer.0"]["w"], np.ones(2))
    with ckptio.open(ckpt) as r:
        assert r.keys() == ["layer.0.w", "layer.1.w"]
        assert np.array_equal(r["layer.0.w"], np.ones(2))
        assert np.array_equal(r["layer.1.w"], np.zeros(2))


@pytest.mark.parametrize(
    "bad, where",
    [({"x": object()}, "'x'"), ({"k": {(1, 2): 3}}, "'k'"), ([{True: 1}], "'0'"), ({1.5: 0}, "float")],
)
def test_unsupported_leaves_and_keys_name_the_path(
    ckpt: pathlib.Path, bad: object, where: str
) -> None:
    with pytest.raises(TypeError, match=where):
        ckptio.save(bad, ckpt)
    assert not ckpt.exists()


def test_namedtuple_gets_a_hint(ckpt: pathlib.Path) -> None:
    P = collections.namedtuple("P", "x y")
    with pytest.raises(TypeError, match="_asdict"):
        ckptio.save({"p": P(1, 2)}, ckpt)


def test_keys_select_leaves_and_subtrees(ckpt: pathlib.Path) -> None:
    tree = {
        "model": {"layers": [{"w": np.full(2, i)} for i in range(3)], "head": np.ones(4)},
        "step": 7,
    }
    ckptio.save(tree, ckpt)
    out = ckptio.load(ckpt, keys=["model.layers.1.w", "step"])
    assert list(out) == ["model", "step"] and out["step"] == 7
    assert list(out["model"]) == ["layers"]
    assert len(out["model"]["layers"]) == 1 and np.array_equal(out["model"]["layers"][0]["w"], [1, 1])
    sub = ckptio.load(ckpt, keys="model.head")
    assert list(sub) == ["model"] and list(sub["model"]) == ["head"]
    whole = ckptio.load(ckpt, keys=["model"])
    assert len(whole["model"]["layers"]) == 3
    with pytest.raises(ckptio.TensorNotFound, match="nope"):
        ckptio.load(ckpt, keys=["model.nope"])
    with pytest.raises(KeyError):
        ckptio.load(ckpt, keys=["model.layers.9"])


def test_reader(ckpt: pathlib.Path) -> None:
    w = np.arange(200, dtype=np.float32).reshape(10, 20)
    ckptio.save({"w": w, "opt": {"lr": 0.5, "m": [np.ones(3)]}}, ckpt, metadata={"step": "100", "run": "a b"})
    with ckptio.open(ckpt) as r:
        assert r.keys() == ["w", "opt.lr", "opt.m.0"]
        assert list(r) == r.keys() and len(r) == 3
        assert "opt.lr" in r and "opt" in r and "zzz" not in r
        assert r.metadata == {"step": "100", "run": "a b"}
        assert r["opt.lr"] == 0.5
        assert r["opt"]["m"][0].tolist() == [1, 1, 1]
        assert same(r["w"], w)
        assert np.array_equal(r.read("w", np.s_[2:5, :]), w[2:5, :])
        assert np.array_equal(r.read("w", np.s_[3]), w[3])
        assert np.array_equal(r.read("w", np.s_[..., 7]), w[..., 7])
        assert np.array_equal(r.read("w", np.s_[1:9:3, -4:]), w[1:9:3, -4:])
        assert np.array_equal(r.read("w", (slice(0, 0), slice(None))), w[0:0])
        assert np.array_equal(r.read("w"), w)
        info = r.info("w")
        assert (info.dtype, info.shape, info.nbytes) == ("f32", (10, 20), 800)
        assert r.get("missing", 5) == 5
        with pytest.raises(ckptio.TensorNotFound, match="missing"):
            r["missing"]
        with pytest.raises(IndexError):
            r.read("w", np.s_[10])
        r.verify()
    assert r.closed
    # Nothing answers from what the reader had cached once it is closed.
    calls = {
        "keys": r.keys, "tensors": r.tensors, "info": lambda: r.info("w"),
        "metadata": lambda: r.metadata, "getitem": lambda: r["w"], "read": lambda: r.read("w"),
        "contains": lambda: "w" in r, "len": lambda: len(r), "load": r.load,
    }  # fmt: skip
    for what, call in calls.items():
        with pytest.raises(ckptio.InvalidRequest, match="closed") as e:
            call()
        assert e.value.name == "CKPTIO_E_STATE", what


def test_stats(ckpt: pathlib.Path) -> None:
    st = ckptio.save({"a": np.zeros(1 << 20, np.uint8)}, ckpt)
    assert st.bytes == 1 << 20 and st.seconds > 0 and st.gbps > 0
    assert st.backend in ("io_uring", "psync", "buffered")
    assert isinstance(st.direct, bool)
    ckptio.load(ckpt)
    ls = ckptio.last_load_stats()
    assert ls is not None and ls.bytes == 1 << 20


@pytest.mark.parametrize("backend", ["psync", "buffered"])
def test_io_options(ckpt: pathlib.Path, backend: str) -> None:
    a = np.arange(1 << 18, dtype=np.int64)
    st = ckptio.save(
        {"a": a}, ckpt, backend=backend, fsync=False, checksums=False, queue_depth=4,
        io_threads=2, staging_bytes=8 << 20, request_bytes=1 << 20,
    )  # fmt: skip
    assert st.backend == backend
    assert same(ckptio.load(ckpt, backend=backend, direct=False)["a"], a)


def test_bad_io_options(ckpt: pathlib.Path) -> None:
    with pytest.raises(TypeError, match="unknown I/O option"):
        ckptio.save({}, ckpt, colour="blue")
    with pytest.raises(ValueError, match="backend"):
        ckptio.save({}, ckpt, backend="floppy")
    with pytest.raises(ValueError, match="queue_depth"):
        ckptio.save({}, ckpt, queue_depth=-1)


def test_metadata_must_be_str(ckpt: pathlib.Path) -> None:
    with pytest.raises(TypeError, match="str"):
        ckptio.save({}, ckpt, metadata={"step": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="reserved"):
        ckptio.save({}, ckpt, metadata={"ckptio.tree": "x"})


def test_overwrite(ckpt: pathlib.Path) -> None:
    ckptio.save({"v": 1}, ckpt)
    with pytest.raises(ckptio.CheckpointExists, match=str(ckpt)):
        ckptio.save({"v": 2}, ckpt)
    assert ckptio.load(ckpt) == {"v": 1}
    ckptio.save({"v": 3}, ckpt, overwrite=True)
    assert ckptio.load(ckpt) == {"v": 3}
    assert not leftovers(ckpt.parent)


def test_many_small_arrays(ckpt: pathlib.Path) -> None:
    tree = {f"t{i:05d}": np.full(1 + i % 17, i, np.int32) for i in range(5000)}
    ckptio.save(tree, ckpt, fsync=False)
    out = ckptio.load(ckpt)
    assert list(out) == list(tree)
    assert all(np.array_equal(out[k], v) for k, v in tree.items())


def test_framework_conversions_from_numpy(ckpt: pathlib.Path) -> None:
    import torch

    tree = {"f": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, ml_dtypes.bfloat16)}
    ckptio.save(tree, ckpt)
    t = ckptio.load(ckpt, framework="torch")
    assert t["f"].dtype == torch.float32 and t["f"].tolist() == tree["f"].tolist()
    assert t["b"].dtype == torch.bfloat16 and t["b"].tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="framework"):
        ckptio.load(ckpt, framework="tensorflow")


def test_like_numpy_casts_and_checks_shapes(ckpt: pathlib.Path) -> None:
    ckptio.save({"w": np.arange(4, dtype=np.float32), "n": 3}, ckpt)
    out = ckptio.load(ckpt, like={"w": np.zeros(4, np.float64), "n": None})
    assert out["w"].dtype == np.float64 and out["w"].tolist() == [0, 1, 2, 3] and out["n"] == 3
    with pytest.raises(ckptio.ShapeMismatch, match="'w'"):
        ckptio.load(ckpt, like={"w": np.zeros(5)})
    with pytest.raises(ckptio.TensorNotFound, match="'x'"):
        ckptio.load(ckpt, like={"x": np.zeros(5)})
    with pytest.raises(ValueError, match="not both"):
        ckptio.load(ckpt, like={"w": np.zeros(4)}, keys=["w"])


def test_zero_dim_arrays_keep_zero_dims(ckpt: pathlib.Path) -> None:
    tree = {
        "be": np.array(1.5, dtype=">f8"),
        "date": np.array("2020-02-02", dtype="datetime64[s]"),
        "strided": np.arange(10)[::3][1:2].reshape(()),
        "plain": np.array(7, np.int8),
    }
    ckptio.save(tree, ckpt)
    out = ckptio.load(ckpt)
    for k, v in tree.items():
        assert isinstance(out[k], np.ndarray) and out[k].shape == (), k
        assert out[k] == v, k


def test_mixed_flat_dict(ckpt: pathlib.Path) -> None:
    """Every kind of entry side by side in one dict (the saver's C fast path and its fallbacks)."""
    a = np.arange(10.0)
    tree = {
        "a": a,
        "same": a,  # alias, in the same dict
        "strided": np.arange(20)[::2],  # not contiguous: copied by Python
        "date": np.array(["2001-01-01"], dtype="datetime64[D]"),  # raw bytes
        7: np.ones(2),  # int key
        "": np.zeros(1),  # empty key
        "bf16": np.ones(3, ml_dtypes.bfloat16),
        "sub": {"x": a, "y": np.float64(2.0)},
        "v": 1.5,
    }
    st = ckptio.save(tree, ckpt)
    out = ckptio.load(ckpt)
    assert list(out) == list(tree)
    assert out["same"] is out["a"] and out["sub"]["x"] is out["a"]
    assert st.bytes == sum(np.asarray(v).nbytes for k, v in tree.items() if k not in ("same", "sub", "v")) + 8
    for k in ("strided", "date", 7, "", "bf16"):
        assert out[k].dtype == tree[k].dtype and np.array_equal(out[k], tree[k]), k
    with ckptio.open(ckpt) as r:
        assert r.keys() == ["a", "same", "strided", "date", "7", ".", "bf16", "sub.x", "sub.y", "v"]


def test_keys_prefix_inside_dotted_dict_keys(ckpt: pathlib.Path) -> None:
    tree = {"m.l.0.w": np.zeros(1), "m.l.0.b": np.ones(1), "m.l.1.w": np.full(1, 2.0)}
    ckptio.save(tree, ckpt)
    assert list(ckptio.load(ckpt, keys=["m.l.0"])) == ["m.l.0.w", "m.l.0.b"]
    assert list(ckptio.load(ckpt, keys=["m"])) == list(tree)
    with pytest.raises(ckptio.TensorNotFound):
        ckptio.load(ckpt, keys=["m.l.2"])
