# SPDX-License-Identifier: Apache-2.0
"""ckptio.torch.load_state_dict: a module's or optimizer's state loaded into its own tensors."""

from __future__ import annotations

import os
from typing import Any

from .._errors import NOT_FOUND, error
from .._into import load_into
from .._load import Reader

PathLike = str | os.PathLike[str]


def load_state_dict(
    obj: Any, path: PathLike, *, strict: bool = True, key: str | None = None, **io_options: Any
) -> Any:
    """Load the state of ``obj`` (a torch.nn.Module or torch.optim.Optimizer) saved by
    ``ckptio.save(obj.state_dict(), path)`` (or under ``key`` of a larger tree) straight into
    its own tensors: parameters, buffers and optimizer state are filled in place (no new
    memory; the same tensor objects stay), after every shape and dtype was checked.

    A module returns torch's (missing_keys, unexpected_keys); with ``strict`` either being
    non-empty raises TensorNotFound before anything is loaded. An optimizer's state tensors
    are filled where the optimizer has them already (a step was taken), as
    torch.distributed.checkpoint.load does; the others are loaded fresh; then
    ``optimizer.load_state_dict`` takes the hyperparameters and those tensors (it keeps
    tensors of the right dtype and device as they are).

    >>> import torch, ckptio, ckptio.torch, tempfile, os
    >>> m = torch.nn.Linear(2, 2)
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt")
    >>> _ = ckptio.save(m.state_dict(), path)
    >>> w = m.weight
    >>> with torch.no_grad():
    ...     _ = m.weight.zero_()
    >>> ckptio.torch.load_state_dict(m, path)
    <All keys matched successfully>
    >>> m.weight is w and bool(m.weight.abs().sum() > 0)
    True
    """
    import torch

    sd = obj.state_dict()
    prefix = key + "." if key else ""
    with Reader(path, **io_options) as r:
        if isinstance(obj, torch.optim.Optimizer):
            return _optimizer(obj, r, sd, key)
        saved = {k[len(prefix) :] for k in r.keys() if k.startswith(prefix)}
        missing = [k for k in sd if k not in saved]
        unexpected = sorted(saved - set(sd))
        if strict and (missing or unexpected):
            raise error(
                NOT_FOUND,
                f"{r.path}: the state does not match the module: missing keys {missing[:8]}, "
                f"unexpected keys {unexpected[:8]}; nothing was loaded (strict=False loads "
                "the keys both have)",
            )
        into = {k: v for k, v in sd.items() if k in saved}
        load_into(r, {key: into} if key else into)
    from torch.nn.modules.module import _IncompatibleKeys

    return _IncompatibleKeys(missing, unexpected)


def _optimizer(opt: Any, r: Reader, sd: dict[str, Any], key: str | None) -> None:
    prefix = key + "." if key else ""
    has = {k for k in r.keys() if k.startswith(prefix + "state.")}
    found = {
        pid: st
        for pid, st in sd["state"].items()
        if any(k.startswith(f"{prefix}state.{pid}.") for k in has)
    }
    into = {"state": found, "param_groups": sd["param_groups"]}
    got = load_into(r, {key: into} if key else into)
    got = got[key] if key else got
    # State the optimizer does not have yet (no step taken): loaded fresh.
    saved_ids = {k[len(prefix + "state.") :].split(".")[0] for k in has}
    fresh = [f"{prefix}state.{i}" for i in sorted(saved_ids) if not _known(i, found)]
    if fresh:
        more = r.load(keys=fresh)
        more = more[key] if key else more
        got["state"].update(more["state"])
    opt.load_state_dict(got)


def _known(pid: str, found: dict[Any, Any]) -> bool:
    return any(str(k) == pid for k in found)
