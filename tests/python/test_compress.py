# SPDX-License-Identifier: Apache-2.0
"""Compressed checkpoints through every front door, on real runtimes: ckptio.save and load of
every torch and numpy dtype bit for bit (NaN payloads, -0.0, infinities, subnormals), random
bytes that do not grow, region reads, a flipped bit found and named, save_async, the Manager,
the DCP StorageWriter, the Orbax handler, a save of 2 gloo ranks loaded on 1 and 3, mapped
loads, and what `ckptio inspect` and `ckptio verify` say."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

import ckptio

torch = pytest.importorskip("torch")

MIB = 1 << 20


# ---- helpers ---------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """CKPTIO_COMPRESS would override what each test asks for."""
    monkeypatch.delenv("CKPTIO_COMPRESS", raising=False)


def cli(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    """The ckptio command (through this Python's package), its output as text."""
    return subprocess.run([sys.executable, "-m", "ckptio", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def inspect(path: pathlib.Path) -> dict[str, Any]:
    """`ckptio inspect --json`: the checkpoint and its tensors by name."""
    res = cli("inspect", "--json", path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    doc["by_name"] = {t["name"]: t for t in doc["tensors"]}
    return dict(doc)


def coded(doc: dict[str, Any]) -> list[str]:
    """Names of the tensors stored with a codec."""
    return [t["name"] for t in doc["tensors"] if t["codec"] != "none"]


_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: Any) -> Any:
    """A tensor's elements as integers of its width: NaN payloads and -0.0 compare as bits."""
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.contiguous().view(_INT[t.element_size()])


def same_torch(a: Any, b: Any) -> None:
    assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, (a, b)
    assert torch.equal(bits(a), bits(b))


def same_np(a: np.ndarray, b: Any) -> None:
    assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


# Bit patterns of values a coder must keep: NaNs with payloads (quiet, signalling, negative),
# -0.0, +-inf, the smallest and largest subnormals, the largest finite value.
SPECIAL = {
    torch.float32: [0x7FC12345, 0x7F800001, 0xFFC00ABC, 0x80000000, 0x7F800000, 0xFF800000,
                    0x00000001, 0x807FFFFF, 0x7F7FFFFF],
    torch.float64: [0x7FF8000000ABCDEF, 0x7FF0000000000001, 0xFFF8000000000123,
                    0x8000000000000000, 0x7FF0000000000000, 0xFFF0000000000000, 1,
                    0x800FFFFFFFFFFFFF, 0x7FEFFFFFFFFFFFFF],
    torch.float16: [0x7E01, 0x7C01, 0xFE01, 0x8000, 0x7C00, 0xFC00, 0x0001, 0x83FF, 0x7BFF],
    torch.bfloat16: [0x7FC1, 0x7F81, 0xFFC1, 0x8000, 0x7F80, 0xFF80, 0x0001, 0x807F, 0x7F7F],
    torch.float8_e4m3fn: [0x7F, 0xFF, 0x80, 0x01, 0x87, 0x7E],  # no infinities
    torch.float8_e5m2: [0x7D, 0x7E, 0xFF, 0x80, 0x7C, 0xFC, 0x01, 0x83, 0x7B],
}


def _plant(flat_int: Any, patterns: list[int], n: int) -> None:
    """Write the patterns (as signed integers of the view's width) at scattered places, and
    around the 1 MiB block boundaries."""
    width = flat_int.element_size() * 8
    vals = [p - (1 << width) if p >= 1 << (width - 1) and flat_int.dtype != torch.uint8 else p
            for p in patterns]
    per_block = MIB // flat_int.element_size()
    spots = list(range(3, n, 997)) + [i for b in range(per_block, n, per_block)
                                      for i in (b - 1, b) if i < n]
    for k, i in enumerate(spots):
        flat_int[i] = vals[k % len(vals)]


def torch_tensor(dtype: Any, nbytes: int, seed: int) -> Any:
    """About nbytes of `dtype` as a trained state holds them: small floats (narrow exponents)
    with the special values planted, small integers with the extremes, random booleans."""
    g = torch.Generator().manual_seed(seed)
    item = torch.empty((), dtype=dtype).element_size()
    n = nbytes // item
    if dtype.is_complex:
        return torch.randn(n, dtype=dtype, generator=g) * 0.02
    if dtype.is_floating_point:
        t = (torch.randn(n, generator=g) * 0.02).to(dtype)
        _plant(t.view(_INT[item]), SPECIAL[dtype], n)
        return t
    if dtype == torch.bool:
        return torch.rand(n, generator=g) < 0.3
    t = torch.randint(0, 50, (n,), generator=g).to(dtype)
    info = torch.iinfo(dtype)
    t[1], t[n // 2], t[-1] = info.min, info.max, -1 if info.min < 0 else 7
    return t


TORCH_DTYPES = [
    torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.float8_e4m3fn,
    torch.float8_e5m2, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
    torch.bool, torch.complex64,
]


def state(nbytes: int = 3 * MIB) -> dict[str, Any]:
    """A training state of bf16 weights, fp32 master weights and moments, and a step."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(nbytes // 4, generator=g) * 0.02
    return {"model": {"w": w.to(torch.bfloat16).reshape(-1, 256)},
            "opt": {"master": w.reshape(-1, 256), "m": (w * 1e-3).reshape(-1, 256),
                    "step": torch.tensor(7)},
            "epoch": 2}


def same_tree(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert sorted(a) == sorted(b)
        for k in a:
            same_tree(a[k], b[k])
    elif isinstance(a, torch.Tensor):
        same_torch(a, b)
    else:
        assert a == b


# ---- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["all", "auto"])
def test_every_torch_dtype_bit_exact(tmp_path: pathlib.Path, mode: str) -> None:
    # 2.25 MiB and a bit each: two whole 1 MiB blocks and a short one.
    tree = {f"t{i:02d}": torch_tensor(dt, 9 * MIB // 4 + 4 * 37, i)
            for i, dt in enumerate(TORCH_DTYPES)}
    # Scalars and tiny tensors (below the 64 KiB a chunk needs to be coded) ride along.
    nan = torch.tensor(0, dtype=torch.int32).fill_(0x7FC0BEEF).view(torch.float32)
    tree["tiny"] = {"nan": nan, "negzero": torch.tensor(-0.0, dtype=torch.bfloat16),
                    "empty": torch.empty(0, 3, dtype=torch.float16), "one": torch.tensor([True]),
                    "inf": torch.tensor([float("inf"), -float("inf"), 5e-324], dtype=torch.float64),
                    "c": torch.tensor([1 + 2j], dtype=torch.complex64)}
    path = tmp_path / "ck"
    ckptio.save(tree, path, compress=mode)
    same_tree(tree, ckptio.load(path))
    doc = inspect(path)
    if mode == "all":  # every large tensor shrank, the float ones by the float coder
        for i, dt in enumerate(TORCH_DTYPES):
            t = doc["by_name"][f"t{i:02d}"]
            assert t["codec"] != "none" and t["stored_bytes"] < t["nbytes"], (dt, t)
            want = "float" if dt.is_floating_point or dt.is_complex else "zstd"
            assert t["codec"] == want, (dt, t)
    else:  # "auto" codes at least the blocks of its first round
        assert coded(doc) and doc["stored_bytes"] < doc["bytes"]
    for name in ("tiny.nan", "tiny.negzero", "tiny.empty", "tiny.c"):
        assert doc["by_name"][name]["codec"] == "none"
    assert cli("verify", path).returncode == 0


def np_array(dtype: np.dtype[Any], nbytes: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = nbytes // dtype.itemsize
    if dtype.kind == "f":
        a = (rng.standard_normal(n) * 0.02).astype(dtype)
        t = torch.from_numpy(a)  # the same planting as for torch, through a shared view
        _plant(t.view(_INT[dtype.itemsize]), SPECIAL[getattr(torch, dtype.name)], n)
        return a
    if dtype.kind == "c":
        return ((rng.standard_normal(2 * n) * 0.02).astype(dtype.type(0).real.dtype)
                .view(dtype))
    if dtype.kind == "b":
        return rng.random(n) < 0.3
    a = rng.integers(0, 50, n).astype(dtype)
    info = np.iinfo(dtype)
    a[1], a[n // 2] = info.min, info.max
    return a


NP_DTYPES = [np.dtype(d) for d in ("float16", "float32", "float64", "int8", "int16", "int32",
                                   "int64", "uint8", "uint16", "uint32", "uint64", "bool",
                                   "complex64", "complex128")]


@pytest.mark.parametrize("mode", ["all", "auto"])
def test_every_numpy_dtype_bit_exact(tmp_path: pathlib.Path, mode: str) -> None:
    tree: dict[str, Any] = {f"a{i:02d}": np_array(d, 2 * MIB + 8 * 51, i)
                            for i, d in enumerate(NP_DTYPES)}
    tree["scalar"] = np.array(np.nan, dtype=np.float32)
    tree["grid"] = np.arange(12, dtype=np.int16).reshape(3, 4)
    path = tmp_path / "ck"
    ckptio.save(tree, path, compress=mode)
    got = ckptio.load(path)
    for k, a in tree.items():
        same_np(a, got[k])
    doc = inspect(path)
    if mode == "all":
        for i, d in enumerate(NP_DTYPES):
            t = doc["by_name"][f"a{i:02d}"]
            assert t["codec"] != "none" and t["ratio"] > 1.0, (d, t)
    else:
        assert coded(doc)


def test_random_bytes_never_grow(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(3)
    noise = rng.integers(0, 256, 3 * MIB + 123, dtype=np.uint8)
    # Half zeros, half noise: the zero blocks shrink, the noise blocks stay as they are.
    half = np.concatenate([np.zeros(2 * MIB, np.uint8), noise[: 2 * MIB]])
    tree = {"noise": noise, "f": noise[: 3 * MIB].copy().view(np.float32), "half": half}
    for mode in ("none", "all", "auto"):
        ckptio.save(tree, tmp_path / mode, compress=mode)
        got = ckptio.load(tmp_path / mode)
        for k, a in tree.items():
            same_np(a, got[k])
    plain, small = inspect(tmp_path / "none"), inspect(tmp_path / "all")
    for name in ("noise", "f"):
        t = small["by_name"][name]
        assert t["codec"] == "none" and t["stored_bytes"] == t["nbytes"], t
    h = small["by_name"]["half"]
    assert h["codec"] != "none" and 2 * MIB <= h["stored_bytes"] < 2 * MIB + 4096, h

    def data_bytes(p: pathlib.Path) -> int:
        return sum(f.stat().st_size for f in (p / "data").iterdir())

    # The data files: never larger than without compression.
    assert data_bytes(tmp_path / "all") <= data_bytes(tmp_path / "none")
    assert data_bytes(tmp_path / "auto") <= data_bytes(tmp_path / "none")
    assert plain["stored_bytes"] == plain["bytes"]


# ---- region reads ----------------------------------------------------------------------------


def test_region_reads(tmp_path: pathlib.Path) -> None:
    # Rows of 2800 bytes: many straddle the 1 MiB blocks.
    m = (np.random.default_rng(4).standard_normal((1500, 700)) * 0.02).astype(np.float32)
    b = torch.from_numpy(m[:, :512].copy()).to(torch.bfloat16)
    path = tmp_path / "ck"
    ckptio.save({"m": m, "b": b}, path, compress="all")
    doc = inspect(path)
    assert doc["by_name"]["m"]["codec"] == "float" and doc["by_name"]["b"]["codec"] == "float"
    per_block = MIB // 2800
    regions = [np.s_[per_block], np.s_[per_block - 1 : per_block + 2, 300:400], np.s_[:, 0],
               np.s_[:, 699], np.s_[880:920, 10:610], np.s_[1499], np.s_[100, 100],
               np.s_[750:, 350], np.s_[1:-1, 2:-1], np.s_[...], np.s_[::7, 5]]
    with ckptio.open(path) as r:
        for reg in regions:
            got = r.read("m", reg)
            assert np.array_equal(got, m[reg]), reg
            assert got.tobytes() == np.ascontiguousarray(m[reg]).tobytes(), reg
        for reg in (np.s_[374:376], np.s_[:, 511], np.s_[1000, 3]):
            same_torch(b[reg].contiguous(), r.read("b", reg))
    # One element reads the block it lies in, not the tensor.
    with ckptio.open(path) as r:
        assert r.read("m", np.s_[1400, 5]) == m[1400, 5]
        s = r.stats()
        assert 0 < s.io_bytes + s.cache_bytes <= MIB + 8192, s
        assert doc["by_name"]["m"]["stored_bytes"] > 3 * MIB


# ---- damage ----------------------------------------------------------------------------------


def flip(path: pathlib.Path, name: str, where: float = 0.5) -> tuple[str, int]:
    """Flip one bit inside tensor `name`'s first (compressed) chunk; returns its data file and
    the offset of the byte."""
    c = inspect(path)["by_name"][name]["chunks"][0]
    assert c["stored_bytes"] < c["nbytes"], c
    at = c["file_offset"] + int(c["stored_bytes"] * where)
    with open(path / c["file"], "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x04]))
    return str(c["file"]), at


def test_flipped_bit_is_named(tmp_path: pathlib.Path) -> None:
    tree = state()
    path = tmp_path / "ck"
    ckptio.save(tree, path, compress="all")
    data_file, _ = flip(path, "opt.master")
    with pytest.raises(ckptio.CorruptCheckpoint) as ei:
        ckptio.load(path)
    e = ei.value
    msg = str(e)
    assert "opt.master" in msg and os.path.basename(data_file) in msg and "offset" in msg, msg
    assert e.tensor == "opt.master" and e.offset is not None and e.file is not None, vars(e)
    assert os.path.basename(data_file) in e.file
    # The other tensors still read; the damaged one fails the same way through a region read.
    with ckptio.open(path) as r:
        same_torch(tree["model"]["w"], r["model.w"])
        with pytest.raises(ckptio.CorruptCheckpoint, match="opt.master"):
            r.read("opt.master", np.s_[1024:2048])  # rows of the middle block
        with pytest.raises(ckptio.CorruptCheckpoint):
            r.verify()
    res = cli("verify", path)
    assert res.returncode != 0 and "opt.master" in res.stdout + res.stderr, res


# ---- the other front doors -------------------------------------------------------------------


def test_save_async(tmp_path: pathlib.Path) -> None:
    tree = state()
    path = tmp_path / "ck"
    ckptio.save_async(tree, path, compress="all").wait()
    doc = inspect(path)
    assert {"model.w", "opt.master", "opt.m"} <= set(coded(doc)), doc["by_name"]
    assert doc["by_name"]["model.w"]["codec"] == "float"
    same_tree(tree, ckptio.load(path))


def test_manager(tmp_path: pathlib.Path) -> None:
    tree = state()
    with ckptio.Manager(tmp_path / "run", keep=2, compress="auto") as m:
        for step in (1, 2, 3):
            m.save(step, tree)
        m.wait_until_finished()
        assert m.all_steps() == [2, 3]
        same_tree(tree, m.restore(3))
    assert coded(inspect(tmp_path / "run" / "3"))


def test_dcp_storage_writer(tmp_path: pathlib.Path) -> None:
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    from ckptio.torch.dcp import StorageReader, StorageWriter

    tree = state()
    path = tmp_path / "ck"
    dcp.save(tree, storage_writer=StorageWriter(path, compress="auto"))
    assert coded(inspect(path))
    got = {"model": {"w": torch.zeros_like(tree["model"]["w"])},
           "opt": {k: torch.zeros_like(v) for k, v in tree["opt"].items()}, "epoch": 0}
    dcp.load(got, storage_reader=StorageReader(path))
    same_tree(tree, got)
    assert cli("verify", path).returncode == 0


def test_orbax_handler(tmp_path: pathlib.Path) -> None:
    jax = pytest.importorskip("jax")
    ocp = pytest.importorskip("orbax.checkpoint", reason="orbax-checkpoint is not installed")
    import ckptio.orbax

    jnp = jax.numpy
    key = jax.random.PRNGKey(0)
    tree = {"w": (jax.random.normal(key, (1024, 1024)) * 0.02).astype(jnp.bfloat16),
            "m": jax.random.normal(key, (512, 1024), jnp.float32) * 1e-3,
            "step": jnp.array(5, jnp.int32)}
    ckptio.orbax.register(ckptio.orbax.ArrayHandler(compress="auto"))
    try:
        with ocp.StandardCheckpointer() as c:
            c.save(tmp_path / "ck", tree)
            c.wait_until_finished()
            out = c.restore(tmp_path / "ck")
    finally:
        ckptio.orbax.unregister()
    for k in tree:
        a, b = np.asarray(tree[k]), np.asarray(out[k])
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), k
    assert coded(inspect(tmp_path / "ck" / ckptio.orbax.SUBDIR))


RANK_PROGRAM = textwrap.dedent('''
    import json, os, sys
    import numpy as np, torch, torch.distributed as dist
    import ckptio

    root = sys.argv[1]
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    pair = dist.new_group([0, 1], backend="gloo")  # collective: every rank creates it
    g = torch.Generator().manual_seed(5)
    w = (torch.randn(1024, 768, generator=g) * 0.02).to(torch.bfloat16)
    m = torch.randn(768, 512, generator=g) * 1e-2
    c = torch.randint(0, 9, (300_000,), generator=g)
    res = {"rank": rank}
    try:
        path = os.path.join(root, "ck")
        if rank < 2:  # a save of 2 ranks: rows of w, columns of m, c replicated
            h, k = 512, 256
            tree = {"w": ckptio.Shard(w[rank * h:(rank + 1) * h], (rank * h, 0), (1024, 768)),
                    "m": ckptio.Shard(m[:, rank * k:(rank + 1) * k].contiguous(), (0, rank * k),
                                      (768, 512)),
                    "c": c, "step": 9}
            ckptio.save(tree, path, comm=pair, compress="all")
        dist.barrier()
        # Loaded on 3 ranks: each its own third of rows and columns, and the whole.
        rows, cols = slice(rank * 341, (rank + 1) * 341), slice(rank * 170, (rank + 1) * 170)
        with ckptio.open(path) as r:
            mine_w, mine_m = r.read("w", np.s_[rows]), r.read("m", np.s_[:, cols])
        full = ckptio.load(path, comm="torch")
        def eq(a, b):
            return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
                a.view(torch.int16) if a.dtype == torch.bfloat16 else a,
                b.view(torch.int16) if b.dtype == torch.bfloat16 else b)
        res.update(w=eq(mine_w, w[rows]), m=eq(mine_m, m[:, cols]), full=all(
            eq(full[k], v) for k, v in (("w", w), ("m", m), ("c", c))), step=full["step"])
    except Exception as e:
        res.update(error=type(e).__name__, message=str(e))
    with open(os.path.join(os.environ["CKPTIO_TEST_OUT"], f"r-{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()
''')


def test_two_ranks_save_three_load(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("torch.distributed")
    from test_comm_dist import launch, results
    from test_dist_save import no_error, torch_env

    prog = tmp_path / "rank.py"
    prog.write_text(RANK_PROGRAM)
    out = tmp_path / "out"
    out.mkdir()
    launch([[sys.executable, str(prog), str(tmp_path)]] * 3, torch_env(3), out)
    res = results(out, "r")
    no_error(res, 3)
    for v in res.values():
        assert v["w"] and v["m"] and v["full"] and v["step"] == 9, v
    # On one process, and what the merged manifest holds: both ranks' chunks, coded.
    g = torch.Generator().manual_seed(5)
    w = (torch.randn(1024, 768, generator=g) * 0.02).to(torch.bfloat16)
    m = torch.randn(768, 512, generator=g) * 1e-2
    c = torch.randint(0, 9, (300_000,), generator=g)
    got = ckptio.load(tmp_path / "ck")
    for name, want in (("w", w), ("m", m), ("c", c)):
        same_torch(want, got[name])
    doc = inspect(tmp_path / "ck")
    for name in ("w", "m"):
        t = doc["by_name"][name]
        assert t["codec"] == "float" and t["num_chunks"] == 2, t
        assert len({ch["file"] for ch in t["chunks"]}) == 2, t  # one data file per rank
    assert doc["by_name"]["c"]["codec"] == "zstd"
    assert cli("verify", tmp_path / "ck").returncode == 0


# ---- mapped loads ----------------------------------------------------------------------------


def test_mapped_loads(tmp_path: pathlib.Path) -> None:
    tree = state()
    tree["raw"] = torch.from_numpy(np.random.default_rng(6).integers(0, 256, MIB, np.uint8))
    path = tmp_path / "ck"
    ckptio.save(tree, path, compress="all")
    doc = inspect(path)
    assert doc["by_name"]["opt.master"]["codec"] == "float"
    assert doc["by_name"]["raw"]["codec"] == "none"  # this one can be mapped as it is
    same_tree(tree, ckptio.load(path, mmap=True))
    with ckptio.open(path, mmap=True) as r:
        same_torch(tree["opt"]["m"], r["opt.m"])
        r.verify()
    flip(path, "opt.m", 0.9)
    with ckptio.open(path, mmap=True) as r:
        same_torch(tree["raw"], r["raw"])
        with pytest.raises(ckptio.CorruptCheckpoint, match="opt.m"):
            r.verify()
    with pytest.raises(ckptio.CorruptCheckpoint, match="opt.m"):
        ckptio.load(path, mmap=True)


def test_torch_dropin_refuses_compress(tmp_path: pathlib.Path) -> None:
    import ckptio.torch

    w = torch.randn(512, 512) * 0.02
    with pytest.raises(ckptio.InvalidRequest, match="compress"):
        ckptio.torch.save({"w": w}, tmp_path / "x.pt", io_options={"compress": "all"})


# ---- ckptio convert --compress ---------------------------------------------------------------


def test_convert_compress(tmp_path: pathlib.Path) -> None:
    import ckptio.safetensors

    tree = state()
    flat = {"model.w": tree["model"]["w"], "opt.master": tree["opt"]["master"],
            "opt.step": tree["opt"]["step"]}
    ckptio.safetensors.save_file(flat, tmp_path / "in.safetensors")
    torch.save(flat, tmp_path / "in.pt")
    # safetensors by the C command, torch files by the command handing over to Python.
    for src, mode in (("in.safetensors", "--compress"), ("in.pt", "--compress=all")):
        dst = tmp_path / f"out-{src.split('.')[1]}"
        res = cli("convert", mode, tmp_path / src, dst)
        assert res.returncode == 0, res.stderr
        doc = inspect(dst)
        assert doc["by_name"]["model.w"]["codec"] == "float", doc["by_name"]
        got = ckptio.load(dst, framework="torch")
        for k, v in flat.items():
            same_torch(v, got[k])
    # ckptio to ckptio: a compressed checkpoint back to a plain one, and that one compressed.
    for src, dst, mode, want in (("out-safetensors", "plain", "--compress=none", "none"),
                                 ("plain", "again", "--compress=all", "float")):
        res = cli("convert", mode, tmp_path / src, tmp_path / dst)
        assert res.returncode == 0, res.stderr
        assert inspect(tmp_path / dst)["by_name"]["model.w"]["codec"] == want
        same_torch(flat["opt.master"], ckptio.load(tmp_path / dst, framework="torch")["opt.master"])
    res = cli("convert", "--compress", tmp_path / "in.pt", tmp_path / "x.safetensors")
    assert res.returncode == 2 and "ckptio destinations only" in res.stderr
    assert not (tmp_path / "x.safetensors").exists()
    res = cli("convert", "--compress=fast", tmp_path / "in.pt", tmp_path / "y")
    assert res.returncode == 2 and "auto, all or none" in res.stderr


# ---- what inspect says -----------------------------------------------------------------------


def test_inspect_text(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "ck"
    tree = state()
    ckptio.save(tree, path, compress="all")
    res = cli("inspect", path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    head = next(ln for ln in lines if ln.startswith("NAME"))
    assert "CODEC" in head and "RATIO" in head
    row = {ln.split()[0]: ln.split() for ln in lines if ln.split() and ln.split()[0] in
           ("model.w", "opt.master", "opt.step")}
    assert row["model.w"][-2] == "float" and float(row["model.w"][-1].rstrip("x")) > 1.3
    assert row["opt.step"][-2:] == ["none", "1.00x"]
    total = next(ln for ln in lines if ln.startswith("total:"))
    doc = inspect(path)
    ratio = doc["bytes"] / doc["stored_bytes"]
    assert f"ratio {ratio:.2f}x" in total and ratio > 1.1, total
