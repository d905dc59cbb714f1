# SPDX-License-Identifier: Apache-2.0
"""pytest setup for the Python layer: 8 virtual CPU devices for JAX, set before jax is imported;
no request to instance metadata off this machine."""

from __future__ import annotations

import os

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
