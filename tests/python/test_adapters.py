# SPDX-License-Identifier: Apache-2.0
"""The Python layer's seams: save as stage + write, the framework adapters' registry, the alias
table, and the named records passed to and from the C binding."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest

import ckptio
from ckptio import _core, _dtypes, _options, _save, _stage
from ckptio.frameworks import _base
from ckptio.frameworks import _registry as _adapters


def test_params_are_passed_by_the_librarys_names(ckpt: pathlib.Path) -> None:
    p = _options.params({"queue_depth": 4, "direct": False}, overwrite=True)
    assert set(p) == set(_core.PARAMS)  # one name per C field, none missing, none extra
    assert p["queue_depth"] == 4 and p["direct"] == 0 and p["overwrite"] == 1
    with pytest.raises(TypeError, match="unknown name"):
        _core.Writer(str(ckpt), {**p, "queue_dept": 4})
    with pytest.raises(ckptio.InvalidRequest, match="direct = 7"):
        _core.Writer(str(ckpt), {**p, "direct": 7})
    with pytest.raises(ckptio.InvalidRequest, match="queue_depth"):  # was cut to 32 bits
        ckptio.save({}, ckpt, queue_depth=1 << 32)
    with _core.Writer(str(ckpt), {"fsync": 0}) as w:  # absent names keep the defaults
        w.set_meta("k", b"v")
        st = w.commit()
    assert isinstance(st, _core.IOStats) and st.bytes == 0 and st.backend in ("io_uring", "psync")


def test_records_have_named_fields(ckpt: pathlib.Path) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    with _core.Writer(str(ckpt)) as w:
        # shape None: the data buffer's own
        w.add_many([_core.AddItem(("a", _dtypes.F32, None, a, None, None))])
        w.add_many([_core.AddItem(("b", _dtypes.F32, (4,), a[0], (0,), (3,)))])
        w.add("b", _dtypes.F32, (4,), np.ones(1, np.float32), (3,), (1,))
        st = w.commit()
    assert (st.bytes, st.tensors) == (40, 2)
    with ckptio.open(ckpt) as r:
        recs = r._r.tensors()
        assert [(t.name, t.dtype, t.shape, t.nbytes, t.num_chunks) for t in recs] == [
            ("a", _dtypes.F32, (2, 3), 24, 1),
            ("b", _dtypes.F32, (4,), 16, 2),
        ]
        ch = r._r.chunks(1)
        assert [(c.offset, c.shape) for c in ch] == [((0,), (3,)), ((3,), (1,))]
        assert all(c.nbytes == 4 * c.shape[0] and c.file for c in ch)
        out = np.zeros(2, np.float32)
        r._r.read([_core.read_region(1, (2,), (2,), out, 0, 8)])
        assert out.tolist() == [2.0, 1.0]
        assert r.stats().tensors == 1


def test_add_item_without_shape_must_be_a_whole_tensor(ckpt: pathlib.Path) -> None:
    with _core.Writer(str(ckpt)) as w, pytest.raises(ckptio.InvalidRequest, match="'c'"):
        w.add_many([_core.AddItem(("c", _dtypes.F32, None, np.ones(2, np.float32), (0,), None))])


def test_stage_writes_nothing_and_the_tree_may_change_after(ckpt: pathlib.Path) -> None:
    a = np.arange(4.0)
    tree = {"a": a, "step": 3, "l": [np.ones(2), a], "s": np.float32(2.5)}
    staged = _stage._stage(tree, metadata={"run": "x"})
    assert not ckpt.exists() and not ckpt.parent.joinpath("ckpt").exists()
    tree["step"] = 4  # already encoded
    del tree["l"]  # the staged items keep the arrays alive
    st = _save._write(staged, ckpt, _options.params({}))
    assert st.bytes == 32 + 16 + 4
    out = ckptio.load(ckpt)
    assert out["step"] == 3 and out["l"][1] is out["a"] and out["s"] == np.float32(2.5)
    assert ckptio.open(ckpt).metadata == {"run": "x"}


def test_deferred_items_are_written_in_batches(
    ckpt: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Device tensors' host copies are made at write time, flushed in batches (this path is
    otherwise reached only with a GPU)."""
    made: list[int] = []

    def make(i: int) -> list[object]:
        made.append(i)
        return [_core.AddItem((f"d{i}", _dtypes.I64, (3,), np.full(3, i), None, None))]

    staged = _stage._stage({"x": np.zeros(2)})
    staged.items += [_base.Deferred(24, lambda i=i: make(i)) for i in range(5)]
    staged.deferred = True
    monkeypatch.setattr(_save, "_TRANSIENT_BATCH", 48)
    flushes: list[int] = []
    real = _core.Writer

    class Counting:
        def __init__(self, *args: object) -> None:
            self.w = real(*args)

        def __enter__(self) -> Counting:
            return self

        def __exit__(self, *exc: object) -> None:
            self.w.close()

        def __getattr__(self, name: str) -> object:
            return getattr(self.w, name)

        def flush(self) -> None:
            flushes.append(len(made))
            self.w.flush()

    monkeypatch.setattr(_core, "Writer", Counting)
    _save._write(staged, ckpt, _options.params({}))
    assert made == [0, 1, 2, 3, 4] and flushes == [2, 4]
    with ckptio.open(ckpt) as r:
        infos = r.tensors()
        assert sorted(infos) == ["d0", "d1", "d2", "d3", "d4", "x"]
        for i in range(5):
            out = np.zeros(3, np.int64)
            r._r.read([_core.read_region(infos[f"d{i}"].index, None, None, out, 0, 24)])
            assert out.tolist() == [i] * 3


def test_one_alias_rule_for_the_c_loop_and_python(ckpt: pathlib.Path) -> None:
    a = np.arange(3.0)
    s = np.float64(1.0)
    tree = {"d": {"a": a, "again": a}, "l": [a, s, s], "t": (a,)}
    staged = _stage._stage(tree)
    assert [it.name for it in staged.items if type(it) is _core.AddItem] == ["d.a", "l.1"]
    _save._write(staged, ckpt, _options.params({}))
    out = ckptio.load(ckpt)
    assert out["d"]["again"] is out["d"]["a"] and out["l"][0] is out["d"]["a"]
    assert out["t"][0] is out["d"]["a"] and out["l"][2] == out["l"][1] == 1.0


def test_registry_order_and_lazy_frameworks() -> None:
    assert [ad.name for ad in _adapters.REGISTRY] == ["numpy", "torch", "jax", "cupy"]
    assert _adapters.classify(np.zeros(1)) is _adapters.get("numpy")
    assert _adapters.classify(object()) is None
    code = "import sys, ckptio, numpy as np, tempfile, os; "
    code += "ckptio.save({'a': np.ones(2)}, os.path.join(tempfile.mkdtemp(), 'c')); "
    code += "print('torch' in sys.modules, 'jax' in sys.modules, 'cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]
