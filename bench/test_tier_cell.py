# SPDX-License-Identifier: Apache-2.0
"""The peer-tier cell (bench/tier_cell.py) at a tiny size, one round: 4 ranks as 2 nodes save, the lost node's ranks restore from the peer, then every rank from the persistent tier, every byte exact, and the result file has every figure and target."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_tier_cell(tmp_path: object) -> None:
    out = os.path.join(str(tmp_path), "results")
    local = os.path.join(str(tmp_path), "local")
    os.makedirs(local)
    cmd = [sys.executable, os.path.join(HERE, "tier_cell.py"), "--size", "16M", "--tensors", "2", "--rounds", "1",
           "--raw-size", "16M", "--dir", os.path.join(str(tmp_path), "data"), "--local-base", local, "--timeout", "240",
           "--collective-timeout", "120", "--out", out, "--quiet"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Peer-tier cell" in r.stdout
    with open(os.path.join(out, "tier-latest.json")) as f:
        doc = json.load(f)
    s = doc["summary"]
    (rnd,) = doc["rounds"]
    assert len(rnd["save"]) == len(rnd["peer"]) == len(rnd["persistent"]) == 4
    for d in rnd["peer"]:
        want = "peer" if d["node"] == "n1" else "local"
        assert d["last_restore"]["source"] == want and d["last_restore"]["step"] == 2 and d["crc_ok"], d
    for d in rnd["persistent"]:
        assert d["last_restore"]["source"] == "persistent" and d["last_restore"]["step"] == 2 and d["crc_ok"], d
    for d in rnd["save"]:
        ls = d["manager"]["last_save"]
        assert ls["step"] == 2 and ls["replicate_bytes"] >= d["bytes"] and not ls["errors"], ls
        assert d["manager"]["stall_s"] > 0 and d["async"]["stall_s"] > 0
    assert rnd["persistent_cache"]["files"] > 0
    for k in ("manager_stall_s", "async_stall_s", "replicate_gbps", "peer_lost_node_s", "persistent_lost_node_s",
              "persistent_x_peer", "peer_job_s", "persistent_job_s"):  # fmt: skip
        assert s[k] > 0, (k, s)
    assert set(s["peer_job_breakdown"]) == {"plan", "fetch", "load", "agree", "total"}
    assert s["peer_exact"] and s["persistent_exact"]
    assert isinstance(s["stall_met"], bool) and isinstance(s["restore_met"], bool)
    assert os.listdir(local) == []  # the cell's local roots are gone
