# SPDX-License-Identifier: Apache-2.0
"""The Python communicator glue (ckptio._core's ckptio_comm table over a Python object) and
resolve(), without any distributed runtime: ranks are threads of this process."""

from __future__ import annotations

import errno
import sys
import threading
from typing import Any

import pytest

import ckptio
from ckptio import _core
from ckptio.ranks import _comm

CORRUPT = _core.errors()["CKPTIO_E_CORRUPT"]
USAGE = _core.errors()["CKPTIO_E_USAGE"]


class ThreadGroup:
    """n ranks as threads: each collective is a rendezvous on a shared table, keyed by the
    operation's sequence number, waited for with the call's timeout."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.cond = threading.Condition()
        self.slots: dict[int, dict[int, bytes | None]] = {}


class ThreadComm:
    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group, self.rank, self.size, self.seq = group, rank, group.n, 0

    def _meet(self, data: bytes | None, timeout: float, need: list[int]) -> dict[int, Any]:
        g = self.group
        self.seq += 1
        with g.cond:
            g.slots.setdefault(self.seq, {})[self.rank] = data
            g.cond.notify_all()
            if not g.cond.wait_for(lambda: all(r in g.slots[self.seq] for r in need), timeout):
                raise TimeoutError(f"rank {self.rank}: op {self.seq} timed out")
            return dict(g.slots[self.seq])

    def barrier(self, timeout: float) -> None:
        self._meet(None, timeout, list(range(self.size)))

    def broadcast(self, root: int, data: bytes | None, timeout: float) -> bytes:
        got = self._meet(data, timeout, [root])
        return got[root]

    def gather(self, root: int, data: bytes, timeout: float) -> list[bytes] | None:
        need = list(range(self.size)) if self.rank == root else [self.rank]
        got = self._meet(data, timeout, need)
        return [got[r] for r in range(self.size)] if self.rank == root else None


def payload(r: int) -> bytes:
    """Rank r's payload in _comm_selftest (its C side: selftest_len, selftest_fill)."""
    n = 0 if r == 1 else (r * 4099 + 5) % 20011
    return bytes((r * 31 + i * 7) & 0xFF for i in range(n))


def check_selftest(results: dict[int, dict[str, Any]], n: int, fail_rank: int) -> None:
    """What every rank of _comm_selftest must have seen (bytes values, or hex from JSON)."""
    b = lambda v: bytes.fromhex(v) if isinstance(v, str) else v  # noqa: E731
    assert sorted(results) == list(range(n))
    everything = b"".join(payload(r) for r in range(n))
    summary = f"{n} ranks, {len(everything)} bytes, sum {sum(everything) % 2**32}".encode()
    for r, res in results.items():
        assert "error" not in res, res
        assert (res["rank"], res["size"]) == (r, n)
        if r == 0:
            assert [b(x) for x in res["gathered"]] == [payload(i) for i in range(n)]
        else:
            assert res["gathered"] is None
        if r == n - 1:
            assert [b(x) for x in res["gathered_last"]] == [bytes([i]) for i in range(n)]
        else:
            assert res["gathered_last"] is None
        assert b(res["summary"]) == summary
        assert b(res["empty"]) == b""
        assert res["agree"] == 0
        if fail_rank >= 0:
            code, msg = res["agree_fail"]
            assert code == CORRUPT
            assert msg.startswith(f"rank {fail_rank} of {n}: failure injected on rank {fail_rank}")


def run_threads(comms: list[Any], timeout: float, fail_rank: int = -1,
                absent: int | None = None) -> dict[int, Any]:
    results: dict[int, Any] = {}

    def one(c: Any) -> None:
        try:
            results[c.rank] = _core._comm_selftest(c, timeout, fail_rank)
        except Exception as e:
            results[c.rank] = e

    threads = [threading.Thread(target=one, args=(c,)) for c in comms if c.rank != absent]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


@pytest.mark.parametrize("n", [1, 2, 4])
def test_selftest_through_threads(n: int) -> None:
    group = ThreadGroup(n)
    results = run_threads([ThreadComm(group, r) for r in range(n)], 10.0, n - 1)
    check_selftest(results, n, n - 1)


def test_absent_rank_times_out_with_the_callback_message() -> None:
    group = ThreadGroup(3)
    results = run_threads([ThreadComm(group, r) for r in range(3)], 0.5, absent=2)
    assert sorted(results) == [0, 1]
    for r, e in results.items():
        assert isinstance(e, ckptio.CheckpointError), e
        assert e.code == -errno.ETIMEDOUT
        assert f"on rank {r} of 3: the other ranks did not all arrive within 0.5 s" in str(e)
        assert f"the communicator raised TimeoutError: rank {r}: op" in str(e)
        assert isinstance(e.__cause__, TimeoutError)
    # Rank 0 waits for rank 2 in the first gather; rank 1 passes it (it only sends) and waits
    # for rank 0's broadcast.
    assert results[0].__notes__ == ["gather to rank 0"]
    assert results[1].__notes__ == ["broadcast from rank 0"]


class Single:
    rank, size = 0, 1

    def barrier(self, timeout: float) -> None:
        pass

    def broadcast(self, root: int, data: bytes | None, timeout: float) -> bytes:
        return data or b""

    def gather(self, root: int, data: bytes, timeout: float) -> list[bytes] | None:
        return [data]


class Raises(Single):
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def gather(self, root: int, data: bytes, timeout: float) -> list[bytes] | None:
        raise self.exc


class RaisesFresh(Single):
    def gather(self, root: int, data: bytes, timeout: float) -> list[bytes] | None:
        raise TimeoutError("x")


@pytest.mark.parametrize(
    "exc, code",
    [
        (TimeoutError("slow"), -errno.ETIMEDOUT),
        (ConnectionResetError("peer gone"), -errno.ECONNRESET),
        (MemoryError(), -errno.ENOMEM),
        (RuntimeError("transport broke"), -errno.ECOMM),
    ],
)
def test_callback_exception_becomes_code(exc: BaseException, code: int) -> None:
    with pytest.raises(ckptio.CheckpointError) as info:
        _core._comm_selftest(Raises(exc), 1.0)
    assert info.value.code == code
    assert info.value.__cause__ is exc
    assert type(exc).__name__ in str(info.value)


class WrongCount(Single):
    def gather(self, root: int, data: bytes, timeout: float) -> list[bytes] | None:
        return [data, data]


class NotBytes(Single):
    def gather(self, root: int, data: bytes, timeout: float) -> list[bytes] | None:
        return [12]  # type: ignore[list-item]


@pytest.mark.parametrize("comm, what", [(WrongCount(), "2 items"), (NotBytes(), "int")])
def test_bad_gather_result_is_usage_error(comm: Any, what: str) -> None:
    with pytest.raises(ckptio.InvalidRequest) as info:
        _core._comm_selftest(comm, 1.0)
    assert info.value.code == USAGE
    assert what in str(info.value)


def test_buffers_other_than_bytes_are_accepted() -> None:
    class Views(ThreadComm):
        def broadcast(self, root: int, data: bytes | None, timeout: float) -> Any:
            return memoryview(bytearray(super().broadcast(root, data, timeout)))

        def gather(self, root: int, data: bytes, timeout: float) -> Any:
            got = super().gather(root, data, timeout)
            return None if got is None else tuple(bytearray(x) for x in got)

    group = ThreadGroup(2)
    check_selftest(run_threads([Views(group, r) for r in range(2)], 10.0, 0), 2, 0)


def test_no_reference_leaks() -> None:
    ok, bad = Single(), RaisesFresh()
    _core._comm_selftest(ok, 1.0, 0)
    before = (sys.getrefcount(ok), sys.getrefcount(bad))
    for _ in range(50):
        _core._comm_selftest(ok, 1.0, 0)
        with pytest.raises(ckptio.CheckpointError) as info:
            _core._comm_selftest(bad, 1.0)
        del info
    assert (sys.getrefcount(ok), sys.getrefcount(bad)) == before


def test_capsule_holds_a_table() -> None:
    obj = Single()
    before = sys.getrefcount(obj)
    cap = _core._comm_new(obj)
    assert sys.getrefcount(obj) == before + 1
    del cap
    assert sys.getrefcount(obj) == before


def test_bad_rank_or_size_refused() -> None:
    class Bad(Single):
        rank, size = 3, 2

    with pytest.raises(ValueError, match="rank 3"):
        _core._comm_new(Bad())


def test_resolve() -> None:
    assert _comm.resolve(None) is None
    mine = Single()
    assert _comm.resolve(mine) is mine
    with pytest.raises(ckptio.InvalidRequest, match="'torch', 'jax', 'mpi'"):
        _comm.resolve("nccl")
    with pytest.raises(ckptio.InvalidType, match="got a object"):
        _comm.resolve(object())


def test_resolve_ranks_only() -> None:
    """collective=False: the one resolver's answer for loads, this process's (rank, size) with
    nothing created, and the same refusals as a collective resolve."""
    assert _comm.resolve(None, collective=False) is None
    assert _comm.resolve(Single(), collective=False) == _comm.Ranks(0, 1)

    class Plain:  # rank and size only: enough to know this process's place, not to exchange
        rank, size = 2, 4

    assert _comm.resolve(Plain(), collective=False) == (2, 4)
    with pytest.raises(ckptio.InvalidType, match="got a Plain"):
        _comm.resolve(Plain())
    with pytest.raises(ckptio.InvalidRequest, match="'torch', 'jax', 'mpi'"):
        _comm.resolve("nccl", collective=False)
    with pytest.raises(ckptio.InvalidType, match="got a object"):
        _comm.resolve(object(), collective=False)


def test_one_resolver() -> None:
    """comm= is turned into ranks in one place: the other two resolvers are gone."""
    from ckptio.ranks import _dist, _share

    assert not hasattr(_share, "_world") and not hasattr(_dist, "rank_of")


def test_docstring_examples() -> None:
    import doctest

    assert doctest.testmod(_comm).failed == 0
