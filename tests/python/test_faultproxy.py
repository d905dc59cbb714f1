# SPDX-License-Identifier: Apache-2.0
"""The fault proxy itself, proven with boto3 (retries off) against a real server before the S3 tests rely on it: pass-through with keep-alive and streamed bodies, and each fault on its schedule."""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
from faultproxy import FaultProxy, Rule, kind, stall_forever
from s3servers import S3Server, boto3_client, unique_prefix

pytest_plugins = ["s3servers"]


@pytest.fixture
def proxy(moto_server: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(moto_server.endpoint) as p:
        yield p


def client(p: FaultProxy, timeout: float = 10.0) -> Any:
    return boto3_client(p.endpoint, retries=False, timeout=timeout)


def blob(n: int, seed: int = 0) -> bytes:
    """``n`` bytes that differ everywhere (a shifted or truncated copy shows)."""
    out = bytearray()
    i = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}:{i}".encode()).digest() * 64
        i += 1
    return bytes(out[:n])


def test_rule_schedule() -> None:
    every = Rule("503", every=3)
    assert [every.hit("PUT", "/b/k") for _ in range(7)] == [False, False, True, False, False, True, False]
    nxt = Rule("500", "PUT", "partNumber=", skip=1, count=2)
    hits = [nxt.hit("PUT", f"/b/k?partNumber={i}&uploadId=u") for i in range(1, 6)]
    assert hits == [False, True, True, False, False] and nxt.fired == 2
    assert not nxt.hit("GET", "/b/k?partNumber=1") and nxt.seen == 5
    with pytest.raises(ValueError):
        Rule("418")


def test_kind() -> None:
    assert kind("PUT", "/b/k?partNumber=2&uploadId=x", {}) == "PUT part"
    assert kind("PUT", "/b/k/manifest", {}) == "PUT object"
    assert kind("POST", "/b/k?uploads", {}) == "POST create"
    assert kind("POST", "/b/k?uploadId=x", {}) == "POST complete"
    assert kind("DELETE", "/b/k?uploadId=x", {}) == "DELETE abort"
    assert kind("GET", "/b/k", {"range": "bytes=0-9"}) == "GET range"
    assert kind("GET", "/b?list-type=2&prefix=k", {}) == "GET list"


def test_pass_through_streams_and_keeps_alive(s3server: S3Server) -> None:
    with FaultProxy(s3server.endpoint) as proxy:
        pass_through(proxy, s3server)


def pass_through(proxy: FaultProxy, srv: S3Server) -> None:
    c = client(proxy)
    b, k = srv.bucket, unique_prefix("pass") + "/big"
    part = blob(8 << 20, 1)
    up = c.create_multipart_upload(Bucket=b, Key=k)["UploadId"]
    etags = [c.upload_part(Bucket=b, Key=k, UploadId=up, PartNumber=i, Body=part[:-i] if i == 3 else part)["ETag"]
             for i in (1, 2, 3)]  # fmt: skip
    c.complete_multipart_upload(Bucket=b, Key=k, UploadId=up,
                                MultipartUpload={"Parts": [{"ETag": e, "PartNumber": i + 1} for i, e in enumerate(etags)]})  # fmt: skip
    size = 3 * len(part) - 3
    assert c.head_object(Bucket=b, Key=k)["ContentLength"] == size
    got = c.get_object(Bucket=b, Key=k, Range=f"bytes={len(part) - 5}-{len(part) + 4}")["Body"].read()
    assert got == part[-5:] + part[:5]
    whole = c.get_object(Bucket=b, Key=k)["Body"].read()
    assert len(whole) == size and whole[: len(part)] == part
    assert proxy.counts["PUT part"] == 3 and proxy.counts["POST create"] == 1
    assert proxy.counts["POST complete"] == 1 and proxy.counts["GET range"] == 1
    assert proxy.counts["GET object"] == 1 and proxy.counts["HEAD"] == 1
    assert proxy.connections <= 2, "keep-alive: one connection carries the requests"
    assert proxy.sizes["PUT part"] == [len(part), len(part), len(part) - 3]
    assert not proxy.injected
    # The log: every request in order, with its target, status and the answer's length.
    assert [s.kind for s in proxy.log] == ["POST create"] + ["PUT part"] * 3 + ["POST complete", "HEAD", "GET range", "GET object"]
    assert all(s.target.startswith(f"/{b}/{k}") for s in proxy.log)
    assert [(s.status, s.received) for s in proxy.log[-2:]] == [(206, 10), (200, size)]
    assert proxy.log[1].sent == len(part) and proxy.log[1].status == 200


def test_503_then_success(proxy: FaultProxy, moto_server: S3Server) -> None:
    from botocore.exceptions import ClientError

    c = client(proxy)
    b, k = moto_server.bucket, unique_prefix("slow") + "/obj"
    proxy.add(Rule("503", "PUT", count=2))
    for _ in range(2):
        with pytest.raises(ClientError) as e:
            c.put_object(Bucket=b, Key=k, Body=blob(2 << 20))
        assert e.value.response["Error"]["Code"] == "SlowDown"
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    c.put_object(Bucket=b, Key=k, Body=blob(2 << 20))
    assert c.get_object(Bucket=b, Key=k)["Body"].read() == blob(2 << 20)
    assert proxy.injected[("PUT object", "503")] == 2 and proxy.counts["PUT object"] == 3
    assert [s.status for s in proxy.log if s.kind == "PUT object"] == [503, 503, 200]


def test_500_every_second_get(proxy: FaultProxy, moto_server: S3Server) -> None:
    from botocore.exceptions import ClientError

    c = client(proxy)
    b, k = moto_server.bucket, unique_prefix("e500") + "/obj"
    c.put_object(Bucket=b, Key=k, Body=b"abc")
    proxy.add(Rule("500", "GET", every=2))
    results = []
    for _ in range(4):
        try:
            results.append(c.get_object(Bucket=b, Key=k)["Body"].read())
        except ClientError as e:
            results.append(e.response["Error"]["Code"].encode())
    assert results == [b"abc", b"InternalError", b"abc", b"InternalError"]


def test_reset_before_response(proxy: FaultProxy, moto_server: S3Server) -> None:
    from botocore.exceptions import ConnectionClosedError, EndpointConnectionError

    c = client(proxy)
    b, k = moto_server.bucket, unique_prefix("reset") + "/obj"
    proxy.add(Rule("reset", "PUT", count=1))
    with pytest.raises((ConnectionClosedError, EndpointConnectionError)):
        c.put_object(Bucket=b, Key=k, Body=blob(4 << 20))
    c.put_object(Bucket=b, Key=k, Body=b"x")  # the next request passes on a new connection
    assert proxy.injected[("PUT object", "reset")] == 1


def test_reset_mid_body(proxy: FaultProxy, moto_server: S3Server) -> None:
    from botocore.exceptions import BotoCoreError

    c = client(proxy)
    b, k = moto_server.bucket, unique_prefix("midreset") + "/obj"
    data = blob(6 << 20, 2)
    c.put_object(Bucket=b, Key=k, Body=data)
    proxy.add(Rule("reset_body", "GET", count=1))
    with pytest.raises((BotoCoreError, OSError)):
        c.get_object(Bucket=b, Key=k, Range="bytes=0-4194303")["Body"].read()
    assert c.get_object(Bucket=b, Key=k, Range="bytes=0-4194303")["Body"].read() == data[: 4 << 20]
    assert proxy.injected[("GET range", "reset_body")] == 1


def test_stall_then_clear(proxy: FaultProxy, moto_server: S3Server) -> None:
    from botocore.exceptions import ReadTimeoutError

    c = client(proxy, timeout=1.0)
    b, k = moto_server.bucket, unique_prefix("stall") + "/obj"
    c.put_object(Bucket=b, Key=k, Body=b"abc")
    proxy.add(Rule("stall", "GET", stall_s=30, count=1))
    t0 = time.monotonic()
    with pytest.raises(ReadTimeoutError):
        c.get_object(Bucket=b, Key=k)
    assert time.monotonic() - t0 < 10
    assert c.get_object(Bucket=b, Key=k)["Body"].read() == b"abc"  # count=1: the next passes


def test_stall_then_resume(proxy: FaultProxy, moto_server: S3Server) -> None:
    c = client(proxy, timeout=10.0)
    b, k = moto_server.bucket, unique_prefix("resume") + "/obj"
    c.put_object(Bucket=b, Key=k, Body=b"abc")
    proxy.add(Rule("stall", "GET", stall_s=1.5, resume=True))
    t0 = time.monotonic()
    assert c.get_object(Bucket=b, Key=k)["Body"].read() == b"abc"
    assert 1.4 < time.monotonic() - t0 < 8


def test_stall_mid_body(proxy: FaultProxy, moto_server: S3Server) -> None:
    from botocore.exceptions import BotoCoreError

    c = client(proxy, timeout=1.0)
    b, k = moto_server.bucket, unique_prefix("stallbody") + "/obj"
    c.put_object(Bucket=b, Key=k, Body=blob(1 << 20))
    proxy.add(Rule("stall_body", "GET", stall_s=30, count=1))
    t0 = time.monotonic()
    with pytest.raises((BotoCoreError, OSError)):
        c.get_object(Bucket=b, Key=k)["Body"].read()
    assert time.monotonic() - t0 < 10


def test_dead_server_and_close(moto_server: S3Server) -> None:
    from botocore.exceptions import ReadTimeoutError

    with FaultProxy(moto_server.endpoint) as p:
        p.add(stall_forever())
        c = client(p, timeout=1.0)
        for _ in range(2):
            with pytest.raises(ReadTimeoutError):
                c.head_bucket(Bucket=moto_server.bucket)
        assert p.rules[0].stall_s == math.inf and p.counts["HEAD"] == 2
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 6, "close() ends stalls at once"


def test_libcurl_expect_and_chunked(s3server: S3Server, tmp_path: Any) -> None:
    """What libcurl sends, through the proxy: a PUT with Expect: 100-continue, a chunked PUT
    of unknown length, a ranged GET (the curl command, SigV4-signed by curl itself)."""
    import shutil
    import subprocess

    from s3servers import ACCESS_KEY, SECRET_KEY

    if shutil.which("curl") is None:
        pytest.skip("no curl command")
    data = blob(12 << 20, 3)
    src = tmp_path / "blob"
    src.write_bytes(data)
    with FaultProxy(s3server.endpoint) as p:
        curl = ["curl", "-sS", "--fail-with-body", "--max-time", "60", "--aws-sigv4", "aws:amz:us-east-1:s3",
                "--user", f"{ACCESS_KEY}:{SECRET_KEY}"]  # fmt: skip
        u = f"{p.endpoint}/{s3server.bucket}/{unique_prefix('curl')}"
        subprocess.run([*curl, "-T", str(src), u + "/a"], check=True, capture_output=True, timeout=90)
        subprocess.run([*curl, "-T", "-", "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", u + "/b"],
                       input=data[: 3 << 20], check=True, capture_output=True, timeout=90)  # fmt: skip
        got = subprocess.run([*curl, "-H", "Range: bytes=100-5000099", u + "/a"], check=True, capture_output=True,
                             timeout=90).stdout  # fmt: skip
        assert got == data[100:5000100]
        got = subprocess.run([*curl, u + "/b"], check=True, capture_output=True, timeout=90).stdout
        assert got == data[: 3 << 20]
        assert p.counts["PUT object"] == 2 and p.counts["GET range"] == 1 and p.counts["GET object"] == 1


def test_server_stops_by_process_group() -> None:
    """A server started and stopped leaves no process of its group and no directory."""
    import os

    from s3servers import missing, running

    if missing("moto"):
        pytest.skip(missing("moto"))
    with running("moto") as srv:
        pid, d = srv.proc.pid, srv.dir
        assert os.path.isdir(d)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    assert not os.path.exists(d)


def test_env_points_at_proxy(proxy: FaultProxy, moto_server: S3Server) -> None:
    env = proxy.env(moto_server.env)
    assert env["AWS_ENDPOINT_URL"] == proxy.endpoint
    assert env["AWS_ACCESS_KEY_ID"] == moto_server.env["AWS_ACCESS_KEY_ID"]
