# SPDX-License-Identifier: Apache-2.0
"""ckptio.deepspeed: DeepSpeed jobs on gloo ranks save through ckptio and resume exactly where they stopped.

Each test launches tests/python/ds_train.py as the ranks of a job (subprocesses, a free port,
bounded in time) with several runs batched into one process, since importing DeepSpeed costs
seconds. A resumed run's losses must equal, bit for bit, those of a run that never stopped.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed"
)

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).with_name("ds_train.py")
STAGES = (0, 1, 2, 3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_PORTS: list[int] = []  # the launches' MASTER_PORTs


@pytest.fixture(autouse=True)
def _no_shared_memory_left() -> Any:
    """DeepSpeed's CPU all-reduce leaves a 64 MiB /dev/shm buffer named after MASTER_ADDR and
    MASTER_PORT per launch: removed after each test, so that runs do not fill the host's RAM."""
    yield
    for port in _PORTS:
        for f in glob.glob(f"/dev/shm/deepspeed_*_127.0.0.1_{port}_*"):
            with contextlib.suppress(OSError):
                os.unlink(f)
    _PORTS.clear()


def _start(jobs: list[dict[str, Any]], world: int, out: Path) -> list[subprocess.Popen[bytes]]:
    out.parent.mkdir(parents=True, exist_ok=True)
    spec = out.with_suffix(".jobs.json")
    spec.write_text(json.dumps(jobs))
    port = _free_port()
    _PORTS.append(port)
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                   OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        log = open(f"{out}.{rank}.log", "wb")
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT), str(spec), str(out)],
                                      env=env, stdout=log, stderr=subprocess.STDOUT))
        log.close()
    return procs


def _finish(procs: list[subprocess.Popen[bytes]], out: Path, timeout: float) -> list[int]:
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return codes


def _results(out: Path, rank: int) -> list[dict[str, Any]]:
    return list(json.loads(Path(f"{out}.{rank}.json").read_text()))


def _log(out: Path, rank: int) -> str:
    return Path(f"{out}.{rank}.log").read_text(errors="replace")[-4000:]


def _run(jobs: list[dict[str, Any]], world: int, out: Path, timeout: float = 240) -> list[Any]:
    codes = _finish(_start(jobs, world, out), out, timeout)
    for rank, rc in enumerate(codes):
        assert rc == 0, f"rank {rank} exited with {rc}:\n{_log(out, rank)}"
    return [_results(out, r) for r in range(world)]


def _tail(losses: dict[str, str], after: int) -> dict[str, str]:
    return {k: v for k, v in losses.items() if int(k) > after}


def _check_files(save_dir: Path, tags: list[str]) -> None:
    """Every file stock torch.load reads; no temporary file left; ``latest`` names tags[-1]."""
    assert (save_dir / "latest").read_text() == tags[-1]
    for tag in tags:
        files = sorted((save_dir / tag).iterdir())
        assert files, tag
        for f in files:
            assert ".tmp-" not in f.name, f
            sd = torch.load(f, map_location="cpu", weights_only=False)
            assert isinstance(sd, dict) and sd, f


def _resume_jobs(root: Path, stage: int, **extra: Any) -> list[dict[str, Any]]:
    d = str(root / f"z{stage}{'d' if extra.get('decoupled') else ''}")
    # Decoupled: step 3's snapshot reuses the memory of step 1's.
    save_at = [1, 3] if extra.get("decoupled") else [3]
    return [{"stage": stage, "dir": d, "steps": 6, "save_at": save_at, **extra},
            {"stage": stage, "dir": d, "steps": 6, "resume": True}]


def test_one_rank_every_stage_resumes_exactly(tmp_path: Path) -> None:
    jobs: list[dict[str, Any]] = []
    for stage in STAGES:
        jobs += _resume_jobs(tmp_path, stage)
    jobs += _resume_jobs(tmp_path, 2, decoupled=True)
    # DeepSpeed's own readers: zero_to_fp32 (ZeRO 3 here) and the universal checkpoint.
    jobs.append({"stage": 3, "dir": str(tmp_path / "fp32"), "steps": 2, "save_at": [2],
                 "fp32_check": True})
    jobs.append({"stage": 1, "dir": str(tmp_path / "z1"), "steps": 6, "resume": True,
                 "universal": "global_step3"})
    (res,) = _run(jobs, 1, tmp_path / "out")
    for i, stage in enumerate((*STAGES, 2)):
        full, resumed = res[2 * i], res[2 * i + 1]
        assert resumed["loaded"].endswith(".pt") and "global_step3" in resumed["loaded"], stage
        assert resumed["client"] == 3
        assert resumed["losses"] == _tail(full["losses"], 3), f"ZeRO {stage}"
        assert list(resumed["losses"]) == ["4", "5", "6"]
    # The decoupled save changes nothing in training: the same losses as a synchronous one.
    assert res[8]["losses"] == res[4]["losses"]
    assert res[10]["fp32_equal"]
    universal = res[11]
    assert "global_step3_universal" in universal["loaded"]
    assert universal["losses"] == _tail(res[2]["losses"], 3)
    for stage in STAGES:
        _check_files(tmp_path / f"z{stage}", ["global_step3"])
    _check_files(tmp_path / "z2d", ["global_step1", "global_step3"])


def test_two_ranks_every_stage_resumes_exactly(tmp_path: Path) -> None:
    jobs: list[dict[str, Any]] = []
    for stage in STAGES:
        jobs += _resume_jobs(tmp_path, stage)
    jobs += _resume_jobs(tmp_path, 3, decoupled=True)
    per_rank = _run(jobs, 2, tmp_path / "out")
    for rank, res in enumerate(per_rank):
        for i, stage in enumerate((*STAGES, 3)):
            full, resumed = res[2 * i], res[2 * i + 1]
            assert "global_step3" in resumed["loaded"], (rank, stage)
            assert resumed["losses"] == _tail(full["losses"], 3), f"rank {rank}, ZeRO {stage}"
            assert list(resumed["losses"]) == ["4", "5", "6"]
    _check_files(tmp_path / "z3d", ["global_step1", "global_step3"])
    for stage in STAGES:
        d = tmp_path / f"z{stage}"
        _check_files(d, ["global_step3"])
        names = sorted(f.name for f in (d / "global_step3").iterdir())
        if stage:  # each rank wrote its own ZeRO shard
            assert sum("optim_states" in n for n in names) == 2, names


def test_save_killed_mid_write_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    """SIGKILL while step 4's first file is half written (synchronous), or once the engine's
    thread has begun writing it (decoupled: it may have finished by then): ``latest`` names
    step 2, which a fresh process resumes from exactly; no file is left half written."""
    runs = {}
    for mode in ("sync", "decoupled"):
        job = {"stage": 2, "dir": str(tmp_path / mode), "steps": 6, "save_at": [2, 4],
               "decoupled": mode == "decoupled", "kill": {"step": 4, "after_bytes": 6000}}
        runs[mode] = _start([job], 1, tmp_path / f"kill-{mode}")
    for mode, procs in runs.items():
        (rc,) = _finish(procs, tmp_path / f"kill-{mode}", 240)
        assert rc == -signal.SIGKILL, f"{mode}: exited with {rc}:\n{_log(tmp_path / f'kill-{mode}', 0)}"
        save_dir = tmp_path / mode
        _check_files(save_dir, ["global_step2"])
        step4 = save_dir / "global_step4"
        done = [f for f in step4.iterdir() if ".tmp-" not in f.name] if step4.exists() else []
        if mode == "sync":
            assert "mp_rank_00_model_states.pt" not in [f.name for f in done], done
        for f in done:  # what was published is whole
            assert torch.load(f, map_location="cpu", weights_only=False), f

    jobs: list[dict[str, Any]] = [{"stage": 2, "dir": str(tmp_path / "ref"), "steps": 6}]
    jobs += [{"stage": 2, "dir": str(tmp_path / m), "steps": 6, "resume": True} for m in runs]
    (res,) = _run(jobs, 1, tmp_path / "resume")
    for r in res[1:]:
        assert "global_step2" in r["loaded"]
        assert r["losses"] == _tail(res[0]["losses"], 2)


def test_install_refuses_what_it_does_not_know() -> None:
    import ckptio.deepspeed as cds

    with pytest.raises(TypeError, match="not a DeepSpeed engine this module knows"):
        cds.install(object())
    with pytest.raises(TypeError, match="unknown io_options"):
        cds.CheckpointEngine(io_options={"nope": 1})


def test_decoupled_snapshot_and_failed_saves(tmp_path: Path) -> None:
    """In one process, no DeepSpeed engine: the decoupled copy is independent of the caller's
    tensors (views still share one storage), and a failed save never moves ``latest``."""
    import ckptio.deepspeed as cds
    from deepspeed.runtime.checkpoint_engine import CheckpointCommitInfo

    base = torch.arange(12, dtype=torch.float32)
    state = {"a": base[:6], "b": base[6:].view(2, 3), "opt": {"step": 3}}
    ce = cds.CheckpointEngine(decoupled=True)
    threads = set(threading.enumerate())
    (tmp_path / "t1").mkdir()
    for tag in ("t1", "t2"):  # t2's copy goes into the storage kept from t1
        info = CheckpointCommitInfo(tag=tag, save_dir=str(tmp_path), save_latest=True)
        ce.create(info)
        (tmp_path / tag).mkdir(exist_ok=True)
        ce.save(state, str(tmp_path / tag / "s.pt"))
        ce.save({"other": base[:2]}, str(tmp_path / tag / "o.pt"))  # beside the first
        assert set(threading.enumerate()) == threads  # written by the C engine's threads
        base.add_(100)  # changed at once; the checkpoint keeps the values at save()
        state["opt"]["step"] += 1
        assert ce.get_commit_info() is info
        ce.commit(info)
        assert (tmp_path / "latest").read_text() == tag
        back = torch.load(tmp_path / tag / "s.pt", weights_only=False)
        first = torch.arange(12, dtype=torch.float32) + (0 if tag == "t1" else 100)
        assert torch.equal(back["a"], first[:6]) and torch.equal(back["b"].flatten(), first[6:])
        assert back["a"].untyped_storage().data_ptr() == back["b"].untyped_storage().data_ptr()
        assert back["opt"]["step"] == (3 if tag == "t1" else 4)
        assert torch.equal(torch.load(tmp_path / tag / "o.pt")["other"], first[:2])
    # Two pools, one per file; t2's copies reused t1's buffers.
    assert len(ce._pools) == 2 and all(pl.pool.stats().allocations == 1 for pl in ce._pools)

    bad = CheckpointCommitInfo(tag="t3", save_dir=str(tmp_path), save_latest=True)
    ce.create(bad)
    ce.save(state, str(tmp_path / "t3" / "s.pt"))  # no such directory: fails in the background
    with pytest.raises(RuntimeError):
        ce.commit(bad)
    assert (tmp_path / "latest").read_text() == "t2"
    ce.cleanup()

    sync = cds.CheckpointEngine()
    sync.create(bad)
    with pytest.raises(RuntimeError):
        sync.save(state, str(tmp_path / "t3" / "s.pt"))
    sync.cleanup()  # the failed checkpoint is not committed
    assert (tmp_path / "latest").read_text() == "t2"
    assert not [p.name for p in tmp_path.rglob("*.tmp-*")]
