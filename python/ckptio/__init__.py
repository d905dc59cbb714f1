# SPDX-License-Identifier: Apache-2.0
"""ckptio: save and load training state (numpy, PyTorch, JAX) at the storage device's speed.

>>> import numpy as np, ckptio, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "step-1000")
>>> stats = ckptio.save({"w": np.ones((4, 4), np.float32), "step": 1000}, path)
>>> state = ckptio.load(path)
>>> state["step"], state["w"].dtype
(1000, dtype('float32'))

``ckptio.torch.save`` / ``ckptio.torch.load`` are drop-ins for torch.save / torch.load.

Floors, bottom to top (a module imports its own floor and those below, never one above, at
module level or inside a function; tests/python/test_structure.py checks it from the source):

- base: the engine binding (_core, the C extension) and what everything uses: _errors,
  _dtypes, _options, _tree (the tree walk, which reaches framework values through hooks the
  registry fills).
- framework common ground: frameworks/_base (the Adapter protocol, Target, Deferred, Aliases,
  the adapters by name) and frameworks/_gpu (device tensors through the library's GPU path).
- framework adapters: frameworks/_numpy, _torch, _jax, _cupy (DTensor targets in _torch).
- framework registry: frameworks/_registry, every adapter in the order leaves are matched.
- staging: _stage, a tree walked into the host buffers a save writes from.
- ranks: ranks/_comm (communicators and the one comm resolver, resolve()), ranks/_dist
  (Shard, RankLocal, the multi-rank save), ranks/_share (shared reads of replicated loads).
- save and load: _save, _mapped, _into, _load, _async, _tiers (the Manager's local, peer and
  persistent tiers), _manager.
- formats: the front ends of other layouts: safetensors, formats/_hf (which adds its reader
  to _load's), orbax, formats/_torch_state, formats/_torch_dcp, formats/_torch_zip, _convert (the ckptio
  command's `python -m ckptio._convert`).
- public: this module, ckptio.torch and __main__, and the training frameworks' hooks, each
  imported only by name: ckptio.deepspeed (DeepSpeed's checkpoint engine), ckptio.lightning
  (Lightning's CheckpointIO), ckptio.hf (the Hugging Face Trainer and accelerate).
"""

from __future__ import annotations

from typing import Any

from ._errors import (
    CheckpointError,
    CheckpointExists,
    CheckpointIOError,
    CheckpointNotFound,
    ChecksumMismatch,
    CorruptCheckpoint,
    DuplicateTensor,
    IncompleteTensor,
    Interrupted,
    InvalidRequest,
    InvalidType,
    LimitExceeded,
    NotACheckpoint,
    NotDurable,
    RegionOutOfRange,
    ShapeMismatch,
    TensorNotFound,
    Unsupported,
    UnsupportedDtype,
    UnsupportedFormat,
)
from . import _core
from ._load import Reader, TensorInfo, last_load_stats, load, open
from ._options import IO_OPTIONS, Stats
from ._save import save
from .ranks._dist import RankLocal, Shard
from ._async import AsyncSave, release_buffers, save_async
from ._manager import Manager
from .formats import _hf  # noqa: F401  (load and open read safetensors files through it)

__version__: str = "0.1.0"
#: The version of the linked C library and the newest on-disk format it reads and writes.
library_version: str = _core.version
format_version: int = _core.format_version

__all__ = [
    "save",
    "save_async",
    "Shard",
    "RankLocal",
    "AsyncSave",
    "release_buffers",
    "Manager",
    "load",
    "open",
    "Reader",
    "TensorInfo",
    "Stats",
    "IO_OPTIONS",
    "last_load_stats",
    "describe_system",
    "CheckpointError",
    "CheckpointExists",
    "CheckpointIOError",
    "CheckpointNotFound",
    "ChecksumMismatch",
    "CorruptCheckpoint",
    "DuplicateTensor",
    "IncompleteTensor",
    "Interrupted",
    "InvalidRequest",
    "InvalidType",
    "LimitExceeded",
    "NotACheckpoint",
    "NotDurable",
    "RegionOutOfRange",
    "ShapeMismatch",
    "TensorNotFound",
    "Unsupported",
    "UnsupportedDtype",
    "UnsupportedFormat",
]


def describe_system(directory: str | None = None) -> str:
    """What this build and system offer (backends, io_uring, O_DIRECT for ``directory``), as
    ``ckptio doctor`` prints it."""
    return str(_core.describe_system(directory) if directory else _core.describe_system())


def __getattr__(name: str) -> Any:
    # ckptio.torch is imported on first use, so `import ckptio` never imports torch.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'ckptio' has no attribute {name!r}")
