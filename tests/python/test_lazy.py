# SPDX-License-Identifier: Apache-2.0
"""Mapped loads (mmap=True): views of private mappings, pages read on touch, checks on access."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

import ckptio
from ckptio._core import ChunkRecord

import rss_probe


def _data_file(path: pathlib.Path) -> pathlib.Path:
    (f,) = sorted((path / "data").iterdir())
    return f


def _chunk(path: pathlib.Path, name: str) -> ChunkRecord:
    with ckptio.open(path) as r:
        (c,) = r._r.chunks(r.tensors()[name].index)
        return c


def _is_view_of_file(arr: np.ndarray) -> bool:
    import mmap

    base = arr
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return isinstance(base, mmap.mmap)


def test_numpy_mapped_values_and_views(ckpt: pathlib.Path) -> None:
    rng = np.random.default_rng(0)
    tree = {
        "w": rng.standard_normal((64, 300)).astype(np.float32),
        "b": np.arange(7, dtype=np.int16),
        "s": np.float64(2.5),
        "e": np.zeros((0, 3)),
        "n": {"lr": 0.1, "x": rng.integers(0, 9, (5, 5)).astype(np.uint8)},
    }
    ckptio.save(tree, ckpt)
    out = ckptio.load(ckpt, mmap=True)
    np.testing.assert_array_equal(out["w"], tree["w"])
    np.testing.assert_array_equal(out["b"], tree["b"])
    np.testing.assert_array_equal(out["n"]["x"], tree["n"]["x"])
    assert out["s"] == 2.5 and out["n"]["lr"] == 0.1 and out["e"].shape == (0, 3)
    assert _is_view_of_file(out["w"]) and _is_view_of_file(out["b"])
    assert ckptio.last_load_stats().bytes == 0  # nothing was read


def test_writes_stay_private(ckpt: pathlib.Path) -> None:
    a = np.arange(4096, dtype=np.float32)
    ckptio.save({"a": a}, ckpt)
    before = _data_file(ckpt).read_bytes()
    out = ckptio.load(ckpt, mmap=True)
    out["a"][:] = -1.0
    assert (out["a"] == -1).all()
    assert _data_file(ckpt).read_bytes() == before
    np.testing.assert_array_equal(ckptio.load(ckpt, mmap=True)["a"], a)
    np.testing.assert_array_equal(ckptio.load(ckpt)["a"], a)


def test_torch_mapped(ckpt: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear(40, 30)
    sd = {k: v.clone() for k, v in lin.state_dict().items()}
    sd["half"] = torch.arange(100, dtype=torch.bfloat16)
    sd["p"] = torch.nn.Parameter(torch.ones(3))
    ckptio.save(sd, ckpt)
    out = ckptio.load(ckpt, mmap=True)
    for k in ("weight", "bias", "half"):
        assert torch.equal(out[k], sd[k]) and out[k].dtype == sd[k].dtype
    assert isinstance(out["p"], torch.nn.Parameter)
    # A view of the file's mapping: its data pointer lies within the mapping the storage holds.
    w = out["weight"]
    off = _chunk(ckpt, "weight").file_offset
    assert w.untyped_storage().data_ptr() % 4096 == off % 4096
    w.add_(1)  # writable, private
    assert torch.equal(ckptio.load(ckpt, mmap=True)["weight"], sd["weight"])


def test_jax_mapped(ckpt: pathlib.Path) -> None:
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    x = jnp.arange(1000.0, dtype=jnp.float32).reshape(10, 100)
    ckptio.save({"x": x}, ckpt)
    out = ckptio.load(ckpt, mmap=True)
    assert isinstance(out["x"], jax.Array)
    np.testing.assert_array_equal(np.asarray(out["x"]), np.asarray(x))
    with ckptio.open(ckpt, mmap=True) as r:
        np.testing.assert_array_equal(np.asarray(r["x"]), np.asarray(x))


def test_reader_item_verifies_and_names_the_tensor(ckpt: pathlib.Path) -> None:
    rng = np.random.default_rng(1)
    ckptio.save({"good": rng.random(5000), "bad": rng.random(5000)}, ckpt)
    c = _chunk(ckpt, "bad")
    with open(_data_file(ckpt), "r+b") as f:
        f.seek(c.file_offset + 100)
        byte = f.read(1)
        f.seek(c.file_offset + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    out = ckptio.load(ckpt, mmap=True)  # nothing checked: returns the damaged bytes
    assert out["bad"].shape == (5000,)
    with ckptio.open(ckpt, mmap=True) as r:
        assert r["good"].shape == (5000,)
        with pytest.raises(ckptio.CorruptCheckpoint, match="tensor 'bad'"):
            r["bad"]
        with pytest.raises(ckptio.CorruptCheckpoint, match="'bad'"):
            r.verify()


def test_split_tensor_is_read_not_mapped(ckpt: pathlib.Path) -> None:
    jax = pytest.importorskip("jax")
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    devs = np.array(jax.devices()[:4]).reshape(2, 2)
    sh = NamedSharding(Mesh(devs, ("a", "b")), P("a", "b"))
    x = jax.device_put(np.arange(64.0 * 64).reshape(64, 64).astype(np.float32), sh)
    ckptio.save({"x": x, "y": np.ones(2000)}, ckpt)
    with ckptio.open(ckpt, mmap=True) as r:
        assert r.tensors()["x"].num_chunks == 4
        out = r.load(framework="numpy")
        np.testing.assert_array_equal(out["x"], np.asarray(x))
        assert not _is_view_of_file(out["x"])  # split along columns: read and assembled
        assert _is_view_of_file(out["y"])


def test_row_slabs_back_to_back_are_one_view(ckpt: pathlib.Path) -> None:
    a = np.arange(4 * 4096, dtype=np.float32).reshape(4, 4096)
    with ckptio._core.Writer(str(ckpt)) as w:
        for i in range(4):
            w.add("a", 12, (4, 4096), a[i : i + 1], (i, 0), (1, 4096))
        w.commit()
    with ckptio.open(ckpt, mmap=True) as r:
        out = r["a"]
    np.testing.assert_array_equal(out, a)
    assert _is_view_of_file(out)


def test_replaced_checkpoint_keeps_the_old_bytes(ckpt: pathlib.Path) -> None:
    old = np.full(1 << 16, 1.0, np.float32)
    ckptio.save({"a": old}, ckpt)
    with ckptio.open(ckpt, mmap=True) as r:
        out = r.load()
        ckptio.save({"a": np.full(1 << 16, 2.0, np.float32)}, ckpt, overwrite=True)
        # Pages not touched yet come from the old file, which the mapping keeps alive.
        assert (out["a"] == 1.0).all()
        r.verify()  # the old files are unlinked, not changed
        assert (r["a"] == 1.0).all()
    assert (ckptio.load(ckpt, mmap=True)["a"] == 2.0).all()


def test_written_in_place_is_found(ckpt: pathlib.Path) -> None:
    ckptio.save({"a": np.full(1 << 16, 1.0, np.float32)}, ckpt)
    c = _chunk(ckpt, "a")
    with ckptio.open(ckpt, mmap=True) as r:
        r.load()
        st = os.stat(_data_file(ckpt))
        with open(_data_file(ckpt), "r+b") as f:
            f.seek(c.file_offset)
            f.write(np.full(16, 3.0, np.float32).tobytes())
        os.utime(_data_file(ckpt), ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        with pytest.raises(ckptio.CorruptCheckpoint, match="changed on disk after it was mapped"):
            r.verify()


def test_truncated_file_refused_before_mapping(ckpt: pathlib.Path) -> None:
    ckptio.save({"a": np.ones(1 << 16, np.float32)}, ckpt)
    f = _data_file(ckpt)
    os.truncate(f, f.stat().st_size - 4096)
    with pytest.raises(ckptio.CorruptCheckpoint, match="truncated"):
        ckptio.load(ckpt, mmap=True)


LAZY_BODY = """
ckptio.save({"a": np.ones(64 << 20, np.uint8)}, path, fsync=False)
base = rss()
out = ckptio.load(path, mmap=True)
mapped = rss()
s = int(out["a"][: 1 << 20].sum())
print(base, mapped, rss(), s)
"""


def test_pages_come_in_on_touch(tmp_path: pathlib.Path) -> None:
    base, mapped, touched, s = rss_probe.run(LAZY_BODY, tmp_path / "ckpt")
    mib = 1 << 20
    assert s == mib
    assert mapped - base < 8 * mib, (base, mapped)  # 64 MiB mapped, none of it resident
    assert touched - base < 24 * mib, (base, touched)  # 1 MiB touched (plus read-ahead)


def test_checksums_off_skips_the_check_on_access(ckpt: pathlib.Path) -> None:
    ckptio.save({"a": np.arange(5000.0)}, ckpt)
    c = _chunk(ckpt, "a")
    with open(_data_file(ckpt), "r+b") as f:
        f.seek(c.file_offset)
        f.write(b"\xff" * 8)
    with ckptio.open(ckpt, mmap=True, checksums=False) as r:
        assert r["a"][1] == 1.0  # the damaged bytes come back unchecked, as asked


JAX_BODY = """
import jax.numpy as jnp
ckptio.save({"x": jnp.ones(64 << 20, jnp.uint8)}, path, fsync=False)
base = rss()
out = ckptio.load(path, mmap=True)
print(base, rss(), int(out["x"][-1]))
"""


def test_jax_on_cpu_adopts_the_mapping(tmp_path: pathlib.Path) -> None:
    # What doc/python.md says: jax.device_put on a CPU device takes the mapped host buffer
    # without a copy, so a mapped jax array is lazy too.
    pytest.importorskip("jax")
    base, after, last = rss_probe.run(JAX_BODY, tmp_path / "ckpt")
    assert last == 1
    assert after - base < 16 << 20, f"{(after - base) >> 20} MiB resident after mapping 64 MiB"


def test_striped_checkpoint_maps_from_its_stripes(tmp_path: pathlib.Path) -> None:
    # Data files in stripe directories of other roots: mapped from there, as the eager load
    # reads them; and from where the stripes are now when the caller passes roots=.
    roots = [tmp_path / "nvme0", tmp_path / "nvme1"]
    for r in roots:
        r.mkdir()
    tree = {f"t{i}": np.full((64, 1024), i, dtype=np.float32) for i in range(6)}
    path = tmp_path / "ckpt"
    ckptio.save(tree, path, roots=roots)
    with ckptio.open(path) as r:
        assert any(c.file != 0 for i in range(6) for c in r._r.chunks(i))  # really striped
    out = ckptio.load(path, mmap=True)
    for k, v in tree.items():
        np.testing.assert_array_equal(out[k], v)
        assert _is_view_of_file(out[k])
    with ckptio.open(path, mmap=True) as r:
        np.testing.assert_array_equal(r["t5"], tree["t5"])
        r.verify()
    moved = tmp_path / "moved"
    moved.mkdir()
    os.rename(roots[1], moved / "nvme1")
    with pytest.raises(FileNotFoundError, match="roots="):
        ckptio.load(path, mmap=True)
    out = ckptio.load(path, mmap=True, roots=[moved / "nvme1"])
    for k, v in tree.items():
        np.testing.assert_array_equal(out[k], v)
    with ckptio.open(path, mmap=True, roots=[moved / "nvme1"]) as r:
        np.testing.assert_array_equal(r["t1"], tree["t1"])
        np.testing.assert_array_equal(r["t5"], tree["t5"])
        r.verify()
