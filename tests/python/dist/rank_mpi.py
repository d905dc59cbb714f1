# SPDX-License-Identifier: Apache-2.0
"""One rank of the mpi4py communicator test, under mpirun: the self-test on a duplicate of
COMM_WORLD (rank 1 failing the agree)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _report import selftest  # noqa: E402

from ckptio.ranks import _comm  # noqa: E402

comm = _comm.resolve("mpi")
assert comm is not None and _comm.resolve("mpi") is comm
selftest("full", comm, 20.0, 1)
