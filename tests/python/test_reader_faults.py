# SPDX-License-Identifier: Apache-2.0
"""Reader failures that must raise, again and again, and never hang the process."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

import numpy as np

import ckptio

# Run in a child with a timeout: a reader that spins must fail this test, not hang the suite.
_CHILD = textwrap.dedent(
    """
    import sys
    import ckptio

    outcomes = []
    with ckptio.open(sys.argv[1], staging_bytes=1 << 46) as r:
        for _ in range(2):
            try:
                r.read("w")
            except ckptio.CheckpointError as e:
                outcomes.append(f"{type(e).__name__}: {e}")
            else:
                outcomes.append("no error")
    print("\\n".join(outcomes))
    """
)


def test_staging_too_large_raises_twice(ckpt: pathlib.Path) -> None:
    ckptio.save({"w": np.arange(1 << 16, dtype=np.float32)}, ckpt)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(ckpt)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2, done.stdout
    for line in lines:
        assert line != "no error"
        assert "staging_bytes" in line, line
    # The checkpoint itself is fine: a reader with sane settings reads it.
    with ckptio.open(ckpt) as r:
        assert np.array_equal(r.read("w"), np.arange(1 << 16, dtype=np.float32))
