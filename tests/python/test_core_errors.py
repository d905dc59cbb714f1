# SPDX-License-Identifier: Apache-2.0
"""Errors from ckptio._core carry their parts as values: path, tensor, rank and message."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

import ckptio
from ckptio import _core
from ckptio._errors import USAGE, error


def _saved(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "c"
    ckptio.save({"x": np.arange(10), "y": np.ones(4, np.float32)}, path)
    return path


def test_open_failure_names_the_path(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ckptio.CheckpointNotFound) as e:
        _core.Reader(tmp_path / "nothing")
    assert e.value.path == os.fspath(tmp_path / "nothing")
    assert e.value.tensor is None and e.value.rank is None
    assert e.value.message == str(e.value) and e.value.name == "ENOENT"


def test_closed_reader_names_the_path(tmp_path: pathlib.Path) -> None:
    r = _core.Reader(_saved(tmp_path))
    r.close()
    with pytest.raises(ckptio.InvalidRequest, match="reader is closed") as e:
        r.tensors()
    assert e.value.path == os.fspath(tmp_path / "c") and e.value.name == "CKPTIO_E_STATE"


def test_writer_errors_name_the_tensor(tmp_path: pathlib.Path) -> None:
    with _core.Writer(tmp_path / "w") as w:
        with pytest.raises(ckptio.ShapeMismatch) as e:
            w.add("a", _core.dtypes()["i64"][0], (3,), np.arange(2))
        assert e.value.tensor == "a" and e.value.path == os.fspath(tmp_path / "w")
        assert "tensor 'a'" in e.value.message
        # In add_many, the item that failed, not the first or the last of its group.
        code = _core.dtypes()["i64"][0]
        items = [
            _core.AddItem(("b", code, None, np.arange(3), None, None)),
            _core.AddItem(("c", code, (5,), np.arange(2), None, None)),
            _core.AddItem(("d", code, None, np.arange(3), None, None)),
        ]
        with pytest.raises(ckptio.ShapeMismatch) as e:
            w.add_many(items)
        assert e.value.tensor == "c"
        with pytest.raises(ckptio.LimitExceeded) as e:
            w.add("e", code, (1,) * (_core.MAX_NDIM + 1), np.arange(1))
        assert e.value.tensor == "e"


def test_read_errors_name_the_tensor(tmp_path: pathlib.Path) -> None:
    path = _saved(tmp_path)
    with _core.Reader(path) as r:
        i = r.find("x")
        region = _core.read_region(i, (0,), (20,), _core.Buffer(4096), 0, 4096)
        with pytest.raises(ckptio.RegionOutOfRange) as e:
            r.read([region])
        assert e.value.tensor == "x" and e.value.path == os.fspath(path)
        with pytest.raises(ckptio.ShapeMismatch) as e:
            r.read([_core.read_region(i, (0, 0), None, _core.Buffer(4096), 0, 4096)])
        assert e.value.tensor == "x"


def test_collective_errors_name_the_rank(tmp_path: pathlib.Path) -> None:
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    with pytest.raises(ckptio.IncompleteTensor, match="tensor 'w'") as e:
        ckptio.save({"w": ckptio.Shard(a[:2], (0, 0), (4, 6))}, tmp_path / "d")
    assert e.value.rank == 0 and e.value.path == os.fspath(tmp_path / "d")


def test_python_raised_errors_have_the_same_attributes() -> None:
    e = error(USAGE, "refused")
    assert (e.path, e.tensor, e.rank) == (None, None, None)
    assert e.message == "refused" and e.name == "CKPTIO_E_USAGE"


def test_named_records_stay_tuples(tmp_path: pathlib.Path) -> None:
    with _core.Reader(_saved(tmp_path)) as r:
        st = r.read_stats()
        assert isinstance(st, tuple) and len(st) == 5
        assert st == (st.cache_bytes, st.device_bytes, st.requests, st.merged, st.verify_threads)
