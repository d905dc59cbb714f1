# SPDX-License-Identifier: Apache-2.0
"""One rank of the torch.distributed (gloo) communicator test; MASTER_ADDR/PORT, RANK and
WORLD_SIZE come from the environment. Runs the self-test on every rank (rank 2 failing the
agree), then again with the last rank absent: the others must time out."""

from __future__ import annotations

import os
import sys
import time

import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from _report import selftest  # noqa: E402

from ckptio.ranks import _comm  # noqa: E402

timeout = float(sys.argv[1])
dist.init_process_group("gloo")
comm = _comm.resolve("torch")
assert _comm.resolve(dist.group.WORLD) is not None
selftest("full", comm, timeout, 2)
if comm.rank == comm.size - 1:
    time.sleep(timeout + 3)  # absent: never calls, so the others' gather must time out
else:
    selftest("absent", comm, timeout)
# The abandoned gloo operation keeps the group's worker busy until the group's own timeout;
# leave without tearing the group down.
os._exit(0)
