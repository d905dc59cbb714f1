# SPDX-License-Identifier: Apache-2.0
"""Shared by the rank programs: run ckptio's communicator self-test and write what it returned
as TAG-RANK.json in the folder $CKPTIO_TEST_OUT (a file per rank: mpirun interleaves the lines
of several ranks' output)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from ckptio import _core


def _plain(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def emit(tag: str, value: dict[str, Any]) -> None:
    path = os.path.join(os.environ["CKPTIO_TEST_OUT"], f"{tag}-{value['rank']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(_plain(value), f)
    os.replace(path + ".tmp", path)


def leave_torch() -> None:
    """Leave together, the process group torn down, and exit without the interpreter's
    finalization. After destroy_process_group, torch's gloo threads can still hold work whose
    destruction at exit dies in std::terminate ("terminate called without an active exception":
    seen once in a full CI run, in a rank that had written every result). emit() has closed
    every result file before this."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def selftest(tag: str, comm: Any, timeout: float, fail_rank: int = -1) -> None:
    """Run _comm_selftest and print what it returned, or the error it raised."""
    try:
        emit(tag, _core._comm_selftest(comm, timeout, fail_rank))
    except Exception as e:  # reported, then judged by the test
        emit(tag, {
            "rank": comm.rank,
            "error": type(e).__name__,
            "code": getattr(e, "code", None),
            "message": str(e),
            "cause": type(e.__cause__).__name__ if e.__cause__ else None,
            "notes": getattr(e, "__notes__", []),
        })


def start_jax() -> tuple[int, int, list[str]]:
    """jax.distributed.initialize from argv PORT PROCESS_ID NUM_PROCESSES (coordinator on
    127.0.0.1, bounded); returns (process id, number of processes, the arguments after them)."""
    import jax

    port, pid, n = (int(a) for a in sys.argv[1:4])
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=n,
                               process_id=pid, initialization_timeout=30)
    return pid, n, sys.argv[4:]


def spy_removals() -> list[str]:
    """From now on, the names of the checkpoints this process removes (every removal goes
    through ckptio._core.remove_checkpoint), in order."""
    removed: list[str] = []
    real = _core.remove_checkpoint

    def spy(path: Any, *store: Any) -> None:
        removed.append(os.path.basename(os.fspath(path)))
        real(path, *store)

    _core.remove_checkpoint = spy  # type: ignore[assignment]
    return removed
