# SPDX-License-Identifier: Apache-2.0
"""The local GCS server of gcsservers.py: the fixture itself (start, stop, environment), and the
emulator's behaviour that the native gs:// client relies on, over raw HTTP (http.client, no
Google library). The strict xfails are the rows of doc/notes/gcs-emulator.md where
fake-gcs-server 1.54.0 is not what real GCS does; they turn into failures when a newer emulator
fixes them. One server for the whole module (the session's); nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import socket
import uuid
from typing import Any

import pytest

import gcsservers
import procs
from gcsservers import GCSServer, Response, crc32c, delete, download, list_names, new_bucket, quote, stat, upload

pytest_plugins = ["gcsservers"]

KIB256 = 256 * 1024
# For the tests that start a server of their own (the others skip through the fixture).
needs_server = pytest.mark.skipif(bool(gcsservers.missing()), reason=f"no fake-gcs-server: {gcsservers.missing()}")
NAMES = ["dir/sub/obj", "with space", "plus+sign", "per%cent", "ümlaut/ü", "a b+c%d/ü"]


def objects(b: str) -> str:
    return f"/storage/v1/b/{quote(b)}/o"


def uploads(b: str) -> str:
    return f"/upload/storage/v1/b/{quote(b)}/o"


def multipart(srv: GCSServer, b: str, name: str, data: bytes, metadata: dict[str, Any] | None = None,
              **params: str | int) -> Response:  # fmt: skip
    """An uploadType=multipart upload: a multipart/related body of JSON metadata, then the media."""
    sep = f"ckptio-{uuid.uuid4().hex}"
    meta = json.dumps({"name": name, **(metadata or {})}).encode()
    body = (f"--{sep}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode() + meta
            + f"\r\n--{sep}\r\nContent-Type: application/octet-stream\r\n\r\n".encode() + data
            + f"\r\n--{sep}--\r\n".encode())  # fmt: skip
    return srv.request("POST", uploads(b), body, {"Content-Type": f"multipart/related; boundary={sep}"},
                       {"uploadType": "multipart", **params})  # fmt: skip


def initiate(srv: GCSServer, b: str, name: str, **params: str | int) -> str:
    """A resumable upload session for ``name``: its URI."""
    r = srv.request("POST", uploads(b), json.dumps({"name": name}).encode(), {"Content-Type": "application/json"},
                    {"uploadType": "resumable", "name": name, **params})  # fmt: skip
    r.expect("initiate", 200)
    return r.headers["location"]


def put(srv: GCSServer, session: str, data: bytes, first: int, total: int | None) -> Response:
    """A resumable chunk ``data`` at ``first`` (``total``: the object's size, None for "*"),
    or a status query when ``data`` is empty."""
    size = "*" if total is None else str(total)
    span = f"{first}-{first + len(data) - 1}" if data else "*"
    return srv.request("PUT", session, data, {"Content-Range": f"bytes {span}/{size}"})


def compose(srv: GCSServer, b: str, dest: str, sources: list[str], **params: str | int) -> Response:
    body = {"sourceObjects": [{"name": s} for s in sources], "destination": {"contentType": "application/octet-stream"}}
    return srv.request("POST", f"{objects(b)}/{quote(dest)}/compose", json.dumps(body).encode(),
                       {"Content-Type": "application/json"}, params)  # fmt: skip


def md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def error_code(r: Response) -> int:
    """The code of a JSON API error body."""
    assert r.headers.get("content-type", "").startswith("application/json"), r.headers
    return r.json()["error"]["code"]  # type: ignore[no-any-return]


# ------------------------------------------------------------------------------------------------
# The fixture
# ------------------------------------------------------------------------------------------------


def test_fixture(gcsserver: GCSServer, gcsprefix: str, gcsenv: dict[str, str]) -> None:
    assert gcsservers.missing() == ""
    assert gcsserver.endpoint.startswith("http://127.0.0.1:") and gcsserver.alive()
    assert gcsserver.bucket == gcsservers.BUCKET
    assert os.environ["STORAGE_EMULATOR_HOST"] == gcsserver.endpoint == gcsenv["CLOUD_STORAGE_EMULATOR_ENDPOINT"]
    assert os.environ["NO_GCE_CHECK"] == "true" and os.environ["GOOGLE_CLOUD_PROJECT"] == gcsservers.PROJECT
    assert gcsserver.request("GET", f"/storage/v1/b/{gcsserver.bucket}").expect("get").json()["name"] == "ckpt"
    assert gcsprefix.startswith("test_fixture") and stat(gcsserver, gcsprefix) is None


@needs_server
def test_executable_and_missing() -> None:
    exe = gcsservers.executable()
    assert exe is not None and os.access(exe, os.X_OK)
    assert "unknown" in gcsservers.missing("no-such-kind")


def test_environ_clears_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent.json")
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    with gcsservers.environ(gcsservers.client_env("http://127.0.0.1:1")):
        assert "GOOGLE_APPLICATION_CREDENTIALS" not in os.environ
        assert os.environ["STORAGE_EMULATOR_HOST"] == "http://127.0.0.1:1"
    assert os.environ["GOOGLE_APPLICATION_CREDENTIALS"] == "/nonexistent.json"
    assert "STORAGE_EMULATOR_HOST" not in os.environ


def test_request_stays_on_the_server(gcsserver: GCSServer) -> None:
    with pytest.raises(ValueError):
        gcsserver.request("GET", "http://example.com/storage/v1/b")


@needs_server
def test_start_again_on_a_taken_port_and_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A port taken between the choice and the bind: the binary exits and start() tries another
    port. stop() ends the process group and removes the directory."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = [[taken.getsockname()[1]]]
        real = procs.free_ports
        monkeypatch.setattr(procs, "free_ports", lambda n: ports.pop() if ports else real(n))
        with gcsservers.running(bucket="other") as srv:
            assert srv.port != taken.getsockname()[1] and not ports
            assert stat(srv, "x", "other") is None
    assert srv.proc.returncode is not None and not os.path.exists(srv.dir)
    with pytest.raises(ProcessLookupError):
        os.killpg(srv.proc.pid, 0)


def test_start_gives_up_after_starts() -> None:
    tries: list[int] = []

    def once() -> None:
        tries.append(1)
        raise procs.Exited("exited")

    with pytest.raises(procs.Exited):
        procs.start(once)
    assert len(tries) == procs.STARTS


# ------------------------------------------------------------------------------------------------
# What the C client relies on
# ------------------------------------------------------------------------------------------------


def test_http11_transport(gcsserver: GCSServer, gcsprefix: str) -> None:
    """Keep-alive, chunked request bodies, and an immediate 100 Continue, as libcurl does."""
    conn = http.client.HTTPConnection("127.0.0.1", gcsserver.port, timeout=5)
    try:
        path = f"{uploads('ckpt')}?uploadType=media&name={quote(gcsprefix)}"
        conn.request("POST", path, body=iter([b"abc", b"def"]), encode_chunked=True)
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())["size"] == "6"
        sock = conn.sock
        conn.request("GET", f"{objects('ckpt')}/{quote(gcsprefix)}?alt=media")
        r = conn.getresponse()
        assert (r.status, r.read()) == (200, b"abcdef") and conn.sock is sock
    finally:
        conn.close()
    with socket.create_connection(("127.0.0.1", gcsserver.port), timeout=1) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 3\r\n"
                  "Expect: 100-continue\r\n\r\n".encode())  # fmt: skip
        assert s.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n")


def test_create_bucket(gcsserver: GCSServer) -> None:
    name = new_bucket(gcsserver)
    got = gcsserver.request("GET", f"/storage/v1/b/{name}").expect("get bucket").json()
    assert (got["kind"], got["name"]) == ("storage#bucket", name)
    again = gcsserver.request("POST", "/storage/v1/b", json.dumps({"name": name}).encode(),
                              {"Content-Type": "application/json"}, {"project": gcsservers.PROJECT})  # fmt: skip
    assert again.status == 409 and error_code(again) == 409
    bad = gcsserver.request("POST", "/storage/v1/b", b'{"name": "b"}', {"Content-Type": "application/json"},
                            {"project": gcsservers.PROJECT})  # fmt: skip
    assert bad.status == 400
    gone = gcsserver.request("GET", f"/storage/v1/b/{name}-missing")
    assert gone.status == 404 and error_code(gone) == 404


def test_media_upload_metadata(gcsserver: GCSServer, gcsbucket: str) -> None:
    data = os.urandom(100_000)
    got = upload(gcsserver, "obj", data, gcsbucket)
    assert got["generation"].isdigit() and got["metageneration"] == "1"
    assert (got["size"], got["crc32c"], got["md5Hash"]) == (str(len(data)), crc32c(data), md5(data))
    assert got["contentType"] == "application/octet-stream"
    st = stat(gcsserver, "obj", gcsbucket)
    assert st is not None and {k: st[k] for k in ("generation", "size", "crc32c")} == {
        k: got[k] for k in ("generation", "size", "crc32c")}  # fmt: skip
    again = upload(gcsserver, "obj", b"new", gcsbucket, ifGenerationMatch=got["generation"])
    assert int(again["generation"]) > int(got["generation"]) and download(gcsserver, "obj", gcsbucket) == b"new"
    missing = gcsserver.request("POST", uploads(gcsbucket), b"x", params={"uploadType": "media"})
    assert missing.status == 400
    nobucket = gcsserver.request("POST", uploads(gcsbucket + "-missing"), b"x",
                                 params={"uploadType": "media", "name": "x"})  # fmt: skip
    assert nobucket.status == 404


def test_multipart_upload_preconditions(gcsserver: GCSServer, gcsbucket: str) -> None:
    first = multipart(gcsserver, gcsbucket, "obj", b"one", {"metadata": {"k": "v"}}, ifGenerationMatch=0)
    assert first.status == 200
    gen = first.json()["generation"]
    assert first.json()["metadata"] == {"k": "v"} and first.json()["crc32c"] == crc32c(b"one")
    exists = multipart(gcsserver, gcsbucket, "obj", b"two", ifGenerationMatch=0)
    assert exists.status == 412 and error_code(exists) == 412
    assert download(gcsserver, "obj", gcsbucket) == b"one"
    second = multipart(gcsserver, gcsbucket, "obj", b"three", ifGenerationMatch=gen)
    assert second.status == 200 and int(second.json()["generation"]) > int(gen)
    stale = multipart(gcsserver, gcsbucket, "obj", b"four", ifGenerationMatch=gen)
    assert stale.status == 412
    assert download(gcsserver, "obj", gcsbucket) == b"three"


def test_resumable_upload(gcsserver: GCSServer, gcsbucket: str) -> None:
    data = os.urandom(KIB256 + 1000)
    session = initiate(gcsserver, gcsbucket, "obj")
    assert session.startswith(gcsserver.endpoint + "/upload/storage/v1/b/") and "upload_id=" in session
    r = put(gcsserver, session, data[:KIB256], 0, None)
    assert r.status == 308 and r.headers["range"] == f"bytes=0-{KIB256 - 1}"
    r = put(gcsserver, session, data[KIB256:], KIB256, len(data))
    assert r.status == 200 and (r.json()["size"], r.json()["md5Hash"]) == (str(len(data)), md5(data))
    assert download(gcsserver, "obj", gcsbucket) == data
    unknown = put(gcsserver, session.replace("upload_id=", "upload_id=0"), b"", 0, None)
    assert unknown.status == 404


def test_ranged_downloads(gcsserver: GCSServer, gcsbucket: str) -> None:
    upload(gcsserver, "obj", b"0123456789", gcsbucket)
    path = f"{objects(gcsbucket)}/obj"
    full = gcsserver.request("GET", path, params={"alt": "media"})
    assert full.status == 200 and full.headers["content-length"] == "10"
    assert f"crc32c={crc32c(b'0123456789')}" in full.headers["x-goog-hash"] and full.headers["x-goog-generation"]
    for spec, body, span in [("2-5", b"2345", "2-5"), ("7-", b"789", "7-9"), ("-3", b"789", "7-9"),
                             ("8-100", b"89", "8-9")]:  # fmt: skip
        r = gcsserver.request("GET", path, headers={"Range": f"bytes={spec}"}, params={"alt": "media"})
        assert (r.status, r.body, r.headers["content-range"]) == (206, body, f"bytes {span}/10"), spec
    for spec in ["10-", "20-30"]:
        r = gcsserver.request("GET", path, headers={"Range": f"bytes={spec}"}, params={"alt": "media"})
        assert r.status == 416, spec


def test_list_prefix_and_pages(gcsserver: GCSServer, gcsbucket: str) -> None:
    names = [f"dir/{i}" for i in range(6)]
    for n in [*names, "dir-other", "other"]:
        upload(gcsserver, n, b"x", gcsbucket)
    pages: list[list[str]] = []
    params: dict[str, str | int] = {"prefix": "dir/", "maxResults": 2}
    while len(pages) < 10:
        got = gcsserver.request("GET", objects(gcsbucket), params=params).expect("list").json()
        pages.append([o["name"] for o in got["items"]])
        if "nextPageToken" not in got:
            break
        params["pageToken"] = got["nextPageToken"]
    assert pages == [names[0:2], names[2:4], names[4:6]]
    assert list_names(gcsserver, "dir/", gcsbucket, page=4) == names
    tree = gcsserver.request("GET", objects(gcsbucket), params={"delimiter": "/"}).expect("list").json()
    assert tree["prefixes"] == ["dir/"] and [o["name"] for o in tree["items"]] == ["dir-other", "other"]
    empty = gcsserver.request("GET", objects(gcsbucket), params={"prefix": "none/"}).expect("list").json()
    assert empty.get("items", []) == []


def test_delete(gcsserver: GCSServer, gcsbucket: str) -> None:
    upload(gcsserver, "obj", b"x", gcsbucket)
    first = gcsserver.request("DELETE", f"{objects(gcsbucket)}/obj")
    assert first.status in (200, 204) and stat(gcsserver, "obj", gcsbucket) is None
    again = gcsserver.request("DELETE", f"{objects(gcsbucket)}/obj")
    assert again.status == 404 and error_code(again) == 404
    assert not delete(gcsserver, "obj", gcsbucket)


def test_compose(gcsserver: GCSServer, gcsbucket: str) -> None:
    parts = [os.urandom(1000 + i) for i in range(3)]
    for i, p in enumerate(parts):
        upload(gcsserver, f"part/{i}", p, gcsbucket)
    r = compose(gcsserver, gcsbucket, "whole", [f"part/{i}" for i in range(3)])
    assert r.status == 200 and r.json()["crc32c"] == crc32c(b"".join(parts))
    assert download(gcsserver, "whole", gcsbucket) == b"".join(parts)
    assert compose(gcsserver, gcsbucket, "many", ["part/0"] * 32).status == 200
    too_many = compose(gcsserver, gcsbucket, "many", ["part/0"] * 33)
    assert too_many.status == 400 and error_code(too_many) == 400


@pytest.mark.parametrize("name", NAMES)
def test_names_percent_encoded(gcsserver: GCSServer, gcsprefix: str, name: str) -> None:
    full = f"{gcsprefix}/{name}"
    data = name.encode()
    assert upload(gcsserver, full, data)["name"] == full
    st = stat(gcsserver, full)
    assert st is not None and st["name"] == full and st["size"] == str(len(data))
    assert download(gcsserver, full) == data
    assert list_names(gcsserver, gcsprefix + "/") == [full]
    assert delete(gcsserver, full) and stat(gcsserver, full) is None


# ------------------------------------------------------------------------------------------------
# Where fake-gcs-server 1.54.0 is not real GCS (doc/notes/gcs-emulator.md): each test asserts
# what Google documents.
# ------------------------------------------------------------------------------------------------


def deviates(reason: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"fake-gcs-server 1.54.0: {reason}")


@deviates("resumable preconditions are never enforced (fixed in 1.55.0, #2260)")
def test_resumable_precondition_at_finalize(gcsserver: GCSServer, gcsbucket: str) -> None:
    session = initiate(gcsserver, gcsbucket, "obj", ifGenerationMatch=0)
    upload(gcsserver, "obj", b"other writer", gcsbucket)
    r = put(gcsserver, session, b"mine", 0, 4)
    assert r.status == 412
    assert download(gcsserver, "obj", gcsbucket) == b"other writer"


@deviates("a status query finalizes the upload with the bytes so far")
def test_resumable_status_query_mid_upload(gcsserver: GCSServer, gcsbucket: str) -> None:
    session = initiate(gcsserver, gcsbucket, "obj")
    assert put(gcsserver, session, os.urandom(KIB256), 0, None).status == 308
    r = put(gcsserver, session, b"", 0, None)
    assert r.status == 308 and r.headers.get("range") == f"bytes=0-{KIB256 - 1}"
    assert stat(gcsserver, "obj", gcsbucket) is None


@deviates("the session is forgotten at finalize: a status query gets 404")
def test_resumable_status_query_after_finalize(gcsserver: GCSServer, gcsbucket: str) -> None:
    session = initiate(gcsserver, gcsbucket, "obj")
    assert put(gcsserver, session, b"abcd", 0, 4).status == 200
    r = put(gcsserver, session, b"", 0, 4)
    assert r.status in (200, 201) and r.json()["size"] == "4"


@deviates("a resent chunk is appended again")
def test_resumable_resent_chunk(gcsserver: GCSServer, gcsbucket: str) -> None:
    data = os.urandom(2 * KIB256 + 100)
    session = initiate(gcsserver, gcsbucket, "obj")
    assert put(gcsserver, session, data[:KIB256], 0, None).status == 308
    resent = put(gcsserver, session, data[:KIB256], 0, None)  # its answer was lost
    assert resent.status == 308 and resent.headers.get("range") == f"bytes=0-{KIB256 - 1}"
    r = put(gcsserver, session, data[KIB256:], KIB256, len(data))
    assert r.status in (200, 201) and r.json()["size"] == str(len(data))
    assert download(gcsserver, "obj", gcsbucket) == data


@deviates("a cancelled session stays usable")
def test_resumable_cancel(gcsserver: GCSServer, gcsbucket: str) -> None:
    session = initiate(gcsserver, gcsbucket, "obj")
    assert put(gcsserver, session, os.urandom(KIB256), 0, None).status == 308
    assert gcsserver.request("DELETE", session).status == 499
    r = put(gcsserver, session, b"tail", KIB256, KIB256 + 4)
    assert 400 <= r.status < 500 and r.status != 499
    assert stat(gcsserver, "obj", gcsbucket) is None


@deviates("preconditions on media uploads are ignored (fixed after 1.55.1, #2308)")
def test_media_upload_precondition(gcsserver: GCSServer, gcsbucket: str) -> None:
    gen = upload(gcsserver, "obj", b"one", gcsbucket)["generation"]
    for match in ("0", str(int(gen) + 1)):
        r = gcsserver.request("POST", uploads(gcsbucket), b"two", params={"uploadType": "media", "name": "obj",
                                                                           "ifGenerationMatch": match})  # fmt: skip
        assert r.status == 412, match
    assert download(gcsserver, "obj", gcsbucket) == b"one"


@deviates("preconditions on delete are ignored: it deletes")
def test_delete_precondition(gcsserver: GCSServer, gcsbucket: str) -> None:
    gen = upload(gcsserver, "obj", b"one", gcsbucket)["generation"]
    r = gcsserver.request("DELETE", f"{objects(gcsbucket)}/obj", params={"ifGenerationMatch": int(gen) + 1})
    assert r.status == 412
    assert stat(gcsserver, "obj", gcsbucket) is not None


@deviates("preconditions on compose are ignored")
def test_compose_precondition(gcsserver: GCSServer, gcsbucket: str) -> None:
    upload(gcsserver, "part", b"part", gcsbucket)
    upload(gcsserver, "whole", b"there already", gcsbucket)
    r = compose(gcsserver, gcsbucket, "whole", ["part"], ifGenerationMatch=0)
    assert r.status == 412
    assert download(gcsserver, "whole", gcsbucket) == b"there already"


@deviates("it checks no authorization")
def test_unauthorized_without_token(gcsserver: GCSServer) -> None:
    r = gcsserver.request("GET", objects(gcsserver.bucket))
    assert r.status == 401 and error_code(r) == 401
