# SPDX-License-Identifier: Apache-2.0
"""pytest setup for the Python layer: 8 virtual CPU devices for JAX, set before jax is imported."""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pathlib  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def ckpt(tmp_path: pathlib.Path) -> pathlib.Path:
    """A checkpoint path that does not exist yet, in a fresh directory."""
    return tmp_path / "ckpt"


def leftovers(directory: pathlib.Path) -> list[str]:
    """Temporary files or directories a save left behind."""
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name)
