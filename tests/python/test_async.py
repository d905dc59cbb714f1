# SPDX-License-Identifier: Apache-2.0
"""ckptio.save_async: snapshot semantics, the host-memory cap, errors, exit and kill."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import ckptio
from ckptio import _async

from conftest import leftovers


class Held:
    """A background save that starts only once ``gate`` is set (it stands in for the
    Completion that ``start`` returns)."""

    def __init__(self, gate: threading.Event, start: Any, *args: Any) -> None:
        self.c: Any = None
        self.err: BaseException | None = None
        self.started = threading.Event()
        threading.Thread(target=self._run, args=(gate, start, args), daemon=True).start()

    def _run(self, gate: threading.Event, start: Any, args: tuple[Any, ...]) -> None:
        assert gate.wait(60), "the test never opened the gate"
        try:
            self.c = start(*args)
        except BaseException as e:
            self.err = e
        self.started.set()

    def done(self) -> bool:
        return self.started.is_set() and (self.c is None or self.c.done())

    def wait(self, timeout: float | None = None) -> Any:
        if not self.started.wait(timeout):
            return None
        if self.err is not None:
            raise self.err
        return self.c.wait(timeout)

    def close(self) -> None:
        self.started.wait()
        if self.c is not None:
            self.c.close()


def hold(monkeypatch: pytest.MonkeyPatch, ev: threading.Event, name: str,
         module: Any = _async) -> None:  # fmt: skip
    """Background saves started by ``module.name`` start only once ``ev`` is set."""
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *args: Held(ev, real, *args))


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Holds every background write until the test sets the event: whatever the caller does
    after save_async returns happens before a single byte is written from the snapshot."""
    ev = threading.Event()
    hold(monkeypatch, ev, "_start_commit")
    yield ev
    ev.set()
    ckptio_wait_all()


@pytest.fixture(autouse=True)
def wait_all() -> Iterator[None]:
    yield
    ckptio_wait_all()


def ckptio_wait_all() -> None:
    h = _async._pending
    if h is not None:
        h._finish(60)
        h._observed = True


def numpy_state() -> dict[str, Any]:
    rng = np.random.default_rng(1)
    return {
        "w": rng.standard_normal((256, 300)).astype(np.float32),
        "b": np.arange(1000, dtype=np.int64),
        "t": rng.standard_normal((64, 64))[:, ::2],  # not contiguous
        "h": np.ones(5, np.float16),
        "s": np.float64(3.5),
        "list": [np.zeros(7, np.uint8), np.full((3, 3), 2, np.int32)],
        "step": 10,
    }


def mutate_numpy(tree: Any) -> None:
    if isinstance(tree, dict):
        for v in tree.values():
            mutate_numpy(v)
    elif isinstance(tree, list):
        for v in tree:
            mutate_numpy(v)
    elif isinstance(tree, np.ndarray):
        tree[...] = 99


def assert_same(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list):
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, (np.ndarray, np.generic)):
        np.testing.assert_array_equal(np.asarray(b), a)
    else:
        assert a == b


def copy_tree(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: copy_tree(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [copy_tree(v) for v in tree]
    if isinstance(tree, np.ndarray):
        return tree.copy()
    return tree


@pytest.mark.parametrize("cap", [None, 0, 200_000, 400_000])
def test_numpy_mutated_after_return(ckpt: pathlib.Path, gate: threading.Event, cap: Any) -> None:
    state = numpy_state()
    snap = copy_tree(state)
    h = ckptio.save_async(state, ckpt, max_host_bytes=cap)
    mutate_numpy(state)  # every tensor, in place, before the background write starts
    assert not h.done()
    gate.set()
    st = h.wait()
    assert h.done() and st.bytes > 0
    assert_same(snap, ckptio.load(ckpt))
    assert leftovers(ckpt.parent) == []


@pytest.mark.parametrize("cap", [None, 20_000])
def test_torch_mutated_after_return(ckpt: pathlib.Path, gate: threading.Event, cap: Any) -> None:
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(64, 32)
    state = {
        "model": lin.state_dict(keep_vars=True),
        "bf16": torch.randn(100, 30, generator=g).to(torch.bfloat16),
        "i64": torch.arange(500),
        "view": torch.randn(40, 40, generator=g).t(),
        "tied": [lin.weight, lin.weight],
    }
    snap = {k: (v.detach().clone() if isinstance(v, torch.Tensor) else None)
            for k, v in state.items()}  # fmt: skip
    w0 = lin.weight.detach().clone()
    b0 = lin.bias.detach().clone()
    h = ckptio.save_async(state, ckpt, max_host_bytes=cap)
    with torch.no_grad():
        lin.weight.add_(1.0)
        lin.bias.mul_(-3.0)
        state["bf16"].fill_(7)
        state["i64"].zero_()
        state["view"].fill_(-1)
    gate.set()
    h.wait()
    out = ckptio.load(ckpt)
    assert torch.equal(out["model"]["weight"], w0) and torch.equal(out["model"]["bias"], b0)
    assert torch.equal(out["tied"][0], w0) and torch.equal(out["tied"][1], w0)
    for k in ("bf16", "i64", "view"):
        assert out[k].dtype == snap[k].dtype and torch.equal(out[k], snap[k]), k


@pytest.mark.parametrize("cap", [None, 9000])
def test_jax_donated_after_return(ckpt: pathlib.Path, gate: threading.Event, cap: Any) -> None:
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    sharded = NamedSharding(mesh, PartitionSpec("x"))
    params = {
        "w": jax.device_put(jnp.arange(4096, dtype=jnp.float32).reshape(64, 64), sharded),
        "b": jnp.ones(33, jnp.bfloat16),
        "n": jnp.arange(10, dtype=jnp.int32),
    }
    snap = {k: np.asarray(v) for k, v in params.items()}

    @jax.jit
    def step(p: Any) -> Any:
        return {k: v * 3 + 1 for k, v in p.items()}

    step_donating = jax.jit(step, donate_argnums=0)
    h = ckptio.save_async(params, ckpt, max_host_bytes=cap)
    new = step_donating(params)  # the old buffers may be reused right away
    new = step_donating(new)
    jax.block_until_ready(new)
    gate.set()
    h.wait()
    out = ckptio.load(ckpt)
    for k, v in snap.items():
        assert isinstance(out[k], jax.Array)
        np.testing.assert_array_equal(np.asarray(out[k]), v)


def test_pool_reuses_exact_size_buffers(tmp_path: pathlib.Path) -> None:
    ckptio_wait_all()
    ckptio.release_buffers()
    state = {"a": np.ones(10_001, np.uint8), "b": np.ones((3, 7), np.float32)}
    ckptio.save_async(state, tmp_path / "1").wait()
    assert _async._PROCESS.pool is not None
    u = _async._PROCESS.pool.stats()
    assert u.held == 10_001 + 84 and u.buffers == 2  # exact sizes, no rounding
    ckptio.save_async(state, tmp_path / "2").wait()
    assert _async._PROCESS.pool.stats().allocations == u.allocations  # the same buffers, reused
    # A different state under a small cap: the unused sizes go first.
    ckptio.save_async({"c": np.ones(20_000, np.uint8)}, tmp_path / "3", max_host_bytes=20_000).wait()
    assert _async._held_bytes() == 20_000
    assert ckptio.release_buffers() == 20_000 and _async._held_bytes() == 0


def test_second_save_waits_for_the_first(tmp_path: pathlib.Path, gate: threading.Event) -> None:
    state = numpy_state()
    h1 = ckptio.save_async(state, tmp_path / "1")
    seen: list[bool] = []

    def second() -> None:
        h2 = ckptio.save_async(state, tmp_path / "2")
        seen.append(h1.done())
        h2.wait()

    t = threading.Thread(target=second)
    t.start()
    time.sleep(0.2)
    assert not seen  # still waiting for the first save
    gate.set()
    t.join(60)
    assert seen == [True]
    h1.wait()
    assert_same(state, ckptio.load(tmp_path / "2"))


def test_existing_path_error_surfaces_on_wait(ckpt: pathlib.Path) -> None:
    ckptio.save({"a": np.zeros(3)}, ckpt)
    for cap in (None, 0):  # in the background, or while writing the overflow in the call
        h = ckptio.save_async({"a": np.ones(3)}, ckpt, max_host_bytes=cap)
        with pytest.raises(ckptio.CheckpointExists):
            h.wait()
        with pytest.raises(ckptio.CheckpointExists):  # again: the error stays
            h.wait()
    assert ckptio.load(ckpt)["a"].tolist() == [0, 0, 0]
    h = ckptio.save_async({"a": np.ones(3)}, ckpt, overwrite=True)
    h.wait()
    assert ckptio.load(ckpt)["a"].tolist() == [1, 1, 1]


def test_unwaited_error_is_raised_by_the_next_save(tmp_path: pathlib.Path) -> None:
    ckptio.save({"a": np.zeros(3)}, tmp_path / "x")
    ckptio.save_async({"a": np.ones(3)}, tmp_path / "x")  # fails; nobody waits
    with pytest.raises(ckptio.CheckpointExists) as e:
        ckptio.save_async({"a": np.ones(3)}, tmp_path / "y")
    assert "nobody waited" in "".join(getattr(e.value, "__notes__", []))
    assert not (tmp_path / "y").exists()
    ckptio.save_async({"a": np.ones(3)}, tmp_path / "y").wait()  # reported once only
    assert ckptio.load(tmp_path / "y")["a"].tolist() == [1, 1, 1]


def test_invalid_tree_raises_in_the_call(ckpt: pathlib.Path) -> None:
    with pytest.raises(ckptio.InvalidType):
        ckptio.save_async({"a": object()}, ckpt)
    with pytest.raises(ckptio.InvalidType):
        ckptio.save_async({"a": np.zeros(1)}, ckpt, max_host_bytes=-1)
    assert not ckpt.exists()


def run_py(script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout
    )


FULL_DISK = """
import errno, sys, numpy as np, ckptio
for cap in (None, 1 << 20):
    h = ckptio.save_async({"a": np.ones(4 << 20, np.uint8)}, sys.argv[1] + "/ckpt",
                          max_host_bytes=cap)
    try:
        h.wait()
    except ckptio.CheckpointIOError as e:
        print(e.errno, e.name, sep="|")
    else:
        print("saved")
"""


def test_enospc_surfaces_on_wait(tmp_path: pathlib.Path) -> None:
    # A full file system: a 1 MiB tmpfs in a private mount namespace (as root).
    if shutil.which("unshare") is None:
        pytest.skip("no unshare command")
    mnt = tmp_path / "small"
    mnt.mkdir()
    script = f"mount -t tmpfs -o size=1m ckptio-test {mnt} && exec {sys.executable} -c \"$0\" {mnt}"
    res = subprocess.run(["unshare", "-m", "sh", "-c", script, FULL_DISK],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    if res.returncode != 0 and "mount" in res.stderr and "ckptio" not in res.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["28|ENOSPC", "28|ENOSPC"], res.stdout


CAP_SCRIPT = """
import os, sys, threading, numpy as np, ckptio

page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page

cap = int(sys.argv[2])
state = {"layers": [np.full(16 << 20, i, np.float32) for i in range(4)]}  # 4 x 64 MiB
base = rss()
peak = [base]
stop = threading.Event()
def sample():
    while not stop.is_set():
        peak[0] = max(peak[0], rss())
        stop.wait(0.0005)
t = threading.Thread(target=sample)
t.start()
for i in range(2):
    h = ckptio.save_async(state, f"{sys.argv[1]}/{i}", max_host_bytes=cap, fsync=False)
    for a in state["layers"]:
        a += 1
    h.wait()
stop.set()
t.join()
out = ckptio.load(f"{sys.argv[1]}/1")
assert [float(a[0]) for a in out["layers"]] == [1.0, 2.0, 3.0, 4.0]
print(peak[0] - base)
"""


def test_host_memory_stays_under_the_cap(tmp_path: pathlib.Path) -> None:
    mib = 1 << 20
    cap = 64 * mib  # a quarter of the state
    res = run_py(CAP_SCRIPT, str(tmp_path), str(cap))
    assert res.returncode == 0, res.stderr
    extra = int(res.stdout)
    # The snapshot buffers (<= cap) plus the writer's own staging and the interpreter's noise.
    assert extra <= cap + 64 * mib, f"peak extra {extra / mib:.0f} MiB over a {cap // mib} MiB cap"
    assert extra >= cap // 2, f"peak extra {extra / mib:.0f} MiB: the sampler saw no copy"


EXIT_SCRIPT = """
import sys, numpy as np, ckptio
ckptio.save_async({"a": np.full(32 << 20, 5, np.uint8), "step": 1}, sys.argv[1])
# exits at once, with the save in flight
"""

EXIT_FAIL_SCRIPT = """
import sys, numpy as np, ckptio
ckptio.save({"a": np.zeros(1)}, sys.argv[1])
ckptio.save_async({"a": np.ones(1)}, sys.argv[1])  # fails: exists; nobody waits
"""


def test_exit_finishes_a_pending_save(ckpt: pathlib.Path) -> None:
    res = run_py(EXIT_SCRIPT, str(ckpt))
    assert res.returncode == 0, res.stderr
    out = ckptio.load(ckpt)
    assert out["step"] == 1 and int(out["a"][-1]) == 5


def test_exit_reports_an_unwaited_error(ckpt: pathlib.Path) -> None:
    res = run_py(EXIT_FAIL_SCRIPT, str(ckpt))
    assert res.returncode == 0, res.stderr
    assert "FAILED and nobody waited" in res.stderr and str(ckpt) in res.stderr, res.stderr
    assert "already exists" in res.stderr


KILL_SCRIPT = """
import sys, time, numpy as np, ckptio
from ckptio import _async

path = sys.argv[1]
ckptio.save({"a": np.zeros(1 << 20, np.uint8), "v": 1}, path)

def stuck(snap, w):
    # max_host_bytes=0: the tensors were written during the call, into the new checkpoint's
    # temporary directory; the commit never starts.
    print("writing", flush=True)
    time.sleep(600)

_async._start_commit = stuck
ckptio.save_async({"a": np.ones(1 << 20, np.uint8), "v": 2}, path, overwrite=True,
                  max_host_bytes=0)
time.sleep(600)
"""


def test_sigkill_during_async_save_keeps_the_previous_checkpoint(ckpt: pathlib.Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(ckpt)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "writing", p.stderr.read() if p.stderr else ""
        assert leftovers(ckpt.parent)  # the new save is under way
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    out = ckptio.load(ckpt)
    assert out["v"] == 1 and int(out["a"].max()) == 0
    ckptio.save_async({"a": np.ones(3), "v": 3}, ckpt, overwrite=True).wait()
    assert ckptio.load(ckpt)["v"] == 3
    assert leftovers(ckpt.parent) == []  # the dead save's temporary directory is gone


def test_exports() -> None:
    assert ckptio.save_async is _async.save_async
    assert "save_async" in ckptio.__all__ and "release_buffers" in ckptio.__all__
    assert _async.default_max_host_bytes() > 0
    assert os.path.basename(_async.__file__) == "_async.py"


def test_populated_buffer_is_exact_size_and_copies() -> None:
    from ckptio import _core

    n = (5 << 20) + 123  # not a multiple of the huge page size
    b = _core.Buffer(n, populate=True)
    assert len(b) == n and b.address % 4096 == 0
    src = np.arange(n, dtype=np.uint64).astype(np.uint8)
    b.copy_from(src[: n - 10], 10)
    b.copy_from(src[n - 10 :])
    got = np.frombuffer(b, np.uint8)
    np.testing.assert_array_equal(got[10:], src[: n - 10])
    np.testing.assert_array_equal(got[:10], src[n - 10 :])
    with pytest.raises(ValueError):
        b.copy_from(src[:11], n - 10)
    with pytest.raises(ValueError):
        b.copy_from(src[:1], -1)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_pool_buffers_are_faulted_in_when_made() -> None:
    # The copy of a save must not page-fault: the pool's buffers are resident once taken
    # (the source here is untouched zero pages, so only the buffer adds to the RSS).
    ckptio_wait_all()
    ckptio.release_buffers()
    n = 64 << 20
    src = np.zeros(n, np.uint8)
    before = _rss()
    pool = _async._pool(False)
    pool.set_max_bytes(n)
    snap = _async._core.take(pool, [("z", 1, (n,), src, None, None, 0)], None)
    try:
        assert _rss() - before >= n * 9 // 10
        assert pool.stats().lent == n
    finally:
        snap.free()
        ckptio.release_buffers()


def test_cap_splits_one_tensor_in_two_and_opens_one_writer(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under a cap the state is written as it would be without one, less one cut: the tensor
    # that straddles the cap becomes two chunks (never many small ones), and the part written
    # during the call and the part written in the background share one writer.
    ckptio_wait_all()
    opened: list[str] = []
    real_open = _async._open
    monkeypatch.setattr(_async, "_open", lambda p, q: opened.append(p) or real_open(p, q))
    mib = 1 << 20
    state = {f"t{i}": np.full((64, mib // 16), i, np.uint8) for i in range(8)}  # 4 MiB each
    cap = mib + 14 * mib  # 1 MiB of staging, then 3.5 tensors
    ckptio.save_async(state, tmp_path / "ck", max_host_bytes=cap, staging_bytes=mib).wait()
    assert opened == [str(tmp_path / "ck")]
    with ckptio._core.Reader(str(tmp_path / "ck")) as r:
        chunks = {t.name: t.num_chunks for t in r.tensors()}
    assert sorted(chunks.values()) == [1] * 7 + [2], chunks
    out = ckptio.load(tmp_path / "ck")
    for k, v in state.items():
        np.testing.assert_array_equal(out[k], v)


class _OneRank:
    """A ckptio Communicator of one rank that counts its calls and the threads making them."""

    rank, size = 0, 1

    def __init__(self) -> None:
        self.threads: set[str] = set()

    def barrier(self, timeout: float) -> None:
        self.threads.add(threading.current_thread().name)

    def broadcast(self, root: int, data: bytes | None, timeout: float) -> bytes:
        self.threads.add(threading.current_thread().name)
        return bytes(data or b"")

    def gather(self, root: int, data: bytes, timeout: float) -> list[bytes]:
        self.threads.add(threading.current_thread().name)
        return [bytes(data)]


def test_distributed_snapshot(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """save_async(comm=): the collective save runs in the engine's thread, from a snapshot."""
    ev = threading.Event()
    hold(monkeypatch, ev, "_start_dist")
    a = np.arange(4096, dtype=np.float32).reshape(64, 64)
    rl = np.arange(3)
    tree = {"w": ckptio.Shard(a, (0, 0), (64, 64)), "rng": ckptio.RankLocal({"s": rl}), "n": 1}
    c = _OneRank()
    h = ckptio.save_async(tree, tmp_path / "c", comm=c, timeout=30)
    a += 1000  # the save has not started: it must write the snapshot
    rl[:] = -1
    assert not h.done()
    staged_by = set(c.threads)
    ev.set()
    h.wait(60)
    out = ckptio.load(tmp_path / "c")
    assert np.array_equal(out["w"], np.arange(4096, dtype=np.float32).reshape(64, 64))
    assert out["rng"][0]["s"].tolist() == [0, 1, 2] and out["n"] == 1
    # Staging may call it from this thread; the save itself only from the engine's.
    saved_by = c.threads - staged_by - {threading.current_thread().name}
    assert len(saved_by) == 1 and "MainThread" not in saved_by, c.threads
    # Without comm=: Shard and RankLocal leaves make a one-rank distributed save, in the
    # background too; over the cap it is written during the call.
    h = ckptio.save_async(tree, tmp_path / "d", max_host_bytes=0)
    assert h.done()
    h.wait()
    assert np.array_equal(ckptio.load(tmp_path / "d")["w"], a)


def test_distributed_staging_error(tmp_path: pathlib.Path) -> None:
    c = _OneRank()
    with pytest.raises(ckptio.CheckpointError, match="tensor 'w'"):
        ckptio.save_async({"w": ckptio.Shard(np.array(["x"], object), (0,), (1,))},
                          tmp_path / "c", comm=c)  # fmt: skip
    # It still took part in the collective save (the other ranks fail naming this one).
    assert c.threads == {threading.current_thread().name}
    assert not (tmp_path / "c").exists()
    with pytest.raises(ckptio.CheckpointError, match="timeout"):
        ckptio.save_async({"w": np.ones(2)}, tmp_path / "c", comm=c, timeout=0)


def test_mpi_without_thread_multiple_saves_during_the_call() -> None:
    """MPI below MPI_THREAD_MULTIPLE forbids the save thread's collectives: no background
    communicator, and a warning saying why."""
    from ckptio.ranks import _comm

    class FakeMPI:
        THREAD_MULTIPLE = 3

        @staticmethod
        def Query_thread() -> int:
            return 1  # MPI_THREAD_FUNNELED

    c = _comm.MPICommunicator.__new__(_comm.MPICommunicator)
    c._MPI, c.rank, c.size = FakeMPI, 0, 2
    with pytest.warns(RuntimeWarning, match="MPI_THREAD_MULTIPLE"):
        assert _async._background_comm(c) is None


def test_multi_rank_with_roots_is_refused_as_save_refuses_it(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """save_async and Manager refuse striping a multi-rank save before staging, as save does."""
    roots = [str(tmp_path / "r1"), str(tmp_path / "r2")]
    tree = {"w": ckptio.Shard(np.ones((4, 4)), (0, 0), (4, 4))}
    with pytest.raises(ckptio.CheckpointError) as plain:
        ckptio.save(tree, tmp_path / "plain", roots=roots)

    def no_staging(*args: Any) -> Any:
        raise AssertionError("staged before refusing")

    monkeypatch.setattr(_async._dist, "stage_or_refuse", no_staging)
    calls: list[Any] = [
        lambda: ckptio.save_async(tree, tmp_path / "a", roots=roots),
        lambda: ckptio.save_async(tree, tmp_path / "b", comm=_OneRank(), roots=roots),
        lambda: ckptio.Manager(tmp_path / "m", comm=_OneRank(), roots=roots).save(1, tree),
    ]
    for call in calls:
        with pytest.raises(ckptio.CheckpointError) as got:
            call()
        assert type(got.value) is type(plain.value) and str(got.value) == str(plain.value)
    assert sorted(os.listdir(tmp_path)) == ["m"]


@pytest.mark.parametrize("exc", [KeyboardInterrupt, MemoryError])
@pytest.mark.parametrize("how", ["all copied", "part written in the call", "distributed"])
def test_pool_count_survives_an_exception_in_the_copy(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, exc: type[BaseException], how: str
) -> None:
    """Ctrl-C or MemoryError as the tensors are copied: the save does not start, the pool
    gets its buffers back (its byte count stays true), and the next save works."""
    state = {"a": np.arange(1 << 18, dtype=np.float32), "b": np.ones(1 << 18, np.uint8)}
    opts: dict[str, Any] = {
        "all copied": {},
        # 1 MiB copied ("a"), "b" written from the caller's memory during the call.
        "part written in the call": {"max_host_bytes": 3 << 19, "staging_bytes": 1 << 19},
        "distributed": {"comm": _OneRank()},
    }[how]
    _async.release_buffers()
    held = _async._held_bytes()  # buffers lent to no save: 0, unless a test before leaked some
    real = _async._core.take

    def failing(*args: Any) -> Any:
        snap = real(*args)  # the copy is done, and then the exception arrives
        del snap
        raise exc()

    monkeypatch.setattr(_async._core, "take", failing)
    with pytest.raises(exc):
        ckptio.save_async(state, tmp_path / "c", **opts)
    assert _async._pending is None or _async._pending.done()
    assert not (tmp_path / "c").exists() and leftovers(tmp_path) == []
    returned = _async.release_buffers()  # the buffers the failed save took came back
    assert _async._held_bytes() == held
    monkeypatch.setattr(_async._core, "take", real)
    ckptio.save_async(state, tmp_path / "c", **opts).wait(60)
    assert_same(ckptio.load(tmp_path / "c"), state)
    pooled = _async.release_buffers()  # what the same save takes when it succeeds
    assert returned == pooled >= 1 << 20 and _async._held_bytes() == held


def test_interrupt_before_the_commit_starts(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C once the snapshot is taken but before its commit starts: nothing is pending,
    the writer aborts (no leftovers), and the snapshot's buffers are back in the pool."""

    def interrupted(*args: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(_async, "_start_commit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ckptio.save_async({"a": np.ones(1 << 20, np.uint8)}, tmp_path / "c")
    assert _async._PROCESS.pool is not None and _async._PROCESS.pool.stats().lent == 0
    assert not (tmp_path / "c").exists() and leftovers(tmp_path) == []


def test_ctrl_c_interrupts_wait(ckpt: pathlib.Path, gate: threading.Event) -> None:
    """Ctrl-C while wait() blocks raises KeyboardInterrupt there; the save stays pending and
    a later wait() gives its outcome."""
    h = ckptio.save_async({"a": np.ones(10)}, ckpt)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        h.wait(30)
    timer.join()
    assert not h.done()
    gate.set()
    h.wait(60)
    assert ckptio.load(ckpt)["a"].tolist() == [1.0] * 10


def test_async_stats_say_how_gpu_tensors_moved(tmp_path: pathlib.Path) -> None:
    """save_async of arrays in (stand-in) GPU memory: ckptio copies them into the pool's pinned
    buffers, and the Stats say so ("snapshot"), as a save's say "staged" or "gds"; with the GPU
    path off, the framework's host copy and why."""
    from test_gpu import FAKE, _run, _standin

    lib = _standin()
    if lib is None:
        pytest.skip("the GPU stand-in is not built (make)")
    code = f"STANDIN = {lib!r}\n" + FAKE + f"""
import ckptio
a = np.arange(1 << 16, dtype=np.float32)
st = ckptio.save_async({{"a": FakeGpu(a), "h": np.ones(3)}}, {str(tmp_path / "ck")!r},
                       overwrite=True).wait()
assert np.array_equal(ckptio.load({str(tmp_path / "ck")!r})["a"], a), "data differs"
print("GPU", st.gpu)
"""
    r = _run(code, {"CKPTIO_CUDA_LIBRARY": lib})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "GPU snapshot"
    r = _run(code, {"CKPTIO_CUDA_LIBRARY": lib, "CKPTIO_GPU": "off"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "GPU host copy (CKPTIO_GPU=off)"
