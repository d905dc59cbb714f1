# SPDX-License-Identifier: Apache-2.0
"""Memory: what a load returns is freed as soon as the caller drops it, without the cycle
collector (nothing in a load may sit in a reference cycle)."""

from __future__ import annotations

import gc
import pathlib
import subprocess
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import ckptio

RSS_SCRIPT = """
import gc, os, sys
import numpy as np, ckptio

gc.disable()
page = os.sysconf("SC_PAGE_SIZE")


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page


path = sys.argv[1]
layers = [{"w": np.full(16 << 20, i, np.float32)} for i in range(4)]  # 4 x 64 MiB
ckptio.save({"model": {"layers": layers}, "step": 3}, path, fsync=False)
del layers
base = rss()
state = ckptio.load(path)
assert state["model"]["layers"][3]["w"][-1] == 3
loaded = rss()
del state
print(base, loaded, rss())
"""


def test_del_frees_a_loaded_state(tmp_path: pathlib.Path) -> None:
    res = subprocess.run(
        [sys.executable, "-c", RSS_SCRIPT, str(tmp_path / "ckpt")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    base, loaded, after = (int(x) for x in res.stdout.split())
    mib = 1 << 20
    assert loaded - base > 200 * mib, (base, loaded, after)  # the load did take the memory
    assert after - base < 32 * mib, f"{(after - base) / mib:.0f} MiB still resident after del"


@pytest.fixture
def no_gc() -> Iterator[None]:
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def leaves(tree: Any) -> Iterator[Any]:
    if isinstance(tree, dict):
        for v in tree.values():
            yield from leaves(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from leaves(v)
    else:
        yield tree


def assert_freed_on_del(load: Callable[[], Any]) -> None:
    out = load()
    refs = [weakref.ref(x) for x in leaves(out) if not isinstance(x, (int, float, str))]
    assert refs, out
    del out
    alive = [r() for r in refs if r() is not None]
    assert not alive, f"{len(alive)} of {len(refs)} loaded tensors outlive the result"


NESTED = {"model": {"layers": [{"w": np.arange(6.0).reshape(2, 3)}, {"w": np.ones(5000)}]}, "lr": 0.5}


def test_numpy_loads_are_freed_on_del(ckpt: pathlib.Path, no_gc: None) -> None:
    ckptio.save(NESTED, ckpt)
    assert_freed_on_del(lambda: ckptio.load(ckpt))
    assert_freed_on_del(lambda: ckptio.load(ckpt, keys=["model.layers.1"]))
    assert_freed_on_del(lambda: ckptio.load(ckpt, like={"model": {"layers": [{"w": np.zeros((2, 3))}]}}))
    with ckptio.open(ckpt) as r:
        assert_freed_on_del(lambda: r["model"])
        assert_freed_on_del(lambda: [r.read("model.layers.1.w", np.s_[10:20])])
        assert_freed_on_del(lambda: r.load())


def test_torch_loads_are_freed_on_del(ckpt: pathlib.Path, no_gc: None) -> None:
    torch = pytest.importorskip("torch")
    ckptio.save({"m": {"w": torch.ones(3, 4), "b": [torch.zeros(5000)]}, "p": torch.nn.Parameter(torch.ones(2))}, ckpt)
    assert_freed_on_del(lambda: ckptio.load(ckpt))
    assert_freed_on_del(lambda: ckptio.load(ckpt, framework="numpy"))
    ckptio.save(NESTED, ckpt, overwrite=True)
    assert_freed_on_del(lambda: ckptio.load(ckpt, framework="torch"))


def test_jax_loads_are_freed_on_del(ckpt: pathlib.Path, no_gc: None) -> None:
    jax = pytest.importorskip("jax")
    ckptio.save({"a": {"x": jax.numpy.ones((8, 4))}, "b": [jax.numpy.zeros(3)]}, ckpt)
    assert_freed_on_del(lambda: ckptio.load(ckpt))
