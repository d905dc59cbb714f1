# SPDX-License-Identifier: Apache-2.0
"""ckptio.safetensors against stock safetensors (both ways, every shared dtype), slices, hostile
headers, and ckptio.load / ckptio.open on safetensors files and Hugging Face directories."""

from __future__ import annotations

import json
import os
import pathlib
import struct
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
stock_torch = pytest.importorskip("safetensors.torch")
stock_np = pytest.importorskip("safetensors.numpy")
ml_dtypes = pytest.importorskip("ml_dtypes")

import ckptio  # noqa: E402
import ckptio.safetensors as cst  # noqa: E402

# The dtypes stock safetensors.torch loads (its _TYPES), by safetensors name.
TORCH_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz, "F8_E5M2": torch.float8_e5m2,
    "F8_E5M2FNUZ": torch.float8_e5m2fnuz, "C64": torch.complex64, "U64": torch.uint64,
    "U32": torch.uint32, "U16": torch.uint16,
}  # fmt: skip
# The dtypes stock safetensors.numpy loads.
NP_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "U64": np.uint64,
    "I32": np.int32, "U32": np.uint32, "I16": np.int16, "U16": np.uint16, "I8": np.int8,
    "U8": np.uint8, "BOOL": np.bool_, "C64": np.complex64,
}  # fmt: skip
# Scalar, empty, small, one that is not a multiple of 4096 bytes, one over 64 KiB.
SHAPES = [(), (0, 4), (3, 5), (37, 129), (300, 257)]


def rand_bytes(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def torch_tensor(dt: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    n = int(np.prod(shape, dtype=np.int64))
    size = torch.empty(0, dtype=dt).element_size()
    raw = rand_bytes(n * size, seed)
    if dt == torch.bool:
        raw = raw & 1
    t = torch.from_numpy(raw.copy()).view(dt) if n else torch.empty(0, dtype=dt)
    return t.reshape(shape)


def bits(t: torch.Tensor) -> bytes:
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def state(dtypes: dict[str, torch.dtype]) -> dict[str, torch.Tensor]:
    out = {}
    for i, (st, dt) in enumerate(dtypes.items()):
        for j, shape in enumerate(SHAPES):
            out[f"{st}.{j}"] = torch_tensor(dt, shape, 100 * i + j)
    return out


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert tuple(a[k].shape) == tuple(b[k].shape), k
        assert bits(a[k]) == bits(b[k]), k


# ---- round trips with stock safetensors ------------------------------------------------------


def test_ckptio_written_read_by_stock(tmp_path: pathlib.Path) -> None:
    sd = state(TORCH_DTYPES)
    path = tmp_path / "m.safetensors"
    cst.save_file(sd, path, metadata={"format": "pt", "k": "v"})
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
    assert (8 + n) % cst.DATA_ALIGNMENT == 0  # the data starts aligned
    same(stock_torch.load_file(str(path)), sd)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "pt", "k": "v"}


def test_stock_written_read_by_ckptio(tmp_path: pathlib.Path) -> None:
    sd = state(TORCH_DTYPES)
    path = tmp_path / "m.safetensors"
    stock_torch.save_file(sd, str(path), metadata={"format": "pt"})
    same(cst.load_file(path), sd)
    with cst.safe_open(path, framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
        assert f.keys() == sorted(sd)
        for k in ("BF16.3", "U8.0", "C64.4"):
            assert bits(f.get_tensor(k)) == bits(sd[k])
            assert f.get_slice(k).get_dtype() == k.split(".")[0]
            assert f.get_slice(k).get_shape() == list(sd[k].shape)


def test_float8_e8m0_both_ways(tmp_path: pathlib.Path) -> None:
    """F8_E8M0 has no ckptio code: it loads through its torch and ml_dtypes types."""
    sd = {"s": torch_tensor(torch.float8_e8m0fnu, (4, 1000), 7)}
    path = tmp_path / "e8m0.safetensors"
    stock_torch.save_file(sd, str(path))
    same(cst.load_file(path), sd)
    a = cst.load_file(path, framework="np")["s"]
    assert a.dtype == np.dtype(ml_dtypes.float8_e8m0fnu)
    assert a.tobytes() == bits(sd["s"])
    cst.save_file(sd, tmp_path / "again.safetensors")
    assert cst.load_file(tmp_path / "again.safetensors")["s"].view(torch.uint8).equal(
        sd["s"].view(torch.uint8)
    )
    back = ckptio.load(path, framework="torch")["s"]
    assert back.view(torch.uint8).equal(sd["s"].view(torch.uint8))


def test_numpy_both_ways(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(3)
    arrays = {}
    for st, dt in NP_DTYPES.items():
        for j, shape in enumerate(SHAPES):
            raw = rng.integers(0, 256, int(np.prod(shape)) * np.dtype(dt).itemsize, dtype=np.uint8)
            if dt is np.bool_:
                raw &= 1
            arrays[f"{st}.{j}"] = raw.view(dt).reshape(shape)
    a, b = tmp_path / "ckptio.safetensors", tmp_path / "stock.safetensors"
    cst.save_file(arrays, a)
    stock_np.save_file(arrays, str(b))
    for got in (stock_np.load_file(str(a)), cst.load_file(b, framework="np"),
                cst.load_file(a, framework="numpy")):  # fmt: skip
        assert sorted(got) == sorted(arrays)
        for k, v in arrays.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
            assert got[k].tobytes() == v.tobytes(), k


def test_numpy_ml_dtypes_read_by_stock_torch(tmp_path: pathlib.Path) -> None:
    sd = {"b": torch_tensor(torch.bfloat16, (17, 33), 1),
          "e4": torch_tensor(torch.float8_e4m3fn, (5, 7), 2),
          "e5": torch_tensor(torch.float8_e5m2, (9,), 3)}  # fmt: skip
    as_np = {
        "b": sd["b"].view(torch.uint16).numpy().view(ml_dtypes.bfloat16),
        "e4": sd["e4"].view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn),
        "e5": sd["e5"].view(torch.uint8).numpy().view(ml_dtypes.float8_e5m2),
    }
    path = tmp_path / "ml.safetensors"
    cst.save_file(as_np, path)
    same(stock_torch.load_file(str(path)), sd)
    back = cst.load_file(path, framework="np")
    for k, v in as_np.items():
        assert back[k].dtype == v.dtype and back[k].tobytes() == v.tobytes()


def test_device_and_jax(tmp_path: pathlib.Path) -> None:
    jax = pytest.importorskip("jax")
    path = tmp_path / "j.safetensors"
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    cst.save_file({"x": x}, path)
    dev = jax.devices("cpu")[1]
    with cst.safe_open(path, framework="flax", device=dev) as f:
        a = f.get_tensor("x")
        assert isinstance(a, jax.Array) and a.devices() == {dev}
        np.testing.assert_array_equal(np.asarray(a), x)
        np.testing.assert_array_equal(np.asarray(f.get_slice("x")[1:3]), x[1:3])
    t = cst.load_file(path, device="meta")["x"]
    assert t.device.type == "meta" and tuple(t.shape) == (4, 6)


def test_save_refuses_what_safetensors_cannot_hold(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "x.safetensors"
    with pytest.raises(ckptio.UnsupportedDtype, match="'c'"):
        cst.save_file({"c": torch.zeros(2, dtype=torch.complex128)}, path)
    with pytest.raises(ckptio.UnsupportedDtype, match="'o'"):
        cst.save_file({"o": np.array([1, "a"], dtype=object)}, path)
    with pytest.raises(ckptio.InvalidType):
        cst.save_file({"w": np.zeros(2)}, path, metadata={"a": 1})  # type: ignore[dict-item]
    with pytest.raises(ckptio.InvalidType):
        cst.save_file({"w": [1, 2]}, path)
    assert not path.exists() and not [p for p in tmp_path.iterdir()]


def test_save_replaces_atomically(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "x.safetensors"
    cst.save_file({"a": torch.ones(3)}, path)
    cst.save_file({"b": torch.zeros(5), "v": torch.arange(10)[::2]}, path)  # non-contiguous
    got = stock_torch.load_file(str(path))
    assert sorted(got) == ["b", "v"] and got["v"].tolist() == [0, 2, 4, 6, 8]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.safetensors"]


# ---- slices --------------------------------------------------------------------------------


@pytest.mark.parametrize("writer", ["ckptio", "stock"])
def test_get_slice_matches_numpy(tmp_path: pathlib.Path, writer: str) -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "pad": np.ones(3, np.uint8),  # puts the stock file's data off page boundaries
        "m": rng.standard_normal((256, 1024)).astype(np.float32),  # 4 KiB rows
        "c": rng.integers(0, 1000, (6, 7, 8, 9)).astype(np.int16),
        "s": np.array(2.5, np.float64),
    }
    path = tmp_path / "s.safetensors"
    if writer == "ckptio":
        cst.save_file(arrays, path)
    else:
        stock_np.save_file(arrays, str(path))
    cases = {
        "m": [np.s_[10:20], np.s_[5], np.s_[-3:], np.s_[:, 100:200], np.s_[2:9:3, ::5],
              np.s_[...], np.s_[..., 7], np.s_[40:40], np.s_[250:300]],
        "c": [np.s_[1:3, 2, :, 4:6], np.s_[:, :, 1], np.s_[5, 6, 7, 8], np.s_[..., 1:2]],
        "s": [np.s_[...], ()],
    }  # fmt: skip
    with cst.safe_open(path, framework="np") as f:
        for name, idxs in cases.items():
            sl = f.get_slice(name)
            for idx in idxs:
                got = sl[idx]
                want = arrays[name][idx]
                assert got.shape == want.shape, (name, idx)
                np.testing.assert_array_equal(got, want)
    with cst.safe_open(path, framework="pt") as f:
        t = f.get_slice("m")[3:7, 1:4]
        assert isinstance(t, torch.Tensor)
        np.testing.assert_array_equal(t.numpy(), arrays["m"][3:7, 1:4])


@pytest.mark.parametrize("writer", ["ckptio", "stock"])
def test_get_slice_reads_only_the_rows(tmp_path: pathlib.Path, writer: str) -> None:
    rows = np.random.default_rng(1).standard_normal((1024, 1024)).astype(np.float32)  # 4 MiB
    path = tmp_path / "r.safetensors"
    tensors = {"pad": np.ones(5, np.uint8), "w": rows}
    if writer == "ckptio":
        cst.save_file(tensors, path)
    else:
        stock_np.save_file(tensors, str(path))
    with cst.safe_open(path, framework="np") as f:
        got = f.get_slice("w")[100:110]
    np.testing.assert_array_equal(got, rows[100:110])
    st = cst.last_stats()
    assert st is not None and st.bytes == 10 * 4096
    # At most one page more on each side of the one range (an unaligned file pays for them).
    assert st.io_bytes <= 10 * 4096 + 2 * 4096


# Indices a slice reads the way stock safetensors does (with framework="pt" it indexes as torch
# does, the same as numpy's basic indexing): None, Ellipsis, negative ints and bounds, steps.
INDEX_CASES = [
    None, (None,), (None, None), (0, None), (None, 0), np.s_[:, None], np.s_[..., None],
    np.s_[None, ...], np.s_[None, ..., None], np.s_[0, None, 0], (), ..., np.s_[..., 0],
    np.s_[0, ...], -1, np.s_[-1, -1], np.s_[0, -6], np.s_[-3:], np.s_[-100:100], np.s_[4:2],
    np.s_[2:2], np.s_[::2], np.s_[1::2, ::3], np.s_[3::10], np.s_[:-1, -2:], np.s_[-1:-3],
    np.s_[6:10], np.int64(1), (np.int64(-1),), np.s_[:, 1], np.s_[-5],
]  # fmt: skip
# What stock reads and ckptio refuses rather than guess at: boolean and array (advanced)
# indices, more than one Ellipsis.
REFUSED = [(True,), (False,), np.s_[True, 0], [0, 1], (np.array([0, 1]),), np.s_[..., ...]]
# What neither reads.
BOTH_REFUSE = [
    -6, 5, np.s_[0, 6], np.s_[::-1], np.s_[::0], 1.0, np.s_[0, 0, 0], np.s_[:, :, :], np.s_[0.5:],
]  # fmt: skip


def _stock_and_ours(path: pathlib.Path, name: str, idx: Any) -> tuple[Any, Any]:
    from safetensors import safe_open as stock_open

    with stock_open(str(path), framework="pt") as f:
        want = f.get_slice(name)[idx]
    with cst.safe_open(path, framework="pt") as f:
        got = f.get_slice(name)[idx]
    return want, got


def test_get_slice_indexes_as_stock_does(tmp_path: pathlib.Path) -> None:
    arrays = {
        "a": np.arange(30, dtype=np.float32).reshape(5, 6),
        "c": np.arange(24, dtype=np.int16).reshape(2, 3, 4),
        "s": np.array(3.0, np.float32),
        "e": np.zeros((0, 3), np.float32),
    }
    path = tmp_path / "i.safetensors"
    stock_np.save_file(arrays, str(path))
    for name, arr in arrays.items():
        for idx in INDEX_CASES:
            try:
                want = torch.from_numpy(arr)[idx]
            except (IndexError, ValueError, TypeError):
                continue  # e.g. (0, -6) of a 3-d tensor: covered by the refusals below
            stock, got = _stock_and_ours(path, name, idx)
            assert tuple(stock.shape) == tuple(want.shape), (name, idx)
            assert tuple(got.shape) == tuple(want.shape), (name, idx)
            assert torch.equal(got, want), (name, idx)
            with cst.safe_open(path, framework="np") as f:
                np_got = f.get_slice(name)[idx]
            assert np_got.shape == arr[idx].shape, (name, idx)
            np.testing.assert_array_equal(np_got, arr[idx])
    for idx in REFUSED:
        with pytest.raises(ckptio.InvalidRequest, match="'a'"):
            _stock_and_ours(path, "a", idx)
    for idx in BOTH_REFUSE:
        from safetensors import safe_open as stock_open

        with stock_open(str(path), framework="pt") as f, pytest.raises(Exception):
            f.get_slice("a")[idx]
        with cst.safe_open(path, framework="pt") as f:
            with pytest.raises((ckptio.InvalidRequest, ckptio.RegionOutOfRange, ValueError)):
                f.get_slice("a")[idx]
    # ckptio.open(...).read's region takes the same indices; None there is the whole tensor.
    ckpt = tmp_path / "ck"
    ckptio.save({"a": arrays["a"]}, ckpt)
    with ckptio.open(ckpt) as r:
        assert r.read("a", None).shape == (5, 6)
        assert r.read("a", np.s_[None, 1:3]).shape == (1, 2, 6)
        np.testing.assert_array_equal(r.read("a", np.s_[..., None, -1]), arrays["a"][..., None, -1])


def test_get_slice_indexes_as_stock_does_hypothesis(tmp_path: pathlib.Path) -> None:
    from hypothesis import given, settings, strategies as st

    arrays = {
        "a": np.arange(30, dtype=np.float32).reshape(5, 6),
        "c": np.arange(24, dtype=np.int16).reshape(2, 3, 4),
    }
    path = tmp_path / "h.safetensors"
    stock_np.save_file(arrays, str(path))
    bound = st.one_of(st.none(), st.integers(-8, 8))
    elem = st.one_of(
        st.none(),
        st.integers(-7, 7),
        st.builds(slice, bound, bound, st.sampled_from([None, 1, 2, 3, 5])),
    )

    @st.composite
    def indices(draw: st.DrawFn) -> Any:
        idx = draw(st.lists(elem, max_size=5))
        if draw(st.booleans()):
            idx.insert(draw(st.integers(0, len(idx))), Ellipsis)
        return tuple(idx) if len(idx) != 1 or draw(st.booleans()) else idx[0]

    from safetensors import safe_open as stock_open

    with stock_open(str(path), framework="pt") as sf, cst.safe_open(path, framework="pt") as of:

        @settings(max_examples=300, deadline=None, database=None)
        @given(name=st.sampled_from(sorted(arrays)), idx=indices())
        def check(name: str, idx: Any) -> None:
            try:
                want = sf.get_slice(name)[idx]
            except Exception:
                with pytest.raises((ckptio.InvalidRequest, ckptio.RegionOutOfRange, ValueError)):
                    of.get_slice(name)[idx]
                return
            got = of.get_slice(name)[idx]
            assert tuple(got.shape) == tuple(want.shape)
            assert torch.equal(got, want)

        check()


def test_get_slice_out_of_range(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "o.safetensors"
    cst.save_file({"w": np.zeros((4, 4), np.float32)}, path)
    with cst.safe_open(path, framework="np") as f:
        with pytest.raises(ckptio.RegionOutOfRange, match="'w'"):
            f.get_slice("w")[4]
        with pytest.raises(ckptio.RegionOutOfRange):
            f.get_slice("w")[0, 0, 0]
        with pytest.raises(ckptio.TensorNotFound, match="'nope'"):
            f.get_slice("nope")
    with pytest.raises(ckptio.InvalidRequest):
        f.keys()  # closed


# ---- hostile headers -----------------------------------------------------------------------


def write_raw(
    path: pathlib.Path, header: bytes, data: bytes = b"", length: int | None = None
) -> None:
    n = len(header) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + header + data)


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


HOSTILE = {
    "huge length": (b"{}", b"", 1 << 62, ckptio.LimitExceeded),
    "longer than the file": (b"{}", b"", 1000, ckptio.CorruptCheckpoint),
    "not utf-8": (b'{"\xff":' + json.dumps(entry("U8", [1], 0, 1)).encode() + b"}", b"x", None,
                  ckptio.CorruptCheckpoint),
    "duplicate": (b'{"a":' + json.dumps(entry("U8", [1], 0, 1)).encode() + b',"a":'
                  + json.dumps(entry("U8", [1], 1, 2)).encode() + b"}", b"xy", None,
                  ckptio.DuplicateTensor),
    "overlap": (json.dumps({"a": entry("U8", [2], 0, 2), "b": entry("U8", [2], 1, 3)}).encode(),
                b"xyz", None, ckptio.CorruptCheckpoint),
    "past the end": (json.dumps({"a": entry("F32", [4], 0, 16)}).encode(), b"x" * 8, None,
                     ckptio.CorruptCheckpoint),
    "size mismatch": (json.dumps({"a": entry("F32", [4], 0, 8)}).encode(), b"x" * 8, None,
                      ckptio.ShapeMismatch),
    "not json": (b"{nope", b"", None, ckptio.CorruptCheckpoint),
    "too short": (b"", b"", 0, ckptio.CorruptCheckpoint),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_headers(tmp_path: pathlib.Path, case: str) -> None:
    header, data, length, cls = HOSTILE[case]
    path = tmp_path / "bad.safetensors"
    write_raw(path, header, data, length)
    if case == "too short":
        path.write_bytes(b"\x01\x02")
    for call in (
        lambda: cst.load_file(path),
        lambda: cst.safe_open(path, framework="np"),
        lambda: ckptio.load(path),
        lambda: ckptio.open(path),
    ):
        with pytest.raises(cls) as ei:
            call()
        assert str(path) in str(ei.value), str(ei.value)
        assert isinstance(ei.value, ckptio.CheckpointError)


def test_subbyte_dtype_refused_naming_the_tensor(tmp_path: pathlib.Path) -> None:
    hdr = json.dumps({"ok": entry("U8", [2], 0, 2), "f4": entry("F4", [4], 2, 4)}).encode()
    path = tmp_path / "f4.safetensors"
    write_raw(path, hdr, b"abcd")
    with pytest.raises(ckptio.UnsupportedDtype, match=r"'f4'.*F4"):
        cst.load_file(path)
    with cst.safe_open(path, framework="np") as f:
        assert f.get_tensor("ok").tobytes() == b"ab"
        with pytest.raises(ckptio.UnsupportedDtype, match="'f4'"):
            f.get_slice("f4")[:1]
    for fw in (None, "torch"):
        with pytest.raises(ckptio.UnsupportedDtype, match="'f4'"):
            ckptio.load(path, framework=fw)
    assert ckptio.load(path, keys=["ok"])["ok"].tobytes() == b"ab"


def test_missing_file(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ckptio.CheckpointNotFound):
        cst.load_file(tmp_path / "none.safetensors")


# ---- ckptio.load / ckptio.open on safetensors ------------------------------------------------


def test_ckptio_load_file_flat_and_framework(tmp_path: pathlib.Path) -> None:
    sd = {"model.layers.0.w": torch.randn(8, 8), "model.layers.1.w": torch.randn(8, 8),
          "model.emb": torch.randn(4, 8).to(torch.bfloat16), "a": torch.ones(2),
          "a.b": torch.zeros(2)}  # fmt: skip
    pt, plain = tmp_path / "pt.safetensors", tmp_path / "plain.safetensors"
    cst.save_file(sd, pt, metadata={"format": "pt"})
    cst.save_file(sd, plain)
    got = ckptio.load(pt)
    same(got, sd)  # flat, torch ("format": "pt")
    arr = ckptio.load(plain)
    assert all(isinstance(v, np.ndarray) for v in arr.values())
    assert arr["model.emb"].dtype == np.dtype(ml_dtypes.bfloat16)
    sub = ckptio.load(pt, keys=["model.layers.1"])
    assert list(sub) == ["model.layers.1.w"]
    assert sub["model.layers.1.w"].equal(sd["model.layers.1.w"])
    st = ckptio.last_load_stats()
    assert st is not None and st.bytes == 8 * 8 * 4
    with ckptio.open(pt) as r:
        assert r.keys() == sorted(sd)
        assert r.metadata == {"format": "pt"}
        assert r.read("model.layers.0.w", np.s_[2:4]).equal(sd["model.layers.0.w"][2:4])
        assert r["a.b"].equal(sd["a.b"])
        assert r.tensors()["model.emb"].dtype == "bf16"
        with pytest.raises(ckptio.Unsupported):
            r.verify()


def test_ckptio_load_like(tmp_path: pathlib.Path) -> None:
    sd = {"w": torch.randn(6, 5).to(torch.bfloat16), "b": torch.randn(5)}
    path = tmp_path / "m.safetensors"
    stock_torch.save_file(sd, str(path), metadata={"format": "pt"})
    like = {"w": torch.empty(6, 5, dtype=torch.float32), "b": np.zeros(5, np.float64)}
    got = ckptio.load(path, like=like)
    assert got["w"].dtype == torch.float32 and got["w"].equal(sd["w"].float())
    assert isinstance(got["b"], np.ndarray) and got["b"].dtype == np.float64
    np.testing.assert_array_equal(got["b"], sd["b"].double().numpy())
    with pytest.raises(ckptio.ShapeMismatch):
        ckptio.load(path, like={"w": torch.empty(5, 6)})


def test_ckptio_load_like_jax_sharding(tmp_path: pathlib.Path) -> None:
    jax = pytest.importorskip("jax")
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    x = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    path = tmp_path / "j.safetensors"
    cst.save_file({"x": x}, path)
    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    sh = NamedSharding(mesh, P("d"))
    got = ckptio.load(path, like={"x": jax.ShapeDtypeStruct((8, 6), np.float32, sharding=sh)})
    assert got["x"].sharding == sh
    np.testing.assert_array_equal(np.asarray(got["x"]), x)


def hf_cache(tmp_path: pathlib.Path, files: dict[str, bytes]) -> pathlib.Path:
    """A Hugging Face cache entry: snapshots/<rev>/<name> -> ../../blobs/<sha>."""
    import hashlib

    repo = tmp_path / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for name, data in files.items():
        sha = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / sha).write_bytes(data)
        os.symlink(f"../../blobs/{sha}", snap / name)
    return snap


def shard_files(tmp_path: pathlib.Path, sd: dict[str, torch.Tensor]) -> dict[str, bytes]:
    """sd saved as two stock shards and an index, as save_pretrained writes them."""
    names = sorted(sd)
    half = len(names) // 2
    files: dict[str, bytes] = {}
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        fn = f"model-{i + 1:05d}-of-00002.safetensors"
        tmp = tmp_path / ("tmp-" + fn)
        stock_torch.save_file({k: sd[k] for k in part}, str(tmp), metadata={"format": "pt"})
        files[fn] = tmp.read_bytes()
        tmp.unlink()
        weight_map |= {k: fn for k in part}
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in sd.values())},
             "weight_map": weight_map}  # fmt: skip
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    return files


def test_sharded_directory_in_hf_cache(tmp_path: pathlib.Path) -> None:
    sd = {f"model.layers.{i}.{p}": torch.randn(16, 32) for i in range(4) for p in ("q", "k")}
    sd["model.embed"] = torch.randn(50, 32).to(torch.bfloat16)
    snap = hf_cache(tmp_path, shard_files(tmp_path, sd))
    assert os.path.islink(snap / "model-00001-of-00002.safetensors")
    same(ckptio.load(snap), sd)
    same(ckptio.load(snap / "model.safetensors.index.json"), sd)
    got = ckptio.load(snap, keys=["model.layers.3.k", "model.embed"])
    assert sorted(got) == ["model.embed", "model.layers.3.k"]
    st = ckptio.last_load_stats()
    assert st is not None and st.bytes == 16 * 32 * 4 + 50 * 32 * 2
    with ckptio.open(snap) as r:
        assert r.metadata["format"] == "pt" and "total_size" in r.metadata
        assert r.read("model.layers.2.q", np.s_[:, 3]).equal(sd["model.layers.2.q"][:, 3])
    # Each shard also reads on its own, through its link.
    one = ckptio.load(snap / "model-00002-of-00002.safetensors")
    assert set(one) < set(sd)
    for k, v in cst.load_file(snap / "model-00001-of-00002.safetensors").items():
        assert bits(v) == bits(sd[k])


def test_single_file_in_hf_cache(tmp_path: pathlib.Path) -> None:
    sd = {"w": torch.randn(33, 17)}
    tmp = tmp_path / "tmp.safetensors"
    stock_torch.save_file(sd, str(tmp))
    snap = hf_cache(tmp_path, {"model.safetensors": tmp.read_bytes()})
    same(cst.load_file(snap / "model.safetensors"), sd)
    assert ckptio.load(snap)["w"].tobytes() == sd["w"].numpy().tobytes()  # numpy: no format


def test_index_naming_a_missing_tensor_or_outside_file(tmp_path: pathlib.Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    cst.save_file({"a": torch.ones(2)}, d / "s.safetensors")
    idx = d / "model.safetensors.index.json"
    idx.write_text(json.dumps({"weight_map": {"a": "s.safetensors", "b": "s.safetensors"}}))
    with pytest.raises(ckptio.CorruptCheckpoint, match="'b'"):
        ckptio.load(d)
    idx.write_text(json.dumps({"weight_map": {"a": "../s.safetensors"}}))
    with pytest.raises(ckptio.CorruptCheckpoint, match="outside"):
        ckptio.load(d)
    idx.write_text("{not json")
    with pytest.raises(ckptio.CorruptCheckpoint, match="not JSON"):
        ckptio.load(d)


def test_directory_without_index_refuses_duplicates(tmp_path: pathlib.Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    cst.save_file({"a": torch.ones(2), "b": torch.ones(1)}, d / "1.safetensors")
    cst.save_file({"c": torch.zeros(3)}, d / "2.safetensors")
    assert sorted(ckptio.load(d)) == ["a", "b", "c"]
    cst.save_file({"a": torch.zeros(3)}, d / "3.safetensors")
    with pytest.raises(ckptio.DuplicateTensor, match="'a'"):
        ckptio.load(d)


def test_ckptio_checkpoints_still_load(tmp_path: pathlib.Path) -> None:
    """A ckptio checkpoint holding a file named *.safetensors is still ckptio's."""
    p = tmp_path / "ck"
    ckptio.save({"w": np.ones(3)}, p)
    (p / "extra.safetensors").write_bytes(b"")
    np.testing.assert_array_equal(ckptio.load(p)["w"], np.ones(3))


def test_ckptio_load_like_dtensors(tmp_path: pathlib.Path) -> None:
    """Two gloo ranks load a stock file with like= DTensors: each reads only its Shard(0) rows."""
    pytest.importorskip("torch.distributed")
    import sys

    from test_comm_dist import DIST, free_port, launch, results

    path = tmp_path / "d.safetensors"
    stock_torch.save_file({"w": torch.randn(8, 256).to(torch.bfloat16), "b": torch.randn(5)},
                          str(path), metadata={"format": "pt"})  # fmt: skip
    port = free_port()
    env = [dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE="2",
                GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1") for r in range(2)]  # fmt: skip
    launch([[sys.executable, str(DIST / "st_dtensor.py"), str(path)]] * 2, env, tmp_path)
    res = results(tmp_path, "st")
    assert sorted(res) == [0, 1], res
    for r, v in res.items():
        assert "error" not in v, v
        assert v["dtensor"] and v["w_ok"] and v["b_ok"], v
        assert v["placements"] == ["S(0)", "R"], v
        assert v["bytes"] == v["want_bytes"], v


def test_save_refuses_names_the_format_cannot_hold(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "n.safetensors"
    for bad in ("a\x00b", "\udcff"):
        with pytest.raises(ckptio.InvalidRequest):
            cst.save_file({bad: np.zeros(2)}, path)
    with pytest.raises(ckptio.InvalidRequest, match="__metadata__"):
        cst.save_file({"__metadata__": np.zeros(2)}, path)
    cst.save_file({"ünï \"q\" \\ \n": np.arange(3)}, path, metadata={"k\x01": "v\x00w"})
    from safetensors import safe_open

    with safe_open(str(path), framework="np") as f:
        assert f.keys() == ["ünï \"q\" \\ \n"] and f.metadata() == {"k\x01": "v\x00w"}
    with cst.safe_open(path, framework="np") as f:
        assert f.metadata() == {"k\x01": "v\x00w"}


@pytest.mark.parametrize("pad", [0, 1, 3, 4, 8])
def test_large_tensors_at_any_file_offset(tmp_path: pathlib.Path, pad: int) -> None:
    """Tensors over 64 KiB start anywhere in files other writers make (unpadded headers, odd
    tensors before them): each is read whole and bit-exact, elements aligned or not."""
    big = np.random.default_rng(pad).standard_normal(70_000).astype(np.float32)
    tail = np.arange(20_000, dtype=np.int64)
    hdr = json.dumps({
        "p": entry("U8", [pad], 0, pad),
        "big": entry("F32", [70_000], pad, pad + big.nbytes),
        "tail": entry("I64", [20_000], pad + big.nbytes, pad + big.nbytes + tail.nbytes),
    }).encode()  # fmt: skip
    path = tmp_path / "odd.safetensors"
    write_raw(path, hdr, bytes(range(pad)) + big.tobytes() + tail.tobytes())
    got = cst.load_file(path, framework="np")
    assert got["big"].tobytes() == big.tobytes() and got["tail"].tobytes() == tail.tobytes()
    assert got["p"].tobytes() == bytes(range(pad))
    t = cst.load_file(path)
    assert t["big"].numpy().tobytes() == big.tobytes()
    np.testing.assert_array_equal(ckptio.load(path)["tail"], tail)


def test_mmap_of_a_safetensors_file_is_refused(tmp_path: Any) -> None:
    path = str(tmp_path / "m.safetensors")
    ckptio.safetensors.save_file({"a": np.zeros(4, np.float32)}, path)
    with pytest.raises(ckptio.Unsupported, match="mmap=True maps ckptio checkpoints only"):
        ckptio.load(path, mmap=True)
