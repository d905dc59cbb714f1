# SPDX-License-Identifier: Apache-2.0
"""Local S3 servers for the tests and the S3 bench cell: SeaweedFS (`weed mini`) and moto's server on 127.0.0.1 with free ports, started in their own process group and stopped by process id, plus the pytest fixtures that share one of each per session.

Test modules take the fixtures with ``pytest_plugins = ["s3servers"]`` after importing from it,
so pytest finds it already imported: PYTEST_DONT_REWRITE (it has no test asserts to rewrite).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

KINDS = ("seaweedfs", "moto")
BINARIES = {"seaweedfs": "weed", "moto": "moto_server"}
ACCESS_KEY = "ckptio-test-key"
SECRET_KEY = "ckptio-test-secret"
REGION = "us-east-1"
BUCKET = "ckpt"
# A server that is not answering after this long failed to start.
READY_S = 60.0
# Starts of a server that exits at once (a port taken meanwhile) before giving up.
STARTS = 3
# SIGTERM, then SIGKILL after this long.
STOP_GRACE_S = 5.0

T = TypeVar("T")


def binary(name: str) -> str | None:
    """The program ``name``: next to this Python (a virtual environment's bin/) first, then PATH."""
    here = os.path.join(os.path.dirname(sys.executable), name)
    return here if os.access(here, os.X_OK) else shutil.which(name)


def missing(kind: str) -> str:
    """Why a ``kind`` server cannot start here ("" when it can)."""
    if binary(BINARIES[kind]) is None:
        return f"{BINARIES[kind]} is not installed (deps/requirements.txt; `make venv`)"
    try:
        import boto3  # noqa: F401
    except ImportError:
        return "boto3 is not installed (deps/requirements.txt; `make venv`)"
    return ""


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


def client_env(endpoint: str, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> dict[str, str]:
    """The environment an AWS client (ckptio's, boto3, s3torchconnector) reads to reach
    ``endpoint`` with these keys; no instance metadata lookups, no profile."""
    return {
        "AWS_ACCESS_KEY_ID": access_key,
        "AWS_SECRET_ACCESS_KEY": secret_key,
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


# Variables that would change what an AWS client does, removed while a server's env is set.
_CLEARED = ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE",
            "AWS_SHARED_CREDENTIALS_FILE")  # fmt: skip


@contextlib.contextmanager
def environ(env: dict[str, str]) -> Iterator[None]:
    """os.environ with ``env`` set (and the AWS variables that would override it removed),
    restored afterwards."""
    keys = set(env) | set(_CLEARED)
    saved = {k: os.environ.get(k) for k in keys}
    try:
        for k in _CLEARED:
            os.environ.pop(k, None)
        os.environ.update(env)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def with_env(env: dict[str, str], fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` with ``env`` set in os.environ (see environ)."""
    with environ(env):
        return fn(*args, **kwargs)


def boto3_client(endpoint: str, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY,
                 retries: bool = True, timeout: float = 30.0) -> Any:  # fmt: skip
    """A boto3 S3 client for ``endpoint``, path-style; ``retries=False``: every failure shows."""
    import boto3
    from botocore.config import Config

    cfg = Config(s3={"addressing_style": "path"}, connect_timeout=timeout, read_timeout=timeout,
                 retries={"total_max_attempts": 1} if not retries else {"max_attempts": 5, "mode": "standard"})  # fmt: skip
    return boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=access_key,
                        aws_secret_access_key=secret_key, config=cfg)  # fmt: skip


@dataclass
class S3Server:
    """A running server: where it answers, its bucket, the client environment for it, and
    the process (its own group) to stop."""

    kind: str
    endpoint: str
    bucket: str
    env: dict[str, str]
    proc: subprocess.Popen[bytes]
    dir: str
    log: str
    ports: dict[str, int] = field(default_factory=dict)

    def client(self, retries: bool = True, timeout: float = 30.0) -> Any:
        return boto3_client(self.endpoint, retries=retries, timeout=timeout)

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 4000) -> str:
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
        """SIGTERM the process group, SIGKILL it after STOP_GRACE_S; remove the data directory."""
        if self.proc.poll() is None:
            _signal_group(self.proc, signal.SIGTERM)
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.proc, signal.SIGKILL)  # children of a leader that already left
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(STOP_GRACE_S)
        shutil.rmtree(self.dir, ignore_errors=True)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    # The server leads its own session (start_new_session), so its pid is its group id.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _seaweedfs_args(exe: str, d: str, bucket: str) -> tuple[list[str], dict[str, int]]:
    names = ["master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc",
             "webdav", "admin", "admin.grpc"]  # fmt: skip
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    # Its unix sockets go into its own directory too (the default is /tmp/seaweedfs-*-<port>.sock,
    # left behind after a stop).
    sock = os.path.dirname(d)
    args = [exe, "mini", f"-dir={d}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-admin.ui=false",
            f"-filer.localSocket={sock}/filer.sock", f"-s3.localSocket={sock}/s3.sock",
            f"-bucket={bucket}", "-master.telemetry=false",
            # A PUT to a missing bucket is an error, as on AWS, not a new bucket.
            "-s3.autoCreateBucket=false",
            # The Iceberg (8181) and Lance (9101) listeners are on fixed ports by default: off,
            # so that two servers never collide.
            "-s3.port.iceberg=0", "-s3.port.lance=0"]  # fmt: skip
    for n, p in ports.items():
        flag = n.replace(".grpc", ".port.grpc") if n.endswith(".grpc") else n + ".port"
        args.append(f"-{flag}={p}")
    return args, ports


def start(kind: str, bucket: str = BUCKET, ready_s: float = READY_S, parent: str | None = None) -> S3Server:
    """Start a ``kind`` server ("seaweedfs" or "moto") on 127.0.0.1 in a fresh temp directory
    (under ``parent``, default the system's), wait (at most ``ready_s``) until its bucket
    ``bucket`` answers, and return it. Raises RuntimeError, with the server's log, when it
    does not come up. Call stop() when done. A server that exits while starting (another
    program took one of its ports between the choice and the bind) is started again, on other
    ports, up to STARTS times."""
    why = missing(kind)
    if why:
        raise FileNotFoundError(why)
    for attempt in range(STARTS):
        try:
            return _start_once(kind, bucket, ready_s, parent)
        except _Exited:
            if attempt == STARTS - 1:
                raise
    raise AssertionError("unreachable")


class _Exited(RuntimeError):
    """The server process ended while starting."""


def _start_once(kind: str, bucket: str, ready_s: float, parent: str | None) -> S3Server:
    exe = binary(BINARIES[kind])
    assert exe is not None
    d = tempfile.mkdtemp(prefix=f"ckptio-{kind}-", dir=parent)
    log = os.path.join(d, "server.log")
    if kind == "seaweedfs":
        data = os.path.join(d, "data")
        os.mkdir(data)
        args, ports = _seaweedfs_args(exe, data, bucket)
        port = ports["s3"]
    elif kind == "moto":
        port = free_ports(1)[0]
        args, ports = [exe, "-H", "127.0.0.1", "-p", str(port)], {"s3": port}
    else:
        raise ValueError(f"unknown S3 server kind {kind!r}")
    endpoint = f"http://127.0.0.1:{port}"
    env = client_env(endpoint)
    penv = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    penv.update(env)  # weed mini makes its admin identity from AWS_ACCESS_KEY_ID/SECRET
    penv["TMPDIR"] = d  # where its other sockets go
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                cwd=d, env=penv, start_new_session=True)  # fmt: skip
    srv = S3Server(kind, endpoint, bucket, env, proc, d, log, ports)
    try:
        _wait_ready(srv, ready_s)
    except BaseException:
        srv.stop()
        raise
    return srv


def _wait_ready(srv: S3Server, ready_s: float) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    c = srv.client(retries=False, timeout=2.0)
    deadline = time.monotonic() + ready_s
    last = ""
    while time.monotonic() < deadline:
        if not srv.alive():
            raise _Exited(f"{srv.kind} exited with {srv.proc.returncode} while starting:\n{srv.log_tail()}")
        try:
            if srv.kind == "moto":
                with contextlib.suppress(ClientError):
                    c.create_bucket(Bucket=srv.bucket)
            c.head_bucket(Bucket=srv.bucket)
            return
        except (BotoCoreError, ClientError) as e:
            last = f"{type(e).__name__}: {e}"
        time.sleep(0.2)
    raise RuntimeError(f"{srv.kind} at {srv.endpoint} not ready after {ready_s:.0f} s ({last}):\n{srv.log_tail()}")


@contextlib.contextmanager
def running(kind: str, bucket: str = BUCKET, parent: str | None = None) -> Iterator[S3Server]:
    """A ``kind`` server for the duration of the block (see start)."""
    srv = start(kind, bucket, parent=parent)
    try:
        yield srv
    finally:
        srv.stop()


def unique_prefix(name: str = "t") -> str:
    """A key prefix no other test or run uses."""
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:40]
    return f"{safe}-{uuid.uuid4().hex[:12]}"


def list_keys(client: Any, bucket: str, prefix: str) -> list[str]:
    """Every object key under ``prefix`` (all pages)."""
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return sorted(keys)


def open_uploads(client: Any, bucket: str, prefix: str) -> list[str]:
    """Keys of the multipart uploads still open under ``prefix``."""
    r = client.list_multipart_uploads(Bucket=bucket, Prefix=prefix)
    return sorted(u["Key"] for u in r.get("Uploads", []))


# ------------------------------------------------------------------------------------------------
# pytest fixtures: one server of each kind per session, started on first use. A test module
# takes them with `pytest_plugins = ["s3servers"]` (once registered, every module shares them).
# ------------------------------------------------------------------------------------------------

try:
    import pytest
except ImportError:  # the bench imports this module without pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    def _session_server(kind: str) -> Iterator[S3Server]:
        why = missing(kind)
        if why:
            pytest.skip(f"no {kind} server: {why}")
        with running(kind) as srv:
            yield srv

    @pytest.fixture(scope="session")
    def seaweedfs_server() -> Iterator[S3Server]:
        """One SeaweedFS (`weed mini`) for the session."""
        yield from _session_server("seaweedfs")

    @pytest.fixture(scope="session")
    def moto_server() -> Iterator[S3Server]:
        """One moto server for the session."""
        yield from _session_server("moto")

    @pytest.fixture(params=KINDS)
    def s3server(request: Any) -> S3Server:
        """Each test that takes this runs once per server kind."""
        return request.getfixturevalue(f"{request.param}_server")  # type: ignore[no-any-return]

    @pytest.fixture
    def s3prefix(request: Any) -> str:
        """A key prefix unique to this test."""
        return unique_prefix(request.node.name)

    @pytest.fixture
    def s3env(s3server: S3Server) -> Iterator[dict[str, str]]:
        """os.environ set for ``s3server`` during the test; yields the variables."""
        with environ(s3server.env):
            yield s3server.env
