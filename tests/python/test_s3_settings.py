# SPDX-License-Identifier: Apache-2.0
"""S3 as a cluster reaches it: the credential chain (instance metadata, container endpoint, web
identity and profiles through moto's STS, credential_process), credentials that expire
mid-save, TLS with a CA of the test's own, a store that never answers, and settings per store
(two servers in one process: save to one, convert to the other, a Manager on one while loading
from the other). Every server is local and started here or by s3servers.py; no request leaves
127.0.0.1. ckptio runs in this process: settings are read per call, so each test sets its own."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from credservers import ContainerCreds, Imds, Issuer, expiry_gate
from faultproxy import FaultProxy, Rule
from s3servers import ACCESS_KEY, REGION, SECRET_KEY, S3Server, free_ports, list_keys, unique_prefix
from tlsfront import TlsFront, make_ca, server_cert

import ckptio
from ckptio._convert import convert

pytest_plugins = ["s3servers"]

MiB = 1 << 20

# Every variable that steers an AWS credential chain: each test starts from none of them.
CHAIN_VARS = (
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_ROLE_SESSION_NAME",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_EC2_METADATA_SERVICE_ENDPOINT", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL_STS", "AWS_CA_BUNDLE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
    "CKPTIO_S3_TIMEOUT", "CKPTIO_S3_FIRST_TIMEOUT",
)  # fmt: skip


@pytest.fixture
def bare_env(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """No credentials anywhere: no variables, empty shared files, no instance metadata."""
    for k in CHAIN_VARS:
        monkeypatch.delenv(k, raising=False)
    cfg, creds = tmp_path / "aws-config", tmp_path / "aws-credentials"
    cfg.write_text("")
    creds.write_text("")
    env = {"AWS_CONFIG_FILE": str(cfg), "AWS_SHARED_CREDENTIALS_FILE": str(creds),
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_REGION": REGION}  # fmt: skip
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


class Watch:
    """A gate for FaultProxy: records the access key and session token of every request, and
    answers as the expiry gate of ``issuer`` does (ExpiredToken for its expired keys)."""

    def __init__(self, issuer: Issuer | None = None) -> None:
        self.keys: Counter[str] = Counter()
        self.tokens: set[str] = set()
        self.inner = expiry_gate(issuer) if issuer is not None else None
        self.lock = threading.Lock()

    def __call__(self, method: str, target: str, headers: dict[str, str]) -> Any:
        m = re.search(r"Credential=([^/]+)/", headers.get("authorization", ""))
        with self.lock:
            if m:
                self.keys[m.group(1)] += 1
            if "x-amz-security-token" in headers:
                self.tokens.add(headers["x-amz-security-token"])
        return self.inner(method, target, headers) if self.inner is not None else None


@pytest.fixture
def proxied(moto_server: S3Server) -> Iterator[tuple[FaultProxy, Watch]]:
    """moto behind a FaultProxy whose gate records what each request was signed with."""
    watch = Watch()
    with FaultProxy(moto_server.endpoint, gate=watch) as p:
        yield p, watch


def tree(seed: int, big: int = 20 * MiB) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal(big // 4, dtype=np.float32), "b": np.arange(7, dtype=np.int64) + seed}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def roundtrip(url: str, seed: int = 1, **options: Any) -> None:
    t = tree(seed)
    ckptio.save(t, url, **options)
    assert same(ckptio.load(url, **options), t)


# ---- the credential chain ---------------------------------------------------------------------


def test_instance_metadata(bare_env: dict[str, str], proxied: tuple[FaultProxy, Watch],
                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """IMDSv2: a session token first, then the role's credentials; requests are signed with
    them and carry their session token."""
    proxy, watch = proxied
    issuer = Issuer()
    with Imds(issuer) as imds:
        monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        roundtrip(f"s3://ckpt/{unique_prefix('imds')}/c")
        assert ("PUT", "/latest/api/token") in imds.counts
        assert imds.counts[("GET", "/latest/meta-data/iam/security-credentials/ckptio-role")] == 1
        assert all(s.headers.get("x-aws-ec2-metadata-token") for s in imds.log if s.method == "GET")
    key = issuer.issued[0]
    assert set(watch.keys) == {key.access_key_id} and watch.tokens == {key.session_token}


def test_container_credentials(bare_env: dict[str, str], proxied: tuple[FaultProxy, Watch],
                               tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """EKS Pod Identity / ECS: the full URI and the authorization token file (read each time);
    a wrong token is refused with an error that names the endpoint."""
    proxy, watch = proxied
    issuer = Issuer()
    tok = tmp_path / "token"
    tok.write_text("pod-identity-token\n")
    with ContainerCreds(issuer, token="pod-identity-token") as cc:
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", cc.full_uri)
        monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", str(tok))
        url = f"s3://ckpt/{unique_prefix('container')}/c"
        roundtrip(url, storage_options={"endpoint_url": proxy.endpoint})
        assert set(watch.keys) == {issuer.issued[0].access_key_id}
        cc.token = "another-token"  # the endpoint rotated it; a new client reads the old file
        with pytest.raises(ckptio.CheckpointError) as e:
            ckptio.load(url, storage_options={"endpoint_url": proxy.endpoint, "region": "eu-west-1"})
    msg = str(e.value)
    assert cc.full_uri in msg and "HTTP 401" in msg and "AWS_CONTAINER_AUTHORIZATION_TOKEN" in msg, msg
    assert "pod-identity-token" not in msg  # never printed


def test_web_identity_through_sts(bare_env: dict[str, str], proxied: tuple[FaultProxy, Watch],
                                  moto_server: S3Server, tmp_path: Any,
                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """IRSA: AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN, AssumeRoleWithWebIdentity at STS
    (moto's); the store sees the role's temporary key and its session token."""
    proxy, watch = proxied
    tok = tmp_path / "web-token"
    tok.write_text("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2ln")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(tok))
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/ckptio-irsa")
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", moto_server.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
    roundtrip(f"s3://ckpt/{unique_prefix('irsa')}/c")
    assert len(watch.keys) == 1 and len(watch.tokens) == 1
    (akid,) = watch.keys
    assert akid not in (ACCESS_KEY, "") and akid.startswith("ASIA"), akid


def test_profile_role_and_process(bare_env: dict[str, str], proxied: tuple[FaultProxy, Watch],
                                  moto_server: S3Server, tmp_path: Any) -> None:  # fmt: skip
    """Shared files: a profile that assumes a role with a source profile's keys (AssumeRole,
    signed, at moto's STS), and one whose credential_process prints them; the profile is named
    in storage_options, so the environment's keys are not read."""
    proxy, watch = proxied
    issuer = Issuer()
    proc_key = issuer.issue()
    script = tmp_path / "creds.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"printf '%s' '{{\"Version\": 1, \"AccessKeyId\": \"{proc_key.access_key_id}\", "
        f"\"SecretAccessKey\": \"{proc_key.secret_access_key}\", \"SessionToken\": "
        f"\"{proc_key.session_token}\", \"Expiration\": \"{proc_key.expiration_str}\"}}'\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    with open(bare_env["AWS_CONFIG_FILE"], "w") as f:
        f.write(f"[profile dev]\nrole_arn = arn:aws:iam::123456789012:role/dev\nsource_profile = base\n"
                f"region = {REGION}\n\n[profile proc]\ncredential_process = {script}\n")  # fmt: skip
    with open(bare_env["AWS_SHARED_CREDENTIALS_FILE"], "w") as f:
        f.write("[base]\naws_access_key_id = AKIABASEBASEBASEBASE\naws_secret_access_key = basesecret\n")
    os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = "AKIAENVIRONMENT00000", "x"
    try:
        so = {"endpoint_url": proxy.endpoint, "sts_endpoint_url": moto_server.endpoint, "profile": "dev"}
        roundtrip(f"s3://ckpt/{unique_prefix('profile')}/c", storage_options=so)
        (akid,) = watch.keys
        assert akid.startswith("ASIA") and akid != "AKIABASEBASEBASEBASE", akid
        watch.keys.clear()
        roundtrip(f"s3://ckpt/{unique_prefix('proc')}/c",
                  storage_options={"endpoint_url": proxy.endpoint, "profile": "proc"})  # fmt: skip
        assert set(watch.keys) == {proc_key.access_key_id}
        with pytest.raises(ckptio.CheckpointError, match="profile 'nope'"):
            ckptio.load("s3://ckpt/x/c", storage_options={"endpoint_url": proxy.endpoint, "profile": "nope"})
    finally:
        del os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]


def test_sources_tried_in_order(bare_env: dict[str, str], proxied: tuple[FaultProxy, Watch],
                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """No source: the error names each, in the SDKs' order. A source that is there and fails
    says so, after the ones tried before it."""
    proxy, _ = proxied
    so = {"endpoint_url": proxy.endpoint}
    with pytest.raises(ckptio.CheckpointError) as e:
        ckptio.load("s3://ckpt/none/c", storage_options=so)
    msg = str(e.value)
    at = [msg.find(s) for s in ("environment (", "web identity (", "profile 'default' (", "container (",
                                "instance metadata (AWS_EC2_METADATA_DISABLED=true)")]  # fmt: skip
    assert -1 not in at and at == sorted(at), msg
    issuer = Issuer()
    issuer.fail_next(5, 500)
    with ContainerCreds(issuer, token=None) as cc:
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", cc.full_uri)
        with pytest.raises(ckptio.CheckpointError) as e:
            ckptio.load("s3://ckpt/none/c", storage_options={**so, "region": "ap-south-1"})
    msg = str(e.value)
    assert "container credentials at" in msg and "HTTP 500" in msg and "sources tried before it" in msg, msg


def test_expiring_credentials_refreshed_mid_save(bare_env: dict[str, str], moto_server: S3Server,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Credentials issued for 4 seconds, a save that takes longer (the store stalls some part
    uploads): the client asks the container endpoint again before they expire, and once the
    store calls a key expired (it refuses it after its expiry), so the save commits and loads
    back exactly."""
    issuer = Issuer(lifetime_s=4)
    watch = Watch(issuer)
    with FaultProxy(moto_server.endpoint, gate=watch) as proxy, ContainerCreds(issuer, token=None) as cc:
        proxy.add(Rule("stall", "PUT", "partNumber=", every=2, stall_s=2.0, resume=True))
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", cc.full_uri)
        monkeypatch.setenv("CKPTIO_S3_CONNECTIONS", "2")  # parts one after another, mostly
        url = f"s3://ckpt/{unique_prefix('expiry')}/c"
        t = tree(3, big=96 * MiB)
        t0 = time.monotonic()
        ckptio.save(t, url, storage_options={"endpoint_url": proxy.endpoint})
        took = time.monotonic() - t0
        proxy.rules.clear()
        assert same(ckptio.load(url, storage_options={"endpoint_url": proxy.endpoint}), t)
    assert took > 4.5, f"the save took {took:.1f} s: not past the first credentials' life"
    assert len(issuer.issued) >= 2 and len(watch.keys) >= 2, (issuer.issued, watch.keys)


def test_expired_token_answer_renews(bare_env: dict[str, str], moto_server: S3Server,
                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The store calls the key expired before the client thought (its clock, a revoked
    session): the request is sent again with new credentials, not failed."""
    issuer = Issuer(lifetime_s=3600)
    watch = Watch(issuer)
    with FaultProxy(moto_server.endpoint, gate=watch) as proxy, Imds(issuer) as imds:
        monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url)
        so = {"endpoint_url": proxy.endpoint, "region": "us-west-1"}
        url = f"s3://ckpt/{unique_prefix('revoked')}/c"
        ckptio.save(tree(4), url, storage_options=so)
        issuer.expire()  # every key issued so far
        assert same(ckptio.load(url, storage_options=so), tree(4))
        assert proxy.gated and len(issuer.issued) == 2


# ---- TLS ----------------------------------------------------------------------------------------


def test_tls_with_own_ca(bare_env: dict[str, str], moto_server: S3Server, tmp_path: Any,
                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """HTTPS to a store whose certificate a CA of this test signed: trusted through ca_bundle
    or AWS_CA_BUNDLE; refused at once, with a clear error, without it or with another CA."""
    ca = make_ca(tmp_path, "ca")
    other = make_ca(tmp_path, "other")
    cert, key = server_cert(ca, tmp_path)
    host, port = moto_server.endpoint.removeprefix("http://").split(":")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    with TlsFront(host, int(port), cert, key) as front:
        url = f"s3://ckpt/{unique_prefix('tls')}/c"
        roundtrip(url, storage_options={"endpoint_url": front.url, "ca_bundle": ca[0]})
        monkeypatch.setenv("AWS_CA_BUNDLE", ca[0])
        assert same(ckptio.load(url, storage_options={"endpoint_url": front.url}), tree(1))
        for bundle in (other[0], None):
            if bundle is None:
                monkeypatch.delenv("AWS_CA_BUNDLE")
            so = {"endpoint_url": front.url, **({"ca_bundle": bundle} if bundle else {})}
            t0 = time.monotonic()
            with pytest.raises(ckptio.CheckpointError) as e:
                ckptio.load(url, storage_options=so)
            assert time.monotonic() - t0 < 5, "a certificate that does not verify is not retried"
            msg = str(e.value)
            assert front.url in msg and "does not trust" in msg and "ca_bundle" in msg, msg
        assert front.wait_handshake_failures(2)


# ---- endpoints that never answer ----------------------------------------------------------------


def test_never_answered_fails_fast(bare_env: dict[str, str], moto_server: S3Server,
                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A wrong endpoint (nothing listens there) fails in about CKPTIO_S3_FIRST_TIMEOUT (10 s by
    default), naming it; a store that answered and then went away keeps the full deadline."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    (dead,) = free_ports(1)
    t0 = time.monotonic()
    with pytest.raises(ckptio.CheckpointError) as e:
        ckptio.save(tree(1, big=MiB), "s3://ckpt/dead/c", storage_options={"endpoint_url": f"http://127.0.0.1:{dead}"})
    took = time.monotonic() - t0
    msg = str(e.value)
    assert 5 < took < 15, took
    assert f"http://127.0.0.1:{dead}" in msg and "CKPTIO_S3_FIRST_TIMEOUT" in msg, msg
    # Retries stop once the next (jittered, at most 5 s) wait would pass the deadline: with 8 s,
    # a call that keeps the full deadline gives up after 3 s at the earliest, one held to the
    # first deadline after about 1.
    monkeypatch.setenv("CKPTIO_S3_FIRST_TIMEOUT", "1")
    monkeypatch.setenv("CKPTIO_S3_TIMEOUT", "8")
    with FaultProxy(moto_server.endpoint) as proxy:
        so = {"endpoint_url": proxy.endpoint}
        url = f"s3://ckpt/{unique_prefix('gone')}/c"
        ckptio.save(tree(2, big=MiB), url, storage_options=so)
    t0 = time.monotonic()  # the proxy is closed: connections are refused now
    with pytest.raises(ckptio.CheckpointError) as e:
        ckptio.load(url, storage_options=so)
    took = time.monotonic() - t0
    assert 2.9 < took < 12, took
    assert "CKPTIO_S3_TIMEOUT" in str(e.value), str(e.value)


# ---- settings per store -------------------------------------------------------------------------


def test_two_stores_in_one_process(seaweedfs_server: S3Server, moto_server: S3Server,
                                   bare_env: dict[str, str], tmp_path: Any,
                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """SeaweedFS and moto with their own settings, the environment pointing at neither: a save
    to one, a convert to the other, a Manager saving to one while loading from the other, the
    catalog calls with each one's settings."""
    (dead,) = free_ports(1)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{dead}")  # never used
    sw = {"endpoint_url": seaweedfs_server.endpoint, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}
    mo = {"endpoint_url": moto_server.endpoint, "access_key_id": "other", "secret_access_key": "other"}
    p = unique_prefix("two")
    src, dst = f"s3://ckpt/{p}/src", f"s3://ckpt/{p}/dst"
    t = tree(5)
    ckptio.save(t, src, storage_options=sw)
    summary = convert(src, dst, src_storage_options=sw, dst_storage_options=mo)
    assert "ckptio" in summary
    assert same(ckptio.load(dst, storage_options=mo), t)
    with pytest.raises(ckptio.CheckpointError):  # not in SeaweedFS
        ckptio.load(dst, storage_options=sw)
    with ckptio.open(src, storage_options=sw) as r:
        assert sorted(r.keys()) == ["b", "w"]

    m = ckptio.Manager(f"s3://ckpt/{p}/run", keep=2, async_save=False, storage_options=mo)
    for step in range(3):
        m.save(step, tree(10 + step, big=MiB))
        assert same(ckptio.load(src, storage_options=sw), t)
    assert m.all_steps() == [1, 2]
    assert same(m.restore(), tree(12, big=MiB))
    m.close()
    assert ckptio._core.list_checkpoints(f"s3://ckpt/{p}", ckptio._options.store(mo)) == ["dst"]
    assert ckptio._core.list_checkpoints(f"s3://ckpt/{p}", ckptio._options.store(sw)) == ["src"]


def test_cli_store_options(seaweedfs_server: S3Server, moto_server: S3Server,
                           bare_env: dict[str, str]) -> None:  # fmt: skip
    """The command takes the same settings: `inspect --option`, `verify --option`, and `convert
    --src-option/--dst-option` from one store to another; a wrong one is a usage error."""
    def opts(flag: str, so: dict[str, str]) -> list[str]:
        return [a for k, v in so.items() for a in (flag, f"{k}={v}")]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ckptio", *args], capture_output=True,
                              text=True, timeout=120)  # fmt: skip

    sw = {"endpoint_url": seaweedfs_server.endpoint, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}
    mo = {"endpoint_url": moto_server.endpoint, "access_key_id": "cli", "secret_access_key": "cli"}
    p = unique_prefix("cli")
    src, dst = f"s3://ckpt/{p}/src", f"s3://ckpt/{p}/dst"
    ckptio.save(tree(8, big=MiB), src, storage_options=sw)
    r = run("inspect", *opts("--option", sw), src)
    assert r.returncode == 0 and "w" in r.stdout, r.stderr
    r = run("convert", *opts("--src-option", sw), *opts("--dst-option", mo), src, dst)
    assert r.returncode == 0, r.stderr
    r = run("verify", *opts("--option", mo), dst)
    assert r.returncode == 0, r.stdout + r.stderr
    assert same(ckptio.load(dst, storage_options=mo), tree(8, big=MiB))
    r = run("inspect", "--option", "endpoint=http://127.0.0.1:9", src)
    assert r.returncode == 2 and "endpoint_url" in r.stderr, r.stderr


def test_tiers_persistent_store_settings(moto_server: S3Server, bare_env: dict[str, str],
                                         tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A Manager with a local tier whose persistent tier is an object store named by
    storage_options (the environment pointing nowhere): parts, step records and the job's id
    go there, and with the local tier lost the restore takes them from there."""
    (dead,) = free_ports(1)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{dead}")
    mo = {"endpoint_url": moto_server.endpoint, "access_key_id": "t", "secret_access_key": "t"}
    d = f"s3://ckpt/{unique_prefix('tiers')}/run"
    m = ckptio.Manager(d, local=str(tmp_path / "local"), persist_every=1, node="solo", storage_options=mo)
    for step in range(2):
        m.save(step, tree(20 + step, big=MiB))
    m.close()
    assert m.all_steps() == [0, 1]
    names = ckptio._core.list_checkpoints(d, ckptio._options.store(mo))
    assert {"0.rank0", "1.rank0", "1.record", "ckptio-job"} <= set(names), names
    m = ckptio.Manager(d, local=str(tmp_path / "other"), persist_every=1, node="solo", storage_options=mo)
    assert same(m.restore(), tree(21, big=MiB))
    assert m.last_restore["source"] == "persistent", m.last_restore
    m.close()


def test_environment_read_per_call(moto_server: S3Server, seaweedfs_server: S3Server,
                                   bare_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A script that changes AWS_ENDPOINT_URL between calls talks to the new endpoint (the
    environment is read when a call needs it, not once per process)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    url = f"s3://ckpt/{unique_prefix('env')}/c"
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.endpoint)
    ckptio.save(tree(6, big=MiB), url)
    monkeypatch.setenv("AWS_ENDPOINT_URL", seaweedfs_server.endpoint)
    assert not ckptio._core.is_checkpoint(url)
    ckptio.save(tree(7, big=MiB), url)
    assert same(ckptio.load(url), tree(7, big=MiB))
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.endpoint)
    assert same(ckptio.load(url), tree(6, big=MiB))


def test_missing_data_object_named(moto_server: S3Server, bare_env: dict[str, str]) -> None:
    """A load asks no HEAD of the data objects (the manifest records their lengths): one that
    is gone is still reported as a corrupt checkpoint, naming the object."""
    mo = {"endpoint_url": moto_server.endpoint, "access_key_id": "m", "secret_access_key": "m"}
    p = unique_prefix("missing")
    url = f"s3://ckpt/{p}/c"
    ckptio.save(tree(9, big=MiB), url, storage_options=mo)
    client = moto_server.client()
    (data,) = [k for k in list_keys(client, "ckpt", p) if k.endswith(".ckd")]
    client.delete_object(Bucket="ckpt", Key=data)
    with pytest.raises(ckptio.CheckpointError) as e:
        ckptio.load(url, storage_options=mo)
    assert e.value.name == "CKPTIO_E_CORRUPT" and f"s3://ckpt/{data} is missing" in str(e.value), e.value


def test_bad_settings_named(bare_env: dict[str, str]) -> None:
    with pytest.raises(ckptio.CheckpointError, match="no store setting is named 'endpoint'"):
        ckptio.save({"a": np.zeros(3)}, "s3://ckpt/x/c", storage_options={"endpoint": "http://127.0.0.1:9"})
    with pytest.raises(ckptio.CheckpointError, match="access_key_id and secret_access_key go together"):
        ckptio.load("s3://ckpt/x/c", storage_options={"access_key_id": "a"})


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
