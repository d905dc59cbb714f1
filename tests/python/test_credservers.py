# SPDX-License-Identifier: Apache-2.0
"""The credential stand-ins (credservers), the FaultProxy expiry gate and the TLS front, proven
against the reference clients (botocore's credential providers, boto3 over the proxy and over
TLS) before the C client's credential chain is tested against them."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from credservers import (
    CLOUD_PLATFORM,
    ContainerCreds,
    Creds,
    GceMetadata,
    Imds,
    Issuer,
    OAuthToken,
    expiry_gate,
    make_jwt,
    public_key_pem,
    rsa_key_pem,
    sa_claims,
    service_account_file,
)
from faultproxy import FaultProxy
from s3servers import S3Server, unique_prefix
from tlsfront import TlsFront, make_ca, server_cert

pytest_plugins = ["s3servers"]

# Never through a proxy: every request here is for 127.0.0.1.
_URLOPEN = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """No AWS configuration at all: no AWS_* variables, config and credential files that do not
    exist, no boto2 config, no proxies. A credential provider can only be the one a test sets."""
    for k in list(os.environ):
        if k.startswith("AWS_") or k.upper() in _PROXY_VARS or k.startswith("GCE_METADATA"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("BOTO_CONFIG", str(tmp_path / "no-boto-config"))


def fetch(url: str, method: str = "GET", headers: dict[str, str] | None = None,
          data: bytes | None = None) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    """(status, headers, body) of one request; an HTTP error status is an answer too."""
    assert urllib.parse.urlsplit(url).hostname == "127.0.0.1", url
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with _URLOPEN.open(req, timeout=10) as r:
            return r.status, dict(r.headers.items()), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers.items()), e.read()


def session_credentials() -> Any:
    import botocore.session

    return botocore.session.get_session().get_credentials()


def s3client(endpoint: str, creds: Creds | None = None, verify: str | bool | None = None,
             key: tuple[str, str, str | None] | None = None, sigv4: bool = False) -> Any:  # fmt: skip
    """boto3 S3 at ``endpoint``, path-style, no retries, with ``creds`` (or ``key``: (id,
    secret, token)); ``sigv4``: presigned URLs SigV4 too (botocore's default for them is
    SigV2's query form)."""
    import boto3
    from botocore.config import Config

    if creds is not None:
        key = (creds.access_key_id, creds.secret_access_key, creds.session_token)
    akid, secret, token = key or ("ckptio-test-key", "ckptio-test-secret", None)
    cfg = Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}, connect_timeout=5,
                 read_timeout=10, signature_version="s3v4" if sigv4 else None)  # fmt: skip
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=akid,
                        aws_secret_access_key=secret, aws_session_token=token, verify=verify, config=cfg)  # fmt: skip


# ------------------------------------------------------------------------------------------------
# Issuer
# ------------------------------------------------------------------------------------------------


def test_issuer() -> None:
    iss = Issuer(lifetime_s=100)
    c = iss.issue()
    assert len(c.access_key_id) == 20 and c.access_key_id.startswith("ASIA") and len(c.secret_access_key) == 40
    assert len(c.session_token) > 100 and iss.issued == [c] and iss.get(c.access_key_id) == c
    left = (c.expiration - dt.datetime.now(dt.timezone.utc)).total_seconds()
    assert 98 < left <= 100 and c.expiration.tzinfo is not None
    assert dt.datetime.strptime(c.expiration_str, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc) <= c.expiration
    assert iss.expired(c.access_key_id) is False and iss.expired("ASIANEVERISSUED00000") is None
    iss.lifetime_s = 0
    d = iss.issue()
    assert iss.expired(d.access_key_id) is True
    iss.expire(c.access_key_id)
    assert iss.expired(c.access_key_id) is True
    iss.fail_next(2, 503)
    assert [iss._take_failure(), iss._take_failure(), iss._take_failure()] == [503, 503, None] and iss.failures == 2


# ------------------------------------------------------------------------------------------------
# EC2 instance metadata
# ------------------------------------------------------------------------------------------------


def test_imds_v2_with_botocore(aws_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    iss = Issuer()
    with Imds(iss) as imds:
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url + "/")
        creds = session_credentials()
        assert creds is not None and creds.method == "iam-role"
        got = creds.get_frozen_credentials()
        c = iss.issued[-1]
        assert (got.access_key, got.secret_key, got.token) == (c.access_key_id, c.secret_access_key, c.session_token)
        # IMDSv2 as botocore does it: a token first, then every GET carries it.
        assert imds.requests[0] == ("PUT", "/latest/api/token") and imds.token_puts == 1
        assert imds.log[0].headers["x-aws-ec2-metadata-token-ttl-seconds"] == "21600"
        gets = imds.log[1:]
        assert [g.target for g in gets] == ["/latest/meta-data/iam/security-credentials/",
                                            "/latest/meta-data/iam/security-credentials/ckptio-role"]  # fmt: skip
        assert all(g.method == "GET" and g.headers["x-aws-ec2-metadata-token"] in imds.tokens for g in gets)
        # A failing credential answer: botocore finds no credentials; the next one works again.
        iss.fail_next(1, 500)
        assert session_credentials() is None and iss.failures == 1
        assert session_credentials().get_frozen_credentials().access_key == iss.issued[-1].access_key_id


def test_imds_rules() -> None:
    iss = Issuer()
    with Imds(iss, region="eu-west-1") as imds, Imds(iss, require_token=False) as v1:
        tok_url = imds.url + "/latest/api/token"
        for ttl in (None, "0", "21601", "x"):
            h = {} if ttl is None else {"X-aws-ec2-metadata-token-ttl-seconds": ttl}
            assert fetch(tok_url, "PUT", h)[0] == 400
        status, hdrs, tok = fetch(tok_url, "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "60"})
        assert status == 200 and hdrs["X-aws-ec2-metadata-token-ttl-seconds"] == "60"
        assert fetch(tok_url, "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "60", "X-Forwarded-For": "1.2.3.4"})[0] == 403
        t = {"X-aws-ec2-metadata-token": tok.decode()}
        doc = imds.url + "/latest/dynamic/instance-identity/document"
        assert fetch(doc)[0] == 401 and fetch(doc, headers={"X-aws-ec2-metadata-token": "nope"})[0] == 401
        assert json.loads(fetch(doc, headers=t)[2])["region"] == "eu-west-1"
        assert fetch(imds.url + "/latest/meta-data/placement/region", headers=t)[2] == b"eu-west-1"
        assert fetch(imds.url + "/latest/meta-data/iam/security-credentials/other", headers=t)[0] == 404
        s, _, body = fetch(imds.url + "/latest/meta-data/iam/security-credentials/ckptio-role", headers=t)
        j = json.loads(body)
        assert s == 200 and j["Code"] == "Success" and j["Type"] == "AWS-HMAC"
        assert j["AccessKeyId"] == iss.issued[-1].access_key_id and j["Expiration"].endswith("Z")
        imds.expire_tokens()
        assert fetch(doc, headers=t)[0] == 401
        # IMDSv1 where allowed; a bad token is still refused there.
        assert fetch(v1.url + "/latest/meta-data/iam/security-credentials/")[2] == b"ckptio-role"
        assert fetch(v1.url + "/latest/meta-data/placement/region", headers={"X-aws-ec2-metadata-token": "x"})[0] == 401
        assert fetch(v1.url + "/latest/meta-data/placement/region", headers={"X-Forwarded-For": "1.2.3.4"})[0] == 403


# ------------------------------------------------------------------------------------------------
# Container credentials
# ------------------------------------------------------------------------------------------------


def test_container_with_botocore(aws_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from botocore.exceptions import CredentialRetrievalError
    from botocore.utils import ContainerMetadataFetcher

    monkeypatch.setattr(ContainerMetadataFetcher, "SLEEP_TIME", 0)  # its retries, without the waits
    iss = Issuer()
    with ContainerCreds(iss, token="secret-token") as cc:
        assert cc.full_uri == cc.url + "/v1/credentials"
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", cc.full_uri)
        monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN", "secret-token")
        creds = session_credentials()
        assert creds.method == "container-role"
        got = creds.get_frozen_credentials()
        c = iss.issued[-1]
        assert (got.access_key, got.secret_key, got.token) == (c.access_key_id, c.secret_access_key, c.session_token)
        assert cc.log[-1].headers["authorization"] == "secret-token"
        # EKS Pod Identity: a /v2 path and the token from a file.
        (tmp_path / "token").write_text("secret-token")
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", cc.url + "/v2/credentials/abc")
        monkeypatch.delenv("AWS_CONTAINER_AUTHORIZATION_TOKEN")
        monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", str(tmp_path / "token"))
        assert session_credentials().get_frozen_credentials().access_key == iss.issued[-1].access_key_id
        assert cc.requests[-1] == ("GET", "/v2/credentials/abc")
        # The wrong token: 401, which botocore retries (3 times) and then gives up on.
        (tmp_path / "token").write_text("wrong")
        before, n = len(iss.issued), len(cc.requests)
        with pytest.raises(CredentialRetrievalError, match="401"):
            session_credentials()
        assert len(iss.issued) == before and len(cc.requests) - n == ContainerMetadataFetcher.RETRY_ATTEMPTS
        status, _, body = fetch(cc.full_uri)
        assert status == 401 and fetch(cc.url + "/elsewhere", headers={"Authorization": "secret-token"})[0] == 404
        iss.fail_next(1, 503)
        assert fetch(cc.full_uri, headers={"Authorization": "secret-token"})[0] == 503
        j = json.loads(fetch(cc.full_uri, headers={"Authorization": "secret-token"})[2])
        assert set(j) == {"AccessKeyId", "SecretAccessKey", "Token", "Expiration", "RoleArn"}


# ------------------------------------------------------------------------------------------------
# Google: metadata server, OAuth2 token endpoint
# ------------------------------------------------------------------------------------------------


def test_gce_metadata() -> None:
    flavor = {"Metadata-Flavor": "Google"}
    with GceMetadata(token_lifetime_s=120) as md:
        base = md.url + "/computeMetadata/v1"
        s, h, _ = fetch(md.url + "/")
        assert s == 200 and h["Metadata-Flavor"] == "Google"
        s, h, _ = fetch(base + "/project/project-id")
        assert s == 403 and h["Metadata-Flavor"] == "Google"
        assert fetch(base + "/project/project-id", headers={"Metadata-Flavor": "google"})[0] == 403
        assert fetch(base + "/project/project-id", headers={**flavor, "X-Forwarded-For": "1.2.3.4"})[0] == 403
        assert fetch(base + "/project/project-id", headers=flavor)[2] == b"ckptio-proj"
        assert fetch(base + "/instance/service-accounts/default/email", headers=flavor)[2] == md.email.encode()
        s, h, body = fetch(base + "/instance/service-accounts/default/token?scopes=" + CLOUD_PLATFORM, headers=flavor)
        j = json.loads(body)
        assert s == 200 and h["Metadata-Flavor"] == "Google" and h["Content-Type"] == "application/json"
        assert j["token_type"] == "Bearer" and j["access_token"].startswith("ya29.") and j["expires_in"] == 120
        assert md.token_expired(j["access_token"]) is False and md.token_expired("ya29.unknown") is None
        md.expire(j["access_token"])
        assert md.token_expired(j["access_token"]) is True
        info = json.loads(fetch(base + "/instance/service-accounts/default/?recursive=true", headers=flavor)[2])
        assert info["email"] == md.email and CLOUD_PLATFORM in info["scopes"]
        md.fail_next(1, 503)
        assert fetch(base + "/instance/service-accounts/default/token", headers=flavor)[0] == 503
        assert fetch(base + "/instance/service-accounts/default/token", headers=flavor)[0] == 200
        assert fetch(base + "/instance/nothing", headers=flavor)[0] == 404
        assert md.counts[("GET", "/computeMetadata/v1/instance/service-accounts/default/token")] == 3


def post_form(url: str, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
    s, _, body = fetch(url, "POST", {"Content-Type": "application/x-www-form-urlencoded"},
                       urllib.parse.urlencode(form).encode())  # fmt: skip
    return s, json.loads(body)


def test_oauth_token(tmp_path: Any) -> None:
    grant = OAuthToken.GRANT
    with OAuthToken() as ep:
        pem = service_account_file(tmp_path / "sa.json", ep.token_url)
        ep.set_key(public_key_pem(pem))
        info = json.loads((tmp_path / "sa.json").read_text())
        assert info["type"] == "service_account" and info["token_uri"] == ep.token_url
        assert info["private_key"] == pem and pem.startswith("-----BEGIN PRIVATE KEY-----")
        assert {"project_id", "private_key_id", "client_email", "client_id"} <= set(info)
        claims = sa_claims(info["client_email"], ep.token_url)
        s, j = post_form(ep.token_url, {"grant_type": grant, "assertion": make_jwt(pem, claims, kid=info["private_key_id"])})
        assert s == 200 and j["token_type"] == "Bearer" and j["access_token"].startswith("ya29.") and j["expires_in"] == 3600
        assert ep.claims[-1]["iss"] == info["client_email"] and ep.token_expired(j["access_token"]) is False
        other = rsa_key_pem()
        now = time.time()
        bad = {
            "Invalid JWT Signature.": make_jwt(other, claims),
            "aud": make_jwt(pem, {**claims, "aud": "https://sts.googleapis.com/v1/token"}),
            "short-lived": make_jwt(pem, sa_claims(info["client_email"], ep.token_url, lifetime_s=3601)),
            "timeframe": make_jwt(pem, sa_claims(info["client_email"], ep.token_url, now=now - 7200)),
            "scope": make_jwt(pem, {k: v for k, v in claims.items() if k != "scope"}),
            "RS256": make_jwt(pem, claims, alg="HS256"),
        }
        for why, jwt in bad.items():
            s, j = post_form(ep.token_url, {"grant_type": grant, "assertion": jwt})
            assert s == 400 and j["error"] == "invalid_grant" and why in j["error_description"], (why, j)
        s, j = post_form(ep.token_url, {"grant_type": "client_credentials", "assertion": make_jwt(pem, claims)})
        assert s == 400 and j["error"] == "unsupported_grant_type"
        assert len(ep.rejected) == len(bad) + 1 and len(ep.issued) == 1


def test_google_auth_reference(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """google-auth, when installed, gets tokens from both Google stand-ins (its metadata and
    service-account credentials), through a transport that sends nothing but to 127.0.0.1."""
    with GceMetadata() as md, OAuthToken() as ep:
        host = md.url.removeprefix("http://")
        monkeypatch.setenv("GCE_METADATA_HOST", host)
        monkeypatch.setenv("GCE_METADATA_IP", host)
        pytest.importorskip("google.auth", reason="google-auth is not installed (optional reference)")
        import google.auth.exceptions
        import google.auth.transport
        from google.auth import compute_engine
        from google.oauth2 import service_account

        class Resp(google.auth.transport.Response):
            def __init__(self, status: int, headers: dict[str, str], data: bytes) -> None:
                # google-auth looks headers up in lower case (requests' are case-blind)
                self._s, self._h, self._d = status, {k.lower(): v for k, v in headers.items()}, data

            @property
            def status(self) -> int:
                return self._s

            @property
            def headers(self) -> dict[str, str]:
                return self._h

            @property
            def data(self) -> bytes:
                return self._d

        class Local(google.auth.transport.Request):
            def __call__(self, url: str, method: str = "GET", body: Any = None, headers: Any = None,
                         timeout: Any = None, **kwargs: Any) -> Resp:  # fmt: skip
                if urllib.parse.urlsplit(url).hostname != "127.0.0.1":
                    raise google.auth.exceptions.TransportError(f"refusing to reach {url}")
                return Resp(*fetch(url, method, dict(headers or {}), body.encode() if isinstance(body, str) else body))

        gce = compute_engine.Credentials()
        gce.refresh(Local())
        assert md.token_expired(gce.token) is False
        pem = service_account_file(tmp_path / "sa.json", ep.token_url)
        ep.set_key(pem)
        sa = service_account.Credentials.from_service_account_file(str(tmp_path / "sa.json"), scopes=[CLOUD_PLATFORM])
        sa.refresh(Local())
        assert ep.token_expired(sa.token) is False and ep.claims[-1]["scope"] == CLOUD_PLATFORM


# ------------------------------------------------------------------------------------------------
# The expiry gate, through the FaultProxy, in front of moto
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def gated(moto_server: S3Server) -> Iterator[tuple[FaultProxy, Issuer, GceMetadata]]:
    iss = Issuer(lifetime_s=1)
    with GceMetadata() as md, FaultProxy(moto_server.endpoint, gate=expiry_gate(iss, md)) as proxy:
        yield proxy, iss, md


def test_expiry_gate_with_boto3(aws_env: None, gated: tuple[FaultProxy, Issuer, GceMetadata],
                                moto_server: S3Server) -> None:  # fmt: skip
    from botocore.exceptions import ClientError

    proxy, iss, _ = gated
    b, k = moto_server.bucket, unique_prefix("gate") + "/obj"
    c = iss.issue()
    s3 = s3client(proxy.endpoint, c)
    s3.put_object(Bucket=b, Key=k, Body=b"x" * 1000)
    assert s3.get_object(Bucket=b, Key=k)["Body"].read() == b"x" * 1000
    url = s3.generate_presigned_url("get_object", Params={"Bucket": b, "Key": k})  # SigV2 query
    url4 = s3client(proxy.endpoint, c, sigv4=True).generate_presigned_url("get_object", Params={"Bucket": b, "Key": k})
    assert "x-amz-security-token=" in url and "X-Amz-Credential=" in url4 and "X-Amz-Security-Token=" in url4
    assert fetch(url)[0] == 200 and fetch(url4)[0] == 200
    assert not proxy.gated and proxy.counts["PUT object"] == 1
    while not iss.expired(c.access_key_id):
        time.sleep(0.05)
    # (a 2 MiB PUT goes with Expect: 100-continue: refused before its body, the connection closed)
    for call in (lambda: s3.put_object(Bucket=b, Key=k, Body=b"y" * 5000), lambda: s3.get_object(Bucket=b, Key=k),
                 lambda: s3.put_object(Bucket=b, Key=k, Body=b"y" * (2 << 20))):  # fmt: skip
        with pytest.raises(ClientError) as e:
            call()
        assert e.value.response["Error"]["Code"] == "ExpiredToken"
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
        assert e.value.response["Error"]["Message"] == "The provided token has expired."
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=b, Key=k)
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    for u in (url, url4):
        s, _, body = fetch(u)
        assert s == 400 and b"<Code>ExpiredToken</Code>" in body
    # (botocore follows a HeadObject 400 with a HeadBucket for the bucket's region: HEADs vary)
    assert proxy.gated[("PUT object", 400)] == 2 and proxy.gated[("GET object", 400)] == 3
    assert set(proxy.gated) == {("PUT object", 400), ("GET object", 400), ("HEAD", 400)}
    assert proxy.gate.refused["ExpiredToken"] == proxy.gated.total()  # type: ignore[union-attr]
    # A live key with another key's session token (or none): InvalidToken.
    iss.lifetime_s = 3600
    live, other = iss.issue(), iss.issue()
    for token in (other.session_token, None):
        with pytest.raises(ClientError) as e:
            s3client(proxy.endpoint, key=(live.access_key_id, live.secret_access_key, token)).head_bucket(Bucket=b)
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    with pytest.raises(ClientError) as e:
        s3client(proxy.endpoint, key=(live.access_key_id, live.secret_access_key, None)).list_objects_v2(Bucket=b)
    assert e.value.response["Error"]["Code"] == "InvalidToken"
    # The live key, and keys it never issued, pass through.
    assert s3client(proxy.endpoint, live).get_object(Bucket=b, Key=k)["Body"].read() == b"x" * 1000
    assert s3client(proxy.endpoint).get_object(Bucket=b, Key=k)["Body"].read() == b"x" * 1000


def test_expiry_gate_keep_alive_and_bearer(gated: tuple[FaultProxy, Issuer, GceMetadata],
                                           moto_server: S3Server) -> None:  # fmt: skip
    proxy, iss, md = gated
    c = iss.issue()
    iss.expire(c.access_key_id)
    tok = json.loads(fetch(md.url + "/computeMetadata/v1/instance/service-accounts/default/token",
                           headers={"Metadata-Flavor": "Google"})[2])["access_token"]  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    key = f"/{moto_server.bucket}/{unique_prefix('keep')}"
    sig = f"AWS4-HMAC-SHA256 Credential={c.access_key_id}/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00"
    # A gated PUT with a body: the body is read and dropped, so the next request on the same
    # connection is parsed from its own first byte.
    conn.request("PUT", key, body=b"z" * 300_000, headers={"Authorization": sig, "x-amz-security-token": c.session_token})
    r = conn.getresponse()
    assert r.status == 400 and b"ExpiredToken" in r.read() and r.getheader("Connection") == "keep-alive"
    conn.request("GET", f"/{moto_server.bucket}?list-type=2")
    r = conn.getresponse()
    assert r.status == 200 and b"ListBucketResult" in r.read()
    conn.request("GET", key, headers={"Authorization": f"Bearer {tok}"})
    r = conn.getresponse()
    assert r.status == 404  # a live Google token is forwarded (moto: no such key)
    r.read()
    md.expire(tok)
    conn.request("GET", key, headers={"Authorization": f"Bearer {tok}"})
    r = conn.getresponse()
    j = json.loads(r.read())
    assert r.status == 401 and j["error"]["code"] == 401 and j["error"]["message"] == "Invalid Credentials"
    assert "invalid_token" in (r.getheader("WWW-Authenticate") or "")
    conn.close()
    assert proxy.connections == 1 and proxy.gated == {("PUT object", 400): 1, ("GET object", 401): 1}
    assert proxy.counts["GET list"] == 1 and proxy.counts["GET object"] == 2


# ------------------------------------------------------------------------------------------------
# TLS front
# ------------------------------------------------------------------------------------------------


def test_tls_front(aws_env: None, moto_server: S3Server, tmp_path: Any) -> None:
    import botocore.exceptions

    ca = make_ca(tmp_path)
    cert, key = server_cert(ca, tmp_path)
    other_ca, _ = make_ca(tmp_path, name="other")
    u = urllib.parse.urlsplit(moto_server.endpoint)
    assert u.hostname is not None and u.port is not None
    b, k = moto_server.bucket, unique_prefix("tls") + "/obj"
    blob = os.urandom(3 << 20)
    with TlsFront(u.hostname, u.port, cert, key) as front:
        assert front.url == f"https://127.0.0.1:{front.port}"
        s3 = s3client(front.url, verify=ca[0])
        s3.put_object(Bucket=b, Key=k, Body=blob)
        assert s3.get_object(Bucket=b, Key=k)["Body"].read() == blob
        assert s3client(f"https://localhost:{front.port}", verify=ca[0]).head_object(Bucket=b, Key=k)["ContentLength"] == len(blob)
        assert front.handshakes >= 2 and front.handshake_failures == 0
        with pytest.raises(botocore.exceptions.SSLError):
            s3client(front.url, verify=other_ca).head_bucket(Bucket=b)
        assert front.wait_handshake_failures(1) and "CA" in front.failures[0].upper()
