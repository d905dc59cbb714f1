# SPDX-License-Identifier: Apache-2.0
"""PyTorch: tensors of every dtype, state dicts, optimizers, ckptio.torch.save/load."""

from __future__ import annotations

import io
import pathlib
import warnings
import zipfile

import numpy as np
import pytest
import torch

import ckptio
import ckptio.torch

from conftest import leftovers

warnings.filterwarnings("ignore", message="ComplexHalf support is experimental")

DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
    torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.complex32, torch.complex64, torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2,
    torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu,
]  # fmt: skip


def make(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (*shape, dtype.itemsize), generator=g, dtype=torch.uint8)
    if dtype == torch.bool:
        return raw[..., 0] % 2 == 1
    return raw.view(dtype).reshape(shape)  # every bit pattern, nan included


def bits(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous()
    if t.dtype == torch.bool:
        return t.numpy().tobytes()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and bits(a) == bits(b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_round_trips(ckpt: pathlib.Path, dtype: torch.dtype) -> None:
    tree = {"s": make(dtype, ()), "v": make(dtype, (5,)), "m": make(dtype, (33, 130))}
    ckptio.save(tree, ckpt)
    out = ckptio.load(ckpt)
    for k in tree:
        assert same(out[k], tree[k]), k
    if dtype.itemsize * 33 * 130 >= 4096:
        assert out["m"].data_ptr() % 4096 == 0


def test_views_noncontiguous_and_tied(ckpt: pathlib.Path) -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    emb = torch.nn.Parameter(torch.randn(10, 8))
    tree = {
        "t": base.t(),
        "slice": base[1:3, ::2],
        "expanded": torch.ones(3, 1).expand(3, 4),
        "neg": -torch.ones(2, dtype=torch.complex64).conj(),
        "emb": emb,
        "head": emb,  # the same object
        "emb_view": emb.detach(),  # the same view of the same storage
    }
    st = ckptio.save(tree, ckpt)
    assert st.bytes == sum(tree[k].numel() * tree[k].element_size() for k in ("t", "slice", "expanded", "neg", "emb"))
    out = ckptio.load(ckpt)
    for k in ("t", "slice", "expanded", "neg"):
        assert torch.equal(out[k], tree[k].resolve_conj()), k
        assert out[k].is_contiguous()
    assert out["emb"] is out["head"]
    assert out["emb_view"].data_ptr() == out["emb"].data_ptr()
    assert type(out["emb"]) is torch.nn.Parameter and out["emb"].requires_grad
    assert type(out["emb_view"]) is torch.Tensor and not out["emb_view"].requires_grad


def test_requires_grad_and_parameters(ckpt: pathlib.Path) -> None:
    tree = {
        "p": torch.nn.Parameter(torch.randn(3)),
        "frozen": torch.nn.Parameter(torch.randn(3), requires_grad=False),
        "leaf": torch.randn(2, requires_grad=True),
        "int_param": torch.nn.Parameter(torch.arange(3), requires_grad=False),
    }
    ckptio.save(tree, ckpt)
    out = ckptio.load(ckpt)
    assert type(out["p"]) is torch.nn.Parameter and out["p"].requires_grad
    assert type(out["frozen"]) is torch.nn.Parameter and not out["frozen"].requires_grad
    assert type(out["leaf"]) is torch.Tensor and out["leaf"].requires_grad and out["leaf"].is_leaf
    assert type(out["int_param"]) is torch.nn.Parameter


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(2))
        self.norm = torch.nn.BatchNorm1d(16)
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight  # tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for layer in self.layers:
            h = torch.relu(layer(h))
        return self.head(self.norm(h))


def trained() -> tuple[Net, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    for _ in range(3):
        opt.zero_grad()
        net(torch.randint(0, 50, (8,))).logsumexp(-1).sum().backward()
        opt.step()
    return net, opt


def assert_tree_equal(a: object, b: object) -> None:
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, dict):
        assert list(a) == list(b)  # type: ignore[arg-type]
        for k in a:
            assert_tree_equal(a[k], b[k])  # type: ignore[index]
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)  # type: ignore[arg-type]
        for x, y in zip(a, b):  # type: ignore[call-overload]
            assert_tree_equal(x, y)
    elif isinstance(a, torch.Tensor):
        assert same(a, b), (a, b)  # type: ignore[arg-type]
    else:
        assert a == b or (a != a and b != b), (a, b)


def test_state_dicts_round_trip_and_load_into_fresh_objects(ckpt: pathlib.Path) -> None:
    net, opt = trained()
    state = {"model": net.state_dict(), "optim": opt.state_dict(), "epoch": 3}
    ckptio.save(state, ckpt)
    out = ckptio.load(ckpt)
    assert_tree_equal(out, state)
    assert out["model"]._metadata == state["model"]._metadata
    # Tied weights share memory after loading too.
    assert out["model"]["emb.weight"].data_ptr() == out["model"]["head.weight"].data_ptr()
    fresh = Net()
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    fresh.load_state_dict(out["model"])
    fresh_opt.load_state_dict(out["optim"])
    assert_tree_equal(fresh.state_dict(), net.state_dict())
    assert_tree_equal(fresh_opt.state_dict(), opt.state_dict())
    # Training continues identically.
    x = torch.randint(0, 50, (8,))
    for m, o in ((net, opt), (fresh, fresh_opt)):
        o.zero_grad()
        m(x).logsumexp(-1).sum().backward()
        o.step()
    assert_tree_equal(fresh.state_dict(), net.state_dict())


def test_device_and_framework_and_like(ckpt: pathlib.Path) -> None:
    t = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    ckptio.save({"t": t, "c": torch.arange(3.0)}, ckpt)
    out = ckptio.load(ckpt, device="cpu")
    assert out["t"].device.type == "cpu" and same(out["t"], t)
    out = ckptio.load(ckpt, device=torch.device("cpu"))
    assert same(out["t"], t)
    n = ckptio.load(ckpt, framework="numpy")
    assert isinstance(n["t"], np.ndarray) and str(n["t"].dtype) == "bfloat16"
    assert n["t"].astype(np.float32).tolist() == t.float().tolist()
    like = ckptio.load(ckpt, like={"t": torch.empty(2, 3, dtype=torch.float32)})
    assert list(like) == ["t"] and like["t"].dtype == torch.float32
    assert like["t"].tolist() == t.float().tolist()
    with pytest.raises(ckptio.ShapeMismatch):
        ckptio.load(ckpt, like={"t": torch.empty(3, 2)})


def test_refuses_sparse(ckpt: pathlib.Path) -> None:
    with pytest.raises(TypeError, match="'s'.*to_dense"):
        ckptio.save({"s": torch.eye(3).to_sparse()}, ckpt)
    assert not ckpt.exists() and not leftovers(ckpt.parent)


def test_torch_size_and_values(ckpt: pathlib.Path) -> None:
    tree = {"size": torch.Size([2, 3]), "dtype_free": (1, 2.0)}
    ckptio.save(tree, ckpt)
    out = ckptio.load(ckpt)
    assert type(out["size"]) is torch.Size and out["size"] == torch.Size([2, 3])
    free = out["dtype_free"]
    assert type(free) is tuple and free == (1, 2.0)
    assert [type(v) for v in free] == [int, float]


# ---- ckptio.torch.save / load ----


class Custom:
    """Not a weights-only global."""


def torch_tree() -> dict[str, object]:
    net, opt = trained()
    return {
        "model": net.state_dict(),
        "optim": opt.state_dict(),
        "bf16": torch.randn(300, 70).to(torch.bfloat16),
        "f8": make(torch.float8_e5m2, (1000,)),
        "view": torch.arange(100.0)[10:20],
        "big": torch.randn(1 << 20),
        "meta": {"step": 5, "name": "run"},
    }


def test_torch_save_output_opens_with_stock_torch_load(tmp_path: pathlib.Path) -> None:
    obj = torch_tree()
    path = tmp_path / "model.pt"
    st = ckptio.torch.save(obj, path)
    assert st is not None and st.bytes == path.stat().st_size
    loaded = torch.load(path, weights_only=True)
    assert_tree_equal(loaded, obj)
    # A standard zip with valid CRCs, storages aligned to 4096 bytes.
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None
        with open(path, "rb") as f:
            for info in z.infolist():
                if "/data/" in info.filename and info.file_size:
                    f.seek(info.header_offset + 26)
                    n, m = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
                    assert (info.header_offset + 30 + n + m) % 4096 == 0, info.filename
    assert not leftovers(tmp_path)


def test_ckptio_torch_load_equals_torch_load(tmp_path: pathlib.Path) -> None:
    obj = torch_tree()
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    ckptio.torch.save(obj, a)
    torch.save(obj, b)
    for path in (a, b):
        ref = torch.load(path, weights_only=True)
        got = ckptio.torch.load(path)
        assert_tree_equal(got, ref)
        got = ckptio.torch.load(path, weights_only=False, map_location="cpu")
        assert_tree_equal(got, ref)
        got = ckptio.torch.load(path, mmap=True)
        assert_tree_equal(got, ref)
    got = ckptio.torch.load(a)
    assert got["big"].data_ptr() % 4096 == 0
    got["big"][0] = 7.0  # writable memory, not a read-only mapping
    assert got["big"][0] == 7.0


def test_torch_save_and_load_file_objects(tmp_path: pathlib.Path) -> None:
    buf = io.BytesIO()
    ckptio.torch.save({"x": torch.ones(3)}, buf)
    buf.seek(0)
    assert torch.equal(ckptio.torch.load(buf)["x"], torch.ones(3))


def test_torch_save_overwrite_and_weights_only(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "m.pt"
    ckptio.torch.save({"v": torch.zeros(2)}, path)
    ckptio.torch.save({"v": torch.ones(2)}, path)  # like torch.save: replaces
    assert torch.equal(ckptio.torch.load(path)["v"], torch.ones(2))
    with pytest.raises(ckptio.CheckpointExists):
        ckptio.torch.save({"v": torch.ones(2)}, path, overwrite=False)

    class Local:
        pass

    with pytest.raises(AttributeError):  # torch.save fails half way: the old file stays
        ckptio.torch.save({"v": torch.zeros(2), "l": Local()}, path)
    assert torch.equal(ckptio.torch.load(path)["v"], torch.ones(2))

    ckptio.torch.save({"c": Custom()}, tmp_path / "c.pt")
    import pickle

    with pytest.raises(pickle.UnpicklingError):
        ckptio.torch.load(tmp_path / "c.pt")
    assert isinstance(ckptio.torch.load(tmp_path / "c.pt", weights_only=False)["c"], Custom)
    assert not leftovers(tmp_path)


def test_torch_load_legacy_format(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "old.pt"
    torch.save({"x": torch.arange(3)}, path, _use_new_zipfile_serialization=False)
    assert torch.equal(ckptio.torch.load(path)["x"], torch.arange(3))


def test_torch_save_without_crc(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "fast.pt"
    obj = {"w": torch.randn(1000, 100)}
    ckptio.torch.save(obj, path, crc32=False)
    assert torch.equal(torch.load(path, weights_only=True)["w"], obj["w"])
    assert torch.equal(ckptio.torch.load(path)["w"], obj["w"])
    assert torch.serialization.get_crc32_options()  # the global setting is left alone
