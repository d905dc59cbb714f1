# SPDX-License-Identifier: Apache-2.0
"""The plugins bench cell (bench/plugins_cell.py) runs end to end on a small checkpoint and writes its result file."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_small_run(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "out"
    subprocess.run([sys.executable, os.path.join(HERE, "plugins_cell.py"), "--dir",
                    str(tmp_path / "d"), "--size", "4M", "--runs", "1", "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=600)  # fmt: skip
    doc = json.loads((out / "latest.json").read_text())
    cells = {r["cell"] for r in doc["rows"]}
    assert "lightning ckptio CheckpointIO(async_save=True)" in cells
    assert "deepspeed ckptio CheckpointEngine(decoupled=True)" in cells
    for r in doc["rows"]:
        assert 0 < r["blocked_s"] <= r["durable_s"] + 1e-6, r
    assert doc["raw_write_gbps"] > 0
