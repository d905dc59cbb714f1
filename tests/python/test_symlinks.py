# SPDX-License-Identifier: Apache-2.0
"""Symlinked paths: the Hugging Face cache layout, saving through a link, ``latest -> step-N``."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

import ckptio
from conftest import leftovers

torch = pytest.importorskip("torch")
ckptio_torch = pytest.importorskip("ckptio.torch")


def _state(seed: int) -> dict[str, object]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(300, 70, generator=g), "b": torch.arange(seed, seed + 9)}


def _same(a: dict[str, object], b: dict[str, object]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # type: ignore[arg-type]


def test_hf_cache_layout(tmp_path: pathlib.Path) -> None:
    """snapshots/<rev>/pytorch_model.bin -> ../../blobs/<sha>, loaded as torch.load loads it."""
    blobs = tmp_path / "hub" / "models--org--name" / "blobs"
    snap = tmp_path / "hub" / "models--org--name" / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    sd = _state(1)
    torch.save(sd, blobs / "9f86d081884c7d65")
    link = snap / "pytorch_model.bin"
    link.symlink_to("../../blobs/9f86d081884c7d65")
    assert _same(ckptio_torch.load(link), sd)
    assert _same(ckptio_torch.load(str(link)), torch.load(link))
    # a chain of links, relative to the working directory
    (tmp_path / "model.bin").symlink_to(link)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert _same(ckptio_torch.load("model.bin"), sd)
    finally:
        os.chdir(cwd)


def test_torch_save_writes_through_a_link(tmp_path: pathlib.Path) -> None:
    """As torch.save does: the link's target is replaced, the link stays a link."""
    (tmp_path / "store").mkdir()
    target = tmp_path / "store" / "model.pt"
    torch.save(_state(1), target)
    target.chmod(0o600)
    link = tmp_path / "model.pt"
    link.symlink_to("store/model.pt")
    sd = _state(2)
    ckptio_torch.save(sd, link)
    assert link.is_symlink() and os.readlink(link) == "store/model.pt"
    assert target.is_file() and not target.is_symlink()
    assert target.stat().st_mode & 0o7777 == 0o600
    assert _same(torch.load(target), sd) and _same(torch.load(link), sd)
    assert _same(ckptio_torch.load(link), sd)
    assert leftovers(tmp_path) == [] and leftovers(tmp_path / "store") == []


def test_latest_link_to_checkpoint(tmp_path: pathlib.Path) -> None:
    """``latest -> step-N`` opens and loads; saving to it with overwrite replaces step-N."""
    tree = {"a": np.arange(1000, dtype=np.float32), "step": 1000}
    ckptio.save(tree, tmp_path / "step-1000")
    latest = tmp_path / "latest"
    latest.symlink_to("step-1000")
    got = ckptio.load(latest)
    assert np.array_equal(got["a"], tree["a"]) and got["step"] == 1000
    with ckptio.open(str(latest)) as r:
        assert set(r.keys()) >= {"a"}
    with pytest.raises(ckptio.CheckpointExists):
        ckptio.save(tree, latest)
    newer = {"a": np.ones(10, dtype=np.float32), "step": 2000}
    ckptio.save(newer, latest, overwrite=True)
    assert latest.is_symlink() and os.readlink(latest) == "step-1000"
    got = ckptio.load(tmp_path / "step-1000")
    assert np.array_equal(got["a"], newer["a"]) and got["step"] == 2000
    assert leftovers(tmp_path) == []
