# SPDX-License-Identifier: Apache-2.0
"""The FastPersist cell (bench/fastpersist_cell.py) at tiny sizes, one round: every mechanism saves the tensor and the small Phi-3 model, each file reads back equal, the DeepSpeed engines save, and the result file has every row and ratio."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def test_fastpersist_cell(tmp_path: object) -> None:
    pytest.importorskip("deepspeed")
    pytest.importorskip("transformers")
    import fastpersist_cell as F

    out = os.path.join(str(tmp_path), "results")
    cmd = [sys.executable, os.path.join(HERE, "fastpersist_cell.py"), "--tensor-size", "4M", "--model", "phi3-tiny",
           "--runs", "1", "--raw-size", "16M", "--check", "--dir", os.path.join(str(tmp_path), "data"),
           "--out", out, "--quiet"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with open(os.path.join(out, "fastpersist-latest.json")) as f:
        doc = json.load(f)
    rows = {(x["benchmark"], x["mechanism"]): x for x in doc["rows"]}
    want = {(b, m) for b in ("Tensor 4 MiB", "Model phi3-tiny") for m in F.FILE_MECHS}
    want |= {("DeepSpeed phi3-tiny", m) for m in F.ENGINE_MECHS}
    assert set(rows) == want
    has_ds = importlib.util.find_spec("ckptio.deepspeed") is not None
    for key, x in rows.items():
        if key[1] == "engine + ckptio.deepspeed" and not has_ds:
            assert x["error"].startswith("not available"), x
            continue
        assert "error" not in x and x["runs"] == 1 and x["gbps"] > 0 and x["cpu_s_per_gb"] >= 0, (key, x)
    assert "Tensor 4 MiB: ckptio.torch.save / FastPersist (zip)" in doc["ratios"]
    assert doc["model"]["tensors"] > 0 and doc["raw_write_gbps"] > 0
