# SPDX-License-Identifier: Apache-2.0
"""One process of the JAX communicator test: argv is PORT PROCESS_ID NUM_PROCESSES. Runs the
self-test (the last process failing the agree), then two barriers, and lists ckptio's keys left in
the store (none: a long job must not grow it)."""

from __future__ import annotations

import os
import sys

import jax

sys.path.insert(0, os.path.dirname(__file__))
from _report import emit, selftest  # noqa: E402

from ckptio.ranks import _comm  # noqa: E402

port, pid, n = (int(a) for a in sys.argv[1:4])
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=n,
                           process_id=pid, initialization_timeout=30)
comm = _comm.resolve("jax")
selftest("full", comm, 20.0, n - 1)
comm.barrier(20.0)  # every rank has read every key: each deletes what it wrote
comm.barrier(20.0)  # every rank has deleted
from jax._src import distributed  # noqa: E402

keys = distributed.global_state.client.key_value_dir_get_bytes("ckptio/")
emit("keys", {"rank": comm.rank, "keys": [k for k, _ in keys]})
comm.barrier(20.0)  # nobody shuts down while another still lists
jax.distributed.shutdown()
