# SPDX-License-Identifier: Apache-2.0
"""Ctrl-C during a save: the save aborts, nothing appears at the path, no temporary is left."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import ckptio

from conftest import leftovers

CHILD = {
    "save": """
        import numpy as np, ckptio
        tree = {f"t{i}": np.zeros(4 << 20, np.float32) for i in range(64)}  # 1 GiB of zero pages
        ckptio.save(tree, PATH)
    """,
    "torch": """
        import torch, ckptio.torch
        ckptio.torch.save({f"t{i}": torch.zeros(16 << 20) for i in range(16)}, PATH)
    """,
}


def written(directory: pathlib.Path) -> int:
    """Bytes in the temporaries of saves in progress under ``directory``."""
    total = 0
    for tmp in directory.glob("*.tmp-*"):
        files = [tmp] if tmp.is_file() else list(tmp.rglob("*"))
        for f in files:
            try:
                total += f.stat().st_size if f.is_file() else 0
            except FileNotFoundError:
                pass
    return total


def interrupt_child(
    kind: str, path: pathlib.Path, after_bytes: int = 0
) -> subprocess.CompletedProcess[str]:
    """Run a save in a child and send it SIGINT once its temporary holds ``after_bytes``."""
    code = "PATH = %r\n" % str(path) + textwrap.dedent(CHILD[kind]) + "print('finished')\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    try:
        # Wait until the save has started writing (its temporary exists), then press Ctrl-C.
        while not leftovers(path.parent) or written(path.parent) < after_bytes:
            if proc.poll() is not None or time.monotonic() > deadline:
                out, err = proc.communicate()
                pytest.fail(f"the save never started or ended too soon: {out}{err}")
            time.sleep(0.001)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("when", ["at_open", "mid_write"])
@pytest.mark.parametrize("kind", ["save", "torch"])
def test_ctrl_c_aborts_cleanly(tmp_path: pathlib.Path, kind: str, when: str) -> None:
    path = tmp_path / ("ckpt" if kind == "save" else "model.pt")
    res = interrupt_child(kind, path, 0 if when == "at_open" else 64 << 20)
    assert "KeyboardInterrupt" in res.stderr, res.stderr
    assert "finished" not in res.stdout
    assert res.returncode != 0
    assert not path.exists()
    assert leftovers(tmp_path) == []


def test_ctrl_c_keeps_the_previous_checkpoint(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "ckpt"
    ckptio.save({"old": np.arange(3)}, path)
    CHILD["overwrite"] = CHILD["save"].replace(", PATH)", ", PATH, overwrite=True)")
    res = interrupt_child("overwrite", path, 64 << 20)
    assert "KeyboardInterrupt" in res.stderr, res.stderr
    assert ckptio.load(path)["old"].tolist() == [0, 1, 2]
    assert leftovers(tmp_path) == []


def test_exception_mid_save_leaves_nothing(tmp_path: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    path = tmp_path / "ckpt"
    # The sparse tensor is refused after the writer opened (its temporary exists).
    tree = {"a": np.ones(1 << 20), "b": torch.eye(2).to_sparse()}
    with pytest.raises(TypeError):
        ckptio.save(tree, path)
    assert not path.exists() and leftovers(tmp_path) == []
