# SPDX-License-Identifier: Apache-2.0
"""`ckptio convert`: every pair of formats bit-exact, sharded safetensors that transformers
loads, refused sources leaving nothing at the destination, bounded memory."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

import ckptio
from ckptio import _convert

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


def run(*args: Any, buffer: int | None = 65536, ok: bool = True) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`python -m ckptio convert ARGS` (the C command, handing torch and DCP back to this
    Python), with a small copy buffer so that tensors are split into pieces."""
    env = dict(os.environ)
    if buffer:
        env["CKPTIO_CONVERT_BUFFER"] = str(buffer)
    res = subprocess.run(
        [sys.executable, "-m", "ckptio", "convert", *map(str, args)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    if ok:
        assert res.returncode == 0, res.stderr
        assert res.stdout == "" and res.stderr == ""  # nothing when not on a terminal
    return res


def state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    return {
        "emb.weight": torch.randn(300, 129, generator=g).to(torch.bfloat16),
        "layer.0.w": torch.randn(64, 33, generator=g).half(),
        "layer.0.b": torch.randn(1000, 70, generator=g),  # 280 kB: several pieces
        "steps": torch.arange(1234, dtype=torch.int64),
        "mask": torch.rand(77, generator=g) > 0.5,
        "u8": torch.randint(0, 255, (5, 3), dtype=torch.uint8, generator=g),
        "f64": torch.randn(3, generator=g, dtype=torch.float64),
        "u16": torch.arange(9, dtype=torch.int32).to(torch.uint16) * 7000,
        "u32": torch.arange(4, dtype=torch.int64).to(torch.uint32) * 1_000_000_000,
        "u64": torch.arange(4, dtype=torch.int64).to(torch.uint64) * (1 << 40),
        "f8": torch.randn(16, generator=g).to(torch.float8_e4m3fn),
        "f8b": torch.randn(16, generator=g).to(torch.float8_e5m2),
        "c64": torch.randn(6, generator=g, dtype=torch.complex64),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 4),
    }


def same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert sorted(a) == sorted(b)
    for k, v in a.items():
        w = b[k] if isinstance(b[k], torch.Tensor) else torch.as_tensor(b[k])
        assert w.dtype == v.dtype, k
        assert w.shape == v.shape, k
        assert torch.equal(w.view(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8)), k


def test_ckptio_safetensors_round_trip(tmp_path: pathlib.Path) -> None:
    sd = state()
    ckptio.save(sd, tmp_path / "ck")
    run(tmp_path / "ck", tmp_path / "m.safetensors")
    same(sd, safetensors_torch.load_file(tmp_path / "m.safetensors"))
    run(tmp_path / "m.safetensors", tmp_path / "back")
    same(sd, ckptio.load(tmp_path / "back"))


def test_hf_shards_load_in_transformers(tmp_path: pathlib.Path) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=300, n_positions=64)
    model = transformers.GPT2Model(cfg)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ckptio.save(sd, tmp_path / "ck")
    hf = tmp_path / "hf"
    run(tmp_path / "ck", hf, "--max-shard-size", "20K")
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert sorted(os.listdir(hf)) == sorted([*shards, "model.safetensors.index.json"])
    assert sorted(index["weight_map"]) == sorted(sd)
    cfg.save_pretrained(hf)
    loaded = transformers.GPT2Model.from_pretrained(hf)
    same(sd, {k: v for k, v in loaded.state_dict().items() if k in sd})
    run(hf, tmp_path / "back")
    same(sd, ckptio.load(tmp_path / "back"))
    run(hf, tmp_path / "one.safetensors")
    same(sd, safetensors_torch.load_file(tmp_path / "one.safetensors"))


@pytest.mark.parametrize("zipped", [True, False])
def test_torch_to_ckptio_keeps_the_tree(tmp_path: pathlib.Path, zipped: bool) -> None:
    # An empty tensor first (its storage, the file's first record, holds no bytes), a
    # transposed view and a view at an offset into another tensor's storage.
    big = torch.arange(600, dtype=torch.float32).reshape(20, 30)
    views = {"empty": torch.empty(0), "big": big, "t": big.t(), "rows": big[5:9]}
    # torch's own reader of its legacy format fails on the dtypes that came later.
    sd = {k: v for k, v in state().items() if zipped or k not in ("u16", "u32", "u64", "f8", "f8b")}
    obj = {"views": views, "model": sd, "epoch": 3, "lr": 0.5, "name": "run-1", "hist": [torch.ones(2), 4]}  # fmt: skip
    torch.save(obj, tmp_path / "x.pt", _use_new_zipfile_serialization=zipped)
    run(tmp_path / "x.pt", tmp_path / "ck")
    back = ckptio.load(tmp_path / "ck")
    same(sd, back["model"])
    same({k: v.contiguous() for k, v in views.items()}, back["views"])
    assert (back["epoch"], back["lr"], back["name"]) == (3, 0.5, "run-1")
    assert torch.equal(back["hist"][0], torch.ones(2)) and back["hist"][1] == 4


def test_ckptio_to_torch_weights_only(tmp_path: pathlib.Path) -> None:
    sd = state()
    ckptio.save({"model": sd, "epoch": 7}, tmp_path / "ck")
    run(tmp_path / "ck", tmp_path / "x.pt")
    for mmap in (False, True):
        back = torch.load(tmp_path / "x.pt", weights_only=True, mmap=mmap)
        same(sd, back["model"])
        assert back["epoch"] == 7


def test_dcp_round_trip(tmp_path: pathlib.Path) -> None:
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    sd = state()
    dcp.save(sd, checkpoint_id=str(tmp_path / "d"), no_dist=True)
    run(tmp_path / "d", tmp_path / "ck")
    same(sd, ckptio.load(tmp_path / "ck"))
    run(tmp_path / "ck", tmp_path / "out.dcp")
    back = {k: torch.empty_like(v) for k, v in sd.items()}
    dcp.load(back, checkpoint_id=str(tmp_path / "out.dcp"), no_dist=True)
    same(sd, back)
    # The 280 kB tensor went out as chunks of the 64 KiB buffer, and every tensor of both DCP
    # directories is read back straight from its records.
    md = dcp.FileSystemReader(str(tmp_path / "out.dcp")).read_metadata()
    assert len(md.state_dict_metadata["layer.0.b"].chunks) > 4
    for d in ("d", "out.dcp"):
        src = _convert.DcpSource(str(tmp_path / d))
        assert sorted(src.direct) == sorted(sd)
        src.close()


def test_tied_tensors(tmp_path: pathlib.Path) -> None:
    """A tensor held twice stays one tensor in torch files and ckptio checkpoints and both keys
    in DCP; from a torch file, the same object twice stays one."""
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    w = torch.randn(300, 70)  # over the 64 KiB buffer: chunks in DCP
    ckptio.save({"emb": w, "head": w, "b": torch.ones(3)}, tmp_path / "ck")
    run(tmp_path / "ck", tmp_path / "x.pt")
    back = torch.load(tmp_path / "x.pt", weights_only=True)
    assert torch.equal(back["emb"], w) and back["head"] is back["emb"]
    run(tmp_path / "ck", tmp_path / "o.dcp")
    got = {"emb": torch.empty_like(w), "head": torch.empty_like(w), "b": torch.empty(3)}
    dcp.load(got, checkpoint_id=str(tmp_path / "o.dcp"), no_dist=True)
    assert torch.equal(got["emb"], w) and torch.equal(got["head"], w)
    run(tmp_path / "x.pt", tmp_path / "ck2")
    again = ckptio.load(tmp_path / "ck2")
    assert torch.equal(again["head"], w) and again["head"].data_ptr() == again["emb"].data_ptr()


def test_dcp_source_by_dcp_load(tmp_path: pathlib.Path) -> None:
    """Chunks that are not runs of rows (saved by several ranks) go through dcp.load."""
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    sd = state()
    dcp.save(sd, checkpoint_id=str(tmp_path / "d"), no_dist=True)
    src = _convert.DcpSource(str(tmp_path / "d"))
    src.direct.clear()
    _convert.to_ckptio(src, str(tmp_path / "ck"), False)
    src.close()
    same(sd, ckptio.load(tmp_path / "ck"))


def test_safetensors_with_torch_and_dcp(tmp_path: pathlib.Path) -> None:
    """Between safetensors and torch or DCP, in one pass through the engine."""
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    sd = state()
    torch.save(sd, tmp_path / "x.pt")
    run(tmp_path / "x.pt", tmp_path / "m.safetensors")
    same(sd, safetensors_torch.load_file(tmp_path / "m.safetensors"))
    run(tmp_path / "x.pt", tmp_path / "hf", "--max-shard-size", "100K")
    run(tmp_path / "hf", tmp_path / "o.dcp")
    back = {k: torch.empty_like(v) for k, v in sd.items()}
    dcp.load(back, checkpoint_id=str(tmp_path / "o.dcp"), no_dist=True)
    same(sd, back)
    run(tmp_path / "m.safetensors", tmp_path / "y.pt")
    same(sd, torch.load(tmp_path / "y.pt", weights_only=True))
    assert sorted(os.listdir(tmp_path)) == ["hf", "m.safetensors", "o.dcp", "x.pt", "y.pt"]
    res = run(tmp_path / "x.pt", tmp_path / "m.safetensors", ok=False)
    assert res.returncode == 1 and "--overwrite" in res.stderr


def corrupt(ck: pathlib.Path) -> None:
    data = ck / "data" / sorted(os.listdir(ck / "data"))[0]
    with open(data, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize("dst", ["m.safetensors", "hf", "x.pt", "back", "out.dcp"])
def test_corrupt_source_leaves_nothing(tmp_path: pathlib.Path, dst: str) -> None:
    ckptio.save(state(), tmp_path / "ck")
    corrupt(tmp_path / "ck")
    extra = ["--max-shard-size", "20K"] if dst == "hf" else []
    res = run(tmp_path / "ck", tmp_path / dst, *extra, ok=False)
    assert res.returncode == 1
    assert "checksum" in res.stderr.lower(), res.stderr
    assert f"nothing was written at {tmp_path / dst}" in res.stderr
    assert sorted(os.listdir(tmp_path)) == ["ck"]


def test_malicious_pickle_is_not_run(tmp_path: pathlib.Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> Any:
            return (os.system, (f"touch {marker}",))

    torch.save({"w": torch.ones(3), "x": Evil()}, tmp_path / "evil.pt")
    for dst in ("ck", "m.safetensors"):  # the second a mixed pair, in one pass
        res = run(tmp_path / "evil.pt", tmp_path / dst, ok=False)
        assert res.returncode == 1
        assert "refused" in res.stderr and "was not run" in res.stderr, res.stderr
        assert f"nothing was written at {tmp_path / dst}" in res.stderr
        assert not marker.exists()
        assert sorted(os.listdir(tmp_path)) == ["evil.pt"]


def test_existing_destination_needs_overwrite(tmp_path: pathlib.Path) -> None:
    sd = state()
    ckptio.save(sd, tmp_path / "ck")
    for dst, extra in (("m.safetensors", []), ("hf", ["--max-shard-size", "20K"]), ("x.pt", []), ("o.dcp", [])):  # fmt: skip
        run(tmp_path / "ck", tmp_path / dst, *extra)
        res = run(tmp_path / "ck", tmp_path / dst, *extra, ok=False)
        assert res.returncode == 1 and "--overwrite" in res.stderr, res.stderr
        run(tmp_path / "ck", tmp_path / dst, *extra, "--overwrite")
    same(sd, safetensors_torch.load_file(tmp_path / "m.safetensors"))
    same(sd, torch.load(tmp_path / "x.pt", weights_only=True)["."] if False else torch.load(tmp_path / "x.pt", weights_only=True))  # fmt: skip
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n or ".old-" in n]
    # Never an unrelated directory, even with --overwrite.
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("x")
    res = run(tmp_path / "ck", tmp_path / "other", "--to", "hf", "--overwrite", ok=False)
    assert res.returncode == 1 and (tmp_path / "other" / "keep.txt").exists()


def test_help_and_usage() -> None:
    res = subprocess.run([sys.executable, "-m", "ckptio", "convert", "--help"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0 and "--max-shard-size" in res.stdout and "dcp" in res.stdout
    res = subprocess.run([sys.executable, "-m", "ckptio", "convert", "only-one"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 2


def peak_rss_mib(*argv: str) -> float:
    """Peak resident memory of the command argv (a child of a fresh Python), in MiB."""
    code = (
        "import resource, subprocess, sys; "
        "subprocess.run(sys.argv[1:], check=True, timeout=600); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    res = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True, timeout=660)  # fmt: skip
    return int(res.stdout.split()[-1]) / 1024


def test_peak_memory_is_bounded(tmp_path: pathlib.Path) -> None:
    """A 256 MB checkpoint converts within far less memory than its size: to safetensors (C)
    within 128 MiB in all, to a torch file and back (Python) within 128 MiB beyond what the
    interpreter with torch takes."""
    import numpy as np

    ckptio.save({f"t{i}": np.full((16 << 20) // 4, i, np.float32) for i in range(16)}, tmp_path / "ck")  # fmt: skip
    cmd = (sys.executable, "-m", "ckptio", "convert")
    assert peak_rss_mib(*cmd, str(tmp_path / "ck"), str(tmp_path / "m.safetensors")) < 128
    base = peak_rss_mib(sys.executable, "-c", "import torch, numpy, ckptio._convert")
    assert peak_rss_mib(*cmd, str(tmp_path / "ck"), str(tmp_path / "m.pt")) < base + 128
    assert peak_rss_mib(*cmd, str(tmp_path / "m.pt"), str(tmp_path / "back")) < base + 128


def watch(monkeypatch: pytest.MonkeyPatch, cls: Any, method: str, where: pathlib.Path, seen: list[list[str]]) -> None:  # fmt: skip
    """Record the listing of `where` at every call of cls.method, while the engine runs."""
    orig = getattr(cls, method)

    def spy(self: Any, *args: Any) -> Any:
        seen.append(sorted(os.listdir(where)))
        return orig(self, *args)

    monkeypatch.setattr(cls, method, spy)


@pytest.mark.parametrize(
    "src, dst, spied",
    [("x.pt", "m.safetensors", "TorchSource.read"), ("in.safetensors", "o.dcp", "DcpSink.write"), ("hf", "y.pt", "TorchSink.write")],  # fmt: skip
)
def test_mixed_pairs_in_one_pass(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, src: str, dst: str, spied: str) -> None:  # fmt: skip
    """torch -> safetensors, safetensors -> DCP, hf -> torch: one pass through the engine; while
    it runs, the destination's directory holds only the source and the destination's own
    temporary sibling, never a temporary ckptio checkpoint."""
    pytest.importorskip("torch.distributed.checkpoint")
    sd = state()
    torch.save(sd, tmp_path / "x.pt")
    safetensors_torch.save_file(sd, tmp_path / "in.safetensors")
    run(tmp_path / "in.safetensors", tmp_path / "hf", "--max-shard-size", "100K")
    before = sorted(os.listdir(tmp_path))
    seen: list[list[str]] = []
    cls, method = spied.split(".")
    watch(monkeypatch, getattr(_convert, cls), method, tmp_path, seen)
    _convert.convert(str(tmp_path / src), str(tmp_path / dst))
    assert len(seen) >= len(sd) - 1  # every tensor but the empty one
    for names in seen:
        extra = [n for n in names if n not in before]
        assert len(extra) <= 1 and all(n.startswith(f"{dst}.tmp-") for n in extra), names
        assert not any((tmp_path / n / "manifest").exists() for n in extra)
    assert sorted(os.listdir(tmp_path)) == sorted([*before, dst])
    if dst.endswith(".dcp"):
        back = {k: torch.empty_like(v) for k, v in sd.items()}
        dcp = pytest.importorskip("torch.distributed.checkpoint")
        dcp.load(back, checkpoint_id=str(tmp_path / dst), no_dist=True)
        assert ".ckptio-spill" not in os.listdir(tmp_path / dst)
    elif dst.endswith(".pt"):
        back = torch.load(tmp_path / dst, weights_only=True)
    else:
        back = safetensors_torch.load_file(tmp_path / dst)
    same(sd, back)


@pytest.mark.parametrize("exc", [_convert.ConvertError("the source broke"), KeyboardInterrupt()])
@pytest.mark.parametrize("dst", ["m.safetensors", "hf", "ck", "o.dcp", "y.pt"])
def test_failing_source_leaves_nothing(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, dst: str, exc: BaseException) -> None:  # fmt: skip
    """A torch source that fails (or is interrupted) part-way: the exception reaches the
    caller as it was raised, and nothing is at the destination, nor beside it."""
    pytest.importorskip("torch.distributed.checkpoint")
    torch.save(state(), tmp_path / "x.pt")
    orig = _convert.TorchSource.read
    calls = []

    def read(self: Any, *args: Any) -> None:
        calls.append(1)
        if len(calls) == 3:
            raise exc
        orig(self, *args)

    monkeypatch.setattr(_convert.TorchSource, "read", read)
    with pytest.raises(type(exc)):
        _convert.convert(str(tmp_path / "x.pt"), str(tmp_path / dst), max_shard_size=20000 if dst == "hf" else None)  # fmt: skip
    assert sorted(os.listdir(tmp_path)) == ["x.pt"]


@pytest.mark.parametrize("dst", ["y.pt", "o.dcp"])
def test_failing_sink_leaves_nothing(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, dst: str) -> None:  # fmt: skip
    """A torch or DCP sink that fails part-way (or at its end): nothing at the destination."""
    pytest.importorskip("torch.distributed.checkpoint")
    ckptio.save(state(), tmp_path / "ck")
    cls = _convert.TorchSink if dst.endswith(".pt") else _convert.DcpSink
    for method in ("write", "end"):
        orig = getattr(cls, method)
        calls = []

        def fail(self: Any, *args: Any, orig: Any = orig, calls: list[int] = calls) -> Any:
            calls.append(1)
            if len(calls) == 2 or method == "end":
                raise OSError(28, "No space left on device (injected)")
            return orig(self, *args)

        with monkeypatch.context() as m:
            m.setattr(cls, method, fail)
            with pytest.raises(OSError, match="injected"):
                _convert.convert(str(tmp_path / "ck"), str(tmp_path / dst))
        assert sorted(os.listdir(tmp_path)) == ["ck"], method
    run(tmp_path / "ck", tmp_path / dst)
    assert sorted(os.listdir(tmp_path)) == sorted(["ck", dst])
