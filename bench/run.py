# SPDX-License-Identifier: Apache-2.0
"""`make bench`: ckptio's saves and loads side by side with torch.save, np.save, safetensors and Orbax, as fractions of the raw device bandwidth measured in the same run."""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import mechanisms as M  # noqa: E402
from common import ROOT, human, machine, make_resident, med, parse_size, raw_measure, version, write_results  # noqa: E402


class Progress:
    """tqdm on a TTY (unless --quiet); silent otherwise (CI, pipes)."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.bar: Any = None
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="step", leave=False, dynamic_ncols=True)

    def step(self, what: str) -> None:
        if self.bar is not None:
            self.bar.set_description(what[:60])

    def done(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_benchmark(
    name: str, ctx: M.Ctx, mechs: list[str], args: argparse.Namespace, raw: dict[str, list[float]],
    prog: Progress,
) -> dict[tuple[str, str, bool], list[float]]:  # fmt: skip
    """``args.runs`` rounds; each: one raw measurement, then every mechanism (order rotated per
    round, so each sees the same disk weather) saves, and each of its loads reads back cold."""
    nbytes = M.state_bytes(ctx.state)
    res: dict[tuple[str, str, bool], list[float]] = {}
    base = os.path.join(args.dir, "data")
    for r in range(args.runs):
        prog.step(f"{name} run {r + 1}: raw")
        w, rd, info = raw_measure(args.dir, args.raw_size)
        raw["write"].append(w)
        raw["read"].append(rd)
        raw["engine"] = [info.get("raw_engine", "")]  # type: ignore[list-item]
        prog.done()
        order = mechs[r % len(mechs) :] + mechs[: r % len(mechs)]
        for mn in order:
            m = M.MECHANISMS[mn]
            path = base + (".file" if m.target == "file" else "")
            M.remove(path)
            prog.step(f"{name} run {r + 1}: {M.SAVE_NAMES[mn]}")
            if m.save_nofsync is not None:
                t0 = time.perf_counter()
                m.save_nofsync(ctx, path)
                nofsync = time.perf_counter() - t0
                M.make_durable(path)
                M.remove(path)
                M.make_durable(args.dir)
            t0 = time.perf_counter()
            m.save(ctx, path)
            t1 = time.perf_counter()
            M.make_durable(path)
            t2 = time.perf_counter()
            if m.save_nofsync is None:
                nofsync = t1 - t0
            res.setdefault((mn, "save", True), []).append(nbytes / (t2 - t0) / 1e9)
            res.setdefault((mn, "save", False), []).append(nbytes / nofsync / 1e9)
            prog.done()
            for ln, load in m.loads.items():
                prog.step(f"{name} run {r + 1}: {ln}")
                M.evict(path)
                if hasattr(load, "prepare"):
                    load.prepare(ctx)  # untimed: e.g. the memory load(into=) fills
                res.setdefault((ln, "load", True), []).append(timed_load(ctx, path, ln, load, nbytes, args))
                prog.done()
                if ln in WARM_LOADS and not args.no_warm:
                    make_resident(path)
                    res.setdefault((ln, "warm", True), []).append(timed_load(ctx, path, ln, load, nbytes, args))
            M.remove(path)
    return res


# Loads also timed warm: the files resident in the page cache (read once through it), as after
# torch.save or a copy; every page touched, as for the cold loads.
WARM_LOADS = ("torch.load", "torch.load(mmap)", "safetensors.load_file", "ckptio.load", "ckptio.load(mmap)")


def timed_load(ctx: M.Ctx, path: str, ln: str, load: Any, nbytes: int, args: argparse.Namespace) -> float:
    """GB/s of one load, from the call until every page (or byte) of what it returned was read."""
    gc.collect()
    t0 = time.perf_counter()
    out = load(ctx, path)
    seen = M.touch(out, args.touch == "bytes")
    t1 = time.perf_counter()
    if seen < nbytes:
        raise SystemExit(f"bench: {ln} returned {seen} bytes of {nbytes}")
    del out
    gc.collect()
    return nbytes / (t1 - t0) / 1e9


def build_rows(name: str, nbytes: int, res: dict[tuple[str, str, bool], list[float]]) -> list[dict[str, Any]]:
    rows = []
    for (mech, op, durable), xs in res.items():
        label = M.SAVE_NAMES.get(mech, mech) if op == "save" else mech
        rows.append({
            "benchmark": name, "mechanism": label, "op": op, "durable": durable, "cold": op == "load",
            "bytes": nbytes, "gbps": round(med(xs), 4), "gbps_min": round(min(xs), 4),
            "gbps_max": round(max(xs), 4), "runs": [round(x, 4) for x in xs],
        })  # fmt: skip
    return rows


def print_table(rows: list[dict[str, Any]], raw_w: float, raw_r: float) -> None:
    print(f"\nraw device: write {raw_w:.2f} GB/s, read {raw_r:.2f} GB/s (medians)")
    print("saves: durable (fsync of files and directories) | without fsync; loads: cold cache, every page touched")
    print("warm: the same load with its files resident in the page cache (of raw: x the raw device read)\n")
    hdr = f"{'benchmark':22s} {'mechanism':27s} {'op':4s} {'GB/s':>6s} {'min - max':>13s} {'x torch':>8s} {'of raw':>7s}   {'no fsync':>8s}"
    print(hdr)
    print("-" * len(hdr))
    for b in dict.fromkeys(r["benchmark"] for r in rows):
        brows = [r for r in rows if r["benchmark"] == b]
        ref = {
            "save": next((r["gbps"] for r in brows if r["mechanism"] == "torch.save" and r["durable"]), 0),
            "load": next((r["gbps"] for r in brows if r["mechanism"] == "torch.load" and r["op"] == "load"), 0),
            "warm": next((r["gbps"] for r in brows if r["mechanism"] == "torch.load" and r["op"] == "warm"), 0),
        }
        for r in brows:
            if r["op"] == "save" and not r["durable"]:
                continue
            nof = ""
            if r["op"] == "save":
                nf = next(x for x in brows if x["mechanism"] == r["mechanism"] and x["op"] == "save" and not x["durable"])
                nof = f"{nf['gbps']:8.2f}"
            raw = raw_w if r["op"] == "save" else raw_r
            x = r["gbps"] / ref[r["op"]] if ref[r["op"]] else 0
            mm = f"{r['gbps_min']:.2f} - {r['gbps_max']:.2f}"
            print(f"{b:22s} {r['mechanism']:27s} {r['op']:4s} {r['gbps']:6.2f} {mm:>13s} "
                  f"{x:7.2f}x {r['gbps'] / raw if raw else 0:7.2f}   {nof}")  # fmt: skip
        for op, (a, b) in dropin_ratios(brows).items():
            print(f"{'':22s} drop-in: ckptio.torch.{op} = {a / b if b else 0:.2f}x ckptio.{op} ({a:.2f} / {b:.2f} GB/s)")
        print()


def dropin_ratios(brows: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """The torch.save/torch.load drop-ins against ckptio's own save and load (durable saves,
    cold loads) of one benchmark: {op: (drop-in GB/s, ckptio GB/s)}, where both ran."""
    out = {}
    for op, mine, own in (("save", "ckptio.torch.save", "ckptio.save"), ("load", "ckptio.torch.load", "ckptio.load")):
        a = next((r["gbps"] for r in brows if r["mechanism"] == mine and r["op"] == op and r["durable"]), None)
        b = next((r["gbps"] for r in brows if r["mechanism"] == own and r["op"] == op and r["durable"]), None)
        if a is not None and b is not None:
            out[op] = (a, b)
    return out


def plot(rows: list[dict[str, Any]], raw_w: float, raw_r: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("save", True, "save (durable)", raw_w), ("save", False, "save (no fsync)", raw_w), ("load", True, "load (cold)", raw_r)]
    benches = list(dict.fromkeys(r["benchmark"] for r in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, (op, durable, title, raw) in zip(axes[0], panels):
        sel = [r for r in rows if r["op"] == op and r["durable"] == durable]
        mechs = list(dict.fromkeys(r["mechanism"] for r in sel))
        w = 0.8 / max(1, len(mechs))
        for i, m in enumerate(mechs):
            ys, lo, hi = [], [], []
            for b in benches:
                r = next((r for r in sel if r["benchmark"] == b and r["mechanism"] == m), None)
                ys.append(r["gbps"] if r else 0)
                lo.append(r["gbps"] - r["gbps_min"] if r else 0)
                hi.append(r["gbps_max"] - r["gbps"] if r else 0)
            xs = [j + i * w for j in range(len(benches))]
            ax.bar(xs, ys, w, yerr=[lo, hi], label=m, capsize=2)
        ax.axhline(raw, color="k", linestyle="--", linewidth=1, label="raw device")
        ax.set_xticks([j + 0.4 - w / 2 for j in range(len(benches))], benches, fontsize=8)
        ax.set_title(title)
        ax.set_ylabel("GB/s (median, min-max)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default=os.path.join(ROOT, "bench-data"), help="bench directory (removed afterwards)")
    ap.add_argument("--tensor-sizes", default="256M,1G", help="save_tensor sizes, comma-separated ('' for none; the issue's full set: 256M,1G,4G)")
    ap.add_argument("--model", default="1.3b", choices=[*M.MODELS, "none"], help="save_model config")
    ap.add_argument("--optimizer", action="store_true", help="save_model with AdamW fp32 moments too")
    ap.add_argument("--mechanisms", default=",".join(M.MECHANISMS), help=f"subset of {','.join(M.MECHANISMS)}")
    ap.add_argument("--runs", type=int, default=3, help="runs per cell")
    ap.add_argument("--model-runs", type=int, default=2, help="runs of the save_model cells (2 by default to keep `make bench` near 5 minutes; 3+ for the full method)")
    ap.add_argument("--raw-size", type=parse_size, default=parse_size("1G"), help="file size of each raw device measurement")
    ap.add_argument("--touch", choices=["pages", "bytes"], default="pages", help="touch one byte of every page (default) or every byte of what loads return")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="where latest.json/png go ('' for nowhere)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--no-warm", action="store_true", help="skip the warm loads (files resident in the page cache)")
    ap.add_argument("--train-loop", action="store_true", help="also the training-loop cell (bench/train_loop.py: checkpoint stalls of save_async, DCP async_save, Orbax async; a few minutes)")
    ap.add_argument("--multirank", action="store_true", help="also the multi-rank cell (bench/multirank.py: 4 local ranks save and cold-load 1 GiB, replicated and Shard(0), ckptio next to torch DCP; a few minutes)")
    ap.add_argument("--safetensors", action="store_true", help="also the safetensors cell (bench/safetensors_cell.py: ckptio.safetensors save_file/load_file next to stock safetensors and the raw device on the --model state, 1.3b with --model none; --runs rounds, about a minute each). Only this cell: --tensor-sizes '' --model none --mechanisms '' --safetensors --no-compress")
    ap.add_argument("--s3", action=argparse.BooleanOptionalAction, default=True, help="the object-storage cell (bench/s3_cell.py), on by default: a SeaweedFS server on 127.0.0.1 started for it; the 1 GiB float32 tensor and the --model state (1.3b with --model none) saved and loaded by boto3's TransferManager, s3torchconnector and ckptio, each in a fresh process: wall, client CPU-s per GB, peak extra memory; --runs rounds (about 10 minutes on 2 cores, where the server is the bottleneck). Only this cell: --tensor-sizes '' --model none --mechanisms '' --no-compress")
    ap.add_argument("--fastpersist", action=argparse.BooleanOptionalAction, default=True, help="the FastPersist cell (bench/fastpersist_cell.py), on by default: a 1 GiB tensor and a 0.37B Phi-3 model saved durably by torch.save, DeepSpeed's FastFileWriter (zip and legacy), ckptio.torch.save and ckptio.save, then the model through DeepSpeed's engine (default writer, fast writer, ckptio.deepspeed); --runs rounds (about 2-3 minutes once DeepSpeed's ops are built). --fastpersist-model phi3-mini for FastPersist's 3.8B model")
    ap.add_argument("--tier", action=argparse.BooleanOptionalAction, default=True, help="the peer-tier cell (bench/tier_cell.py), on by default: 4 gloo ranks as 2 simulated nodes save 1 GiB of float32 through Manager(local=/dev/shm/..., replicas=1, persist_every=1) with the persistent tier under --dir; the save stall next to save_async's, the replication rate, and a lost node's restore from its peer against every rank's from the persistent tier (page cache dropped), with the breakdown; --runs rounds (about a minute each)")
    ap.add_argument("--fastpersist-model", default="phi3-0.4b", help="the FastPersist cell's Hugging Face model (phi3-0.4b, phi3-mini)")
    ap.add_argument("--gcs", action=argparse.BooleanOptionalAction, default=True, help="the Google Cloud Storage cell (bench/s3_cell.py --store gcs), on by default: a fake-gcs-server on 127.0.0.1 started for it; the 1 GiB float32 tensor saved and loaded by google-cloud-storage and ckptio (gs://), each in a fresh process: wall, client CPU-s per GB, peak extra memory; --runs rounds (a few minutes)")
    ap.add_argument("--s3-ranks", action="store_true", help="also the four-rank object-storage cell (bench/s3_ranks.py: a Shard(0) state saved and loaded by 4 gloo ranks through SeaweedFS, ckptio(comm=) next to DCP with s3torchconnector; a few minutes)")
    ap.add_argument("--compress", action=argparse.BooleanOptionalAction, default=True, help="the compression cell (bench/compress_cell.py), on by default: about 2 minutes once its trained states are cached, and the first run trains them (a few minutes more). Ratio and one-thread speed of ZipNN, zstd -1/-3 with and without byte grouping and ckptio's codec against the exponent-entropy bound, on a small trained model's training state and the --model state (1.3b with --model none), then ckptio.save(compress=) next to the raw device. Only this cell: --tensor-sizes '' --model none --mechanisms ''")
    a = ap.parse_args()
    mechs = [m for m in a.mechanisms.split(",") if m]
    for m in mechs:
        if m not in M.MECHANISMS:
            ap.error(f"unknown mechanism {m!r}; known: {', '.join(M.MECHANISMS)}")
    made = not os.path.exists(a.dir)
    os.makedirs(a.dir, exist_ok=True)

    plan: list[tuple[str, Any, int]] = []
    for s in filter(None, a.tensor_sizes.split(",")):
        plan.append((f"save_tensor {human(parse_size(s))}", lambda n=parse_size(s): M.tensor_state(n), a.runs))
    if a.model != "none":
        c = M.MODELS[a.model]
        plan.append((f"save_model {a.model}" + ("+adamw" if a.optimizer else ""), lambda: M.model_state(c, a.optimizer), a.model_runs))

    steps = sum(p[2] for p in plan) * (1 + sum(1 + len(M.MECHANISMS[m].loads) for m in mechs))
    prog = Progress(steps, a.quiet)
    raw: dict[str, list[float]] = {"write": [], "read": []}
    rows: list[dict[str, Any]] = []
    t_start = time.time()
    try:
        # Warm-up, untimed: imports, Orbax's checkpointer and JAX's first dispatch.
        prog.step("warming up")
        if mechs:
            warm = M.Ctx(M.tensor_state(1 << 20))
            warm_res = run_benchmark("warm-up", warm, mechs, argparse.Namespace(**{**vars(a), "runs": 1, "raw_size": 16 << 20}), {"write": [], "read": []}, Progress(0, True))
            del warm, warm_res
        for name, build, runs in plan:
            prog.step(f"{name}: building the state")
            ctx = M.Ctx(build())
            nbytes = M.state_bytes(ctx.state)
            res = run_benchmark(name, ctx, mechs, argparse.Namespace(**{**vars(a), "runs": runs}), raw, prog)
            rows += build_rows(name, nbytes, res)
            del ctx
            gc.collect()
    finally:
        prog.close()
        if made:
            shutil.rmtree(a.dir, ignore_errors=True)
        else:
            M.remove(os.path.join(a.dir, "data"))
            M.remove(os.path.join(a.dir, "data.file"))
    raw_w, raw_r = med(raw["write"]), med(raw["read"])
    if rows:
        print_table(rows, raw_w, raw_r)
    loop_rows: list[dict[str, Any]] = []
    if a.train_loop:
        import train_loop

        loop_rows = train_loop.run(a.model if a.model != "none" else "1.3b", 10, 3, os.path.join(a.dir, "train-loop"), train_loop.MECHS, a.quiet)
        shutil.rmtree(os.path.join(a.dir, "train-loop"), ignore_errors=True)
        print("\n".join(train_loop.summarize(loop_rows)))
    if a.multirank:
        import multirank

        mr = multirank.defaults(dir=os.path.join(a.dir, "multirank"), quiet=a.quiet)
        multirank.write(multirank.run(mr), a.out)
        shutil.rmtree(mr.dir, ignore_errors=True)
    if a.safetensors:
        import safetensors_cell

        sa = safetensors_cell.parser().parse_args([])
        sa.dir, sa.runs, sa.raw_size, sa.quiet = os.path.join(a.dir, "safetensors"), a.runs, a.raw_size, a.quiet
        sa.model = a.model if a.model != "none" else "1.3b"
        try:
            st_doc = safetensors_cell.run(sa)
        finally:
            shutil.rmtree(sa.dir, ignore_errors=True)
        print(safetensors_cell.summarize(st_doc))
        safetensors_cell.write(st_doc, a.out)
    if a.compress:
        import compress_cell

        c_args = ["--dir", os.path.join(a.dir, "compress"), "--raw-size", str(a.raw_size), "--out", a.out,
                  "--model", a.model if a.model != "none" else "1.3b"] + (["--quiet"] if a.quiet else [])  # fmt: skip
        c_doc = compress_cell.run(compress_cell.parser().parse_args(c_args))
        print(compress_cell.summarize(c_doc))
        compress_cell.write(c_doc, a.out)
    if a.fastpersist:
        import fastpersist_cell

        fp_out = os.path.join(a.out, "fastpersist-" + time.strftime("%Y%m%d")) if a.out else ""
        fp_args = ["--dir", os.path.join(a.dir, "fastpersist"), "--runs", str(a.runs), "--raw-size", str(a.raw_size),
                   "--model", a.fastpersist_model, "--out", fp_out] + (["--quiet"] if a.quiet else [])  # fmt: skip
        fp_doc = fastpersist_cell.run(fastpersist_cell.parser().parse_args(fp_args))
        print(fastpersist_cell.summarize(fp_doc))
        fastpersist_cell.write(fp_doc, fp_out)
    if a.tier:
        import tier_cell

        t_out = os.path.join(a.out, "tier-" + time.strftime("%Y%m%d")) if a.out else ""
        t_args = ["--dir", os.path.join(a.dir, "tier"), "--rounds", str(a.runs), "--raw-size", str(a.raw_size),
                  "--out", t_out] + (["--quiet"] if a.quiet else [])  # fmt: skip
        t_doc = tier_cell.run(tier_cell.parser().parse_args(t_args))
        print(tier_cell.summarize(t_doc))
        tier_cell.write(t_doc, t_out)
    if a.s3:
        import s3_cell

        s3_args = ["--dir", os.path.join(a.dir, "s3"), "--out", a.out, "--runs", str(a.runs),
                   "--state", a.model if a.model != "none" else "1.3b"] + (["--quiet"] if a.quiet else [])  # fmt: skip
        s3_doc = s3_cell.run(s3_cell.parser().parse_args(s3_args))
        print(s3_cell.summarize(s3_doc))
        s3_cell.write(s3_doc, a.out)
    if a.gcs:
        import s3_cell

        g_args = ["--store", "gcs", "--dir", os.path.join(a.dir, "gcs"), "--out", a.out, "--runs", str(a.runs)]
        g_doc = s3_cell.run(s3_cell.parser().parse_args(g_args + (["--quiet"] if a.quiet else [])))
        print(s3_cell.summarize(g_doc))
        s3_cell.write(g_doc, a.out)
    if a.s3_ranks:
        import s3_ranks

        ra = s3_ranks.parser().parse_args(["--dir", os.path.join(a.dir, "s3-ranks"), "--runs", str(a.runs)]
                                          + (["--quiet"] if a.quiet else []))  # fmt: skip
        ra.size = parse_size(ra.size)
        r_doc = s3_ranks.run(ra)
        print(s3_ranks.table(r_doc))
        if a.out:
            print(f"results: {write_results(r_doc, os.path.join(a.out, 's3ranks'), 's3ranks-')}")
    if made:  # the cells above put their files in folders of their own under it
        shutil.rmtree(a.dir, ignore_errors=True)
    elapsed = time.time() - t_start
    print(f"{a.runs} runs per save_tensor cell, {a.model_runs} per save_model cell, mechanisms interleaved; {elapsed:.0f} s")
    if a.out and (rows or loop_rows):  # a run of only the cells with files of their own writes none
        import torch

        doc = {
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(a.dir),
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         **{p: version(p) for p in ("ckptio", "numpy", "safetensors", "orbax-checkpoint", "jax")}},
            "args": vars(a), "seconds": round(elapsed, 1), "raw_engine": (raw.get("engine") or [""])[0],
            "raw_write_gbps": round(raw_w, 4), "raw_read_gbps": round(raw_r, 4),
            "raw_write_runs": [round(x, 4) for x in raw["write"]], "raw_read_runs": [round(x, 4) for x in raw["read"]],
            "rows": rows, "train_loop": loop_rows,
            "dropin": {b: {op: round(x / y, 4) if y else 0 for op, (x, y) in dropin_ratios([r for r in rows if r["benchmark"] == b]).items()}
                       for b in dict.fromkeys(r["benchmark"] for r in rows)},
        }  # fmt: skip
        for r in rows:
            r["raw_write_gbps"], r["raw_read_gbps"] = doc["raw_write_gbps"], doc["raw_read_gbps"]
        latest = write_results(doc, a.out)
        plot(rows, raw_w, raw_r, os.path.join(a.out, "latest.png"))
        print(f"results: {latest}, latest.png")


if __name__ == "__main__":
    main()
