# SPDX-License-Identifier: Apache-2.0
"""The trained states of the compression cell: a small byte-level GPT trained with bf16 weights, fp32 master weights and AdamW on the Python standard library's source, kept at three steps and cached on disk."""

from __future__ import annotations

import argparse
import dataclasses
import glob
import hashlib
import json
import math
import os
import sys
import sysconfig
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

State = dict[str, torch.Tensor]

# The kinds of tensors a mixed-precision training state holds, as key prefixes.
KINDS = ("model", "master", "exp_avg", "exp_avg_sq")


@dataclass(frozen=True)
class TrainConfig:
    """The model, its data and its schedule; every field is part of the cache key."""

    layers: int = 6
    d_model: int = 384
    heads: int = 6
    context: int = 256
    vocab: int = 256  # bytes
    batch: int = 8
    steps: int = 300  # S: the first kept state; S + 10 and S + 100 follow
    later: tuple[int, ...] = (10, 100)
    lr: float = 1e-3
    warmup: int = 50
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    seed: int = 0
    threads: int = 2  # torch's intra-op threads: part of the key, since reductions follow them

    def kept(self) -> list[int]:
        return [self.steps] + [self.steps + d for d in self.later]


class Block(nn.Module):
    def __init__(self, c: TrainConfig) -> None:
        super().__init__()
        d = c.d_model
        self.heads = c.heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    """Decoder-only transformer over bytes; the output head is tied to the token embedding."""

    def __init__(self, c: TrainConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(c.vocab, c.d_model)
        self.wpe = nn.Embedding(c.context, c.d_model)
        self.h = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.d_model)
        for n, p in self.named_parameters():
            if n.endswith(".weight") and p.dim() == 2:
                # GPT-2's initialisation: N(0, 0.02), residual projections scaled by depth.
                std = 0.02 / math.sqrt(2 * c.layers) if n.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif n.endswith(".bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.h:
            x = blk(x)
        return self.ln_f(x) @ self.wte.weight.t()


def corpus() -> bytes:
    """The standard library's own *.py files (installed packages left out), in path order."""
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True))
    parts = []
    for f in files:
        rel = os.path.relpath(f, root).split(os.sep)
        if "site-packages" in rel or "dist-packages" in rel:
            continue
        with open(f, "rb") as fh:
            parts.append(fh.read())
    return b"\n".join(parts)


def cache_dir(c: TrainConfig, text: bytes) -> str:
    """~/.cache/ckptio-bench/compress-<key>: the key hashes the config, the text and torch's
    version, so a change of any of them trains anew rather than reusing other weights."""
    key = json.dumps({"config": dataclasses.asdict(c), "torch": torch.__version__,
                      "text": hashlib.sha256(text).hexdigest()}, sort_keys=True)  # fmt: skip
    base = os.environ.get("CKPTIO_BENCH_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "ckptio-bench"))
    return os.path.join(base, "compress-" + hashlib.sha256(key.encode()).hexdigest()[:16])


def _snapshot(model: GPT, master: list[torch.Tensor], opt: torch.optim.AdamW) -> State:
    st: State = {}
    for (n, p), m in zip(model.named_parameters(), master):
        s = opt.state[m]
        st["model." + n] = p.detach().clone()
        st["master." + n] = m.detach().clone()
        st["exp_avg." + n] = s["exp_avg"].clone()
        st["exp_avg_sq." + n] = s["exp_avg_sq"].clone()
    return st


def train(c: TrainConfig, text: bytes, log: bool = True) -> tuple[dict[int, State], dict[str, float]]:
    """Mixed-precision training as large-model trainers do it: the model holds bf16 weights
    and computes in bf16; AdamW updates fp32 master copies from the bf16 gradients, and each
    step rounds the masters back into the model. Returns the states at ``c.kept()`` and the
    training figures (seconds, losses)."""
    torch.manual_seed(c.seed)
    torch.set_num_threads(c.threads)
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    model = GPT(c)
    master = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    model.to(torch.bfloat16)
    decay = [m for m in master if m.dim() == 2]
    no_decay = [m for m in master if m.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": c.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=c.lr, betas=c.betas, foreach=False)  # fmt: skip
    gen = torch.Generator().manual_seed(c.seed + 1)
    kept: dict[int, State] = {}
    losses: dict[int, float] = {}
    t0 = time.perf_counter()
    last = max(c.kept())
    for step in range(1, last + 1):
        for g in opt.param_groups:
            g["lr"] = c.lr * min(1.0, step / c.warmup)
        starts = torch.randint(0, data.numel() - c.context - 1, (c.batch,), generator=gen)
        rows = torch.stack([data[s : s + c.context + 1] for s in starts.tolist()]).long()
        logits = model(rows[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, c.vocab), rows[:, 1:].reshape(-1))
        loss.backward()
        with torch.no_grad():
            for p, m in zip(model.parameters(), master):
                m.grad = p.grad.float()
                p.grad = None
            opt.step()
            for p, m in zip(model.parameters(), master):
                p.copy_(m)  # round to nearest even: the bf16 copy the next step computes with
        if step % 50 == 0 or step in c.kept():
            losses[step] = round(loss.item(), 4)
            if log:
                print(f"train: step {step}/{last} loss {loss.item():.3f} "
                      f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
        if step in c.kept():
            kept[step] = _snapshot(model, master, opt)
    info = {"seconds": round(time.perf_counter() - t0, 1), "losses": losses,
            "params": sum(p.numel() for p in model.parameters())}  # fmt: skip
    return kept, info


def states(c: TrainConfig | None = None, log: bool = True) -> tuple[dict[int, State], dict[str, object]]:
    """The kept states of ``c`` (defaults: TrainConfig()) from the cache, training them first
    when they are not there. The info says where they are, whether they came from the cache,
    and how long training took (when it ran, or when the cached run ran)."""
    c = c or TrainConfig()
    text = corpus()
    d = cache_dir(c, text)
    meta_path = os.path.join(d, "meta.json")
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        kept = {s: torch.load(os.path.join(d, f"step-{s}.pt"), weights_only=True) for s in c.kept()}
        return kept, {**meta, "cached": True, "dir": d}
    if log:
        print(f"train: {c} on {len(text) / 1e6:.1f} MB of stdlib source; caching in {d}", file=sys.stderr)
    kept, info = train(c, text, log)
    os.makedirs(d, exist_ok=True)
    for s, st in kept.items():
        torch.save(st, os.path.join(d, f"step-{s}.pt.tmp"))
        os.replace(os.path.join(d, f"step-{s}.pt.tmp"), os.path.join(d, f"step-{s}.pt"))
    meta = {"config": dataclasses.asdict(c), "text_bytes": len(text), "torch": torch.__version__,
            "train_seconds": info["seconds"], "losses": info["losses"], "params": info["params"]}  # fmt: skip
    with open(meta_path + ".tmp", "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(meta_path + ".tmp", meta_path)  # written last: its presence means the states are whole
    return kept, {**meta, "cached": False, "dir": d}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=TrainConfig.steps, help="S, the first kept step")
    ap.add_argument("--layers", type=int, default=TrainConfig.layers)
    ap.add_argument("--d-model", type=int, default=TrainConfig.d_model)
    ap.add_argument("--batch", type=int, default=TrainConfig.batch)
    a = ap.parse_args()
    c = TrainConfig(steps=a.steps, layers=a.layers, d_model=a.d_model, batch=a.batch)
    kept, info = states(c)
    print(json.dumps({k: v for k, v in info.items()}, indent=1))
    for s, st in kept.items():
        print(f"step {s}: {len(st)} tensors, {sum(t.numel() * t.element_size() for t in st.values()) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
