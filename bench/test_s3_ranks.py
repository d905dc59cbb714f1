# SPDX-License-Identifier: Apache-2.0
"""The four-rank S3 cell (bench/s3_ranks.py) at a tiny size, one round: every mechanism saves and loads back the same bytes on every rank, and the result file says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# The cell is a script beside this test (bench/ is no package); it lives in bench/, not tests/,
# as nothing reaches into bench/.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))

import s3servers as S3  # noqa: E402


def test_s3_ranks_cell(tmp_path: object) -> None:
    why = S3.missing("seaweedfs")
    if why:
        pytest.skip(f"no SeaweedFS: {why}")
    pytest.importorskip("torch")
    pytest.importorskip("s3torchconnector")
    out = os.path.join(str(tmp_path), "results")
    cmd = [sys.executable, os.path.join(HERE, "s3_ranks.py"), "--size", "2M", "--tensors", "2", "--runs", "1",
           "--mechanisms", "ckptio,dcp-s3tc,ckptio-dcp", "--dir", os.path.join(str(tmp_path), "data"), "--out", out, "--timeout", "400", "--collective-timeout", "120"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=480)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with open(os.path.join(out, "s3ranks-latest.json")) as f:
        doc = json.load(f)
    rows = {(x["mech"], x["op"]): x for x in doc["rows"]}
    assert set(rows) == {(m, op) for m in ("ckptio", "dcp-s3tc", "ckptio-dcp") for op in ("save", "load")}
    for (m, op), x in rows.items():
        assert x["runs"] == 1 and not x["errors"], (m, op, x["errors"])
        # CPU times tick in 10 ms: at this size a call may take none.
        assert x["seconds"] > 0 and x["cpu_s_per_gb"] >= 0 and x["server_cpu_s_per_gb"] >= 0 and len(x["peak_rss_mib_per_rank"]) == 4
        if op == "load":
            assert x["checksums_per_rank"] == doc["saved_checksums_per_rank"]
    assert len(set(doc["saved_checksums_per_rank"])) == 4  # each rank holds its own rows
    assert doc["bytes"] == sum(doc["bytes_per_rank"])
    assert {f"{m} {op} vs DCP+s3torchconnector" for m in ("ckptio", "ckptio-dcp") for op in ("save", "load")} == set(doc["ratios"])
    assert doc["objects_left"] == 0
    assert "ckptio.save(comm=)" in r.stdout
