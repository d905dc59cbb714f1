# SPDX-License-Identifier: Apache-2.0
"""The Python communicators on real runtimes: torch.distributed (gloo, 4 ranks), JAX's
distributed client (2 processes) and mpi4py (4 ranks under mpirun). Each rank runs
ckptio._core._comm_selftest through the C entry points (tests/python/dist/); every launch is
bounded by a timeout and listens on 127.0.0.1 only."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
from typing import Any

import pytest

from test_comm import check_selftest

DIST = pathlib.Path(__file__).parent / "dist"
LAUNCH_TIMEOUT = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(
    argvs: list[list[str]], env: list[dict[str, str]], out: pathlib.Path
) -> tuple[list[int], str]:
    """Start one process per argv, wait for all (each bounded by LAUNCH_TIMEOUT; any still
    running is killed), and return their exit codes and the tails of their outputs."""
    procs = []
    for argv, extra in zip(argvs, env):
        e = dict(os.environ, CKPTIO_TEST_OUT=str(out), **extra)
        procs.append(subprocess.Popen(argv, env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=LAUNCH_TIMEOUT)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [p.returncode for p in procs], "\n---\n".join(o[-3000:] for o in outputs)


def launch(argvs: list[list[str]], env: list[dict[str, str]], out: pathlib.Path) -> None:
    """run_ranks(), failing with their output if any process did."""
    codes, tails = run_ranks(argvs, env, out)
    bad = [(i, c) for i, c in enumerate(codes) if c != 0]
    assert not bad, f"exit codes {bad}:\n{tails}"


def launch_jax(script: str, n: int, devices: int, out: pathlib.Path, *args: str) -> None:
    """launch() of n JAX processes of dist/SCRIPT with DEVICES CPU devices each; argv is PORT
    PROCESS_ID NUM_PROCESSES ARGS (dist/_report.py's start_jax reads it)."""
    port = free_port()
    argvs = [[sys.executable, str(DIST / script), str(port), str(i), str(n), *args]
             for i in range(n)]
    env = [dict(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
           for _ in range(n)]
    launch(argvs, env, out)


def results(out: pathlib.Path, tag: str) -> dict[int, dict[str, Any]]:
    found = {}
    for f in out.glob(f"{tag}-*.json"):
        res = json.loads(f.read_text())
        found[res["rank"]] = res
    return found


def test_torch_gloo_four_ranks(tmp_path: pathlib.Path) -> None:
    n, timeout = 4, 3.0
    port = free_port()
    argv = [sys.executable, str(DIST / "rank_torch.py"), str(timeout)]
    env = [dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(n),
                GLOO_SOCKET_IFNAME="lo") for r in range(n)]
    launch([argv] * n, env, tmp_path)
    check_selftest(results(tmp_path, "full"), n, 2)
    # The last rank never called: every other rank reports a timeout of that length, raised
    # by the communicator and named by the C entry point.
    absent = results(tmp_path, "absent")
    assert sorted(absent) == [0, 1, 2]
    for r, res in absent.items():
        assert res["error"] == "CheckpointIOError", res
        assert res["code"] == -errno.ETIMEDOUT
        assert f"on rank {r} of 4: the other ranks did not all arrive within 3 s" in res["message"]
        assert "the communicator raised TimeoutError: torch.distributed" in res["message"]
        assert res["cause"] == "TimeoutError"


def test_jax_two_processes(tmp_path: pathlib.Path) -> None:
    n = 2
    port = free_port()
    argvs = [[sys.executable, str(DIST / "rank_jax.py"), str(port), str(i), str(n)]
             for i in range(n)]
    env = [dict(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
           for _ in range(n)]
    launch(argvs, env, tmp_path)
    check_selftest(results(tmp_path, "full"), n, n - 1)
    # Every key ckptio wrote was deleted once read.
    assert {r: res["keys"] for r, res in results(tmp_path, "keys").items()} == {0: [], 1: []}


def test_mpi4py_four_ranks(tmp_path: pathlib.Path) -> None:
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not found (install openmpi-bin: deps/apt-packages.txt)")
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed (deps/requirements.txt; make venv)")
    n = 4
    argv = ["timeout", str(LAUNCH_TIMEOUT), mpirun, "--allow-run-as-root", "--oversubscribe",
            "-np", str(n), sys.executable, str(DIST / "rank_mpi.py")]
    launch([argv], [{}], tmp_path)
    check_selftest(results(tmp_path, "full"), n, 1)
