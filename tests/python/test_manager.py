# SPDX-License-Identifier: Apache-2.0
"""ckptio.Manager: listing, retention, restore, and crashes during a save or a deletion."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import ckptio
from ckptio import _async


def state(step: int) -> dict[str, object]:
    return {"w": np.full((64, 8), step, np.float32), "step": step}


@pytest.mark.parametrize("async_save", [True, False])
def test_retention_and_restore(tmp_path: pathlib.Path, async_save: bool) -> None:
    with ckptio.Manager(tmp_path / "run", keep=2, keep_every=3, async_save=async_save) as m:
        assert m.all_steps() == [] and m.latest_step() is None
        for s in range(8):
            assert m.save(s, state(s))
        m.wait_until_finished()
        assert m.all_steps() == [0, 3, 6, 7] and m.latest_step() == 7
        assert m.restore()["step"] == 7
        out = m.restore(3, like={"w": np.zeros((64, 8), np.float64), "step": 0})
        assert out["w"].dtype == np.float64 and out["w"][0, 0] == 3.0
    assert sorted(os.listdir(tmp_path / "run")) == ["0", "3", "6", "7"]
    with pytest.raises(ckptio.CheckpointError):
        m.save(8, state(8))  # closed


def test_keep_none_keeps_everything(tmp_path: pathlib.Path) -> None:
    m = ckptio.Manager(tmp_path, keep=None)
    for s in (10, 20, 30, 40):
        m.save(s, state(s))
    m.close()
    assert m.all_steps() == [10, 20, 30, 40]


def test_old_steps_go_only_after_a_newer_commit(tmp_path: pathlib.Path) -> None:
    m = ckptio.Manager(tmp_path, keep=1)
    m.save(1, state(1))
    m.wait_until_finished()
    ckptio.save({"x": np.zeros(1)}, tmp_path / "2")  # step 2 exists: the save of 2 fails
    m.save(2, state(2))
    with pytest.raises(ckptio.CheckpointExists):
        m.wait_until_finished()
    assert m.all_steps() == [1, 2]  # nothing deleted: the failed save committed nothing
    m.save(3, state(3))
    m.close()
    assert m.all_steps() == [3]


def test_unfinished_steps_are_not_listed(tmp_path: pathlib.Path) -> None:
    m = ckptio.Manager(tmp_path, keep=None, async_save=False)
    m.save(1, state(1))
    (tmp_path / "5.tmp-999999.0").mkdir()  # a save that died before its commit
    (tmp_path / "6").mkdir()  # a directory without a manifest
    (tmp_path / "notastep").mkdir()
    (tmp_path / "007").mkdir()
    assert m.all_steps() == [1] and m.latest_step() == 1


def test_restore_without_steps(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ckptio.CheckpointNotFound):
        ckptio.Manager(tmp_path).restore()


def test_bad_arguments(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ckptio.InvalidType, match="comm="):
        ckptio.Manager(tmp_path, comm=object())
    with pytest.raises(ckptio.CheckpointError, match="timeout"):
        ckptio.Manager(tmp_path, timeout=0)
    with pytest.raises(ckptio.InvalidType):
        ckptio.Manager(tmp_path, keep=0)
    m = ckptio.Manager(tmp_path)
    with pytest.raises(ckptio.InvalidType):
        m.save(-1, state(0))


CRASH_IN_RETENTION = """
import os, sys, numpy as np, ckptio

m = ckptio.Manager(sys.argv[1], keep=2, async_save=sys.argv[2] == "1")
for s in range(2):
    m.save(s, {"w": np.full(1000, s, np.float32), "step": s})
m.wait_until_finished()
pad = os.path.join(m.step_path(0), "pad")  # a step slow enough to remove to be killed midway
os.mkdir(pad)
for i in range(4000):
    open(os.path.join(pad, str(i)), "w").close()
print("ready", flush=True)
m.save(2, {"w": np.full(1000, 2, np.float32), "step": 2})
m.wait_until_finished()
"""


def _killed_mid_removal(d: pathlib.Path, async_save: str) -> bool:
    """Run CRASH_IN_RETENTION and SIGKILL it the moment step 0's removal has begun (its
    directory renamed out of the listing); whether it died with the removal unfinished."""
    p = subprocess.Popen([sys.executable, "-c", CRASH_IN_RETENTION, str(d), async_save],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert p.stdout is not None and p.stdout.readline() == "ready\n", p.communicate(timeout=60)
        deadline = time.monotonic() + 120  # a child that neither removes nor ends is killed
        while p.poll() is None and time.monotonic() < deadline:
            if any(".deleting-" in n for n in os.listdir(d)):
                break
        p.kill()
        p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=60)
    return p.returncode == -signal.SIGKILL and any(".deleting-" in n for n in os.listdir(d))


@pytest.mark.parametrize("async_save", ["1", "0"])
def test_crash_during_retention(tmp_path: pathlib.Path, async_save: str) -> None:
    """A job killed while retention removes a step (a real SIGKILL, inside the library's
    removal): the step is gone from the listing whole, and the next Manager sweeps the rest."""
    for attempt in range(5):  # the kill may come after the removal ended: try again
        d = tmp_path / str(attempt)
        d.mkdir()
        if _killed_mid_removal(d, async_save):
            break
    else:
        pytest.fail("the removal always finished before the kill landed")
    m = ckptio.Manager(d, keep=2)
    assert m.all_steps() == [1, 2]
    for s in m.all_steps():
        assert ckptio.load(m.step_path(s))["step"] == s
    assert sorted(os.listdir(d)) == ["1", "2"]  # the leftover is gone


CRASH_IN_SAVE = """
import sys, time, numpy as np, ckptio
from ckptio import _async

def stuck(snap, w):
    # The writer is open (its temporary directory made) and the snapshot taken; the commit
    # never starts.
    print("writing", flush=True)
    time.sleep(600)

m = ckptio.Manager(sys.argv[1], keep=2)
m.save(1, {"w": np.ones(1000), "step": 1})
m.wait_until_finished()
_async._start_commit = stuck
m.save(2, {"w": np.ones(1000), "step": 2})
time.sleep(600)
"""


def test_crash_during_save(tmp_path: pathlib.Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", CRASH_IN_SAVE, str(tmp_path)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "writing"
    finally:
        p.kill()
        p.wait()
    m = ckptio.Manager(tmp_path, keep=2)
    assert m.all_steps() == [1] and m.restore()["step"] == 1
    m.save(2, {"w": np.ones(3), "step": 2})  # the dead save's leftovers do not stand in the way
    m.close()
    assert m.all_steps() == [1, 2]


def test_manager_uses_the_shared_pool(tmp_path: pathlib.Path) -> None:
    with ckptio.Manager(tmp_path, max_host_bytes=1 << 20) as m:
        m.save(1, state(1))
    assert _async._held_bytes() <= 1 << 20


def test_torch_four_ranks(tmp_path: pathlib.Path) -> None:
    """Every rank saves its shards through its Manager; only rank 0 deletes old steps, and every
    rank lists the same steps once save() returns (sync), or once the save finishes (async)."""
    pytest.importorskip("torch")
    from test_comm_dist import DIST, launch, results
    from test_dist_save import no_error, torch_env

    out = tmp_path / "out"
    out.mkdir()
    argv = [sys.executable, str(DIST / "manager_torch.py"), str(tmp_path), "run"]
    launch([argv] * 4, torch_env(4), out)
    sync = results(out, "sync")
    no_error(sync, 4)
    for r, v in sync.items():
        assert v["seen"] == [[0], [0, 1], [1, 2], [2, 3]], (r, v)
        assert v["steps"] == [2, 3] and v["ok"], (r, v)
        assert v["removed"] == (["0", "1"] if r == 0 else []), (r, v)  # rank 0 alone removes
    bg = results(out, "async")
    no_error(bg, 4)
    for r, v in bg.items():
        assert v["steps"] == [2, 3] and v["ok"], (r, v)
        assert len(v["removed"]) == (2 if r == 0 else 0), (r, v)
    inc = results(out, "incremental")
    no_error(inc, 4)
    for r, v in inc.items():
        assert v["steps"] == [3, 4, 5] and v["bases"] == [None, 3, 4] and v["ok"], (r, v)
    assert sorted(os.listdir(tmp_path / "sync")) == ["2", "3"]
    assert sorted(os.listdir(tmp_path / "async")) == ["2", "3"]
    full = ckptio.load(tmp_path / "async" / "3")
    assert full["step"] == 3 and full["w"][0, 0].item() == 300.0


def test_mpi_four_ranks(tmp_path: pathlib.Path) -> None:
    """Manager(comm=COMM_WORLD, async_save=True) under mpirun: rank 0 alone deletes; the
    collective saves run in the save thread where MPI allows it (MPI_THREAD_MULTIPLE)."""
    import importlib.util
    import shutil

    mpirun = shutil.which("mpirun")
    if mpirun is None or importlib.util.find_spec("mpi4py") is None:
        pytest.skip("needs mpirun and mpi4py")
    from test_comm_dist import DIST, LAUNCH_TIMEOUT, launch, results
    from test_dist_save import no_error

    out = tmp_path / "out"
    out.mkdir()
    argv = ["timeout", str(LAUNCH_TIMEOUT), mpirun, "--allow-run-as-root", "--oversubscribe",
            "-np", "4", sys.executable, str(DIST / "manager_mpi.py"), str(tmp_path / "run")]
    launch([argv], [{}], out)
    res = results(out, "mpi")
    no_error(res, 4)
    for r, v in res.items():
        assert v["steps"] == [2, 3] and v["back"] == [True, True], (r, v)
        assert v["removed"] == (2 if r == 0 else 0), (r, v)
        # Below MPI_THREAD_MULTIPLE the saves ran during the calls, saying so.
        assert bool(v["warnings"]) != v["multiple"], (r, v)
    assert sorted(os.listdir(tmp_path / "run")) == ["2", "3"]


def test_jax_two_processes(tmp_path: pathlib.Path) -> None:
    """Manager(async_save=True) of jax arrays spanning 2 processes, without comm=."""
    pytest.importorskip("jax")
    from test_comm_dist import DIST, free_port, launch, results
    from test_dist_save import no_error

    port = free_port()
    argvs = [[sys.executable, str(DIST / "manager_jax.py"), str(port), str(i), "2",
              str(tmp_path / "run")] for i in range(2)]
    env = [dict(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4")
           for _ in range(2)]
    out = tmp_path / "out"
    out.mkdir()
    launch(argvs, env, out)
    res = results(out, "jax")
    no_error(res, 2)
    for r, v in res.items():
        assert v["steps"] == [2, 3] and v["back"] == [True, True], (r, v)
        assert v["removed"] == (2 if r == 0 else 0), (r, v)


def test_torch_rank_0_killed_while_deleting(tmp_path: pathlib.Path) -> None:
    """Rank 0 dies after renaming an old step out of the listing, before removing it: the other
    ranks' save() fails within its timeout, the new step is listed and loadable, and the next
    Manager on the directory removes what the dead rank left."""
    pytest.importorskip("torch")
    from test_comm_dist import DIST, results, run_ranks
    from test_dist_save import torch_env

    out = tmp_path / "out"
    out.mkdir()
    argv = [sys.executable, str(DIST / "manager_torch.py"), str(tmp_path), "kill"]
    codes, tails = run_ranks([argv] * 3, torch_env(3), out)
    assert codes == [-signal.SIGKILL, 0, 0], (codes, tails)
    killed = results(out, "kill")
    assert sorted(killed) == [1, 2], killed
    for v in killed.values():  # rank 0's connection drops, or the wait times out
        assert v["error"] in ("TimeoutError", "ConnectionError", "ConnectionResetError"), v
        assert any("step 1 of" in n and "committed on every rank" in n for n in v["notes"]), v
    after = results(out, "after")[1]
    assert after["steps"] == [1] and after["w_ok"], after
    assert len(after["entries"]) == 2 and after["entries"][0].startswith("0.deleting-"), after
    assert after["left"] == ["1"], after


def test_body_exception_is_not_replaced_by_the_close_error(tmp_path: pathlib.Path) -> None:
    ckptio.save({"x": np.zeros(1)}, tmp_path / "1")  # step 1 exists: the async save of 1 fails
    with pytest.raises(ValueError, match="the body's") as info:
        with ckptio.Manager(tmp_path) as m:
            m.save(1, state(1))
            raise ValueError("the body's error")
    notes = getattr(info.value, "__notes__", [])
    assert any("CheckpointExists" in n and "already exists" in n for n in notes), notes
    # Without an exception in the body, the close error is raised as before.
    with pytest.raises(ckptio.CheckpointExists):
        with ckptio.Manager(tmp_path) as m:
            m.save(1, state(1))


@pytest.mark.parametrize("async_save", [True, False])
def test_a_step_older_than_the_latest_is_refused(tmp_path: pathlib.Path, async_save: bool) -> None:
    m = ckptio.Manager(tmp_path, keep=2, async_save=async_save)
    for s in (10, 20, 30):
        m.save(s, state(s))
    with pytest.raises(ckptio.InvalidRequest, match="step 5 is older than the latest .* 30"):
        m.save(5, state(5))
    m.close()
    assert m.all_steps() == [20, 30] and m.latest_step() == 30
    assert sorted(os.listdir(tmp_path)) == ["20", "30"]  # nothing of step 5 was written
