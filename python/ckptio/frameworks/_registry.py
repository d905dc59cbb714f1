# SPDX-License-Identifier: Apache-2.0
"""The framework registry: every adapter (numpy, torch, jax, cupy), in the order leaves are matched.

It sits above the adapters it lists; the tree walk below them (ckptio._tree) reaches framework
values (torch.Size) through the hooks this module fills as it loads.
"""

from __future__ import annotations

from typing import Any

from .. import _tree
from . import _base
from ._base import Adapter, get
from ._cupy import CUPY
from ._jax import JAX
from ._numpy import NUMPY
from ._torch import TORCH

__all__ = ["REGISTRY", "BY_NAME", "BY_VALUE_TAG", "classify", "classify_like", "get"]

#: Every adapter, in the order leaves are matched: cupy after torch and jax, whose GPU arrays
#: also speak its interface.
REGISTRY: tuple[Adapter, ...] = (NUMPY, TORCH, JAX, CUPY)
BY_NAME: dict[str, Adapter] = _base.BY_NAME
#: The tree walk's own table (ckptio._tree decodes framework values through it).
BY_VALUE_TAG: dict[str, Any] = _tree.BY_VALUE_TAG


def _init() -> None:
    for ad in REGISTRY:
        BY_NAME[ad.name] = ad
        for tag in ad.value_tags:
            BY_VALUE_TAG[tag] = ad
    _tree.VALUE_ADAPTERS[:] = REGISTRY


def classify(obj: Any) -> Adapter | None:
    """The adapter whose tensors include ``obj``, or None."""
    for ad in REGISTRY:
        if ad.matches(obj):
            return ad
    return None


def classify_like(obj: Any) -> Adapter | None:
    for ad in REGISTRY:
        if ad.matches_like(obj):
            return ad
    return None


_init()
