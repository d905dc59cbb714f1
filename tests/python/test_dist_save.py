# SPDX-License-Identifier: Apache-2.0
"""ckptio.save(comm=...) and ckptio.load on real runtimes: torch.distributed (gloo, CPU, ranks
launched here), JAX (2 processes x 4 CPU devices) and mpi4py (4 ranks under mpirun); and the
one-process forms (ckptio.Shard, ckptio.RankLocal without comm=). Every launch is bounded and
listens on 127.0.0.1 only; the rank programs are in tests/python/dist/."""

from __future__ import annotations

import errno
import importlib.util
import os
import pathlib
import shutil
import sys
import threading
from typing import Any

import numpy as np
import pytest

import ckptio
from ckptio.ranks import _dist
from test_comm_dist import DIST, LAUNCH_TIMEOUT, free_port, launch, results, run_ranks


def torch_env(n: int) -> list[dict[str, str]]:
    port = free_port()
    return [dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(n),
                 GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1") for r in range(n)]


def no_error(res: dict[int, dict], ranks: int) -> None:
    assert sorted(res) == list(range(ranks)), res
    for r, v in res.items():
        assert "error" not in v, (r, v)


def test_torch_gloo(tmp_path: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    out = tmp_path / "out"
    out.mkdir()
    argv = [sys.executable, str(DIST / "save_torch.py"), "four", str(tmp_path)]
    launch([argv] * 4, torch_env(4), out)

    no_error(results(out, "save"), 4)
    # Loaded on the same 4 ranks into other placements, with each rank's own state.
    load4 = results(out, "load4")
    no_error(load4, 4)
    for r, v in load4.items():
        assert v["w_ok"] and v["b_ok"], v
        assert v["b_local"] == [[0.0, 0.5], [1.0, 1.5], [2.0, 2.5], []][r]
        assert v["e"] == [1, 1, 1] and v["step"] == 7
        assert v["rng"] == [[100 + r], r]
    # Diverging replicas: every rank fails with the same message naming tensor and ranks.
    div = results(out, "diverge")
    assert sorted(div) == [0, 1, 2, 3]
    for v in div.values():
        assert v["error"] == "DuplicateTensor", v
        assert "tensor 'stats'" in v["message"] and "ranks 0 and 2" in v["message"], v
    assert len({v["message"] for v in div.values()}) == 1
    # `if rank == 0: ckptio.save(plain tree)` in a job of 4 ranks saves from rank 0 alone.
    no_error(results(out, "rank0"), 1)
    assert ckptio.load(tmp_path / "rank0")["step"] == 1
    # The last rank raised in its own code before the save: the others fail within 3 s.
    absent = results(out, "absent")
    assert absent[3]["error"] == "RuntimeError"
    for r in range(3):
        assert absent[r]["code"] == -errno.ETIMEDOUT, absent[r]
        assert "within 3 s" in absent[r]["message"], absent[r]
    assert not any(v["absent"] for v in results(out, "published").values())
    assert not (tmp_path / "absent").exists()

    # One plain process: full tensors, every rank's state.
    full = ckptio.load(tmp_path / "ckpt")
    assert torch.equal(full["model"]["w"], torch.arange(48, dtype=torch.float32).reshape(8, 6))
    assert torch.equal(full["model"]["b"], torch.arange(6, dtype=torch.float64) * 0.5)
    assert full["model"]["e"].dtype == torch.int32 and full["step"] == 7 and full["lr"] == 0.5
    assert {r: (s["seed"].item(), s["n"]) for r, s in full["rng"].items()} == {
        r: (100 + r, r) for r in range(4)
    }

    # 3 ranks: other placements; then a rank killed in the middle of a save.
    out3 = tmp_path / "out3"
    out3.mkdir()
    argv = [sys.executable, str(DIST / "save_torch.py"), "three", str(tmp_path)]
    launch_killed([argv] * 3, torch_env(3), out3)
    load3 = results(out3, "load3")
    no_error(load3, 3)
    cols = [[0, 1], [2, 3], [4, 5]]
    w = np.arange(48, dtype=np.float32).reshape(8, 6)
    for r, v in load3.items():
        assert v["w_ok"] and v["b_ok"], v
        assert v["w_local"] == w[:, cols[r]].tolist()
        assert v["rng"] == [[100 + r], r]
    no_error(results(out3, "first"), 3)
    killed = results(out3, "killed")
    assert sorted(killed) == [0, 2], killed  # rank 1 died before reporting
    for v in killed.values():  # gloo tells them the peer is gone, or the agree times out
        assert v["error"] == "CheckpointIOError", v
        assert v["code"] in (-errno.ECONNRESET, -errno.ETIMEDOUT, -errno.ECOMM), v
    after = results(out3, "after")[0]
    assert after["step"] == 1 and after["w_ok"], after
    assert after["entries"] == ["ckpt", "killed", "out", "out3", "rank0"], after  # no temporary


def test_torch_mesh_of_one_process(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("torch")
    argv = [sys.executable, str(DIST / "save_torch.py"), "one", str(tmp_path)]
    launch([argv], torch_env(1), tmp_path)
    res = results(tmp_path, "one")
    no_error(res, 1)
    assert res[0]["full_ok"] and res[0]["param"] and res[0]["dtensor"], res


def launch_killed(argvs: list[list[str]], env: list[dict[str, str]], out: pathlib.Path) -> None:
    """launch(), where rank 1 is expected to die by SIGKILL."""
    codes, tails = run_ranks(argvs, env, out)
    assert codes == [0, -9, 0], f"exit codes {codes}:\n{tails}"


def test_one_process_shard_and_rank_local(tmp_path: pathlib.Path) -> None:
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    tree = {"w": ckptio.Shard(a, (0, 0), (4, 6)), "step": 3,
            "rng": ckptio.RankLocal({"s": np.arange(3), "k": "x"})}
    ckptio.save(tree, tmp_path / "c")
    out = ckptio.load(tmp_path / "c")
    assert np.array_equal(out["w"], a) and out["step"] == 3
    assert list(out["rng"]) == [0] and out["rng"][0]["k"] == "x"
    # With comm=, a rank gets its own value; a rank the save did not have gets None.
    from ckptio.ranks._dist import SingleRank

    class Rank5(SingleRank):
        rank, size = 5, 6

    assert ckptio.load(tmp_path / "c", comm=SingleRank())["rng"]["k"] == "x"
    assert ckptio.load(tmp_path / "c", comm=Rank5())["rng"] is None
    with pytest.raises(ckptio.InvalidRequest, match="timeout must be > 0"):
        ckptio.save(tree, tmp_path / "t", timeout=0)
    # A box that does not cover the global array fails naming the tensor and the hole.
    with pytest.raises(ckptio.IncompleteTensor, match="tensor 'w'.*no rank holds"):
        ckptio.save({"w": ckptio.Shard(a[:2], (0, 0), (4, 6))}, tmp_path / "d")
    assert not (tmp_path / "d").exists()
    with pytest.raises(ckptio.CheckpointError, match="not inside the global shape"):
        ckptio.Shard(a, (1, 0), (4, 6))


def test_jax_two_processes(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("jax")
    n = 2
    port = free_port()
    argvs = [[sys.executable, str(DIST / "save_jax.py"), str(port), str(i), str(n), str(tmp_path)]
             for i in range(n)]
    env = [dict(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4")
           for _ in range(n)]
    out = tmp_path / "out"
    out.mkdir()
    launch(argvs, env, out)
    res = results(out, "jax")
    no_error(res, 2)
    for v in res.values():
        assert v["restored_ok"], v
    # One plain process: the full array.
    full = ckptio.load(tmp_path / "ckpt", framework="numpy")
    assert np.array_equal(full["x"], np.arange(8 * 4, dtype=np.float32).reshape(8, 4))
    assert full["step"] == 5


def test_mpi4py_shards(tmp_path: pathlib.Path) -> None:
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not found (install openmpi-bin: deps/apt-packages.txt)")
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed (deps/requirements.txt; make venv)")
    argv = ["timeout", str(LAUNCH_TIMEOUT), mpirun, "--allow-run-as-root", "--oversubscribe",
            "-np", "4", sys.executable, str(DIST / "save_mpi.py"), str(tmp_path)]
    out = tmp_path / "out"
    out.mkdir()
    launch([argv], [{}], out)
    no_error(results(out, "mpi"), 4)
    full = ckptio.load(tmp_path / "ckpt")
    assert np.array_equal(full["x"], np.arange(8 * 3, dtype=np.int64).reshape(8, 3))
    assert np.array_equal(full["bias"], np.ones(3))
    assert {r: int(v) for r, v in full["count"].items()} == {0: 0, 1: 10, 2: 20, 3: 30}


def save_in_threads(trees: list[Any], path: pathlib.Path, timeout: float = 20.0,
                    **options: Any) -> list[Any]:
    """ckptio.save of trees[r] from rank r (with the save options given), the ranks being
    threads of this process; what each returned or raised."""
    from test_comm import ThreadComm, ThreadGroup

    group = ThreadGroup(len(trees))
    out: list[Any] = [None] * len(trees)

    def one(r: int) -> None:
        try:
            out[r] = ckptio.save(trees[r], path, comm=ThreadComm(group, r), timeout=timeout,
                                 **options)
        except Exception as e:  # judged by the test
            out[r] = e

    threads = [threading.Thread(target=one, args=(r,)) for r in range(len(trees))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    return out


def test_ranks_with_different_trees_fail_naming_the_ranks(tmp_path: pathlib.Path) -> None:
    a = np.arange(4.0)
    trees = [{"w": ckptio.Shard(a[:2], (0,), (4,)), "step": 3},
             {"w": ckptio.Shard(a[2:], (2,), (4,)), "step": 4}]
    out = save_in_threads(trees, tmp_path / "c")
    for e in out:
        assert isinstance(e, ckptio.DuplicateTensor), e
        assert "ranks 0 and 1 saved different trees" in str(e), e
        assert (e.rank, e.other_rank, e.tensor) == (0, 1, _dist.TREE_DIGEST), vars(e)
    assert not (tmp_path / "c").exists()


def test_a_rank_that_cannot_stage_fails_every_rank_at_once(tmp_path: pathlib.Path) -> None:
    a = np.arange(4.0)
    trees = [{"w": ckptio.Shard(a[:2], (0,), (4,))}, {"w": ckptio.Shard(a[2:], (2,), (4,)),
                                                      "bad": object()}]
    out = save_in_threads(trees, tmp_path / "c", timeout=60.0)
    assert isinstance(out[1], ckptio.InvalidType) and "'bad'" in str(out[1])
    # Rank 0 learns it from the plan, naming rank 1 and its error, not from a timeout.
    assert isinstance(out[0], ckptio.CheckpointError) and out[0].code != -errno.ETIMEDOUT, out[0]
    assert "rank 1 could not stage its part of the tree" in str(out[0]), out[0]
    assert "'bad'" in str(out[0]), out[0]
    # As values, on every rank: the rank that could not stage, refusing.
    for e in out:
        assert e.rank == 1 and e.refused and e.path == os.fspath(tmp_path / "c"), vars(e)
    assert out[0].code == out[1].code
    assert not (tmp_path / "c").exists()


def test_dtensor_placement_that_is_not_a_box_is_refused() -> None:
    pytest.importorskip("torch")
    from torch.distributed.tensor.placement_types import _StridedShard

    from ckptio.ranks import _dist

    class Fake:  # what FSDP2 + TP leave on a parameter: not a box of the global tensor
        placements = (_StridedShard(0, split_factor=2),)

    with pytest.raises(ckptio.InvalidType, match="tensor 'w': DTensor placement"):
        _dist._stage_dtensor("w", Fake(), {})
