# SPDX-License-Identifier: Apache-2.0
"""ckptio.lightning: a PyTorch Lightning CheckpointIO whose saves, loads and removals go through ckptio.

``Trainer(plugins=[ckptio.lightning.CheckpointIO()])`` is the one line. By default every
checkpoint is a torch zip file written by ``ckptio.torch.save`` (stock ``torch.load``,
``LightningModule.load_from_checkpoint`` and Lightning's own loader read it), published
atomically: a save that fails or is killed leaves the file that was at the path. With
``async_save=True`` the call returns once torch has pickled the checkpoint and ckptio has
copied its storages into the C engine's host buffers; the engine's thread writes the same
torch file in the background. ``load_checkpoint`` also reads the ckptio checkpoint
directories that ``async_save=True`` wrote before ckptio 0.3.

>>> import torch, tempfile, os, ckptio.lightning
>>> io = ckptio.lightning.CheckpointIO()
>>> path = os.path.join(tempfile.mkdtemp(), "epoch=0-step=4.ckpt")
>>> io.save_checkpoint({"state_dict": {"w": torch.ones(2)}, "epoch": 0}, path)
>>> torch.load(path, weights_only=True)["epoch"]
0
>>> io.remove_checkpoint(path); os.path.exists(path)
False
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
import threading
import weakref
from typing import Any

import ckptio
import ckptio.torch
from . import _core
from ._async import AsyncSave, host_cap

try:
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO as _Base

    _OTHER = "lightning_fabric.plugins.io.checkpoint_io"
except ImportError:  # the standalone packages (pytorch_lightning + lightning_fabric)
    try:
        from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO as _Base

        _OTHER = ""
    except ImportError as e:
        raise ImportError(
            "ckptio.lightning needs PyTorch Lightning (pip install lightning)"
        ) from e

__all__ = ["CheckpointIO", "is_async_checkpoint"]

#: Keys of ``io_options``: ckptio's I/O options (backend, direct, fsync, ...) and ``crc32``
#: (the zip CRC-32s; see ckptio.torch.save).
IO_OPTION_KEYS = tuple(k for k in ckptio.torch.SAVE_OPTIONS if k != "overwrite")


def is_async_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a committed checkpoint in ckptio's format (what
    ``CheckpointIO(async_save=True)`` wrote before ckptio 0.3), rather than a torch file."""
    p = os.fspath(path)
    return os.path.isdir(p) and bool(_core.is_checkpoint(p))


def _device(map_location: Any) -> Any:
    """The ``device=`` of ckptio.load for a torch.load ``map_location``: a device or its name
    maps to itself; anything else (None, a function, a dict of storage locations: torch's
    remapping of storages, which a ckptio checkpoint does not record) to the CPU."""
    import torch

    if isinstance(map_location, (str, torch.device)):
        return map_location
    return "cpu"


def _on_cpu(storage: Any, location: str) -> Any:
    """torch.load's map_location that keeps every storage on the CPU (Lightning's default)."""
    return storage


class CheckpointIO(_Base):  # type: ignore[misc]
    """Lightning's CheckpointIO through ckptio: ``Trainer(plugins=[CheckpointIO()])``.

    ``async_save=False`` (the default): ``save_checkpoint`` writes a torch zip file with
    ``ckptio.torch.save`` and returns once it is durable at ``path``.

    ``async_save=True``: ``save_checkpoint`` returns once the checkpoint is pickled and its
    storages copied (``ckptio.torch.save_async``; ``max_host_bytes`` caps that memory as
    there); the engine's thread then writes the same torch file at ``path``.

    Either way, calls are ordered as if every save were synchronous: a save, a load or
    ``teardown`` first waits for a save in flight, and raises its error if it failed; removing
    the path being written waits for it; removing another path while a save is in flight is
    done once that save has committed (never before: a save killed or failing in between
    leaves the older checkpoint on disk). Safe to call from several threads, as
    Lightning's ``AsyncCheckpointIO`` does when it wraps this one.

    ``io_options``: ckptio's I/O options for every save (backend, direct, fsync, ...,
    ``crc32`` for torch files); ``storage_options`` of a single save adds to them.
    """

    def __init__(
        self,
        *,
        io_options: dict[str, Any] | None = None,
        async_save: bool = False,
        max_host_bytes: int | None = None,
    ) -> None:
        super().__init__()
        self.io_options = self._check_options(io_options)
        self.async_save = bool(async_save)
        host_cap(max_host_bytes)  # checked now, not at the first save
        self.max_host_bytes = max_host_bytes
        self._cv = threading.Condition()
        self._writing: str | None = None  # the path a torch-file save is writing now
        self._pending: AsyncSave | None = None  # the background save not yet seen finished
        self._doomed: list[str] = []  # removals waiting for the save in flight to commit
        # (set-aside name, path): an older checkpoint directory moved out of the way of the
        # save in flight, put back if that save fails
        self._aside: tuple[str, str] | None = None
        self._pid = os.getpid()
        # Not seen by any call before the interpreter exits: finished then (ckptio's own exit
        # handler, registered earlier, runs after this one and reports nothing twice).
        ref = weakref.ref(self)
        atexit.register(_finish_at_exit, ref)

    @staticmethod
    def _check_options(opts: dict[str, Any] | None) -> dict[str, Any]:
        out = dict(opts or {})
        unknown = sorted(set(out) - set(IO_OPTION_KEYS))
        if unknown:
            known = ", ".join(IO_OPTION_KEYS)
            raise TypeError(f"unknown io_options key(s) {', '.join(unknown)}; known: {known}")
        return out

    # ---- Lightning's interface ----

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Save ``checkpoint`` at ``path`` (see the class). ``storage_options``: None, or a dict
        of io_options for this save."""
        if storage_options is not None and not isinstance(storage_options, dict):
            raise TypeError(
                f"{type(self).__name__}.save_checkpoint takes storage_options as a dict of "
                f"ckptio io_options, got {type(storage_options).__name__}"
            )
        opts = {**self.io_options, **self._check_options(storage_options)}
        p = os.fspath(path)
        parent = os.path.dirname(p)
        with self._cv:
            self._cv.wait_for(lambda: self._writing is None)
            self._settle(wait=True)
            if parent:
                os.makedirs(parent, exist_ok=True)
            aside = _set_aside(p)
            if self.async_save:
                started = False
                try:
                    self._pending = ckptio.torch.save_async(
                        checkpoint, p, io_options=opts, max_host_bytes=self.max_host_bytes
                    )
                    started = True
                finally:
                    if aside and started:
                        self._doomed.append(aside)
                        self._aside = (aside, p)
                    elif aside:
                        os.rename(aside, p)
                return
            self._writing = p
        ok = False
        try:
            ckptio.torch.save(checkpoint, p, io_options=opts)
            ok = True
        finally:
            with self._cv:
                self._writing = None
                if aside:
                    if ok:
                        self._doomed.append(aside)
                    elif not os.path.lexists(p):
                        os.rename(aside, p)
                self._after_save(ok)
                self._cv.notify_all()

    def load_checkpoint(
        self, path: Any, map_location: Any | None = _on_cpu, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """The checkpoint at ``path``: a torch file through ``ckptio.torch.load`` (torch.load's
        ``map_location`` and ``weights_only`` rules), or a ckptio checkpoint through
        ``ckptio.load`` (never unpickled; tensors on the CPU, or on ``map_location`` when that
        is a device). Without ``map_location``, tensors load on the CPU, as with Lightning's
        own plugin (the Trainer passes none)."""
        p = os.fspath(path)
        with self._cv:
            self._cv.wait_for(lambda: self._writing is None)
            self._settle(wait=True)
        if os.path.isdir(p) and _core.is_checkpoint(p):
            out: dict[str, Any] = ckptio.load(p, device=_device(map_location))
            return out
        if not os.path.exists(p):
            raise FileNotFoundError(f"Checkpoint file not found: {p}")
        out = ckptio.torch.load(p, map_location=map_location, weights_only=weights_only)
        return out  # type: ignore[no-any-return]

    def remove_checkpoint(self, path: Any) -> None:
        """Remove the checkpoint at ``path`` (a torch file or a ckptio checkpoint; nothing if
        there is none). Another path's save in flight: done once that save has committed."""
        p = os.fspath(path)
        with self._cv:
            self._settle(wait=False)
            busy = self._writing if self._writing is not None else self._pending_path()
            if busy == p:  # the save of this very path: it must not land after the removal
                self._cv.wait_for(lambda: self._writing != p)
                self._settle(wait=True)
            elif busy is not None:
                self._doomed.append(p)
                return
            _remove(p)

    def teardown(self) -> None:
        """Wait for the save in flight and do the removals it held back; raises its error."""
        with self._cv:
            self._cv.wait_for(lambda: self._writing is None)
            self._settle(wait=True)

    # ---- insides ----

    def _pending_path(self) -> str | None:
        return None if self._pending is None else self._pending.path

    def _settle(self, wait: bool) -> None:
        """Take the outcome of the background save if it has finished (or, with ``wait``,
        once it has): on success, do the removals it held back; on failure, drop them (the
        older checkpoints stay) and raise its error. Call with the lock held."""
        if os.getpid() != self._pid:  # a forked child: the parent's save and removals
            self._pending, self._doomed, self._aside, self._pid = None, [], None, os.getpid()
        h = self._pending
        if h is not None:
            if not wait and not h.done():
                return
            try:
                h.wait()
            except KeyboardInterrupt:
                raise  # still in flight: a later call takes its outcome
            except BaseException:
                self._pending = None
                self._after_save(False)
                raise
            self._pending = None
        if self._writing is None:
            self._after_save(True)

    def _after_save(self, ok: bool) -> None:
        """The save in flight has ended: do (``ok``) or drop the removals it held back (and
        put back the older checkpoint it had moved aside, where nothing took its place)."""
        doomed, self._doomed = self._doomed, []
        aside, self._aside = self._aside, None
        if not ok and aside is not None and not os.path.lexists(aside[1]):
            os.rename(*aside)
        if ok:
            for p in doomed:
                _remove(p)


def _set_aside(path: str) -> str:
    """Rename a ckptio checkpoint directory at ``path`` (what ``async_save=True`` wrote before
    ckptio 0.3) out of the way of the torch file to be written there, to be removed once the
    file is committed; its new name, or "" if none."""
    if os.path.islink(path) or not os.path.isdir(path) or not _core.is_checkpoint(path):
        return ""  # a file (replaced atomically), nothing, or not a checkpoint: the save says so
    aside = f"{path}.replaced-{os.getpid()}"
    os.rename(path, aside)
    return aside


def _remove(path: str) -> None:
    """Remove a torch file or a ckptio checkpoint directory (through the engine's
    ckptio_remove_checkpoint); a missing path is no error, as in Lightning's own."""
    if os.path.isdir(path) and not os.path.islink(path):
        if _core.is_checkpoint(path):
            _core.remove_checkpoint(path)
            return
        raise IsADirectoryError(f"'{path}' is a directory that holds no ckptio checkpoint")
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _finish_at_exit(ref: weakref.ref[CheckpointIO]) -> None:
    io = ref()
    if io is None or (io._pending is None and not io._doomed):
        return
    try:
        io.teardown()
    except Exception as e:  # never lost: printed, as ckptio's exit handler prints its own
        print(f"ckptio.lightning: the last checkpoint save FAILED: {e}", file=sys.stderr)


if _OTHER and "lightning_fabric" in sys.modules:
    # The standalone `pytorch_lightning` package's Trainer checks plugins against
    # lightning_fabric's class: registered there too, one class serves both (importing
    # lightning_fabric here would double this module's import time for everyone else).
    try:
        importlib.import_module(_OTHER).CheckpointIO.register(CheckpointIO)
    except Exception:  # pragma: no cover - a broken second install must not break this one
        pass
