# SPDX-License-Identifier: Apache-2.0
"""ckptio.hf: Trainer checkpoints and resume through ckptio, killed saves, accelerate state."""

from __future__ import annotations

import inspect
import json
import os
import pathlib
import pickle
import signal
import socket
import subprocess
import sys
import zipfile
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")

import safetensors.torch  # noqa: E402
from transformers.trainer_utils import get_last_checkpoint  # noqa: E402

import ckptio.hf  # noqa: E402
import ckptio.safetensors as cst  # noqa: E402
import ckptio.torch as ct  # noqa: E402

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))
import hf_trainer_run as run  # noqa: E402

STEPS = [2, 4, 6]


def weights(trainer: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def written_by_ckptio_safetensors(path: pathlib.Path) -> bool:
    """ckptio's safetensors writer pads the header so that the data starts on 4096 bytes."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
    return (8 + n) % 4096 == 0


def written_by_ckptio_torch(path: pathlib.Path) -> bool:
    """ckptio.torch.save aligns every storage record of the zip archive to 4096 bytes."""
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        starts = []
        for info in z.infolist():
            if "/data/" not in info.filename:
                continue
            f.seek(info.header_offset + 26)
            name_len, extra_len = (int.from_bytes(f.read(2), "little") for _ in range(2))
            starts.append(info.header_offset + 30 + name_len + extra_len)
    return bool(starts) and all(s % 4096 == 0 for s in starts)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An uninterrupted run of MAX_STEPS with ckptio installed: its checkpoints, final weights
    and losses."""
    out = tmp_path_factory.mktemp("hf-ref")
    trainer = run.make_trainer(str(out), save_total_limit=2)
    trainer.train()
    return {"out": out, "weights": weights(trainer), "losses": run.losses(trainer)}


def test_checkpoints_through_ckptio(reference: dict[str, Any]) -> None:
    out: pathlib.Path = reference["out"]
    # save_total_limit=2 kept the two newest; nothing hidden is left over.
    assert sorted(os.listdir(out)) == ["checkpoint-4", "checkpoint-6"]
    ck = out / "checkpoint-4"
    names = set(os.listdir(ck))
    assert {"model.safetensors", "config.json", "optimizer.pt", "scheduler.pt", "rng_state.pth",
            "trainer_state.json", "training_args.bin"} <= names  # fmt: skip
    assert written_by_ckptio_safetensors(ck / "model.safetensors")
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"):
        assert zipfile.ZipFile(ck / name).testzip() is None, name
    assert written_by_ckptio_torch(ck / "optimizer.pt")
    # Stock readers: safetensors, torch.load, from_pretrained.
    stock = safetensors.torch.load_file(ck / "model.safetensors")
    model = transformers.GPT2LMHeadModel.from_pretrained(ck)
    got = model.state_dict()
    for k, v in stock.items():
        assert torch.equal(got[k], v), k
    opt = torch.load(ck / "optimizer.pt", weights_only=True)
    assert opt["state"] and all("exp_avg" in s for s in opt["state"].values())
    state = json.loads((ck / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    assert ckptio.load(ck / "model.safetensors", keys=["transformer.h.0"])  # and ckptio reads it


def test_resume_is_exact_and_reads_through_ckptio(
    reference: dict[str, Any], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    for mod, name in ((ct, "load"), (cst, "load_file")):
        real = getattr(mod, name)

        def spy(f: Any, *a: Any, _real: Any = real, **k: Any) -> Any:
            calls.append(os.path.basename(os.fspath(f)))
            return _real(f, *a, **k)

        monkeypatch.setattr(mod, name, spy)
    trainer = run.make_trainer(str(tmp_path))
    trainer.train(resume_from_checkpoint=str(reference["out"] / "checkpoint-4"))
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"} <= set(calls)
    assert_same(weights(trainer), reference["weights"])
    want = reference["losses"]
    assert {s: run.losses(trainer)[s] for s in (5, 6)} == {s: want[s] for s in (5, 6)}
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-6"]


def test_stock_and_ckptio_checkpoints_interchange(
    reference: dict[str, Any], tmp_path: pathlib.Path
) -> None:
    """A stock Trainer resumes from ckptio's checkpoint, an installed one from a stock one;
    a stock run ends with the weights of an installed run."""
    stock = run.make_trainer(str(tmp_path / "stock"), install=False)
    stock.train()
    assert_same(weights(stock), reference["weights"])
    assert not written_by_ckptio_safetensors(tmp_path / "stock/checkpoint-4/model.safetensors")
    for src, install in ((reference["out"], False), (tmp_path / "stock", True)):
        trainer = run.make_trainer(str(tmp_path / f"from-{install}"), install=install)
        trainer.train(resume_from_checkpoint=str(src / "checkpoint-4"))
        assert_same(weights(trainer), reference["weights"])


def child_env() -> dict[str, str]:
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path)


def killed_run(out: pathlib.Path, *args: str) -> None:
    """Run hf_trainer_run.py in a child process that must die of SIGKILL."""
    p = subprocess.run([sys.executable, str(HERE / "hf_trainer_run.py"), str(out), *args],
                       env=child_env(), capture_output=True, text=True, timeout=240)  # fmt: skip
    assert p.returncode == -signal.SIGKILL, p.stderr[-3000:]


def test_killed_saves_leave_previous_checkpoint_resumable(
    reference: dict[str, Any], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp4, tmp6 = (f".checkpoint-{s}{ckptio.hf.TEMP_SUFFIX}" for s in (4, 6))
    # Killed in the save of step 4 with some files written: they sit in the hidden temporary
    # directory only, and the last checkpoint is still checkpoint-2.
    killed_run(tmp_path, "--kill-at", "4")
    assert sorted(os.listdir(tmp_path)) == [tmp4, "checkpoint-2"]
    partial = set(os.listdir(tmp_path / tmp4))
    assert "model.safetensors" in partial and "trainer_state.json" not in partial
    assert get_last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-2")
    # Resumed from it, and the save of step 6 fails once every file is written and durable,
    # before the rename: checkpoint-4 is the last one (the leftover of step 4 was swept by
    # the save of step 4).
    fsync_tree = ckptio.hf._fsync_tree

    def fsync_then_fail(path: str) -> None:
        fsync_tree(path)
        if path.endswith(tmp6):
            raise OSError("injected: the save dies before its rename")

    monkeypatch.setattr(ckptio.hf, "_fsync_tree", fsync_then_fail)
    with pytest.raises(OSError, match="injected"):
        run.make_trainer(str(tmp_path)).train(resume_from_checkpoint=True)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == [tmp6, "checkpoint-2", "checkpoint-4"]
    assert "trainer_state.json" in os.listdir(tmp_path / tmp6)
    assert get_last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-4")
    # A fresh run resumes from the newest complete checkpoint and ends where the
    # uninterrupted run ended.
    trainer = run.make_trainer(str(tmp_path))
    trainer.train(resume_from_checkpoint=True)
    assert_same(weights(trainer), reference["weights"])
    assert sorted(os.listdir(tmp_path)) == [f"checkpoint-{s}" for s in STEPS]


def test_two_ranks_save_and_resume(tmp_path: pathlib.Path) -> None:
    """Two gloo ranks: each writes its RNG state into the checkpoint being written, which is
    published once all have; a resume on two ranks continues exactly."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(port),
           str(HERE / "hf_trainer_run.py"), str(tmp_path), "--ranks"]  # fmt: skip
    p = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))
    got = json.loads(line[len("RESULT ") :])
    assert got["same"]
    assert got["dirs"] == [f"checkpoint-{s}" for s in STEPS]
    want = {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors", "optimizer.pt"}
    assert want <= set(got["files"])


def test_hub_push_sees_the_published_checkpoint(tmp_path: pathlib.Path) -> None:
    """The checkpoint's Hub push (a background upload of the folder, by its name) runs once
    the folder is checkpoint-N and complete."""
    trainer = run.make_trainer(str(tmp_path), max_steps=2)
    trainer.args.push_to_hub = True  # after __init__: no repository is created
    seen: list[tuple[str, bool]] = []
    trainer._push_from_checkpoint = lambda folder: seen.append(
        (folder, os.path.isfile(os.path.join(folder, "trainer_state.json")))
    )
    trainer.train()
    trainer.args.push_to_hub = False
    assert seen == [(str(tmp_path / "checkpoint-2"), True)]


def test_best_checkpoint_and_final_save(tmp_path: pathlib.Path) -> None:
    """load_best_model_at_end: the best checkpoint is recorded under its final name, kept by
    the rotation and loaded at the end through ckptio; save_model() writes through ckptio."""
    trainer = run.make_trainer(
        str(tmp_path), evaluate=True, eval_strategy="steps", eval_steps=2, save_total_limit=2,
        load_best_model_at_end=True, metric_for_best_model="loss", greater_is_better=True,
    )  # fmt: skip
    trainer.train()
    # greater_is_better on the loss: the first evaluation's (the highest loss) stays best.
    best = str(tmp_path / "checkpoint-2")
    assert trainer.state.best_model_checkpoint == best
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2", "checkpoint-6"]
    saved = json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())
    assert saved["best_model_checkpoint"] == best
    assert_same(weights(trainer), cst.load_file(tmp_path / "checkpoint-2" / "model.safetensors")
                | {"lm_head.weight": weights(trainer)["lm_head.weight"]})  # fmt: skip
    trainer.save_model(str(tmp_path / "final"))
    assert written_by_ckptio_safetensors(tmp_path / "final" / "model.safetensors")


def test_routing_is_scoped(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside the methods install() wraps, torch.save and safetensors are the originals."""
    run.make_trainer(str(tmp_path))  # installs the routes
    called: list[str] = []
    monkeypatch.setattr(ct, "save", lambda *a, **k: called.append("ckptio"))
    torch.save({"x": torch.ones(3)}, tmp_path / "plain.pt")
    safetensors.torch.save_file({"x": torch.ones(3)}, tmp_path / "plain.safetensors")
    assert called == []
    assert not written_by_ckptio_safetensors(tmp_path / "plain.safetensors")
    assert torch.equal(torch.load(tmp_path / "plain.pt")["x"], torch.ones(3))
    # The stand-ins keep the originals' signatures and pickle as references to the names.
    assert inspect.signature(torch.save) == inspect.signature(torch.save.__ckptio_original__)
    assert pickle.loads(pickle.dumps(torch.save)) is torch.save
    assert pickle.loads(pickle.dumps(safetensors.torch.load_file)) is safetensors.torch.load_file


def test_install_refuses_what_is_not_a_trainer() -> None:
    with pytest.raises(TypeError, match="not a transformers 5.x Trainer"):
        ckptio.hf.install(object())
    with pytest.raises(TypeError, match="not an Accelerator"):
        ckptio.hf.install_accelerate(object())


# ---- accelerate ----------------------------------------------------------------------


def accel_setup() -> tuple[Any, Any, Any, Any, Any]:
    from accelerate import Accelerator

    acc = ckptio.hf.install_accelerate(Accelerator(cpu=True))
    model = run.tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=10)
    loader = torch.utils.data.DataLoader(run.Tokens(), batch_size=2, shuffle=False)
    model, opt, sched, loader = acc.prepare(model, opt, sched, loader)
    return acc, model, opt, sched, loader


def accel_steps(acc: Any, model: Any, opt: Any, sched: Any, batches: list[Any]) -> list[float]:
    out = []
    model.train()  # dropout on: the RNG state matters
    for b in batches:
        loss = model(**b).loss
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def test_accelerate_save_and_load_state(tmp_path: pathlib.Path) -> None:
    acc, model, opt, sched, loader = accel_setup()
    batches = list(loader)
    accel_steps(acc, model, opt, sched, batches[:2])
    where = tmp_path / "state"
    assert acc.save_state(str(where)) == where
    names = set(os.listdir(where))
    assert {"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"} <= names
    assert sorted(os.listdir(tmp_path)) == ["state"]  # no temporary left
    assert written_by_ckptio_safetensors(where / "model.safetensors")
    assert written_by_ckptio_torch(where / "optimizer.bin")
    stock = safetensors.torch.load_file(where / "model.safetensors")
    now = acc.unwrap_model(model).state_dict()
    assert_same(stock, {k: v for k, v in now.items() if k in stock})
    assert torch.load(where / "optimizer.bin", weights_only=True)["state"]

    after_save = weights_of(model)
    first = accel_steps(acc, model, opt, sched, batches[2:4])
    acc.load_state(str(where))
    assert_same(weights_of(model), after_save)
    again = accel_steps(acc, model, opt, sched, batches[2:4])
    assert first == again  # optimizer, scheduler and RNG state came back too

    # load_state's keywords reach the models' load_state_dict.
    model.register_buffer("extra", torch.zeros(1))
    with pytest.raises(RuntimeError, match="extra"):
        acc.load_state(str(where))
    acc.load_state(str(where), strict=False)
    del model.extra

    # Saving again replaces the directory, once the new one is complete.
    acc.save_state(str(where))
    assert_same(cst.load_file(where / "model.safetensors"), weights_of(model))
    assert sorted(os.listdir(tmp_path)) == ["state"]


def weights_of(model: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
