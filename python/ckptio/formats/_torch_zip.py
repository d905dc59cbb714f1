# SPDX-License-Identifier: Apache-2.0
"""torch.save's archive layout: the records that follow torch's pickle, in torch's order.

One definition for every torch archive ckptio writes: ckptio.torch.save and save_async (the
storages from torch's pickling) and the conversion to a torch file (ckptio._convert's
TorchSink, whose storages stream from a checkpoint).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["records"]


def records(pkl: bytes, storages: dict[str, Any], disable_byteorder: bool) -> list[tuple[str, Any]]:
    """The records of a torch archive, in the order torch.save writes them (without the
    common prefix): the pickle, torch's format records, each storage (an untyped storage),
    then what torch's archive writer adds at its end."""
    import torch

    alignment = getattr(torch.serialization, "_get_storage_alignment", lambda: 64)()
    out: list[tuple[str, Any]] = [
        ("data.pkl", pkl), (".format_version", b"1"), (".storage_alignment", str(alignment).encode()),
    ]  # fmt: skip
    if not disable_byteorder:
        out.append(("byteorder", sys.byteorder.encode()))
    out += [(f"data/{key}", s) for key, s in storages.items()]
    out.append(("version", b"3\n"))
    if disable_byteorder:
        out.append(("byteorder", sys.byteorder.encode()))
    out.append((".data/serialization_id", _serialization_id().encode()))
    return out


def _serialization_id() -> str:
    """Forty digits, as torch's writer gives each archive (torch.load logs it)."""
    import secrets

    return f"{secrets.randbits(64):020d}{secrets.randbits(64):020d}"
