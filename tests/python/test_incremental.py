# SPDX-License-Identifier: Apache-2.0
"""Incremental checkpoints: ckptio.save(base=) stores tensors as XOR deltas against an older
checkpoint, loads resolve the chain, and a base that is missing, moved or changed is an error
naming it; Manager(full_every=) keeps chains short and never deletes a base a kept step needs;
several ranks (threads here) save deltas, on another rank count than their base's."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import ckptio
from test_dist_save import save_in_threads

CLI = [sys.executable, "-m", "ckptio"]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(bits(a[k]), bits(b[k])) for k in a)


class Trainer:
    """A small AdamW run: bf16 weights, fp32 master and moments, as a training state has them."""

    def __init__(self, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.w = torch.randn(512, 384, generator=g).requires_grad_()
        self.opt = torch.optim.AdamW([self.w], lr=1e-3)
        self.g = g
        self.steps(1)

    def steps(self, n: int) -> None:
        for _ in range(n):
            loss = (self.w * torch.randn(self.w.shape, generator=self.g)).sum()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()

    def state(self) -> dict:
        st = self.opt.state[self.w]
        return {"w": self.w.detach().to(torch.bfloat16), "master": self.w.detach().clone(),
                "m": st["exp_avg"].clone(), "v": st["exp_avg_sq"].clone()}


def inspect(path: pathlib.Path) -> dict:
    out = subprocess.run([*CLI, "inspect", "--json", str(path)], capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(out.stdout)


def test_a_chain_of_ten_deltas_restores_exactly(tmp_path: pathlib.Path) -> None:
    t = Trainer()
    t.steps(3)
    states = [t.state()]
    ckptio.save(states[0], tmp_path / "s0", compress="all")
    for i in range(1, 11):
        t.steps(10)
        states.append(t.state())
        ckptio.save(states[i], tmp_path / f"s{i}", base=tmp_path / f"s{i - 1}")
    for i, s in enumerate(states):
        assert same(ckptio.load(tmp_path / f"s{i}"), s), i
    info = {x["name"]: x for x in inspect(tmp_path / "s10")["tensors"]}
    assert info["w"]["delta"] and info["w"]["ratio"] > 2.0, info["w"]
    with ckptio.open(tmp_path / "s10") as f:  # region reads resolve the chain too
        assert torch.equal(bits(f["master"][100:103, 7:300]), bits(states[10]["master"][100:103, 7:300]))
        f.verify()


def test_a_base_that_is_missing_moved_or_changed_is_refused_by_name(tmp_path: pathlib.Path) -> None:
    t = Trainer(1)
    ckptio.save(t.state(), tmp_path / "a", compress="all")
    t.steps(5)
    s1 = t.state()
    ckptio.save(s1, tmp_path / "b", base=tmp_path / "a")
    # Both moved together: the relative path still holds.
    shutil.move(tmp_path / "a", tmp_path / "a2")
    shutil.move(tmp_path / "b", tmp_path / "b2")
    os.makedirs(tmp_path / "moved")
    shutil.move(tmp_path / "a2", tmp_path / "moved" / "a")
    shutil.move(tmp_path / "b2", tmp_path / "moved" / "b")
    assert same(ckptio.load(tmp_path / "moved" / "b"), s1)
    # The base alone moved away: missing.
    shutil.move(tmp_path / "moved" / "a", tmp_path / "elsewhere")
    with pytest.raises(ckptio.CheckpointError) as e:
        ckptio.load(tmp_path / "moved" / "b")
    assert "base" in str(e.value) and "'../a'" in str(e.value), e.value
    # Another checkpoint in its place: changed.
    ckptio.save(t.state(), tmp_path / "moved" / "a", compress="all")
    with pytest.raises(ckptio.CorruptCheckpoint) as e:
        ckptio.load(tmp_path / "moved" / "b")
    assert "not the checkpoint these deltas were made against" in str(e.value), e.value
    r = subprocess.run([*CLI, "verify", str(tmp_path / "moved" / "b")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and "base" in (r.stdout + r.stderr)


def test_damage_in_the_base_is_found_reading_the_delta(tmp_path: pathlib.Path) -> None:
    t = Trainer(2)
    ckptio.save(t.state(), tmp_path / "a", compress="all")
    t.steps(2)
    ckptio.save(t.state(), tmp_path / "b", base=tmp_path / "a")
    assert {x["name"]: x for x in inspect(tmp_path / "b")["tensors"]}["w"]["delta"]
    chunk = {x["name"]: x for x in inspect(tmp_path / "a")["tensors"]}["w"]["chunks"][0]
    data = tmp_path / "a" / chunk["file"]
    raw = bytearray(data.read_bytes())
    raw[chunk["file_offset"] + chunk["stored_bytes"] // 2] ^= 0x40
    data.write_bytes(bytes(raw))
    with pytest.raises(ckptio.CorruptCheckpoint) as e:
        ckptio.load(tmp_path / "b")
    assert data.name in str(e.value), e.value


def test_tensors_the_base_lacks_or_that_changed_shape_are_stored_whole(tmp_path: pathlib.Path) -> None:
    a = {"x": torch.randn(300, 300), "y": torch.randn(200, 300)}
    ckptio.save(a, tmp_path / "a", compress="all")
    b = {"x": a["x"] + 1e-4, "y": torch.randn(300, 200), "z": torch.randn(256, 256)}
    ckptio.save(b, tmp_path / "b", base=tmp_path / "a")
    info = {x["name"]: x for x in inspect(tmp_path / "b")["tensors"]}
    assert info["x"]["delta"] and not info["y"]["delta"] and not info["z"]["delta"], info
    assert same(ckptio.load(tmp_path / "b"), b)


def test_base_needs_compression_and_cannot_be_itself(tmp_path: pathlib.Path) -> None:
    ckptio.save({"x": np.ones(100000)}, tmp_path / "a")
    with pytest.raises(ckptio.InvalidRequest, match="compression is off"):
        ckptio.save({"x": np.ones(100000)}, tmp_path / "b", base=tmp_path / "a", compress="none")
    with pytest.raises(ckptio.CheckpointError, match="cannot be found"):
        ckptio.save({"x": np.ones(100000)}, tmp_path / "c", base=tmp_path / "nothing")
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


@pytest.mark.parametrize("async_save", [False, True])
def test_manager_full_every_keeps_chains_short_and_bases_alive(tmp_path: pathlib.Path,
                                                               async_save: bool) -> None:
    t = Trainer(3)
    states = {}
    with ckptio.Manager(tmp_path, keep=2, full_every=4, async_save=async_save) as m:
        for step in range(12):
            t.steps(1)
            states[step] = t.state()
            m.save(step, states[step])
        m.wait_until_finished()
        # Saves 0, 4, 8 are full; 9, 10, 11 deltas on the step before. keep=2 keeps 10 and 11,
        # and with them 9 and 8, their bases.
        assert m.all_steps() == [8, 9, 10, 11]
        assert [m.base_step(s) for s in m.all_steps()] == [None, 8, 9, 10]
        for s in m.all_steps():
            assert same(m.restore(s), states[s]), s
    # A new Manager over the same directory goes on with the chain where it stands.
    with ckptio.Manager(tmp_path, keep=2, full_every=4, async_save=False) as m:
        t.steps(1)
        m.save(12, t.state())
        assert m.base_step(12) is None  # 8 <- 9 <- 10 <- 11 is full_every long: a full save
        t.steps(1)
        m.save(13, t.state())
        assert m.base_step(13) == 12 and m.all_steps() == [12, 13]


def test_ranks_save_deltas_against_a_base_of_another_rank_count(tmp_path: pathlib.Path) -> None:
    g = torch.Generator().manual_seed(4)
    full = torch.randn(600, 256, generator=g)
    rows2 = [(0, 300), (300, 600)]
    trees = [{"w": ckptio.Shard(full[a:b].numpy(), (a, 0), (600, 256))} for a, b in rows2]
    for e in save_in_threads(trees, tmp_path / "base"):
        assert not isinstance(e, Exception), e
    nxt = full + 1e-3 * torch.randn(600, 256, generator=g)
    rows3 = [(0, 150), (150, 420), (420, 600)]

    def shards(t: torch.Tensor) -> list[dict]:
        return [{"w": ckptio.Shard(t[a:b].numpy(), (a, 0), (600, 256))} for a, b in rows3]

    out = save_in_threads(shards(nxt), tmp_path / "delta", 30.0, compress="all",
                          base=tmp_path / "base")
    for e in out:
        assert not isinstance(e, Exception), e
    info = {x["name"]: x for x in inspect(tmp_path / "delta")["tensors"]}
    assert info["w"]["delta"], info
    got = ckptio.load(tmp_path / "delta")["w"]
    assert np.array_equal(np.asarray(got).view(np.int32), nxt.numpy().view(np.int32))


KILL_SCRIPT = r"""
import sys, numpy as np, ckptio
base, path = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(5)
w = rng.standard_normal((1024, 1024)).astype(np.float32)
d = rng.standard_normal((1024, 1024)).astype(np.float32)
for i in range(1, 10_000):
    print(i, flush=True)
    ckptio.save({"w": w + np.float32(1e-3 * i) * d, "i": i}, path, base=base, overwrite=True)
"""


def test_a_delta_save_killed_anywhere_leaves_the_base_and_the_last_one_whole(
        tmp_path: pathlib.Path) -> None:
    import signal
    import threading
    import time

    rng = np.random.default_rng(5)
    w = rng.standard_normal((1024, 1024)).astype(np.float32)
    d = rng.standard_normal((1024, 1024)).astype(np.float32)
    ckptio.save({"w": w, "i": 0}, tmp_path / "base", compress="all")
    for delay in (0.05, 0.2, 0.45):
        p = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(tmp_path / "base"),
                              str(tmp_path / "delta")], stdout=subprocess.PIPE, text=True)
        watchdog = threading.Timer(120, p.kill)  # a child that stops printing cannot hang us
        watchdog.start()
        try:
            assert p.stdout is not None
            for _ in range(3):  # a few saves in, then at some point of the next one
                p.stdout.readline()
            time.sleep(delay)
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=60)
            watchdog.cancel()
        got = ckptio.load(tmp_path / "base")
        assert got["i"] == 0 and np.array_equal(got["w"], w)
        got = ckptio.load(tmp_path / "delta")  # the last save that committed, whole
        i = got["i"]
        assert i >= 1 and np.array_equal(got["w"], w + np.float32(1e-3 * i) * d), i
    assert {x["name"]: x for x in inspect(tmp_path / "delta")["tensors"]}["w"]["delta"]
    ckptio.save({"w": w, "i": -1}, tmp_path / "delta", base=tmp_path / "base", overwrite=True)
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]  # the dead saves' leftovers went
