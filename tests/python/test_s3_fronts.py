# SPDX-License-Identifier: Apache-2.0
"""s3:// through ckptio's other front doors, on both local servers: torch DCP's StorageWriter and
StorageReader, safetensors files and Hugging Face directories in a bucket, and `ckptio convert`
between local paths and s3:// (both ways, and s3:// to s3:// compressed). Every ckptio call runs
in a bounded child process (the C client reads its AWS_* settings once per process)."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np

from s3servers import S3Server, list_keys
from test_s3 import cli, ok, py

pytest_plugins = ["s3servers"]


def test_dcp_storage_writer_and_reader(s3server: S3Server, s3prefix: str) -> None:
    url = s3server.url(f"{s3prefix}/dcp")
    code = f"""
def run():
    import torch, torch.distributed.checkpoint as dcp
    import ckptio.torch
    g = torch.Generator().manual_seed(5)
    sd = {{"w": torch.randn(300, 700, generator=g), "b": torch.arange(10), "h": torch.randn(64, generator=g).bfloat16()}}
    dcp.save(sd, storage_writer=ckptio.torch.dcp.StorageWriter({url!r}))
    out = {{k: torch.zeros_like(v) for k, v in sd.items()}}
    dcp.load(out, storage_reader=ckptio.torch.dcp.StorageReader({url!r}))
    return {{"same": all(torch.equal(out[k], sd[k]) for k in sd)}}
attempt(run)
"""
    assert ok(py(code, s3server.env))["same"]
    keys = list_keys(s3server.client(), s3server.bucket, f"{s3prefix}/dcp/")
    assert f"{s3prefix}/dcp/manifest" in keys, keys


def _put_hf(s3server: S3Server, tmp: pathlib.Path, prefix: str) -> dict[str, np.ndarray]:
    """A sharded save_pretrained-style directory (two shards and an index) in the bucket."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    shards = {"model-00001-of-00002.safetensors": {"embed": rng.standard_normal((64, 32), np.float32)},
              "model-00002-of-00002.safetensors": {"head": rng.standard_normal((32, 8), np.float32),
                                                   "bias": np.arange(8, dtype=np.int64)}}  # fmt: skip
    index = {"metadata": {}, "weight_map": {n: f for f, ts in shards.items() for n in ts}}
    c = s3server.client()
    for f, ts in shards.items():
        save_file(ts, str(tmp / f))
        c.upload_file(str(tmp / f), s3server.bucket, f"{prefix}/{f}")
    c.put_object(Bucket=s3server.bucket, Key=f"{prefix}/model.safetensors.index.json", Body=json.dumps(index).encode())
    return {n: t for ts in shards.values() for n, t in ts.items()}


def test_load_safetensors_and_hf_directory_from_bucket(s3server: S3Server, s3prefix: str, tmp_path: pathlib.Path) -> None:
    want = _put_hf(s3server, tmp_path, f"{s3prefix}/hf")
    d, one = s3server.url(f"{s3prefix}/hf"), s3server.url(f"{s3prefix}/hf/model-00002-of-00002.safetensors")
    code = f"""
def run():
    a = ckptio.load({d!r})
    b = ckptio.load({one!r})
    return {{"a": {{k: np.asarray(v).tolist() for k, v in a.items()}}, "b": sorted(b)}}
attempt(run)
"""
    r = ok(py(code, s3server.env))
    assert sorted(r["a"]) == sorted(want)
    for k, v in want.items():
        assert np.array_equal(np.asarray(r["a"][k], dtype=v.dtype), v), k
    assert r["b"] == ["bias", "head"]


def test_convert_between_local_and_bucket(s3server: S3Server, s3prefix: str, tmp_path: pathlib.Path) -> None:
    src = tmp_path / "src"
    code = f"""
def run():
    rng = np.random.default_rng(9)
    ckptio.save({{"w": rng.standard_normal((256, 1024)).astype(np.float32), "n": np.arange(5)}}, {str(src)!r})
    return {{}}
attempt(run)
"""
    ok(py(code, s3server.env))
    up, up2 = s3server.url(f"{s3prefix}/conv/up"), s3server.url(f"{s3prefix}/conv/up2")
    back = tmp_path / "back"
    for args in (("convert", str(src), up), ("convert", up, up2, "--compress=all"), ("convert", up2, str(back)),
                 ("verify", up2)):  # fmt: skip
        p = cli(s3server.env, *args)
        assert p.returncode == 0, (args, p.stdout[-2000:], p.stderr[-2000:])
    insp = cli(s3server.env, "inspect", up2)
    assert insp.returncode == 0 and "float" in insp.stdout, insp.stdout
    code = f"""
def run():
    a, b = ckptio.load({str(src)!r}), ckptio.load({str(back)!r})
    return {{"same": all(np.array_equal(a[k], b[k]) for k in a)}}
attempt(run)
"""
    assert ok(py(code, s3server.env))["same"]


def test_convert_refuses_foreign_destinations_in_bucket(s3server: S3Server, s3prefix: str, tmp_path: pathlib.Path) -> None:
    src = tmp_path / "c"
    ok(py(f"attempt(lambda: ckptio.save({{'w': np.ones(4)}}, {str(src)!r}))", s3server.env))
    p = cli(s3server.env, "convert", str(src), s3server.url(f"{s3prefix}/x.safetensors"))
    assert p.returncode != 0
    msg: Any = p.stderr + p.stdout
    assert "object store" in msg and "local directory" in msg, msg
