# SPDX-License-Identifier: Apache-2.0
"""The training-loop cell: how long a loop that checkpoints every few steps is blocked per
checkpoint, and the peak extra host memory, for ckptio.save, ckptio.save_async (default cap
and a quarter-of-the-state cap), torch DCP's async_save and Orbax's async checkpointer.

The checkpointed tree is save_model's state (bench/mechanisms.py; 1.3B bf16 parameters by
default). A full forward/backward/AdamW step of that model takes minutes on a small CPU-only
machine, so the loop's step is lighter but touches every tensor in place, as an optimizer
step does: torch._foreach_mul_/add_ on the torch state, a jitted update that donates its
input on the JAX copy (Orbax). Each mechanism runs in its own process, so peak RSS (sampled
from /proc/self/statm every millisecond) is its own; "extra" is the peak over the RSS after
the state is built and one step has run. The stall of a checkpoint is the time the loop
spends in the save call, plus any wait for the previous save to finish before the next one.

    python bench/train_loop.py [--model 1.3b] [--steps 10] [--every 3] [--rounds 1] [--out FILE]

With --rounds R the mechanisms run R times, interleaved (round 1: every mechanism, round 2:
every mechanism...), so that a shared machine's load changes hit them alike; each row is the
medians over the rounds, with every round's row kept under "rounds". The first stall of each
process is reported apart too ("first_stall_s"): a save_async then allocates its buffers.
Steps are split into those that follow a checkpoint (they overlap its background write) and
the others.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MECHS = ["ckptio.save", "ckptio.save_async", "ckptio.save_async cap=1/4", "dcp.async_save", "orbax.async"]


class Peak:
    """Samples this process's RSS in a thread; ``extra()`` is the peak over the baseline."""

    def __init__(self) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.base = self.rss()
        self.peak = self.base
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _run(self) -> None:
        while not self.stop.wait(0.001):
            self.peak = max(self.peak, self.rss())

    def extra(self) -> int:
        self.stop.set()
        self.t.join()
        return self.peak - self.base


def one(mech: str, model: str, steps: int, every: int, d: str) -> dict[str, Any]:
    """Run the loop for one mechanism (in this process)."""
    sys.path.insert(0, HERE)
    import mechanisms as M
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1)))
    st = M.model_state(M.MODELS[model], False)
    nbytes = M.state_bytes(st)
    tensors = list(st.values())
    is_jax = mech == "orbax.async"
    if is_jax:
        import jax

        jst = M.to_jax(st)
        del st, tensors
        step_fn = jax.jit(lambda t: jax.tree.map(lambda x: x * 0.999, t), donate_argnums=0)

        def train_step() -> None:
            nonlocal jst
            jst = step_fn(jst)
            jax.block_until_ready(jst)
    else:

        def train_step() -> None:
            with torch.no_grad():
                torch._foreach_mul_(tensors, 0.999)

    pending: list[Any] = [None]
    kept: list[str] = []
    cap = nbytes // 4

    def tidy(path: str) -> None:
        kept.append(path)
        while len(kept) > 2:  # the previous checkpoint is complete by now: drop older ones
            shutil.rmtree(kept.pop(0), ignore_errors=True)

    if mech.startswith("ckptio"):
        import ckptio

        def checkpoint(path: str) -> None:
            if mech == "ckptio.save":
                ckptio.save(st, path)
            else:
                if pending[0] is not None:
                    pending[0].wait()
                pending[0] = ckptio.save_async(
                    st, path, max_host_bytes=cap if "cap" in mech else None
                )

        def finish() -> None:
            if pending[0] is not None:
                pending[0].wait()
    elif mech == "dcp.async_save":
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)

        def checkpoint(path: str) -> None:
            if pending[0] is not None:
                pending[0].result()
            r = dcp.async_save(st, checkpoint_id=path)
            pending[0] = getattr(r, "upload_completion", r)

        def finish() -> None:
            if pending[0] is not None:
                pending[0].result()
    else:
        import orbax.checkpoint as ocp

        ckptr = ocp.StandardCheckpointer()

        def checkpoint(path: str) -> None:
            ckptr.save(path, jst)  # waits for the previous save itself

        def finish() -> None:
            ckptr.wait_until_finished()

    train_step()  # warm: compile, first touch
    peak = Peak()
    stalls: list[float] = []
    step_s: list[float] = []
    after_ckpt: list[float] = []  # the step right after a checkpoint
    t_loop = time.perf_counter()
    for i in range(1, steps + 1):
        t0 = time.perf_counter()
        train_step()
        step_s.append(time.perf_counter() - t0)
        if i > every and (i - 1) % every == 0:
            after_ckpt.append(step_s[-1])
        if i % every == 0:
            path = os.path.join(d, f"{mech.replace(' ', '_').replace('/', '_')}-{i}")
            t0 = time.perf_counter()
            checkpoint(path)
            stalls.append(time.perf_counter() - t0)
            tidy(path)
    t0 = time.perf_counter()
    finish()
    tail = time.perf_counter() - t0
    loop_s = time.perf_counter() - t_loop
    extra = peak.extra()
    for p in kept:
        shutil.rmtree(p, ignore_errors=True)
    if mech == "dcp.async_save":
        import torch.distributed as dist

        dist.destroy_process_group()
    return {
        "mechanism": mech, "state_bytes": nbytes, "checkpoints": len(stalls),
        "stall_s": [round(x, 4) for x in stalls], "stall_median_s": round(statistics.median(stalls), 4),
        "first_stall_s": round(stalls[0], 4),
        "later_stall_median_s": round(statistics.median(stalls[1:]), 4) if len(stalls) > 1 else None,
        "step_median_s": round(statistics.median(step_s), 4),
        "step_after_checkpoint_median_s": round(statistics.median(after_ckpt), 4) if after_ckpt else None,
        "step_other_median_s": round(statistics.median([x for x in step_s if x not in after_ckpt]), 4),
        "final_wait_s": round(tail, 4),
        "loop_s": round(loop_s, 3), "peak_extra_bytes": extra,
        "max_host_bytes": cap if "cap" in mech else _default_cap() if mech == "ckptio.save_async" else None,
    }  # fmt: skip


def _default_cap() -> int:
    from ckptio._async import default_max_host_bytes

    return default_max_host_bytes()


def run(model: str, steps: int, every: int, d: str, mechs: list[str], quiet: bool = False,
        rounds: int = 1) -> list[dict[str, Any]]:
    """Each mechanism in a fresh process, ``rounds`` times interleaved; returns their rows
    (medians over the rounds)."""
    os.makedirs(d, exist_ok=True)
    per: dict[str, list[dict[str, Any]]] = {m: [] for m in mechs}
    for r in range(rounds):
        for m in mechs:
            if not quiet:
                print(f"train loop: round {r + 1}/{rounds}: {m}...", file=sys.stderr, flush=True)
            cmd = [sys.executable, os.path.abspath(__file__), "--one", m, "--model", model,
                   "--steps", str(steps), "--every", str(every), "--dir", d]  # fmt: skip
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                per[m].append({"mechanism": m, "error": res.stderr.strip().splitlines()[-1:] or ["?"]})
                continue
            per[m].append(json.loads(res.stdout.strip().splitlines()[-1]))
    return [_merge(m, per[m]) if rounds > 1 else per[m][0] for m in mechs]


def _merge(m: str, rs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from a mechanism's rounds: medians of the numbers, all stalls, every round."""
    ok = [r for r in rs if "error" not in r]
    if not ok:
        return rs[0]
    out: dict[str, Any] = {"mechanism": m, "rounds_ok": len(ok), "rounds_failed": len(rs) - len(ok)}
    for k, v in ok[0].items():
        vals = [r[k] for r in ok if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)]
        if k == "stall_s":
            out[k] = [x for r in ok for x in r[k]]
        elif len(vals) == len(ok) and k not in ("state_bytes", "checkpoints", "max_host_bytes"):
            out[k] = round(statistics.median(vals), 4)
        else:
            out[k] = v
    out["stall_median_s"] = round(statistics.median(out["stall_s"]), 4)
    out["rounds"] = rs
    return out


def summarize(rows: list[dict[str, Any]]) -> list[str]:
    by = {r["mechanism"]: r for r in rows if "error" not in r}
    lines = [f"{'mechanism':28} {'stall (median)':>15} {'first':>8} {'peak extra':>12} {'step/after ckpt':>16}  stalls"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['mechanism']:28} failed: {r['error']}")
            continue
        sa = r.get("step_after_checkpoint_median_s")
        lines.append(f"{r['mechanism']:28} {r['stall_median_s']:>13.3f} s {r['first_stall_s']:>6.2f} s "
                     f"{r['peak_extra_bytes'] / 2**20:>8.0f} MiB {r['step_other_median_s']:>6.2f}/{sa if sa is not None else float('nan'):.2f} s  {r['stall_s']}")
    blocking = by.get("ckptio.save")
    a = by.get("ckptio.save_async")
    dcp = by.get("dcp.async_save")
    if a and blocking:
        lines.append(f"ckptio async / blocking stall: {a['stall_median_s'] / blocking['stall_median_s']:.2f}x (target <= 0.3x)")
    c = by.get("ckptio.save_async cap=1/4")
    if c and blocking and a:
        # What the cap cannot absorb, written during the call, plus the copy of what it can.
        frac = 1 - c["max_host_bytes"] / c["state_bytes"]
        want = blocking["stall_median_s"] * frac + a["stall_median_s"] * (1 - frac)
        lines.append(f"ckptio async cap=1/4 stall: {c['stall_median_s']:.3f} s; blocking x {frac:.2f} + "
                     f"copy of the rest = {want:.3f} s ({c['stall_median_s'] / blocking['stall_median_s']:.2f}x blocking)")
    if a and dcp:
        lines.append(f"ckptio async / DCP async_save stall: {a['stall_median_s'] / dcp['stall_median_s']:.2f}x (target <= 0.5x)")
    return lines


def _meminfo() -> dict[str, int]:
    """The host's memory and page cache (kB), as /proc/meminfo says: the cache state a run saw."""
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, v = line.split(":", 1)
                if k in ("MemTotal", "MemAvailable", "Cached", "Dirty", "Writeback", "AnonHugePages"):
                    out[k] = int(v.split()[0])
    except OSError:
        pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="1.3b")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--dir", default=os.path.join(ROOT, "bench-data", "train-loop"))
    ap.add_argument("--mechanisms", default=",".join(MECHS))
    ap.add_argument("--rounds", type=int, default=1, help="run the mechanisms this many times, interleaved")
    ap.add_argument("--out", default="", help="write the rows as JSON here")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.model, a.steps, a.every, a.dir)))
        return
    t0 = time.time()
    mem0 = _meminfo()
    load0 = os.getloadavg()
    rows = run(a.model, a.steps, a.every, a.dir, [m for m in a.mechanisms.split(",") if m], rounds=a.rounds)
    shutil.rmtree(a.dir, ignore_errors=True)
    print("\n".join(summarize(rows)))
    if a.out:
        doc = {"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "model": a.model, "steps": a.steps,
               "every": a.every, "rounds": a.rounds, "load_before": load0,
               "meminfo_kb_before": mem0, "meminfo_kb_after": _meminfo(), "load_after": os.getloadavg(), "dir": os.path.abspath(a.dir), "cpus": os.cpu_count(),
               "seconds": round(time.time() - t0, 1), "rows": rows}  # fmt: skip
        with open(a.out, "w") as f:
            f.write(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
