# SPDX-License-Identifier: Apache-2.0
"""Communicators for distributed saves: torch.distributed, JAX's distributed client, mpi4py.

A communicator moves bytes between the ranks of one save. ``resolve(comm)`` turns what the user
passed as ``comm=`` into one; the C extension wraps it in a ``ckptio_comm`` table
(python/ckptio/_comm.c) whose callbacks call these methods, with the GIL taken for each call.

Every method is collective (all ranks call it, in the same order, with the same root), takes
``timeout`` in seconds, and raises TimeoutError when the other ranks did not all arrive in time,
ConnectionError for a transport failure. After any exception the communicator is unusable.

>>> c = resolve(None)  # one process: no communicator at all
>>> c is None
True
"""

from __future__ import annotations

import itertools
import sys
import time
from datetime import timedelta
from typing import Any, Literal, NamedTuple, Protocol, overload, runtime_checkable

from .. import _errors

__all__ = [
    "Communicator",
    "TorchCommunicator",
    "JaxCommunicator",
    "MPICommunicator",
    "Ranks",
    "resolve",
    "running",
]


@runtime_checkable
class Communicator(Protocol):
    """What ckptio needs from a runtime: this process's ``rank`` of ``size``, and three
    collective byte operations, each bounded by ``timeout`` seconds."""

    rank: int
    size: int

    def barrier(self, timeout: float) -> None:
        """Return once every rank has entered."""
        ...

    def broadcast(self, root: int, data: bytes | None, timeout: float) -> bytes:
        """The root passes its bytes; every rank returns them (the others pass None)."""
        ...

    def gather(self, root: int, data: bytes, timeout: float) -> list[bytes] | None:
        """Each rank's bytes, in rank order, on the root; None elsewhere."""
        ...


def _left(deadline: float) -> float:
    # Each step of an operation gets what remains of its timeout, never 0: the runtime still
    # gets a positive time to fail by.
    return max(deadline - time.monotonic(), 1e-3)


# --- torch.distributed ---------------------------------------------------------------------

_gloo_groups: dict[Any, Any] = {}

# How long a gloo group that ckptio creates lets an operation run in its worker thread. Each
# call is bounded by its own timeout regardless (Work.wait(timeout)); this bound only limits how
# long an abandoned operation keeps the group's thread busy.
GLOO_GROUP_TIMEOUT = timedelta(minutes=5)


def _torch_error(e: BaseException, op: str, rank: int, size: int) -> Exception:
    msg = f"torch.distributed {op} on rank {rank} of {size}: {e}"
    text = str(e).lower()
    if "timed out" in text or "timeout" in text or "deadline" in text:
        return TimeoutError(msg)
    if "closed" in text or "reset" in text or "broken pipe" in text:
        return ConnectionResetError(msg)
    return ConnectionError(msg)


class TorchCommunicator:
    """torch.distributed, over a gloo group and uint8 CPU tensors (no pickle).

    If ``group`` (default: the default group) is not a gloo group (NCCL, or a mixed
    ``cpu:gloo,cuda:nccl`` one), a gloo group over the same ranks is created once and cached;
    ``new_group`` is collective over the whole default group, so every rank of the job must
    resolve the same group in the same order.

    Timeouts: every operation is issued with ``async_op=True`` and waited for with
    ``Work.wait(timeout=...)``, given what remains of the call's ``timeout``, so a call returns
    (raising TimeoutError) within its timeout whatever the group's own timeout. The abandoned
    operation still runs in the group's worker thread until the group's timeout (gloo has no
    cancel), which is why the communicator is unusable afterwards. The barrier is
    ``monitored_barrier``, whose error names the ranks that did not arrive.
    """

    def __init__(self, group: Any = None) -> None:
        import torch
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise _errors.error(
                _errors.STATE,
                "comm='torch' needs torch.distributed initialized: call "
                "torch.distributed.init_process_group() on every rank first",
            )
        self._torch = torch
        self._dist = dist
        base = group if group is not None else dist.group.WORLD
        self.rank: int = dist.get_rank(base)
        self.size: int = dist.get_world_size(base)
        if self.rank < 0:
            raise _errors.error(
                _errors.USAGE, "this process is not a member of the torch.distributed group"
            )
        self._base = base  # keeps the id that resolve() caches by alive
        self._global = [dist.get_global_rank(base, r) for r in range(self.size)]
        if dist.get_backend(base) == "gloo":
            self._group = base
        else:
            if base not in _gloo_groups:
                _gloo_groups[base] = dist.new_group(
                    ranks=self._global, backend="gloo", timeout=GLOO_GROUP_TIMEOUT
                )
            self._group = _gloo_groups[base]

    def _wait(self, work: Any, deadline: float, op: str) -> None:
        try:
            work.wait(timeout=timedelta(seconds=_left(deadline)))
        except RuntimeError as e:
            raise _torch_error(e, op, self.rank, self.size) from e

    def barrier(self, timeout: float) -> None:
        try:
            self._dist.monitored_barrier(
                group=self._group, timeout=timedelta(seconds=timeout), wait_all_ranks=True
            )
        except RuntimeError as e:
            raise _torch_error(e, "barrier", self.rank, self.size) from e

    def broadcast(self, root: int, data: bytes | None, timeout: float) -> bytes:
        torch, dist = self._torch, self._dist
        deadline = time.monotonic() + timeout
        mine = self.rank == root
        n = torch.tensor([len(data) if mine and data else 0], dtype=torch.int64)
        src = self._global[root]
        self._wait(dist.broadcast(n, src=src, group=self._group, async_op=True), deadline,
                   "broadcast")
        size = int(n.item())
        if size == 0:
            return b""
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if mine and data else \
            torch.empty(size, dtype=torch.uint8)
        self._wait(dist.broadcast(buf, src=src, group=self._group, async_op=True), deadline,
                   "broadcast")
        return bytes(data) if mine and data else buf.numpy().tobytes()

    def gather(self, root: int, data: bytes, timeout: float) -> list[bytes] | None:
        torch, dist = self._torch, self._dist
        deadline = time.monotonic() + timeout
        # Every rank learns every length (8 bytes a rank), so all pad to the same maximum.
        lens = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        mine = torch.tensor([len(data)], dtype=torch.int64)
        self._wait(dist.all_gather(lens, mine, group=self._group, async_op=True), deadline,
                   "gather")
        sizes = [int(t.item()) for t in lens]
        longest = max(sizes)
        is_root = self.rank == root
        if longest == 0:
            return [b""] * self.size if is_root else None
        send = torch.zeros(longest, dtype=torch.uint8)
        if data:
            send[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        recv = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.size)] if is_root \
            else None
        self._wait(
            dist.gather(send, recv, dst=self._global[root], group=self._group, async_op=True),
            deadline, "gather")
        if recv is None:
            return None
        return [t[:s].numpy().tobytes() for t, s in zip(recv, sizes)]


# --- JAX ------------------------------------------------------------------------------------

_jax_ids = itertools.count()


def _jax_error(e: BaseException, op: str, rank: int, size: int) -> Exception:
    msg = f"jax distributed {op} on process {rank} of {size}: {e}"
    if "DEADLINE_EXCEEDED" in str(e):
        return TimeoutError(msg)
    return ConnectionError(msg)


class JaxCommunicator:
    """JAX multi-process, through the key-value store of jax.distributed's client.

    Each operation writes its bytes under keys unique to this communicator and operation (a
    counter every rank advances in step) and reads them with ``blocking_key_value_get_bytes``
    bounded by the call's timeout; the barrier is ``wait_at_barrier`` with ``timeout_in_ms``.
    Keys are deleted once every reader is known to have read them — gathered keys by the root
    as it reads them, broadcast keys by their writer after the next barrier or gather it roots —
    so a long job does not grow the store.
    """

    def __init__(self, name: str | None = None) -> None:
        """``name``: the keys' namespace, the same on every process (then processes need not
        make their communicators in the same order); default: the next of this process's."""
        from jax._src import distributed

        state = distributed.global_state
        if state.client is None:
            raise _errors.error(
                _errors.STATE,
                "comm='jax' needs jax.distributed.initialize() called on every process first",
            )
        self._client = state.client
        self.rank: int = int(state.process_id)
        self.size: int = int(state.num_processes)
        self._prefix = f"ckptio/{name}/" if name else f"ckptio/comm{next(_jax_ids)}/"
        self._seq = 0
        self._pending: list[str] = []  # broadcast keys this rank wrote that others may still read

    def _key(self, op: str) -> str:
        self._seq += 1
        return f"{self._prefix}{self._seq}/{op}"

    def _ms(self, deadline: float) -> int:
        return max(int(_left(deadline) * 1000), 1)

    def _cleanup(self) -> None:
        # Everyone has finished every earlier operation: our broadcast keys are read.
        for key in self._pending:
            self._client.key_value_delete(key)
        self._pending.clear()

    def barrier(self, timeout: float) -> None:
        key = self._key("barrier")
        try:
            self._client.wait_at_barrier(key, max(int(timeout * 1000), 1))
        except Exception as e:
            raise _jax_error(e, "barrier", self.rank, self.size) from e
        self._cleanup()

    def broadcast(self, root: int, data: bytes | None, timeout: float) -> bytes:
        key = self._key("bcast")
        deadline = time.monotonic() + timeout
        try:
            if self.rank == root:
                self._client.key_value_set_bytes(key, bytes(data or b""))
                self._pending.append(key)
                return bytes(data or b"")
            return bytes(self._client.blocking_key_value_get_bytes(key, self._ms(deadline)))
        except Exception as e:
            raise _jax_error(e, "broadcast", self.rank, self.size) from e

    def gather(self, root: int, data: bytes, timeout: float) -> list[bytes] | None:
        base = self._key("gather")
        deadline = time.monotonic() + timeout
        try:
            if self.rank != root:
                self._client.key_value_set_bytes(f"{base}/{self.rank}", bytes(data))
                return None
            out = []
            for r in range(self.size):
                if r == root:
                    out.append(bytes(data))
                    continue
                key = f"{base}/{r}"
                out.append(bytes(self._client.blocking_key_value_get_bytes(key, self._ms(deadline))))
                self._client.key_value_delete(key)
        except Exception as e:
            raise _jax_error(e, "gather", self.rank, self.size) from e
        self._cleanup()
        return out


# --- mpi4py ---------------------------------------------------------------------------------

_mpi_comms: dict[int, MPICommunicator] = {}


class MPICommunicator:
    """mpi4py, on a duplicate of ``comm`` (default COMM_WORLD) so that ckptio's messages never
    match the application's. Non-blocking collectives (Ibarrier, Igather + Igatherv, Ibcast)
    are polled against the deadline, so a missing rank raises TimeoutError instead of hanging.
    MPI cannot cancel a collective: after a timeout the request and its buffers are kept alive
    for the life of the communicator, which is unusable from then on."""

    def __init__(self, comm: Any = None) -> None:
        from mpi4py import MPI

        self._MPI = MPI
        base = comm if comm is not None else MPI.COMM_WORLD
        self._comm = base.Dup()
        self.rank: int = self._comm.Get_rank()
        self.size: int = self._comm.Get_size()
        self._abandoned: list[tuple[Any, ...]] = []

    def _wait(self, req: Any, deadline: float, op: str, *buffers: Any) -> None:
        delay = 1e-5
        while not req.Test():
            if time.monotonic() >= deadline:
                self._abandoned.append((req, *buffers))
                raise TimeoutError(
                    f"MPI {op} on rank {self.rank} of {self.size}: the other ranks did not all "
                    "arrive in time"
                )
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)

    def barrier(self, timeout: float) -> None:
        self._wait(self._comm.Ibarrier(), time.monotonic() + timeout, "barrier")

    def broadcast(self, root: int, data: bytes | None, timeout: float) -> bytes:
        import numpy as np

        deadline = time.monotonic() + timeout
        mine = self.rank == root
        n = np.array([len(data) if mine and data else 0], dtype=np.int64)
        self._wait(self._comm.Ibcast(n, root=root), deadline, "broadcast", n)
        size = int(n[0])
        if size == 0:
            return b""
        buf = np.frombuffer(bytearray(data), dtype=np.uint8) if mine and data else \
            np.empty(size, dtype=np.uint8)
        self._wait(self._comm.Ibcast(buf, root=root), deadline, "broadcast", buf)
        return bytes(data) if mine and data else buf.tobytes()

    def gather(self, root: int, data: bytes, timeout: float) -> list[bytes] | None:
        import numpy as np

        MPI = self._MPI
        deadline = time.monotonic() + timeout
        is_root = self.rank == root
        mine = np.array([len(data)], dtype=np.int64)
        sizes = np.zeros(self.size, dtype=np.int64) if is_root else None
        self._wait(self._comm.Igather(mine, sizes, root=root), deadline, "gather", mine, sizes)
        send = np.frombuffer(bytearray(data), dtype=np.uint8) if data else \
            np.empty(0, dtype=np.uint8)
        recv: Any = None
        if is_root:
            assert sizes is not None
            displs = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
            buf = np.empty(int(sizes.sum()), dtype=np.uint8)
            recv = [buf, (sizes.tolist(), displs.tolist()), MPI.BYTE]
        self._wait(self._comm.Igatherv([send, MPI.BYTE], recv, root=root), deadline, "gather",
                   send, recv)
        if not is_root:
            return None
        assert sizes is not None
        return [buf[d : d + s].tobytes() for d, s in zip(displs.tolist(), sizes.tolist())]


def _mpi_for(comm: Any) -> MPICommunicator:
    # One duplicate per MPI communicator (Dup is collective and comms are few).
    handle = int(comm.py2f())
    if handle not in _mpi_comms:
        _mpi_comms[handle] = MPICommunicator(comm)
    return _mpi_comms[handle]


# --- resolve --------------------------------------------------------------------------------

_defaults: dict[str, Communicator] = {}


class Ranks(NamedTuple):
    """This process's ``rank`` among the ``size`` ranks of a communicator, read without
    creating any group: what ``resolve(comm, collective=False)`` gives."""

    rank: int
    size: int


def _refuse_name(comm: str) -> Exception:
    return _errors.error(
        _errors.USAGE,
        f"comm={comm!r}: use 'torch', 'jax', 'mpi', a torch.distributed ProcessGroup, an "
        "mpi4py communicator or a ckptio Communicator",
    )


def _refuse_type(comm: Any) -> Exception:
    return _errors.error(
        _errors.USAGE,
        f"comm= got a {type(comm).__name__}: pass 'torch', 'jax', 'mpi', a torch.distributed "
        "ProcessGroup, an mpi4py communicator or an object with rank, size, barrier, broadcast "
        "and gather (ckptio's Communicator)",
        _errors.InvalidType,
    )


def running(runtime: str) -> Ranks | None:
    """This process's Ranks in the default group of ``runtime`` ("torch" or "jax") when that
    runtime's distributed side is already up, else None; asked of the modules already imported,
    so nothing is started (jax.process_count() would start a backend)."""
    if runtime == "torch":
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        return Ranks(int(dist.get_rank()), int(dist.get_world_size()))
    if runtime == "jax":
        state = getattr(sys.modules.get("jax._src.distributed"), "global_state", None)
        size = int(getattr(state, "num_processes", None) or 0)
        return Ranks(int(getattr(state, "process_id", None) or 0), size) if size else None
    raise _refuse_name(runtime)


def _ranks(comm: Any) -> Ranks | None:
    """resolve(comm, collective=False): the same kinds of ``comm=``, the same refusals."""
    if comm is None:
        return None
    if isinstance(comm, str):
        if comm == "torch":
            import torch.distributed as dist

            return Ranks(int(dist.get_rank()), int(dist.get_world_size()))
        if comm == "jax":
            import jax

            return Ranks(int(jax.process_index()), int(jax.process_count()))
        if comm == "mpi":
            from mpi4py import MPI

            w = MPI.COMM_WORLD
            return Ranks(int(w.Get_rank()), int(w.Get_size()))
        raise _refuse_name(comm)
    module = type(comm).__module__ or ""
    if module.startswith("torch"):
        return Ranks(int(comm.rank()), int(comm.size()))
    if module.startswith("mpi4py"):
        return Ranks(int(comm.Get_rank()), int(comm.Get_size()))
    rank, size = getattr(comm, "rank", None), getattr(comm, "size", None)
    if isinstance(rank, int) and isinstance(size, int):
        return Ranks(rank, size)
    raise _refuse_type(comm)


@overload
def resolve(comm: Any) -> Communicator | None: ...
@overload
def resolve(comm: Any, *, collective: Literal[True]) -> Communicator | None: ...
@overload
def resolve(comm: Any, *, collective: Literal[False]) -> Ranks | None: ...


def resolve(comm: Any, *, collective: bool = True) -> Communicator | Ranks | None:
    """The communicator for ``comm=``: None (one process) stays None; "torch", "jax" or "mpi"
    is that runtime's default group; a torch.distributed ProcessGroup or an mpi4py
    communicator is wrapped; an object that already implements Communicator is used as is.
    Collective the first time a group is seen (it may create a gloo group or an MPI
    duplicate), so call it on every rank in the same order.

    ``collective=False`` (loads, which exchange nothing): only this process's Ranks (rank,
    size) in that group, read from the runtime at once; nothing is created or cached, so any
    rank may ask at any time."""
    if not collective:
        return _ranks(comm)
    if comm is None:
        return None
    if isinstance(comm, str):
        if comm not in ("torch", "jax", "mpi"):
            raise _refuse_name(comm)
        if comm not in _defaults:
            if comm == "torch":
                _defaults[comm] = TorchCommunicator()
            elif comm == "jax":
                _defaults[comm] = JaxCommunicator()
            else:
                from mpi4py import MPI

                _defaults[comm] = _mpi_for(MPI.COMM_WORLD)
        return _defaults[comm]
    module = type(comm).__module__ or ""
    if module.startswith("torch"):
        key = f"torch:{id(comm)}"
        if key not in _defaults:
            _defaults[key] = TorchCommunicator(comm)
        return _defaults[key]
    if module.startswith("mpi4py"):
        return _mpi_for(comm)
    if isinstance(comm, Communicator):
        return comm
    raise _refuse_type(comm)
