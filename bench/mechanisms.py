# SPDX-License-Identifier: Apache-2.0
"""The save and load mechanisms `make bench` compares, the states they save, and the I/O helpers (durability, eviction, touching)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

State = dict[str, torch.Tensor]

# ------------------------------------------------------------------------------------------------
# States
# ------------------------------------------------------------------------------------------------

_POOL_BYTES = 64 << 20


def _pool() -> torch.Tensor:
    """64 MiB of bf16 values drawn like initialised weights (N(0, 0.02)): the source of every
    tensor's bytes, so compressing savers (Orbax's zstd) see realistic, not constant, data."""
    g = torch.Generator().manual_seed(0)
    return (torch.randn(_POOL_BYTES // 2, generator=g) * 0.02).to(torch.bfloat16)


def _filled(shape: tuple[int, ...], pool: torch.Tensor, salt: int) -> torch.Tensor:
    t = torch.empty(shape, dtype=torch.bfloat16)
    flat = t.view(-1)
    n, p, off = flat.numel(), pool.numel(), (salt * 7919) % pool.numel()
    i = 0
    while i < n:
        k = min(n - i, p - off)
        flat[i : i + k].copy_(pool[off : off + k])
        i += k
        off = 0
    return t


def tensor_state(nbytes: int) -> State:
    """save_tensor: one bf16 tensor of ``nbytes`` (rows of 4096 elements)."""
    return {"tensor": _filled((nbytes // 2 // 4096, 4096), _pool(), 1)}


@dataclass(frozen=True)
class GPTConfig:
    """A GPT-2/3-style decoder; the defaults are GPT-3 XL (~1.3B parameters)."""

    layers: int = 24
    d_model: int = 2048
    vocab: int = 50257
    context: int = 2048


MODELS = {
    "1.3b": GPTConfig(),
    "350m": GPTConfig(layers=24, d_model=1024),
    "125m": GPTConfig(layers=12, d_model=768),
}


def model_shapes(c: GPTConfig) -> dict[str, tuple[int, ...]]:
    d = c.d_model
    s: dict[str, tuple[int, ...]] = {"wte.weight": (c.vocab, d), "wpe.weight": (c.context, d)}
    for i in range(c.layers):
        p = f"h.{i}."
        s |= {
            p + "ln_1.weight": (d,), p + "ln_1.bias": (d,),
            p + "attn.c_attn.weight": (3 * d, d), p + "attn.c_attn.bias": (3 * d,),
            p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
            p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
            p + "mlp.c_fc.weight": (4 * d, d), p + "mlp.c_fc.bias": (4 * d,),
            p + "mlp.c_proj.weight": (d, 4 * d), p + "mlp.c_proj.bias": (d,),
        }  # fmt: skip
    s |= {"ln_f.weight": (d,), "ln_f.bias": (d,)}
    return s


def model_state(c: GPTConfig, optimizer: bool) -> State:
    """save_model: the model's bf16 weights (lm_head tied to wte, stored once) and, with
    ``optimizer``, AdamW's fp32 first and second moments of each, as flat key paths."""
    pool = _pool()
    st: State = {}
    for i, (k, shape) in enumerate(model_shapes(c).items()):
        st["model." + k] = _filled(shape, pool, i)
    if optimizer:
        for i, (k, shape) in enumerate(model_shapes(c).items()):
            for m, salt in (("exp_avg", 1), ("exp_avg_sq", 2)):
                st[f"optim.{m}.{k}"] = _filled(shape, pool, 3 * i + salt).float()
    return st


def state_bytes(st: State) -> int:
    return sum(t.numel() * t.element_size() for t in st.values())


def to_numpy(st: State) -> dict[str, np.ndarray]:
    """Zero-copy numpy views; bf16 as uint16 (numpy has no bf16 np.save can describe)."""
    return {k: (t.view(torch.uint16) if t.dtype == torch.bfloat16 else t).numpy() for k, t in st.items()}


def to_jax(st: State) -> dict[str, Any]:
    """The JAX variant of the state (a copy on the CPU device), for Orbax."""
    import jax
    import ml_dtypes

    out: dict[str, Any] = {}
    for k, t in st.items():
        a = t.view(torch.uint16).numpy().view(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 else t.numpy()
        out[k] = jax.device_put(a)
    jax.block_until_ready(out)
    return out


# ------------------------------------------------------------------------------------------------
# Durability, eviction, touching
# ------------------------------------------------------------------------------------------------


def _files_and_dirs(path: str) -> tuple[list[str], list[str]]:
    if os.path.isfile(path):
        return [path], [os.path.dirname(os.path.abspath(path))]
    files, dirs = [], []
    for root, _d, fs in os.walk(path):
        dirs.append(root)
        files += [os.path.join(root, f) for f in fs]
    dirs.append(os.path.dirname(os.path.abspath(path)))
    return files, dirs


def make_durable(path: str) -> None:
    """fsync every file under ``path``, then every directory (and the parent)."""
    files, dirs = _files_and_dirs(path)
    for p in files + dirs:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def evict(path: str) -> None:
    """Drop ``path``'s pages from the page cache: fsync, then POSIX_FADV_DONTNEED per file."""
    for p in _files_and_dirs(path)[0]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.remove(path)


def _leaves(x: Any) -> list[Any]:
    if isinstance(x, dict):
        return [y for v in x.values() for y in _leaves(v)]
    if isinstance(x, (list, tuple)):
        return [y for v in x for y in _leaves(v)]
    return [x]


def touch(loaded: Any, every_byte: bool) -> int:
    """Read the loaded tensors so that lazily mapped bytes are faulted in: one byte of every
    4 KiB page (which brings the whole page in), or with ``every_byte`` all of them. Returns
    the bytes seen."""
    total, acc = 0, 0
    for v in _leaves(loaded):
        if isinstance(v, torch.Tensor):
            a = v.contiguous().view(-1).view(torch.uint8).numpy()
        elif isinstance(v, np.ndarray) or hasattr(v, "__array__"):
            a = np.asarray(v)
            a = a.reshape(-1).view(np.uint8)
        else:
            continue
        total += a.size
        if every_byte:
            n8 = a.size // 8 * 8
            acc ^= int(np.bitwise_xor.reduce(a[:n8].view(np.uint64))) if n8 else 0
            acc ^= int(a[n8:].sum())
        else:
            acc += _touch_pages(a)
    return total


_PAGE = 4096
_LINE = 64
_BLOCK = _PAGE * (_PAGE // _LINE)  # 64 pages: one byte in each, at 64 different cache lines


def _touch_pages(a: np.ndarray) -> int:
    """Sum one byte of every 4 KiB page of the uint8 array ``a``: in the k-th page of each run
    of 64 pages, the byte at 64 * k. Not the byte at one fixed offset in every page: reading
    a byte at the start (or end) of each of 262,144 pages takes this machine's CPU about twice
    as long as at 0x240 into each (bench/touch_alignment.py measures it), so a loader whose
    tensors begin at a page boundary (ckptio's, the mapped ones) would be charged for where
    its bytes lie rather than for loading them."""
    if a.size == 0:
        return 0
    head = -a.ctypes.data % _PAGE  # bytes before the first page boundary
    acc = int(a[0]) if head else 0
    body = a[head:]
    nb = body.size // _BLOCK
    if nb:
        acc += int(body[: nb * _BLOCK].reshape(nb, _BLOCK)[:, :: _PAGE + _LINE].sum())
    return acc + int(body[nb * _BLOCK :: _PAGE].sum())


# ------------------------------------------------------------------------------------------------
# Mechanisms
# ------------------------------------------------------------------------------------------------


@dataclass
class Ctx:
    state: State
    jax_state: Any = None  # built on first use by Orbax
    into: Any = None  # load(into=): the caller's own tensors, built (untimed) by a load's prepare


@dataclass(frozen=True)
class Mechanism:
    """A way to save a state, and the loads that read what it saved."""

    name: str
    target: str  # "file" or "dir"
    save: Callable[[Ctx, str], None]
    loads: dict[str, Callable[[Ctx, str], Any]]
    save_nofsync: Callable[[Ctx, str], None] | None = None  # for savers that fsync themselves


def _torch_save(c: Ctx, p: str) -> None:
    torch.save(c.state, p)


def _np_save(c: Ctx, p: str) -> None:
    os.mkdir(p)
    for i, (k, a) in enumerate(to_numpy(c.state).items()):
        np.save(os.path.join(p, f"{i:05d}.npy"), a)
    with open(os.path.join(p, "keys.txt"), "w") as f:
        f.write("\n".join(c.state))


def _np_load(c: Ctx, p: str) -> dict[str, np.ndarray]:
    with open(os.path.join(p, "keys.txt")) as f:
        keys = f.read().split("\n")
    return {k: np.load(os.path.join(p, f"{i:05d}.npy")) for i, k in enumerate(keys)}


def _st_save(c: Ctx, p: str) -> None:
    import safetensors.torch

    safetensors.torch.save_file(c.state, p)


def _st_load(c: Ctx, p: str) -> Any:
    import safetensors.torch

    return safetensors.torch.load_file(p)


_orbax: dict[str, Any] = {}


def _checkpointer() -> Any:
    if "ckptr" not in _orbax:
        import orbax.checkpoint as ocp

        _orbax["ckptr"] = ocp.StandardCheckpointer()
    return _orbax["ckptr"]


def _orbax_save(c: Ctx, p: str) -> None:
    if c.jax_state is None:
        c.jax_state = to_jax(c.state)
    ck = _checkpointer()
    ck.save(os.path.abspath(p), c.jax_state)
    ck.wait_until_finished()


def _orbax_load(c: Ctx, p: str) -> Any:
    import jax

    if c.jax_state is None:
        c.jax_state = to_jax(c.state)
    like = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), c.jax_state)
    out = _checkpointer().restore(os.path.abspath(p), like)
    jax.block_until_ready(out)
    return out


def _through_ckptio(fn: Callable[[Ctx, str], Any]) -> Callable[[Ctx, str], Any]:
    """``fn`` (an Orbax save or restore) with ckptio.orbax's handler registered for jax.Array."""

    def run(c: Ctx, p: str) -> Any:
        import ckptio.orbax

        ckptio.orbax.register()
        try:
            return fn(c, p)
        finally:
            ckptio.orbax.unregister()

    return run


def _ckptio_save(c: Ctx, p: str, **kw: Any) -> None:
    import ckptio

    ckptio.save(c.state, p, overwrite=True, **kw)


def _ckptio_torch_save(c: Ctx, p: str, **kw: Any) -> None:
    import ckptio.torch

    ckptio.torch.save(c.state, p, **kw)


def _ckptio_load(c: Ctx, p: str) -> Any:
    import ckptio

    return ckptio.load(p)


def _ckptio_load_mmap(c: Ctx, p: str) -> Any:
    import ckptio

    return ckptio.load(p, mmap=True)


def _ckptio_load_into(c: Ctx, p: str) -> Any:
    import ckptio

    return ckptio.load(p, into=c.into)


def _prepare_into(c: Ctx) -> None:
    """Memory the caller owns already (a model's parameters): allocated and touched once."""
    if c.into is None:
        c.into = {k: torch.zeros_like(v) for k, v in c.state.items()}


_ckptio_load_into.prepare = _prepare_into  # type: ignore[attr-defined]


def _ckptio_torch_load(c: Ctx, p: str) -> Any:
    import ckptio.torch

    return ckptio.torch.load(p)


MECHANISMS: dict[str, Mechanism] = {
    m.name: m
    for m in (
        Mechanism("torch", "file", _torch_save, {
            "torch.load": lambda c, p: torch.load(p, weights_only=True),
            "torch.load(mmap)": lambda c, p: torch.load(p, weights_only=True, mmap=True),
        }),
        Mechanism("numpy", "dir", _np_save, {"np.load": _np_load}),
        Mechanism("safetensors", "file", _st_save, {"safetensors.load_file": _st_load}),
        Mechanism("orbax", "dir", _orbax_save, {"orbax.restore": _orbax_load}),
        Mechanism("orbax+ckptio", "dir", _through_ckptio(_orbax_save),
                  {"orbax.restore via ckptio": _through_ckptio(_orbax_load)}),
        Mechanism("ckptio", "dir", _ckptio_save, {"ckptio.load": _ckptio_load,
                                                  "ckptio.load(mmap)": _ckptio_load_mmap,
                                                  "ckptio.load(into)": _ckptio_load_into},
                  save_nofsync=lambda c, p: _ckptio_save(c, p, fsync=False)),
        Mechanism("ckptio.torch", "file", _ckptio_torch_save, {"ckptio.torch.load": _ckptio_torch_load},
                  save_nofsync=lambda c, p: _ckptio_torch_save(c, p, fsync=False)),
    )
}  # fmt: skip

SAVE_NAMES = {
    "torch": "torch.save",
    "numpy": "np.save",
    "safetensors": "safetensors.save_file",
    "orbax": "orbax StandardCheckpointer",
    "orbax+ckptio": "orbax via ckptio.orbax",
    "ckptio": "ckptio.save",
    "ckptio.torch": "ckptio.torch.save",
}
