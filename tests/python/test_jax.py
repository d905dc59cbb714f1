# SPDX-License-Identifier: Apache-2.0
"""JAX: sharded arrays saved shard by shard and loaded into any sharding (8 CPU devices)."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P, SingleDeviceSharding

import ckptio


def mesh(shape: tuple[int, ...], names: tuple[str, ...], devices: list[object] | None = None) -> Mesh:
    devs = np.array(devices if devices is not None else jax.devices()[: int(np.prod(shape))])
    return Mesh(devs.reshape(shape), names)


def test_eight_devices() -> None:
    assert len(jax.devices()) == 8, "conftest sets --xla_force_host_platform_device_count=8"


def host(x: jax.Array) -> np.ndarray:
    return np.asarray(jax.device_get(x))


def test_sharded_save_writes_each_shard_once(ckpt: pathlib.Path) -> None:
    m = mesh((4, 2), ("x", "y"))
    full = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    a = jax.device_put(full, NamedSharding(m, P("x", "y")))  # 8 distinct shards
    b = jax.device_put(full, NamedSharding(m, P("x")))  # 4 shards, each on 2 devices
    c = jax.device_put(full, NamedSharding(m, P()))  # replicated on 8 devices
    st = ckptio.save({"a": a, "b": b, "c": c}, ckpt)
    assert st.bytes == 3 * full.nbytes  # replicas written once
    with ckptio.open(ckpt) as r:
        chunks = {k: v.num_chunks for k, v in r.tensors().items()}
    assert chunks == {"a": 8, "b": 4, "c": 1}
    out = ckptio.load(ckpt)
    for k, src in (("a", a), ("b", b), ("c", c)):
        assert isinstance(out[k], jax.Array)
        assert out[k].sharding == src.sharding, k
        assert np.array_equal(host(out[k]), full)


@pytest.mark.parametrize(
    "target",
    ["other_mesh", "transposed", "replicated", "single", "rows_on_4"],
)
def test_reshard_on_load(ckpt: pathlib.Path, target: str) -> None:
    full = np.arange(16 * 12, dtype=np.float32).reshape(16, 12)
    src = jax.device_put(full, NamedSharding(mesh((4, 2), ("x", "y")), P("x", "y")))
    ckptio.save({"w": src}, ckpt)
    if target == "other_mesh":
        s = NamedSharding(mesh((2, 2), ("p", "q"), jax.devices()[4:]), P("q", "p"))
    elif target == "transposed":
        s = NamedSharding(mesh((2, 4), ("a", "b")), P("b", "a"))
    elif target == "replicated":
        s = NamedSharding(mesh((8,), ("d",)), P())
    elif target == "single":
        s = SingleDeviceSharding(jax.devices()[3])
    else:
        s = NamedSharding(mesh((4,), ("d",)), P("d", None))
    like = {"w": jax.ShapeDtypeStruct(full.shape, full.dtype, sharding=s)}
    out = ckptio.load(ckpt, like=like)
    assert out["w"].sharding == s
    assert np.array_equal(host(out["w"]), full)
    for shard in out["w"].addressable_shards:
        assert np.array_equal(np.asarray(shard.data), full[shard.index])


def test_like_arrays_dtypes_and_conversions(ckpt: pathlib.Path) -> None:
    m = mesh((2,), ("x",))
    w = jax.device_put(jnp.arange(8, dtype=jnp.bfloat16), NamedSharding(m, P("x")))
    ckptio.save({"w": w, "i": jnp.int32(3), "step": 10}, ckpt)
    out = ckptio.load(ckpt)
    assert out["w"].dtype == jnp.bfloat16 and out["i"].dtype == jnp.int32 and out["step"] == 10
    assert int(out["i"]) == 3
    # like= with real arrays takes their sharding and dtype.
    tgt = jax.device_put(jnp.zeros(8, jnp.float32), NamedSharding(mesh((4,), ("z",)), P("z")))
    got = ckptio.load(ckpt, like={"w": tgt})
    assert got["w"].dtype == jnp.float32 and got["w"].sharding == tgt.sharding
    assert host(got["w"]).tolist() == list(range(8))
    n = ckptio.load(ckpt, framework="numpy")
    assert isinstance(n["w"], np.ndarray) and n["w"].dtype == ml_dtypes.bfloat16
    t = ckptio.load(ckpt, framework="torch")
    import torch

    assert t["w"].dtype == torch.bfloat16 and t["w"].float().tolist() == list(range(8))
    d = ckptio.load(ckpt, device=jax.devices()[6])
    assert d["w"].sharding == SingleDeviceSharding(jax.devices()[6])


def test_numpy_and_torch_to_jax(ckpt: pathlib.Path) -> None:
    import torch

    ckptio.save({"n": np.arange(4.0), "t": torch.arange(3, dtype=torch.bfloat16)}, ckpt)
    out = ckptio.load(ckpt, framework="jax")
    assert isinstance(out["n"], jax.Array) and host(out["n"]).tolist() == [0, 1, 2, 3]
    assert out["t"].dtype == jnp.bfloat16
    s = NamedSharding(mesh((2,), ("x",)), P("x"))
    got = ckptio.load(ckpt, like={"n": jax.ShapeDtypeStruct((4,), jnp.float64, sharding=s)})
    assert got["n"].sharding == s


def test_reader_read_region_of_sharded(ckpt: pathlib.Path) -> None:
    full = np.arange(64, dtype=np.int32).reshape(8, 8)
    a = jax.device_put(full, NamedSharding(mesh((4, 2), ("x", "y")), P("x", "y")))
    ckptio.save({"a": a}, ckpt)
    with ckptio.open(ckpt) as r:
        part = r.read("a", np.s_[1:7, 3:5])
        assert isinstance(part, jax.Array)
        assert np.array_equal(host(part), full[1:7, 3:5])
        assert np.array_equal(r.read("a", np.s_[2], framework="numpy"), full[2])


def test_prng_keys_are_refused(ckpt: pathlib.Path) -> None:
    with pytest.raises(TypeError, match="key_data"):
        ckptio.save({"k": jax.random.key(0)}, ckpt)
    assert not ckpt.exists()
