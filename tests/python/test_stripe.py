# SPDX-License-Identifier: Apache-2.0
"""Striping from Python: ``save(tree, path, roots=[...])`` and ``load(path, roots=[...])``."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

import ckptio
from conftest import leftovers


def _stripes(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in root.iterdir() if p.name.endswith(".ckptio-stripe"))


def _data_bytes(d: pathlib.Path) -> int:
    return sum(f.stat().st_size for f in (d / "data").iterdir())


def _roots(tmp_path: pathlib.Path, n: int) -> list[pathlib.Path]:
    out = [tmp_path / f"nvme{i}" for i in range(n)]
    for r in out:
        r.mkdir()
    return out


def test_numpy_round_trip(tmp_path: pathlib.Path) -> None:
    roots = _roots(tmp_path, 2)
    rng = np.random.default_rng(0)
    tree = {
        "layers": [{"w": rng.standard_normal((256, 256), dtype=np.float32)} for _ in range(9)],
        "bias": np.arange(7, dtype=np.int64),
        "step": 12,
    }
    path = tmp_path / "ckpt"
    st = ckptio.save(tree, path, roots=roots)
    assert st.bytes == 9 * 256 * 256 * 4 + 7 * 8
    assert leftovers(tmp_path) == []
    # the checkpoint's own directory and each root hold a third of the 9 equal tensors
    shares = [_data_bytes(path)] + [_data_bytes(_stripes(r)[0]) for r in roots]
    assert all(s >= 3 * 256 * 256 * 4 for s in shares), shares
    out = ckptio.load(path)
    assert out["step"] == 12
    np.testing.assert_array_equal(out["bias"], tree["bias"])
    for a, b in zip(out["layers"], tree["layers"]):  # type: ignore[arg-type]
        np.testing.assert_array_equal(a["w"], b["w"])


def test_moved_roots_and_missing_root(tmp_path: pathlib.Path) -> None:
    roots = _roots(tmp_path, 2)
    tree = {f"t{i}": np.full((64, 1024), i, dtype=np.float32) for i in range(6)}
    path = tmp_path / "ckpt"
    ckptio.save(tree, path, roots=[str(r) for r in roots])
    moved = tmp_path / "moved"
    moved.mkdir()
    os.rename(roots[1], moved / "nvme1")
    with pytest.raises(FileNotFoundError) as e:
        ckptio.load(path)
    msg = str(e.value)
    assert str(roots[1]) in msg and "roots=" in msg and str(path) in msg
    out = ckptio.load(path, roots=[moved / "nvme1"])
    for k, v in tree.items():
        np.testing.assert_array_equal(out[k], v)
    with ckptio.open(path, roots=[moved / "nvme1"]) as r:
        np.testing.assert_array_equal(r.read("t5"), tree["t5"])


def test_overwrite_replaces_stripes(tmp_path: pathlib.Path) -> None:
    roots = _roots(tmp_path, 1)
    path = tmp_path / "ckpt"
    ckptio.save({"a": np.ones(4096), "b": np.ones(4096)}, path, roots=roots)
    (old,) = _stripes(roots[0])
    ckptio.save({"a": np.zeros(4096), "b": np.zeros(4096)}, path, roots=roots, overwrite=True)
    (new,) = _stripes(roots[0])
    assert new != old and not old.exists()
    assert ckptio.load(path)["b"].sum() == 0


def test_roots_usage(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ckptio.InvalidType):
        ckptio.save({"a": np.ones(3)}, tmp_path / "c", roots=str(tmp_path))
    with pytest.raises(ckptio.CheckpointError):
        ckptio.save({"a": np.ones(3)}, tmp_path / "c", roots=[tmp_path / "missing"])
    assert not (tmp_path / "c").exists()


def test_torch_round_trip(tmp_path: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    roots = _roots(tmp_path, 3)
    g = torch.Generator().manual_seed(3)
    sd = {f"w{i}": torch.randn(128, 300, generator=g) for i in range(8)}
    sd["half"] = torch.randn(77, dtype=torch.float16, generator=g)
    path = tmp_path / "ckpt"
    ckptio.save(sd, path, roots=roots)
    assert all(len(_stripes(r)) == 1 for r in roots)
    out = ckptio.load(path)
    assert out.keys() == sd.keys()
    assert all(torch.equal(out[k], sd[k]) for k in sd)


def test_manager_prunes_stripes(tmp_path: pathlib.Path) -> None:
    """A Manager saving with roots= removes a pruned step's stripes with the step."""
    roots = _roots(tmp_path, 1)
    with ckptio.Manager(tmp_path / "run", keep=1, async_save=False, roots=roots) as m:
        for step in (1, 2, 3):
            m.save(step, {"w": np.full(8192, step, dtype=np.float32), "v": np.ones(8192)})
        assert m.all_steps() == [3]
    assert len(_stripes(roots[0])) == 1
    assert ckptio.load(tmp_path / "run" / "3")["w"][0] == 3
