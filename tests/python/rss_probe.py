# SPDX-License-Identifier: Apache-2.0
"""Run a snippet in a fresh interpreter that has rss() (resident bytes) and print its output."""

from __future__ import annotations

import pathlib
import subprocess
import sys

PRELUDE = """
import os, sys
import numpy as np, ckptio

_page = os.sysconf("SC_PAGE_SIZE")


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _page


path = sys.argv[1]
"""


def run(body: str, path: pathlib.Path) -> list[int]:
    """The integers the snippet ``body`` printed; it sees ``path`` (a checkpoint path)."""
    res = subprocess.run(
        [sys.executable, "-c", PRELUDE + body, str(path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return [int(x) for x in res.stdout.split()]
