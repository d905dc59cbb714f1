# SPDX-License-Identifier: Apache-2.0
"""Loads where several ranks of a host read the same bytes: read through the page cache, each
rank starting at its own part of the bytes, so that each byte comes off the device once."""

from __future__ import annotations

import os
import sys
from typing import Any

from .._tree import flatten
from ._comm import resolve, running
from ._dist import classify_like

__all__ = ["Share", "plan", "read", "last", "storage_read"]


class Share:
    """This rank's place among the ``size`` ranks that read the same bytes: ``index`` (0 ..
    size - 1) says which 1/size of them it reads first."""

    __slots__ = ("index", "size")

    def __init__(self, index: int, size: int) -> None:
        self.index = index
        self.size = size

    def __repr__(self) -> str:
        return f"Share({self.index}, {self.size})"


#: The last shared read of this process: {"index", "size", "parts": [bytes per read call, in
#: the order they ran], "tensors": [the tensor indices of each call], "first": the byte offset
#: within the load's regions it started at}.
last: dict[str, Any] | None = None


def _host(world: tuple[int, int]) -> tuple[int, int]:
    """(rank, size) among the ranks of this host when the launcher says (torchrun's LOCAL_RANK
    and LOCAL_WORLD_SIZE): the page cache is the host's, so the rotation is too."""
    try:
        local, size = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return world
    return (local, size) if 0 <= local < size <= world[1] else world


def _replica_group(d: Any) -> tuple[int, int]:
    """(index, size) of this rank among the ranks of DTensor ``d``'s mesh that hold the same
    box: its coordinate over the mesh dimensions the placements replicate."""
    from torch.distributed.tensor import Replicate

    coord = d.device_mesh.get_coordinate() or []
    index, size = 0, 1
    for dim, p in enumerate(d.placements):
        if type(p) is Replicate:
            n = int(d.device_mesh.size(dim))
            index = index * n + int(coord[dim])
            size *= n
    return index, size


def plan(comm: Any, like: Any, io_options: dict[str, Any]) -> Share | None:
    """How this rank shares its reads in load(path, like=like, comm=comm), or None to read as
    one process does (O_DIRECT where it can). Shared when most of the bytes this rank loads are
    loaded by other ranks too: without like= or with plain tensors every rank of ``comm`` loads
    everything (replicated state); DTensors share along the mesh dimensions they replicate.
    ``direct=True`` keeps O_DIRECT: the caller asked for it."""
    if io_options.get("direct") is True or io_options.get("mmap"):
        return None
    ranks = resolve(comm, collective=False)
    world = (ranks.rank, ranks.size) if ranks is not None else None
    if world is None:
        torch_ranks = running("torch")
        if torch_ranks is None or torch_ranks.size < 2:
            return None  # one process: nothing to share
    if like is None:
        world = _host(world) if world is not None else None
        return Share(*world) if world is not None and world[1] > 1 else None
    dtensor = None
    if "torch.distributed.tensor" in sys.modules:
        dtensor = getattr(sys.modules["torch.distributed.tensor"], "DTensor", None)
    _root, leaves = flatten(like, classify=classify_like)
    shared = private = 0
    group: tuple[int, int] | None = None
    for _name, obj, _node in leaves:
        if dtensor is not None and isinstance(obj, dtensor):
            g = _replica_group(obj)
            n = int(obj.to_local().nbytes)
            if g[1] > 1:
                shared += n
                group = group or g
            else:
                private += n
        else:
            n = int(getattr(obj, "nbytes", 0) or 0)
            if world is not None and world[1] > 1 and not hasattr(obj, "sharding"):
                shared += n
            else:
                private += n  # a jax array spanning processes reads its own devices' boxes
    if shared == 0 or shared < private:
        return None
    if group is None and world is not None:
        group = _host(world)
    return Share(*group) if group is not None and group[1] > 1 else None


def read(r: Any, regions: list[Any], share: Share) -> None:
    """Read ``regions`` with core reader ``r`` (buffered) as reader ``share.index`` of
    ``share.size`` (ckptio_reader_read_shared): the library cuts the read into size x k parts
    (k up to 8, parts of 32 MiB or more) and this rank reads parts index, index + 1, ...
    wrapping around. At each step the ranks are on neighbouring parts, the one ahead reading a
    new part off the device while the others copy parts it or they have just brought into the
    page cache: the device reads spread over the whole load and overlap the copies. ``last``
    records the parts as the library reports them."""
    global last
    rounds, first, parts = r.read_shared(regions, share.index, share.size)
    last = {"index": share.index, "size": share.size, "parts": [p[2] for p in parts],
            "tensors": [[int(regions[i][0]) for i in range(p[0], p[0] + p[1])] for p in parts],
            "first": first, "rounds": rounds}  # fmt: skip


def storage_read() -> int:
    """Bytes this process (its threads and io_uring's workers too) has read from storage
    (Linux's /proc/self/io), -1 where unknown: across a load, what it took off the device; the
    rest came from the page cache."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1
