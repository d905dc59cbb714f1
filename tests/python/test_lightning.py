# SPDX-License-Identifier: Apache-2.0
"""ckptio.lightning.CheckpointIO: Trainer fits with retention and resume, sync and async, inside AsyncCheckpointIO, errors, and a save killed mid-write."""

from __future__ import annotations

import argparse
import doctest
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading
import weakref
from typing import Any

import pytest

pytest.importorskip("lightning", reason="PyTorch Lightning is not installed")

import torch  # noqa: E402
from lightning.pytorch.plugins.io import AsyncCheckpointIO  # noqa: E402

import ckptio  # noqa: E402
import ckptio.lightning  # noqa: E402
from ckptio.lightning import CheckpointIO, is_async_checkpoint  # noqa: E402

import lightning_child as lc  # noqa: E402
from conftest import leftovers  # noqa: E402
from test_async import hold  # noqa: E402

EPOCHS = 5
CHILD = pathlib.Path(__file__).with_name("lightning_child.py")


@pytest.fixture(scope="module")
def reference() -> tuple[dict[str, torch.Tensor], dict[int, float]]:
    """An uninterrupted run of EPOCHS epochs: its final weights and its loss at every step."""
    m = lc.model()
    lc.trainer(EPOCHS).fit(m, lc.data())
    return {k: v.clone() for k, v in m.state_dict().items()}, dict(m.losses)


def resume_and_compare(path: pathlib.Path | str, reference: Any, plugins: list[Any],
                       ckpt_dir: pathlib.Path | None = None, pad_mib: int = 0) -> None:  # fmt: skip
    """fit(ckpt_path=path) up to EPOCHS epochs ends on the uninterrupted run's weights, with
    its losses at every step it ran."""
    weights, losses = reference
    torch.manual_seed(123)
    m = lc.Tiny(pad_mib)  # other initial weights: only the checkpoint makes them equal
    t = lc.trainer(EPOCHS, plugins, None if ckpt_dir is None else str(ckpt_dir))
    t.fit(m, lc.data(), ckpt_path=str(path))
    assert t.global_step == EPOCHS * lc.STEPS_PER_EPOCH
    assert m.losses and min(m.losses) > 0, "the resumed run started from the beginning"
    assert m.losses == {s: losses[s] for s in m.losses}
    for k, v in weights.items():
        assert torch.equal(m.state_dict()[k], v), k


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_fit_keeps_two_and_resumes_exactly(
    tmp_path: pathlib.Path, reference: Any, mode: str
) -> None:
    d = tmp_path / "ckpts"
    io = CheckpointIO(async_save=mode == "async")
    m = lc.model()
    lc.trainer(3, [io], str(d)).fit(m, lc.data())
    names = sorted(os.listdir(d))
    assert names == ["epoch=1-step=16.ckpt", "epoch=2-step=24.ckpt"], names
    newest = d / names[-1]
    for name, step in zip(names, (16, 24)):  # torch files, in both modes
        assert (d / name).is_file()
        ck = torch.load(d / name, weights_only=True)  # stock torch.load
        assert ck["global_step"] == step and ck["optimizer_states"][0]["state"]
    ck = torch.load(newest, weights_only=True)
    again = lc.Tiny.load_from_checkpoint(newest)  # Lightning's own loader, not the plugin
    assert torch.equal(again.net[0].weight, m.net[0].weight)
    for k, v in m.state_dict().items():
        assert torch.equal(ck["state_dict"][k], v), k
    # Resumed into the same directory: saving goes on, and the older of the two is removed
    # (Lightning never removes the checkpoint a run resumed from).
    resume_and_compare(newest, reference, [CheckpointIO(async_save=mode == "async")], d)
    assert sorted(os.listdir(d)) == [names[-1], "epoch=3-step=32.ckpt", "epoch=4-step=40.ckpt"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_inside_lightnings_async_checkpoint_io(tmp_path: pathlib.Path, mode: str) -> None:
    d = tmp_path / "ckpts"
    io = CheckpointIO(async_save=mode == "async")
    m = lc.model()
    lc.trainer(3, [AsyncCheckpointIO(io)], str(d)).fit(m, lc.data())
    io.teardown()  # the wrapper's teardown does not reach the plugin it wraps
    names = sorted(os.listdir(d))
    assert names == ["epoch=1-step=16.ckpt", "epoch=2-step=24.ckpt"], names
    ck = torch.load(d / names[-1], weights_only=True)
    assert ck["global_step"] == 24
    for k, v in m.state_dict().items():
        assert torch.equal(ck["state_dict"][k], v), k


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_fabric_save_and_load(tmp_path: pathlib.Path, mode: str) -> None:
    from lightning.fabric import Fabric

    io = CheckpointIO(async_save=mode == "async")
    fabric = Fabric(accelerator="cpu", devices=1, plugins=[io])
    torch.manual_seed(0)
    m, opt = fabric.setup(*model_and_optimizer())
    m(torch.randn(3, 4)).sum().backward()
    opt.step()
    fabric.save(tmp_path / "s.ckpt", {"model": m, "optim": opt, "step": 7})
    m2, opt2 = fabric.setup(*model_and_optimizer())
    into = {"model": m2, "optim": opt2, "step": 0}
    assert fabric.load(tmp_path / "s.ckpt", into) == {}
    assert into["step"] == 7 and torch.equal(m2.weight, m.weight)
    saved, loaded = opt.state_dict()["state"][0], opt2.state_dict()["state"][0]
    assert torch.equal(loaded["exp_avg"], saved["exp_avg"])


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    m = torch.nn.Linear(4, 2)
    return m, torch.optim.Adam(m.parameters())


def state(v: float) -> dict[str, Any]:
    return {"state_dict": {"w": torch.full((1024,), v)}, "global_step": int(v)}


class Failed:
    """A background save's completion that reports an I/O error once ``ended`` is set."""

    ended = threading.Event()

    def done(self) -> bool:
        return self.ended.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        if not self.ended.wait(timeout):
            return None
        raise ckptio.CheckpointIOError("disk on fire", -5, "EIO")

    def close(self) -> None:
        pass


@pytest.fixture
def failing(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Every background save fails once the event is set."""

    def start(snap: Any, zw: Any, records: Any) -> Failed:
        zw.close()  # the writer aborts: nothing is published
        snap.free()
        return Failed()

    Failed.ended = threading.Event()
    monkeypatch.setattr(ckptio.torch, "_start_zip_commit", start)
    return Failed.ended


@pytest.mark.parametrize("then", ["save", "load", "teardown"])
def test_background_error_surfaces_once_on_the_next_call(
    tmp_path: pathlib.Path, failing: threading.Event, then: str
) -> None:
    io = CheckpointIO(async_save=True)
    torch.save(state(0), tmp_path / "old.ckpt")
    io.save_checkpoint(state(1), tmp_path / "a.ckpt")  # returns: the failure comes later
    io.remove_checkpoint(tmp_path / "old.ckpt")  # held back until a.ckpt is committed
    assert (tmp_path / "old.ckpt").exists()
    failing.set()
    with pytest.raises(ckptio.CheckpointIOError, match="disk on fire"):
        if then == "save":
            io.save_checkpoint(state(2), tmp_path / "b.ckpt")
        elif then == "load":
            io.load_checkpoint(tmp_path / "old.ckpt")
        else:
            io.teardown()
    assert not (tmp_path / "a.ckpt").exists() and not (tmp_path / "b.ckpt").exists()
    assert (tmp_path / "old.ckpt").exists()  # a.ckpt failed: the older one stays
    io.teardown()  # raised once, not twice
    assert io.load_checkpoint(tmp_path / "old.ckpt")["global_step"] == 0


def test_removal_waits_for_the_save_in_flight(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    hold(monkeypatch, gate, "_start_zip_commit", ckptio.torch)  # no byte written until the gate opens
    io = CheckpointIO(async_save=True)
    old, new = tmp_path / "old.ckpt", tmp_path / "new.ckpt"
    CheckpointIO().save_checkpoint(state(1), old)
    io.save_checkpoint(state(2), new)
    io.remove_checkpoint(old)
    assert old.is_file() and not new.exists()  # removed only once new.ckpt is committed
    gate.set()
    io.teardown()
    assert not old.exists() and new.is_file()
    assert io.load_checkpoint(new)["global_step"] == 2
    # Removing the path being written waits for that save, then removes it.
    gate.clear()
    io.save_checkpoint(state(3), new)
    threading.Timer(0.3, gate.set).start()
    io.remove_checkpoint(new)
    assert not new.exists() and leftovers(tmp_path) == []


def test_exit_finishes_the_save_and_its_removals(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = threading.Event()
    hold(monkeypatch, gate, "_start_zip_commit", ckptio.torch)
    io = CheckpointIO(async_save=True)
    old, new = tmp_path / "old.ckpt", tmp_path / "new.ckpt"
    CheckpointIO().save_checkpoint(state(1), old)
    io.save_checkpoint(state(2), new)
    io.remove_checkpoint(old)
    threading.Timer(0.3, gate.set).start()
    ckptio.lightning._finish_at_exit(weakref.ref(io))  # what interpreter exit runs
    assert not old.exists() and io.load_checkpoint(new)["global_step"] == 2
    assert capsys.readouterr().err == ""


def test_exit_prints_an_error_no_call_took(
    tmp_path: pathlib.Path, failing: threading.Event, capsys: pytest.CaptureFixture[str]
) -> None:
    io = CheckpointIO(async_save=True)
    io.save_checkpoint(state(1), tmp_path / "a.ckpt")
    failing.set()
    ckptio.lightning._finish_at_exit(weakref.ref(io))
    assert "save FAILED: disk on fire" in capsys.readouterr().err
    io.teardown()  # reported once


def test_an_older_async_checkpoint_is_replaced_atomically(tmp_path: pathlib.Path) -> None:
    """A ckptio checkpoint directory that async_save=True wrote before 0.3: still loaded, and
    replaced by the torch file a save writes at its path (removed once that is committed)."""
    p = tmp_path / "last.ckpt"
    ckptio.save(state(1), p)  # what async_save=True wrote before
    assert is_async_checkpoint(p)
    for io in (CheckpointIO(), CheckpointIO(async_save=True)):
        assert io.load_checkpoint(p)["global_step"] == 1
        io.save_checkpoint(state(2), p)
        io.teardown()
        assert p.is_file() and torch.load(p, weights_only=True)["global_step"] == 2
        assert os.listdir(tmp_path) == ["last.ckpt"]
        shutil.rmtree(p) if p.is_dir() else p.unlink()
        ckptio.save(state(1), p)


def test_an_older_checkpoint_stays_when_the_background_save_fails(
    tmp_path: pathlib.Path, failing: threading.Event
) -> None:
    """The older ckptio directory moved aside for a background save comes back, under its own
    name, when that save fails: nothing named `.replaced-<pid>` is left."""
    p = tmp_path / "last.ckpt"
    ckptio.save(state(1), p)
    io = CheckpointIO(async_save=True)
    io.save_checkpoint(state(2), p)
    failing.set()
    with pytest.raises(ckptio.CheckpointIOError, match="disk on fire"):
        io.teardown()
    assert os.listdir(tmp_path) == ["last.ckpt"] and is_async_checkpoint(p)
    assert io.load_checkpoint(p)["global_step"] == 1


def test_async_keeps_what_only_pickle_holds(tmp_path: pathlib.Path) -> None:
    """Hyperparameters of any picklable type are kept in the background too (a torch file)."""
    io = CheckpointIO(async_save=True)
    ck = {**state(4), "hyper_parameters": {"args": argparse.Namespace(lr=0.1)}}
    io.save_checkpoint(ck, tmp_path / "x.ckpt")
    io.teardown()
    back = io.load_checkpoint(tmp_path / "x.ckpt", weights_only=False)
    assert back["hyper_parameters"]["args"].lr == 0.1 and back["global_step"] == 4


def test_options_and_missing_files(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(TypeError, match="unknown io_options"):
        CheckpointIO(io_options={"bogus": 1})
    io = CheckpointIO(io_options={"crc32": False, "fsync": True})
    io.save_checkpoint(state(5), tmp_path / "sub" / "y.ckpt", storage_options={"direct": False})
    assert io.load_checkpoint(tmp_path / "sub" / "y.ckpt", map_location="cpu")["global_step"] == 5
    with pytest.raises(FileNotFoundError):
        io.load_checkpoint(tmp_path / "nothing.ckpt")
    # Without map_location (the Trainer passes none), storages stay on the CPU, as with
    # Lightning's own plugin: a checkpoint saved on a GPU loads on a machine without one.
    seen: dict[str, Any] = {}
    real = ckptio.torch.load
    monkeypatch.setattr(ckptio.torch, "load", lambda p, **kw: seen.update(kw) or real(p, **kw))
    io.load_checkpoint(tmp_path / "sub" / "y.ckpt")
    storage = torch.UntypedStorage(4)
    assert seen["map_location"](storage, "cuda:0") is storage
    io.remove_checkpoint(tmp_path / "nothing.ckpt")  # nothing there: no error, as Lightning's


def head(f: pathlib.Path) -> bytes:
    with open(f, "rb") as fh:
        return fh.read(1 << 20)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_save_killed_mid_write_keeps_the_previous_checkpoint(
    tmp_path: pathlib.Path, reference: Any, mode: str
) -> None:
    d = tmp_path / "ckpts"
    # Every epoch saves epoch=E-step=S.ckpt, then overwrites last.ckpt: the 6th save is
    # last.ckpt at the end of epoch 2, killed once part of it is on disk.
    res = subprocess.run([sys.executable, str(CHILD), str(d), mode, "4", "6"],
                         capture_output=True, text=True, timeout=240)  # fmt: skip
    assert res.returncode == -signal.SIGKILL, res.stderr[-3000:]
    left = [d / n for n in leftovers(d)]
    files = [f for t in left for f in [t, *sorted(t.rglob("*"))] if f.is_file()]
    # Its files are allocated whole at the start: data, not only their size, shows the writes.
    assert files and any(head(f).strip(b"\0") for f in files), left
    load = lambda p: torch.load(p, weights_only=True)  # noqa: E731
    assert load(d / "last.ckpt")["global_step"] == 16  # the previous last.ckpt, whole
    assert load(d / "epoch=2-step=24.ckpt")["global_step"] == 24
    # fit(ckpt_path="last"): Lightning's own search of the directory finds last.ckpt (and
    # none of the killed save's files).
    io = CheckpointIO(async_save=mode == "async")
    resume_and_compare("last", reference, [io], d, pad_mib=lc.PAD_MIB)


def test_docstring_example() -> None:
    result = doctest.testmod(ckptio.lightning, optionflags=doctest.ELLIPSIS)
    assert result.attempted and result.failed == 0


def test_doc_example_runs(tmp_path: pathlib.Path) -> None:
    doc = pathlib.Path(__file__).resolve().parents[2] / "doc" / "lightning.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)
    assert len(blocks) == 2
    for code in blocks:
        exec(compile(code.replace("/tmp/ckptio-lightning", str(tmp_path)), str(doc), "exec"), {})
    assert sorted(os.listdir(tmp_path / "run")) == [
        "epoch=2-step=12.ckpt", "epoch=3-step=16.ckpt", "epoch=4-step=20.ckpt"
    ]
