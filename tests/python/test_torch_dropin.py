# SPDX-License-Identifier: Apache-2.0
"""ckptio.torch.save/load as drop-ins for torch.save/load: arguments, modes, errors, memory."""

from __future__ import annotations

import gc
import io
import os
import pathlib
import pickle
import zipfile

import pytest
import torch

import ckptio
import ckptio.torch as ct


def sd() -> dict[str, torch.Tensor]:
    return {"w": torch.randn(64, 32), "b": torch.arange(10, dtype=torch.int64)}


def equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---- torch.save's own arguments ----


def test_save_takes_torch_positional_arguments(tmp_path: pathlib.Path) -> None:
    obj = sd()
    path = tmp_path / "pos.pt"
    # torch.save(obj, f, pickle_module, pickle_protocol, _use_new_zipfile_serialization,
    #            _disable_byteorder_record)
    ct.save(obj, path, pickle, 2, True, False)
    assert equal(torch.load(path, weights_only=True), obj)
    buf = io.BytesIO()
    ct.save(obj, buf, pickle, 4, True, True)
    buf.seek(0)
    assert equal(torch.load(buf, weights_only=False), obj)
    assert buf.getvalue().find(b"\x80\x04") >= 0  # pickle protocol 4 was used


@pytest.mark.parametrize("to_path", [True, False])
def test_save_legacy_format_like_torch(tmp_path: pathlib.Path, to_path: bool) -> None:
    obj = sd()
    f: io.BytesIO | pathlib.Path = tmp_path / "old.pt" if to_path else io.BytesIO()
    ct.save(obj, f, _use_new_zipfile_serialization=False)
    ref = io.BytesIO()
    torch.save(obj, ref, _use_new_zipfile_serialization=False)
    data = f.read_bytes() if isinstance(f, pathlib.Path) else f.getvalue()
    assert not zipfile.is_zipfile(io.BytesIO(data))
    # The legacy format names storages by address; everything else is byte for byte torch's.
    assert data[:64] == ref.getvalue()[:64]
    assert len(data) == len(ref.getvalue())
    assert equal(torch.load(io.BytesIO(data), weights_only=True), obj)
    if isinstance(f, pathlib.Path):
        assert equal(ct.load(f), obj)


@pytest.mark.parametrize("to_path", [True, False])
def test_save_disable_byteorder_record(tmp_path: pathlib.Path, to_path: bool) -> None:
    obj = sd()

    def records(data: bytes) -> list[str]:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return [n.split("/", 1)[1] for n in z.namelist()]

    for disable in (False, True):
        f: io.BytesIO | pathlib.Path = tmp_path / f"bo{disable}.pt" if to_path else io.BytesIO()
        ct.save(obj, f, _disable_byteorder_record=disable)
        data = f.read_bytes() if isinstance(f, pathlib.Path) else f.getvalue()
        ref = io.BytesIO()
        torch.save(obj, ref, _disable_byteorder_record=disable)
        assert records(data) == records(ref.getvalue())  # the same records, in torch's order
        assert equal(torch.load(io.BytesIO(data), weights_only=True), obj)


def test_io_options_dict_and_keyword_compat(tmp_path: pathlib.Path) -> None:
    obj = sd()
    path = tmp_path / "o.pt"
    ct.save(obj, path, io_options={"fsync": False, "crc32": False, "backend": "psync"})
    assert equal(ct.load(path, io_options={"backend": "psync"}), obj)
    with pytest.raises(ckptio.CheckpointExists):
        ct.save(obj, path, io_options={"overwrite": False})
    with pytest.raises(ckptio.CheckpointExists):
        ct.save(obj, path, io_options={"overwrite": False}, _use_new_zipfile_serialization=False)
    ct.save(obj, path, crc32=False, fsync=False)  # the keyword form older versions took
    with pytest.raises(TypeError, match="unexpected keyword argument 'frobnicate'"):
        ct.save(obj, path, frobnicate=1)
    with pytest.raises(TypeError, match="frobnicate"):
        ct.save(obj, path, io_options={"frobnicate": 1})


# ---- torch.serialization.skip_data ----


def test_save_under_skip_data_matches_torch(tmp_path: pathlib.Path) -> None:
    obj = {"w": torch.randn(1000, 10), "b": torch.randn(3), "step": 7}
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    with torch.serialization.skip_data():
        ct.save(obj, a)
        torch.save(obj, b)
    got, ref = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    assert got["step"] == ref["step"] == 7
    for k in ("w", "b"):
        assert got[k].shape == obj[k].shape
        assert torch.equal(got[k], ref[k])  # the skipped bytes read back as torch's holes do
    assert torch.equal(ct.load(a)["w"], got["w"])
    with torch.serialization.skip_data():  # torch refuses this combination; so does ckptio
        with pytest.raises(RuntimeError, match="skip_data"):
            ct.save(obj, a, _use_new_zipfile_serialization=False)


def test_file_writer_seeks_forward_only(tmp_path: pathlib.Path) -> None:
    from ckptio import _core

    with _core.FileWriter(str(tmp_path / "s"), None) as fw:
        fw.write(b"ab")
        assert fw.seek(3, os.SEEK_CUR) == 5
        assert fw.seek(8) == 8
        assert fw.seek(0, os.SEEK_END) == 8
        with pytest.raises(io.UnsupportedOperation):
            fw.seek(1)
        fw.write(b"z")
        fw.commit()
    assert (tmp_path / "s").read_bytes() == b"ab" + bytes(6) + b"z"


# ---- memory: each loaded storage is freed with its tensors ----


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_small_tensor_does_not_pin_the_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "m.pt"
    big = 100 << 20
    ct.save({"big": torch.ones(big // 4), "tiny": torch.tensor([1.0, 2.0])}, path)
    gc.collect()
    gc.disable()
    try:
        loaded = ct.load(path)
        tiny = loaded["tiny"]
        assert float(loaded["big"][-1]) == 1.0
        before = _rss()
        del loaded
        after = _rss()
        # torch.load frees the big storage here; one buffer for the whole file would not be.
        assert before - after > 0.8 * big, (before, after)
        assert torch.equal(tiny, torch.tensor([1.0, 2.0]))
        assert tiny.untyped_storage().nbytes() == 8
    finally:
        gc.enable()


def test_many_small_tensors_cost_no_page_each(tmp_path: pathlib.Path) -> None:
    n = 20000
    path = tmp_path / "small.pt"
    ct.save({f"s{i}": torch.tensor(float(i)) for i in range(n)}, path)
    gc.collect()
    before = _rss()
    got = ct.load(path)
    grown = _rss() - before
    # torch.load grows by about 13 MB here; a page-aligned buffer per storage would be over
    # n * 4096 = 80 MB (and the file itself is that large: its records are page-aligned).
    assert grown < n * 4096 * 0.6, grown
    assert all(float(got[f"s{i}"]) == i for i in range(0, n, 997))


def test_shared_storages_and_views_survive(tmp_path: pathlib.Path) -> None:
    base = torch.arange(100.0)
    obj = {"a": base[10:20], "b": base[50:], "c": base, "e": torch.empty(0)}
    path = tmp_path / "v.pt"
    ct.save(obj, path)
    got = ct.load(path)
    for k in obj:
        assert torch.equal(got[k], obj[k])
    assert got["a"].untyped_storage().data_ptr() == got["c"].untyped_storage().data_ptr()
    got["c"][15] = -1.0
    assert float(got["a"][5]) == -1.0
    assert got["e"].numel() == 0


# ---- file modes ----


def test_new_file_honours_umask(tmp_path: pathlib.Path) -> None:
    old = os.umask(0o027)
    try:
        ct.save(sd(), tmp_path / "n.pt")
        torch.save(sd(), tmp_path / "t.pt")
    finally:
        os.umask(old)
    mode = (tmp_path / "n.pt").stat().st_mode & 0o777
    assert mode == (tmp_path / "t.pt").stat().st_mode & 0o777 == 0o640


def test_existing_file_keeps_its_mode(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "keep.pt"
    path.write_bytes(b"old")
    path.chmod(0o600)
    obj = sd()
    ct.save(obj, path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert equal(ct.load(path), obj)


# ---- errors a torch user catches ----


@pytest.mark.parametrize("save", [torch.save, ct.save], ids=["torch", "ckptio"])
def test_save_errors_are_runtime_errors(tmp_path: pathlib.Path, save: object) -> None:
    with pytest.raises(RuntimeError):
        save(sd(), tmp_path / "missing" / "x.pt")  # type: ignore[operator]
    with pytest.raises(RuntimeError):
        save(sd(), tmp_path)  # type: ignore[operator]


def test_save_errors_stay_ckptio_errors(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ckptio.CheckpointError) as e:
        ct.save(sd(), tmp_path / "missing" / "x.pt")
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, RuntimeError)
    assert "missing" in str(e.value)
    with pytest.raises(ckptio.CheckpointExists):
        ct.save(sd(), tmp_path)


@pytest.mark.parametrize("load", [torch.load, ct.load], ids=["torch", "ckptio"])
def test_load_errors_like_torch(tmp_path: pathlib.Path, load: object) -> None:
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "missing.pt")  # type: ignore[operator]
    with pytest.raises(IsADirectoryError):
        load(tmp_path)  # type: ignore[operator]




def test_load_read_errors_are_runtime_errors(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "e.pt"
    ct.save(sd(), path)

    def failing_read(*args: object) -> None:
        raise ckptio._errors._from_code(-5, "EIO", f"cannot read {path} at offset 4096 (EIO)")

    monkeypatch.setattr(ct._core, "file_read", failing_read)
    with pytest.raises(RuntimeError) as e:  # what torch.load raises for an unreadable archive
        ct.load(path)
    assert isinstance(e.value, ckptio.CheckpointError) and isinstance(e.value, OSError)
    assert "offset 4096" in str(e.value)


# ---- weights_only: torch.load's errors and warnings, word for word ----


class Unsafe:
    """Not a weights-only global."""


def test_weights_only_refusal_is_torch_loads_error(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "u.pt"
    ct.save({"u": Unsafe(), "w": torch.ones(2)}, path)
    with pytest.raises(pickle.UnpicklingError) as want:
        torch.load(path, weights_only=True)
    with pytest.raises(pickle.UnpicklingError) as got:
        ct.load(path, weights_only=True)
    assert str(got.value) == str(want.value)
    assert "add_safe_globals" in str(got.value)
    with torch.serialization.safe_globals([Unsafe]):
        assert isinstance(ct.load(path, weights_only=True)["u"], Unsafe)


def test_force_no_weights_only_env_warns_like_torch(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.pt"
    ct.save(torch.nn.Linear(3, 5), path)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    for load in (torch.load, ct.load):
        with pytest.warns(UserWarning, match="forcing weights_only=False"):
            assert isinstance(load(path), torch.nn.Linear)
        with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
            load(path, weights_only=True)  # an explicit weights_only wins over the variable
    monkeypatch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(RuntimeError, match="but both were set"):
        ct.load(path)


# ---- the archive ckptio's zip writer makes (C: CRC-32s computed while the data is written) ----


def _records_check(path: pathlib.Path) -> list[zipfile.ZipInfo]:
    """Every record's CRC-32 is zlib's of its data, and zipfile's own check passes."""
    import zlib

    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None
        for info in z.infolist():
            crc = 0
            with z.open(info) as f:
                while chunk := f.read(64 << 20):
                    crc = zlib.crc32(chunk, crc)
            assert info.CRC == crc, info.filename
            assert info.compress_type == zipfile.ZIP_STORED
        return z.infolist()


def test_one_gib_archive_stock_load_and_crcs(tmp_path: pathlib.Path) -> None:
    g = torch.Generator().manual_seed(5)
    obj = {"big": torch.randn(1 << 28, generator=g), "small": torch.arange(7), "step": 3}
    path = tmp_path / "one_gib.pt"
    ct.save(obj, path)
    infos = _records_check(path)
    names = [i.filename for i in infos]
    # torch's records in torch's order, under torch's archive name for this file
    assert names == [f"one_gib/{n}" for n in ("data.pkl", ".format_version", ".storage_alignment",
                     "byteorder", "data/0", "data/1", "version", ".data/serialization_id")]  # fmt: skip
    with open(path, "rb") as f:  # every record's data at a multiple of the storage alignment
        for i in infos:
            f.seek(i.header_offset + 26)
            n, m = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
            assert (i.header_offset + 30 + n + m) % ct.STORAGE_ALIGNMENT == 0
    got = torch.load(path, weights_only=True)
    assert equal({k: got[k] for k in ("big", "small")}, {k: obj[k] for k in ("big", "small")})
    assert got["step"] == 3
    del got
    assert torch.equal(ct.load(path)["big"], obj["big"])


def test_crc32_off_leaves_zeros_torch_still_loads(tmp_path: pathlib.Path) -> None:
    obj = sd()
    path = tmp_path / "nocrc.pt"
    ct.save(obj, path, io_options={"crc32": False})
    with zipfile.ZipFile(path) as z:
        assert all(i.CRC == 0 for i in z.infolist() if i.file_size)
    assert equal(torch.load(path, weights_only=True), obj)
    from torch.utils.serialization import config

    with config.patch({"save.compute_crc32": False}):  # torch's own switch is followed too
        ct.save(obj, path)
    with zipfile.ZipFile(path) as z:
        assert all(i.CRC == 0 for i in z.infolist() if i.file_size)
    ct.save(obj, path)
    _records_check(path)


def test_archive_names_follow_torch(tmp_path: pathlib.Path) -> None:
    for name, stem in (("a.b.pt", "a.b"), ("noext", "noext"), (".hidden", "archive")):
        ct.save(sd(), tmp_path / name)
        with zipfile.ZipFile(tmp_path / name) as z:
            assert z.namelist()[0] == f"{stem}/data.pkl"


def test_past_four_gib_zip64(tmp_path: pathlib.Path) -> None:
    """A storage of 4 GiB + 4099 bytes (zero pages of an anonymous map: no memory used), and a
    record after it at an offset past 32 bits: torch's reader finds both."""
    import mmap

    import numpy as np

    n = (4 << 30) + 4099
    m = mmap.mmap(-1, n)
    big = torch.from_numpy(np.frombuffer(m, dtype=np.uint8))
    big[-1] = 7
    path = tmp_path / "z64.pt"
    ct.save({"big": big, "after": torch.arange(5)}, path, io_options={"fsync": False})
    del big
    m.close()
    got = torch.load(path, mmap=True, weights_only=True)
    assert got["big"].shape == (n,) and int(got["big"][-1]) == 7 and int(got["big"][4096]) == 0
    assert torch.equal(got["after"], torch.arange(5))
    with zipfile.ZipFile(path) as z:
        sizes = {i.filename: (i.file_size, i.header_offset) for i in z.infolist()}
    assert sizes["z64/data/0"][0] == n and sizes["z64/data/1"][1] > 1 << 32


def test_drop_ins_installed_over_torch_save_and_load(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """``torch.save = ckptio.torch.save`` (and load): what the drop-ins hand back to torch (file
    objects, the legacy format, mmap loads) reaches torch's own functions, not themselves."""
    monkeypatch.setattr(torch, "save", ct.save)
    monkeypatch.setattr(torch, "load", ct.load)
    obj = sd()
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    assert equal(torch.load(buf), obj)
    path = tmp_path / "p.pt"
    torch.save(obj, path)
    assert equal(torch.load(path, mmap=True), obj)
    torch.save(obj, path, _use_new_zipfile_serialization=False)
    assert equal(torch.load(path), obj)


# ---- save_async: the same archive, written by the C engine's thread ----


def records(path: pathlib.Path) -> dict[str, bytes]:
    """An archive's records by name, without its common prefix and its serialization id."""
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None
        return {n.split("/", 1)[1]: z.read(n) for n in z.namelist()
                if not n.endswith("serialization_id")}  # fmt: skip


def test_save_async_writes_save_s_archive_as_it_was(tmp_path: pathlib.Path) -> None:
    """The same records, in the same order and places, as ckptio.torch.save of the state at
    the call; views keep one storage; the caller's tensors may change as soon as it returns."""
    base = torch.arange(24, dtype=torch.float32)
    obj = {"a": base[:12].view(3, 4), "b": base[12:], "h": torch.ones(5, dtype=torch.bfloat16),
           "t": base[::2], "e": torch.empty(0, 3), "step": 3, "meta": {"name": "x"}}  # fmt: skip
    ct.save(obj, tmp_path / "s.pt")
    h = ct.save_async(obj, tmp_path / "a.pt")
    base.add_(100)
    obj["meta"]["name"] = "changed"
    st = h.wait()
    assert st.bytes >= 24 * 4 and h.stall_seconds >= 0
    assert records(tmp_path / "a.pt") == records(tmp_path / "s.pt")
    with zipfile.ZipFile(tmp_path / "a.pt") as za, zipfile.ZipFile(tmp_path / "s.pt") as zs:
        assert [(i.filename[2:], i.header_offset) for i in za.infolist()] == [
            (i.filename[2:], i.header_offset) for i in zs.infolist()]  # fmt: skip
    back = torch.load(tmp_path / "a.pt", weights_only=True)  # stock torch.load
    assert torch.equal(back["b"], torch.arange(12, 24, dtype=torch.float32))
    assert back["meta"]["name"] == "x" and back["step"] == 3
    assert back["a"].untyped_storage().data_ptr() == back["t"].untyped_storage().data_ptr()


def test_save_async_cap_errors_and_order(tmp_path: pathlib.Path) -> None:
    obj = sd()
    # Storages past max_host_bytes: written during the call, finished when it returns.
    h = ct.save_async(obj, tmp_path / "now.pt", max_host_bytes=0)
    assert h.done() and equal(torch.load(tmp_path / "now.pt", weights_only=True), obj)
    # An error in the object (unpicklable) is the call's; nothing is written.
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        ct.save_async({"f": lambda: 0}, tmp_path / "bad.pt")
    # An I/O error is the save's, raised by wait() (a RuntimeError too, as torch.save's).
    h = ct.save_async(obj, tmp_path / "now.pt", io_options={"overwrite": False})
    with pytest.raises(RuntimeError, match="already exists"):
        h.wait()
    with pytest.raises(TypeError, match="max_host_bytes"):
        ct.save_async(obj, tmp_path / "x.pt", max_host_bytes=-1)
    with pytest.raises(TypeError, match="path"):
        ct.save_async(obj, io.BytesIO())  # type: ignore[arg-type]
    # One at a time, with ckptio.save_async: the next call waits for the one in flight.
    first = ct.save_async({"w": torch.zeros(1 << 20)}, tmp_path / "1.pt")
    second = ckptio.save_async({"w": torch.ones(3)}, tmp_path / "2")
    assert first.done()
    second.wait()
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


def test_save_async_under_skip_data_is_save_s_fallback(tmp_path: pathlib.Path) -> None:
    """Inside skip_data() (no storage bytes) the file is save()'s, written during the call."""
    obj = {"w": torch.randn(1000, 10), "step": 7}
    with torch.serialization.skip_data():
        h = ct.save_async(obj, tmp_path / "a.pt")
        assert h.done()
        ct.save(obj, tmp_path / "s.pt")
    h.wait()
    # (no storage bytes: holes, whose CRCs torch leaves unchecked)
    names = [[n.split("/", 1)[1] for n in zipfile.ZipFile(tmp_path / f).namelist()]
             for f in ("a.pt", "s.pt")]  # fmt: skip
    assert names[0] == names[1]
    assert torch.load(tmp_path / "a.pt", weights_only=True)["w"].shape == (1000, 10)
