# SPDX-License-Identifier: Apache-2.0
"""ckptio._core's async engine binding: Pool, take, Snapshot, commit_async, Completion."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import ckptio
from ckptio import _core
from ckptio._dtypes import F32
from ckptio.ranks._dist import SingleRank


def _items(a: np.ndarray, b: np.ndarray) -> list[tuple]:
    return [
        ("a", F32, a.shape, a, None, None, 0),
        ("b", F32, b.shape, b, None, None, 0),
    ]


def _pool(cap: int) -> _core.Pool:
    return _core.Pool(pinned=_core.SWITCH_OFF, max_bytes=cap)


def test_take_commit_async_round_trip(tmp_path: pathlib.Path) -> None:
    a = np.arange(1 << 16, dtype=np.float32)
    b = np.ones((64, 32), np.float32)
    pool = _pool(64 << 20)
    s = _core.take(pool, _items(a, b))
    assert [(n, sh, nb) for n, _, sh, _, _, _, nb in s.items()] == [
        ("a", a.shape, a.nbytes), ("b", b.shape, b.nbytes)]
    st = s.stats()
    assert st.copied_bytes == a.nbytes + b.nbytes and st.written_bytes == 0
    a[:] = -1  # the snapshot holds the values as they were at the take
    u = pool.stats()
    assert u.lent == u.held == a.nbytes + b.nbytes and not u.pinned
    w = _core.Writer(str(tmp_path / "ck"))
    w.set_meta("k", b"v")
    c = _core.commit_async(s, w)
    assert w.closed  # the completion owns the writer now
    with pytest.raises(ckptio.CheckpointError):
        s.items()  # and the snapshot
    stats = c.wait(60)
    assert stats is not None and stats.bytes >= b.nbytes and c.done()
    assert c.stats().bytes == stats.bytes
    c.close()
    assert pool.stats().lent == 0
    out = ckptio.load(str(tmp_path / "ck"))
    assert np.array_equal(out["a"], np.arange(1 << 16, dtype=np.float32))
    assert np.array_equal(out["b"], b)
    held = pool.stats().held
    assert pool.release() == held and pool.stats().held == 0


def test_take_over_cap(tmp_path: pathlib.Path) -> None:
    """Without a writer what does not fit is a LimitExceeded; with one, it is written now."""
    a = np.arange(3 << 18, dtype=np.float32).reshape(768, 1024)  # 3 MiB
    b = np.ones(16, np.float32)
    pool = _pool(2 << 20)
    with pytest.raises(ckptio.LimitExceeded):
        _core.take(pool, _items(a, b))
    assert pool.stats().lent == 0
    w = _core.Writer(str(tmp_path / "ck"), {"staging_bytes": 1 << 20})
    s = _core.take(pool, _items(a, b), w)
    st = s.stats()
    assert st.split == 1 and st.written_bytes > 0 and st.copied_bytes <= 2 << 20
    _core.commit_async(s, w).wait()
    out = ckptio.load(str(tmp_path / "ck"))
    assert np.array_equal(out["a"], a) and np.array_equal(out["b"], b)


def test_save_dist_async_single_rank(tmp_path: pathlib.Path) -> None:
    a = np.arange(1000, dtype=np.float32)
    b = np.zeros((3, 4), np.float32)
    pool = _pool(16 << 20)
    s = _core.take(pool, _items(a, b))
    c = _core.save_dist_async(s, str(tmp_path / "ck"), SingleRank(), [("k", b"v")], None, 30.0)
    assert c.wait() is not None
    c.close()
    out = ckptio.load(str(tmp_path / "ck"))
    assert np.array_equal(out["a"], a) and np.array_equal(out["b"], b)


def test_completion_error_and_next_take(tmp_path: pathlib.Path) -> None:
    """A commit's error is raised by wait(); one nobody waited for by the next take."""
    a = np.ones(8, np.float32)
    pool = _pool(1 << 20)
    for waited in (True, False):
        path = tmp_path / f"ck{waited}"
        s = _core.take(pool, _items(a, a[:4]))
        w = _core.Writer(str(path))
        path.mkdir()  # a checkpoint appears at the path before the commit publishes
        (path / "manifest").write_bytes(b"x")
        c = _core.commit_async(s, w)
        if waited:
            with pytest.raises(ckptio.CheckpointExists):
                c.wait()
            c.close()
        else:
            while not c.done():
                pass
            c.close()
            with pytest.raises(ckptio.CheckpointExists):
                _core.take(pool, _items(a, a[:4]))
            _core.take(pool, _items(a, a[:4])).free()  # reported once
    assert pool.stats().lent == 0
