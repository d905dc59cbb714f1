# SPDX-License-Identifier: Apache-2.0
"""The single-process object-store cells (bench/s3_cell.py) at a tiny size, one round: boto3, s3torchconnector and ckptio each save and load back through a SeaweedFS server the cell starts, google-cloud-storage and ckptio through a fake-gcs-server, and each result file has every row without an error."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))

import gcsservers as GCS  # noqa: E402
import s3servers as S3  # noqa: E402


def run_cell(tmp_path: object, store: str) -> dict[str, object]:
    out = os.path.join(str(tmp_path), "results")
    cmd = [sys.executable, os.path.join(HERE, "s3_cell.py"), "--store", store, "--size", "24M", "--runs", "1",
           "--dir", os.path.join(str(tmp_path), "data"), "--out", out, "--quiet"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with open(os.path.join(out, f"{store}-latest.json")) as f:
        return json.load(f)  # type: ignore[no-any-return]


def check_rows(doc: dict[str, object], mechanisms: tuple[str, ...]) -> None:
    rows = {(x["mechanism"], x["op"]): x for x in doc["rows"]}  # type: ignore[attr-defined]
    assert set(rows) == {(m, op) for m in mechanisms for op in ("save", "load")}
    for key, x in rows.items():
        assert "error" not in x and x["runs"] == 1 and x["wall_s"] > 0, (key, x)
    assert doc["targets"], doc


def test_gcs_cell(tmp_path: object) -> None:
    why = GCS.missing()
    if why:
        pytest.skip(f"no GCS server: {why}")
    pytest.importorskip("google.cloud.storage")
    check_rows(run_cell(tmp_path, "gcs"), ("google-cloud-storage", "ckptio"))


def test_s3_cell(tmp_path: object) -> None:
    why = S3.missing("seaweedfs")
    if why:
        pytest.skip(f"no SeaweedFS: {why}")
    pytest.importorskip("s3torchconnector")
    check_rows(run_cell(tmp_path, "s3"), ("boto3", "s3torchconnector", "ckptio"))
