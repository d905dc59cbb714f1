# SPDX-License-Identifier: Apache-2.0
"""ckptio.deepspeed: DeepSpeed's checkpoint engine through ckptio, one line after ``deepspeed.initialize``.

``install(engine)`` puts a ``CheckpointEngine`` under ``engine.save_checkpoint`` and
``engine.load_checkpoint``: every file DeepSpeed writes (model states, each rank's ZeRO
shards) is written by ``ckptio.torch.save`` (the torch zip archive stock ``torch.load`` and
DeepSpeed's own tools read, published only once complete and durable) and read back by
``ckptio.torch.load``. The ``latest`` tag is written only once every rank's files of the step
are durable, and durably itself (temporary file, fsync, rename, directory fsync), so a job
killed during a save resumes from the previous checkpoint. With ``decoupled=True`` a save
returns once the state is copied; the files are written in the background and committed at
DeepSpeed's next optimizer step (or ``wait()``), as DeepSpeed's decoupled engine does.

Run on every rank (the example needs DeepSpeed, so the doc test does not run it)::

    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    ckptio.deepspeed.install(engine)          # the one line
    engine.save_checkpoint("ckpts")           # ckpts/global_step<N>/..., ckpts/latest
    engine.load_checkpoint("ckpts")           # resumes from ckpts/latest

Written for DeepSpeed 0.19 (``deepspeed.runtime.checkpoint_engine``); ``install`` refuses an
engine that does not have the attributes it sets, naming them.
"""

from __future__ import annotations

import atexit
import os
import sys
import weakref
from typing import Any

from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointCommitInfo
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import (
    CheckpointEngine as _DeepSpeedCheckpointEngine,
)

from . import _core
from . import torch as _ctorch
from ._async import AsyncSave, HostPool, host_cap
from ._errors import CheckpointError
from ._options import fsync_path, params
from .ranks import _comm

__all__ = ["CheckpointEngine", "install", "LATEST", "WRITTEN_FOR"]

#: The tag file DeepSpeed's ``load_checkpoint`` reads when no tag is given.
LATEST = "latest"

#: The DeepSpeed series whose engine ``install`` knows.
WRITTEN_FOR = "0.19"

# What install() reads or sets on a DeepSpeed engine; one missing means a DeepSpeed this module
# was not written for, and install() says so instead of half-installing.
_ENGINE_ATTRS = (
    "checkpoint_engine",
    "save_checkpoint",
    "load_checkpoint",
    "save_non_zero_checkpoint",
    "global_rank",
    "local_rank",
    "use_node_local_storage",
    "zero_optimization_partition_weights",
    "_commit_decoupled_checkpoint",
)


def _decoupled_in(config_params: Any) -> bool:
    """Whether DeepSpeed's config asked for a decoupled checkpoint writer."""
    cfg = getattr(config_params, "checkpoint_config", None)
    writer = cfg.get("writer") if isinstance(cfg, dict) else None
    return bool(isinstance(writer, dict) and writer.get("decoupled"))


# How long a rank waits for the others at the end of a save: torch.distributed's default, so a
# rank that never comes is an error, as late as DeepSpeed's own collectives would report it.
_BARRIER_TIMEOUT = 1800.0


def _rank() -> int:
    ranks = _comm.running("torch")
    return ranks.rank if ranks is not None else 0


# Engines with background saves, whose files are finished at interpreter exit.
_LIVE: weakref.WeakSet[CheckpointEngine] = weakref.WeakSet()


def _at_exit() -> None:
    """Finish the files of background saves nobody waited for; ``latest`` is not moved (that
    needs every rank, which may be gone): call ``wait()`` or ``engine.destroy()`` for that."""
    for ce in list(_LIVE):
        try:
            ce._drain()
        except BaseException as e:
            print(f"ckptio.deepspeed: a background save failed: {e}", file=sys.stderr)


atexit.register(_at_exit)


class CheckpointEngine(_DeepSpeedCheckpointEngine):  # type: ignore[misc]
    """DeepSpeed's checkpoint engine interface, writing and reading through ckptio.

    ``save(state_dict, path)`` is ``ckptio.torch.save``: a torch zip archive, published at
    ``path`` only once complete and durable. ``load(path, map_location)`` is
    ``ckptio.torch.load`` (``weights_only=False``, as DeepSpeed's files hold its own objects).
    ``commit(info)`` waits for this rank's files, then for every rank's (a collective: DeepSpeed
    calls it on every rank), makes the step's directory durable and, on rank 0, writes the
    ``latest`` tag durably when ``info.save_latest``.

    ``io_options``: ckptio.torch.save's ``io_options`` (``backend``, ``direct``, ``fsync``,
    ``crc32``, ...). ``decoupled``: save in the background (``save`` returns once the state is
    pickled and its storages copied into the C engine's host buffers; ``commit`` waits for the
    writes, which run on the engine's threads); None follows DeepSpeed's config
    (``"checkpoint": {"writer": {"decoupled": true}}``). ``max_host_bytes`` caps the buffers
    of a checkpoint's copies (default: a quarter of physical memory); a file whose storages
    do not fit is written during its save() call. They are kept for the next checkpoint
    (``release_buffers()`` frees them).
    """

    def __init__(
        self,
        config_params: Any = None,
        *,
        io_options: dict[str, Any] | None = None,
        decoupled: bool | None = None,
        max_host_bytes: int | None = None,
    ) -> None:
        super().__init__(config_params)
        self.name = "ckptio"
        opts = dict(io_options or {})
        _ctorch._save_options(opts, {})  # unknown keys fail here, not at the first save
        self.io_options = opts
        self.decoupled = _decoupled_in(config_params) if decoupled is None else bool(decoupled)
        self._info: CheckpointCommitInfo | None = None
        self._save_latest = False
        host_cap(max_host_bytes)  # checked now, not at the first save
        self.max_host_bytes = max_host_bytes
        self._pending: list[AsyncSave] = []  # this checkpoint's background saves, by file
        # A pool of host buffers per file of a checkpoint (one save in flight per pool): the
        # files are written side by side, and the next checkpoint's copies reuse the buffers.
        self._pools: list[HostPool] = []
        # Set by install(): DeepSpeed then leaves `latest` to commit() (its own write of it has
        # no fsync), and this says whether the caller asked for it.
        self._latest_requested: bool | None = None
        _LIVE.add(self)

    # DeepSpeed's interface

    def create(self, info: CheckpointCommitInfo) -> None:
        """Start the checkpoint ``info.tag``; a decoupled one still pending is committed first."""
        if self._info is not None and self.decoupled:
            self.commit(self._info)
        # (A synchronous save that raised left its info here: it is dropped, never committed.)
        self._info = info
        want = self._latest_requested
        self._save_latest = bool(info.save_latest if want is None else want)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        os.makedirs(path, exist_ok=exist_ok)

    def save(self, state_dict: Any, path: str) -> None:
        """Write ``state_dict`` to ``path`` (torch zip); decoupled: copy it and write it later."""
        if not self.decoupled:
            _ctorch.save(state_dict, path, io_options=self.io_options)
            return
        slot = len(self._pending)
        if slot == len(self._pools):
            self._pools.append(HostPool())
        budget = host_cap(self.max_host_bytes)
        others = sum(pl.held() for i, pl in enumerate(self._pools) if i != slot)
        self._pending.append(_ctorch.start_async(
            state_dict, path, self.io_options, self._pools[slot], max(budget - others, 0)
        ))  # fmt: skip

    def load(self, path: str, map_location: Any = None) -> Any:
        self._drain()
        return _ctorch.load(path, map_location=map_location, weights_only=False)

    def commit(self, info: CheckpointCommitInfo) -> bool:
        """Make the checkpoint ``info.tag`` durable on every rank, then name it in ``latest``.

        Collective: every rank calls it. A rank whose save failed makes every rank raise, and
        ``latest`` keeps naming the previous checkpoint.
        """
        mine = self._info
        if mine is not None and (mine.tag, mine.save_dir) != (info.tag, info.save_dir):
            raise ValueError(
                f"ckptio.deepspeed: commit of tag {info.tag!r} in {info.save_dir!r}, but the "
                f"checkpoint being saved is {mine.tag!r} in {mine.save_dir!r}"
            )
        save_latest = self._save_latest if mine is not None else bool(info.save_latest)
        self._info = None
        error: BaseException | None = None
        try:
            self._drain()
        except BaseException as e:  # reported to the other ranks before it is raised
            error = e
        failed = self._any_rank(error is not None)
        if error is not None:
            raise error
        if failed:
            raise RuntimeError(
                f"ckptio.deepspeed: another rank failed to save checkpoint {info.tag!r} in "
                f"{info.save_dir!r}; {LATEST!r} still names the previous one"
            )
        if _rank() == 0:
            self._publish(info.save_dir, info.tag, save_latest)
        self._any_rank(False)  # every rank returns once `latest` is written
        return True

    def is_decoupled(self) -> bool:
        return self.decoupled

    def get_commit_info(self) -> CheckpointCommitInfo | None:
        return self._info if self.decoupled else None

    def cleanup(self) -> None:
        """Commit a decoupled checkpoint still pending (DeepSpeed calls this at destroy())."""
        self.wait()
        self.release_buffers()

    def preserves_storage_sharing(self) -> bool:
        return True

    # ckptio's additions

    def wait(self) -> None:
        """Commit the decoupled checkpoint still pending, if any (collective, like commit).

        A synchronous checkpoint whose save raised is never committed here.
        """
        if self._info is not None and self.decoupled:
            self.commit(self._info)

    # internals

    def release_buffers(self) -> None:
        """Free the host buffers kept for the next decoupled save (after waiting for this
        rank's saves in flight)."""
        self._drain()
        for pl in self._pools:
            pl.release()
        self._pools = []

    def _drain(self) -> None:
        """Wait for this rank's background saves; raise the first one's error (a ckptio error
        as a RuntimeError too, as ckptio.torch.save raises it)."""
        first: BaseException | None = None
        while self._pending:
            h = self._pending[0]
            try:
                h.wait()
            except KeyboardInterrupt:
                raise  # still in flight: a later call waits again
            except BaseException as e:
                if first is None:
                    first = e
            self._pending.pop(0)
        if isinstance(first, CheckpointError):
            first = _ctorch._as_runtime_error(first)
        if first is not None:
            raise first

    def _any_rank(self, failed: bool) -> bool:
        """Whether any rank failed (``failed`` is this one's); a barrier over every rank."""
        ranks = _comm.running("torch")
        if ranks is None or ranks.size == 1:
            return failed
        comm = _comm.resolve("torch")  # ckptio's group over the default one (gloo: CPU bytes)
        assert comm is not None
        flags = comm.gather(0, b"1" if failed else b"0", _BARRIER_TIMEOUT)
        verdict = (b"1" if flags and b"1" in flags else b"0") if ranks.rank == 0 else None
        return comm.broadcast(0, verdict, _BARRIER_TIMEOUT) == b"1"

    def _publish(self, save_dir: str, tag: str, save_latest: bool) -> None:
        """Rank 0, once every rank's files are durable: the step's directory, then ``latest``."""
        step = os.path.join(save_dir, tag)
        if os.path.isdir(step):
            # ckptio wrote its files durably; what DeepSpeed wrote beside them (the recovery
            # script) and the directory entries are made durable here.
            for entry in os.scandir(step):
                if entry.is_file(follow_symlinks=False):
                    fsync_path(entry.path)
            fsync_path(step)
        fsync_path(save_dir)
        if save_latest:
            write_latest(save_dir, tag)


def write_latest(save_dir: str, tag: str) -> None:
    """Write ``save_dir/latest`` naming ``tag``, durably: the old one stays until the new is."""
    with _core.FileWriter(os.path.join(save_dir, LATEST), params({}, overwrite=True)) as fw:
        fw.write(tag.encode())
        fw.commit()


def _check_engine(engine: Any) -> None:
    import deepspeed

    missing = [a for a in _ENGINE_ATTRS if not hasattr(engine, a)]
    if missing:
        raise TypeError(
            f"ckptio.deepspeed.install: {type(engine).__module__}.{type(engine).__name__} is not "
            f"a DeepSpeed engine this module knows (written for DeepSpeed {WRITTEN_FOR}.x, "
            f"installed: {deepspeed.__version__}): it has no {', '.join(missing)}. Pass the "
            "engine deepspeed.initialize returned"
        )
    old = engine.checkpoint_engine
    if not isinstance(old, _DeepSpeedCheckpointEngine):
        raise TypeError(
            "ckptio.deepspeed.install: engine.checkpoint_engine is "
            f"{type(old).__name__}, not a DeepSpeed CheckpointEngine (written for DeepSpeed "
            f"{WRITTEN_FOR}.x, installed: {deepspeed.__version__}): call install() after "
            "deepspeed.initialize"
        )


def install(
    engine: Any,
    *,
    io_options: dict[str, Any] | None = None,
    decoupled: bool | None = None,
    max_host_bytes: int | None = None,
) -> CheckpointEngine:
    """Make ``engine.save_checkpoint``/``load_checkpoint`` write and read through ckptio.

    Call it on every rank, right after ``deepspeed.initialize``. It replaces the engine's
    checkpoint engine (DeepSpeed keeps one reference to it, ``engine.checkpoint_engine``; a
    decoupled one DeepSpeed started is committed and its writer process stopped), recomputes
    which ranks write the model states as DeepSpeed does for its own, and has
    ``save_checkpoint`` leave ``latest`` to ckptio's commit (written after every rank's files
    are durable, and durably); ``load_checkpoint`` first commits a decoupled save still
    pending, so ``latest`` names the newest checkpoint. Calling it again replaces the engine
    it installed. Returns the CheckpointEngine; ``decoupled``, ``io_options`` and
    ``max_host_bytes`` as there (``decoupled=None`` keeps what DeepSpeed's config chose).
    """
    _check_engine(engine)
    old = engine.checkpoint_engine
    if decoupled is None:
        decoupled = bool(old.is_decoupled())
    if old.is_decoupled() or isinstance(old, CheckpointEngine):
        old.cleanup()  # commits what it holds; DeepSpeed's decoupled engine also stops its process
    new = CheckpointEngine(
        getattr(engine, "_config", None), io_options=io_options, decoupled=decoupled,
        max_host_bytes=max_host_bytes,
    )
    engine.checkpoint_engine = new
    _writes_model_states(engine, new)
    cls = type(engine)
    save_checkpoint = cls.save_checkpoint
    load_checkpoint = cls.load_checkpoint

    def save(save_dir: str, tag: Any = None, client_state: Any = None,
             save_latest: bool = True, exclude_frozen_parameters: bool = False) -> Any:
        new._latest_requested = bool(save_latest)
        try:
            # DeepSpeed writes `latest` itself after commit, without fsync: ckptio's commit does.
            return save_checkpoint(engine, save_dir, tag, {} if client_state is None else
                                   client_state, False, exclude_frozen_parameters)
        finally:
            new._latest_requested = None

    def load(load_dir: str, *args: Any, **kwargs: Any) -> Any:
        if engine.checkpoint_engine is new:
            new.wait()
        return load_checkpoint(engine, load_dir, *args, **kwargs)

    save.__doc__ = save_checkpoint.__doc__
    load.__doc__ = load_checkpoint.__doc__
    engine.save_checkpoint = save
    engine.load_checkpoint = load
    return new


def _writes_model_states(engine: Any, ce: CheckpointEngine) -> None:
    """Set ``engine.save_non_zero_checkpoint`` as DeepSpeed's own setup does for its engine."""
    from deepspeed.utils import groups

    dp_rank = groups._get_sequence_data_parallel_rank()
    rank = engine.local_rank if engine.use_node_local_storage() else dp_rank
    writes = ce.is_data_parallel_writer(rank)
    if not writes and engine.zero_optimization_partition_weights():
        writes = bool(engine.is_first_weights_partition_group())
    engine.save_non_zero_checkpoint = writes
