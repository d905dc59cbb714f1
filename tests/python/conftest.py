# SPDX-License-Identifier: Apache-2.0
"""pytest setup for the Python layer: 8 virtual CPU devices for JAX, set before jax is imported;
no request to instance metadata off this machine; Ctrl-C delivered as KeyboardInterrupt."""

from __future__ import annotations

import os
import signal

# A shell without job control starts a background command (`make test &` in a script) with
# SIGINT ignored, and Python then raises no KeyboardInterrupt, in this process or in the ones
# it starts (they inherit the disposition): the Ctrl-C tests need it, as a terminal gives it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# No cloud client looks for instance metadata at 169.254.169.254 (off this machine): a test
# that wants a metadata server starts its own and names it, unsetting these.
os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")

import pathlib  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def ckpt(tmp_path: pathlib.Path) -> pathlib.Path:
    """A checkpoint path that does not exist yet, in a fresh directory."""
    return tmp_path / "ckpt"


def leftovers(directory: pathlib.Path) -> list[str]:
    """Temporary files or directories a save left behind."""
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name)
