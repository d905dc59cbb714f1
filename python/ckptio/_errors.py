# SPDX-License-Identifier: Apache-2.0
"""The exceptions ckptio raises, one class per family of libckptio error codes."""

from __future__ import annotations

import errno as _errno

__all__ = [
    "CheckpointError",
    "CorruptCheckpoint",
    "ChecksumMismatch",
    "CheckpointExists",
    "NotACheckpoint",
    "TensorNotFound",
    "UnsupportedFormat",
    "UnsupportedDtype",
    "ShapeMismatch",
    "RegionOutOfRange",
    "DuplicateTensor",
    "IncompleteTensor",
    "LimitExceeded",
    "InvalidRequest",
    "InvalidType",
    "Unsupported",
    "Interrupted",
    "NotDurable",
    "CheckpointIOError",
    "CheckpointNotFound",
]


class CheckpointError(Exception):
    """Base class of every error ckptio reports.

    ``code`` is the libckptio return code (negative: ``-errno`` or a ``CKPTIO_E_*`` value),
    ``name`` its symbolic name, and ``str(e)`` (also ``message``) the library's message, which
    names the path and, where one is involved, the tensor. The same parts come as values where
    the binding knows them, so that no one parses the message: ``path`` (the checkpoint or file
    the call was about), ``tensor`` (the tensor involved) and ``rank`` (in a collective call, the
    rank the failure is about: the one that failed, refused or disagreed, else the rank that
    raised it); where the library recorded them, also ``file`` (the data file involved),
    ``offset`` (the byte offset in it), ``other_rank`` (the rank that ``rank`` disagreed with)
    and ``refused`` (True when ``rank`` refused to take part: it could not stage its part);
    None (False) where unknown.

    >>> import ckptio
    >>> try:
    ...     ckptio.open("/nonexistent/ckpt")
    ... except ckptio.CheckpointError as e:
    ...     print(type(e).__name__, e.name)
    CheckpointNotFound ENOENT
    """

    code: int = 0
    name: str = ""
    # Set on the instance by ckptio._core where it knows them.
    path: str | None = None
    tensor: str | None = None
    rank: int | None = None
    file: str | None = None
    offset: int | None = None
    other_rank: int | None = None
    refused: bool = False

    def __init__(self, message: str, code: int = 0, name: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.name = name

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    @property
    def message(self) -> str:
        """The library's message: ``str(self)``."""
        return str(self)


class CorruptCheckpoint(CheckpointError):
    """The manifest or the data is damaged (CKPTIO_E_CORRUPT)."""


class ChecksumMismatch(CorruptCheckpoint):
    """Stored bytes do not match their checksum (CKPTIO_E_CHECKSUM)."""


class CheckpointExists(CheckpointError, FileExistsError):
    """The destination exists and ``overwrite`` was not given (CKPTIO_E_EXISTS)."""


class NotACheckpoint(CheckpointError):
    """The path is not a committed checkpoint, e.g. an unfinished save (CKPTIO_E_NOT_CHECKPOINT)."""


class TensorNotFound(CheckpointError, KeyError):
    """No tensor or key by that name (CKPTIO_E_NOT_FOUND)."""


class UnsupportedFormat(CheckpointError):
    """The checkpoint uses a newer on-disk format (CKPTIO_E_FORMAT)."""


class UnsupportedDtype(CheckpointError, TypeError):
    """A dtype ckptio cannot store or a framework cannot represent (CKPTIO_E_DTYPE)."""


class ShapeMismatch(CheckpointError, ValueError):
    """Shapes, offsets, regions or buffer sizes disagree (CKPTIO_E_SHAPE/_BUFFER)."""


class RegionOutOfRange(ShapeMismatch, IndexError):
    """A region or index lies outside the tensor (CKPTIO_E_RANGE)."""


class DuplicateTensor(CheckpointError, ValueError):
    """Two tensors with one name, or overlapping chunks (CKPTIO_E_DUPLICATE)."""


class IncompleteTensor(CheckpointError, ValueError):
    """A tensor's chunks do not cover it (CKPTIO_E_INCOMPLETE)."""


class LimitExceeded(CheckpointError, ValueError):
    """A size or count beyond the format's limits (CKPTIO_E_LIMIT)."""


class InvalidRequest(CheckpointError, ValueError):
    """An invalid argument or call (CKPTIO_E_USAGE, CKPTIO_E_STATE)."""


class InvalidType(InvalidRequest, TypeError):
    """An argument or a tree leaf of a type ckptio does not take (CKPTIO_E_USAGE)."""


class Unsupported(CheckpointError):
    """A feature this build or system lacks (CKPTIO_E_UNSUPPORTED)."""


class Interrupted(CheckpointError):
    """The operation was cancelled (CKPTIO_E_INTERRUPTED)."""


class NotDurable(CheckpointError):
    """Saved and visible, but the directory entry's fsync failed, so a crash might lose it
    (CKPTIO_E_NOT_DURABLE). The checkpoint or file is complete: sync, or save again."""


class CheckpointIOError(CheckpointError, OSError):
    """A system error (``-errno``); ``errno`` is set as for OSError."""

    def __init__(self, message: str, code: int = 0, name: str = "") -> None:
        OSError.__init__(self, -code if code < 0 else code, message)
        self.code = code
        self.name = name

    def __str__(self) -> str:
        return str(self.strerror)


class CheckpointNotFound(CheckpointIOError, FileNotFoundError):
    """The path does not exist (ENOENT)."""


# Names of the codes the Python layer raises itself.
USAGE = "CKPTIO_E_USAGE"
STATE = "CKPTIO_E_STATE"
DTYPE = "CKPTIO_E_DTYPE"
SHAPE = "CKPTIO_E_SHAPE"
DUPLICATE = "CKPTIO_E_DUPLICATE"
NOT_FOUND = "CKPTIO_E_NOT_FOUND"
RANGE = "CKPTIO_E_RANGE"
FORMAT = "CKPTIO_E_FORMAT"
CORRUPT = "CKPTIO_E_CORRUPT"

# The class of each libckptio error, by the code's name; the codes themselves come from the
# library's own table (ckptio._core.errors()).
_BY_NAME: dict[str, type[CheckpointError]] = {
    "CKPTIO_E_USAGE": InvalidRequest,
    "CKPTIO_E_STATE": InvalidRequest,
    "CKPTIO_E_DTYPE": UnsupportedDtype,
    "CKPTIO_E_SHAPE": ShapeMismatch,
    "CKPTIO_E_DUPLICATE": DuplicateTensor,
    "CKPTIO_E_INCOMPLETE": IncompleteTensor,
    "CKPTIO_E_EXISTS": CheckpointExists,
    "CKPTIO_E_NOT_CHECKPOINT": NotACheckpoint,
    "CKPTIO_E_NOT_FOUND": TensorNotFound,
    "CKPTIO_E_RANGE": RegionOutOfRange,
    "CKPTIO_E_BUFFER": ShapeMismatch,
    "CKPTIO_E_FORMAT": UnsupportedFormat,
    "CKPTIO_E_CORRUPT": CorruptCheckpoint,
    "CKPTIO_E_CHECKSUM": ChecksumMismatch,
    "CKPTIO_E_LIMIT": LimitExceeded,
    "CKPTIO_E_UNSUPPORTED": Unsupported,
    "CKPTIO_E_INTERRUPTED": Interrupted,
    "CKPTIO_E_NOT_DURABLE": NotDurable,
}


#: The attributes that say where an error happened (CheckpointError's values).
VALUES = ("path", "tensor", "rank", "file", "offset", "other_rank", "refused")


def carry_values(src: CheckpointError, dst: CheckpointError) -> CheckpointError:
    """``dst`` with the values ``src`` has (path, tensor, rank, ...): for an exception rebuilt
    from another, so that what the library said as values is not lost. Returns ``dst``."""
    for k in VALUES:
        v = src.__dict__.get(k)
        if v is not None and k not in dst.__dict__:
            setattr(dst, k, v)
    return dst


def _from_code(code: int, name: str, message: str) -> CheckpointError:
    """Build the exception for a libckptio return code (called by ckptio._core)."""
    cls = _BY_NAME.get(name)
    if cls is None:
        if code == -_errno.ENOENT:
            cls = CheckpointNotFound
        elif code == -_errno.EEXIST:
            return CheckpointExists(message, code, name)
        else:
            cls = CheckpointIOError
    return cls(message, code, name)


def error(name: str, message: str, cls: type[CheckpointError] | None = None) -> CheckpointError:
    """The exception for a request the Python layer refuses: ``name`` is the libckptio code's
    name ("CKPTIO_E_USAGE"), whose value comes from the library's table; ``cls`` (default: the
    code's class) may narrow it, e.g. InvalidType for a CKPTIO_E_USAGE about a type."""
    global _codes
    if _codes is None:
        from . import _core  # imported late: _core imports this module as it loads

        _codes = _core.errors()
    return (cls or _BY_NAME[name])(message, _codes[name], name)


_codes: dict[str, int] | None = None
