# SPDX-License-Identifier: Apache-2.0
"""The C engine's live S3 tests run against the real servers this suite starts: group s3's
(tests/test_s3.c: objects, multipart, objects as engine descriptors, errors) and group s3ckpt
(tests/test_s3_ckpt.c: checkpoints through the public API) and the store conformance suite's
S3 half (tests/test_store.c) and a save in flight across fork (tests/test_fork.c), from the plain build and, where
`make test-sanitize` built them from the current sources, the ASan+UBSan and TSan builds, so
that `make test` exercises them live rather than skipping them for want of a store. The same
for Google Cloud Storage against the local GCS server (gcsservers.py): group gcs's live tests
(tests/test_gcs.c) and the conformance suite's GCS half."""

from __future__ import annotations

import os
import pathlib
import re

import pytest

from gcsservers import GCSServer
from procs import run_group
from s3servers import S3Server

pytest_plugins = ["s3servers", "gcsservers"]

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The live tests only: the groups' offline tests (SigV4, XML, a scripted server) run in
# `make test-c` and `make test-sanitize` already.
GROUPS = ("s3/live_", "s3ckpt/", "store/s3/", "store/s3-spread/", "fork/s3")
# Live tests the groups hold (4 + 13 + 6 + 6 + 1); a run that passes fewer lost some.
MIN_PASSED = 30
GCS_GROUPS = ("gcs/live_", "store/gcs/", "store/gcs-spread/")
GCS_MIN_PASSED = 14  # 2 + 6 + 6
# Seconds one run of the groups may take (TSan is the slowest).
TIMEOUT_S = {"build": 150.0, "build-asan": 200.0, "build-tsan": 300.0}
SANITIZER_ENV = {
    "build-asan": {"ASAN_OPTIONS": "detect_leaks=1",
                   "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"},  # fmt: skip
    "build-tsan": {"TSAN_OPTIONS": "halt_on_error=1"},
}
# What the test binary is built from: a sanitizer build older than any of these is stale.
SOURCES = ("src", "include", "tests")


def newest_source() -> tuple[float, pathlib.Path]:
    """The newest C source or header the test binary is built from, and its mtime."""
    best = (0.0, ROOT)
    for top in SOURCES:
        for p in (ROOT / top).rglob("*"):
            if p.suffix in (".c", ".h") or p.name == "meson.build":
                best = max(best, (p.stat().st_mtime, p))
    return best


def stale(build: str) -> str:
    """Why ``build``'s test binary cannot stand for the current sources ("" when it can)."""
    exe = ROOT / build / "tests" / "ckptio-tests"
    if not exe.exists():
        return f"{exe} is not built (make test-sanitize builds it)"
    t, src = newest_source()
    if exe.stat().st_mtime < t:
        return f"{exe} is older than {src.relative_to(ROOT)} (make test-sanitize rebuilds it)"
    return ""


def run_groups(exe: pathlib.Path, env: dict[str, str], timeout: float,
               groups: tuple[str, ...] = GROUPS) -> tuple[int, str]:  # fmt: skip
    """The runner on ``groups`` in its own process group, all of which a timeout kills (a test
    the runner forked would otherwise go on)."""
    try:
        return run_group([str(exe), *groups], env, timeout)
    except TimeoutError as e:
        pytest.fail(str(e))


def runner_of(build: str) -> pathlib.Path:
    """The test runner of ``build``: the plain one must be there, a sanitizer's current."""
    exe = ROOT / build / "tests" / "ckptio-tests"
    if build == "build":
        if not exe.exists():
            pytest.fail(f"{exe} is missing: run `make build` first")
    else:
        why = stale(build)
        if why:
            pytest.skip(why)
    return exe


def check_run(rc: int, out: str, least: int) -> None:
    """The run passed, skipped nothing, and ran at least ``least`` tests."""
    assert rc == 0, out[-4000:]
    m = re.search(r"^(\d+) passed, (\d+) failed, (\d+) skipped$", out, re.M)
    assert m, out[-2000:]
    passed, failed, skipped = map(int, m.groups())
    assert failed == 0 and skipped == 0 and passed >= least, out[-2000:]


@pytest.mark.parametrize("build", ["build", "build-asan", "build-tsan"])
def test_c_s3_groups_live(s3server: S3Server, build: str) -> None:
    exe = runner_of(build)
    if build != "build":
        if s3server.kind != "seaweedfs":
            # The sanitizers look at ckptio's code, which is the same whatever the store; one
            # server keeps this file within its time.
            pytest.skip(f"{build} runs against SeaweedFS only")
    env = dict(os.environ, **s3server.env, **SANITIZER_ENV.get(build, {}))
    env.update(CKPTIO_TEST_S3_ENDPOINT=s3server.endpoint, CKPTIO_TEST_S3_BUCKET=s3server.bucket)
    rc, out = run_groups(exe, env, TIMEOUT_S[build])
    check_run(rc, out, MIN_PASSED)


@pytest.mark.parametrize("build", ["build", "build-asan", "build-tsan"])
def test_c_gcs_groups_live(gcsserver: GCSServer, build: str) -> None:
    exe = runner_of(build)
    env = dict(os.environ, **SANITIZER_ENV.get(build, {}))
    env.update(CKPTIO_TEST_GCS_ENDPOINT=gcsserver.endpoint, CKPTIO_TEST_GCS_BUCKET=gcsserver.bucket)
    rc, out = run_groups(exe, env, TIMEOUT_S[build], GCS_GROUPS)
    check_run(rc, out, GCS_MIN_PASSED)
