# SPDX-License-Identifier: Apache-2.0
"""The Manager's peer tier (local roots, replicas on other nodes, the persistent directory)
across processes: 4 torch.distributed ranks as 2 simulated nodes on 127.0.0.1 (each node its
own CKPTIO_NODE and local root), ranks killed mid-save and mid-replication, parts lost or
damaged between launches; the same calls on MPI and JAX; and the one-process checks. The rank
programs are tests/python/dist/tier_*.py; every launch is bounded, and every process a test
starts is killed in a finally block."""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import os
import pathlib
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import pytest

import ckptio
from ckptio import _core
from test_comm_dist import DIST, free_port, results

_spec = importlib.util.spec_from_file_location("tier_parts", DIST / "tier_parts.py")
assert _spec is not None and _spec.loader is not None
tier_parts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tier_parts)
SMALL: int = tier_parts.SMALL
part = tier_parts.part
same = tier_parts.same

LAUNCH_TIMEOUT = 90  # seconds for a whole launch of all its ranks
RATE = 2_000_000  # CKPTIO_PEER_MAX_RATE of the kill tests: an 8 MiB push takes ~4 s
BIG = 8 << 20
T = TypeVar("T")


# ---- launching ranks ----
class Job:
    """A job's folders under ``base``: the persistent directory and one local root per node."""

    def __init__(self, base: pathlib.Path, nodes: int = 2) -> None:
        self.base = base
        self.persist = base / "persist"
        self.roots = [base / f"local-n{i}" for i in range(nodes)]
        self.launches = 0

    def out(self) -> pathlib.Path:
        self.launches += 1
        d = self.base / f"out-{self.launches}"
        d.mkdir()
        return d


class Launch:
    """Processes started together: ``finish()`` waits for them within a deadline and kills the
    rest; leaving the ``started`` block kills whatever still runs."""

    def __init__(self, procs: list[subprocess.Popen[bytes]], out: pathlib.Path) -> None:
        self.procs = procs
        self.out = out

    def finish(self, timeout: float = LAUNCH_TIMEOUT) -> list[int | None]:
        deadline = time.monotonic() + timeout
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
        codes = [p.returncode for p in self.procs]
        self.kill()
        return codes

    def kill(self) -> None:
        stop(self.procs)

    def tails(self) -> str:
        logs = sorted(self.out.glob("log-*.txt"))
        return "\n---\n".join(f"{f.name}:\n{f.read_text(errors='replace')[-3000:]}" for f in logs)

    def results(self, tag: str) -> dict[int, dict[str, Any]]:
        return results(self.out, tag)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGKILL each process's whole group (each started in a session of its own: mpirun's
    ranks go too, not only the launcher) and reap it."""
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


@contextlib.contextmanager
def started(
    argvs: list[list[str]], envs: list[dict[str, str]], out: pathlib.Path
) -> Iterator[Launch]:
    """Start one process per argv (output in out/log-<i>.txt), each in its own session; on
    leaving, whatever of them still runs is killed."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i, (argv, extra) in enumerate(zip(argvs, envs)):
            env = dict(os.environ, CKPTIO_TEST_OUT=str(out), CKPTIO_PEER_ADDR="127.0.0.1",
                       OMP_NUM_THREADS="1")
            env.update(extra)
            with open(out / f"log-{i}.txt", "wb") as log:
                procs.append(subprocess.Popen(argv, env=env, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
        yield Launch(procs, out)
    finally:
        stop(procs)


@contextlib.contextmanager
def torch_ranks(
    job: Job, mode: str, placement: list[int], env: dict[str, str] | None = None, **run: Any
) -> Iterator[Launch]:
    """Start one dist/tier_rank.py per entry of ``placement`` (rank r on node placement[r]:
    CKPTIO_NODE=n<node>, its root job.roots[node]) with the run ``run``."""
    pytest.importorskip("torch")
    port, n = free_port(), len(placement)
    argvs, envs = [], []
    for r, node in enumerate(placement):
        cfg = dict(run, mode=mode, persist=str(job.persist), local=str(job.roots[node]))
        argvs.append([sys.executable, str(DIST / "tier_rank.py"), json.dumps(cfg)])
        envs.append(dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                         WORLD_SIZE=str(n), GLOO_SOCKET_IFNAME="lo", CKPTIO_NODE=f"n{node}",
                         **(env or {})))
    with started(argvs, envs, job.out()) as launch:
        yield launch


def run_torch(job: Job, mode: str, placement: list[int], **run: Any) -> dict[int, dict[str, Any]]:
    """A launch of tier_rank.py that must end well on every rank: its results by rank."""
    with torch_ranks(job, mode, placement, **run) as launch:
        codes = launch.finish()
        assert codes == [0] * len(placement), f"exit codes {codes}:\n{launch.tails()}"
        res = launch.results(mode)
        assert sorted(res) == list(range(len(placement))), (res, launch.tails())
        for r, v in res.items():
            assert "error" not in v, f"rank {r}: {json.dumps(v, indent=1)}\n{launch.tails()}"
        return res


def wait_for(what: str, cond: Callable[[], T], timeout: float, launch: Launch) -> T:
    """Poll ``cond`` until it returns something true (bounded); fail early, with the ranks'
    output, if a rank has ended meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        ended = [(i, p.returncode) for i, p in enumerate(launch.procs) if p.poll() is not None]
        assert not ended and time.monotonic() < deadline, (
            f"{what}: not seen within {timeout} s (ranks ended: {ended}):\n{launch.tails()}")
        time.sleep(0.005)


# ---- what is on disk ----
def parts(d: pathlib.Path) -> set[str]:
    """The committed parts (rank<R>) in the folder of one step (its record aside)."""
    if not d.is_dir():
        return set()
    return {n for n in _core.list_checkpoints(str(d)) if n.startswith("rank")}


def record(d: pathlib.Path) -> dict[str, Any] | None:
    """The step record in the folder of one step, or None."""
    try:
        with ckptio.open(d / "record") as r:
            return json.loads(r.metadata["ckptio_tier.record"])
    except (OSError, ckptio.CheckpointError):
        return None


def complete_steps(job: Job, n: int) -> list[int]:
    """The steps for which every rank's part is committed somewhere (a root or the persistent
    tier), ascending: what a restore may choose from."""
    found: dict[int, set[str]] = {}
    for d in (*job.roots, job.persist):
        if not d.is_dir():
            continue
        for s in d.iterdir():
            if s.name.isdigit():
                found.setdefault(int(s.name), set()).update(parts(s))
    want = {f"rank{r}" for r in range(n)}
    return sorted(s for s, have in found.items() if want <= have)


def leftovers(root: pathlib.Path) -> list[str]:
    """Unfinished copies (`<step>/rank<R>.tmp-*`) under a root."""
    if not root.is_dir():
        return []
    return sorted(str(p.relative_to(root)) for p in root.glob("*/*.tmp-*"))


def step_dirs(root: pathlib.Path) -> list[str]:
    return sorted((p.name for p in root.iterdir() if p.name.isdigit()), key=int)


def flip_a_data_byte(part_dir: pathlib.Path) -> None:
    """Flip one byte in the middle of the part's largest data file: inside "w"'s bytes (the
    part is almost all "w"), not in the manifest."""
    files = [p for p in part_dir.rglob("*") if p.is_file() and p.name != "manifest"]
    f = max(files, key=lambda p: p.stat().st_size)
    with open(f, "r+b") as fh:
        at = f.stat().st_size // 2
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0xFF]))


def sources(res: dict[int, dict[str, Any]]) -> dict[int, str]:
    return {r: v["last_restore"]["source"] for r, v in res.items()}


def check_restored(res: dict[int, dict[str, Any]], step: int) -> None:
    """Every rank restored ``step`` exactly, its own part, and said so in last_restore."""
    for r, v in res.items():
        assert v["step"] == step and v["ok"], (r, v)
        lr = v["last_restore"]
        assert lr["step"] == step, (r, lr)
        for k in ("plan", "fetch", "load", "agree", "total"):
            assert lr["seconds"][k] >= 0, (r, lr)
        # bytes: what the restore moved over the network (0 unless fetched from a peer)
        assert lr["bytes"] > 0 if lr["source"] == "peer" else lr["bytes"] >= 0, (r, lr)


TWO_NODES = [0, 0, 1, 1]  # ranks 0 and 1 on node n0, 2 and 3 on n1
KW = dict(replicas=1, persist_every=1, local_keep=1, keep=1)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Job:
    """Steps 1, 2 and 3 saved by 4 ranks on 2 nodes, each step also persisted, one step kept
    in each tier: each test copies the folders and changes its copy."""
    job = Job(tmp_path_factory.mktemp("tiers-saved"))
    res = run_torch(job, "save", TWO_NODES, steps=[1, 2, 3], kw=KW)
    for r, v in res.items():
        ls = v["last_save"]
        assert v["saved"] == [1, 2, 3] and ls["step"] == 3 and ls["errors"] == [], (r, v)
        assert ls["replicated_to"] == ["n1" if r < 2 else "n0"], (r, ls)
        assert ls["replicate_bytes"] >= SMALL and ls["persist_s"] is not None, (r, ls)
    return job


def copy_of(saved: Job, base: pathlib.Path) -> Job:
    job = Job(base / "job")
    shutil.copytree(saved.base, job.base, ignore=shutil.ignore_patterns("out-*"))
    return job


def test_forking_loader_between_saves(tmp_path: pathlib.Path) -> None:
    """A DataLoader with workers forks each rank after every save: the forked workers leave
    the rank's peer server and job thread alone, so every save is replicated and complete."""
    job = Job(tmp_path)
    res = run_torch(job, "save", [0, 1], steps=[1, 2, 3, 4], loader=2,
                    kw=dict(replicas=1, persist_every=None, local_keep=4))
    for r, v in res.items():
        ls = v["last_save"]
        assert v["saved"] == [1, 2, 3, 4] and ls["errors"] == [], (r, v)
        assert ls["replicated_to"] == [f"n{1 - r}"], (r, ls)
    for root in job.roots:
        for s in ("1", "2", "3", "4"):
            assert parts(root / s) == {"rank0", "rank1"}, (root, s, os.listdir(root))


# ---- the layout a save leaves ----
def test_layout_of_a_save(saved: Job) -> None:
    """Each root holds its node's own parts and the replicas of the other node's; the
    persistent tier every rank's part; the parts' metadata names them. With local_keep=1 and
    keep=1, each tier holds step 3 and the step before it, complete, kept until step 3 is
    known complete (the job agrees on a save at the next one; retention runs in that save's
    background job)."""
    for d in (*saved.roots, saved.persist):
        assert step_dirs(d) == ["2", "3"], (d, os.listdir(d))
        for s in ("2", "3"):
            assert parts(d / s) == {"rank0", "rank1", "rank2", "rank3"}, (d, s)
        assert leftovers(d) == []
    for s in (2, 3):
        for r in range(4):
            for d in (*saved.roots, saved.persist):
                p = d / str(s) / f"rank{r}"
                with ckptio.open(p) as reader:
                    meta = reader.metadata
                assert meta == {"ckptio_tier.world": "4", "ckptio_tier.rank": str(r),
                                "ckptio_tier.step": str(s),
                                "ckptio_tier.node": "n0" if r < 2 else "n1"}, (p, meta)
                assert same(ckptio.load(p), r, s), p
    # Each step's record, in every tier: this job's, naming each part's manifest digest.
    jobs = set()
    for d in (*saved.roots, saved.persist):
        for s in (2, 3):
            rec = record(d / str(s))
            assert rec is not None and rec["step"] == s and rec["world"] == 4, (d, s, rec)
            for r in range(4):
                with _core.Reader(str(d / str(s) / f"rank{r}"), None) as reader:
                    assert rec["digests"][r] == reader.digest().hex(), (d, s, r)
            jobs.add(rec["job"])
    assert len(jobs) == 1, jobs
    # The local roots are their owner's only, and so are the parts received there.
    for root in saved.roots:
        assert root.stat().st_mode & 0o077 == 0, oct(root.stat().st_mode)
        for s in ("2", "3"):
            assert (root / s).stat().st_mode & 0o077 == 0, (root, s)


# ---- 1. a node's local tier deleted ----
def test_lost_node_restores_from_its_peer(saved: Job, tmp_path: pathlib.Path) -> None:
    job = copy_of(saved, tmp_path)
    shutil.rmtree(job.roots[1])
    res = run_torch(job, "restore", TWO_NODES, kw=KW, steps_to_restore=[2])
    check_restored(res, 3)
    assert sources(res) == {0: "local", 1: "local", 2: "peer", 3: "peer"}, res
    for r, v in res.items():
        assert v["last_restore"]["failed"] == [], (r, v)
        assert v["by_number"]["2"]["ok"], (r, v)  # restore(step=2): the same way
    # The fetched parts were stored in the node's root, verified, under their own names.
    assert parts(job.roots[1] / "3") >= {"rank2", "rank3"}
    assert leftovers(job.roots[1]) == []
    for r in (2, 3):
        assert same(ckptio.load(job.roots[1] / "3" / f"rank{r}"), r, 3)


def test_ranks_closing_at_their_own_pace_keep_the_last_replicas(tmp_path: pathlib.Path) -> None:
    """Every rank saves and closes its Manager with no barrier of its own: rank 0's 4 MiB
    part takes about a second to push (CKPTIO_PEER_MAX_RATE), the others' are done at once.
    Once every rank has closed, every replica of the last step is in place (a rank's close()
    does not cut off a push to it that another rank's save still makes)."""
    job = Job(tmp_path)
    with torch_ranks(job, "save", TWO_NODES, env={"CKPTIO_PEER_MAX_RATE": "4000000"},
                     steps=[1], sizes={"1": [4 << 20, SMALL, SMALL, SMALL]},
                     kw=dict(replicas=1, persist_every=None), barrier=False) as launch:
        codes = launch.finish()
        res = launch.results("save")
        tails = launch.tails()
    assert codes == [0] * 4 and sorted(res) == [0, 1, 2, 3], (codes, tails)
    for r, v in res.items():
        assert "error" not in v and v["last_save"]["errors"] == [], (r, v, tails)
    for root in job.roots:
        assert parts(root / "1") == {f"rank{r}" for r in range(4)}, (root, os.listdir(root / "1"))


# ---- 2. a damaged replica ----
def test_damaged_replica_is_reported_and_skipped(saved: Job, tmp_path: pathlib.Path) -> None:
    job = copy_of(saved, tmp_path)
    flip_a_data_byte(job.roots[1] / "3" / "rank0")  # rank 0's replica on n1
    shutil.rmtree(job.roots[0] / "3" / "rank0")  # and rank 0's own copy is gone
    res = run_torch(job, "restore", TWO_NODES, kw=KW)
    check_restored(res, 3)
    assert sources(res) == {0: "persistent", 1: "local", 2: "local", 3: "local"}, res
    failed = res[0]["last_restore"]["failed"]
    assert len(failed) == 1 and failed[0]["source"] == "peer" and failed[0]["error"], failed
    for r in (1, 2, 3):
        assert res[r]["last_restore"]["failed"] == [], res[r]
    # The damaged copy was never stored as rank 0's part on n0: neither left there, nor
    # published there unverified and removed once it failed to load.
    p = job.roots[0] / "3" / "rank0"
    assert not p.exists() or same(ckptio.load(p), 0, 3)
    mine = [d for d in res[0]["removed"] if d.startswith(str(p))]
    assert mine == [], f"a damaged copy was published as {p} before it was verified: {mine}"


def test_no_good_copy_of_a_part_moves_every_rank_to_an_older_step(
    saved: Job, tmp_path: pathlib.Path
) -> None:
    """Both copies of rank 0's part of step 3 damaged and its persistent copy gone: rank 0
    reports both, and every rank restores step 2 (the same step everywhere); the damaged local
    copy is removed from the root."""
    job = copy_of(saved, tmp_path)
    flip_a_data_byte(job.roots[0] / "3" / "rank0")
    flip_a_data_byte(job.roots[1] / "3" / "rank0")
    shutil.rmtree(job.persist / "3" / "rank0")
    res = run_torch(job, "restore", TWO_NODES, kw=KW)
    check_restored(res, 2)
    assert set(sources(res).values()) == {"local"}, res
    failed = res[0]["last_restore"]["failed"]
    assert [(f["step"], f["source"]) for f in failed] == [(3, "local"), (3, "peer")], failed
    assert all("checksum" in f["error"].lower() for f in failed), failed
    for r in (1, 2, 3):
        assert res[r]["last_restore"]["failed"] == [], res[r]
    assert "rank0" not in parts(job.roots[0] / "3"), os.listdir(job.roots[0] / "3")


def test_damaged_replica_then_another_peer(tmp_path: pathlib.Path) -> None:
    """3 nodes of one rank, replicas=2 (each part on both other nodes), no persistent copy:
    rank 0's own copy gone and its replica on n1 damaged, rank 0 takes the one on n2 (peers in
    node order), reporting n1's."""
    job = Job(tmp_path, nodes=3)
    kw = dict(replicas=2, persist_every=None)
    res = run_torch(job, "save", [0, 1, 2], steps=[1, 2], kw=kw)
    for r, v in res.items():
        want = sorted({"n0", "n1", "n2"} - {f"n{r}"})
        assert sorted(v["last_save"]["replicated_to"]) == want, (r, v["last_save"])
    for root in job.roots:
        assert parts(root / "2") == {"rank0", "rank1", "rank2"}, os.listdir(root / "2")
    shutil.rmtree(job.roots[0] / "2" / "rank0")
    flip_a_data_byte(job.roots[1] / "2" / "rank0")
    res = run_torch(job, "restore", [0, 1, 2], kw=kw)
    check_restored(res, 2)
    assert sources(res) == {0: "peer", 1: "local", 2: "local"}, res
    failed = res[0]["last_restore"]["failed"]
    assert len(failed) == 1 and failed[0]["source"] == "peer", failed
    assert "n1" in failed[0]["peer"] and "n2" not in failed[0]["peer"], failed
    assert same(ckptio.load(job.roots[0] / "2" / "rank0"), 0, 2)  # n2's copy, kept on n0


# ---- 3. a peer killed mid-replication ----
@pytest.mark.parametrize("victim", ["receiver", "sender"])
def test_peer_killed_mid_replication(tmp_path: pathlib.Path, victim: str) -> None:
    """Rank 0 pushes an 8 MiB part of step 2 to rank 2 (node n1) at 2 MB/s; rank 2 (the
    receiver) or rank 0 (the sender) is SIGKILLed while the copy is in rank2's temporary
    folder. No rank0 part of step 2 ever appears on n1. Then n0's root is lost as well, so the
    half-sent copy would be the only rank0 part of step 2: the restore takes step 1."""
    job = Job(tmp_path)
    kw = dict(replicas=1, persist_every=None, local_keep=2, timeout=5)
    with torch_ranks(job, "save", TWO_NODES, env={"CKPTIO_PEER_MAX_RATE": str(RATE)},
                     steps=[1, 2], sizes={"2": [BIG, SMALL, SMALL, SMALL]}, kw=kw,
                     barrier=False) as launch:
        step2 = job.roots[1] / "2"
        wait_for("rank 0's copy in flight to n1",
                 lambda: list(step2.glob("rank0.tmp-*")) if step2.is_dir() else [],
                 LAUNCH_TIMEOUT, launch)
        killed = launch.procs[2 if victim == "receiver" else 0]
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        at_kill = (step2 / "rank0").exists()
        codes = launch.finish(60)
        tails = launch.tails()
    assert not at_kill, "the 8 MiB push ended before the kill: the test did not test"
    assert codes[2 if victim == "receiver" else 0] == -signal.SIGKILL, (codes, tails)
    assert "rank0" not in parts(step2) and not (step2 / "rank0").exists(), os.listdir(step2)
    assert parts(job.roots[1] / "1") == {f"rank{r}" for r in range(4)}, tails

    shutil.rmtree(job.roots[0])
    assert complete_steps(job, 4) == [1]
    res = run_torch(job, "restore", TWO_NODES, kw=kw)
    check_restored(res, 1)
    assert sources(res) == {0: "peer", 1: "peer", 2: "local", 3: "local"}, res
    # The unfinished copy is removed once its process is gone, and never became a part.
    assert "rank0" not in parts(step2) and leftovers(job.roots[1]) == [], os.listdir(step2)


# ---- 4. every local copy lost ----
def test_every_local_copy_lost(saved: Job, tmp_path: pathlib.Path) -> None:
    job = copy_of(saved, tmp_path)
    for root in job.roots:
        shutil.rmtree(root)
    res = run_torch(job, "restore", TWO_NODES, kw=KW)
    check_restored(res, 3)
    assert set(sources(res).values()) == {"persistent"}, res
    for r, v in res.items():
        assert v["last_restore"]["failed"] == [], (r, v)


# ---- 5. another order ----
def test_restart_in_another_order(saved: Job, tmp_path: pathlib.Path) -> None:
    """Ranks 0 and 1 come back on n1, 2 and 3 on n0, each node with its own root."""
    job = copy_of(saved, tmp_path)
    res = run_torch(job, "restore", [1, 1, 0, 0], kw=KW)
    check_restored(res, 3)
    assert set(sources(res).values()) <= {"local", "peer"}, res


def test_a_job_of_another_size_is_refused(saved: Job, tmp_path: pathlib.Path) -> None:
    """Steps saved by 4 ranks are not restored by a job of 2 (each part is one rank's state:
    ranks 0 and 1 taking theirs would drop half of the job's state without a word): every
    rank fails with a CheckpointError."""
    job = copy_of(saved, tmp_path)
    with torch_ranks(job, "restore", [0, 1], kw=KW) as launch:
        codes = launch.finish()
        res = launch.results("restore")
        tails = launch.tails()
    assert codes == [0, 0] and sorted(res) == [0, 1], (codes, tails)
    for r, v in res.items():
        assert "error" in v, f"rank {r} of 2 restored a part of a 4-rank step: {v}"
        assert issubclass(getattr(ckptio, v["error"], Exception), ckptio.CheckpointError), v


# ---- 6. trust: a stranger on the network, another job, an earlier attempt ----
def wire_reply(addr: str, port: int, data: bytes) -> tuple[int, bytes]:
    """Send ``data`` to a peer server as the first bytes of a connection: its reply's status
    and message (status 1: no reply)."""
    with socket.create_connection((addr, port), timeout=10) as c:
        c.sendall(data)
        got = b""
        with contextlib.suppress(OSError):
            while chunk := c.recv(4096):
                got += chunk
    if len(got) < 8:
        return 1, got
    status, n = struct.unpack("<iI", got[:8])
    return status, got[8:8 + n]


def listening_on(port: int) -> list[str]:
    """The IPv4 addresses a TCP socket listens on at ``port`` (/proc/net/tcp)."""
    found = []
    for line in pathlib.Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        addr, p = f[1].split(":")
        if int(p, 16) == port and f[3] == "0A":  # LISTEN
            found.append(socket.inet_ntoa(struct.pack("<I", int(addr, 16))))
    return found


def test_an_outsider_reads_and_plants_nothing(tmp_path: pathlib.Path) -> None:
    """A process outside the job (the library, no key of the job's: its own, or the job's with
    one byte changed) connects to every rank's server: each fetch of each committed part, each
    push of a forged newer step under each rank's name, each request by hand (the old
    protocol's, plain HTTP) is refused; the refusals carry nothing of the server's (no path,
    no name); each server logs the outsider's address; nothing is published; and the next
    restore() returns the job's own newest step exactly."""
    job = Job(tmp_path)
    forged = tmp_path / "forged"
    ckptio.save(part(0, 9), forged)  # a self-consistent part (its checksums hold)
    # No CKPTIO_PEER_ADDR: each server listens on the interface that routes to MASTER_ADDR
    # (127.0.0.1 here), not on every interface.
    with torch_ranks(job, "serve", TWO_NODES, env={"CKPTIO_PEER_ADDR": ""}, steps=[1, 2],
                     kw=KW) as launch:
        out = launch.out
        serving = wait_for("every rank serving", lambda: sorted(out.glob("serving-*.json"))
                           if len(list(out.glob("serving-*.json"))) == 4 else [],
                           LAUNCH_TIMEOUT, launch)  # fmt: skip
        servers = [json.loads(f.read_text()) for f in serving]
        for sv in servers:
            assert sv["addr"] == "127.0.0.1" and listening_on(sv["port"]) == ["127.0.0.1"], sv
        off_by_one = bytes.fromhex((out / "key-off-by-one").read_text())
        tried = refused = 0
        for key in (os.urandom(32), off_by_one):
            for sv in servers:
                for st in (1, 2, 3):
                    for r in range(4):
                        tried += 2
                        with pytest.raises(ckptio.CheckpointError) as e:
                            _core.peer_fetch(sv["addr"], sv["port"], f"{st}/rank{r}",
                                             str(tmp_path / "stolen" / f"{st}-{r}"), 10, True, key)
                        refused += e.value.code == -errno.EACCES
                        with pytest.raises(ckptio.CheckpointError) as e:
                            _core.peer_push(str(forged), sv["addr"], sv["port"], f"3/rank{r}",
                                            10, 0, key)
                        refused += e.value.code == -errno.EACCES
        assert refused == tried == 2 * 4 * 3 * 4 * 2
        old = struct.pack("<IIII", 0x52504B43, 1, 2, 7) + b"2/rank0"
        for sv in servers:
            for data in (old, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"):
                status, msg = wire_reply(sv["addr"], sv["port"], data)
                assert (status, msg) == (-errno.EACCES, b"not authenticated"), (status, msg)
        (out / "go").touch()
        codes = launch.finish()
        tails = launch.tails()
    assert codes == [0] * 4, (codes, tails)
    assert not (tmp_path / "stolen").exists() or not any((tmp_path / "stolen").iterdir())
    for root in job.roots:
        assert step_dirs(root) == ["1", "2"], os.listdir(root)
        assert leftovers(root) == []
    logs = "".join(f.read_text(errors="replace") for f in out.glob("log-*.txt"))
    assert logs.count("refused the connection from 127.0.0.1:") == tried + 2 * 4, tails
    res = run_torch(job, "restore", TWO_NODES, kw=KW)
    check_restored(res, 2)
    for r, v in res.items():
        assert v["last_restore"]["failed"] == [] and v["last_restore"]["unrecorded"] == [], v


def test_another_job_in_the_same_local_tier_is_never_restored(tmp_path: pathlib.Path) -> None:
    """Job A saves steps 1, 2 and 3 (no persistent copies); job B, its own persistent tier,
    saves steps 2 and 3 of other bytes into the same local roots (replacing A's parts and
    records there). A restarted restores step 1, the newest step of its own, and reports 2 and
    3 as held without its record; with persistent copies of A's, A restores its step 3 from
    them."""
    for sub in "abcd":
        (tmp_path / sub).mkdir()
    a = Job(tmp_path / "a")
    b = Job(tmp_path / "b")
    b.roots = a.roots
    kw = dict(replicas=1, persist_every=None, local_keep=3)
    run_torch(a, "save", TWO_NODES, steps=[1, 2, 3], kw=kw)
    other = {str(s): [2 * SMALL] * 4 for s in (2, 3)}
    run_torch(b, "save", TWO_NODES, steps=[2, 3], sizes=other, kw=kw)
    rec_a, rec_b = record(a.roots[0] / "1"), record(a.roots[0] / "3")
    assert rec_a and rec_b and rec_a["job"] != rec_b["job"], (rec_a, rec_b)
    res = run_torch(a, "restore", TWO_NODES, kw=kw)
    check_restored(res, 1)
    for r, v in res.items():
        assert v["last_restore"]["unrecorded"] == [2, 3], v["last_restore"]
    # With A's steps also in its persistent tier: A's own step 3, from there.
    c = Job(tmp_path / "c")
    d = Job(tmp_path / "d")
    d.roots = c.roots
    kw = dict(replicas=1, persist_every=1, local_keep=3)
    run_torch(c, "save", TWO_NODES, steps=[1, 2, 3], kw=kw)
    run_torch(d, "save", TWO_NODES, steps=[2, 3], sizes=other, kw=kw)
    res = run_torch(c, "restore", TWO_NODES, kw=kw)
    check_restored(res, 3)  # same(): SMALL bytes, A's, not B's
    assert set(sources(res).values()) == {"persistent"}, res


def test_a_replica_from_an_earlier_attempt_is_reported_and_skipped(tmp_path: pathlib.Path) -> None:
    """Step 2 saved, then saved again by the restarted job with other bytes (its second
    attempt). Rank 1's replica on n1 from the first attempt is put back in place, and rank 1's
    own copy lost: the restore refuses the stale replica (its digest is not the record's),
    reports it, and takes the second attempt's bytes from the persistent tier."""
    job = Job(tmp_path)
    kw = dict(replicas=1, persist_every=1, local_keep=2, keep=2)
    run_torch(job, "save", TWO_NODES, steps=[1, 2], kw=kw)
    stale = tmp_path / "stale-rank1"
    shutil.copytree(job.roots[1] / "2" / "rank1", stale)
    second = {"2": [2 * SMALL] * 4}
    run_torch(job, "save", TWO_NODES, steps=[2], sizes=second, kw=kw)
    shutil.rmtree(job.roots[1] / "2" / "rank1")
    shutil.copytree(stale, job.roots[1] / "2" / "rank1")
    shutil.rmtree(job.roots[0] / "2" / "rank1")
    res = run_torch(job, "restore", TWO_NODES, sizes=second, kw=kw)
    check_restored(res, 2)  # same(): the second attempt's bytes, on every rank
    assert sources(res)[1] == "persistent", res
    failed = res[1]["last_restore"]["failed"]
    assert [(f["step"], f["source"]) for f in failed] == [(2, "peer")], failed
    assert "not the one this job committed" in failed[0]["error"], failed


def test_restart_in_another_order_on_four_nodes(tmp_path: pathlib.Path) -> None:
    """4 nodes of one rank (node i's part replicated to node i+1), restarted in reverse order:
    rank 0 on n3 (which holds parts 2 and 3 only), ..., so ranks fetch from peers. The pushes
    run under CKPTIO_PEER_MAX_RATE: a 1 MiB part at 4 MB/s takes a quarter second at least."""
    job = Job(tmp_path, nodes=4)
    kw = dict(replicas=1, persist_every=None)
    sizes = {"2": [1 << 20] * 4}
    with torch_ranks(job, "save", [0, 1, 2, 3], env={"CKPTIO_PEER_MAX_RATE": "4000000"},
                     steps=[1, 2], sizes=sizes, kw=kw) as launch:
        codes = launch.finish()
        saved = launch.results("save")
        assert codes == [0] * 4 and sorted(saved) == [0, 1, 2, 3], (codes, launch.tails())
    for r, v in saved.items():
        ls = v["last_save"]
        assert ls["errors"] == [] and ls["replicated_to"] == [f"n{(r + 1) % 4}"], (r, v)
        assert ls["replicate_bytes"] >= 1 << 20, (r, ls)
        assert ls["replicate_s"] >= 0.9 * ls["replicate_bytes"] / 4e6, (r, ls)
    for i, root in enumerate(job.roots):
        assert parts(root / "2") == {f"rank{i}", f"rank{(i - 1) % 4}"}, (root, os.listdir(root))
    res = run_torch(job, "restore", [3, 2, 1, 0], sizes=sizes, kw=kw)
    check_restored(res, 2)
    # Rank r now runs on node 3-r, which holds parts 3-r and 2-r (mod 4): ranks 1 and 3 find
    # theirs there, ranks 0 and 2 fetch from a peer.
    assert sources(res) == {0: "peer", 1: "local", 2: "peer", 3: "local"}, res


# ---- 6. retention ----
def test_retention_keeps_the_only_complete_step(tmp_path: pathlib.Path) -> None:
    """local_keep=1: a save deletes what the newest step complete for the whole job no longer
    needs (the job agrees on a save's completeness at the next save, so a root holds the
    newest complete step and the one being saved). Rank 3 saves a 32 MiB part of step 4 and
    is SIGKILLed as soon as save() returns: step 4 is not known complete, so step 3 (the only
    complete one before it) stays while step 2 goes, and a relaunch restores the newest
    complete step."""
    job = Job(tmp_path)
    kw = dict(replicas=1, persist_every=None, local_keep=1, timeout=5)
    sizes = {"4": [SMALL, SMALL, SMALL, 32 << 20]}
    with torch_ranks(job, "save", TWO_NODES, steps=[1, 2, 3, 4], sizes=sizes, kw=kw,
                     kill={"rank": 3, "step": 4, "when": "after"}) as launch:
        codes = launch.finish()
        tails = launch.tails()
        res = launch.results("save")
    assert codes[3] == -signal.SIGKILL, (codes, tails)
    for r in (0, 1, 2):
        assert res[r]["saved"] == [1, 2, 3, 4] and "error" not in res[r], (res[r], tails)
    for root in job.roots:
        assert step_dirs(root) == ["3", "4"], (root, os.listdir(root), tails)
        assert parts(root / "3") == {f"rank{r}" for r in range(4)}, (root, tails)
    complete = complete_steps(job, 4)
    assert complete[0] == 3 and complete[-1] in (3, 4), complete
    res = run_torch(job, "restore", TWO_NODES, sizes=sizes, kw=kw)
    check_restored(res, complete[-1])


def test_restarted_job_prunes_at_its_first_save(saved: Job, tmp_path: pathlib.Path) -> None:
    """A relaunched job's first save prunes its roots and the persistent tier (local_keep=1,
    keep=1): step 3, complete on disk, is known to the new Managers, so step 2 goes and step 3
    stays beside step 4 until step 4 is known complete."""
    job = copy_of(saved, tmp_path)
    res = run_torch(job, "save", TWO_NODES, steps=[4], kw=KW)
    for r, v in res.items():
        assert v["saved"] == [4] and v["last_save"]["errors"] == [], (r, v)
    for d in (*job.roots, job.persist):
        assert step_dirs(d) == ["3", "4"], (d, os.listdir(d))


# ---- 7. SIGKILL during a local save ----
def test_sigkill_during_a_local_save(tmp_path: pathlib.Path) -> None:
    """Rank 1 saves a 32 MiB part of step 2 and is SIGKILLed as soon as save() returns, while
    its local write runs in the background: the newest complete step stays restorable."""
    job = Job(tmp_path)
    kw = dict(replicas=1, persist_every=None, local_keep=2, timeout=5)
    sizes = {"2": [SMALL, 32 << 20, SMALL, SMALL]}
    with torch_ranks(job, "save", TWO_NODES, steps=[1, 2], sizes=sizes, kw=kw,
                     kill={"rank": 1, "step": 2, "when": "after"}) as launch:
        codes = launch.finish()
        tails = launch.tails()
    assert codes[1] == -signal.SIGKILL, (codes, tails)
    complete = complete_steps(job, 4)
    assert complete and complete[-1] in (1, 2), (complete, tails)
    res = run_torch(job, "restore", TWO_NODES, sizes=sizes, kw=kw)
    check_restored(res, complete[-1])
    for root in job.roots:  # no unfinished copy of the dead rank is left or used
        assert not [p for p in leftovers(root) if "rank1.tmp-" in p], leftovers(root)


def test_torch_dtensors_lose_a_node(tmp_path: pathlib.Path) -> None:
    """A Shard(0) DTensor is saved as each rank's shard; n1's root lost; restore() gives each
    rank its shard (from the peer on n1), restore(like=) the DTensor rebuilt."""
    job = Job(tmp_path)
    res = run_torch(job, "dtensor", TWO_NODES, deleter=2,
                    kw=dict(replicas=1, persist_every=None))
    for r, v in res.items():
        assert v["plain_ok"] and v["like_ok"], (r, v)
        assert v["source"] == ("peer" if r >= 2 else "local"), (r, v)


# ---- 8. MPI and JAX ----
def check_lost_node(res: dict[int, dict[str, Any]], n: int, lost: set[int], tails: str) -> None:
    """What tier_parts.save_lose_restore reported: every rank restored step 2 exactly, the
    ranks of the lost node from a peer (and kept the fetched part in their root)."""
    assert sorted(res) == list(range(n)), (res, tails)
    for r, v in res.items():
        msg = f"rank {r}: {json.dumps(v, indent=1)}\n{tails}"
        assert "error" not in v, msg
        assert v["step"] == 2 and v["ok"], msg
        assert v["last_restore"]["source"] == ("peer" if r in lost else "local"), msg
        assert v["last_save"]["errors"] == [], msg
        assert f"rank{r}" in v["root"], msg


def test_mpi_lose_a_node(tmp_path: pathlib.Path) -> None:
    mpirun = shutil.which("mpirun")
    if mpirun is None or importlib.util.find_spec("mpi4py") is None:
        pytest.skip("needs mpirun and mpi4py")
    job = Job(tmp_path)
    run = dict(persist=str(job.persist), roots=[str(r) for r in job.roots], lose=1,
               first_of_lost=2)
    argv = ["timeout", str(LAUNCH_TIMEOUT), mpirun, "--allow-run-as-root", "--oversubscribe",
            "-np", "4", sys.executable, str(DIST / "tier_mpi.py"), json.dumps(run)]
    with started([argv], [{}], job.out()) as launch:
        codes = launch.finish()
        assert codes == [0], (codes, launch.tails())
        check_lost_node(launch.results("mpi"), 4, {2, 3}, launch.tails())


def test_jax_lose_a_node(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("jax")
    job = Job(tmp_path)
    run = dict(persist=str(job.persist), roots=[str(r) for r in job.roots], lose=1,
               first_of_lost=1)
    port = free_port()
    argvs = [[sys.executable, str(DIST / "tier_jax.py"), str(port), str(i), "2", json.dumps(run)]
             for i in range(2)]
    env = dict(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    with started(argvs, [env, env], job.out()) as launch:
        codes = launch.finish()
        assert codes == [0, 0], (codes, launch.tails())
        res = launch.results("jax")
        check_lost_node(res, 2, {1}, launch.tails())
        for r, v in res.items():  # restore(like=) rebuilt the global array, from the local tier
            assert v["like_ok"] and v["like_source"] == "local", (r, v)


# ---- one process, no launch ----
def test_one_process_local_tier(tmp_path: pathlib.Path) -> None:
    local, persist = tmp_path / "local", tmp_path / "persist"
    m = ckptio.Manager(persist, local=str(local), persist_every=1, local_keep=2, node="solo")
    for s in (1, 2, 3):
        m.save(s, part(0, s))
    m.wait_until_finished()
    assert m.last_save["step"] == 3 and m.last_save["local_s"] >= 0, m.last_save
    assert step_dirs(local) == ["2", "3"] and parts(local / "3") == {"rank0"}
    assert parts(persist / "3") == {"rank0"}
    assert m.local_steps() == [2, 3] and m.all_steps() == [1, 2, 3]
    with ckptio.open(local / "3" / "rank0") as reader:
        assert reader.metadata == {"ckptio_tier.world": "1", "ckptio_tier.rank": "0",
                                   "ckptio_tier.step": "3", "ckptio_tier.node": "solo"}
    assert same(m.restore(), 0, 3)
    lr = m.last_restore
    assert (lr["step"], lr["source"], lr["failed"]) == (3, "local", []), lr
    assert same(m.restore(step=2), 0, 2) and m.last_restore["step"] == 2
    m.close()

    # Unfinished or uncommitted step folders are never listed nor used.
    junk = local / "9" / "rank0.tmp-999999999.0"
    junk.mkdir(parents=True)
    (junk / "manifest").write_bytes(b"not a manifest")
    (local / "8" / "rank0").mkdir(parents=True)
    m = ckptio.Manager(persist, local=str(local), persist_every=1, node="solo")
    assert same(m.restore(), 0, 3) and m.last_restore["source"] == "local"
    m.close()

    # The local tier lost: the persistent one.
    shutil.rmtree(local)
    m = ckptio.Manager(persist, local=str(local), persist_every=1, node="solo")
    assert same(m.restore(), 0, 3) and m.last_restore["source"] == "persistent"
    m.close()


def test_one_process_local_tier_is_private_whatever_the_umask(tmp_path: pathlib.Path) -> None:
    """With umask 0, and a local root that already existed open to all: the root and each step
    folder made 0700; the part still loads back; the step's record is there."""
    local = tmp_path / "local"
    local.mkdir(mode=0o777)
    os.chmod(local, 0o777)
    was = os.umask(0)
    try:
        m = ckptio.Manager(tmp_path / "persist", local=str(local), persist_every=None, node="solo")
        m.save(1, part(0, 1))
        m.wait_until_finished()
    finally:
        os.umask(was)
    assert local.stat().st_mode & 0o777 == 0o700, oct(local.stat().st_mode)
    assert (local / "1").stat().st_mode & 0o777 == 0o700, oct((local / "1").stat().st_mode)
    rec = record(local / "1")
    assert rec is not None and rec["step"] == 1 and rec["world"] == 1, rec
    assert same(m.restore(), 0, 1)
    m.close()


def test_one_process_step_record_that_cannot_be_written(tmp_path: pathlib.Path) -> None:
    """Step 2's record cannot be written in the persistent tier (something that is no
    checkpoint is in its place): the save says so, step 2 does not count as persisted, and
    with the local tier lost the restore takes step 1, the newest step the persistent tier
    holds a record of."""
    local, persist = tmp_path / "local", tmp_path / "persist"
    m = ckptio.Manager(persist, local=str(local), persist_every=1, local_keep=2, node="solo")
    m.save(1, part(0, 1))
    m.wait_until_finished()
    (persist / "2" / "record").mkdir(parents=True)
    (persist / "2" / "record" / "not-ours").write_text("x")
    m.save(2, part(0, 2))
    m.wait_until_finished()
    errors = m.last_save["errors"]
    assert any("step record of step 2" in e for e in errors), errors
    m.close()
    shutil.rmtree(local)
    m = ckptio.Manager(persist, local=str(local), persist_every=1, node="solo")
    assert same(m.restore(), 0, 1) and m.last_restore["source"] == "persistent", m.last_restore
    assert 2 in m.last_restore["unrecorded"], m.last_restore
    m.close()


def test_one_process_restart_prunes_at_its_first_save(tmp_path: pathlib.Path) -> None:
    """A job that restarts between saves (a Manager made for each save) keeps its tiers at
    local_keep and keep: the newest complete step on disk is known when the Manager is made,
    so the first save prunes what that step no longer needs."""
    local, persist = tmp_path / "local", tmp_path / "persist"
    for s in (1, 2, 3, 4):
        m = ckptio.Manager(persist, local=str(local), local_keep=1, keep=1, node="solo")
        m.save(s, part(0, s))
        m.close()
        assert m.last_save["errors"] == [], m.last_save
        want = [str(s)] if s == 1 else [str(s - 1), str(s)]
        assert step_dirs(local) == want and step_dirs(persist) == want, (s, os.listdir(local))


def test_one_process_save_at_the_end_of_a_script(tmp_path: pathlib.Path) -> None:
    """A save() just before a script ends without wait or close is still written to the local
    tier and copied to the persistent one before the process exits."""
    local, persist = tmp_path / "local", tmp_path / "persist"
    code = ("import sys, numpy as np, ckptio; "
            f"m = ckptio.Manager({str(persist)!r}, local={str(local)!r}, node='solo'); "
            "m.save(7, {'w': np.arange(1 << 20)})")  # fmt: skip
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert parts(local / "7") == {"rank0"} and parts(persist / "7") == {"rank0"}, p.stderr
    assert np.array_equal(ckptio.load(persist / "7" / "rank0")["w"], np.arange(1 << 20))


def test_one_process_local_tier_in_host_memory(tmp_path: pathlib.Path) -> None:
    """The local tier in /dev/shm (tmpfs), the persistent one on another file system: the
    persistent copy crosses file systems and loads exactly."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    local = pathlib.Path("/dev/shm") / f"ckptio-test-tiers-{os.getpid()}-{tmp_path.name}"
    persist = tmp_path / "persist"
    try:
        m = ckptio.Manager(persist, local=str(local), node="solo")
        m.save(1, part(0, 1, 4 << 20))
        m.wait_until_finished()
        m.close()
        assert m.last_save["errors"] == [] and m.last_save["persist_s"] is not None, m.last_save
        assert same(ckptio.load(persist / "1" / "rank0"), 0, 1, 4 << 20)
        assert same(ckptio.load(local / "1" / "rank0"), 0, 1, 4 << 20)
    finally:
        shutil.rmtree(local, ignore_errors=True)


def test_one_process_persistent_copy_that_fails_is_reported(tmp_path: pathlib.Path) -> None:
    """The persistent copy goes in the pushes' pass; where it cannot be made (a file stands
    where its step's folder goes) the save reports why, the local part stays, and the next
    step is copied."""
    local, persist = tmp_path / "local", tmp_path / "persist"
    persist.mkdir()
    (persist / "1").write_bytes(b"in the way")
    m = ckptio.Manager(persist, local=str(local), persist_every=1, node="solo")
    m.save(1, part(0, 1))
    m.wait_until_finished()
    errors = m.last_save["errors"]
    assert len(errors) == 1 and "to the persistent tier failed" in errors[0], m.last_save
    assert str(persist / "1") in errors[0], errors
    assert parts(local / "1") == {"rank0"}
    m.save(2, part(0, 2))
    m.wait_until_finished()
    m.close()
    assert m.last_save["errors"] == [] and m.last_save["persist_s"] is not None, m.last_save
    assert same(ckptio.load(persist / "2" / "rank0"), 0, 2)


def test_one_process_no_complete_step(tmp_path: pathlib.Path) -> None:
    m = ckptio.Manager(tmp_path / "persist", local=str(tmp_path / "local"), node="solo")
    with pytest.raises(ckptio.CheckpointError) as info:
        m.restore()
    assert isinstance(info.value, FileNotFoundError), info.value
    m.save(1, part(0, 1))
    with pytest.raises(ckptio.CheckpointError) as info:
        m.restore(step=2)
    assert isinstance(info.value, FileNotFoundError), info.value
    assert same(m.restore(step=1), 0, 1)
    m.close()


def test_one_process_persist_every_second_save(tmp_path: pathlib.Path) -> None:
    persist = tmp_path / "persist"
    m = ckptio.Manager(persist, keep=None, local=str(tmp_path / "local"), persist_every=2,
                       node="solo")
    persisted = []
    for s in (1, 2, 3, 4):
        m.save(s, part(0, s))
        m.wait_until_finished()
        persisted.append(m.last_save["persist_s"] is not None)
    m.close()
    assert persisted in ([True, False, True, False], [False, True, False, True]), persisted
    assert m.all_steps() == [s for s, p in zip((1, 2, 3, 4), persisted) if p]


def test_one_process_persist_every_none_keeps_the_persistent_tier_empty(
    tmp_path: pathlib.Path,
) -> None:
    persist = tmp_path / "persist"
    m = ckptio.Manager(persist, local=str(tmp_path / "local"), persist_every=None, node="solo")
    m.save(1, {"x": np.arange(5)})
    m.wait_until_finished()
    assert m.last_save["persist_s"] is None, m.last_save
    m.close()
    assert not persist.exists() or step_dirs(persist) == []


@pytest.mark.parametrize("kw, word", [
    (dict(replicas=-1), "replicas"),
    (dict(replicas=1.5), "replicas"),
    (dict(replicas=True), "replicas"),
    (dict(persist_every=0), "persist_every"),
    (dict(persist_every="2"), "persist_every"),
    (dict(local_keep=0), "local_keep"),
    (dict(local_keep=-1), "local_keep"),
])  # fmt: skip
def test_bad_arguments_are_refused(tmp_path: pathlib.Path, kw: dict[str, Any], word: str) -> None:
    args: dict[str, Any] = dict(local=str(tmp_path / "local"), node="solo")
    args.update(kw)
    with pytest.raises((ckptio.CheckpointError, TypeError, ValueError), match=word):
        ckptio.Manager(tmp_path / "persist", **args)
