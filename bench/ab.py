# SPDX-License-Identifier: Apache-2.0
"""Before and after, alternated on one machine: one command run in two checkouts in turn (old 1,
new 1, old 2, new 2, ...), each from its own tree, package and build, so that both sides see the
same minutes of the disk and the same load.

    .venv/bin/python bench/ab.py --old e45d7a2 --new HEAD --runs 2 --out bench/results/X/s3 -- \\
        {python} bench/run.py --tensor-sizes '' --model none --mechanisms '' --s3 --out {out}

A side is a commit (a detached worktree under --trees, made once and kept: its own venv whose
site-packages chain to this checkout's .venv for the dependencies, ckptio installed editable,
and build/ configured and compiled for build/tools) or "." (this checkout as it is). In the
command, {python} is the side's interpreter, {out} the run's result folder (OUT/<side>-<i>),
{tree} the side's checkout ("." runs with the interpreter running ab.py); it runs in {tree},
with this checkout's .venv/bin on PATH (the local object stores' servers). Each run's output goes to OUT/<side>-<i>.log; OUT/ab.json lists the
runs in the order they ran, with the commits, exit codes, start times and seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import ROOT  # noqa: E402

SIDES = ("old", "new")


def order(runs: int) -> list[tuple[str, int]]:
    """The runs in the order they go: old 1, new 1, old 2, new 2, ..."""
    return [(side, i) for i in range(1, runs + 1) for side in SIDES]


def expand(cmd: list[str], **values: str) -> list[str]:
    """The command with {python}, {out} and {tree} filled in (other braces left as they are)."""
    out = []
    for arg in cmd:
        for k, v in values.items():
            arg = arg.replace("{" + k + "}", v)
        out.append(arg)
    return out


def git(*args: str, cwd: str = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def side_tree(rev: str, trees: str, log: Any) -> tuple[str, str, str]:
    """(checkout, its python, its commit) for ``rev``: "." is this checkout as it is; a commit
    gets a worktree of its own, built the first time."""
    if rev == ".":  # the interpreter running this script: this checkout's venv, whatever its name
        try:
            dirty = " (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else ""
            commit = git("rev-parse", "HEAD") + dirty
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown (no git checkout)"
        return ROOT, sys.executable, commit
    sha = git("rev-parse", "--verify", rev + "^{commit}")
    tree = os.path.join(trees, "ckptio-" + sha[:12])
    py = os.path.join(tree, ".venv-ab", "bin", "python")
    if os.path.exists(os.path.join(tree, ".ab-ready")):
        return tree, py, sha
    os.makedirs(trees, exist_ok=True)
    if not os.path.isdir(tree):
        git("worktree", "add", "--detach", tree, sha)

    def step(*cmd: str, cwd: str = tree) -> None:
        print("ab: " + " ".join(cmd), file=log, flush=True)
        subprocess.run(cmd, cwd=cwd, check=True, stdout=log, stderr=subprocess.STDOUT)

    step(sys.executable, "-m", "venv", os.path.join(tree, ".venv-ab"))
    here_site = sysconfig.get_paths()["purelib"]  # this checkout's .venv: the dependencies
    there_site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    with open(os.path.join(there_site, "zz-ckptio-ab-deps.pth"), "w") as f:
        f.write(here_site + "\n")  # read after the editable install's own .pth: its ckptio wins
    step(py, "-m", "pip", "install", "--no-build-isolation", "-q", "-e", tree)
    env_bin = os.path.dirname(sys.executable)
    meson = os.path.join(env_bin, "meson")
    if not os.path.exists(os.path.join(tree, "build", "build.ninja")):  # build/ may hold pip's cp311/
        step(meson, "setup", "build")
    step(meson, "compile", "-C", "build")
    open(os.path.join(tree, ".ab-ready"), "w").close()
    return tree, py, sha


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("ab.py: give the command after --")
    cut = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="a commit, or '.' for this checkout")
    ap.add_argument("--new", default=".", help="a commit, or '.' for this checkout (default)")
    ap.add_argument("--runs", type=int, default=2, help="runs of each side (default 2)")
    ap.add_argument("--out", required=True, help="the folder of the results")
    ap.add_argument("--trees", default=os.path.join(ROOT, "bench-data", "ab-trees"),
                    help="where the commits' worktrees are made and kept")  # fmt: skip
    ap.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    a = ap.parse_args(argv[:cut])
    cmd = argv[cut + 1:]
    if not cmd or a.runs < 1:
        raise SystemExit("ab.py: a command and --runs >= 1 are needed")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "ab-setup.log"), "a") as log:
        sides = {"old": side_tree(a.old, a.trees, log), "new": side_tree(a.new, a.trees, log)}
    doc: dict[str, Any] = {"command": cmd, "sides": {s: {"rev": r, "tree": t, "commit": c}
                           for (s, (t, _p, c)), r in zip(sides.items(), (a.old, a.new))}, "runs": []}  # fmt: skip
    env = dict(os.environ, PATH=os.path.join(ROOT, ".venv", "bin") + os.pathsep + os.environ.get("PATH", ""))
    failed = 0
    for side, i in order(a.runs):
        tree, py, _commit = sides[side]
        out = os.path.abspath(os.path.join(a.out, f"{side}-{i}"))
        run = expand(cmd, python=py, out=out, tree=tree)
        t0, start = time.perf_counter(), time.strftime("%Y-%m-%dT%H:%M:%S")
        with open(os.path.join(a.out, f"{side}-{i}.log"), "w") as lf:
            try:
                rc = subprocess.run(run, cwd=tree, env=env, stdout=lf, stderr=subprocess.STDOUT,
                                    timeout=a.timeout).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                rc = 124
        failed += rc != 0
        doc["runs"].append({"side": side, "run": i, "rc": rc, "start": start,
                            "seconds": round(time.perf_counter() - t0, 1)})  # fmt: skip
        with open(os.path.join(a.out, "ab.json"), "w") as f:
            json.dump(doc, f, indent=1)
        print(f"ab: {side} {i}: rc {rc}, {doc['runs'][-1]['seconds']} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
