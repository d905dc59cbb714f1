# SPDX-License-Identifier: Apache-2.0
"""Checkpoints in object storage (s3://bucket/key) on real local servers, SeaweedFS and moto: round trips, atomic overwrite, a writer killed mid-upload, racing writers, corruption, injected faults, dead servers, bad credentials and missing buckets, and the ckptio command."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from faultproxy import FaultProxy, Rule, stall_forever
from s3servers import S3Server, list_keys, open_uploads, start, unique_prefix

pytest_plugins = ["s3servers"]

# Every ckptio call on S3 runs in a child process: the library reads its AWS_* settings once
# per process, and each test points it at its own server or proxy. Children are bounded.
CHILD_TIMEOUT = 180
MiB = 1 << 20

PRELUDE = r"""
import json, os, sys, time
import numpy as np
import ml_dtypes
import ckptio

def pattern(n, seed, dtype=np.float32):
    # n elements of dtype whose bytes differ everywhere and depend on seed (fast for 200 MiB).
    width = np.dtype(dtype).itemsize
    words = (np.arange((n * width + 3) // 4, dtype=np.uint32) * np.uint32(2654435761)) ^ np.uint32(seed * 40503 + 1)
    return words.view(np.uint8)[: n * width].view(dtype)

def tree(seed, big=40 << 20):
    # Several dtypes, a 0-d array, plain values and one big float32 tensor (multipart).
    t = {"big": pattern(big // 4, seed),
         "layer": {"f16": pattern(3000, seed, np.float16).reshape(30, 100),
                   "bf16": pattern(4096, seed + 1, ml_dtypes.bfloat16).reshape(64, 64),
                   "i64": pattern(777, seed, np.int64), "i8": pattern(1000, seed, np.int8),
                   "u8": pattern(5, seed, np.uint8), "flag": pattern(9, seed, np.uint8) > 128,
                   "zero_d": np.array(seed, dtype=np.int32)},
         "step": seed, "lr": 0.5, "name": f"run-{seed}"}
    if big == 0:
        del t["big"]
    return t

def flat(t, prefix=""):
    out = {}
    for k, v in t.items():
        if isinstance(v, dict):
            out.update(flat(v, prefix + k + "."))
        else:
            out[prefix + k] = v
    return out

def same(got, want):
    # Which leaves differ (dtype, shape or bytes), as a list of names.
    g, w = flat(got), flat(want)
    bad = sorted(set(g) ^ set(w))
    for k in set(g) & set(w):
        a, b = g[k], w[k]
        if isinstance(b, np.ndarray):
            a = np.asarray(a)
            if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
                bad.append(k)
        elif a != b:
            bad.append(k)
    return bad

def report(**kw):
    print("RESULT " + json.dumps(kw), flush=True)

def attempt(fn):
    t0 = time.monotonic()
    try:
        extra = fn()
    except BaseException as e:
        report(ok=False, type=type(e).__name__, mro=[c.__name__ for c in type(e).__mro__], msg=str(e),
               tensor=getattr(e, "tensor", None), file=getattr(e, "file", None),
               offset=getattr(e, "offset", None), elapsed=time.monotonic() - t0)
        return
    report(ok=True, elapsed=time.monotonic() - t0, **(extra if isinstance(extra, dict) else {}))

def check(url, seed, big=40 << 20, **kw):
    bad = same(ckptio.load(url, **kw), tree(seed, big))
    if bad:
        raise AssertionError(f"loaded leaves differ: {bad}")
"""


def child_env(env: dict[str, str], **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CKPTIO_S3_"))}
    return {**base, **env, **extra}


def py(code: str, env: dict[str, str], timeout: float = CHILD_TIMEOUT, cwd: str | None = None) -> dict[str, Any]:
    """Run PRELUDE + ``code`` in a fresh Python with ``env``; the dict of its last RESULT line."""
    try:
        r = subprocess.run([sys.executable, "-c", PRELUDE + code], env=child_env(env), cwd=cwd,
                           capture_output=True, text=True, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"child did not finish within {timeout} s (a hang):\n{e.stdout!r}\n{e.stderr!r}") from e
    return _result(r.stdout, r.stderr, r.returncode)


def py_all(children: list[tuple[list[str], dict[str, str]]], code: str, before_wait: Any = None) -> list[dict[str, Any]]:
    """Run PRELUDE + ``code`` in one child per (argv, env) at once; ``before_wait()`` (if given)
    runs once they are all started; their results, in order. Every child is bounded."""
    ps = [subprocess.Popen([sys.executable, "-c", PRELUDE + code, *argv], env=child_env(env),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for argv, env in children]  # fmt: skip
    try:
        if before_wait is not None:
            before_wait()
        outs = [p.communicate(timeout=CHILD_TIMEOUT) for p in ps]
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=30)
    return [_result(o, e, p.returncode) for (o, e), p in zip(outs, ps, strict=True)]


def _result(out: str, err: str, rc: int | None) -> dict[str, Any]:
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise AssertionError(f"child exited {rc} without a result:\nstdout: {out[-3000:]}\nstderr: {err[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])  # type: ignore[no-any-return]


def ok(r: dict[str, Any]) -> dict[str, Any]:
    assert r["ok"], f"{r.get('type')}: {r.get('msg')}"
    return r


def save(url: str, env: dict[str, str], seed: int, big: int = 40 * MiB, overwrite: bool = False,
         timeout: float = CHILD_TIMEOUT) -> dict[str, Any]:  # fmt: skip
    return py(f"attempt(lambda: ckptio.save(tree({seed}, {big}), {url!r}, overwrite={overwrite}))", env, timeout)


def load(url: str, env: dict[str, str], seed: int, big: int = 40 * MiB, timeout: float = CHILD_TIMEOUT) -> dict[str, Any]:
    return py(f"attempt(lambda: check({url!r}, {seed}, {big}))", env, timeout)


def cli(env: dict[str, str], *args: str, timeout: float = CHILD_TIMEOUT) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-m", "ckptio", *args], env=child_env(env), capture_output=True,
                              text=True, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"ckptio {' '.join(args)} did not finish within {timeout} s") from e


def is_error(r: dict[str, Any]) -> bool:
    """A failure ckptio reports as it should: a CheckpointError or an OSError subclass."""
    return not r["ok"] and ("CheckpointError" in r["mro"] or "OSError" in r["mro"])


def data_keys(keys: list[str], prefix: str) -> list[str]:
    return [k for k in keys if k != prefix + "/manifest"]


def save_ids(keys: list[str], prefix: str) -> set[str]:
    """The distinct d-<save id> folders under the checkpoint ``prefix``."""
    return {k[len(prefix) + 1 :].split("/")[0] for k in data_keys(keys, prefix)}


def assert_clean(srv: S3Server, key: str) -> None:
    """Exactly one save's objects under ``key``: its manifest and one d-<id>/ folder, and no
    multipart upload left open."""
    c = srv.client()
    keys = list_keys(c, srv.bucket, key + "/")
    assert key + "/manifest" in keys, keys
    ids = save_ids(keys, key)
    assert len(ids) == 1 and all(i.startswith("d-") for i in ids), f"objects of more than one save: {keys}"
    assert open_uploads(c, srv.bucket, key + "/") == []


# ------------------------------------------------------------------------------------------------
# Skip the module only while ckptio cannot save to s3:// at all
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _s3_supported(moto_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A tiny save to s3:// in a child, in an empty directory: skip the module while ckptio
    refuses s3:// as unsupported, or takes it for a local directory (it then writes "s3:/...")."""
    key = unique_prefix("probe")
    cwd = tmp_path_factory.mktemp("s3probe")
    url = moto_server.url(key)
    r = py(f"attempt(lambda: ckptio.save({{'a': np.arange(3)}}, {url!r}))", moto_server.env, cwd=str(cwd))
    committed = key + "/manifest" in list_keys(moto_server.client(), moto_server.bucket, key + "/")
    if r["ok"] and not committed:
        pytest.skip(f"ckptio does not save to s3:// yet: ckptio.save({url!r}) wrote no object "
                    f"(local entries: {sorted(os.listdir(cwd))})")  # fmt: skip
    text = f"{r.get('type')} {r.get('msg')}".lower()
    if not r["ok"] and any(w in text for w in ("unsupported", "not supported", "not yet", "not implemented")):
        pytest.skip(f"ckptio does not save to s3:// yet: {r['type']}: {r['msg']}")


@pytest.fixture
def key(s3prefix: str) -> str:
    return s3prefix + "/step-1"


@pytest.fixture
def proxy(s3server: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(s3server.endpoint) as p:
        yield p


# ------------------------------------------------------------------------------------------------
# Round trips
# ------------------------------------------------------------------------------------------------


def test_round_trip_multipart(s3server: S3Server, proxy: FaultProxy, key: str) -> None:
    """Several dtypes and a 40 MiB tensor (multipart, parts of >= 8 MiB), through a
    pass-through proxy that counts the requests."""
    env = proxy.env(s3server.env)
    url = s3server.url(key)
    ok(save(url, env, seed=1))
    uploads, parts = proxy.counts["POST create"], proxy.sizes.get("PUT part", [])
    assert uploads >= 1 and len(parts) >= 2, proxy.counts
    assert proxy.counts["POST complete"] >= 1
    # Parts of at least 8 MiB, but for the last of each upload.
    assert len([n for n in parts if n < 8 * MiB]) <= uploads, sorted(parts)
    ok(load(url, env, seed=1))
    assert proxy.counts["GET range"] + proxy.counts["GET object"] >= 2
    assert_clean(s3server, key)
    stored = sum(o["Size"] for o in s3server.client().list_objects_v2(Bucket=s3server.bucket, Prefix=key + "/")["Contents"])
    assert stored >= 40 * MiB  # the big tensor's bytes are really in the bucket


def test_open_and_read_one_tensor(s3server: S3Server, key: str) -> None:
    url = s3server.url(key)
    ok(save(url, s3server.env, seed=2, big=8 * MiB))
    code = f"""
def run():
    with ckptio.open({url!r}) as r:
        keys = sorted(r.keys())
        want = tree(2, {8 * MiB})
        assert np.asarray(r["layer.i64"]).tobytes() == want["layer"]["i64"].tobytes()
        assert r["step"] == 2 and r["name"] == "run-2"
        return {{"keys": keys}}
attempt(run)
"""
    r = ok(py(code, s3server.env))
    assert "big" in r["keys"] and "layer.bf16" in r["keys"]


def test_save_async(s3server: S3Server, key: str) -> None:
    url = s3server.url(key)
    ok(py(f"attempt(lambda: ckptio.save_async(tree(3, {16 * MiB}), {url!r}).wait())", s3server.env))
    ok(load(url, s3server.env, seed=3, big=16 * MiB))
    assert_clean(s3server, key)


def test_manager_retention(s3server: S3Server, s3prefix: str) -> None:
    url = s3server.url(s3prefix)
    code = f"""
def run():
    m = ckptio.Manager({url!r}, keep=2, async_save=False)
    for step in (1, 2, 3, 4):
        m.save(step, tree(step, {MiB}))
    steps = m.all_steps()
    bad = same(m.restore(), tree(4, {MiB}))
    m.close()
    assert not bad, bad
    return {{"steps": steps}}
attempt(run)
"""
    r = ok(py(code, s3server.env))
    assert r["steps"] == [3, 4]
    keys = list_keys(s3server.client(), s3server.bucket, s3prefix + "/")
    assert not [k for k in keys if k.startswith((f"{s3prefix}/1/", f"{s3prefix}/2/"))], keys
    assert f"{s3prefix}/4/manifest" in keys


def test_manager_tiers_persist_to_the_store(s3server: S3Server, s3prefix: str,
                                            tmp_path: Any) -> None:
    """Manager(url, local=...): each save is copied to the store as <step>.rank<R> (through
    the convert engine) in the background; with the local tier gone, restore takes the part
    from the store, exactly; retention removes old parts whole."""
    url = s3server.url(s3prefix)
    local = str(tmp_path / "local")
    code = f"""
import shutil
def run():
    m = ckptio.Manager({url!r}, keep=1, local={local!r}, persist_every=1, local_keep=1)
    for step in (1, 2, 3, 4):
        m.save(step, tree(step, {MiB}))
    m.wait_until_finished()
    errors, steps = m.last_save["errors"], m.all_steps()
    shutil.rmtree({local!r})
    got = m.restore()
    where = (m.last_restore["source"], m.last_restore["path"])
    m.close()
    bad = same(got, tree(4, {MiB}))
    assert not bad, bad
    return {{"errors": errors, "steps": steps, "where": where}}
attempt(run)
"""
    r = ok(py(code, s3server.env))
    assert r["errors"] == [], r
    assert r["where"] == ["persistent", f"{url}/4.rank0"], r
    assert r["steps"] == [3, 4], r  # keep=1 counts complete steps before the one being written
    keys = list_keys(s3server.client(), s3server.bucket, s3prefix + "/")
    assert f"{s3prefix}/4.rank0/manifest" in keys
    # the step's record beside its part, and the job's id; old steps' records go with them
    assert f"{s3prefix}/4.record/manifest" in keys and f"{s3prefix}/ckptio-job/manifest" in keys
    assert not [k for k in keys if k.startswith((f"{s3prefix}/1.rank0/", f"{s3prefix}/2.rank0/",
                                                 f"{s3prefix}/1.record/", f"{s3prefix}/2.record/"))]


RANK_SAVE = r"""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
full = torch.arange(1024 * 4096, dtype=torch.float32).reshape(1024, 4096)
tree = {"w": distribute_tensor(full, mesh, [Shard(0)]),
        "b": distribute_tensor(torch.arange(7, dtype=torch.float64), mesh, [Replicate()]), "step": 5}
attempt(lambda: ckptio.save(tree, URL))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("spread", ["0", "1"])
def test_four_gloo_ranks(s3server: S3Server, key: str, spread: str) -> None:
    """Four torch.distributed (gloo) ranks save a Shard(0) DTensor and a replicated one: each
    rank uploads its own data objects, rank 0 commits; one plain process loads it whole. With
    CKPTIO_PREFIX_SPREAD=1 the ranks' objects lie under the parent's .ckptio-<h>/ prefixes,
    found by the load with no setting."""
    from s3servers import free_ports

    pytest.importorskip("torch")
    url = s3server.url(key)
    port = free_ports(1)[0]
    ranks: list[tuple[list[str], dict[str, str]]] = [([], {**s3server.env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r),
                   "WORLD_SIZE": "4", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
                   "CKPTIO_PREFIX_SPREAD": spread}) for r in range(4)]  # fmt: skip
    for r in py_all(ranks, RANK_SAVE.replace("URL", repr(url))):
        ok(r)
    c = s3server.client()
    keys = list_keys(c, s3server.bucket, key + "/")
    parent, name = key.rsplit("/", 1)
    spread_keys = [k for k in list_keys(c, s3server.bucket, parent + "/.ckptio-") if k.split("/")[-3] == name]
    if spread == "0":
        assert len(data_keys(keys, key)) >= 4 and not spread_keys, keys
    else:
        assert len(data_keys(keys, key)) == 1 and data_keys(keys, key)[0].endswith("-x1/spread"), keys
        assert len(spread_keys) >= 4 and len({k.split("/")[-4] for k in spread_keys}) >= 2, spread_keys
        assert open_uploads(c, s3server.bucket, parent + "/.ckptio-") == []
    assert_clean(s3server, key)
    check = f"""
def run():
    t = ckptio.load({url!r})
    w = np.asarray(t["w"])
    assert w.shape == (1024, 4096) and np.array_equal(w.reshape(-1), np.arange(1024 * 4096, dtype=np.float32))
    assert np.asarray(t["b"]).tolist() == list(range(7)) and t["step"] == 5
attempt(run)
"""
    ok(py(check, s3server.env))


def test_cli_inspect_and_verify(s3server: S3Server, key: str) -> None:
    url = s3server.url(key)
    ok(save(url, s3server.env, seed=4, big=8 * MiB))
    r = cli(s3server.env, "inspect", url)
    assert r.returncode == 0, r.stderr
    assert "big" in r.stdout and "layer.bf16" in r.stdout
    r = cli(s3server.env, "verify", url)
    assert r.returncode == 0, r.stdout + r.stderr


# ------------------------------------------------------------------------------------------------
# Commit: nothing half-visible, overwrite, a killed writer, racing writers
# ------------------------------------------------------------------------------------------------


def test_prefix_without_manifest_is_not_a_checkpoint(s3server: S3Server, key: str) -> None:
    c = s3server.client()
    c.put_object(Bucket=s3server.bucket, Key=key + "/d-0123456789abcdef/000000.ckd", Body=os.urandom(8192))
    r = load(s3server.url(key), s3server.env, seed=0)
    assert is_error(r), r
    assert key in r["msg"], r["msg"]
    assert cli(s3server.env, "verify", s3server.url(key)).returncode != 0


def test_overwrite_refused_then_atomic(s3server: S3Server, key: str) -> None:
    url = s3server.url(key)
    ok(save(url, s3server.env, seed=5, big=16 * MiB))
    first = list_keys(s3server.client(), s3server.bucket, key + "/")
    r = save(url, s3server.env, seed=6, big=16 * MiB)
    assert not r["ok"] and "CheckpointExists" in r["mro"], r
    ok(load(url, s3server.env, seed=5, big=16 * MiB))
    ok(save(url, s3server.env, seed=6, big=16 * MiB, overwrite=True))
    ok(load(url, s3server.env, seed=6, big=16 * MiB))
    assert_clean(s3server, key)
    now = list_keys(s3server.client(), s3server.bucket, key + "/")
    assert not set(data_keys(first, key)) & set(now), "the replaced checkpoint's objects are gone"


def test_writer_killed_mid_upload(s3server: S3Server, proxy: FaultProxy, key: str) -> None:
    """A child saving ~200 MiB (overwrite=True) through a proxy that stalls part uploads after
    the first two is SIGKILLed mid-upload: the previous checkpoint still loads, and the next
    save removes what the dead one left."""
    url = s3server.url(key)
    ok(save(url, s3server.env, seed=7, big=MiB))
    proxy.add(Rule("stall", "PUT", "partNumber=", skip=2, stall_s=120))
    code = f"attempt(lambda: ckptio.save(tree(8, {200 * MiB}), {url!r}, overwrite=True))"
    p = subprocess.Popen([sys.executable, "-c", PRELUDE + code], env=child_env(proxy.env(s3server.env)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while sum(proxy.injected.values()) < 1 and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p.poll() is None, f"the writer ended before it was killed: {p.communicate()}"
        assert proxy.counts["PUT part"] >= 3, proxy.counts
        os.kill(p.pid, signal.SIGKILL)
        p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=30)
        proxy.clear()
    keys = list_keys(s3server.client(), s3server.bucket, key + "/")
    assert len(save_ids(keys, key)) >= 1
    ok(load(url, s3server.env, seed=7, big=MiB))  # the old checkpoint, whole
    ok(save(url, s3server.env, seed=9, big=MiB, overwrite=True))
    # The dead save's objects and open uploads are gone. A part upload the killed client had in
    # flight may still land on the server after the sweep aborted its upload (S3 documents
    # this: such an upload may need aborting again); then it is of a dead save, and the next
    # save's sweep removes it.
    if open_uploads(s3server.client(), s3server.bucket, key + "/"):
        ok(save(url, s3server.env, seed=9, big=MiB, overwrite=True))
    assert_clean(s3server, key)
    ok(load(url, s3server.env, seed=9, big=MiB))


def test_racing_writers_one_wins(s3server: S3Server, key: str, tmp_path: Any) -> None:
    url = s3server.url(key)
    go = tmp_path / "go"
    code = """
seed = int(sys.argv[1])
t = tree(seed, 32 << 20)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.005)
attempt(lambda: ckptio.save(t, {url!r}))
""".replace("{url!r}", repr(url))

    def start_both() -> None:
        time.sleep(3)  # both have built their trees
        go.touch()

    rs = py_all([([str(seed), str(go)], s3server.env) for seed in (10, 11)], code, start_both)
    winners = [seed for seed, r in zip((10, 11), rs, strict=True) if r["ok"]]
    assert len(winners) == 1, rs
    loser = rs[1 - (10, 11).index(winners[0])]
    assert "CheckpointExists" in loser["mro"], loser
    ok(load(url, s3server.env, seed=winners[0], big=32 * MiB))
    assert open_uploads(s3server.client(), s3server.bucket, key + "/") == []


def test_overtaken_save_says_another_save_won(s3server: S3Server, key: str) -> None:
    """A save overtaken by one begun 2 s after it (which commits first, and sweeps the older
    save's upload: that save can no longer commit) fails with CheckpointExists at its next write
    or its commit, at once: whatever the store answers for the vanished upload (404
    NoSuchUpload, or moto's 500 on completing it, which is not retried until the timeout)."""
    url = s3server.url(key)
    code = """
f32 = ckptio._core.dtypes()["f32"][0]
w = ckptio._core.Writer(URL)  # begins: its first data object's upload is open
time.sleep(2.5)  # the next save begins 2 whole seconds of the store's clock later
ckptio.save(tree(5, MiB), URL)
big = pattern(4 << 20, 3)
def finish():
    w.add("big", f32, big.shape, big)
    w.commit()
attempt(finish)
""".replace("URL", repr(url)).replace("MiB", str(MiB))
    r = py(code, {**s3server.env, "CKPTIO_S3_TIMEOUT": "100"})
    assert not r["ok"] and "CheckpointExists" in r["mro"], r
    assert "committed by another save" in r["msg"] and "gave up" not in r["msg"], r
    ok(load(url, s3server.env, seed=5, big=MiB))
    assert_clean(s3server, key)


# ------------------------------------------------------------------------------------------------
# Integrity
# ------------------------------------------------------------------------------------------------


def test_corrupted_object_is_detected(s3server: S3Server, key: str) -> None:
    url = s3server.url(key)
    code = f"attempt(lambda: ckptio.save({{'weights': pattern({4 * MiB}, 12)}}, {url!r}))"
    ok(py(code, s3server.env))
    c = s3server.client()
    data = [k for k in data_keys(list_keys(c, s3server.bucket, key + "/"), key)]
    obj = max(data, key=lambda k: c.head_object(Bucket=s3server.bucket, Key=k)["ContentLength"])
    body = bytearray(c.get_object(Bucket=s3server.bucket, Key=obj)["Body"].read())
    mid = len(body) // 2
    body[mid : mid + 16] = bytes(b ^ 0xFF for b in body[mid : mid + 16])
    c.put_object(Bucket=s3server.bucket, Key=obj, Body=bytes(body))
    r = py(f"attempt(lambda: ckptio.load({url!r}))", s3server.env)
    assert not r["ok"] and ("ChecksumMismatch" in r["mro"] or "CorruptCheckpoint" in r["mro"]), r
    assert "weights" in r["msg"], r["msg"]
    assert obj.rsplit("/", 1)[-1] in r["msg"], f"the object is named: {r['msg']}"
    v = cli(s3server.env, "verify", url)
    assert v.returncode != 0 and "weights" in v.stdout + v.stderr


# ------------------------------------------------------------------------------------------------
# Faults: retries, timeouts, dead servers
# ------------------------------------------------------------------------------------------------

# Short deadlines so that a missing retry or a hang fails the test quickly.
FAST = {"CKPTIO_S3_TIMEOUT": "60", "CKPTIO_S3_STALL": "2"}


@pytest.mark.parametrize("fault", ["503", "500", "reset", "stall"])
def test_save_retries_through_faults(s3server: S3Server, proxy: FaultProxy, key: str, fault: str) -> None:
    """Every third PUT (parts and the manifest) fails: the save succeeds through retries."""
    proxy.add(Rule(fault, "PUT", every=3, stall_s=30))
    url = s3server.url(key)
    ok(save(url, {**proxy.env(s3server.env), **FAST}, seed=13, big=40 * MiB))
    hit = sum(proxy.injected.values())
    puts = proxy.total("PUT")
    assert hit >= 1 and puts > hit, (proxy.counts, proxy.injected)
    proxy.clear()
    ok(load(url, s3server.env, seed=13))
    assert_clean(s3server, key)


@pytest.mark.parametrize("fault", ["503", "500", "reset", "reset_body", "stall", "stall_body"])
def test_load_retries_through_faults(s3server: S3Server, proxy: FaultProxy, key: str, fault: str) -> None:
    url = s3server.url(key)
    ok(save(url, s3server.env, seed=14, big=24 * MiB))
    proxy.add(Rule(fault, "GET", every=2, stall_s=30))
    ok(load(url, {**proxy.env(s3server.env), **FAST}, seed=14, big=24 * MiB))
    hit = sum(proxy.injected.values())
    assert hit >= 1 and proxy.total("GET") > hit, (proxy.counts, proxy.injected)


def test_dead_server_fails_within_timeout(s3server: S3Server, key: str) -> None:
    """A server that accepts connections and never answers: with CKPTIO_S3_TIMEOUT=5 the save
    and the load fail within ~15 s, never hang."""
    url = s3server.url(key)
    ok(save(url, s3server.env, seed=15, big=MiB))
    with FaultProxy(s3server.endpoint) as dead:
        dead.add(stall_forever())
        env = {**dead.env(s3server.env), "CKPTIO_S3_TIMEOUT": "5", "CKPTIO_S3_STALL": "2"}
        for r in (save(s3server.url(key + "-new"), env, seed=16, big=MiB, timeout=60),
                  load(url, env, seed=15, big=MiB, timeout=60)):  # fmt: skip
            assert is_error(r), r
            assert r["elapsed"] < 15, r
            assert dead.total() >= 1


@pytest.mark.parametrize("kind", ["seaweedfs", "moto"])
def test_server_killed_during_load(kind: str, s3prefix: str) -> None:
    srv = start(kind)
    try:
        url = srv.url(s3prefix + "/ck")
        ok(save(url, srv.env, seed=17, big=64 * MiB))
        with FaultProxy(srv.endpoint) as p:
            # The manifest passes; every data read then waits, so the load is surely under way.
            p.add(Rule("stall", "GET", skip=1, stall_s=math.inf))
            env = {**p.env(srv.env), "CKPTIO_S3_TIMEOUT": "5", "CKPTIO_S3_STALL": "2"}
            code = f"attempt(lambda: check({url!r}, 17, {64 * MiB}))"
            child = subprocess.Popen([sys.executable, "-c", PRELUDE + code], env=child_env(env),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
            try:
                deadline = time.monotonic() + 60
                while sum(p.injected.values()) < 1 and child.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                srv.kill()
                p.clear()  # the stalled reads go on, to a server that is gone
                out, err = child.communicate(timeout=60)
            finally:
                if child.poll() is None:
                    child.kill()
                    child.communicate(timeout=30)
        r = _result(out, err, child.returncode)
        assert is_error(r), r
        assert r["elapsed"] < 30, r
    finally:
        srv.stop()


# ------------------------------------------------------------------------------------------------
# Errors that tell the user what to do
# ------------------------------------------------------------------------------------------------


def test_bad_credentials(s3server: S3Server, key: str) -> None:
    if s3server.kind == "moto":
        pytest.skip("moto's server accepts any credentials")
    url = s3server.url(key)
    ok(save(url, s3server.env, seed=18, big=MiB))
    bad = {**s3server.env, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    for r in (save(s3server.url(key + "-b"), bad, seed=18, big=MiB, timeout=60), load(url, bad, seed=18, big=MiB, timeout=60)):
        assert is_error(r), r
        assert s3server.bucket in r["msg"] and key in r["msg"], r["msg"]
        assert any(w in r["msg"].lower() for w in ("credential", "aws_secret_access_key", "access key")), r["msg"]


def test_missing_bucket(s3server: S3Server, key: str) -> None:
    url = f"s3://ckptio-no-such-bucket/{key}"
    for r in (save(url, s3server.env, seed=19, big=MiB, timeout=60), load(url, s3server.env, seed=19, big=MiB, timeout=60)):
        assert is_error(r), r
        assert "ckptio-no-such-bucket" in r["msg"] and "bucket" in r["msg"].lower(), r["msg"]
    assert "ckptio-no-such-bucket" not in [b["Name"] for b in s3server.client().list_buckets()["Buckets"]]
