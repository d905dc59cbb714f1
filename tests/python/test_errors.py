# SPDX-License-Identifier: Apache-2.0
"""Errors: the CheckpointError classes, their codes, and messages naming the path and tensor."""

from __future__ import annotations

import errno
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

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
    # The same as values: the tensor, the data file and the damaged block's offset in it.
    data_file = os.path.join(os.fspath(ckpt), file)
    assert e.value.tensor == "bad" and e.value.path == os.fspath(ckpt), vars(e.value)
    assert e.value.file == data_file and e.value.offset == file_offset, vars(e.value)
    assert ckptio.load(ckpt, keys=["good"])["good"].sum() == 0  # the intact tensor still loads
    with ckptio.open(ckpt) as r, pytest.raises(ckptio.CorruptCheckpoint) as e:
        r.verify()
    assert "'bad'" in str(e.value) and "000000.ckd" in str(e.value), str(e.value)
    assert (e.value.tensor, e.value.file) == ("bad", data_file), vars(e.value)
    # Without verification the damaged bytes come back as they are: only the flipped one differs.
    got = ckptio.load(ckpt, checksums=False)["bad"].view(np.uint8)
    want = np.ones(100_000, np.float32).view(np.uint8).copy()
    want[5000] ^= 0xFF
    assert np.array_equal(got, want)


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
    with ckptio.open(ckpt) as r:
        # Past the end: the library decides, and its message says where.
        with pytest.raises(ckptio.RegionOutOfRange) as e:
            r.read("a", np.s_[:, 9])
        assert e.value.name == "CKPTIO_E_RANGE" and e.value.code == ckptio._core.errors()["CKPTIO_E_RANGE"]
        assert "'a'" in str(e.value) and "9" in str(e.value) and "past its size 4" in str(e.value)
        assert isinstance(e.value, IndexError)
        # Before the start and too many indices: refused before any read, also naming the tensor.
        for region in (np.s_[:, -5], np.s_[1, 2, 3]):
            with pytest.raises(ckptio.RegionOutOfRange, match="'a'"):
                r.read("a", region)


def test_bad_requests_are_checkpoint_errors(ckpt: pathlib.Path) -> None:
    ckptio.save({"a": np.zeros(3)}, ckpt)
    with pytest.raises(ckptio.InvalidRequest, match="framework") as e:
        ckptio.load(ckpt, framework="tensorflow")
    assert isinstance(e.value, ValueError) and e.value.name == "CKPTIO_E_USAGE"
    with pytest.raises(ckptio.InvalidType, match="builtins.object at 'x'") as t:
        ckptio.save({"x": object()}, ckpt, overwrite=True)
    assert isinstance(t.value, TypeError) and isinstance(t.value, ckptio.CheckpointError)
    with pytest.raises(ckptio.InvalidType, match="dict key"):
        ckptio.save({1.5: np.zeros(1)}, ckpt, overwrite=True)
    with pytest.raises(ckptio.InvalidType, match="unknown I/O option"):
        ckptio.save({}, ckpt, overwrite=True, speed=3)
    with pytest.raises(ckptio.DuplicateTensor, match="a.b"):
        ckptio.save({"a.b": np.zeros(1), "a": {"b": np.zeros(1)}}, ckpt, overwrite=True)
    with ckptio.open(ckpt) as r, pytest.raises(ckptio.InvalidRequest, match="negative steps"):
        r.read("a", np.s_[::-1])


def test_error_codes_come_from_the_library() -> None:
    table = ckptio._core.errors()
    for name, code in table.items():
        e = ckptio._errors._from_code(code, name, "m")
        assert e.code == code and e.name == name and isinstance(e, ckptio.CheckpointError)
        assert ckptio._core.strerror(code)[0] == name
        assert type(e) is not ckptio.CheckpointIOError, name  # every code has its class
    e = ckptio._errors.error("CKPTIO_E_RANGE", "r")
    assert type(e) is ckptio.RegionOutOfRange and e.code == table["CKPTIO_E_RANGE"]


FULL_DISK = """
import errno, sys, numpy as np, ckptio
try:
    ckptio.save({"a": np.ones(4 << 20, np.uint8)}, sys.argv[1] + "/ckpt")
except ckptio.CheckpointIOError as e:
    assert isinstance(e, OSError), type(e).__mro__
    print(e.errno, e.name, str(e), sep="|")
else:
    print("saved")
"""


def test_io_error_is_an_oserror(tmp_path: pathlib.Path) -> None:
    # A full file system: a 1 MiB tmpfs in a private mount namespace (as root, how tests run).
    if shutil.which("unshare") is None:
        pytest.skip("no unshare command")
    mnt = tmp_path / "small"
    mnt.mkdir()
    script = f"mount -t tmpfs -o size=1m ckptio-test {mnt} && exec {sys.executable} -c \"$0\" {mnt}"
    res = subprocess.run(["unshare", "-m", "sh", "-c", script, FULL_DISK], capture_output=True, text=True, timeout=120)
    if res.returncode != 0 and "mount" in res.stderr and "ckptio" not in res.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    assert res.returncode == 0, res.stderr
    code, name, msg = res.stdout.strip().split("|", 2)
    assert int(code) == errno.ENOSPC and name == "ENOSPC", res.stdout
    assert str(mnt) in msg, msg


def test_parent_directories_are_created(tmp_path: pathlib.Path) -> None:
    ckptio.save({"a": np.zeros(1)}, tmp_path / "no" / "such" / "dir")
    assert ckptio.load(tmp_path / "no" / "such" / "dir")["a"].tolist() == [0.0]


def test_parent_is_a_file(tmp_path: pathlib.Path) -> None:
    (tmp_path / "file").write_text("x")
    for dest in (tmp_path / "file" / "ckpt", tmp_path / "file" / "sub" / "ckpt"):
        with pytest.raises(ckptio.CheckpointIOError) as e:
            ckptio.save({"a": np.zeros(1)}, dest)
        assert e.value.errno == errno.ENOTDIR and e.value.name == "ENOTDIR"
        assert f"'{tmp_path / 'file'}' is a file" in str(e.value) and str(dest) in str(e.value)
    assert (tmp_path / "file").read_text() == "x"


def test_error_attributes() -> None:
    e = ckptio._errors._from_code(-4013, "CKPTIO_E_CORRUPT", "x: broken")
    assert type(e) is ckptio.CorruptCheckpoint and e.code == -4013 and str(e) == "x: broken"
    e = ckptio._errors._from_code(-errno.ENOSPC, "ENOSPC", "disk full writing 'p'")
    assert type(e) is ckptio.CheckpointIOError and e.errno == errno.ENOSPC
    assert str(e) == "disk full writing 'p'"
    # The values the library did not give are None (refused: False), on every class.
    assert (e.file, e.offset, e.other_rank, e.refused) == (None, None, None, False)


def test_rebuilt_errors_keep_their_values(tmp_path: pathlib.Path) -> None:
    """An exception the Python layer rebuilds (torch's RuntimeError twin) keeps the values."""
    e = ckptio._errors._from_code(-4014, "CKPTIO_E_CHECKSUM", "checksum mismatch in tensor 'w'")
    e.tensor, e.file, e.offset, e.path = "w", "/c/data/000000.ckd", 4096, "/c"
    pytest.importorskip("torch")
    from ckptio import torch as ct

    out = ct._as_runtime_error(e)
    assert isinstance(out, RuntimeError) and isinstance(out, ckptio.ChecksumMismatch)
    assert (out.tensor, out.file, out.offset, out.path) == ("w", "/c/data/000000.ckd", 4096, "/c")


def test_a_scheme_no_store_serves_is_refused(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """az:// (no store serves it yet) is an error naming the schemes there are, never a local
    directory called "az:"; the library's one URL parser answers the bindings."""
    monkeypatch.chdir(tmp_path)
    for call in (lambda: ckptio.save({"w": np.zeros(3)}, "az://bucket/ck"),
                 lambda: ckptio.load("az://bucket/ck")):  # fmt: skip
        with pytest.raises(ckptio.InvalidRequest, match="no store serves 'az://' URLs.*s3://, gs://"):
            call()
    assert list(tmp_path.iterdir()) == []
    assert ckptio._core.store_name("s3://b/k") == "s3" and ckptio._core.store_name("d") == "posix"
    assert ckptio._core.store_name("gs://b/k") == "gcs"
