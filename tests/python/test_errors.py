# SPDX-License-Identifier: Apache-2.0
"""Errors: the CheckpointError classes, their codes, and messages naming the path and tensor."""

from __future__ import annotations

import errno
import os
import pathlib

import numpy as np
import pytest

import ckptio


def test_class_hierarchy() -> None:
    for cls in (
        ckptio.CorruptCheckpoint, ckptio.ChecksumMismatch, ckptio.CheckpointExists,
        ckptio.NotACheckpoint, ckptio.TensorNotFound, ckptio.UnsupportedFormat,
        ckptio.UnsupportedDtype, ckptio.ShapeMismatch, ckptio.CheckpointIOError,
        ckptio.CheckpointNotFound,
    ):  # fmt: skip
        assert issubclass(cls, ckptio.CheckpointError)
    assert issubclass(ckptio.ChecksumMismatch, ckptio.CorruptCheckpoint)
    assert issubclass(ckptio.CheckpointExists, FileExistsError)
    assert issubclass(ckptio.CheckpointNotFound, FileNotFoundError)
    assert issubclass(ckptio.TensorNotFound, KeyError)


def test_missing_path(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ckptio.CheckpointNotFound) as e:
        ckptio.load(tmp_path / "nothing")
    assert e.value.errno == errno.ENOENT and e.value.name == "ENOENT"
    assert "nothing" in str(e.value)


def test_not_a_checkpoint(tmp_path: pathlib.Path) -> None:
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "data").mkdir()
    with pytest.raises(ckptio.NotACheckpoint) as e:
        ckptio.open(tmp_path / "half")
    assert e.value.code == -4008 and e.value.name == "CKPTIO_E_NOT_CHECKPOINT"
    assert "half" in str(e.value)


def test_exists(ckpt: pathlib.Path) -> None:
    ckptio.save({}, ckpt)
    with pytest.raises(ckptio.CheckpointExists) as e:
        ckptio.save({}, ckpt)
    assert str(ckpt) in str(e.value) and e.value.code == -4007


def flip_byte(ckpt: pathlib.Path, offset: int) -> None:
    data = ckpt / "data" / "000000.ckd"
    with open(data, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def test_corrupt_data_names_file_and_tensor(ckpt: pathlib.Path) -> None:
    ckptio.save({"good": np.zeros(4096, np.uint8), "bad": np.ones(100_000, np.float32)}, ckpt)
    with ckptio.open(ckpt) as r:
        (_, _, file, file_offset, _, _), = r._r.chunks(r.info("bad").index)
    flip_byte(ckpt, file_offset + 5000)
    with pytest.raises(ckptio.ChecksumMismatch) as e:
        ckptio.load(ckpt)
    msg = str(e.value)
    assert "bad" in msg and "000000.ckd" in msg
    assert ckptio.load(ckpt, keys=["good"])["good"].sum() == 0  # the intact tensor still loads
    with ckptio.open(ckpt) as r, pytest.raises(ckptio.CorruptCheckpoint, match="bad"):
        r.verify()
    # Without verification the damaged bytes come back as they are.
    assert ckptio.load(ckpt, checksums=False)["bad"].shape == (100_000,)


def test_corrupt_manifest(ckpt: pathlib.Path) -> None:
    ckptio.save({"a": np.zeros(3)}, ckpt)
    man = ckpt / "manifest"
    raw = bytearray(man.read_bytes())
    raw[len(raw) // 2] ^= 0x55
    man.write_bytes(bytes(raw))
    with pytest.raises(ckptio.CorruptCheckpoint) as e:
        ckptio.open(ckpt)
    assert "manifest" in str(e.value)


def test_tensor_not_found_names_it(ckpt: pathlib.Path) -> None:
    ckptio.save({"a": np.zeros(3)}, ckpt)
    with ckptio.open(ckpt) as r:
        with pytest.raises(ckptio.TensorNotFound, match="'b'") as e:
            r["b"]
        assert str(ckpt) in str(e.value)
        with pytest.raises(ckptio.TensorNotFound):
            r.read("b")


def test_region_outside_tensor(ckpt: pathlib.Path) -> None:
    ckptio.save({"a": np.zeros((4, 4))}, ckpt)
    with ckptio.open(ckpt) as r, pytest.raises(IndexError):
        r.read("a", np.s_[:, 9])


def test_io_error_is_an_oserror(tmp_path: pathlib.Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    try:
        if os.access(ro, os.W_OK):  # root ignores permissions
            pytest.skip("running as root: permissions are not enforced")
        with pytest.raises(ckptio.CheckpointIOError) as e:
            ckptio.save({}, ro / "ckpt")
        assert isinstance(e.value, OSError) and e.value.errno == errno.EACCES
    finally:
        os.chmod(ro, 0o700)


def test_parent_directories_are_created(tmp_path: pathlib.Path) -> None:
    ckptio.save({"a": np.zeros(1)}, tmp_path / "no" / "such" / "dir")
    assert ckptio.load(tmp_path / "no" / "such" / "dir")["a"].tolist() == [0.0]


def test_parent_is_a_file(tmp_path: pathlib.Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises((ckptio.CheckpointError, OSError)) as e:
        ckptio.save({"a": np.zeros(1)}, tmp_path / "file" / "ckpt")
    assert "file" in str(e.value)


def test_error_attributes() -> None:
    e = ckptio._errors._from_code(-4013, "CKPTIO_E_CORRUPT", "x: broken")
    assert type(e) is ckptio.CorruptCheckpoint and e.code == -4013 and str(e) == "x: broken"
    e = ckptio._errors._from_code(-errno.ENOSPC, "ENOSPC", "disk full writing 'p'")
    assert type(e) is ckptio.CheckpointIOError and e.errno == errno.ENOSPC
    assert str(e) == "disk full writing 'p'"
