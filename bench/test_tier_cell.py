# SPDX-License-Identifier: Apache-2.0
"""The peer-tier cell (bench/tier_cell.py) at a tiny size, one round: 4 ranks as 2 nodes save, the lost node's ranks restore from the peer, then every rank from the persistent tier, every byte exact, and the result file has every figure and target."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_tier_cell(tmp_path: object) -> None:
    # The cell's own layout: local roots in /dev/shm (tmpfs), the persistent tier on the disk.
    out = os.path.join(str(tmp_path), "results")
    cmd = [sys.executable, os.path.join(HERE, "tier_cell.py"), "--size", "16M", "--tensors", "2", "--rounds", "1",
           "--saves", "2", "--raw-size", "16M", "--dir", os.path.join(str(tmp_path), "data"), "--timeout", "240",
           "--collective-timeout", "120", "--out", out, "--quiet"]  # fmt: skip
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert "Peer-tier cell" in stdout
    assert not os.path.exists(f"/dev/shm/ckptio-tier-{p.pid}")  # the cell's local roots are gone
    with open(os.path.join(out, "tier-latest.json")) as f:
        doc = json.load(f)
    s = doc["summary"]
    (rnd,) = doc["rounds"]
    for d in rnd["save"]:  # steps 2 and 3 timed (step 1: the untimed first save)
        assert [x["last_save"]["step"] for x in d["manager"]] == [2, 3] and len(d["async"]) == 2, d
        for x in d["manager"]:
            ls = x["last_save"]
            assert ls["replicate_bytes"] >= d["bytes"] and not ls["errors"] and x["stall_s"] > 0, ls
        assert all(x["stall_s"] > 0 for x in d["async"])
    assert not rnd.get("peer_error") and not rnd.get("persistent_error"), stdout[-3000:]
    assert len(rnd["save"]) == len(rnd["peer"]) == len(rnd["persistent"]) == 4
    for d in rnd["peer"]:
        want = "peer" if d["node"] == "n1" else "local"
        assert d["last_restore"]["source"] == want and d["last_restore"]["step"] == 3 and d["crc_ok"], d
    for d in rnd["persistent"]:
        assert d["last_restore"]["source"] == "persistent" and d["last_restore"]["step"] == 3 and d["crc_ok"], d
    assert rnd["persistent_cache"]["files"] > 0
    for k in ("manager_stall_s", "async_stall_s", "replicate_gbps", "persistent_x_peer"):
        assert s[k] > 0, (k, s)
    for kind in ("peer", "persistent"):
        x = s[kind]
        assert x["rounds"] == 1 and x["lost_node_s"] > 0 and x["job_s"] > 0 and x["exact"] and not x["failed"], x
        assert set(x["job_breakdown"]) == {"plan", "fetch", "load", "agree", "total"}
    assert isinstance(s["stall_met"], bool) and isinstance(s["restore_met"], bool)
