# SPDX-License-Identifier: Apache-2.0
"""save_async and Manager across os.fork(): the child inherits no pending save, lock or thread."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

import pytest

import ckptio

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")

# Each case runs in a script of its own, which forks and reaps its child within CHILD_LIMIT
# seconds (a child that hangs is killed and reported as "hung"), so a hang fails the test.
PRELUDE = r"""
import os, sys, threading, time, numpy as np, ckptio
from ckptio import _async

d, case = sys.argv[1], sys.argv[2]
CHILD_LIMIT = 30
gate = threading.Event()
real_start = _async._start_commit


class Held:
    # Stands in for the Completion: the commit starts only once the gate is open.
    def __init__(self, *args):
        self.c = None
        self.t = threading.Thread(target=self._run, args=args, daemon=True)
        self.t.start()

    def _run(self, *args):
        gate.wait()
        self.c = real_start(*args)

    def done(self):
        return not self.t.is_alive() and self.c.done()

    def wait(self, timeout=None):
        self.t.join(timeout)
        return None if self.t.is_alive() else self.c.wait(timeout)

    def close(self):
        self.t.join()
        self.c.close()


def held(*args):
    return Held(*args)


def fork(body):
    # The child runs body and leaves through sys.exit, so its atexit handlers run.
    pid = os.fork()
    if pid == 0:
        try:
            body()
        except BaseException as e:
            print("child raised", type(e).__name__, e, flush=True)
            os._exit(3)
        sys.stdout.flush()
        sys.exit(0)
    end = time.monotonic() + CHILD_LIMIT
    while time.monotonic() < end:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got:
            print("child exit", os.waitstatus_to_exitcode(status), flush=True)
            return
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print("child hung", flush=True)


def tree(v):
    return {"a": np.full(1 << 20, v, np.uint8), "v": v}


def fork_in_flight(body, finish):
    # Fork while the parent's save is held at the gate, then let it run and finish it.
    fork(body)
    gate.set()
    print("parent saved", finish(), flush=True)


def child_saves():
    _async._start_commit = real_start
    ckptio.save_async(tree(2), d + "/child").wait()
    print("child saved", flush=True)
"""

CASES = {
    # A save in flight at the fork: the child's own save runs; the parent's is not the child's
    # to wait for (its handle says so), and the child's exit does not wait for it either.
    "in_flight": r"""
_async._start_commit = held
h = ckptio.save_async(tree(1), d + "/parent")

def child():
    assert h.done()
    try:
        h.wait()
    except ckptio.InvalidRequest as e:
        print("child: parent's save:", e, flush=True)
    child_saves()

fork_in_flight(child, lambda: h.wait().bytes)
""",
    # The child exits at once while the parent's save is in flight.
    "exit": r"""
_async._start_commit = held
h = ckptio.save_async(tree(1), d + "/parent")
fork_in_flight(lambda: None, lambda: h.wait().bytes)
""",
    # A finished save large enough to start the pool's copy threads (two 64 MiB pieces): the
    # child's copies do not wait for the parent's copy threads.
    "copier": r"""
ckptio.save_async({"big": np.ones(65 << 20, np.uint8)}, d + "/parent").wait()
assert _async._PROCESS.pool is not None and _async._PROCESS.pool.stats().held >= 65 << 20

fork(child_saves)
print("parent saved", flush=True)
""",
    # Another thread holds the engine's locks at the fork (inside a save_async call).
    "locks": r"""
ckptio.save_async(tree(1), d + "/parent").wait()
taken, never = threading.Event(), threading.Event()

def hold():
    with _async._LOCK:
        taken.set()
        never.wait()

holder = threading.Thread(target=hold, daemon=True)
holder.start()
taken.wait()

fork(child_saves)
never.set()
holder.join()
print("parent saved", flush=True)
""",
    # A Manager with a save in flight: in the child it waits for nothing, and saves its own.
    "manager": r"""
_async._start_commit = held
m = ckptio.Manager(d + "/run", keep=1)
m.save(1, tree(1))

def child():
    _async._start_commit = real_start
    with ckptio.Manager(d + "/child-run") as m2:
        m2.save(2, tree(2))
    m.wait_until_finished()
    m.close()
    print("child saved", flush=True)

fork_in_flight(child, lambda: (m.close(), m.all_steps())[1])
""",
}


def run_case(tmp_path: pathlib.Path, case: str) -> subprocess.CompletedProcess[str]:
    # Its own session, so that on a timeout the script and any child of it are killed.
    p = subprocess.Popen([sys.executable, "-c", PRELUDE + CASES[case], str(tmp_path), case],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)  # fmt: skip
    try:
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"timed out: {out}\n{err}")
    res = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "child exit 0" in res.stdout, res.stdout + res.stderr
    assert "parent saved" in res.stdout, res.stdout + res.stderr
    assert "waiting for the async save" not in res.stderr, res.stderr
    return res


def test_child_saves_while_the_parents_save_is_in_flight(tmp_path: pathlib.Path) -> None:
    res = run_case(tmp_path, "in_flight")
    assert "child saved" in res.stdout, res.stdout
    assert "runs in process" in res.stdout and "parent" in res.stdout, res.stdout
    assert ckptio.load(tmp_path / "parent")["v"] == 1
    assert ckptio.load(tmp_path / "child")["v"] == 2


def test_child_exit_does_not_wait_for_the_parents_save(tmp_path: pathlib.Path) -> None:
    run_case(tmp_path, "exit")
    assert ckptio.load(tmp_path / "parent")["v"] == 1


def test_child_copies_without_the_parents_copy_threads(tmp_path: pathlib.Path) -> None:
    run_case(tmp_path, "copier")
    assert int(ckptio.load(tmp_path / "child")["a"][-1]) == 2


def test_child_does_not_inherit_held_locks(tmp_path: pathlib.Path) -> None:
    run_case(tmp_path, "locks")
    assert int(ckptio.load(tmp_path / "child")["a"][-1]) == 2


def test_manager_in_a_child_waits_for_nothing(tmp_path: pathlib.Path) -> None:
    res = run_case(tmp_path, "manager")
    assert "child saved" in res.stdout and "parent saved [1]" in res.stdout, res.stdout
    assert ckptio.Manager(tmp_path / "child-run").all_steps() == [2]
