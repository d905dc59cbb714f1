# SPDX-License-Identifier: Apache-2.0
"""bench/ab.py alternates the two sides, fills in the command's fields and records every run."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import ab  # noqa: E402


def test_order_and_fields() -> None:
    assert ab.order(2) == [("old", 1), ("new", 1), ("old", 2), ("new", 2)]
    assert ab.expand(["{python}", "x.py", "--out={out}", "{tree}/y", "{other}"],
                     python="/p", out="/o", tree="/t") == ["/p", "x.py", "--out=/o", "/t/y", "{other}"]  # fmt: skip


def test_runs_alternate_and_are_recorded(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "ab"
    code = ("import os, sys, time; os.makedirs(sys.argv[1]); "
            "open(os.path.join(sys.argv[1], 'when'), 'w').write(repr(time.time())); "
            "print('ran in', os.getcwd()); sys.exit(3 if sys.argv[1].endswith('new-2') else 0)")  # fmt: skip
    p = subprocess.run([sys.executable, os.path.join(HERE, "ab.py"), "--old", ".", "--runs", "2",
                        "--out", str(out), "--", "{python}", "-c", code, "{out}"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 1, p.stdout + p.stderr  # one run failed: said, the others kept
    doc = json.loads((out / "ab.json").read_text())
    assert [(r["side"], r["run"], r["rc"]) for r in doc["runs"]] == [
        ("old", 1, 0), ("new", 1, 0), ("old", 2, 0), ("new", 2, 3)]
    when = [float((out / f"{s}-{i}" / "when").read_text()) for s, i in ab.order(2)]
    assert when == sorted(when)
    root = os.path.dirname(HERE)
    assert f"ran in {root}" in (out / "old-1.log").read_text()
    assert doc["sides"]["old"]["tree"] == doc["sides"]["new"]["tree"] == root
