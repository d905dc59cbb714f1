# SPDX-License-Identifier: Apache-2.0
"""The compression cell of `make bench` (bench/run.py --compress): compression ratio and one-thread speed of ZipNN, zstd (with and without byte grouping) and ckptio's codec against the exponent-field entropy bound, on trained training states and the 1.3B bench state, plus ckptio's durable save and cold load with compression next to the raw device, all in one run."""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import ROOT, machine, med, parse_size, raw_measure, version, write_results  # noqa: E402

# The block every codec here compresses on its own, as ckptio's per-checksum-block codec does.
BLOCK = 1 << 20
# Element width in bytes and the exponent field (shift, bits) of each dtype the cell measures.
WIDTH = {"bf16": 2, "f32": 4}
EXPONENT = {"bf16": (7, 8), "f32": (23, 8)}
UINT = {"bf16": np.uint16, "f32": np.uint32}
CODEC_BENCH = os.path.join(ROOT, "build", "tools", "ckptio-codec-bench")
NOT_IN_BUILD = "not in this build"

# ------------------------------------------------------------------------------------------------
# The pure parts (tests/python/test_bench_compress.py)
# ------------------------------------------------------------------------------------------------


def entropy_bits(values: np.ndarray, symbols: int = 256) -> float:
    """Order-0 entropy, in bits per symbol, of the integers ``values`` (all < ``symbols``)."""
    if values.size == 0:
        return 0.0
    counts = np.bincount(values.reshape(-1), minlength=symbols)
    p = counts[counts > 0] / values.size
    return float(-(p * np.log2(p)).sum())


def exponent_field(bits: np.ndarray, dtype: str) -> np.ndarray:
    """The biased exponent of each element of ``bits`` (the raw uint16/uint32 patterns)."""
    shift, width = EXPONENT[dtype]
    return ((bits >> shift) & ((1 << width) - 1)).astype(np.uint8)


def exponent_entropy(bits: np.ndarray, dtype: str) -> float:
    return entropy_bits(exponent_field(bits, dtype))


def bound_bytes(bits: np.ndarray, dtype: str) -> float:
    """The exponent-field bound: sign and mantissa stored as they are, the exponent coded at
    its order-0 entropy H. bf16: N * (8 + H) / 8 bytes; f32: N * (24 + H) / 8."""
    other = WIDTH[dtype] * 8 - EXPONENT[dtype][1]
    return bits.size * (other + exponent_entropy(bits, dtype)) / 8


def block_bound_bytes(bits: np.ndarray, dtype: str, block: int = BLOCK) -> float:
    """bound_bytes of each ``block`` bytes on their own, added up: what a coder whose
    exponent statistics restart every block (as ckptio's per-block codec) would reach at
    best. Below the whole group's bound where tensors differ in scale."""
    n = block // WIDTH[dtype]
    return sum(bound_bytes(bits[i : i + n], dtype) for i in range(0, bits.size, n))


def plane_bound_bytes(bits: np.ndarray, dtype: str) -> float:
    """Each byte plane coded at its own order-0 entropy: what byte grouping plus an ideal
    order-0 coder per plane would reach (no matching of repeats)."""
    u8 = np.ascontiguousarray(bits).view(np.uint8).reshape(-1, WIDTH[dtype])
    return sum(bits.size * entropy_bits(u8[:, i]) / 8 for i in range(WIDTH[dtype]))


def byte_planes(block: np.ndarray, width: int) -> np.ndarray:
    """The bytes of ``block`` (uint8, a multiple of ``width`` long) grouped by their position in
    each element: row i holds byte i of every element (little-endian: row 0 the lowest)."""
    assert block.dtype == np.uint8 and block.size % width == 0
    return np.ascontiguousarray(block.reshape(-1, width).T)


def interleave(planes: list[np.ndarray], out: np.ndarray) -> None:
    """The inverse of byte_planes: write ``planes`` back into ``out`` (uint8) element by element."""
    view = out.reshape(-1, len(planes))
    for i, p in enumerate(planes):
        view[:, i] = p


def xor_delta(new: np.ndarray, old: np.ndarray) -> np.ndarray:
    """The bitwise XOR of two arrays of raw bit patterns of the same shape (new ^ old restores
    either from the other)."""
    assert new.shape == old.shape and new.dtype == old.dtype
    return np.bitwise_xor(new, old)


# ------------------------------------------------------------------------------------------------
# Groups: what is measured
# ------------------------------------------------------------------------------------------------


@dataclass
class Part:
    """Elements of one dtype, as raw bit patterns (uint16 for bf16, uint32 for f32)."""

    dtype: str
    bits: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.bits.nbytes)


@dataclass
class Group:
    name: str
    parts: list[Part]
    note: str = ""
    sum_of: list[str] = field(default_factory=list)  # a group whose figures add up others'

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


def bits_of(tensors: list[Any], dtype: str) -> np.ndarray:
    """The tensors' raw bit patterns, concatenated into one uint16/uint32 array."""
    import torch

    view = {"bf16": torch.uint16, "f32": torch.int32}[dtype]
    flat = torch.cat([t.detach().reshape(-1) for t in tensors]) if tensors else torch.empty(0)
    return flat.view(view).numpy().view(UINT[dtype])


def trained_groups(kept: dict[int, dict[str, Any]]) -> list[Group]:
    """The groups of the trained state: each kind at the first kept step S, the whole training
    state (their sum), and the bf16 weights' XOR deltas from S to each later kept step."""
    steps = sorted(kept)
    s0 = kept[steps[0]]

    def kind(st: dict[str, Any], k: str) -> list[Any]:
        return [t for n, t in st.items() if n.startswith(k + ".")]

    g = [
        Group("bf16 weights", [Part("bf16", bits_of(kind(s0, "model"), "bf16"))]),
        Group("fp32 master", [Part("f32", bits_of(kind(s0, "master"), "f32"))]),
        Group("exp_avg", [Part("f32", bits_of(kind(s0, "exp_avg"), "f32"))]),
        Group("exp_avg_sq", [Part("f32", bits_of(kind(s0, "exp_avg_sq"), "f32"))]),
    ]
    g.append(Group("training state", [p for x in g for p in x.parts], sum_of=[x.name for x in g]))
    w0 = g[0].parts[0].bits
    for s in steps[1:]:
        ws = bits_of(kind(kept[s], "model"), "bf16")
        d = xor_delta(ws, w0)
        same = 1 - np.count_nonzero(d) / max(1, d.size)
        g.append(Group(f"bf16 XOR {s - steps[0]} steps", [Part("bf16", d)],
                       note=f"steps {steps[0]} -> {s}: {same:.1%} of the bf16 weights unchanged"))  # fmt: skip
    return g


def bench_group(model: str, sample: int) -> tuple[Group, Any]:
    """The main job's --model state (bench/mechanisms.py: bf16 N(0, 0.02) values tiled from one
    seeded 64 MiB pool), its first ``sample`` bytes (0: all) as the group; returns the state too."""
    import mechanisms as M

    state = M.model_state(M.MODELS[model], False)
    total = M.state_bytes(state)
    take, ts = total if sample <= 0 else min(sample, total), []
    for t in state.values():
        if take <= 0:
            break
        n = min(t.numel(), take // 2)
        ts.append(t.reshape(-1)[:n])
        take -= 2 * n
    note = f"{model}: {len(state)} tensors, {total / 1e9:.2f} GB bf16; first {sum(t.numel() for t in ts) * 2 / 2**20:.0f} MiB measured"
    return Group(f"{model} bench state", [Part("bf16", bits_of(ts, "bf16"))], note=note), state


# ------------------------------------------------------------------------------------------------
# Codecs: each compresses a Part and returns (stored bytes, compress s, decompress s), checking
# the round trip
# ------------------------------------------------------------------------------------------------

Result = tuple[int, float, float]


def zstd_part(part: Part, level: int, grouped: bool) -> Result:
    """libzstd through python-zstandard, one thread, each 1 MiB block on its own (its byte
    planes each on their own when ``grouped``); a piece that does not shrink is kept raw."""
    import zstandard

    cctx = zstandard.ZstdCompressor(level=level)
    dctx = zstandard.ZstdDecompressor()
    u8 = np.ascontiguousarray(part.bits).view(np.uint8).reshape(-1)
    width = WIDTH[part.dtype]
    blocks: list[list[tuple[bool, Any]]] = []
    stored = 0
    t0 = time.perf_counter()
    for off in range(0, u8.size, BLOCK):
        blk = u8[off : off + BLOCK]
        pieces = list(byte_planes(blk, width)) if grouped else [blk]
        out = []
        for p in pieces:
            z = cctx.compress(p)
            packed = len(z) < p.size
            out.append((packed, z if packed else p))
            stored += len(z) if packed else p.size
        blocks.append(out)
    t1 = time.perf_counter()
    # Each block decodes into one reused buffer and is compared outside the clock: the figure
    # is the codec's, not the cost of faulting in fresh memory for the whole part (a load's
    # cost, which the end-to-end rows measure).
    dst = np.empty(BLOCK, np.uint8)
    d_s = 0.0
    for i, out in enumerate(blocks):
        n = min(BLOCK, u8.size - i * BLOCK)
        t = time.perf_counter()
        got = [np.frombuffer(dctx.decompress(x), np.uint8) if packed else x for packed, x in out]
        if grouped:
            interleave(got, dst[:n])
        else:
            dst[:n] = got[0]
        d_s += time.perf_counter() - t
        if not np.array_equal(dst[:n], u8[i * BLOCK : i * BLOCK + n]):
            raise SystemExit(f"bench: zstd-{level}{'+bg' if grouped else ''} round trip differs")
    return stored, t1 - t0, d_s


_ZIPNN_DTYPE = {"bf16": "bfloat16", "f32": "float32"}
# ZipNN gets the part in pieces of this size: on this machine its one-thread speed falls off
# past ~16 MiB per call (bf16: 1.1-1.2 GB/s compress at 4-16 MiB, 0.25 at 256 MiB), so whole
# tensors of hundreds of MiB would understate it.
ZIPNN_PIECE = 16 << 20


def zipnn_part(part: Part) -> Result:
    """ZipNN (byte grouping + Huffman / zstd per plane), one thread, on the part's bytes in
    pieces of ZIPNN_PIECE. ZipNN's compress rewrites its input buffer in place, so it gets
    copies (made untimed)."""
    from zipnn import ZipNN

    z = ZipNN(input_format="byte", bytearray_dtype=_ZIPNN_DTYPE[part.dtype], threads=1)
    orig = np.ascontiguousarray(part.bits).view(np.uint8).reshape(-1)
    bufs = [bytearray(orig[off : off + ZIPNN_PIECE]) for off in range(0, orig.size, ZIPNN_PIECE)]
    t0 = time.perf_counter()
    cs = [z.compress(b) for b in bufs]
    t1 = time.perf_counter()
    del bufs
    d_s = 0.0
    for i, c in enumerate(cs):  # piece by piece, compared outside the clock (as for zstd)
        t = time.perf_counter()
        d = z.decompress(c)
        d_s += time.perf_counter() - t
        if not np.array_equal(np.frombuffer(d, np.uint8), orig[i * ZIPNN_PIECE : (i + 1) * ZIPNN_PIECE]):
            raise SystemExit("bench: ZipNN round trip differs")
        del d
    return sum(len(c) for c in cs), t1 - t0, d_s


def zipnn_status() -> str:
    """"" when ZipNN imports and round-trips here, else why not, in one line."""
    try:
        import zipnn  # noqa: F401
    except Exception as e:  # noqa: BLE001 (any failure to import is the answer)
        return f"ZipNN does not import: {type(e).__name__}: {e}"
    try:
        zipnn_part(Part("bf16", (np.arange(4096, dtype=np.uint16) * 7) & 0x3FFF))
    except BaseException as e:  # noqa: BLE001
        return f"ZipNN does not run: {type(e).__name__}: {e}"
    return ""


def zstd_status() -> str:
    try:
        import zstandard  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return f"python-zstandard does not import: {type(e).__name__}: {e}"
    return ""


def codec_bench_part(part: Part, tool: str, runs: int, tmp: str) -> tuple[Result, dict[str, Any]]:
    """ckptio's codec through `ckptio-codec-bench --codec auto` on the part written to a raw file."""
    path = os.path.join(tmp, f"part-{part.dtype}.raw")
    assert sys.byteorder == "little"  # the tool reads little-endian elements
    part.bits.tofile(path)
    try:
        out = subprocess.run([tool, "--dtype", part.dtype, "--codec", "auto", "--repeat", str(runs), path],
                             check=True, capture_output=True, text=True, timeout=600).stdout  # fmt: skip
    finally:
        os.remove(path)
    j = json.loads(out[out.index("{") :])
    raw = j["raw_bytes"]
    return (int(j["stored_bytes"]), raw / (j["compress_gbps"] * 1e9), raw / (j["decompress_gbps"] * 1e9)), j


METHODS: dict[str, Callable[[Part], Result]] = {
    "ZipNN": zipnn_part,
    "zstd-1": lambda p: zstd_part(p, 1, False),
    "zstd-3": lambda p: zstd_part(p, 3, False),
    "zstd-1+bg": lambda p: zstd_part(p, 1, True),
    "zstd-3+bg": lambda p: zstd_part(p, 3, True),
}
CKPTIO_CODEC = "ckptio codec"
INCOMPRESSIBLE = "random bf16 bits"
# "No slower beyond noise" (issue 20, compress="auto" on incompressible data): the median
# compressed save at least this fraction of the median uncompressed one, same rounds.
NOISE_FLOOR = 0.9


# ------------------------------------------------------------------------------------------------
# End to end: ckptio.save(compress=...) and a cold load, next to the raw device
# ------------------------------------------------------------------------------------------------


def incompressible_state(nbytes: int, tensors: int = 8) -> dict[str, Any]:
    """``tensors`` bf16 tensors of uniformly random bit patterns (NaNs and all), ``nbytes`` in
    all: what no coder shrinks, so "auto" must cost nothing on it."""
    import torch

    g = torch.Generator().manual_seed(20)
    n = nbytes // 2 // tensors
    return {f"noise.{i}": torch.randint(-(1 << 15), 1 << 15, (n,), dtype=torch.int16, generator=g).view(torch.bfloat16)
            for i in range(tensors)}  # fmt: skip


def save_accepts_compress() -> bool:
    """Whether this ckptio's save takes ``compress=``: a keyword of its own, or an I/O option."""
    import ckptio

    try:
        if "compress" in inspect.signature(ckptio.save).parameters:
            return True
    except (TypeError, ValueError):
        pass
    try:
        from ckptio._options import IO_OPTIONS

        return "compress" in IO_OPTIONS
    except ImportError:
        return False


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _d, fs in os.walk(path) for f in fs)


def end_to_end(name: str, state: dict[str, Any], variants: list[str], runs: int, d: str, raw_size: int,
               quiet: bool) -> dict[str, Any]:  # fmt: skip
    """An untimed save and load, then ``runs`` rounds; each measures the raw device once, then
    each variant (order rotated per round) saves the state durably (ckptio fsyncs files and
    directories itself) and loads it back from a cold page cache (fsync + POSIX_FADV_DONTNEED
    of every file first), touching a byte of every page. GB/s are logical: the state's
    uncompressed bytes over the time."""
    import ckptio
    import mechanisms as M

    nbytes = M.state_bytes(state)
    path = os.path.join(d, "ckpt")
    res: dict[tuple[str, str], list[float]] = {}
    disk: dict[str, int] = {}
    raw: dict[str, list[float]] = {"write": [], "read": []}
    # One untimed save and cold load first: the first full-size load into fresh memory in a
    # process is the slow one on this VM (bench/README.md, the multi-rank cell's warm round).
    ckptio.save(state, path, overwrite=True)
    M.evict(path)
    M.touch(ckptio.load(path), False)
    gc.collect()
    for r in range(runs):
        w, rd, _ = raw_measure(d, raw_size)
        raw["write"].append(w)
        raw["read"].append(rd)
        for v in variants[r % len(variants) :] + variants[: r % len(variants)]:
            kw = {} if v == "none" else {"compress": v}
            M.remove(path)
            M.make_durable(d)
            gc.collect()
            t0 = time.perf_counter()
            ckptio.save(state, path, overwrite=True, **kw)
            t1 = time.perf_counter()
            disk[v] = _dir_bytes(path)
            M.evict(path)
            gc.collect()
            t2 = time.perf_counter()
            out = ckptio.load(path)
            seen = M.touch(out, False)
            t3 = time.perf_counter()
            del out
            if seen < nbytes:
                raise SystemExit(f"bench: ckptio.load returned {seen} bytes of {nbytes}")
            res.setdefault((v, "save"), []).append(nbytes / (t1 - t0) / 1e9)
            res.setdefault((v, "load"), []).append(nbytes / (t3 - t2) / 1e9)
            if not quiet:
                print(f"{name} round {r + 1}: compress={v} save {res[(v, 'save')][-1]:.2f}, "
                      f"load {res[(v, 'load')][-1]:.2f} GB/s (raw {w:.2f} / {rd:.2f})", flush=True)  # fmt: skip
    M.remove(path)
    raw_w, raw_r = med(raw["write"]), med(raw["read"])
    rows = []
    for (v, op), xs in res.items():
        ref = raw_w if op == "save" else raw_r
        rows.append({
            "state": name, "compress": v, "op": op, "durable": op == "save",
            "cache": "cold" if op == "load" else "", "bytes": nbytes, "disk_bytes": disk[v],
            "gbps": round(med(xs), 4), "gbps_min": round(min(xs), 4), "gbps_max": round(max(xs), 4),
            "runs": [round(x, 4) for x in xs], "of_raw": round(med(xs) / ref, 4) if ref else 0.0,
        })  # fmt: skip
    return {"state": name, "bytes": nbytes, "raw_write_gbps": round(raw_w, 4), "raw_read_gbps": round(raw_r, 4),
            "raw_write_runs": [round(x, 4) for x in raw["write"]],
            "raw_read_runs": [round(x, 4) for x in raw["read"]], "rows": rows}  # fmt: skip


# ------------------------------------------------------------------------------------------------
# The cell
# ------------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default=os.path.join(ROOT, "bench-data"), help="bench directory (its files are removed afterwards)")
    ap.add_argument("--model", default="1.3b", help="the main job's state measured beside the trained one ('none': skip)")
    ap.add_argument("--sample", default="256M", help="bytes of the --model state the codecs measure (0: all of it)")
    ap.add_argument("--runs", type=int, default=3, help="codec rounds (speeds are medians)")
    ap.add_argument("--e2e-runs", type=int, default=3, help="end-to-end rounds per state")
    ap.add_argument("--no-e2e", action="store_true", help="codecs only: no saves or loads")
    ap.add_argument("--raw-size", default="1G", help="file size of each raw device measurement")
    ap.add_argument("--steps", type=int, default=0, help="S, the first kept training step (0: compress_state's default)")
    ap.add_argument("--codec-bench", default=CODEC_BENCH, help="ckptio's codec bench program")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="JSON directory ('': none)")
    ap.add_argument("--quiet", action="store_true")
    return ap


def _measure(groups: list[Group], methods: dict[str, Callable[[Part], Result]], runs: int,
             quiet: bool) -> dict[str, dict[str, dict[str, Any]]]:  # fmt: skip
    """Every method on every part of every group, ``runs`` rounds (method order rotated per
    round); per group and method: stored bytes and per-round compress/decompress seconds."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    names = list(methods)
    for r in range(runs):
        for m in names[r % len(names) :] + names[: r % len(names)]:
            for g in groups:
                if g.sum_of:
                    continue
                stored, cs, ds = 0, 0.0, 0.0
                for p in g.parts:
                    s, c, d = methods[m](p)
                    stored, cs, ds = stored + s, cs + c, ds + d
                e = out.setdefault(g.name, {}).setdefault(m, {"stored": stored, "c": [], "d": []})
                e["c"].append(cs)
                e["d"].append(ds)
            if not quiet:
                print(f"codecs round {r + 1}: {m} done", file=sys.stderr, flush=True)
    for g in groups:  # a sum group: stored bytes and per-round seconds add up
        if g.sum_of:
            for m in names:
                parts = [out[x][m] for x in g.sum_of]
                out[g.name] = out.get(g.name, {})
                out[g.name][m] = {"stored": sum(e["stored"] for e in parts),
                                  "c": [sum(e["c"][i] for e in parts) for i in range(runs)],
                                  "d": [sum(e["d"][i] for e in parts) for i in range(runs)]}  # fmt: skip
    return out


def _codec_rows(groups: list[Group], tool: str, runs: int) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """ckptio's codec on every group (the tool times its own repeats); sum groups add up."""
    out: dict[str, dict[str, Any]] = {}
    raw_json: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ckptio-codec-") as tmp:
        for g in groups:
            if g.sum_of:
                continue
            stored, cs, ds = 0, 0.0, 0.0
            for p in g.parts:
                (s, c, d), j = codec_bench_part(p, tool, runs, tmp)
                stored, cs, ds = stored + s, cs + c, ds + d
                raw_json.append({"group": g.name, **j})
            out[g.name] = {"stored": stored, "c": [cs], "d": [ds]}
    for g in groups:
        if g.sum_of:
            es = [out[x] for x in g.sum_of]
            out[g.name] = {"stored": sum(e["stored"] for e in es), "c": [sum(e["c"][0] for e in es)],
                           "d": [sum(e["d"][0] for e in es)]}  # fmt: skip
    return out, raw_json


def run(a: argparse.Namespace) -> dict[str, Any]:
    import compress_state as CS
    import torch

    import ckptio

    t_start = time.time()
    cfg = CS.TrainConfig(steps=a.steps) if a.steps else CS.TrainConfig()
    kept, train_info = CS.states(cfg, log=not a.quiet)
    groups = trained_groups(kept)
    state_sizes = {str(s): {k: sum(t.numel() * t.element_size() for n, t in st.items() if n.startswith(k + "."))
                            for k in CS.KINDS} for s, st in kept.items()}  # fmt: skip
    big_state = None
    if a.model != "none":
        g, big_state = bench_group(a.model, parse_size(str(a.sample)))
        groups.append(g)

    # End to end first: after the codecs had run in this process, the same cold load of the
    # 1.3B state measured 0.33 GB/s where it measured 0.50-0.79 before them.
    e2e: list[dict[str, Any]] = []
    has_compress = save_accepts_compress()
    if not a.no_e2e:
        variants = ["none", "auto"] if has_compress else ["none"]
        raw_size = parse_size(str(a.raw_size))
        made = not os.path.exists(a.dir)
        os.makedirs(a.dir, exist_ok=True)
        # The kept states together (3 x 152 MB by default): one step alone is small enough for
        # the fixed costs of a save (files, fsyncs, the manifest) to blur the device's speed.
        union = {f"step{s}/{k}": t for s, st in kept.items() for k, t in st.items()}
        try:
            e2e.append(end_to_end(f"trained states {', '.join(map(str, sorted(kept)))}", union, variants, a.e2e_runs,
                                  a.dir, raw_size, a.quiet))  # fmt: skip
            if big_state is not None:
                e2e.append(end_to_end(f"{a.model} bench state", big_state, variants, a.e2e_runs, a.dir, raw_size, a.quiet))
            if has_compress:  # without compress= this row would repeat the ones above
                e2e.append(end_to_end(INCOMPRESSIBLE, incompressible_state(512 << 20), variants, a.e2e_runs, a.dir,
                                      raw_size, a.quiet))  # fmt: skip
        finally:
            if made:
                shutil.rmtree(a.dir, ignore_errors=True)
    del big_state  # the codecs measure its sample, a copy
    gc.collect()
    status = {"ZipNN": zipnn_status(), "zstd": zstd_status(),
              "ckptio.save(compress=)": "" if has_compress else NOT_IN_BUILD}  # fmt: skip
    methods = {m: f for m, f in METHODS.items() if not status["ZipNN" if m == "ZipNN" else "zstd"]}
    measured = _measure(groups, methods, a.runs, a.quiet)
    tool = a.codec_bench if os.access(a.codec_bench, os.X_OK) else ""
    status[CKPTIO_CODEC] = "" if tool else f"{NOT_IN_BUILD} (no {os.path.relpath(a.codec_bench, ROOT)})"
    codec_json: list[dict[str, Any]] = []
    if tool:
        cm, codec_json = _codec_rows(groups, tool, a.runs)
        for gname, e in cm.items():
            measured[gname][CKPTIO_CODEC] = e

    table = []
    for g in groups:
        parts = g.parts
        bound = sum(bound_bytes(p.bits, p.dtype) for p in parts)
        planes = sum(plane_bound_bytes(p.bits, p.dtype) for p in parts)
        blocks = sum(block_bound_bytes(p.bits, p.dtype) for p in parts)
        entry: dict[str, Any] = {
            "group": g.name, "bytes": g.nbytes, "dtypes": sorted({p.dtype for p in parts}),
            "elements": sum(int(p.bits.size) for p in parts), "note": g.note, "sum_of": g.sum_of,
            "exponent_entropy_bits": {p.dtype: round(exponent_entropy(p.bits, p.dtype), 4) for p in parts} if not g.sum_of else {},
            "bound_ratio": round(g.nbytes / bound, 4), "plane_bound_ratio": round(g.nbytes / planes, 4),
            "block_bound_ratio": round(g.nbytes / blocks, 4),
            "methods": {},
        }  # fmt: skip
        for m, e in measured.get(g.name, {}).items():
            ratio = g.nbytes / e["stored"]
            entry["methods"][m] = {
                "stored_bytes": e["stored"], "ratio": round(ratio, 4),
                "of_bound": round(ratio / entry["bound_ratio"], 4),
                "compress_gbps": round(g.nbytes / med(e["c"]) / 1e9, 4),
                "decompress_gbps": round(g.nbytes / med(e["d"]) / 1e9, 4),
                "compress_gbps_runs": [round(g.nbytes / x / 1e9, 4) for x in e["c"]],
                "decompress_gbps_runs": [round(g.nbytes / x / 1e9, 4) for x in e["d"]],
            }  # fmt: skip
        table.append(entry)


    doc = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": shlex.join([os.path.basename(sys.executable), *sys.argv]),
        "machine": machine(a.dir, mem=False),
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "ckptio": ckptio.__version__,
                     **{p: version(p) for p in ("numpy", "zstandard", "zipnn")}},
        "args": dict(vars(a)), "seconds": round(time.time() - t_start, 1),
        "training": {k: train_info[k] for k in ("config", "params", "train_seconds", "losses", "cached", "dir", "text_bytes")},
        "state_bytes": state_sizes, "block_bytes": BLOCK, "threads": 1,
        "status": status, "groups": table, "codec_bench": codec_json, "end_to_end": e2e,
        "targets": targets(table, e2e),
    }  # fmt: skip
    return doc


def targets(table: list[dict[str, Any]], e2e: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 20's targets for ckptio's codec and compressed saves: True/False when measured,
    None when the part they need is not in this build."""
    by = {g["group"]: g for g in table}
    out: dict[str, Any] = {}

    def codec(group: str) -> dict[str, Any] | None:
        return by.get(group, {}).get("methods", {}).get(CKPTIO_CODEC)

    for group, floor in (("bf16 weights", 1.45), ("fp32 master", 1.15), ("training state", 1.2), ("bf16 XOR 100 steps", 2.0)):
        c = codec(group)
        out[f"{group}: ratio >= {floor}"] = None if c is None else c["ratio"] >= floor
        out[f"{group}: within 5% of the bound"] = None if c is None else c["of_bound"] >= 0.95
    c, z = codec("bf16 weights"), by.get("bf16 weights", {}).get("methods", {}).get("ZipNN")
    out["bf16 weights: ratio >= ZipNN's"] = None if c is None or z is None else c["ratio"] >= z["ratio"]
    for what in ("compress", "decompress"):
        out[f"bf16 weights: {what} >= 1.5x ZipNN's per core"] = (
            None if c is None or z is None else c[f"{what}_gbps"] >= 1.5 * z[f"{what}_gbps"])  # fmt: skip
    noise = next((e for e in e2e if e["state"] == INCOMPRESSIBLE), None)
    saves = {r["compress"]: r["gbps"] for r in (noise or {}).get("rows", []) if r["op"] == "save"}
    out[f"incompressible: auto save >= {NOISE_FLOOR} x uncompressed save"] = (
        None if "auto" not in saves else saves["auto"] >= NOISE_FLOOR * saves["none"])  # fmt: skip
    trained = next((e for e in e2e if e["state"].startswith("trained")), None)
    for op in ("save", "load"):
        r = next((x for x in (trained or {}).get("rows", []) if x["compress"] == "auto" and x["op"] == op), None)
        out[f"trained state: compressed {op} >= 1.2x raw {'write' if op == 'save' else 'read'}"] = (
            None if r is None else r["of_raw"] >= 1.2)  # fmt: skip
    return out


def _ratio_cell(e: dict[str, Any] | None) -> str:
    return f"{e['ratio']:.3f}" if e else "-"


def summarize(doc: dict[str, Any]) -> str:
    t = doc["training"]
    c = t["config"]
    lines = [
        f"\ncompression cell: trained state = byte-level GPT, {c['layers']} layers, d_model {c['d_model']}, context "
        f"{c['context']}, {t['params'] / 1e6:.1f}M params, {c['steps']} AdamW steps on {t['text_bytes'] / 1e6:.1f} MB of "
        f"stdlib source (loss {t['losses'].get(str(c['steps']), t['losses'].get(c['steps'], '?'))}); training took "
        f"{t['train_seconds']:.0f} s" + (" (states from the cache)" if t["cached"] else ""),
    ]  # fmt: skip
    for s, kinds in doc["state_bytes"].items():
        lines.append(f"  state at step {s}: " + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in kinds.items())
                     + f"; {sum(kinds.values()) / 1e6:.1f} MB in all")  # fmt: skip
    for k, v in doc["status"].items():
        if v:
            lines.append(f"  {k}: {v}")
    methods = list(dict.fromkeys(m for g in doc["groups"] for m in g["methods"]))
    if CKPTIO_CODEC not in methods:
        methods.append(CKPTIO_CODEC)
    lines.append(f"\nratio (raw / stored; each {doc['block_bytes'] >> 20} MiB block on its own for zstd; +bg = byte planes "
                 "zstd'ed apart); bound = exponent field at its order-0 entropy, sign and mantissa raw; "
                 "blocks = the same per 1 MiB block; planes = every byte plane at its order-0 entropy")  # fmt: skip
    hdr = f"{'group':22s} {'MB':>8s} {'H(exp)':>12s} {'bound':>6s} {'blocks':>6s} {'planes':>6s}" + "".join(f" {m:>12s}" for m in methods)
    lines += [hdr, "-" * len(hdr)]
    for g in doc["groups"]:
        h = "/".join(f"{v:.2f}" for v in g["exponent_entropy_bits"].values()) or "(sum)"
        lines.append(f"{g['group']:22s} {g['bytes'] / 1e6:8.1f} {h:>12s} {g['bound_ratio']:6.3f} {g.get('block_bound_ratio', 0):6.3f} {g['plane_bound_ratio']:6.3f}"
                     + "".join(f" {_ratio_cell(g['methods'].get(m)):>12s}" for m in methods))  # fmt: skip
    lines.append("\none-thread speed, GB/s of raw bytes: compress / decompress (medians of "
                 f"{doc['args']['runs']} rounds, in memory)")
    hdr = f"{'group':22s}" + "".join(f" {m:>12s}" for m in methods)
    lines += [hdr, "-" * len(hdr)]
    for g in doc["groups"]:
        cells = []
        for m in methods:
            e = g["methods"].get(m)
            cells.append(f"{e['compress_gbps']:.2f}/{e['decompress_gbps']:.2f}" if e else "-")
        lines.append(f"{g['group']:22s}" + "".join(f" {x:>12s}" for x in cells))
    for g in doc["groups"]:
        if g["note"]:
            lines.append(f"  {g['group']}: {g['note']}")
    for e in doc["end_to_end"]:
        lines.append(f"\nckptio end to end, {e['state']} ({e['bytes'] / 1e6:.1f} MB): raw O_DIRECT write "
                     f"{e['raw_write_gbps']:.2f}, read {e['raw_read_gbps']:.2f} GB/s (medians, same rounds); "
                     "saves durable, loads cold (page cache dropped), logical GB/s")  # fmt: skip
        for r in e["rows"]:
            what = f"ckptio.{r['op']}" + (" (cold)" if r["op"] == "load" else " (durable)")
            lines.append(f"  compress={r['compress']:5s} {what:20s} {r['gbps']:6.2f} GB/s  {r['gbps_min']:.2f} - "
                         f"{r['gbps_max']:.2f}  {r['of_raw']:.2f} of raw  on disk {r['disk_bytes'] / 1e6:.1f} MB")  # fmt: skip
        if "auto" not in {r["compress"] for r in e["rows"]}:
            lines.append(f"  compress=auto: {NOT_IN_BUILD} (ckptio.save has no compress option)")
    lines.append("")
    for k, ok in doc["targets"].items():
        lines.append(f"  target {k}: {NOT_IN_BUILD if ok is None else ('met' if ok else 'MISSED')}")
    lines.append(f"compression cell: {doc['seconds']:.0f} s")
    return "\n".join(lines)


def write(doc: dict[str, Any], out: str) -> None:
    if out:
        print(f"results: {write_results(doc, out, 'compress-')}")


def main() -> None:
    a = parser().parse_args()
    doc = run(a)
    print(summarize(doc))
    write(doc, a.out)


if __name__ == "__main__":
    main()
