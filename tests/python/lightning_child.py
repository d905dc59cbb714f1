# SPDX-License-Identifier: Apache-2.0
"""A tiny deterministic Lightning run for test_lightning.py; as a script, a run that SIGKILLs itself in the middle of writing its Nth checkpoint.

    python lightning_child.py ROOT MODE EPOCHS KILL_AT     (MODE: sync or async)
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import ckptio.lightning

STEPS_PER_EPOCH = 8
#: The size of the model's extra buffer in the child, and how much of a torch file it writes
#: before it dies.
PAD_MIB = 32
KILL_AFTER = 16 << 20


class Tiny(L.LightningModule):
    """A small regression with SGD and momentum (optimizer state a resume must restore);
    ``pad_mib`` adds a buffer of that size, so that a save spans many of the writer's writes."""

    def __init__(self, pad_mib: int = 0) -> None:
        super().__init__()
        if pad_mib:
            self.register_buffer("pad", torch.arange(pad_mib << 18, dtype=torch.float32))
        layers = (torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.net = torch.nn.Sequential(*layers)
        self.losses: dict[int, float] = {}  # global step -> loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses[self.global_step] = loss.item()
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def data() -> torch.utils.data.DataLoader[Any]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4 * STEPS_PER_EPOCH, 8, generator=g)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(4 * STEPS_PER_EPOCH, 1, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)


def model(pad_mib: int = 0) -> Tiny:
    L.seed_everything(0, verbose=False)
    return Tiny(pad_mib)


def trainer(epochs: int, plugins: list[Any] | None = None, ckpt_dir: str | None = None,
            **checkpoint: Any) -> L.Trainer:  # fmt: skip
    """A CPU trainer; with ``ckpt_dir``, a ModelCheckpoint there keeping the 2 newest steps
    (plus ``checkpoint``'s options) at every epoch's end."""
    callbacks = []
    if ckpt_dir is not None:
        callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, monitor="step", mode="max",
                                         save_top_k=2, every_n_epochs=1, **checkpoint))  # fmt: skip
    return L.Trainer(
        max_epochs=epochs, accelerator="cpu", devices=1, plugins=plugins, callbacks=callbacks,
        enable_checkpointing=ckpt_dir is not None, logger=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True, num_sanity_val_steps=0,
    )  # fmt: skip


def _kill_in_write(mode: str) -> None:
    """The next save dies with SIGKILL once part of its data is on disk, before its commit."""
    if mode == "sync":
        from ckptio import torch as ct

        real = ct._core.ZipWriter

        class Dying:  # the zip writer, killed at its first record after KILL_AFTER bytes
            def __init__(self, *args: Any) -> None:
                self._w = real(*args)
                self._n = 0

            def __enter__(self) -> Dying:
                self._w.__enter__()
                return self

            def __exit__(self, *exc: Any) -> Any:
                return self._w.__exit__(*exc)

            def add(self, name: str, data: Any, *args: Any) -> Any:
                if self._n >= KILL_AFTER:
                    os.kill(os.getpid(), signal.SIGKILL)
                self._n += len(memoryview(data).cast("B"))
                return self._w.add(name, data, *args)

            def __getattr__(self, name: str) -> Any:
                return getattr(self._w, name)

        ct._core.ZipWriter = Dying  # type: ignore[misc]
    else:
        from ckptio import torch as ct

        real_start = ct._start_zip_commit

        def dying(snap: Any, zw: Any, records: Any) -> Any:
            # The engine's thread writes the archive: SIGKILL once its first bytes are in the
            # temporary file (allocated whole at its start: its data shows the writes).
            c = real_start(snap, zw, records)
            root = sys.argv[1]
            while True:
                for name in os.listdir(root):
                    if ".tmp-" in name:
                        with open(os.path.join(root, name), "rb") as f:
                            if f.read(4) == b"PK\x03\x04":
                                os.kill(os.getpid(), signal.SIGKILL)
                if c.done():
                    return c  # written before any write was seen: the test says so

        ct._start_zip_commit = dying  # type: ignore[assignment]


def main() -> None:
    root, mode, epochs, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    # Async: 1 MiB of staging, so that the engine's thread writes the 32 MiB file in many
    # writes, the first long before the commit (the window the kill aims at).
    opts = {"staging_bytes": 1 << 20} if mode == "async" else None
    io = ckptio.lightning.CheckpointIO(async_save=mode == "async", io_options=opts)
    real_save = io.save_checkpoint
    calls = 0

    def save(*args: Any, **kwargs: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == kill_at:
            _kill_in_write(mode)
        real_save(*args, **kwargs)

    io.save_checkpoint = save  # type: ignore[method-assign]
    trainer(epochs, [io], root, save_last=True).fit(model(PAD_MIB), data())


if __name__ == "__main__":
    main()
