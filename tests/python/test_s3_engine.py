# SPDX-License-Identifier: Apache-2.0
"""The C engine's own S3 tests (tests/test_s3.c, group s3: objects, multipart, objects as engine
descriptors, errors) run against the real servers this suite starts, so that `make test`
exercises them live rather than skipping them for want of a store."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess

import pytest

from s3servers import S3Server

pytest_plugins = ["s3servers"]

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_c_s3_group_live(s3server: S3Server) -> None:
    exe = ROOT / "build" / "tests" / "ckptio-tests"
    if not exe.exists():
        pytest.fail(f"{exe} is missing: run `make build` first")
    env = dict(os.environ, **s3server.env)
    env.update(CKPTIO_TEST_S3_ENDPOINT=s3server.endpoint, CKPTIO_TEST_S3_BUCKET=s3server.bucket)
    p = subprocess.run([str(exe), "s3/"], env=env, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    m = re.search(r"^(\d+) passed, (\d+) failed, (\d+) skipped$", out, re.M)
    assert m, out[-2000:]
    passed, failed, skipped = map(int, m.groups())
    assert failed == 0 and skipped == 0 and passed >= 4, out[-2000:]
