# SPDX-License-Identifier: Apache-2.0
"""ckptio.load / ckptio.open on stock safetensors files, whose tensors start at any offset:
a whole tensor is read from the page boundary below it into memory with room before it, so
the read stays direct, and every byte still comes back exact."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
stock_torch = pytest.importorskip("safetensors.torch")
stock_np = pytest.importorskip("safetensors.numpy")

import ckptio  # noqa: E402
import ckptio.safetensors as cst  # noqa: E402

PAGE = 4096


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {
        "a.tiny": torch.arange(37, dtype=torch.uint8),  # makes the offsets after it unaligned
        "b.f32": torch.randn(300, 257, generator=g),
        "c.bf16": torch.randn(513, 129, generator=g).to(torch.bfloat16),
        "d.i64": torch.arange(40_000, dtype=torch.int64),
        "e.small": torch.randn(100, generator=g),
        "f.u8": torch.randint(0, 255, (70_001,), dtype=torch.uint8, generator=g),
    }


def _placed_in_page(ptr: int, offset: int) -> bool:
    """Whether memory at ``ptr`` sits in its page as file ``offset`` does in its page."""
    return ptr % PAGE == offset % PAGE


@pytest.mark.parametrize("fmt", ["pt", None])
def test_stock_file_loads_exact_and_direct(tmp_path: pathlib.Path, fmt: str | None) -> None:
    sd = _state()
    path = tmp_path / "m.safetensors"
    stock_torch.save_file(sd, str(path), metadata={"format": fmt} if fmt else None)
    h = cst.read_header(path)
    unaligned = [n for n, e in h.entries.items() if e.nbytes >= PAGE and e.offset % PAGE]
    assert len(unaligned) >= 3  # the case under test
    got = ckptio.load(path)
    assert sorted(got) == sorted(sd)
    for name, t in sd.items():
        g = got[name]
        raw = t.view(torch.uint8) if t.dtype == torch.bfloat16 else t
        if fmt == "pt":
            assert g.dtype == t.dtype and g.shape == t.shape
            assert torch.equal(g.view(torch.uint8), t.view(torch.uint8)), name
            ptr = g.data_ptr()
        else:
            assert g.shape == tuple(t.shape)
            assert g.tobytes() == raw.numpy().tobytes(), name
            ptr = g.ctypes.data
        e = h.entries[name]
        if name in unaligned:
            assert _placed_in_page(ptr, e.offset), f"{name} at file offset {e.offset}"


def test_open_read_keys_and_regions(tmp_path: pathlib.Path) -> None:
    sd = _state()
    path = tmp_path / "m.safetensors"
    stock_torch.save_file(sd, str(path), metadata={"format": "pt"})
    # cache="never": the file stock just wrote is resident, and io_bytes counts device reads
    with ckptio.open(path, cache="never") as r:
        part = r.load(keys=["b.f32", "d.i64"])
        assert torch.equal(part["b.f32"], sd["b.f32"])
        assert torch.equal(part["d.i64"], sd["d.i64"])
        box = r.read("b.f32", np.s_[10:20, 3:200])
        assert torch.equal(torch.as_tensor(np.asarray(box)), sd["b.f32"][10:20, 3:200])
        whole = r.load()
        for name, t in sd.items():
            assert torch.equal(whole[name].view(torch.uint8), t.view(torch.uint8)), name
        st = r.stats()
        # bytes counts the tensors asked for, not the page edges read around them
        want = sd["b.f32"].nbytes + sd["d.i64"].nbytes + 10 * 197 * 4
        want += sum(t.nbytes for t in sd.values())
        assert st.bytes == want
        assert st.io_bytes >= st.bytes


def test_like_targets_unchanged(tmp_path: pathlib.Path) -> None:
    """Destinations the caller gives (like=) are never written outside the tensor."""
    sd = _state()
    path = tmp_path / "m.safetensors"
    stock_torch.save_file(sd, str(path), metadata={"format": "pt"})
    like = {k: torch.empty_like(v) for k, v in sd.items()}
    got = ckptio.load(path, like=like)
    for name, t in sd.items():
        assert torch.equal(got[name].view(torch.uint8), t.view(torch.uint8)), name


def test_numpy_stock_file_misaligned_elements(tmp_path: pathlib.Path) -> None:
    """A tensor whose elements are misaligned in the file (offset not a multiple of its item
    size) is staged, and still exact."""
    arrs = {"a": np.arange(3, dtype=np.uint8), "b": np.arange(5000, dtype=np.float32)}
    path = tmp_path / "n.safetensors"
    stock_np.save_file(arrs, str(path))
    got = ckptio.load(path)
    for k, v in arrs.items():
        assert got[k].tobytes() == v.tobytes()


def test_save_file_from_page_aligned_memory(tmp_path: pathlib.Path) -> None:
    """Tensors that ckptio loaded sit in page-aligned memory, so save_file writes them from
    that memory (the file writer's in-place path); the file is still exact."""
    g = torch.Generator().manual_seed(5)
    sd = {"big": torch.randn(5_000_000, generator=g), "odd": torch.randn(2_500_001, generator=g)}
    src = tmp_path / "src.safetensors"
    cst.save_file(sd, src)
    loaded = cst.load_file(src)
    assert loaded["big"].data_ptr() % PAGE == 0
    out = tmp_path / "out.safetensors"
    cst.save_file(loaded, out)
    back = stock_torch.load_file(str(out))
    for k, v in sd.items():
        assert torch.equal(back[k], v), k


def test_load_file_reads_unaligned_tensors_in_place(tmp_path: pathlib.Path) -> None:
    """ckptio.safetensors.load_file places big tensors as ckptio.load does (through the C
    reader's lead room), and safe_open's slices come back exact."""
    sd = _state()
    path = tmp_path / "m.safetensors"
    stock_torch.save_file(sd, str(path))
    h = cst.read_header(path)
    got = cst.load_file(path)
    placed = 0
    for name, t in sd.items():
        assert torch.equal(got[name].view(torch.uint8), t.view(torch.uint8)), name
        e = h.entries[name]
        if e.nbytes >= 64 << 10 and e.offset % PAGE and e.offset % t.element_size() == 0:
            assert _placed_in_page(got[name].data_ptr(), e.offset), name
            placed += 1
    assert placed >= 2
    with cst.safe_open(path, framework="pt") as f:
        assert torch.equal(f.get_slice("c.bf16")[7:300, 5:100], sd["c.bf16"][7:300, 5:100])
