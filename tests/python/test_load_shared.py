# SPDX-License-Identifier: Apache-2.0
"""load(comm=...) of bytes several ranks read: through the page cache, each rank starting at
its own 1/N (ckptio.ranks._share); 4 torch gloo ranks launched here (tests/python/dist/
load_shared_torch.py), bounded, on 127.0.0.1."""

from __future__ import annotations

import pathlib
import sys

import pytest

from ckptio.ranks import _share
from test_comm_dist import DIST, launch, results
from test_dist_save import no_error, torch_env

N = 4
# tests/python/dist/load_shared_torch.py's SIZES, f32.
TOTAL = 4 * sum([1 << 18, 3 << 16, 1 << 18, 5, 1 << 17, 1 << 18, 100, 1 << 18])


class FakeComm:
    def __init__(self, rank: int, size: int) -> None:
        self.rank = rank
        self.size = size


def test_plan_one_process_or_direct_is_unshared() -> None:
    np = pytest.importorskip("numpy")
    like = {"a": np.zeros(1000, np.float32)}
    assert _share.plan(None, like, {}) is None
    assert _share.plan(None, None, {}) is None
    assert _share.plan(FakeComm(0, 1), like, {}) is None
    assert _share.plan(FakeComm(2, 4), like, {"direct": True}) is None
    s = _share.plan(FakeComm(2, 4), like, {})
    assert s is not None and (s.index, s.size) == (2, 4)
    s = _share.plan(FakeComm(1, 3), None, {"direct": False})
    assert s is not None and (s.index, s.size) == (1, 3)


def test_read_starts_at_own_share_and_wraps(tmp_path: pathlib.Path) -> None:
    np = pytest.importorskip("numpy")
    import ckptio
    from ckptio import _core

    # Ten tensors of 100 bytes: four parts of 250 bytes, a tensor going with its first byte.
    want = {f"t{i}": np.full(25, i, np.float32) for i in range(10)}
    ckptio.save(want, tmp_path / "ck")
    for index, first in [(0, [0, 1, 2]), (1, [3, 4]), (2, [5, 6, 7]), (3, [8, 9])]:
        with ckptio.open(tmp_path / "ck", direct=False) as r:
            core = r._r
            bufs = [bytearray(100) for _ in range(10)]
            regions = [_core.read_region(core.find(f"t{i}"), None, None, bufs[i], 0, 100)
                       for i in range(10)]  # fmt: skip
            _share.read(core, regions, _share.Share(index, 4))
        assert _share.last is not None
        tensors = _share.last["tensors"]
        assert tensors[0] == first
        assert sorted(t for c in tensors for t in c) == list(range(10))  # each region once
        assert _share.last["first"] == 1000 * index // 4 and _share.last["rounds"] == 1
        assert sum(_share.last["parts"]) == 1000
        for i in range(10):
            assert bytes(bufs[i]) == want[f"t{i}"].tobytes()


def test_torch_replicated_load(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "out"
    out.mkdir()
    argv = [sys.executable, str(DIST / "load_shared_torch.py"), str(tmp_path)]
    launch([argv] * N, torch_env(N), out)

    for tag in ("plain", "replicate"):
        res = results(out, tag)
        no_error(res, N)
        calls = []
        for r, v in sorted(res.items()):
            assert v["exact"] and not v["direct"] and v["bytes"] == TOTAL, (tag, v)
            sh = v["share"]
            # Rank r read its own quarter first, then the next ones, every byte once.
            assert sh["index"] == r and sh["size"] == N, (tag, v)
            assert sum(sh["parts"]) >= TOTAL and sh["parts"][0] > 0, (tag, v)
            calls.append(sh["tensors"])
        firsts = [c[0] for c in calls]
        assert len({tuple(f) for f in firsts}) == N, firsts  # four different starting shares
        for r in range(N):
            assert calls[r] == calls[0][r:] + calls[0][:r], calls
        direct = results(out, "direct")
        reads = [v["read"] for v in res.values()]
        if min(reads) >= 0 and min(v["read"] for v in direct.values()) >= TOTAL:
            # O_DIRECT: each rank reads the whole state from storage; through the page cache
            # the ranks together read it about once.
            assert sum(reads) < 2 * TOTAL, (tag, reads)
    # Shard(0) boxes are this rank's own: read as one process does, no sharing.
    res = results(out, "shard0")
    no_error(res, N)
    for v in res.values():
        assert v["exact"] and v["share"] is None, v
    direct = results(out, "direct")
    no_error(direct, N)
    for v in direct.values():
        assert v["exact"] and v["share"] is None, v
    # A corrupt byte: found by every rank, each reading all of it.
    bad = results(out, "corrupt")
    assert sorted(bad) == list(range(N))
    for v in bad.values():
        assert v["error"] == "ChecksumMismatch", v


def test_plan_rotates_among_the_ranks_of_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    np = pytest.importorskip("numpy")
    like = {"a": np.zeros(1000, np.float32)}
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    s = _share.plan(FakeComm(3, 4), like, {})
    assert s is not None and (s.index, s.size) == (1, 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # not this communicator's hosts
    s = _share.plan(FakeComm(3, 4), like, {})
    assert s is not None and (s.index, s.size) == (3, 4)
