# SPDX-License-Identifier: Apache-2.0
"""load(into=tree) and ckptio.torch.load_state_dict: reading into memory the caller owns."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import ckptio

import rss_probe


def test_numpy_into_fills_in_place(ckpt: pathlib.Path) -> None:
    rng = np.random.default_rng(0)
    src = {"a": rng.random((300, 70)), "b": {"c": np.arange(10, dtype=np.int32)}, "n": 7}
    ckptio.save(src, ckpt)
    dst = {"a": np.zeros((300, 70)), "b": {"c": np.zeros(10, np.int32)}, "n": 0}
    a, c = dst["a"], dst["b"]["c"]
    out = ckptio.load(ckpt, into=dst)
    assert out["a"] is a and out["b"]["c"] is c
    np.testing.assert_array_equal(a, src["a"])
    np.testing.assert_array_equal(c, src["b"]["c"])
    assert out["n"] == 7  # plain values come from the checkpoint


@pytest.mark.parametrize(
    "bad, what",
    [
        ({"a": np.zeros((300, 71))}, "(300, 71)"),
        ({"a": np.zeros((300, 70), np.float32)}, "float32"),
    ],
)
def test_into_mismatch_writes_nothing(ckpt: pathlib.Path, bad: dict, what: str) -> None:
    ckptio.save({"a": np.ones((300, 70)), "z": np.ones(5000)}, ckpt)
    z = np.full(5000, 9.0)
    dst = {"z": z, **bad}  # z, checked first, matches: it must stay untouched all the same
    before = (dst["a"].tobytes(), z.tobytes())
    with pytest.raises(ckptio.ShapeMismatch, match=r"'a'.*" + what.replace("(", r"\(").replace(")", r"\)")) as e:
        ckptio.load(ckpt, into=dst)
    assert "(300, 70)" in str(e.value) and "float64" in str(e.value)
    assert (dst["a"].tobytes(), z.tobytes()) == before


def test_into_missing_key(ckpt: pathlib.Path) -> None:
    ckptio.save({"a": np.ones(3)}, ckpt)
    b = np.zeros(3)
    with pytest.raises(ckptio.TensorNotFound, match="'b'"):
        ckptio.load(ckpt, into={"a": np.zeros(3), "b": b})


def test_into_unaligned_and_strided(ckpt: pathlib.Path) -> None:
    rng = np.random.default_rng(2)
    a = rng.random(100_000)
    m = rng.random((64, 64))
    ckptio.save({"a": a, "m": m}, ckpt)
    raw = np.zeros(100_000 * 8 + 1, np.uint8)
    unaligned = raw[1:].view(np.float64)  # an address that is no multiple of 8, let alone 4096
    assert not unaligned.flags.aligned or unaligned.ctypes.data % 4096
    big = np.zeros((64, 128))
    strided = big[:, ::2]  # not contiguous: read into staging, then copied
    ckptio.load(ckpt, into={"a": unaligned, "m": strided})
    np.testing.assert_array_equal(unaligned, a)
    np.testing.assert_array_equal(big[:, ::2], m)
    assert not big[:, 1::2].any()


def test_into_torch_and_jax(ckpt: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    src = {"w": torch.randn(50, 30).to(torch.bfloat16), "i": torch.arange(9)}
    ckptio.save(src, ckpt)
    dst = {"w": torch.zeros(50, 30, dtype=torch.bfloat16), "i": torch.zeros(9, dtype=torch.int64)}
    w = dst["w"]
    out = ckptio.load(ckpt, into=dst)
    assert out["w"] is w and torch.equal(w, src["w"]) and torch.equal(dst["i"], src["i"])
    jnp = pytest.importorskip("jax.numpy")
    with pytest.raises(ckptio.InvalidRequest, match="jax arrays cannot be written in place"):
        ckptio.load(ckpt, into={"w": dst["w"], "i": jnp.zeros(9, jnp.int32)})


def test_load_state_dict_module_and_optimizer(ckpt: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    import ckptio.torch as ct

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(5, 8)).sum().backward()
    opt.step()
    ckptio.save({"model": model.state_dict(), "optim": opt.state_dict()}, ckpt)
    want_m = {k: v.clone() for k, v in model.state_dict().items()}
    want_o = opt.state_dict()
    want_o = {p: {k: v.clone() for k, v in s.items()} for p, s in want_o["state"].items()}

    # The same model and optimizer, changed afterwards: loading puts back the saved state.
    params = {k: v for k, v in model.named_parameters()}
    state_objs = {p: dict(s) for p, s in opt.state_dict()["state"].items()}
    model(torch.randn(5, 8)).sum().backward()
    opt.step()
    opt.param_groups[0]["lr"] = 0.5
    assert ct.load_state_dict(model, ckpt, key="model") is not None
    ct.load_state_dict(opt, ckpt, key="optim")
    for k, v in model.state_dict().items():
        assert torch.equal(v, want_m[k]), k
    for k, p in model.named_parameters():
        assert p is params[k]
    got = opt.state_dict()
    assert got["param_groups"][0]["lr"] == 1e-3
    for pid, s in got["state"].items():
        for k, v in s.items():
            assert torch.equal(v, want_o[pid][k]), (pid, k)
            if k != "step":
                assert v is state_objs[pid][k], (pid, k)  # filled in place

    # A fresh optimizer (no state yet) gets the saved state loaded fresh.
    opt2 = torch.optim.Adam(model.parameters(), lr=0.1)
    ct.load_state_dict(opt2, ckpt, key="optim")
    for pid, s in opt2.state_dict()["state"].items():
        for k, v in s.items():
            assert torch.equal(v, want_o[pid][k])


def test_load_state_dict_strict(ckpt: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    import ckptio.torch as ct

    ckptio.save(torch.nn.Linear(3, 3).state_dict(), ckpt)
    m = torch.nn.Sequential(torch.nn.Linear(3, 3))
    w = m[0].weight.detach().clone()
    with pytest.raises(ckptio.TensorNotFound, match="missing keys"):
        ct.load_state_dict(m, ckpt)
    assert torch.equal(m[0].weight, w)
    res = ct.load_state_dict(m, ckpt, strict=False)
    assert sorted(res.missing_keys) == ["0.bias", "0.weight"]
    assert sorted(res.unexpected_keys) == ["bias", "weight"]


INTO_BODY = """
state = {f"l{i}": np.full(16 << 20, i, np.float32) for i in range(4)}  # 4 x 64 MiB
ckptio.save(state, path, fsync=False)
for v in state.values():
    v[:] = -1
base = rss()
ckptio.load(path, into=state)
assert all((state[f"l{i}"] == i).all() for i in range(4))
print(base, rss())
"""


def test_into_allocates_nothing_big(tmp_path: pathlib.Path) -> None:
    base, after = rss_probe.run(INTO_BODY, tmp_path / "ckpt")
    mib = 1 << 20
    assert after - base < 48 * mib, f"{(after - base) / mib:.0f} MiB more resident for 256 MiB"


def test_into_checksum_failure_names_what_it_wrote(ckpt: pathlib.Path) -> None:
    # The read lands in the caller's memory as it is verified: after a failure, the exception
    # lists every leaf it may have written (new, damaged or half-read bytes); every other leaf
    # holds exactly what it held before (a strided view is copied only after the whole read).
    rng = np.random.default_rng(3)
    src = {
        "a": rng.random(50_000),
        "b": rng.random(100_000).astype(np.float32),
        "m": rng.random((64, 64)),
        "z": np.zeros(0),
    }
    ckptio.save(src, ckpt)
    with ckptio.open(ckpt) as r:
        ((_, _, file, file_offset, _, _),) = r._r.chunks(r.info("b").index)
    path = ckpt / file
    with open(path, "r+b") as f:
        f.seek(file_offset + 5000)
        byte = f.read(1)
        f.seek(file_offset + 5000)
        f.write(bytes([byte[0] ^ 0xFF]))
    big = np.full((64, 128), 7.0)
    dst = {
        "a": np.full(50_000, 7.0),
        "b": np.full(100_000, 7.0, np.float32),
        "m": big[:, ::2],
        "z": np.zeros(0),
    }
    with pytest.raises(ckptio.ChecksumMismatch) as e:
        ckptio.load(ckpt, into=dst)
    assert e.value.tensors == ("a", "b")  # type: ignore[attr-defined]
    msg = str(e.value)
    assert "'b'" in msg and "000000.ckd" in msg  # the damaged tensor and its file
    assert "'a', 'b'" in msg and "may hold" in msg  # the leaves written
    assert (big == 7.0).all()  # the strided leaf: untouched
    # The same contract through ckptio.torch.load_state_dict (load_into underneath).
    torch = pytest.importorskip("torch")
    import ckptio.torch as ct

    m = torch.nn.Linear(4, 4)
    ckptio.save(m.state_dict(), ckpt, overwrite=True)
    with ckptio.open(ckpt) as r:
        ((_, _, file, file_offset, _, _),) = r._r.chunks(r.info("weight").index)
    with open(ckpt / file, "r+b") as f:
        f.seek(file_offset + 3)
        byte = f.read(1)
        f.seek(file_offset + 3)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ckptio.ChecksumMismatch) as e:
        ct.load_state_dict(m, ckpt)
    assert set(e.value.tensors) == {"bias", "weight"}  # type: ignore[attr-defined]
