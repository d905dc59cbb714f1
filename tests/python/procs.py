# SPDX-License-Identifier: Apache-2.0
"""Server processes for the test fixtures (s3servers.py, gcsservers.py): free ports on 127.0.0.1,
finding a program, starting one in its own session (process group) in a temp directory, starting
it again when it exits at once, waiting with a deadline until it answers, and stopping its whole
group (SIGTERM, then SIGKILL) and removing the directory.

A fixture module makes its server class a subclass of Server, and starts one with::

    d = tempdir(kind, parent)
    proc, log = spawn(args, d, child_env("PREFIX_", {...}))
    srv = MyServer(kind=kind, endpoint=..., proc=proc, dir=d, log=log, ...)
    return wait_ready(srv, probe, ready_s)   # probe() -> None when it answers, else why not

inside a function that start() calls up to STARTS times; per_test_fixtures makes the pytest
fixtures that every such module has (``{store}server``, ``{store}prefix``, ``{store}env``).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

# Starts of a server that exits at once (a port taken meanwhile) before giving up.
STARTS = 3
# SIGTERM, then SIGKILL after this long.
STOP_GRACE_S = 5.0
# How often a server that is starting is asked whether it answers.
POLL_S = 0.05

T = TypeVar("T")
S = TypeVar("S", bound="Server")


def binary(name: str) -> str | None:
    """The program ``name``: next to this Python (a virtual environment's bin/) first, then PATH."""
    here = os.path.join(os.path.dirname(sys.executable), name)
    return here if os.access(here, os.X_OK) else shutil.which(name)


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now: all held open at once while the kernel picks,
    so no two are the same."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def unique_prefix(name: str = "t") -> str:
    """A key prefix no other test or run uses."""
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:40]
    return f"{safe}-{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def environ(env: Mapping[str, str], cleared: Iterable[str] = ()) -> Iterator[None]:
    """os.environ with ``env`` set and the variables ``cleared`` removed, restored afterwards."""
    cleared = tuple(cleared)
    saved = {k: os.environ.get(k) for k in set(env) | set(cleared)}
    try:
        for k in cleared:
            os.environ.pop(k, None)
        os.environ.update(env)
        yield
    finally:
        os.environ.update({k: v for k, v in saved.items() if v is not None})
        for k in [k for k, v in saved.items() if v is None]:
            os.environ.pop(k, None)


def child_env(drop: str, extra: Mapping[str, str]) -> dict[str, str]:
    """A server's environment: os.environ without the variables whose names start with ``drop``,
    with ``extra`` set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(extra)
    return env


def tempdir(kind: str, parent: str | None = None) -> str:
    """A fresh directory for a ``kind`` server (under ``parent``, default the system's temp)."""
    return tempfile.mkdtemp(prefix=f"ckptio-{kind}-", dir=parent)


def spawn(args: list[str], d: str, env: Mapping[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """Run ``args`` in ``d`` as the leader of a new session (so its process group is its pid),
    stdout and stderr into ``d``/server.log; returns the process and the log's path. ``d`` is
    removed when the program cannot be started."""
    log = os.path.join(d, "server.log")
    try:
        with open(log, "wb") as out:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=d, env=dict(env), start_new_session=True)  # fmt: skip
    except BaseException:
        shutil.rmtree(d, ignore_errors=True)
        raise
    return proc, log


def run_group(args: list[str], env: Mapping[str, str], timeout: float,
              cwd: str | None = None) -> tuple[int, str]:  # fmt: skip
    """Run ``args`` to its end as the leader of a new session, stdout and stderr together;
    returns (exit status, output). Past ``timeout`` seconds its whole process group is killed
    (what it started would otherwise go on) and TimeoutError says so, with the output's end."""
    p = subprocess.Popen(args, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)  # fmt: skip
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        raise TimeoutError(f"{' '.join(args)} ran past {timeout:.0f} s:\n{out[-4000:]}") from None
    return p.returncode, out


@dataclass
class Server:
    """A server process: where it answers, the process (leader of its own group) and the temp
    directory that holds its data and its log."""

    kind: str
    endpoint: str
    proc: subprocess.Popen[bytes]
    dir: str
    log: str

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 4000) -> str:
        """The last ``n`` bytes of the server's log, as text ("" when there is none)."""
        try:
            with open(self.log, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the server's whole process group now (a server dying under a client)."""
        _signal_group(self.proc, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(STOP_GRACE_S)

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it after STOP_GRACE_S; remove the directory."""
        if self.proc.poll() is None:
            _signal_group(self.proc, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(STOP_GRACE_S)
        _signal_group(self.proc, signal.SIGKILL)  # children of a leader that already left
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(STOP_GRACE_S)
        shutil.rmtree(self.dir, ignore_errors=True)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    # The server leads its own session (start_new_session), so its pid is its group id.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


class Exited(RuntimeError):
    """The server process ended while starting."""


def wait_ready(srv: S, probe: Callable[[], str | None], ready_s: float, poll_s: float = POLL_S) -> S:
    """Call ``probe`` every ``poll_s`` until it returns None (the server answers; otherwise it
    returns why not), at most ``ready_s`` seconds, and return ``srv``. Raises Exited when the process ends
    meanwhile and RuntimeError when the time runs out, both with the server's log; the server
    is stopped then (and on any other exception)."""
    try:
        deadline = time.monotonic() + ready_s
        last = ""
        while True:
            if not srv.alive():
                raise Exited(f"{srv.kind} exited with {srv.proc.returncode} while starting:\n{srv.log_tail()}")
            why = probe()
            if why is None:
                return srv
            last = why
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(poll_s, left))
        raise RuntimeError(f"{srv.kind} at {srv.endpoint} not ready after {ready_s:.0f} s ({last}):\n{srv.log_tail()}")
    except BaseException:
        srv.stop()
        raise


def start(once: Callable[[], T], starts: int = STARTS) -> T:
    """``once()``, called again while it raises Exited (a server that exited while starting,
    mostly because another program took one of its ports between the choice and the bind), up
    to ``starts`` times in all."""
    for attempt in range(starts):
        try:
            return once()
        except Exited:
            if attempt == starts - 1:
                raise
    raise ValueError(f"starts must be at least 1, not {starts}")


@contextlib.contextmanager
def stopping(srv: S) -> Iterator[S]:
    """``srv`` for the duration of the block, stopped afterwards."""
    try:
        yield srv
    finally:
        srv.stop()


def per_test_fixtures(store: str, kinds: Sequence[str], session: Callable[[str], str],
                      environ: Callable[[dict[str, str]], AbstractContextManager[None]]
                      ) -> tuple[Any, Any, Any]:  # fmt: skip
    """The per-test pytest fixtures of a server module, for it to assign to module names so that
    pytest finds them: ``{store}server``, ``{store}prefix`` and ``{store}env`` (see their
    docstrings). ``session(kind)`` names the session fixture of the server of each kind in
    ``kinds``; ``environ(env)`` sets os.environ for a server's ``env`` (whose variables it
    yields). Needs pytest."""
    import pytest

    @pytest.fixture(name=f"{store}server", params=kinds)
    def server(request: Any) -> Any:
        """The session's server of each kind: each test that takes this runs once per kind."""
        return request.getfixturevalue(session(request.param))

    @pytest.fixture(name=f"{store}prefix")
    def prefix(request: Any) -> str:
        """A name (key) prefix unique to this test."""
        return unique_prefix(request.node.name)

    def env(**fixtures: Any) -> Iterator[dict[str, str]]:
        """os.environ set for the test's server during the test; yields the variables."""
        srv = fixtures[f"{store}server"]
        with environ(srv.env):
            yield srv.env

    # It takes the server fixture by name (pytest reads the names from the signature), so that a
    # test that takes only the env fixture is parametrized over the kinds too.
    server_arg = inspect.Parameter(f"{store}server", inspect.Parameter.KEYWORD_ONLY)
    env.__signature__ = inspect.Signature([server_arg])  # type: ignore[attr-defined]
    return server, prefix, pytest.fixture(name=f"{store}env")(env)
