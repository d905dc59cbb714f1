# SPDX-License-Identifier: Apache-2.0
"""The FastPersist cell of `make bench`: DeepSpeed FastPersist's three micro-benchmarks (a 1 GiB tensor, a Hugging Face model, the same model through DeepSpeed's engine) saved durably by torch.save, FastPersist's writer, the engine's writers and ckptio, next to the raw device write of the same rounds."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import glob
import importlib.util
import os
import platform
import resource
import shlex
import shutil
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# Workaround 3 of 3 for FastPersist on a CPU-only DeepSpeed: the engine's fast writer pins its
# I/O buffer through the accelerator, whose CPU pin_memory is a no-op that then falls back to
# Tensor.pin_memory(), which needs CUDA; the "native" backend pins with DeepSpeed's own
# pin_memory op instead. It must be set before deepspeed is imported.
os.environ.setdefault("DS_PIN_MEMORY_BACKEND", "native")

import torch  # noqa: E402

import mechanisms as M  # noqa: E402
from common import ROOT, human, machine, med, parse_size, raw_measure, reset_peak_rss, status_kib, version, write_results  # noqa: E402

# Phi-3's architecture (fused qkv and gate/up projections, untied output head): the mini model
# of FastPersist's model benchmark, and a 0.37B scaling of it that keeps `make bench` short.
MODELS: dict[str, dict[str, int]] = {
    "phi3-mini": {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064},
    "phi3-0.4b": {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 24,
                  "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 32064},
    "phi3-tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 512},
}  # fmt: skip

FILE_MECHS = ("torch.save", "FastPersist (zip)", "FastPersist (legacy)", "ckptio.torch.save", "ckptio.save")
ENGINE_MECHS = ("engine default writer", "engine fast writer", "engine + ckptio.deepspeed")
HOW = {
    "torch.save": "torch.save(state, path), zip format",
    "FastPersist (zip)": "torch.save(state, FastFileWriter) with _use_new_zipfile_serialization=True; "
                         "O_DIRECT writes through libaio from a double buffer of page-locked memory, then close() (fsync)",
    "FastPersist (legacy)": "the same with _use_new_zipfile_serialization=False (torch's pre-1.6 format)",
    "ckptio.torch.save": "ckptio.torch.save(state, path): a zip file stock torch.load reads",
    "ckptio.save": "ckptio.save(state, path): ckptio's format",
    "engine default writer": "engine.save_checkpoint with no checkpoint writer configured (torch.save)",
    "engine fast writer": "engine.save_checkpoint with checkpoint.writer {type: fast, data_parallel: replica}: "
                          "FastPersist inside the engine (zip serialization, its default)",
    "engine + ckptio.deepspeed": "engine.save_checkpoint after ckptio.deepspeed.install(engine)",
}  # fmt: skip
WORKAROUNDS = [
    "FastFileWriter's pinned buffer comes from the aio handle's new_cpu_locked_tensor: on CPU, "
    "torch's pin_memory() needs CUDA and the accelerator's is a no-op",
    "deepspeed.io.fast_file_writer.UtilsBuilder is pointed at the generic utils op "
    "(deepspeed.ops.op_builder.utils): the CPU accelerator maps UtilsBuilder to a builder that "
    "raises 'not implemented', and FastFileWriter needs its cast_to_byte_tensor",
    "DS_PIN_MEMORY_BACKEND=native, so that the engine's fast writer pins its I/O buffer with "
    "DeepSpeed's pin_memory op",
    "the engine's fast writer only writes with checkpoint.writer.data_parallel set (replica here), "
    "which names the file with a '-0.1' suffix that load_checkpoint does not find: saves only",
]
IO_BUFFER = 64 << 20  # the engine's default io_buffer_size, double-buffered, for both writers


# ------------------------------------------------------------------------------------------------
# States
# ------------------------------------------------------------------------------------------------


def model_config(name: str) -> Any:
    from transformers import Phi3Config

    c = MODELS[name]
    special = min(32000, c["vocab_size"] - 1)  # Phi-3's pad and eos ids, inside a tiny test vocabulary
    return Phi3Config(**c, max_position_embeddings=4096, tie_word_embeddings=False, pad_token_id=special,
                      eos_token_id=special)  # fmt: skip


def hf_model(name: str) -> torch.nn.Module:
    """A Hugging Face Phi-3 model from its config with bf16 weights drawn N(0, 0.02) (bench's
    pool; no download, no init pass: built on the meta device, then given memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config(name)).to(torch.bfloat16)
    model.to_empty(device="cpu")
    pool = M._pool()
    with torch.no_grad():
        for i, t in enumerate(model.state_dict().values()):
            t.copy_(M._filled(tuple(t.shape), pool, i))
    model.requires_grad_(False)
    return model


# ------------------------------------------------------------------------------------------------
# DeepSpeed: the three workarounds and the engines
# ------------------------------------------------------------------------------------------------


def _remove_shm(addr: str, port: str) -> None:
    for f in glob.glob(f"/dev/shm/deepspeed_*_{addr}_{port}_*"):
        with contextlib.suppress(OSError):
            os.unlink(f)


class DeepSpeedSetup:
    """deepspeed imported, its aio handle and FastFileWriter's pinned buffer made once; what each
    step cost, so a cold op build shows in the result file."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        t = time.perf_counter()
        import deepspeed  # noqa: F401
        import deepspeed.io.fast_file_writer as ffw
        from deepspeed.ops.op_builder import AsyncIOBuilder
        from deepspeed.ops.op_builder.utils import UtilsBuilder as GenericUtilsBuilder
        from deepspeed.runtime.swap_tensor import constants as C

        self.seconds["import deepspeed"] = time.perf_counter() - t
        ffw.UtilsBuilder = GenericUtilsBuilder  # workaround 2
        t = time.perf_counter()
        GenericUtilsBuilder().load()
        self.seconds["utils op load"] = time.perf_counter() - t
        t = time.perf_counter()
        self.handle = AsyncIOBuilder().load().aio_handle(
            C.AIO_BLOCK_SIZE_DEFAULT, C.AIO_QUEUE_DEPTH_DEFAULT, C.AIO_SINGLE_SUBMIT_DEFAULT,
            C.AIO_OVERLAP_EVENTS_DEFAULT, C.AIO_INTRA_OP_PARALLELISM_DEFAULT)  # fmt: skip
        self.seconds["async_io op load"] = time.perf_counter() - t
        # Workaround 1: page-locked, page-aligned memory from the aio handle itself.
        self.pinned = self.handle.new_cpu_locked_tensor(IO_BUFFER, torch.empty(0, dtype=torch.uint8))
        self.dist_ready = False

    def writer(self, path: str) -> Any:
        from deepspeed.io import FastFileWriter, FastFileWriterConfig

        return FastFileWriter(file_path=path, config=FastFileWriterConfig(dnvme_handle=self.handle, pinned_tensor=self.pinned))

    def init_dist(self) -> None:
        """A world of one over gloo, with the variables DeepSpeed's data-parallel writer reads."""
        if self.dist_ready:
            return
        import deepspeed

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_SIZE": "1", "CROSS_RANK": "0",
               "CROSS_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        for k, v in env.items():
            os.environ.setdefault(k, v)
        # DeepSpeed's CPU all-reduce leaves a 64 MiB /dev/shm buffer named after the address and
        # port: removed when the cell's process ends, so that runs do not fill the host's RAM.
        atexit.register(_remove_shm, os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])
        t = time.perf_counter()
        deepspeed.init_distributed(dist_backend="gloo")
        self.seconds["init_distributed"] = time.perf_counter() - t
        self.dist_ready = True

    def engine(self, model: torch.nn.Module, writer: str) -> Any:
        import deepspeed

        self.init_dist()
        cfg: dict[str, Any] = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                               "zero_optimization": {"stage": 0}}  # fmt: skip
        if writer == "fast":
            cfg["checkpoint"] = {"writer": {"type": "fast", "data_parallel": "replica", "io_buffer_size": IO_BUFFER,
                                            "io_buffer_double": True}}  # fmt: skip
        t = time.perf_counter()
        engine, *_ = deepspeed.initialize(model=model, config=cfg)
        self.seconds[f"initialize ({writer})"] = time.perf_counter() - t
        if writer == "ckptio":
            import ckptio.deepspeed  # type: ignore[import-not-found,unused-ignore]

            ckptio.deepspeed.install(engine)
        return engine


def ckptio_deepspeed_missing() -> str:
    """Why ckptio's DeepSpeed engine cannot run here, or ""."""
    try:
        found = importlib.util.find_spec("ckptio.deepspeed") is not None
    except ImportError as e:
        return f"not available: {e}"
    return "" if found else "not available: this ckptio has no ckptio.deepspeed"


# ------------------------------------------------------------------------------------------------
# Mechanisms: each writes `state` (or saves an engine) under `path`; the clock adds make_durable
# ------------------------------------------------------------------------------------------------


def file_mechanism(name: str, ds: DeepSpeedSetup | None) -> Callable[[dict[str, torch.Tensor], str], None]:
    if name == "torch.save":
        return lambda st, p: torch.save(st, p)
    if name.startswith("FastPersist"):
        assert ds is not None
        zipfmt = name.endswith("(zip)")

        def fast(st: dict[str, torch.Tensor], p: str) -> None:
            w = ds.writer(p)
            torch.save(st, w, _use_new_zipfile_serialization=zipfmt)
            w.close()  # drains the buffer, fsyncs the file

        return fast
    if name == "ckptio.torch.save":
        import ckptio.torch

        return lambda st, p: ckptio.torch.save(st, p)
    if name == "ckptio.save":
        import ckptio

        return lambda st, p: ckptio.save(st, p, overwrite=True)
    raise ValueError(name)


def measure(save: Callable[[], None], path: str) -> dict[str, float]:
    """One durable save: wall seconds, process CPU seconds (user + system, every thread), and
    the peak resident memory it added over what the process held before."""
    M.remove(path)
    M.make_durable(os.path.dirname(os.path.abspath(path)))
    gc.collect()
    reset = reset_peak_rss()
    base = status_kib("VmRSS")
    c0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    save()
    M.make_durable(path)
    w1, c1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    peak = status_kib("VmHWM")
    return {"wall_s": w1 - w0, "cpu_s": (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime),
            "peak_extra_mib": max(0, peak - base) / 1024 if reset else -1.0}  # fmt: skip


def check_load(state: dict[str, torch.Tensor], path: str) -> None:
    """What a file mechanism wrote reads back equal through stock torch.load (or ckptio.load)."""
    if os.path.isdir(path):
        import ckptio

        got = ckptio.load(path)
    else:
        got = torch.load(path, weights_only=True)
    for k, v in state.items():
        g = got[k]
        if not isinstance(g, torch.Tensor):
            g = torch.as_tensor(g)
        if g.view(torch.uint8).shape != v.view(torch.uint8).shape or not torch.equal(g.view(torch.uint8), v.view(torch.uint8)):
            raise RuntimeError(f"{path}: tensor {k} differs after the save")


# ------------------------------------------------------------------------------------------------
# The cell
# ------------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tensor-size", default="1G", help="bytes of the Tensor benchmark's bf16 tensor ('0': skip it)")
    ap.add_argument("--fastpersist-model", "--model", dest="model", default="phi3-0.4b", choices=[*MODELS, "none"],
                    help="the Model and DeepSpeed benchmarks' Hugging Face model (phi3-mini: FastPersist's 3.8B)")
    ap.add_argument("--runs", type=int, default=3, help="rounds per benchmark (figures are medians)")
    ap.add_argument("--no-deepspeed-engine", action="store_true", help="skip the DeepSpeed engine benchmark")
    ap.add_argument("--raw-size", type=parse_size, default=parse_size("1G"), help="file size of each round's raw device write")
    ap.add_argument("--check", action="store_true", help="after each file save, read it back (untimed) and compare")
    ap.add_argument("--dir", default=os.path.join(ROOT, "bench-data", "fastpersist"), help="bench directory (removed afterwards)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "fastpersist-" + time.strftime("%Y%m%d")),
                    help="where fastpersist-latest.json and a timestamped copy go ('' for nowhere)")  # fmt: skip
    ap.add_argument("--quiet", action="store_true")
    return ap


def _rounds(name: str, nbytes: int, mechs: dict[str, Callable[[str], None]], paths: dict[str, str],
            a: argparse.Namespace, raw: list[float], check: Callable[[str, str], None] | None) -> list[dict[str, Any]]:  # fmt: skip
    """``a.runs`` rounds: the raw device write once, then every mechanism, order rotated."""
    res: dict[str, list[dict[str, float]]] = {m: [] for m in mechs}
    names = list(mechs)
    for r in range(a.runs):
        raw.append(raw_measure(a.dir, a.raw_size)[0])
        for mn in names[r % len(names) :] + names[: r % len(names)]:
            out = measure(lambda mn=mn: mechs[mn](paths[mn]), paths[mn])  # type: ignore[misc]
            res[mn].append(out)
            if check is not None:
                check(mn, paths[mn])
            M.remove(paths[mn])
            if not a.quiet:
                print(f"{name} round {r + 1}: {mn}: {nbytes / out['wall_s'] / 1e9:.2f} GB/s, cpu {out['cpu_s']:.2f} s", flush=True)
    rows = []
    gb = nbytes / 1e9
    for mn, outs in res.items():
        walls = [o["wall_s"] for o in outs]
        rows.append({
            "benchmark": name, "mechanism": mn, "bytes": nbytes, "runs": len(outs),
            "gbps": round(gb / med(walls), 4), "gbps_runs": [round(gb / w, 4) for w in walls],
            "wall_s": round(med(walls), 3), "cpu_s_per_gb": round(med([o["cpu_s"] / gb for o in outs]), 3),
            "peak_extra_mib": round(med([o["peak_extra_mib"] for o in outs]), 1),
        })  # fmt: skip
    return rows


def run(a: argparse.Namespace) -> dict[str, Any]:
    t_start = time.time()
    os.makedirs(a.dir, exist_ok=True)
    ds = DeepSpeedSetup()
    rows: list[dict[str, Any]] = []
    raw: dict[str, list[float]] = {}
    file_mechs = {m: file_mechanism(m, ds) for m in FILE_MECHS}
    # Untimed warm-up: every mechanism once on 1 MiB (first calls load ops and imports).
    warm = M.tensor_state(1 << 20)
    for mn, fn in file_mechs.items():
        p = os.path.join(a.dir, "warm")
        fn(warm, p)
        check_load(warm, p)
        M.remove(p)
    del warm

    def bench_files(name: str, state: dict[str, torch.Tensor]) -> None:
        nbytes = M.state_bytes(state)
        mechs = {m: (lambda p, fn=fn: fn(state, p)) for m, fn in file_mechs.items()}
        paths = {m: os.path.join(a.dir, "ckpt" + ("" if m == "ckptio.save" else ".pt")) for m in file_mechs}
        check = (lambda mn, p: check_load(state, p)) if a.check else None
        raw[name] = []
        rows.extend(_rounds(name, nbytes, mechs, paths, a, raw[name], check))

    size = parse_size(a.tensor_size)
    if size:
        bench_files(f"Tensor {human(size)}", M.tensor_state(size))
        gc.collect()
    model_info: dict[str, Any] = {}
    if a.model != "none":
        t = time.perf_counter()
        model = hf_model(a.model)
        sd = model.state_dict()
        model_info = {"name": a.model, "config": MODELS[a.model], "architecture": "Phi3ForCausalLM",
                      "parameters": sum(t.numel() for t in sd.values()), "tensors": len(sd),
                      "bytes": M.state_bytes(sd), "build_s": round(time.perf_counter() - t, 1)}  # fmt: skip
        mlabel = f"Model {a.model}"
        bench_files(mlabel, dict(sd))
        if not a.no_deepspeed_engine:
            engines: dict[str, Callable[[str], None]] = {}
            errors: dict[str, str] = {}
            for mn, kind in zip(ENGINE_MECHS, ("default", "fast", "ckptio")):
                why = ckptio_deepspeed_missing() if kind == "ckptio" else ""
                if why:
                    errors[mn] = why
                    continue
                eng = ds.engine(model, kind)
                engines[mn] = lambda p, eng=eng: eng.save_checkpoint(p, tag="step")
            dname = f"DeepSpeed {a.model}"
            raw[dname] = []
            paths = {m: os.path.join(a.dir, "ds-" + str(i)) for i, m in enumerate(engines)}
            rows.extend(_rounds(dname, model_info["bytes"], engines, paths, a, raw[dname], None))
            for mn, why in errors.items():
                rows.append({"benchmark": dname, "mechanism": mn, "bytes": model_info["bytes"], "runs": 0, "error": why})
            del engines
        del model, sd
        gc.collect()
    raw_all = [x for xs in raw.values() for x in xs]
    for r in rows:
        rw = med(raw[r["benchmark"]])
        r["raw_write_gbps"] = round(rw, 4)
        if "gbps" in r:
            r["of_raw"] = round(r["gbps"] / rw, 3) if rw else 0.0
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                **{p: version(p) for p in ("ckptio", "deepspeed", "transformers")}}  # fmt: skip
    return {
        "cell": "fastpersist", "command": shlex.join([os.path.basename(sys.executable), *sys.argv]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(a.dir, load_average=os.getloadavg()),
        "versions": versions, "how": HOW, "workarounds": WORKAROUNDS, "durable": "every save is timed until "
        "its files and directories are fsynced (make_durable: each file, each directory, the parent)",
        "setup_seconds": {k: round(v, 2) for k, v in ds.seconds.items()}, "model": model_info,
        "args": vars(a), "seconds": round(time.time() - t_start, 1), "raw_write_gbps": round(med(raw_all), 4),
        "raw_write_runs": {k: [round(x, 4) for x in v] for k, v in raw.items()},
        "rows": rows, "ratios": ratios(rows),
    }  # fmt: skip


# (ckptio's mechanism, the mechanism it is compared with, the target ratio or None: reported)
PAIRS = (
    ("ckptio.torch.save", "FastPersist (zip)", 1.0),
    ("ckptio.save", "FastPersist (legacy)", None),
    ("ckptio.save", "FastPersist (zip)", None),
    ("ckptio.torch.save", "torch.save", None),
    ("engine + ckptio.deepspeed", "engine fast writer", 1.0),
    ("engine + ckptio.deepspeed", "engine default writer", None),
)
RAW_TARGET = 0.9


def ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """ckptio against FastPersist like with like (zip with zip; ckptio.save against the legacy
    format too), and ckptio's mechanisms as a fraction of the raw device write."""
    by = {(r["benchmark"], r["mechanism"]): r for r in rows if "gbps" in r}
    out: dict[str, Any] = {}
    for b in dict.fromkeys(r["benchmark"] for r in rows):
        for mine, other, target in PAIRS:
            x, y = by.get((b, mine)), by.get((b, other))
            if x and y:
                v = round(x["gbps"] / y["gbps"], 3)
                out[f"{b}: {mine} / {other}"] = {"value": v, **({"target": target, "met": v >= target} if target else {})}
        for (bb, m), r in by.items():
            if bb == b and m.startswith(("ckptio", "engine + ckptio")):
                out[f"{b}: {m} of raw write"] = {"value": r["of_raw"], "target": RAW_TARGET, "met": r["of_raw"] >= RAW_TARGET}
    return out


def summarize(doc: dict[str, Any]) -> str:
    lines = [f"\nFastPersist cell: durable saves, medians of {doc['args']['runs']}; raw device write "
             f"{doc['raw_write_gbps']:.2f} GB/s (median)",
             f"  {'benchmark':20s} {'mechanism':26s} {'GB/s':>6s} {'of raw':>7s} {'CPU s/GB':>9s} {'+RSS MiB':>9s}"]  # fmt: skip
    for r in doc["rows"]:
        head = f"  {r['benchmark']:20s} {r['mechanism']:26s}"
        if "error" in r:
            lines.append(f"{head} {r['error']}")
        else:
            lines.append(f"{head} {r['gbps']:6.2f} {r['of_raw']:7.2f} {r['cpu_s_per_gb']:9.2f} {r['peak_extra_mib']:9.0f}")
    for k, v in doc["ratios"].items():
        tail = f" (target {v['target']}: {'met' if v['met'] else 'MISSED'})" if "target" in v else ""
        lines.append(f"  {k}: {v['value']}{tail}")
    return "\n".join(lines)


def write(doc: dict[str, Any], out: str) -> None:
    if out:
        print(f"results: {write_results(doc, out, 'fastpersist-')}")


def main() -> None:
    a = parser().parse_args()
    made = not os.path.exists(a.dir)
    try:
        doc = run(a)
    finally:
        if made:
            shutil.rmtree(a.dir, ignore_errors=True)
    print(summarize(doc))
    write(doc, a.out)


if __name__ == "__main__":
    main()
