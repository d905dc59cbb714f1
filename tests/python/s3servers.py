# SPDX-License-Identifier: Apache-2.0
"""Local S3 servers for the tests and the S3 bench cell: SeaweedFS (`weed mini`) and moto's server on 127.0.0.1 with free ports, started in their own process group and stopped by process id (procs.py), plus the pytest fixtures that share one of each per session.

Test modules take the fixtures with ``pytest_plugins = ["s3servers"]`` after importing from it,
so pytest finds it already imported: PYTEST_DONT_REWRITE (it has no test asserts to rewrite).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import procs
from procs import STARTS as STARTS
from procs import STOP_GRACE_S as STOP_GRACE_S
from procs import binary as binary
from procs import free_ports as free_ports
from procs import unique_prefix as unique_prefix

KINDS = ("seaweedfs", "moto")
BINARIES = {"seaweedfs": "weed", "moto": "moto_server"}
ACCESS_KEY = "ckptio-test-key"
SECRET_KEY = "ckptio-test-secret"
REGION = "us-east-1"
BUCKET = "ckpt"
# A server that is not answering after this long failed to start.
READY_S = 60.0

T = TypeVar("T")


def missing(kind: str) -> str:
    """Why a ``kind`` server cannot start here ("" when it can)."""
    if binary(BINARIES[kind]) is None:
        return f"{BINARIES[kind]} is not installed (deps/requirements.txt; `make venv`)"
    try:
        import boto3  # noqa: F401
    except ImportError:
        return "boto3 is not installed (deps/requirements.txt; `make venv`)"
    return ""


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
    with procs.environ(env, _CLEARED):
        yield


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
class S3Server(procs.Server):
    """A running server: where it answers, its bucket, the client environment for it, and
    the process (its own group) to stop (alive, log_tail, kill, stop: procs.Server)."""

    bucket: str
    env: dict[str, str]
    ports: dict[str, int] = field(default_factory=dict)

    def client(self, retries: bool = True, timeout: float = 30.0) -> Any:
        return boto3_client(self.endpoint, retries=retries, timeout=timeout)

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"


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
    if kind not in KINDS:
        raise ValueError(f"unknown S3 server kind {kind!r}")
    why = missing(kind)
    if why:
        raise FileNotFoundError(why)
    return procs.start(lambda: _start_once(kind, bucket, ready_s, parent))


def _start_once(kind: str, bucket: str, ready_s: float, parent: str | None) -> S3Server:
    exe = binary(BINARIES[kind])
    assert exe is not None
    d = procs.tempdir(kind, parent)
    if kind == "seaweedfs":
        data = os.path.join(d, "data")
        os.mkdir(data)
        args, ports = _seaweedfs_args(exe, data, bucket)
        port = ports["s3"]
    else:
        port = free_ports(1)[0]
        args, ports = [exe, "-H", "127.0.0.1", "-p", str(port)], {"s3": port}
    endpoint = f"http://127.0.0.1:{port}"
    env = client_env(endpoint)
    # weed mini makes its admin identity from AWS_ACCESS_KEY_ID/SECRET; TMPDIR: where its other
    # sockets go.
    proc, log = procs.spawn(args, d, procs.child_env("AWS_", {**env, "TMPDIR": d}))
    srv = S3Server(kind=kind, endpoint=endpoint, proc=proc, dir=d, log=log, bucket=bucket, env=env, ports=ports)
    return procs.wait_ready(srv, _probe(srv), ready_s, poll_s=0.2)


def _probe(srv: S3Server) -> Callable[[], str | None]:
    """Whether ``srv``'s bucket answers (moto's is created first): None when it does."""
    from botocore.exceptions import BotoCoreError, ClientError

    c = srv.client(retries=False, timeout=2.0)

    def probe() -> str | None:
        try:
            if srv.kind == "moto":
                with contextlib.suppress(ClientError):
                    c.create_bucket(Bucket=srv.bucket)
            c.head_bucket(Bucket=srv.bucket)
            return None
        except (BotoCoreError, ClientError) as e:
            return f"{type(e).__name__}: {e}"

    return probe


@contextlib.contextmanager
def running(kind: str, bucket: str = BUCKET, parent: str | None = None) -> Iterator[S3Server]:
    """A ``kind`` server for the duration of the block (see start)."""
    with procs.stopping(start(kind, bucket, parent=parent)) as srv:
        yield srv


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

    # s3server: each test that takes it runs once per server kind; s3prefix: a key prefix
    # unique to the test; s3env: os.environ set for s3server during the test.
    s3server, s3prefix, s3env = procs.per_test_fixtures("s3", KINDS, lambda kind: f"{kind}_server", environ)
