# SPDX-License-Identifier: Apache-2.0
"""ckptio.orbax: Orbax's StandardCheckpointer and CheckpointManager storing jax arrays through
ckptio (one process with 8 CPU devices here; two processes in tests/python/dist/orbax_jax.py)."""

from __future__ import annotations

import pathlib
import sys
from typing import Any, Iterator

import numpy as np
import pytest

import ckptio
from test_comm_dist import launch_jax, results

jax = pytest.importorskip("jax")
ocp = pytest.importorskip("orbax.checkpoint")
jnp = jax.numpy
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import ckptio.orbax  # noqa: E402


@pytest.fixture(autouse=True)
def registered() -> Iterator[None]:
    ckptio.orbax.register()
    yield
    ckptio.orbax.unregister()


def mesh(n: int, axes: tuple[str, ...] = ("d",), shape: tuple[int, ...] | None = None) -> Mesh:
    devs = np.array(jax.devices()[:n]).reshape(shape or (n,))
    return Mesh(devs, axes)


def state() -> dict[str, Any]:
    m4 = mesh(4)
    m22 = mesh(4, ("a", "b"), (2, 2))
    rows = NamedSharding(m4, P("d"))
    return {
        "params": {
            "w": jax.device_put(jnp.arange(64, dtype=jnp.float32).reshape(8, 8), rows),
            "b16": jax.device_put(
                (jnp.arange(32, dtype=jnp.float32) / 8).astype(jnp.bfloat16).reshape(4, 8),
                NamedSharding(m22, P("a", "b")),
            ),
            "rep": jax.device_put(jnp.arange(6, dtype=jnp.int32), NamedSharding(m4, P())),
        },
        "opt": [jax.device_put(jnp.full((8, 2), 3, jnp.int8), rows),
                jax.device_put(jnp.array(True), NamedSharding(m4, P()))],
        "step": jax.device_put(jnp.array(7, jnp.int64 if jax.config.jax_enable_x64 else jnp.int32),
                               NamedSharding(m4, P())),
    }


def other_targets(tree: dict[str, Any]) -> Any:
    """Each array restored onto another sharding: columns over 8 devices, or one device."""
    m8 = mesh(8)

    def target(x: Any) -> Any:
        if x.ndim == 2 and x.shape[1] % 8 == 0:
            s = NamedSharding(m8, P(None, "d"))
        elif x.ndim >= 1 and x.shape[0] % 8 == 0:
            s = NamedSharding(m8, P("d"))
        else:
            s = jax.sharding.SingleDeviceSharding(jax.devices()[5])
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)

    return jax.tree.map(target, tree)


def assert_same(a: Any, b: Any, like: Any = None) -> None:
    fa, fb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(fa) == len(fb)
    for x, y in zip(fa, fb):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(np.asarray(x), np.asarray(y))
    if like is not None:
        for x, t in zip(fa, jax.tree.leaves(like)):
            assert x.sharding == t.sharding
            for s in x.addressable_shards:  # every device holds its own box
                assert s.data.shape == t.sharding.shard_shape(t.shape)


def test_standard_checkpointer_round_trip(tmp_path: pathlib.Path) -> None:
    tree = state()
    path = tmp_path / "ckpt"
    with ocp.StandardCheckpointer() as c:
        c.save(path, tree)
        c.wait_until_finished()
        like = other_targets(tree)
        out = c.restore(path, like)
    assert_same(out, tree, like)
    # The bytes went through ckptio: the item directory holds a ckptio checkpoint that ckptio
    # reads without Orbax, and no tensorstore array data.
    store = path / ckptio.orbax.SUBDIR
    assert (store / "manifest").is_file() and (store / "data" / "r00000-000000.ckd").is_file()
    plain = ckptio.load(store, framework="numpy")
    assert sorted(plain) == ["opt.0", "opt.1", "params.b16", "params.rep", "params.w", "step"]
    assert np.array_equal(plain["params.w"], np.arange(64, dtype=np.float32).reshape(8, 8))
    assert plain["params.b16"].dtype == jnp.bfloat16
    with ckptio.open(store) as r:
        r.verify()
        assert r.info("params.w").shape == (8, 8)
    assert sorted(p.name for p in path.iterdir()) == [
        "_CHECKPOINT_METADATA", "_METADATA", "ckptio", "commit_success.txt"]  # no tensorstore
    # Restored with the saved shardings (no target), and the metadata Orbax shows.
    with ocp.StandardCheckpointer() as c:
        again = c.restore(path)
        meta = c.metadata(path)
    assert_same(again, tree)
    assert again["params"]["w"].sharding == tree["params"]["w"].sharding
    m = meta.item_metadata if hasattr(meta, "item_metadata") else meta
    assert m["params"]["b16"].shape == (4, 8) and m["params"]["b16"].dtype == jnp.bfloat16


def test_cast_on_restore(tmp_path: pathlib.Path) -> None:
    tree = {"w": jnp.arange(8, dtype=jnp.float32)}
    with ocp.StandardCheckpointer() as c:
        c.save(tmp_path / "c", tree)
        c.wait_until_finished()
        t = jax.ShapeDtypeStruct((8,), jnp.bfloat16, sharding=NamedSharding(mesh(2), P("d")))
        out = c.restore(tmp_path / "c", {"w": t})
    assert out["w"].dtype == jnp.bfloat16 and np.array_equal(np.asarray(out["w"]), np.arange(8))
    with ocp.StandardCheckpointer() as c:
        bad = {"w": jax.ShapeDtypeStruct((9,), jnp.float32, sharding=t.sharding)}
        with pytest.raises(Exception, match="saved with shape"):
            c.restore(tmp_path / "c", bad)


def test_checkpoint_manager_steps(tmp_path: pathlib.Path) -> None:
    tree = state()
    opts = ocp.CheckpointManagerOptions(max_to_keep=2)
    with ocp.CheckpointManager(tmp_path / "run", options=opts) as mgr:
        for step in range(4):
            t = jax.tree.map(lambda x, s=step: x + s if x.dtype != jnp.bool_ else x, tree)
            mgr.save(step, args=ocp.args.StandardSave(t))
        mgr.wait_until_finished()
        assert mgr.all_steps() == [2, 3]
        like = other_targets(tree)
        out = mgr.restore(3, args=ocp.args.StandardRestore(like))
    want = jax.tree.map(lambda x: x + 3 if x.dtype != jnp.bool_ else x, tree)
    assert_same(out, want, like)
    for step in (2, 3):
        item = tmp_path / "run" / str(step) / "default" / ckptio.orbax.SUBDIR
        assert ckptio.load(item, framework="numpy")["step"] == 7 + step


def test_corrupt_block_fails_restore(tmp_path: pathlib.Path) -> None:
    tree = {"w": jax.device_put(jnp.arange(4096, dtype=jnp.float32),
                                NamedSharding(mesh(4), P("d")))}
    path = tmp_path / "c"
    with ocp.StandardCheckpointer() as c:
        c.save(path, tree)
        c.wait_until_finished()
    data = sorted((path / ckptio.orbax.SUBDIR / "data").iterdir())
    assert data
    with open(data[0], "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))
    with ocp.StandardCheckpointer() as c:
        with pytest.raises(ckptio.ChecksumMismatch, match="w"):
            c.restore(path, jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree))


def test_orbax_checkpoints_still_restore(tmp_path: pathlib.Path) -> None:
    """A checkpoint Orbax wrote itself (before register()) restores through the fallback."""
    tree = {"w": jax.device_put(jnp.arange(16, dtype=jnp.float32), NamedSharding(mesh(4), P("d")))}
    ckptio.orbax.unregister()
    with ocp.StandardCheckpointer() as c:
        c.save(tmp_path / "plain", tree)
        c.wait_until_finished()
    assert not (tmp_path / "plain" / ckptio.orbax.SUBDIR).exists()
    ckptio.orbax.register()
    with ocp.StandardCheckpointer() as c:
        out = c.restore(tmp_path / "plain", other_targets(tree))
    assert_same(out, tree)


def test_import_ckptio_does_not_import_orbax() -> None:
    import subprocess

    code = "import sys, ckptio; print('orbax' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_two_processes(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    launch_jax("orbax_jax.py", 2, 4, out, str(tmp_path))  # 2 processes x 4 CPU devices
    res = results(out, "orbax")
    assert sorted(res) == [0, 1], res
    for r, v in res.items():
        assert "error" not in v, (r, v)
        assert v["restored_ok"] and v["manager_steps"] == [1, 2], v
        assert v["written"] > 0, v  # each process wrote its own boxes into its own data file
        assert v["read"] == 2 * 4 * 4 * 4, v  # half the rows of each (8, 4) f32 array
    refused = results(out, "refused")
    assert sorted(refused) == [0, 1], refused
    for v in refused.values():
        assert "injected staging failure" in v.get("message", ""), v
    assert "rank 1 could not stage" in refused[0]["message"], refused
    assert not (tmp_path / "refused").exists()
    # Both processes wrote a data file; one process reads the whole checkpoint, in ckptio.
    store = tmp_path / "ckpt" / ckptio.orbax.SUBDIR
    assert len(list((store / "data").iterdir())) == 2
    with ckptio.open(store) as r:  # a box per device for x; rep once, by replica 0's owner
        assert r.info("x").num_chunks == 8 and r.info("rep").num_chunks == 1
    full = ckptio.load(store, framework="numpy")
    assert np.array_equal(full["x"], np.arange(8 * 4, dtype=np.float32).reshape(8, 4))
    assert np.array_equal(full["rep"], np.arange(8 * 4, dtype=np.float32).reshape(8, 4) * 2)
    # And one process restores the 2-process checkpoint through Orbax onto its own devices.
    tree = {"x": jax.ShapeDtypeStruct((8, 4), jnp.float32,
                                      sharding=NamedSharding(mesh(8), P(None, None))),
            "rep": jax.ShapeDtypeStruct((8, 4), jnp.float32,
                                        sharding=NamedSharding(mesh(4), P("d")))}
    with ocp.StandardCheckpointer() as c:
        got = c.restore(tmp_path / "ckpt", tree)
    assert np.array_equal(np.asarray(got["x"]), full["x"])
    assert np.array_equal(np.asarray(got["rep"]), full["rep"])
