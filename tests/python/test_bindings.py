# SPDX-License-Identifier: Apache-2.0
"""The C binding's bounds: more dimensions than the format holds, region tuples that do not
match the tensor, dicts whose order is not their hash table's."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
from collections import OrderedDict

import numpy as np
import pytest

import ckptio
from ckptio import _core

MAX = _core.MAX_NDIM


@pytest.mark.parametrize("ndim", [MAX + 1, 40, 64])
def test_too_many_dimensions_is_refused(ckpt: pathlib.Path, ndim: int) -> None:
    a = np.zeros((1,) * ndim, np.float32)  # numpy allows up to 64
    with pytest.raises(ckptio.LimitExceeded) as e:
        ckptio.save({"deep": a}, ckpt)
    assert "'deep'" in str(e.value) and f"{ndim} dimensions" in str(e.value)
    assert f"at most {MAX}" in str(e.value) and e.value.name == "CKPTIO_E_LIMIT"
    assert not ckpt.exists()


def test_too_many_dimensions_other_paths(ckpt: pathlib.Path) -> None:
    # Not C-contiguous (copied by Python, added through Writer.add), a non-native dtype (raw
    # bytes: one more dimension), and the flat tensor list of Writer.add_many.
    strided = np.zeros((1,) * (MAX - 1) + (2, 2), np.float32).swapaxes(-1, -2)
    assert not strided.flags.c_contiguous
    for tree in ({"s": strided}, {"s": np.zeros((1,) * MAX, "M8[s]")}, {"s": [np.zeros((1,) * 50)]}):
        with pytest.raises(ckptio.LimitExceeded, match=f"'s.*at most {MAX}"):
            ckptio.save(tree, ckpt)
    with _core.Writer(str(ckpt)) as w, pytest.raises(ckptio.LimitExceeded, match="'x'"):
        w.add("x", 1, (1,) * (MAX + 1), b"\0")
    # The limit itself is fine.
    ckptio.save({"s": np.ones((1,) * MAX, np.float32)}, ckpt)
    assert ckptio.load(ckpt)["s"].shape == (1,) * MAX


def test_region_tuples_must_match_the_tensor(ckpt: pathlib.Path) -> None:
    ckptio.save({"a": np.arange(24.0).reshape(2, 3, 4)}, ckpt)
    with ckptio.open(ckpt) as r:
        buf = _core.Buffer(4096)
        bad = [
            ((0, 0), (2, 3, 4)),  # offset too short: the library would read past it
            ((0, 0, 0), (2, 3)),
            ((0, 0, 0, 0), (2, 3, 4, 1)),
            (None, (1,)),
        ]
        for off, shape in bad:
            with pytest.raises(ckptio.ShapeMismatch) as e:
                r._r.read([(0, off, shape, buf, 0, 4096)])
            msg = str(e.value)
            assert "'a' has 3 dimensions" in msg and str(ckpt) in msg, msg
        with pytest.raises(ckptio.LimitExceeded, match="'a'"):
            r._r.read([(0, (0,) * 70, None, buf, 0, 4096)])
        # A well-formed region still reads.
        r._r.read([(0, (1, 0, 0), (1, 3, 4), buf, 0, 4096)])
        assert np.frombuffer(buf, np.float64, 12).tolist() == list(range(12, 24))


def test_ordered_dict_order(ckpt: pathlib.Path) -> None:
    # An OrderedDict's order differs from its hash table's after move_to_end; the C loop over
    # a dict's arrays must follow the order Python's part of the saver uses.
    od = OrderedDict(a=np.ones(3), b=5, c=np.zeros(2), d="x")
    od.move_to_end("a")
    ckptio.save({"m": od}, ckpt)
    out = ckptio.load(ckpt)["m"]
    assert list(out) == ["b", "c", "d", "a"]
    assert out["b"] == 5 and out["d"] == "x" and out["a"].tolist() == [1, 1, 1]


RACE = """
import sys, threading, numpy as np, ckptio
d = {f"k{i}": np.full(1, i % 251, np.uint8) for i in range(3000)}
stop = False


def grow():  # runs whenever the saver releases the GIL
    k = 0
    while not stop and k < 200_000:
        d[f"new{k}"] = np.zeros(1, np.uint8)
        k += 1


sys.setswitchinterval(1e-6)
t = threading.Thread(target=grow)
t.start()
try:
    ckptio.save({"m": d}, sys.argv[1], fsync=False)
finally:
    stop = True
    t.join()
m = ckptio.load(sys.argv[1])["m"]
assert all(m[f"k{i}"][0] == i % 251 for i in range(3000))
print("ok", len(m))
"""


def test_dict_changed_by_another_thread_during_save(ckpt: pathlib.Path) -> None:
    # The saver's C loop releases the GIL between groups of arrays while iterating a dict
    # that another thread keeps growing: it must save a consistent snapshot, not run past
    # the end of its lists.
    for _ in range(3):
        res = subprocess.run(
            [sys.executable, "-c", RACE, str(ckpt)], capture_output=True, text=True, timeout=300
        )
        assert res.returncode == 0 and res.stdout.startswith("ok"), res.stdout + res.stderr
        shutil.rmtree(ckpt)
