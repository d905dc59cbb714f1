# SPDX-License-Identifier: Apache-2.0
"""GPU arrays through ckptio's GPU path (doc/gpu.md).

Without a GPU: arrays speaking the CUDA array interface whose "device memory" belongs to the
test-only driver stand-in (tests/gpu_standin.c, loaded through CKPTIO_CUDA_LIBRARY), each
case in a fresh interpreter since the driver is loaded once per process; and the no-driver
fallback. With a GPU (make test-gpu): torch CUDA tensors, JAX GPU arrays and CuPy arrays; those
tests skip where there is none."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ckptio

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _standin() -> str | None:
    env = os.environ.get("CKPTIO_GPU_STANDIN")
    if env:
        return env
    for build in sorted(ROOT.glob("build*")):
        lib = build / "tests" / "libckptio-gpu-standin.so"
        if lib.exists():
            return str(lib)
    return None


# A GPU array of the stand-in: numpy bytes copied into its "device memory".
FAKE = """
import ctypes, numpy as np
lib = ctypes.CDLL(STANDIN)
lib.standin_malloc.restype = ctypes.c_void_p
lib.standin_malloc.argtypes = [ctypes.c_size_t]
class FakeGpu:
    def __init__(self, a, host_copy=True):
        self.a = np.ascontiguousarray(a)
        self.ptr = lib.standin_malloc(max(self.a.nbytes, 1))
        ctypes.memmove(self.ptr, self.a.ctypes.data, self.a.nbytes)
        if host_copy:
            self.get = lambda: self.a.copy()
    @property
    def __cuda_array_interface__(self):
        return {"shape": self.a.shape, "typestr": self.a.dtype.str, "data": (self.ptr, False),
                "strides": None, "version": 3, "stream": 1}
"""


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter with `env` over ours. A case that names its CUDA driver
    (the stand-in, or none) names its cuFile too: the stand-in's (which fails to open unless
    CKPTIO_STANDIN_GDS=1), never a real one that `make test-gpu` found for its own phases."""
    full = {**os.environ, **env}
    full.pop("CKPTIO_GPU", None) if "CKPTIO_GPU" not in env else None
    if "CKPTIO_CUDA_LIBRARY" in env and "CKPTIO_CUFILE_LIBRARY" not in env:
        full["CKPTIO_CUFILE_LIBRARY"] = env["CKPTIO_CUDA_LIBRARY"]
        full.pop("CKPTIO_STANDIN_GDS", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize("gds", [False, True])
def test_cuda_array_interface_through_standin(tmp_path: pathlib.Path, gds: bool) -> None:
    """Arrays in (stand-in) GPU memory are saved by device pointer through the staged ring (or
    GDS), with the same format: they load back equal, and Stats.gpu says which path ran."""
    lib = _standin()
    if lib is None:
        pytest.skip("the GPU stand-in is not built (make)")
    env = {"CKPTIO_CUDA_LIBRARY": lib}
    if gds:
        env.update(CKPTIO_CUFILE_LIBRARY=lib, CKPTIO_STANDIN_GDS="1")
    code = f"STANDIN = {lib!r}\n" + FAKE + f"""
import ckptio
a = np.arange(3 << 18, dtype=np.float32).reshape(768, 1024)
b = (np.arange(10) % 3 == 0)
st = ckptio.save({{"a": FakeGpu(a, host_copy=False), "b": FakeGpu(b, host_copy=False),
                  "h": np.ones(3)}}, {str(tmp_path / "ck")!r}, gpu_staging_bytes=4 << 20)
out = ckptio.load({str(tmp_path / "ck")!r})
assert np.array_equal(out["a"], a) and np.array_equal(out["b"], b), "data differs"
ckptio.open({str(tmp_path / "ck")!r}).verify()
print("GPU", st.gpu, st.direct)
"""
    r = _run(code, env)
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip().splitlines()[-1]
    path, direct = line.split()[1], line.split()[-1] == "True"
    if gds and direct:
        assert path == "gds+staged"  # the big array by cuFile, the small one staged
    else:
        assert path == "staged"


def test_no_driver_falls_back_or_refuses(tmp_path: pathlib.Path) -> None:
    """No usable driver: a GPU array is copied by its framework (Stats.gpu says why); with
    CKPTIO_GPU=staged (or gds, or gpu="staged") forced, the save refuses with a clear error."""
    lib = _standin()
    if lib is None:
        pytest.skip("the GPU stand-in is not built (make)")
    base = f"STANDIN = {lib!r}\n" + FAKE + f"""
import ckptio
a = np.arange(100, dtype=np.int64)
try:
    st = ckptio.save({{"a": FakeGpu(a)}}, {str(tmp_path / "ck")!r}, overwrite=True)
except ckptio.Unsupported as e:
    print("REFUSED", e)
else:
    assert np.array_equal(ckptio.load({str(tmp_path / "ck")!r})["a"], a)
    print("GPU", st.gpu)
"""
    # The stand-in library is loaded by the test itself, not as the driver: none is found.
    env = {"CKPTIO_CUDA_LIBRARY": "/nonexistent/libcuda.so.1"}
    r = _run(base, env)
    assert r.returncode == 0, r.stderr
    assert "GPU host copy (the CUDA driver (/nonexistent/libcuda.so.1) is not installed" in r.stdout
    r = _run(base, {**env, "CKPTIO_GPU": "staged"})
    assert r.returncode == 0, r.stderr
    assert "REFUSED" in r.stdout and "CKPTIO_GPU=staged" in r.stdout
    r = _run(base, {"CKPTIO_CUDA_LIBRARY": lib, "CKPTIO_GPU": "off"})
    assert r.returncode == 0, r.stderr
    assert "GPU host copy (CKPTIO_GPU=off)" in r.stdout
    # The same through the gpu= option: the C library's route says who asked.
    by_option = base.replace("overwrite=True", 'overwrite=True, gpu="staged"')
    r = _run(by_option, env)
    assert r.returncode == 0, r.stderr
    assert "REFUSED" in r.stdout and "gpu=staged asks" in r.stdout
    r = _run(by_option.replace('"staged"', '"off"'), {"CKPTIO_CUDA_LIBRARY": lib})
    assert r.returncode == 0, r.stderr
    assert "GPU host copy (gpu=off)" in r.stdout


# Two ranks as threads of one process (tests/python/test_comm.py's ThreadComm), each holding
# its rows of "w" (a Shard) and a replicated "rep" in stand-in GPU memory, and "h" on the host.
DIST = """
import sys, threading
sys.path.insert(0, TESTS)
from test_comm import ThreadComm, ThreadGroup
import ckptio
a = np.arange(8 << 16, dtype=np.float32).reshape(8, 1 << 16)
rep = (np.arange(1 << 18) % 251).astype(np.float32)
def trees(bad):
    out = []
    for r in range(2):
        x = rep.copy()
        if r == bad:
            x[-5] += 1
        out.append({"w": ckptio.Shard(FakeGpu(a[4 * r:4 * r + 4], host_copy=HOST), (4 * r, 0), a.shape),
                    "rep": FakeGpu(x, host_copy=HOST), "h": np.arange(3)})
    return out
def save_all(ts, path):
    g, res = ThreadGroup(2), [None, None]
    def one(r):
        try:
            res[r] = ckptio.save(ts[r], path, comm=ThreadComm(g, r), timeout=30,
                                 gpu_staging_bytes=4 << 20, overwrite=True)
        except Exception as e:
            res[r] = e
    th = [threading.Thread(target=one, args=(r,)) for r in range(2)]
    [t.start() for t in th]
    [t.join() for t in th]
    return res
"""


def test_dist_save_from_device_memory(tmp_path: pathlib.Path) -> None:
    """ckptio.save(comm=...) writes each rank's GPU arrays (a Shard, a replicated array) by
    device pointer through the ranks' rings (no host copy by the framework): they load back
    equal, Stats.gpu says so; replicas that differ in GPU memory fail every rank, nothing
    published; without a driver the framework's host copy is used, saying why."""
    lib = _standin()
    if lib is None:
        pytest.skip("the GPU stand-in is not built (make)")
    ck = str(tmp_path / "ck")
    code = f"STANDIN = {lib!r}\nTESTS = {str(ROOT / 'tests' / 'python')!r}\nHOST = False\n"
    code += FAKE + DIST + f"""
res = save_all(trees(-1), {ck!r})
assert not any(isinstance(x, Exception) for x in res), res
out = ckptio.load({ck!r})
assert np.array_equal(out["w"], a) and np.array_equal(out["rep"], rep), "data differs"
ckptio.open({ck!r}).verify()
print("GPU", res[0].gpu)
res = save_all(trees(1), {ck + "2"!r})
assert all(isinstance(x, ckptio.DuplicateTensor) for x in res), res
assert all("tensor 'rep'" in str(x) and "ranks 0 and 1" in str(x) for x in res), res
import os
assert not os.path.exists({ck + "2"!r})
print("DIVERGED")
"""
    r = _run(code, {"CKPTIO_CUDA_LIBRARY": lib})
    assert r.returncode == 0, r.stderr
    assert "GPU device (staged or gds, per rank)" in r.stdout and "DIVERGED" in r.stdout
    # No usable driver: the arrays' own host copies (FakeGpu.get), and why, in the stats.
    code = code.replace("HOST = False", "HOST = True")
    r = _run(code, {"CKPTIO_CUDA_LIBRARY": "/nonexistent/libcuda.so.1"})
    assert r.returncode == 0, r.stderr
    assert "GPU host copy (the CUDA driver (/nonexistent/libcuda.so.1) is not installed" in r.stdout


def test_doctor_says_which_gpu_path() -> None:
    text = ckptio._core.describe_system(".")
    assert "\ngpu: " in text


# ---- on a GPU (make test-gpu) ----



def _torch_cuda() -> object:
    try:
        import torch as t
    except ImportError:
        pytest.skip("torch is not installed")
    if not t.cuda.is_available():
        pytest.skip("no CUDA GPU")
    return t


def test_torch_cuda_roundtrip(tmp_path: pathlib.Path) -> None:
    """CUDA tensors are saved from GPU memory (no .cpu()), after the work queued on the current
    stream, and load back into GPU memory with device= and like=, every byte equal."""
    t = _torch_cuda()
    g = t.Generator(device="cuda").manual_seed(0)
    s = t.cuda.Stream()
    with t.cuda.stream(s):
        w = t.randn(1024, 1031, device="cuda", generator=g)
        w.mul_(3)  # queued on s: ckptio must wait for it
        tree = {"w": w, "b": t.arange(7, device="cuda", dtype=t.bfloat16), "nc": w.t()}
        st = ckptio.save(tree, tmp_path / "ck")
    assert st.gpu in ("staged", "gds", "gds+staged") or st.gpu.startswith(("staged", "gds"))
    out = ckptio.load(tmp_path / "ck", device="cuda:0")
    assert out["w"].is_cuda and t.equal(out["w"], w) and t.equal(out["b"], tree["b"])
    assert t.equal(out["nc"], w.t())
    like = {"w": t.empty_like(w), "b": t.empty_like(tree["b"]), "nc": t.empty_like(w.t())}
    out = ckptio.load(tmp_path / "ck", like=like)
    assert t.equal(out["w"], w)
    assert ckptio.last_load_stats().gpu.startswith(("staged", "gds"))
    host = ckptio.load(tmp_path / "ck")
    assert t.equal(host["w"].cpu(), w.cpu())


def test_torch_cuda_async(tmp_path: pathlib.Path) -> None:
    """save_async snapshots CUDA tensors into pinned memory: changing them right after the
    call does not change what is saved."""
    t = _torch_cuda()
    w = t.full((1 << 20,), 1.0, device="cuda")
    h = ckptio.save_async({"w": w}, tmp_path / "ck")
    w.fill_(2.0)
    h.wait()
    assert t.equal(ckptio.load(tmp_path / "ck")["w"], t.full((1 << 20,), 1.0))


def test_jax_gpu_roundtrip(tmp_path: pathlib.Path) -> None:
    jax = pytest.importorskip("jax")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        pytest.skip("no JAX GPU")
    x = jax.device_put(np.arange(1 << 20, dtype=np.float32), gpus[0])
    st = ckptio.save({"x": x}, tmp_path / "ck")
    assert st.gpu.startswith(("staged", "gds")), st.gpu
    assert np.array_equal(np.asarray(ckptio.load(tmp_path / "ck")["x"]), np.asarray(x))


def test_cupy_roundtrip(tmp_path: pathlib.Path) -> None:
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA GPU")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("no CUDA GPU")
    x = cupy.arange(1 << 20, dtype=cupy.float64)
    st = ckptio.save({"x": x}, tmp_path / "ck")
    assert st.gpu.startswith(("staged", "gds")), st.gpu
    y = ckptio.load(tmp_path / "ck")["x"]
    assert isinstance(y, cupy.ndarray) and bool((y == x).all())


def test_torch_cuda_dist_save(tmp_path: pathlib.Path) -> None:
    """A distributed save (two ranks as threads) of CUDA tensors: each rank's Shard and the
    replicated tensor are written by device pointer (Stats.gpu says so), load back equal, and
    replicas differing in GPU memory fail every rank."""
    t = _torch_cuda()
    import threading

    from test_comm import ThreadComm, ThreadGroup

    from ckptio.ranks._dist import GPU_NOTE

    w = t.randn(8, 1 << 16, device="cuda")
    rep = t.arange(1 << 20, device="cuda", dtype=t.float32)

    def save_all(reps: list[object], path: pathlib.Path) -> list[object]:
        g, res = ThreadGroup(2), [None, None]

        def one(r: int) -> None:
            tree = {"w": ckptio.Shard(w[4 * r : 4 * r + 4], (4 * r, 0), tuple(w.shape)),
                    "rep": reps[r]}  # fmt: skip
            try:
                res[r] = ckptio.save(tree, path, comm=ThreadComm(g, r), timeout=60)
            except Exception as e:  # judged below
                res[r] = e

        th = [threading.Thread(target=one, args=(r,)) for r in range(2)]
        for x in th:
            x.start()
        for x in th:
            x.join()
        return res

    res = save_all([rep, rep.clone()], tmp_path / "ck")
    assert all(getattr(x, "gpu", None) == GPU_NOTE for x in res), res
    out = ckptio.load(tmp_path / "ck")
    assert t.equal(out["w"], w.cpu()) and t.equal(out["rep"], rep.cpu())
    bad = rep.clone()
    bad[-3] += 1
    res = save_all([rep, bad], tmp_path / "ck2")
    assert all(isinstance(x, ckptio.DuplicateTensor) for x in res), res
    assert not (tmp_path / "ck2").exists()
