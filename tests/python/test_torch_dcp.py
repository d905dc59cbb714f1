# SPDX-License-Identifier: Apache-2.0
"""ckptio.torch.dcp: torch.distributed.checkpoint (dcp.save, dcp.async_save, dcp.load) through
ckptio's StorageWriter and StorageReader, in one process and on gloo ranks launched here (2
ranks save, 3 ranks load with other placements); the result is a ckptio checkpoint that
ckptio.load, `ckptio verify` and `ckptio inspect` read, and ckptio.save's checkpoints load
through dcp.load. The rank programs are in tests/python/dist/dcp_torch.py."""

from __future__ import annotations

import os
import pathlib
import pickle
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import ckptio  # noqa: E402
import ckptio.torch  # noqa: E402
from test_comm_dist import DIST, launch, results  # noqa: E402
from test_dist_save import no_error, torch_env  # noqa: E402


def state() -> dict[str, Any]:
    return {
        "model": {"w": torch.arange(24, dtype=torch.float32).reshape(4, 6),
                  "h": torch.arange(10, dtype=torch.int64).to(torch.bfloat16)},
        "step": 12,
        "cfg": {"lr": 0.5, "names": ["a", "b"]},
    }


def zeros() -> dict[str, Any]:
    return {
        "model": {"w": torch.zeros(4, 6), "h": torch.zeros(10, dtype=torch.bfloat16)},
        "step": 0,
        "cfg": {"lr": 0.0, "names": []},
    }


def test_module_names() -> None:
    from ckptio.torch.dcp import StorageReader, StorageWriter

    assert ckptio.torch.dcp.StorageWriter is StorageWriter
    assert issubclass(StorageWriter, dcp.StorageWriter)
    assert issubclass(StorageReader, dcp.StorageReader)


def test_import_ckptio_does_not_import_torch_distributed() -> None:
    code = ("import sys, ckptio, ckptio.torch; "
            "assert 'torch.distributed.checkpoint' not in sys.modules, 'imported'; "
            "from ckptio.torch.dcp import StorageWriter; "
            "assert 'torch.distributed.checkpoint' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_one_process_round_trip(tmp_path: pathlib.Path) -> None:
    from ckptio.torch.dcp import StorageReader, StorageWriter

    path = tmp_path / "ckpt"
    dcp.save(state(), storage_writer=StorageWriter(path))
    got = zeros()
    dcp.load(got, storage_reader=StorageReader(path))
    want = state()
    assert torch.equal(got["model"]["w"], want["model"]["w"])
    assert torch.equal(got["model"]["h"], want["model"]["h"])
    assert got["step"] == 12 and got["cfg"] == {"lr": 0.5, "names": ["a", "b"]}
    # A ckptio checkpoint: ckptio.load gives the tensors by FQN, DCP's Metadata is kept.
    out = ckptio.load(path)
    assert torch.equal(out["model.w"], want["model"]["w"])
    assert out["model.h"].dtype == torch.bfloat16
    assert torch.load(__import__("io").BytesIO(out["step"].tobytes())) == 12
    with ckptio.open(path) as r:
        md = pickle.loads(r._r.get_meta(ckptio.torch.dcp.METADATA_KEY))
    assert set(md.state_dict_metadata) == {"model.w", "model.h", "step", "cfg.lr", "cfg.names"}


def test_checkpoint_id_and_command_line(tmp_path: pathlib.Path) -> None:
    from ckptio.torch.dcp import StorageReader, StorageWriter

    path = tmp_path / "ckpt"
    dcp.save(state(), checkpoint_id=path, storage_writer=StorageWriter(tmp_path / "elsewhere"))
    assert path.is_dir() and not (tmp_path / "elsewhere").exists()
    for cmd in ("verify", "inspect"):
        res = subprocess.run([sys.executable, "-m", "ckptio", cmd, str(path)],
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
    assert "model.w" in res.stdout
    got = zeros()
    dcp.load(got, checkpoint_id=path, storage_reader=StorageReader(tmp_path / "elsewhere"))
    assert got["step"] == 12


def test_ckptio_save_read_by_dcp(tmp_path: pathlib.Path) -> None:
    """No DCP Metadata: the reader makes it from the manifest and tree (plain values as byte
    items, tied tensors by their key path)."""
    from ckptio.torch.dcp import StorageReader

    path = tmp_path / "ckpt"
    w = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    ckptio.save({"model": {"w": w, "tied": w, "n": np.arange(3, dtype=np.int32)}, "step": 4}, path)
    got = {"model": {"w": torch.zeros(4, 6), "tied": torch.zeros(4, 6),
                     "n": torch.zeros(3, dtype=torch.int32)}, "step": 0}
    dcp.load(got, storage_reader=StorageReader(path))
    assert torch.equal(got["model"]["w"], w) and torch.equal(got["model"]["tied"], w)
    assert got["model"]["n"].tolist() == [0, 1, 2] and got["step"] == 4
    # A partial load of a subset of the keys, into a non-contiguous destination.
    dst = torch.zeros(6, 4).t()
    part = {"model": {"w": dst}}
    dcp.load(part, storage_reader=StorageReader(path))
    assert torch.equal(dst, w)


def test_region_reads_only(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read item is a region of the stored tensor: the reader asks the core for that box
    only, never the whole chunk."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.planner import ReadItem

    from ckptio import _core
    from ckptio.torch.dcp import StorageReader

    path = tmp_path / "ckpt"
    ckptio.save({"w": torch.arange(64, dtype=torch.float32).reshape(8, 8)}, path)
    asked: list[Any] = []
    real = _core.Reader.read

    class Spy:
        def __init__(self, r: Any) -> None:
            self._r = r

        def read(self, regions: list[Any]) -> None:
            asked.extend((g.offset, g.shape) for g in regions)
            real(self._r, regions)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._r, name)

    import ckptio.formats._torch_dcp as mod

    class Narrow(DefaultLoadPlanner):
        def create_local_plan(self) -> Any:
            plan = super().create_local_plan()
            (item,) = plan.items
            # Rows 2..5 of the stored tensor into rows 2..5 of the destination.
            plan.items = [ReadItem(type=item.type, dest_index=item.dest_index,
                                   dest_offsets=torch.Size([2, 0]), storage_index=item.storage_index,
                                   storage_offsets=torch.Size([2, 0]), lengths=torch.Size([3, 8]))]
            return plan

    orig = mod.Reader.__init__

    def init(self: Any, *a: Any, **k: Any) -> None:
        orig(self, *a, **k)
        self._r = Spy(self._r)

    monkeypatch.setattr(mod.Reader, "__init__", init)
    got = {"w": torch.zeros(8, 8)}
    dcp.load(got, storage_reader=StorageReader(path), planner=Narrow())
    assert asked == [((2, 0), (3, 8))]
    want = torch.zeros(8, 8)
    want[2:5] = torch.arange(64, dtype=torch.float32).reshape(8, 8)[2:5]
    assert torch.equal(got["w"], want)


def test_writer_pickles() -> None:
    from ckptio.torch.dcp import StorageWriter

    w = pickle.loads(pickle.dumps(StorageWriter("/tmp/x", timeout=5, direct=False)))
    assert w.path == "/tmp/x" and w.timeout == 5 and w.io_options == {"direct": False}
    with pytest.raises(ckptio.CheckpointError):
        StorageWriter("/tmp/x", no_such_option=1)


def test_two_ranks_save_three_ranks_load(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    prog = str(DIST / "dcp_torch.py")
    launch([[sys.executable, prog, "save", str(tmp_path)]] * 2, torch_env(2), out)
    for tag in ("fsdp", "plain", "async_thread", "async_process", "native", "solo"):
        no_error(results(out, tag), 2)
    assert all(v["dtensor"] for v in results(out, "fsdp").values())
    # Rank 1 raised inside write_data: every rank fails naming it, nothing half-written, the
    # previous checkpoint at that path intact and no temporary directory left.
    failed = results(out, "failed")
    assert sorted(failed) == [0, 1]
    assert "rank 1 failed to stage its state" in failed[1]["message"], failed[1]
    assert "rank 1" in failed[0]["message"], failed[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "async-process", "async-thread", "fsdp", "fsdp-expected.pt", "native", "out", "plain",
        "solo"]
    assert ckptio.load(tmp_path / "solo")["x"].tolist() == [0.0, 1.0, 2.0]
    full = ckptio.load(tmp_path / "plain")
    assert sorted(full) == ["bias", "e", "extra.name", "extra.step", "w"]
    assert torch.equal(full["w"], torch.arange(72, dtype=torch.float32).reshape(12, 6))
    assert full["e"].dtype == torch.bfloat16 and tuple(full["e"].shape) == (6, 9)
    ckptio.open(tmp_path / "plain").verify()

    launch([[sys.executable, prog, "load", str(tmp_path)]] * 3, torch_env(3), out)
    for name in ("plain", "async-thread", "async-process", "native"):
        for placement, local in (("S(1)", [12, 2]), ("R", [12, 6])):
            res = results(out, f"load-{name}-{placement}")
            no_error(res, 3)
            for v in res.values():
                assert v["w_ok"] and v["e_ok"] and v["bias_ok"], (name, v)
                assert v["w_local"] == local and v["extra"] == {"step": 7, "name": "run-a"}
    fsdp = results(out, "load-fsdp")
    no_error(fsdp, 3)
    assert all(v["same"] and v["keys"] for v in fsdp.values()), fsdp
