# SPDX-License-Identifier: Apache-2.0
"""ckptio.Manager: numbered checkpoints in one directory, saved in the background, old ones
pruned only once a newer one is committed."""

from __future__ import annotations

import errno
import os
import re
import threading
import weakref
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from . import _core
from ._async import AsyncSave, _save_async
from ._errors import USAGE, InvalidType, _from_code, error
from ._load import load
from ._options import store
from ._save import PathLike, save
from ._stage import is_url
from ._tiers import Tiers
from .ranks import _comm, _dist
from .ranks._comm import Communicator

__all__ = ["Manager"]

_STEP = re.compile(r"0|[1-9][0-9]*")


class Manager:
    """Checkpoints of a training run, one directory per step: ``<directory>/<step>``.

    ``keep``: how many of the newest steps to keep (None: all); ``keep_every``: steps that are
    a multiple of it are kept as well; ``async_save``: save() returns once the state is
    copied (ckptio.save_async) instead of once it is written; ``max_host_bytes``: the cap of
    that copy; ``save_options``: passed to every save (I/O options such as ``fsync``).

    A step is listed (``all_steps()``, ``latest_step()``) only once it is committed, so a crash
    at any point never lists a half-written step. Older steps are deleted only after a newer
    one is committed, and each is first renamed out of the listing (durably) and then removed,
    so a crash during the deletion leaves every listed step loadable.

    ``full_every``: incremental checkpoints: every ``full_every``-th save is a full one, the
    saves between are stored as deltas against the step before (``ckptio.save(base=)``;
    compression turns on, "auto" unless ``compress`` says otherwise), so no chain is longer
    than ``full_every - 1`` deltas. Pruning never deletes a step that a kept step needs as its
    base (directly or through other deltas), so every listed step stays loadable. None (the
    default) or 1: every save is full.

    ``comm``: a job of several ranks (a torch.distributed ProcessGroup, an mpi4py
    communicator, "torch", "jax", "mpi"): every rank creates the Manager on the same
    (shared) directory and calls save(step, tree) with its part of the tree; each save is the
    collective ckptio.save(..., comm=). Without ``comm``, a tree holding DTensors on a
    multi-process mesh or jax arrays spanning processes uses their runtime, as ckptio.save
    does. Once a save has committed (every rank saw it succeed), only rank 0 deletes the steps
    the policy lets go, then tells the other ranks, which wait for it (bounded by
    ``timeout``, the save's timeout) so that save() returns on every rank with the same steps
    listed and no rank restores a step while it is being deleted. A crash of any rank at any
    point leaves every listed step loadable: the other ranks' save fails and nothing is
    published, or the deletion is a durable rename followed by a removal. With
    ``async_save`` the collective save and the deletion run in ckptio's background thread
    (see ckptio.save_async for which communicators allow it).

    ``local``: tiers (doc/tiers.md). Each rank's part goes to the node's local tier
    (``<local>/<step>/rank<R>``, host memory or local NVMe) in the background, is pushed to
    ``replicas`` ranks on the next nodes (verified by the receiver before it is published), and
    every ``persist_every``-th save is copied to ``directory/<step>/rank<R>`` (an s3:// URL:
    ``<url>/<step>.rank<R>``; None: never).
    Each node keeps ``local_keep`` steps and never deletes the newest step complete for the
    whole job. restore() is collective: each rank takes its part from its node, else a peer,
    else the persistent tier, every block verified, the same step on every rank.
    ``last_save`` and ``last_restore`` say what happened and where the seconds went. ``node``:
    the node's id (default: $CKPTIO_NODE, else the host name).
    """

    def __init__(
        self,
        directory: PathLike,
        keep: int | None = 3,
        keep_every: int | None = None,
        async_save: bool = True,
        *,
        max_host_bytes: int | None = None,
        comm: Any = None,
        timeout: float | None = None,
        full_every: int | None = None,
        local: PathLike | None = None,
        replicas: int = 1,
        persist_every: int | None = 1,
        local_keep: int = 2,
        node: str | None = None,
        **save_options: Any,
    ) -> None:
        if "base" in save_options:
            raise error(USAGE, "a Manager chooses each save's base itself: pass full_every, "
                        "not base", InvalidType)  # fmt: skip
        for name, v in (("keep", keep), ("keep_every", keep_every), ("full_every", full_every)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise error(USAGE, f"{name} must be None or an int >= 1, got {v!r}", InvalidType)
        d = os.fspath(directory)
        self._url = is_url(d)  # an object store: no directories, no renames
        self.directory = d.rstrip("/") if self._url else os.path.abspath(d)
        self.keep = keep
        self.keep_every = keep_every
        self.full_every = full_every
        self.async_save = async_save
        self.max_host_bytes = max_host_bytes
        self.save_options = save_options
        # The store's settings (storage_options), for the listings and removals here too.
        self._store = store(save_options.get("storage_options"))
        self.timeout = _dist.DEFAULT_TIMEOUT if timeout is None else float(timeout)
        if not self.timeout > 0:
            raise error(USAGE, f"timeout must be > 0 seconds, got {timeout!r}")
        # Resolved now: resolving is collective the first time (it may create a group), and
        # every rank creates its Manager at the same point of the program.
        self.comm: Communicator | None = _comm.resolve(comm)
        self._pending: AsyncSave | None = None
        self._lock = threading.Lock()
        self._closed = False
        _LIVE.add(self)
        self._tiers: Tiers | None = None
        if local is not None:
            if full_every not in (None, 1):
                raise error(USAGE, "full_every (deltas) is not available with local= tiers: "
                            "each tier holds full parts", InvalidType)  # fmt: skip
            self._tiers = Tiers(self.directory, local, self.comm, replicas=replicas,
                persist_every=persist_every, local_keep=local_keep, keep=keep, node=node,
                timeout=self.timeout, storage_options=save_options.get("storage_options"))  # fmt: skip
            return
        if not self._url:
            os.makedirs(self.directory, exist_ok=True)
        if self.comm is None or self.comm.rank == 0:
            _core.sweep(self.directory, self._store)  # what killed saves and removals left

    # ---- listing ----
    def all_steps(self) -> list[int]:
        """The committed steps, ascending (with local=: the steps complete in the persistent
        tier, every rank's part there)."""
        if self._tiers is not None:
            return self._tiers.persistent_steps()
        names = _core.list_checkpoints(self.directory, self._store)
        return sorted(int(n) for n in names if _STEP.fullmatch(n))

    def latest_step(self) -> int | None:
        """The newest committed step, or None."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def step_path(self, step: int) -> str:
        """The directory of ``step``'s checkpoint."""
        if self._url:
            return f"{self.directory}/{int(step)}"
        return os.path.join(self.directory, str(int(step)))

    # ---- save / restore ----
    def save(
        self, step: int, tree: Any, *, metadata: Mapping[str, str] | None = None
    ) -> bool:
        """Save ``tree`` as step ``step`` (an int >= 0); with async_save, returns once the
        tree may be changed. A save still in flight is waited for first (its error is raised
        here if nobody waited for it). A step older than latest_step() is refused
        (InvalidRequest, nothing written): steps only grow. Afterwards the steps that ``keep`` / ``keep_every`` no
        longer hold are deleted (in the background with async_save). Returns True."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise error(USAGE, f"step must be an int >= 0, got {step!r}", InvalidType)
        self._check_open()
        if self._tiers is not None:
            with self._lock:
                self._tiers.save(step, tree, metadata, self.max_host_bytes, self.save_options)
            return True
        with self._lock:
            self._wait_pending()
            latest = self.latest_step()
            if latest is not None and step < latest:
                # Steps only grow: "newest" is then one order for keep and latest_step().
                raise error(USAGE,
                    f"step {step} is older than the latest committed step {latest} of "
                    f"'{self.directory}': a Manager's steps only grow (keep holds the highest "
                    "ones, latest_step() is the highest); to go back to an earlier step, "
                    "delete the newer ones first, or save into another directory",
                )  # fmt: skip
            path = self.step_path(step)
            c = self._comm_for(tree)
            options = self._options_for(latest)
            if self.async_save:
                self._pending = _save_async(
                    tree, path, max_host_bytes=self.max_host_bytes, overwrite=False,
                    metadata=metadata, io_options=options, comm=c,
                    timeout=self.timeout, after=lambda cc: self._retain(step, cc),
                )  # fmt: skip
            else:
                if c is None:
                    save(tree, path, metadata=metadata, **options)
                else:
                    save(tree, path, metadata=metadata, comm=c, timeout=self.timeout,
                         **options)  # fmt: skip
                self._retain(step, c)
        return True

    def restore(self, step: int | None = None, like: Any = None, **load_options: Any) -> Any:
        """Load step ``step`` (default: the latest committed one), as ckptio.load(path,
        like=like, **load_options) does (``comm=`` too: pass it to load on the ranks of a
        job). A save in flight is waited for first. Listing and restoring work after close()
        too."""
        if self._tiers is not None:
            with self._lock:
                return self._tiers.restore(step, like, load_options)
        self.wait_until_finished()
        if step is None:
            step = self.latest_step()
            if step is None:
                raise _from_code(
                    -errno.ENOENT, "ENOENT", f"no checkpoint in '{self.directory}' to restore"
                )
        if "storage_options" in self.save_options:  # the store saved to, unless told otherwise
            load_options.setdefault("storage_options", self.save_options["storage_options"])
        return load(self.step_path(step), like=like, **load_options)

    def wait_until_finished(self) -> None:
        """Wait for the save in flight, raising its error (with local=: its local write's; its
        replication's and persistent copy's errors are in last_save["errors"])."""
        with self._lock:
            self._wait_pending()
            if self._tiers is not None:
                self._tiers.finish()

    def close(self) -> None:
        """Wait for the save in flight (raising its error); the manager saves no more."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            self._wait_pending()
            if self._tiers is not None:
                self._tiers.close()

    @property
    def last_save(self) -> dict[str, Any] | None:
        """With local=: what the newest finished save did (see doc/tiers.md)."""
        return None if self._tiers is None else self._tiers.last_save

    @property
    def last_restore(self) -> dict[str, Any] | None:
        """With local=: where the last restore took this rank's part from (doc/tiers.md)."""
        return None if self._tiers is None else self._tiers.last_restore

    def local_steps(self) -> list[int]:
        """With local=: the steps of which this node's local tier holds this rank's part."""
        if self._tiers is None:
            return []
        return self._tiers.local_steps()

    def __enter__(self) -> Manager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """close(); when the body raised, its exception goes on, and an error of close() (the
        pending save's) is attached to it as a note rather than replacing it."""
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception as e:
            exc.add_note(
                f"ckptio.Manager: closing the Manager of '{self.directory}' as this exception "
                f"left the with block failed too: {type(e).__name__}: {e}"
            )

    # ---- internals ----
    def _check_open(self) -> None:
        if self._closed:
            raise error(USAGE, f"this Manager of '{self.directory}' is closed")

    def _wait_pending(self) -> None:
        h, self._pending = self._pending, None
        if h is not None:
            h.wait()

    def _comm_for(self, tree: Any) -> Communicator | None:
        """The communicator of a save of ``tree``: the Manager's, else the runtime of the
        tree's distributed arrays (as ckptio.save finds it), else None (this process alone)."""
        if self.comm is not None:
            return self.comm
        kind = _dist.runtime_of(tree)
        if kind is None or kind == "local":
            return None  # Shard / RankLocal leaves alone: ckptio.save makes it one rank's
        return _comm.resolve(kind)

    def _retain(self, newest: int, c: Communicator | None) -> None:
        """After step ``newest`` committed on every rank: rank 0 deletes, the others wait for
        it to finish (and raise its error, if it failed, so every rank reports it)."""
        if c is None or c.size == 1:
            self._prune(newest)
            return
        if c.rank == 0:
            err: Exception | None = None
            try:
                self._prune(newest)
            except Exception as e:  # told to the other ranks, then raised here
                err = e
            c.broadcast(0, f"{type(err).__name__}: {err}".encode() if err else b"", self.timeout)
            if err is not None:
                raise err
            return
        try:
            got = c.broadcast(0, None, self.timeout)
        except Exception as e:
            e.add_note(
                f"ckptio.Manager: step {newest} of '{self.directory}' was committed on every "
                "rank; this rank was waiting for rank 0 to delete older steps, and every "
                "listed step is loadable"
            )
            raise
        if got:
            raise _from_code(
                -errno.EIO, "EIO",
                f"rank 0 could not delete old steps of '{self.directory}' after step {newest} "
                f"was committed: {got.decode(errors='replace')}; every listed step is still "
                "loadable",
            )  # fmt: skip

    # ---- incremental saves ----
    def base_step(self, step: int) -> int | None:
        """The step whose checkpoint ``step`` was saved against (a delta), or None (a full one
        or no Manager step)."""
        path = self.step_path(step)
        try:
            r = _core.Reader(path, None)
        except Exception:
            return None
        try:
            rel = r.base
        finally:
            r.close()
        if rel is None:
            return None
        target = os.path.normpath(os.path.join(path, rel))
        name = os.path.basename(target)
        if os.path.dirname(target) != self.directory or not _STEP.fullmatch(name):
            return None  # a base outside this Manager's steps: not its to keep or delete
        return int(name)

    def _chain(self, step: int) -> list[int]:
        """``step`` and the steps its deltas need, newest first."""
        out = [step]
        while (b := self.base_step(out[-1])) is not None and b not in out:
            out.append(b)
        return out

    def _options_for(self, latest: int | None) -> dict[str, Any]:
        """The save options of the next save: a delta against ``latest`` while its chain is
        shorter than full_every - 1 deltas."""
        if not self.full_every or self.full_every == 1 or latest is None:
            return self.save_options
        if len(self._chain(latest)) >= self.full_every:
            return self.save_options
        return dict(self.save_options, base=self.step_path(latest))

    def _prune(self, newest: int) -> None:
        """Delete the steps older than ``newest`` (committed) that the policy lets go."""
        if self.keep is None:
            return
        steps = [s for s in self.all_steps() if s <= newest]
        keep = set(steps[-self.keep :])
        keep.update(s for s in self.all_steps() if s > newest)
        keep.update(s for s in steps if self.keep_every and s % self.keep_every == 0)
        if self.full_every and self.full_every > 1:
            for s in list(keep):  # the bases a kept step needs stay too
                keep.update(self._chain(s))
        doomed = [s for s in steps if s not in keep]
        if not doomed:
            return
        for s in doomed:  # each goes whole: out of the listing durably first, then its data
            _core.remove_checkpoint(self.step_path(s), self._store)
        roots = self.save_options.get("roots")
        if roots:  # striped steps: their stripes in the other roots go too
            for s in doomed:
                _core.remove_stripes(self.step_path(s), [os.fspath(r) for r in roots])

    def __repr__(self) -> str:
        return f"ckptio.Manager('{self.directory}', keep={self.keep}, steps={self.all_steps()})"


# Every Manager of this process, so that a forked child can reset them.
_LIVE: weakref.WeakSet[Manager] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child's Managers have nothing pending (the save in flight, and its deletion
    of old steps, are the parent's) and fresh locks (the parent's may have been held)."""
    for m in list(_LIVE):
        m._lock = threading.Lock()
        m._pending = None


os.register_at_fork(after_in_child=_after_fork_in_child)
