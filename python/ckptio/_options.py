# SPDX-License-Identifier: Apache-2.0
"""I/O options (backend, O_DIRECT, fsync, ...) turned into the parameters ckptio._core takes by name."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import _core
from ._errors import USAGE, InvalidType, error

__all__ = ["IO_OPTIONS", "params", "split_roots", "store", "Stats"]

_BACKENDS = {"auto": 0, "io_uring": 1, "psync": 2, "buffered": 3}
_AUTO, _OFF, _ON = -1, 0, 1

#: Keyword arguments accepted by ckptio.save / ckptio.load / ckptio.open as I/O options.
IO_OPTIONS = (
    "backend",
    "direct",
    "fsync",
    "checksums",
    "queue_depth",
    "io_threads",
    "staging_bytes",
    "request_bytes",
    "gpu",
    "gpu_staging_bytes",
    "roots",
    "cache",
    "verify_threads",
    "compress",
    "base",
    "storage_options",
)


_stores: dict[tuple[tuple[str, str | None], ...], Any] = {}


def store(storage_options: Mapping[str, Any] | None) -> Any:
    """The library's settings object (ckptio._core.StoreOptions) for ``storage_options``, an
    object store's settings as fsspec and boto3 take them per call: endpoint_url, region,
    profile, access_key_id, secret_access_key, session_token, ca_bundle, addressing_style,
    sts_endpoint_url, prefix_spread (doc/s3.md). None or {}: None (the environment's settings, read by the
    library when it needs them). One object per distinct mapping, kept for the process, so the
    library's clients (connections, credentials) are shared by every call with those settings.
    The library checks the names and values; a wrong one raises at once."""
    if not storage_options:
        return None
    if not isinstance(storage_options, Mapping):
        raise error(USAGE, f"storage_options must be a mapping, got {storage_options!r}", InvalidType)
    items = []
    for k, v in storage_options.items():
        if isinstance(v, int) and not isinstance(v, bool):
            v = str(v)  # prefix_spread=2
        if not isinstance(k, str) or not (v is None or isinstance(v, (str, os.PathLike))):
            raise error(USAGE, f"storage_options: {k!r}: names must be str, values str or int", InvalidType)
        items.append((k, None if v is None else os.fsdecode(v)))
    key = tuple(sorted(items))
    made = _stores.get(key)
    if made is None:
        made = _stores[key] = _core.StoreOptions(dict(key))
    return made


def fsync_path(path: str) -> None:
    """Make ``path`` (a file, or a directory's entries) durable: for the adapters that write or
    rename files themselves, around a framework's own save."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _switch(name: str, value: Any, auto_ok: bool) -> int:
    if value is None or (isinstance(value, str) and value == "auto"):
        if not auto_ok:
            raise error(USAGE, f"{name} must be True or False")
        return _AUTO
    if isinstance(value, bool):
        return _ON if value else _OFF
    raise error(USAGE, f"{name} must be True, False{' or None (auto)' if auto_ok else ''}", InvalidType)


def _count(name: str, value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise error(USAGE, f"{name} must be a non-negative int, got {value!r}")
    return value


_GPU_MODES = {"auto": 0, "gds": 1, "staged": 2, "off": 3}


def _gpu_mode(value: Any) -> int:
    if value is None:
        return 0
    if value not in _GPU_MODES:
        raise error(USAGE, f"gpu must be one of {', '.join(_GPU_MODES)}, got {value!r}")
    return _GPU_MODES[value]


def params(options: dict[str, Any], *, overwrite: bool = False) -> dict[str, int]:
    """Validate ``options`` (names from IO_OPTIONS) and build ckptio._core's parameters: a dict
    keyed by the names of ckptio._core.PARAMS (the C library's ckptio_params fields).

    backend: "auto" (io_uring where the kernel allows, else a pread/pwrite pool), "io_uring",
    "psync" or "buffered"; direct: None (O_DIRECT where the file system allows), True, False;
    fsync, checksums: bools (default True); queue_depth, io_threads, staging_bytes,
    request_bytes: ints, 0 = the library's default; gpu: how GPU tensors move, "auto", "gds",
    "staged" or "off" (the framework copies them; doc/gpu.md), CKPTIO_GPU winning over it;
    gpu_staging_bytes: the pinned ring for GPU loads (0: 256 MiB; a staged save pins the
    writer's staging_bytes instead, doc/gpu.md);
    roots: directories to stripe a checkpoint over (save), or to find its stripes in (load), kept
    under "roots" (see split_roots).
    cache (loads): "auto" (ranges resident in the page cache are copied from it, the rest read
    from the device), "never", or "fill" (everything through the page cache, leaving the files
    resident for the next load); verify_threads (loads): threads that verify checksums and copy
    cached ranges, 0 = default.
    compress (saves): None or "none" (tensors stored as they are), "auto" (blocks compressed
    where that saves 2 %, a share left as they are while the device would wait on the coder, so
    a save never runs slower: the choice for every save), "all" (every block tried: the
    smallest checkpoint, at the coder's speed); True means "auto". CKPTIO_COMPRESS wins over it.
    storage_options: an object store's settings for this call (see store()).
    base (saves): an older checkpoint to save against (an incremental checkpoint): tensors it
    also holds are stored as XOR deltas where that is smaller; needs compress (base alone
    turns compress on: "auto"). Loading resolves the chain; the base must stay where it was,
    unchanged.
    """
    unknown = set(options) - set(IO_OPTIONS)
    if unknown:
        raise error(
            USAGE,
            f"unknown I/O option(s) {', '.join(sorted(unknown))}; known: {', '.join(IO_OPTIONS)}",
            InvalidType,
        )
    backend = options.get("backend", "auto")
    if backend is None:
        backend = "auto"
    if backend not in _BACKENDS:
        raise error(USAGE, f"backend must be one of {', '.join(_BACKENDS)}, got {backend!r}")
    out: dict[str, Any] = {
        "io_threads": _count("io_threads", options.get("io_threads")),
        "queue_depth": _count("queue_depth", options.get("queue_depth")),
        "staging_bytes": _count("staging_bytes", options.get("staging_bytes")),
        "request_bytes": _count("request_bytes", options.get("request_bytes")),
        "backend": _BACKENDS[backend],
        "direct": _switch("direct", options.get("direct"), True),
        "fsync": _switch("fsync", options.get("fsync", True), False),
        "checksums": _switch("checksums", options.get("checksums", True), False),
        "overwrite": _ON if overwrite else _OFF,
        "gpu": _gpu_mode(options.get("gpu", "auto")),
        "gpu_staging_bytes": _count("gpu_staging_bytes", options.get("gpu_staging_bytes")),
        "cache": _cache(options.get("cache", "auto")),
        "verify_threads": _count("verify_threads", options.get("verify_threads")),
        "compress": _compress(options.get("compress")),
    }
    base = options.get("base")
    if base is not None:
        if not isinstance(base, (str, bytes, os.PathLike)):
            raise error(USAGE, f"base must be a checkpoint's path, got {base!r}", InvalidType)
        out["base"] = os.fsdecode(base)
        if options.get("compress") is None:
            out["compress"] = _COMPRESS["auto"]
    so = store(options.get("storage_options"))
    if so is not None:
        out["store"] = so
    roots = options.get("roots")
    if roots is not None:
        if isinstance(roots, (str, bytes, os.PathLike)) or not all(
            isinstance(r, (str, bytes, os.PathLike)) for r in roots
        ):
            raise error(USAGE, f"roots must be a list of directories, got {roots!r}", InvalidType)
        out["roots"] = [os.fsdecode(r) for r in roots]
    return out


def split_roots(p: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``p`` without its striping roots (which _core's params do not take), and the roots."""
    if "roots" not in p:
        return p, []
    q = dict(p)
    return q, q.pop("roots")


_COMPRESS = {"none": 0, "auto": 1, "all": 2}


def _compress(value: Any) -> int:
    """compress: None/False/"none", True/"auto", or "all" (doc/format.md section 11)."""
    if value is None or value is False:
        return 0
    if value is True:
        return 1
    if value not in _COMPRESS:
        raise error(USAGE, f"compress must be 'none', 'auto' or 'all' (or a bool), got {value!r}")
    return _COMPRESS[value]


def _cache(value: Any) -> int:
    """cache: "auto" (resident ranges from the page cache, the rest from the device), "never"
    or "fill" (everything through the page cache, leaving the files resident)."""
    modes = {"auto": 0, "never": 1, "fill": 2}
    if value is None:
        return 0
    if value not in modes:
        raise error(USAGE, f"cache must be 'auto', 'never' or 'fill', got {value!r}")
    return modes[value]


@dataclass(frozen=True)
class Stats:
    """What one save or load did.

    ``bytes``: tensor bytes moved; ``seconds``: wall time of the whole Python call (flattening,
    I/O and commit); ``gbps``: bytes / seconds / 1e9; ``backend``: the I/O path that ran
    ("io_uring", "psync" or "buffered"); ``direct``: whether O_DIRECT was used;
    ``io_seconds``: the library's own time from open to commit (or last read); ``tensors``:
    tensors (or chunks) written, or regions read.
    ``io_bytes``: bytes read from or written to the device; ``cache_bytes`` (loads): stored
    bytes copied from the page cache instead.
    """

    bytes: int
    seconds: float
    gbps: float
    backend: str
    direct: bool
    tensors: int = 0
    io_bytes: int = 0
    io_seconds: float = 0.0
    #: How GPU tensors moved: "" (none), "staged", "gds", "gds+staged" (with why GDS was not
    #: used where it could have been), or "host copy (<why>)" when the framework copied them.
    gpu: str = ""
    cache_bytes: int = 0

    @classmethod
    def _from_core(cls, t: Any, seconds: float) -> Stats:
        """From ckptio._core.IOStats ``t``; ``seconds``: the whole call's wall time."""
        return cls(
            bytes=t.bytes,
            seconds=seconds,
            gbps=t.bytes / seconds / 1e9 if seconds > 0 else 0.0,
            backend=t.backend,
            direct=bool(t.direct),
            tensors=t.tensors,
            io_bytes=t.io_bytes,
            io_seconds=t.seconds,
        )
