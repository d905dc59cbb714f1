# SPDX-License-Identifier: Apache-2.0
"""The request-pattern cell (bench/s3_requests.py) at a tiny size: 2 and 4 simulated ranks save and load through the counting proxy, to S3 in both layouts and to GCS, and the result file's counts are what the store protocol says they must be."""

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


@pytest.mark.parametrize(("store", "layout", "spread"), [("s3", "shard", 0), ("s3", "ranklocal", 0), ("gcs", "shard", 0), ("s3", "shard", 2)])
def test_s3_requests_cell(tmp_path: object, store: str, layout: str, spread: int) -> None:
    why = GCS.missing() if store == "gcs" else S3.missing("seaweedfs")
    if why:
        pytest.skip(f"no {store} server: {why}")
    out = os.path.join(str(tmp_path), "results")
    cmd = [sys.executable, os.path.join(HERE, "s3_requests.py"), "--store", store, "--ranks", "2,4", "--state-bytes", "1M", "--runs", "1",
           "--layout", layout, "--dir", os.path.join(str(tmp_path), "data"), "--out", out, "--quiet",
           "--timeout", "60", "--launch-timeout", "120", "--spread", str(spread)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    name = f"{store}requests-" + ("" if layout == "shard" else f"{layout}-") + (f"spread{spread}-" if spread else "") + "latest.json"
    with open(os.path.join(out, name)) as f:
        doc = json.load(f)
    assert set(doc["by_ranks"]) == {"2", "4"} and doc["objects_left"] == 0
    for n, row in doc["by_ranks"].items():
        ranks = int(n)
        assert "errors" not in row and row["runs"] == 1 and row["save_s"] > 0 and row["load_s"] > 0, row
        sv, ld = row["save"], row["load"]
        # A save: rank 0 looks for the manifest once and puts it once; each rank writes its own
        # data object, smaller than a part: one request, no multipart upload; rank 0 lists what
        # to sweep afterwards (S3 its objects and its unfinished uploads, GCS its objects).
        assert sv["manifest_puts"] == 1 and sv["manifest_heads"] == 1 and sv["manifest_gets"] == 0, sv
        # (spread: and the save's marker, beside the manifest)
        assert sv["data_objects"] == ranks and sv["by_kind"]["PUT object"] == ranks + 1 + (spread > 0), sv["by_kind"]
        assert not {"POST create", "PUT part", "POST complete"} & set(sv["by_kind"]), sv["by_kind"]
        assert sv["lists"] == (1 if store == "gcs" else 2) and sv["heads"] == 1
        assert sv["not_2xx"] == {"HEAD 404": 1} and sv["retried"] == 0
        assert sv["requests"] == sum(sv["by_kind"].values()) and not sv["other_kinds"]
        # (2 ranks: 2 data writes and the manifest's HEAD and PUT, a tie)
        assert sv["bytes_up"] >= row["bytes"] and (sv["busiest_component"].startswith("d-") or ranks == 2)
        # A load: the ranks open it together, so the manifest is read once (rank 0 sends it to
        # the others), and no HEAD asks for what the manifest says (the data objects' sizes).
        assert ld["manifest_gets"] == 1 and ld["manifest_heads"] == 0 and ld["lists"] == 0, ld
        # (GCS's conditional write carries the manifest in a multipart body, with its metadata)
        up, down = sv["manifest_bytes_up"], ld["manifest_bytes_down"]
        assert ld["heads"] == 0 and (up - 400 < down < up if store == "gcs" else down == up), ld
        assert ld["data_objects"] == ranks and ld["by_kind"]["GET range"] >= ranks and not ld["not_2xx"]
        assert ld["bytes_down"] >= row["bytes"] and ld["put_class"] == 0
        for phase in (sv, ld):
            assert phase["requests_per_rank"] == pytest.approx(phase["requests"] / ranks, abs=1e-3)
            assert phase["requests_per_gb"] == pytest.approx(phase["requests"] / (row["bytes"] / 1e9), rel=1e-3)
            assert 0 < phase["busiest_component_share"] <= 1 and phase["common_prefix_share"] == 1.0
            if not spread:  # every request in the checkpoint's own prefix
                assert phase["common_prefix"].endswith("/ckpt/") and phase["prefix_profile"][0] == [0, 1.0]
                assert phase["ranges"] == 1 and phase["busiest_range"] == "ckpt" and phase["busiest_range_share"] == 1.0
            else:  # the data objects' requests in the parent's .ckptio-<hh>/ prefixes
                assert phase["ranges"] >= 2 and phase["busiest_range_share"] < 1.0, phase
    assert doc["growth"]["load manifest_gets"] == 1.0
    assert f"{store.upper()} request pattern" in r.stdout
