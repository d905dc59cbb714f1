# SPDX-License-Identifier: Apache-2.0
"""The compression bench cell's pure parts (bench/compress_cell.py): entropy bound, byte grouping and XOR deltas on small arrays."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest

# The cell is a script beside this test (bench/ is no package): its folder goes on the path, as
# the bench's own scripts do. It lives in bench/, not tests/, as nothing reaches into bench/.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import compress_cell as C  # noqa: E402


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """bf16 bit patterns of float32 values, truncated (enough for fields and entropies)."""
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def test_entropy_bits() -> None:
    assert C.entropy_bits(np.zeros(100, np.uint8)) == 0.0
    assert C.entropy_bits(np.arange(256, dtype=np.uint8)) == pytest.approx(8.0)
    assert C.entropy_bits(np.array([0, 1] * 50, np.uint8)) == pytest.approx(1.0)
    # p = (1/2, 1/4, 1/4): 1.5 bits
    assert C.entropy_bits(np.array([7, 7, 3, 9], np.uint8)) == pytest.approx(1.5)
    assert C.entropy_bits(np.zeros(0, np.uint8)) == 0.0


def test_exponent_field() -> None:
    one, two, half = 0x3F80, 0x4000, 0x3F00  # bf16 1.0, 2.0, 0.5: biased exponents 127, 128, 126
    got = C.exponent_field(np.array([one, two, half, 0x8000 | one], np.uint16), "bf16")
    assert got.tolist() == [127, 128, 126, 127]  # the sign is not part of it
    f = np.array([1.0, 2.0, 0.5, -0.0, np.inf], np.float32).view(np.uint32)
    assert C.exponent_field(f, "f32").tolist() == [127, 128, 126, 0, 255]
    assert C.exponent_field(bf16_bits(np.array([3.0, -3.0, 1e-3])), "bf16").tolist() == [128, 128, 117]


def test_bound_bytes() -> None:
    # One exponent everywhere: H = 0, so only sign + mantissa remain (8 of 16 bits, 24 of 32).
    assert C.bound_bytes(np.full(1000, 0x3F80, np.uint16), "bf16") == pytest.approx(1000 * 8 / 8)
    assert C.bound_bytes(np.full(1000, 0x3F800000, np.uint32), "f32") == pytest.approx(1000 * 24 / 8)
    # Two exponents, equally often: H = 1 bit.
    b = np.array([0x3F80, 0x4000] * 500, np.uint16)
    assert C.bound_bytes(b, "bf16") == pytest.approx(1000 * 9 / 8)
    # Weight-like values: the bound ratio sits where the literature puts bf16 (about 1.5x).
    w = bf16_bits(np.random.default_rng(0).normal(0, 0.02, 1 << 16))
    h = C.exponent_entropy(w, "bf16")
    assert 2.0 < h < 3.5
    assert w.nbytes / C.bound_bytes(w, "bf16") == pytest.approx(16 / (8 + h))


def test_plane_bound_bytes() -> None:
    # Low byte uniform over 256 values (8 bits), high byte constant (0 bits).
    b = (np.arange(1024, dtype=np.uint16) % 256) | 0x4000
    assert C.plane_bound_bytes(b, "bf16") == pytest.approx(1024 * 8 / 8)
    assert C.plane_bound_bytes(np.zeros(64, np.uint32), "f32") == 0.0


def test_byte_planes_and_interleave() -> None:
    b = np.array([0x0102, 0x0304, 0x0506], np.uint16).view(np.uint8)
    planes = C.byte_planes(b, 2)
    assert planes.shape == (2, 3)
    assert planes[0].tolist() == [0x02, 0x04, 0x06]  # little-endian: low bytes first
    assert planes[1].tolist() == [0x01, 0x03, 0x05]
    assert all(p.flags.c_contiguous for p in planes)
    rng = np.random.default_rng(1)
    for width in (2, 4):
        raw = rng.integers(0, 256, 4096 * width, dtype=np.uint8)
        back = np.empty_like(raw)
        C.interleave(list(C.byte_planes(raw, width)), back)
        assert np.array_equal(back, raw)
    with pytest.raises(AssertionError):
        C.byte_planes(np.zeros(3, np.uint8), 2)


def test_xor_delta() -> None:
    rng = np.random.default_rng(2)
    old = rng.integers(0, 1 << 16, 1000, dtype=np.uint16)
    new = old.copy()
    new[::10] ^= 1  # a few mantissa bits moved
    d = C.xor_delta(new, old)
    assert np.count_nonzero(d) == 100 and set(d[d != 0].tolist()) == {1}
    assert np.array_equal(C.xor_delta(d, old), new) and np.array_equal(C.xor_delta(d, new), old)
    assert not C.xor_delta(old, old).any()
    with pytest.raises(AssertionError):
        C.xor_delta(new, old.astype(np.uint32))


def test_zstd_part_round_trips_and_keeps_raw() -> None:
    pytest.importorskip("zstandard")
    rng = np.random.default_rng(3)
    w = C.Part("bf16", bf16_bits(rng.normal(0, 0.02, (1 << 19) + 5)))  # not a multiple of a block
    for grouped in (False, True):
        stored, cs, ds = C.zstd_part(w, 1, grouped)
        assert 0 < stored < w.nbytes and cs > 0 and ds > 0
    # Random bytes never grow: a piece that does not shrink is kept raw.
    noise = C.Part("f32", rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint32))
    assert C.zstd_part(noise, 3, True)[0] == noise.nbytes
    assert math.isfinite(noise.nbytes / C.bound_bytes(noise.bits, "f32"))


def test_block_bound_bytes() -> None:
    # Two blocks, each with one exponent of its own: 0 bits per block, 1 bit over the whole.
    n = C.BLOCK // 2
    b = np.concatenate([np.full(n, 0x3F80, np.uint16), np.full(n, 0x4000, np.uint16)])
    assert C.block_bound_bytes(b, "bf16") == pytest.approx(b.size * 8 / 8)
    assert C.bound_bytes(b, "bf16") == pytest.approx(b.size * 9 / 8)
    # A short tail block counts too.
    assert C.block_bound_bytes(b[: n + 10], "bf16") == pytest.approx((n + 10) * 8 / 8)


def test_incompressible_state() -> None:
    import torch

    st = C.incompressible_state(1 << 16, tensors=4)
    assert len(st) == 4 and all(t.dtype == torch.bfloat16 and t.numel() == 1 << 13 for t in st.values())
    bits = C.bits_of(list(st.values()), "bf16")
    assert C.exponent_entropy(bits, "bf16") > 7.9  # every exponent about equally often
    assert C.incompressible_state(1 << 16, tensors=4)["noise.0"].view(torch.int16).equal(st["noise.0"].view(torch.int16))
