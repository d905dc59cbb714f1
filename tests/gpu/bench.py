# SPDX-License-Identifier: Apache-2.0
"""The GPU bench of `make test-gpu` (tests/gpu/run.sh): save and load a state of CUDA tensors
with torch.save/torch.load, ckptio staged, ckptio GDS and ckptio's host-copy path, next to the
device's raw O_DIRECT figures on the same directory; peak host memory of each phase and
equality of every tensor. Writes one JSON object (--out). Bench numbers, not test asserts:
a phase that fails is reported with its error and the exit status is 1.

    python3 tests/gpu/bench.py --dir DIR --ckptio build-gpu/bin/ckptio --out bench.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import time
import traceback
from collections.abc import Callable
from typing import Any


def _rss() -> int:
    """Resident bytes now and their peak since the last reset: (rss, hwm)."""
    vals = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":")
                vals[k] = int(v.split()[0]) * 1024
    return vals["VmRSS"], vals["VmHWM"]


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to VmRSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def _drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return True
    except OSError:
        return False


def phase(sync: Callable[[], None], fn: Callable[[], Any]) -> tuple[Any, float, int]:
    """(result, seconds, peak host bytes above the resident size at the start)."""
    gc.collect()
    _reset_peak()
    base, _ = _rss()
    t0 = time.perf_counter()
    out = fn()
    sync()
    dt = time.perf_counter() - t0
    _, hwm = _rss()
    return out, dt, max(hwm - base, 0)


def make_state(torch: Any, total: int) -> dict[str, Any]:
    """About `total` bytes of CUDA tensors: large bf16 matrices, a few f32 ones, many small."""
    g = torch.Generator(device="cuda").manual_seed(0)
    state: dict[str, Any] = {}
    big = 256 << 20
    n_big = max(total // big - 1, 1)
    for i in range(n_big):
        state[f"layer{i}.w"] = torch.randn(big // 2 // 4096, 4096, device="cuda",
                                           generator=g, dtype=torch.float32).to(torch.bfloat16)
    for i in range(4):
        state[f"f32.{i}"] = torch.randn(1 << 20, device="cuda", generator=g)  # 4 MiB each
    for i in range(200):
        state[f"small.{i}"] = torch.randn(257 + 31 * i, device="cuda", generator=g)
    state["step"] = torch.tensor(1234, device="cuda")
    torch.cuda.synchronize()
    return state


def all_equal(torch: Any, a: dict[str, Any], b: dict[str, Any], cuda: bool) -> bool:
    if a.keys() != b.keys():
        return False
    for k, v in a.items():
        w = b[k]
        if not isinstance(w, torch.Tensor) or w.is_cuda != cuda:
            return False
        if not torch.equal(v, w.to(v.device)):
            return False
    return True


def nbytes(state: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--ckptio", required=True, help="the ckptio command (raw device figures)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--bytes", type=int, default=int(os.environ.get("GPU_BENCH_BYTES", 4 << 30)))
    args = ap.parse_args()
    res: dict[str, Any] = {"dir": args.dir}
    failed = False

    def record(name: str, fn: Callable[[], dict[str, Any]]) -> None:
        nonlocal failed
        try:
            res[name] = fn()
        except Exception as e:  # noqa: BLE001 - reported, the next phase still runs
            failed = True
            res[name] = {"error": f"{type(e).__name__}: {e}"}
            traceback.print_exc()

    try:
        import torch

        import ckptio
    except ImportError as e:
        res["error"] = f"cannot import torch or ckptio: {e}"
        json.dump(res, open(args.out, "w"), indent=1)
        return 1
    if not torch.cuda.is_available():
        res["error"] = "torch sees no CUDA device"
        json.dump(res, open(args.out, "w"), indent=1)
        return 1
    res["torch"] = torch.__version__
    res["device"] = torch.cuda.get_device_name(0)
    res["ckptio"] = ckptio.__version__ if hasattr(ckptio, "__version__") else ""
    state = make_state(torch, args.bytes)
    total = nbytes(state)
    res["bytes"] = total
    res["tensors"] = len(state)
    res["drop_caches"] = _drop_caches()
    sync = torch.cuda.synchronize

    def torch_path() -> dict[str, Any]:
        f = os.path.join(args.dir, "state.pt")
        _, ts, ms = phase(sync, lambda: torch.save(state, f))
        _drop_caches()
        out, tl, ml = phase(sync, lambda: torch.load(f, map_location="cuda:0"))
        eq = all_equal(torch, state, out, True)
        del out
        os.unlink(f)
        return {"save_gbps": total / ts / 1e9, "load_gbps": total / tl / 1e9,
                "save_peak_host_bytes": ms, "load_peak_host_bytes": ml, "equal": eq}

    def ckptio_path(mode: str) -> dict[str, Any]:
        os.environ["CKPTIO_GPU"] = mode
        d = os.path.join(args.dir, f"ck-{mode}")
        st, ts, ms = phase(sync, lambda: ckptio.save(state, d, overwrite=True))
        _drop_caches()
        out, tl, ml = phase(sync, lambda: ckptio.load(d, device="cuda:0"))
        lst = ckptio.last_load_stats()
        eq = all_equal(torch, state, out, True)
        del out
        like = {k: torch.empty_like(v) for k, v in state.items()}
        out = ckptio.load(d, like=like)
        eq_like = all_equal(torch, state, out, True)
        del out, like
        shutil.rmtree(d)
        return {"save_gbps": total / ts / 1e9, "load_gbps": total / tl / 1e9,
                "save_peak_host_bytes": ms, "load_peak_host_bytes": ml, "equal": eq,
                "equal_like": eq_like, "save_path": st.gpu, "load_path": lst.gpu if lst else "",
                "direct": st.direct, "backend": st.backend}

    record("torch_save_load", torch_path)
    record("ckptio_staged", lambda: ckptio_path("staged"))
    record("ckptio_gds", lambda: ckptio_path("gds"))
    record("ckptio_host_copy", lambda: ckptio_path("off"))
    gds = res.get("ckptio_gds", {})
    if isinstance(gds, dict) and "save_path" in gds and not gds["save_path"].startswith("gds"):
        res["gds_not_used_because"] = gds["save_path"]
    os.environ.pop("CKPTIO_GPU", None)

    def async_path() -> dict[str, Any]:
        d = os.path.join(args.dir, "ck-async")
        w = state["f32.0"]
        before = w.clone()
        h = ckptio.save_async({"w": w}, d, overwrite=True)
        w.add_(1)  # after the call: must not reach the checkpoint
        h.wait()
        eq = torch.equal(ckptio.load(d)["w"], before.cpu())
        w.sub_(1)
        shutil.rmtree(d)
        return {"snapshot_equal": eq}

    record("ckptio_async", async_path)

    def raw() -> dict[str, Any]:
        size = f"{max(total >> 20, 64)}M"
        r = subprocess.run([args.ckptio, "bench", "--raw-only", "--dir", args.dir, "--size",
                            size, "--runs", "1", "--json"], capture_output=True, text=True,
                           timeout=300)
        if r.returncode:
            raise RuntimeError(r.stderr.strip()[-500:])
        return json.loads(r.stdout)

    record("raw_odirect", raw)

    def other_frameworks() -> dict[str, Any]:
        out: dict[str, Any] = {}
        try:
            import jax
            import numpy as np

            gpus = [d for d in jax.devices() if d.platform in ("gpu", "cuda")]
            if gpus:
                x = jax.device_put(np.arange(1 << 22, dtype=np.float32), gpus[0])
                d = os.path.join(args.dir, "ck-jax")
                st = ckptio.save({"x": x}, d, overwrite=True)
                y = ckptio.load(d)["x"]
                out["jax"] = {"path": st.gpu, "equal": bool(np.array_equal(np.asarray(y),
                                                                             np.asarray(x)))}
                shutil.rmtree(d)
            else:
                out["jax"] = "no JAX GPU device"
        except ImportError:
            out["jax"] = "not installed"
        try:
            import cupy

            x = cupy.arange(1 << 22, dtype=cupy.float64)
            d = os.path.join(args.dir, "ck-cupy")
            st = ckptio.save({"x": x}, d, overwrite=True)
            y = ckptio.load(d)["x"]
            out["cupy"] = {"path": st.gpu, "equal": bool((cupy.asarray(y) == x).all())}
            shutil.rmtree(d)
        except ImportError:
            out["cupy"] = "not installed"
        return out

    record("frameworks", other_frameworks)
    eqs = [v.get(k) for v in res.values() if isinstance(v, dict)
           for k in ("equal", "equal_like", "snapshot_equal") if k in v]
    res["all_equal"] = bool(eqs) and all(eqs)
    json.dump(res, open(args.out, "w"), indent=1)
    print(json.dumps(res, indent=1))
    return 1 if failed or not res["all_equal"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
