# SPDX-License-Identifier: Apache-2.0
"""Loads that take resident ranges from the page cache: the cache option and its stats."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

import ckptio


def _state() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "big": rng.standard_normal((1024, 1031)).astype(np.float32),  # not whole pages
        "small": [rng.integers(0, 255, 20000 + 517 * i, dtype=np.uint8) for i in range(40)],
        "step": np.int64(12),
    }


def _files(path: pathlib.Path) -> list[pathlib.Path]:
    return [p for p in (path / "data").iterdir()]


def _evict(path: pathlib.Path) -> None:
    for p in _files(path):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _warm(path: pathlib.Path) -> None:
    for p in _files(path):
        p.read_bytes()


def _same(a: dict, b: dict) -> None:
    np.testing.assert_array_equal(a["big"], b["big"])
    assert len(a["small"]) == len(b["small"])
    for x, y in zip(a["small"], b["small"]):
        np.testing.assert_array_equal(x, y)
    assert int(a["step"]) == int(b["step"])


def _saved_and_loaded_cold(ckpt: pathlib.Path) -> tuple[dict, ckptio.Stats]:
    """The state saved at ckpt, then loaded from the device: (state, the load's stats); skips
    where O_DIRECT is not in effect (every read then goes through the page cache)."""
    st = _state()
    ckptio.save(st, ckpt)
    _evict(ckpt)
    _same(ckptio.load(ckpt), st)
    cold = ckptio.last_load_stats()
    assert cold is not None
    if not cold.direct:
        pytest.skip("O_DIRECT is not in effect here: every read goes through the page cache")
    return st, cold


def test_cache_auto_and_never(ckpt: pathlib.Path) -> None:
    st, cold = _saved_and_loaded_cold(ckpt)
    # a ckptio save writes around the cache, and a load from the device leaves it out too
    assert cold.cache_bytes == 0 and cold.io_bytes >= cold.bytes
    _warm(ckpt)
    _same(ckptio.load(ckpt), st)
    warm = ckptio.last_load_stats()
    # (the page cache may drop some of it meanwhile: those bytes come from the device)
    assert warm is not None and warm.cache_bytes > 0
    assert warm.cache_bytes + warm.io_bytes >= warm.bytes
    _same(ckptio.load(ckpt, cache="never", verify_threads=1), st)
    never = ckptio.last_load_stats()
    assert never is not None and never.cache_bytes == 0 and never.io_bytes >= never.bytes


def test_direct_is_what_the_load_used(ckpt: pathlib.Path) -> None:
    """stats.direct says whether O_DIRECT read any of the data: a load whose bytes all came
    from the page cache says False, one from the device True."""
    st, cold = _saved_and_loaded_cold(ckpt)
    assert cold.io_bytes >= cold.bytes
    _warm(ckpt)
    _same(ckptio.load(ckpt), st)
    warm = ckptio.last_load_stats()
    assert warm is not None and warm.cache_bytes > 0
    # (pages the cache dropped meanwhile come from the device, with O_DIRECT)
    assert warm.direct == (warm.io_bytes > 0), warm


def test_direct_off_leaves_the_checkpoint_resident(ckpt: pathlib.Path) -> None:
    """Saved or loaded with direct=False, the files stay in the page cache for the next load."""
    st = _state()
    ckptio.save(st, ckpt, direct=False)
    _same(ckptio.load(ckpt), st)
    s = ckptio.last_load_stats()
    assert s is not None
    if s.direct:
        assert s.cache_bytes > 0
    _evict(ckpt)
    _same(ckptio.load(ckpt, direct=False), st)
    _same(ckptio.load(ckpt), st)
    s = ckptio.last_load_stats()
    assert s is not None
    if s.direct:
        assert s.cache_bytes > 0


def test_reader_read_stats(ckpt: pathlib.Path) -> None:
    ckptio.save(_state(), ckpt)
    _warm(ckpt)
    with ckptio.open(ckpt, verify_threads=2) as r:
        r.verify()
        cache, device, requests, merged, threads = r._r.read_stats()
        assert cache + device > 0 and threads >= 1 and requests >= 0 and merged >= 0
        assert r.stats().cache_bytes == cache


@pytest.mark.parametrize("bad", ["always", 1, True])
def test_cache_option_checked(ckpt: pathlib.Path, bad: object) -> None:
    ckptio.save(_state(), ckpt)
    with pytest.raises(ckptio.InvalidRequest, match="cache"):
        ckptio.load(ckpt, cache=bad)


def test_cache_fill_leaves_the_checkpoint_resident(ckpt: pathlib.Path) -> None:
    """cache="fill" reads every byte through the page cache: the next load takes them from it."""
    st, first = _saved_and_loaded_cold(ckpt)
    _same(ckptio.load(ckpt), st)
    again = ckptio.last_load_stats()
    assert again is not None and again.cache_bytes == 0  # O_DIRECT left nothing behind
    _same(ckptio.load(ckpt, cache="fill"), st)
    filled = ckptio.last_load_stats()
    assert filled is not None and filled.cache_bytes + filled.io_bytes >= filled.bytes
    _same(ckptio.load(ckpt), st)
    warm = ckptio.last_load_stats()
    # The kernel may reclaim a few pages in between (those come from the device): most of the
    # state must come from the cache, and none of it did before the fill.
    assert warm is not None and warm.cache_bytes >= warm.bytes // 2
