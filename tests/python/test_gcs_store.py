# SPDX-License-Identifier: Apache-2.0
"""gs:// (Google Cloud Storage) through every door that takes a URL, against the local GCS
server (gcsservers.py: fake-gcs-server, reached as an emulator through STORAGE_EMULATOR_HOST or
by the store settings endpoint_url and token): save, load, open and save_async; overwrite and
what a replaced checkpoint leaves; the Manager and its tiers' persistent tier; torch DCP's
StorageWriter/Reader; safetensors and Hugging Face directories in a bucket; four gloo ranks;
`ckptio inspect/verify/convert`, and a convert from an S3 store (moto) to GCS in one process;
tokens from a metadata server stand-in that expire mid-save, refused by a gate as GCS refuses
them (401); HTTPS with a CA of the test's own; no credentials anywhere. Nothing leaves
127.0.0.1. ckptio runs in this process: settings are read per call."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
from credservers import GceMetadata, expiry_gate
from faultproxy import FaultProxy, Rule
from gcsservers import GCSServer, list_names, upload
from s3servers import ACCESS_KEY, SECRET_KEY, S3Server, free_ports, unique_prefix
from tlsfront import TlsFront, make_ca, server_cert

import ckptio
from ckptio._convert import convert

pytest_plugins = ["gcsservers", "s3servers"]

MiB = 1 << 20
CHILD_TIMEOUT = 180


def tree(seed: int, big: int = 20 * MiB) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal(big // 4, dtype=np.float32), "b": np.arange(7, dtype=np.int64) + seed,
            "step": seed}  # fmt: skip


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def objects(srv: GCSServer, prefix: str) -> list[str]:
    """The names under ``prefix/``, relative to it."""
    return [n[len(prefix) + 1 :] for n in list_names(srv, prefix + "/")]


def saves(names: list[str]) -> set[str]:
    return {n.split("/")[0] for n in names if n != "manifest"}


def test_round_trip_open_async_overwrite(gcsserver: GCSServer, gcsprefix: str, gcsenv: dict[str, str]) -> None:
    """A 20 MiB tensor (three parts composed into one object), read back whole and one tensor
    at a time; save_async; an overwrite that replaces the checkpoint and removes its data; no
    part object left anywhere."""
    url = f"gs://{gcsserver.bucket}/{gcsprefix}/a"
    t = tree(1)
    ckptio.save(t, url)
    assert same(ckptio.load(url), t)
    with ckptio.open(url) as r:
        assert sorted(r.keys()) == ["b", "step", "w"]
        assert np.array_equal(np.asarray(r["b"]), t["b"]) and r["step"] == 1
    names = objects(gcsserver, f"{gcsprefix}/a")
    assert "manifest" in names and len(saves(names)) == 1, names
    assert not [n for n in names if ".part-" in n], names
    assert ckptio._core.is_checkpoint(url)

    with pytest.raises(ckptio.CheckpointError, match="already holds a checkpoint"):
        ckptio.save(tree(2), url)
    ckptio.save_async(tree(2), url, overwrite=True).wait()
    assert same(ckptio.load(url), tree(2))
    after = objects(gcsserver, f"{gcsprefix}/a")
    assert len(saves(after)) == 1 and saves(after) != saves(names), after  # the old data went
    assert not [n for n in after if ".part-" in n], after


def test_manifest_answer_lost(gcsserver: GCSServer, gcsprefix: str, gcsenv: dict[str, str]) -> None:
    """The manifest's conditional write commits but its answer is cut off (a reset halfway
    through the body): the retry is refused (the object now exists), and the save must still
    count as committed, its data kept, rather than be reported as overtaken and its data
    deleted under the committed manifest."""
    url = f"gs://{gcsserver.bucket}/{gcsprefix}/lost"
    t = tree(6, big=MiB)
    with FaultProxy(gcsserver.endpoint) as proxy:
        proxy.add(Rule("reset_body", "POST", "uploadType=multipart", count=1))
        so = {"endpoint_url": proxy.endpoint}
        ckptio.save(t, url, storage_options=so)
        assert proxy.rules[0].fired == 1
        assert same(ckptio.load(url, storage_options=so), t)
    names = objects(gcsserver, f"{gcsprefix}/lost")
    assert "manifest" in names and len(saves(names)) == 1, names


def test_missing_and_corrupt(gcsserver: GCSServer, gcsprefix: str, gcsenv: dict[str, str]) -> None:
    """A prefix without a manifest is no checkpoint; a data object that went missing is named."""
    url = f"gs://{gcsserver.bucket}/{gcsprefix}/m"
    assert not ckptio._core.is_checkpoint(url)
    with pytest.raises(ckptio.CheckpointError):
        ckptio.load(url)
    ckptio.save(tree(3, big=MiB), url)
    data = [n for n in objects(gcsserver, f"{gcsprefix}/m") if n != "manifest"]
    from gcsservers import delete

    for n in data:
        assert delete(gcsserver, f"{gcsprefix}/m/{n}")
    with pytest.raises(ckptio.CheckpointError, match=r"gs://.* is missing"):
        ckptio.load(url)


def test_manager_and_tiers(gcsserver: GCSServer, gcsprefix: str, gcsenv: dict[str, str], tmp_path: Any) -> None:
    """Manager(gs://...): retention and restore; with a local tier, parts, step records and the
    job's id go to the bucket, and with the local tier gone the restore takes them from there."""
    d = f"gs://{gcsserver.bucket}/{gcsprefix}/run"
    m = ckptio.Manager(d, keep=2, async_save=False)
    for step in range(4):
        m.save(step, tree(10 + step, big=MiB))
    assert m.all_steps() == [2, 3]
    assert same(m.restore(), tree(13, big=MiB))
    m.close()
    assert sorted(ckptio._core.list_checkpoints(d, None)) == ["2", "3"]

    d2 = f"gs://{gcsserver.bucket}/{gcsprefix}/tiers"
    m = ckptio.Manager(d2, local=str(tmp_path / "local"), persist_every=1, node="solo")
    for step in range(2):
        m.save(step, tree(20 + step, big=MiB))
    m.close()
    names = ckptio._core.list_checkpoints(d2, None)
    assert {"0.rank0", "1.rank0", "1.record", "ckptio-job"} <= set(names), names
    m = ckptio.Manager(d2, local=str(tmp_path / "other"), persist_every=1, node="solo")
    assert same(m.restore(), tree(21, big=MiB))
    assert m.last_restore["source"] == "persistent", m.last_restore
    m.close()


def test_dcp_and_hf_reads(gcsserver: GCSServer, gcsprefix: str, gcsenv: dict[str, str], tmp_path: pathlib.Path) -> None:
    """torch DCP's StorageWriter and StorageReader on gs://; a sharded Hugging Face directory
    and one safetensors file read from the bucket."""
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    import ckptio.torch

    url = f"gs://{gcsserver.bucket}/{gcsprefix}/dcp"
    g = torch.Generator().manual_seed(5)
    sd = {"w": torch.randn(300, 700, generator=g), "b": torch.arange(10), "h": torch.randn(64, generator=g).bfloat16()}
    dcp.save(sd, storage_writer=ckptio.torch.dcp.StorageWriter(url))
    out = {k: torch.zeros_like(v) for k, v in sd.items()}
    dcp.load(out, storage_reader=ckptio.torch.dcp.StorageReader(url))
    assert all(torch.equal(out[k], sd[k]) for k in sd)

    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    shards = {"model-00001-of-00002.safetensors": {"embed": rng.standard_normal((64, 32), np.float32)},
              "model-00002-of-00002.safetensors": {"head": rng.standard_normal((32, 8), np.float32),
                                                   "bias": np.arange(8, dtype=np.int64)}}  # fmt: skip
    index = {"metadata": {}, "weight_map": {n: f for f, ts in shards.items() for n in ts}}
    for f, ts in shards.items():
        save_file(ts, str(tmp_path / f))
        upload(gcsserver, f"{gcsprefix}/hf/{f}", (tmp_path / f).read_bytes())
    import json

    upload(gcsserver, f"{gcsprefix}/hf/model.safetensors.index.json", json.dumps(index).encode())
    base = f"gs://{gcsserver.bucket}/{gcsprefix}/hf"
    got = ckptio.load(base)
    want = {n: t for ts in shards.values() for n, t in ts.items()}
    assert sorted(got) == sorted(want) and all(np.array_equal(np.asarray(got[k]), v) for k, v in want.items())
    assert sorted(ckptio.load(f"{base}/model-00002-of-00002.safetensors")) == ["bias", "head"]


RANK_SAVE = r"""
import os, sys
import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
import ckptio

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
full = torch.arange(512 * 4096, dtype=torch.float32).reshape(512, 4096)
tree = {"w": distribute_tensor(full, mesh, [Shard(0)]),
        "b": distribute_tensor(torch.arange(7, dtype=torch.float64), mesh, [Replicate()]), "step": 5}
ckptio.save(tree, sys.argv[1])
# and a collective load, resharded onto this world: every rank gets its rows
got = ckptio.load(sys.argv[1], comm=dist.group.WORLD, like={"w": distribute_tensor(torch.zeros(512, 4096), mesh, [Shard(0)]),
                                      "b": torch.zeros(7, dtype=torch.float64), "step": 0})
local = got["w"].to_local()
assert torch.equal(local, full.chunk(dist.get_world_size())[dist.get_rank()]), "rows differ"
assert got["step"] == 5
dist.destroy_process_group()
print("RANK-OK", flush=True)
"""


def test_four_gloo_ranks(gcsserver: GCSServer, gcsprefix: str, gcsenv: dict[str, str]) -> None:
    """Four torch.distributed (gloo) ranks save a Shard(0) DTensor to gs://, each uploading its
    own data objects, rank 0 committing; they load it back resharded; this process loads it
    whole."""
    pytest.importorskip("torch")
    url = f"gs://{gcsserver.bucket}/{gcsprefix}/ranks"
    port = free_ports(1)[0]
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="4",
                GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")  # fmt: skip
    ps = [subprocess.Popen([sys.executable, "-c", RANK_SAVE, url], env={**base, "RANK": str(r)},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(4)]  # fmt: skip
    outs = []
    try:
        for p in ps:
            outs.append(p.communicate(timeout=CHILD_TIMEOUT)[0])
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=30)
    for p, out in zip(ps, outs, strict=True):
        assert p.returncode == 0 and "RANK-OK" in out, out[-3000:]
    names = objects(gcsserver, f"{gcsprefix}/ranks")
    assert len([n for n in names if n != "manifest"]) >= 4 and len(saves(names)) == 1, names
    assert not [n for n in names if ".part-" in n], names
    t = ckptio.load(url)
    assert np.array_equal(np.asarray(t["w"]).reshape(-1), np.arange(512 * 4096, dtype=np.float32))
    assert t["step"] == 5


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptio", *args], capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT, env=env)  # fmt: skip


def test_settings_convert_from_s3_and_cli(gcsserver: GCSServer, moto_server: S3Server,
                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The environment names no store: GCS is reached by the settings endpoint_url and token,
    moto by its own; a convert from S3 to GCS in one process, and the command's inspect, verify
    and convert with --option, --src-option and --dst-option."""
    (dead,) = free_ports(1)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"127.0.0.1:{dead}")  # never used
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{dead}")
    gs = {"endpoint_url": gcsserver.endpoint, "token": "ya29.test"}
    mo = {"endpoint_url": moto_server.endpoint, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}
    p = unique_prefix("gcs-conv")
    src, dst = f"s3://{moto_server.bucket}/{p}/src", f"gs://{gcsserver.bucket}/{p}/dst"
    t = tree(5, big=9 * MiB)
    ckptio.save(t, src, storage_options=mo)
    convert(src, dst, src_storage_options=mo, dst_storage_options=gs)
    assert same(ckptio.load(dst, storage_options=gs), t)
    with pytest.raises(ckptio.CheckpointError, match="cannot reach"):  # the environment's dead port
        ckptio.load(dst)

    def opts(flag: str, so: dict[str, str]) -> list[str]:
        return [a for k, v in so.items() for a in (flag, f"{k}={v}")]

    r = run_cli("inspect", *opts("--option", gs), dst)
    assert r.returncode == 0 and "w" in r.stdout, r.stderr
    back = f"gs://{gcsserver.bucket}/{p}/again"
    r = run_cli("convert", *opts("--src-option", gs), *opts("--dst-option", gs), dst, back, "--compress=all")
    assert r.returncode == 0, r.stderr
    r = run_cli("verify", *opts("--option", gs), back)
    assert r.returncode == 0, r.stdout + r.stderr
    assert same(ckptio.load(back, storage_options=gs), t)


# ---- credentials and TLS --------------------------------------------------------------------------

# What steers Google's credential chain: each test below starts from none of it.
GOOGLE_VARS = ("GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG", "STORAGE_EMULATOR_HOST", "GCE_METADATA_HOST",
               "GCE_METADATA_IP", "NO_GCE_CHECK", "CKPTIO_GCS_TIMEOUT", "CKPTIO_GCS_FIRST_TIMEOUT")  # fmt: skip


@pytest.fixture
def no_google(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in GOOGLE_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no gcloud file
    monkeypatch.setenv("NO_GCE_CHECK", "true")


def test_token_expiring_mid_save(gcsserver: GCSServer, gcsprefix: str, no_google: None,
                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Tokens from the metadata server (GKE workload identity's path) that live 4 seconds, a save
    that takes longer (the store stalls some part uploads), a gate that answers an expired token
    401 as GCS does: the client asks for a new token before the old one expires, and again
    when the store refuses one, so the save commits and loads back exactly."""
    meta = GceMetadata(token_lifetime_s=4)
    with meta, FaultProxy(gcsserver.endpoint, gate=expiry_gate(meta)) as proxy:
        proxy.add(Rule("stall", "POST", "uploadType=media", every=2, stall_s=2.0, resume=True))
        monkeypatch.delenv("NO_GCE_CHECK")
        monkeypatch.setenv("GCE_METADATA_HOST", meta.url.removeprefix("http://"))
        monkeypatch.setenv("CKPTIO_GCS_CONNECTIONS", "2")  # parts one after another, mostly
        so = {"endpoint_url": proxy.endpoint}
        url = f"gs://{gcsserver.bucket}/{gcsprefix}/expiry"
        t = tree(3, big=96 * MiB)
        t0 = time.monotonic()
        ckptio.save(t, url, storage_options=so)
        took = time.monotonic() - t0
        proxy.rules.clear()
        meta.expire(None)  # every token so far: the store refuses them, the client renews
        assert same(ckptio.load(url, storage_options=so), t)
    assert took > 4.5, f"the save took {took:.1f} s: not past the first token's life"
    assert len(meta.issued) >= 3, meta.issued


def test_tls_with_own_ca(gcsserver: GCSServer, gcsprefix: str, no_google: None, tmp_path: Any) -> None:
    """HTTPS to a GCS endpoint whose certificate a CA of this test signed: trusted through the
    ca_bundle setting; refused at once, with a clear error, without it or with another CA."""
    ca, other = make_ca(tmp_path, "ca"), make_ca(tmp_path, "other")
    cert, key = server_cert(ca, tmp_path)
    host, port = gcsserver.endpoint.removeprefix("http://").split(":")
    with TlsFront(host, int(port), cert, key) as front:
        url = f"gs://{gcsserver.bucket}/{gcsprefix}/tls"
        so = {"endpoint_url": front.url, "token": "ya29.tls", "ca_bundle": ca[0]}
        ckptio.save(tree(1, big=MiB), url, storage_options=so)
        assert same(ckptio.load(url, storage_options=so), tree(1, big=MiB))
        for bundle in (other[0], None):
            bad = {"endpoint_url": front.url, "token": "ya29.tls", **({"ca_bundle": bundle} if bundle else {})}
            t0 = time.monotonic()
            with pytest.raises(ckptio.CheckpointError) as e:
                ckptio.load(url, storage_options=bad)
            assert time.monotonic() - t0 < 5, "a certificate that does not verify is not retried"
            msg = str(e.value)
            assert front.url in msg and "does not trust" in msg and "ca_bundle" in msg, msg


def test_no_credentials_names_sources(gcsserver: GCSServer, no_google: None) -> None:
    """No token anywhere (no file, no gcloud file, no metadata server): the save fails at once,
    naming each source tried, in order, and nothing is written."""
    url = f"gs://{gcsserver.bucket}/{unique_prefix('nocreds')}/c"
    with pytest.raises(ckptio.CheckpointError) as e:
        ckptio.save(tree(1, big=MiB), url, storage_options={"endpoint_url": gcsserver.endpoint})
    msg = str(e.value)
    assert "GOOGLE_APPLICATION_CREDENTIALS" in msg and "metadata server" in msg, msg
    assert msg.index("GOOGLE_APPLICATION_CREDENTIALS") < msg.index("metadata server"), msg
