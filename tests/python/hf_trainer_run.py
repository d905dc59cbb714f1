# SPDX-License-Identifier: Apache-2.0
"""A tiny Hugging Face Trainer run for test_hf_trainer.py; as a script: killed mid-save, or 2 ranks.

A 2-layer GPT-2 built from a config and 24 fixed token sequences (no hub, no datasets), on the
CPU. ``python hf_trainer_run.py OUT --kill-at N`` trains with ckptio.hf installed and SIGKILLs
itself inside the checkpoint save of step N, once the model and optimizer files are written,
before the RNG state and the trainer state are.

Under ``torchrun --nproc-per-node 2``, ``hf_trainer_run.py OUT --ranks`` trains on two gloo ranks
(saving), then resumes a second Trainer from checkpoint-4, and prints on rank 0 a JSON line:
whether the resumed run ended with the first one's weights, and the checkpoint's files.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from typing import Any

import torch
import transformers

import ckptio.hf

MAX_STEPS = 6
SAVE_STEPS = 2


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """24 fixed sequences of 8 tokens, each its own label (causal LM)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1234)
        self.ids = torch.randint(0, 64, (24, 8), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_model() -> Any:
    transformers.set_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    return transformers.GPT2LMHeadModel(cfg)


def make_trainer(out: str, *, install: bool = True, evaluate: bool = False, **args: Any) -> Any:
    """A Trainer on the tiny model, saving every SAVE_STEPS steps (dropout on, so resuming
    exactly needs the RNG state back); ``evaluate``: with an evaluation set (the same data)."""
    kw: dict[str, Any] = {
        "output_dir": out,
        "max_steps": MAX_STEPS,
        "save_strategy": "steps",
        "save_steps": SAVE_STEPS,
        "per_device_train_batch_size": 2,
        "learning_rate": 1e-3,
        "warmup_steps": 1,
        "logging_steps": 1,
        "report_to": [],
        "use_cpu": True,
        "disable_tqdm": True,
        "seed": 0,
        "dataloader_num_workers": 0,
    }
    kw.update(args)
    trainer = transformers.Trainer(
        model=tiny_model(),
        args=transformers.TrainingArguments(**kw),
        train_dataset=Tokens(),
        eval_dataset=Tokens() if evaluate else None,
    )
    return ckptio.hf.install(trainer) if install else trainer


def losses(trainer: Any) -> dict[int, float]:
    """The training loss logged at each step."""
    return {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}


def kill_at(trainer: Any, step: int) -> None:
    """SIGKILL this process in the checkpoint save of ``step`` (see the module)."""
    inner = trainer._save_rng_state

    def save_rng_state(output_dir: str) -> None:
        if trainer.state.global_step == step:
            os.kill(os.getpid(), signal.SIGKILL)
        inner(output_dir)

    trainer._save_rng_state = save_rng_state


def ranks(out: str) -> None:
    first = make_trainer(os.path.join(out, "a"), ddp_backend="gloo")
    first.train()
    again = make_trainer(os.path.join(out, "b"), ddp_backend="gloo")
    again.train(resume_from_checkpoint=os.path.join(out, "a", "checkpoint-4"))
    a, b = first.model.state_dict(), again.model.state_dict()
    if first.args.process_index == 0:
        same = sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
        dirs = sorted(os.listdir(os.path.join(out, "a")))
        files = sorted(os.listdir(os.path.join(out, "a", "checkpoint-4")))
        print("RESULT " + json.dumps({"same": same, "dirs": dirs, "files": files}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ranks", action="store_true")
    ap.add_argument("--kill-at", type=int)
    a = ap.parse_args()
    if a.ranks:
        return ranks(a.out)
    trainer = make_trainer(a.out)
    kill_at(trainer, a.kill_at)
    trainer.train()
    raise SystemExit("the run was not killed")


if __name__ == "__main__":
    main()
