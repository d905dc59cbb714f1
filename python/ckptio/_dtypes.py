# SPDX-License-Identifier: Apache-2.0
"""Dtype tables: ckptio's on-disk dtype codes and their numpy and ml_dtypes equivalents (torch's
are in ckptio.frameworks._torch)."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from ._errors import DTYPE, error

# The on-disk codes of include/ckptio.h (CKPTIO_DTYPE_TABLE); they never change.
BOOL, U8, I8, U16, I16, U32, I32, U64, I64 = 1, 2, 3, 4, 5, 6, 7, 8, 9
F16, BF16, F32, F64, C64, C128, F8_E4M3FN, F8_E5M2, BYTES = 10, 11, 12, 13, 14, 15, 16, 17, 18

NAMES = {
    BOOL: "bool", U8: "u8", I8: "i8", U16: "u16", I16: "i16", U32: "u32", I32: "i32",
    U64: "u64", I64: "i64", F16: "f16", BF16: "bf16", F32: "f32", F64: "f64", C64: "c64",
    C128: "c128", F8_E4M3FN: "f8_e4m3fn", F8_E5M2: "f8_e5m2", BYTES: "bytes",
}  # fmt: skip

ITEMSIZE = {
    BOOL: 1, U8: 1, I8: 1, U16: 2, I16: 2, U32: 4, I32: 4, U64: 8, I64: 8, F16: 2, BF16: 2,
    F32: 4, F64: 8, C64: 8, C128: 16, F8_E4M3FN: 1, F8_E5M2: 1, BYTES: 1,
}  # fmt: skip

def ml_dtypes() -> Any:
    """The ml_dtypes module, or None when it is not installed."""
    try:
        import ml_dtypes as m
    except ImportError:  # pragma: no cover - ml_dtypes comes with jax and our requirements
        return None
    return m


class _Table(dict[Any, Any]):
    """A lookup table whose ml_dtypes entries (bf16, float8) are added at the first lookup that
    misses: importing ml_dtypes costs most of a second, which a load of plain dtypes never pays."""

    def __init__(self, base: dict[Any, Any], extra: Any) -> None:
        super().__init__(base)
        self._extra = extra

    def _complete(self) -> bool:
        if self._extra is None:
            return False
        extra, self._extra = self._extra, None
        self.update(extra())
        return True

    def __missing__(self, key: Any) -> Any:
        if self._complete():
            return self[key]
        raise KeyError(key)

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or (self._complete() and dict.__contains__(self, key))


def _ml_codes() -> dict[np.dtype[Any], int]:
    m = ml_dtypes()
    if m is None:
        return {}
    return {np.dtype(m.bfloat16): BF16, np.dtype(m.float8_e4m3fn): F8_E4M3FN,
            np.dtype(m.float8_e5m2): F8_E5M2}  # fmt: skip


_PLAIN: dict[np.dtype[Any], int] = {
    np.dtype(np.bool_): BOOL, np.dtype(np.uint8): U8, np.dtype(np.int8): I8,
    np.dtype(np.uint16): U16, np.dtype(np.int16): I16, np.dtype(np.uint32): U32,
    np.dtype(np.int32): I32, np.dtype(np.uint64): U64, np.dtype(np.int64): I64,
    np.dtype(np.float16): F16, np.dtype(np.float32): F32, np.dtype(np.float64): F64,
    np.dtype(np.complex64): C64, np.dtype(np.complex128): C128,
}  # fmt: skip


@cache
def np_to_code() -> dict[np.dtype[Any], int]:
    """numpy dtype (native byte order) -> ckptio code, for the dtypes stored as themselves."""
    return _Table(_PLAIN, _ml_codes)


@cache
def code_to_np() -> dict[int, np.dtype[Any]]:
    """ckptio code -> numpy dtype (bf16 and float8 need ml_dtypes; without it they are absent)."""
    base: dict[int, np.dtype[Any]] = {code: dt for dt, code in _PLAIN.items()}
    base[BYTES] = np.dtype(np.uint8)
    return _Table(base, lambda: {code: dt for dt, code in _ml_codes().items()})


def np_dtype_name(dt: np.dtype[Any]) -> str:
    """A name np_dtype_from_name() turns back into ``dt`` (for dtypes stored as raw bytes)."""
    m = ml_dtypes()
    if m is not None and dt.kind == "V" and dt.names is None and hasattr(m, dt.name):
        return "ml_dtypes:" + dt.name
    return dt.str


def np_dtype_from_name(name: str) -> np.dtype[Any]:
    if name.startswith("ml_dtypes:"):
        m = ml_dtypes()
        if m is None:
            raise error(DTYPE, f"dtype {name[10:]} needs the ml_dtypes package")
        return np.dtype(getattr(m, name[10:]))
    return np.dtype(name)


def np_for_code(code: int) -> np.dtype[Any]:
    """The numpy dtype of on-disk code ``code``."""
    dt = code_to_np().get(code)
    if dt is None:
        raise error(DTYPE, f"dtype {NAMES.get(code, code)} needs the ml_dtypes package")
    return dt
