# SPDX-License-Identifier: Apache-2.0
"""How often the Python layer enters the C engine, and walks a tree, for the walks a user makes most: a local save and load of a nested state, a safetensors file's load_file and save_file, ckptio.torch's save and load.

    python bench/crossings.py --out bench/results/crossings-<date>/new

Crossings are calls of ckptio._core's functions and of its objects' methods (what the profiler
reports as C calls into that module), counted over one call of each walk after one untimed
warm-up call; tree walks are calls into ckptio._tree's walkers (flatten, unflatten,
iter_leaves) from outside that module. The state: ``--dicts`` nested dicts of ``--per-dict``
float32 tensors each (and one int leaf per dict).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import ckptio  # noqa: E402
from ckptio import _core  # noqa: E402

from common import write_results  # noqa: E402

_WALKERS = {"flatten", "unflatten", "iter_leaves"}
_CORE_TYPES = tuple(t for t in vars(_core).values() if isinstance(t, type))


def count(fn: Callable[[], Any]) -> dict[str, Any]:
    """Run ``fn`` once, counting its calls into ckptio._core and into _tree's walkers."""
    calls: collections.Counter[str] = collections.Counter()
    walks: collections.Counter[str] = collections.Counter()

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call":
            owner = getattr(arg, "__self__", None)
            if getattr(arg, "__module__", None) == "ckptio._core":
                calls[arg.__name__] += 1
            elif isinstance(owner, _CORE_TYPES):
                calls[f"{type(owner).__name__}.{arg.__name__}"] += 1
        elif event == "call":
            code = frame.f_code
            if code.co_name in _WALKERS and frame.f_globals.get("__name__") == "ckptio._tree":
                back = frame.f_back
                if back is None or back.f_globals.get("__name__") != "ckptio._tree":
                    walks[code.co_name] += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return {"crossings": sum(calls.values()), "walks": sum(walks.values()),
            "by_call": dict(calls.most_common()), "by_walker": dict(walks)}  # fmt: skip


def state(dicts: int, per: int) -> dict[str, Any]:
    return {f"block{d}": {**{f"w{i}": np.full(256, d * per + i, np.float32) for i in range(per)},
                          "step": d} for d in range(dicts)}  # fmt: skip


def walks(d: str, dicts: int, per: int) -> dict[str, Callable[[], Any]]:
    tree = state(dicts, per)
    flat = {f"{k}.{n}": v for k, sub in tree.items() for n, v in sub.items()
            if isinstance(v, np.ndarray)}  # fmt: skip
    out: dict[str, Callable[[], Any]] = {
        "ckptio.save (local)": lambda: ckptio.save(tree, os.path.join(d, "ck"), overwrite=True),
        "ckptio.load": lambda: ckptio.load(os.path.join(d, "ck")),
    }
    import ckptio.safetensors as cst

    st_path = os.path.join(d, "m.safetensors")
    out["safetensors.save_file"] = lambda: cst.save_file(flat, st_path)
    out["safetensors.load_file"] = lambda: cst.load_file(st_path, framework="np")
    try:
        import torch

        import ckptio.torch as ct

        tt = {k: torch.from_numpy(v) for k, v in flat.items()}
        out["ckptio.torch.save"] = lambda: ct.save(tt, os.path.join(d, "t.pt"))
        out["ckptio.torch.load"] = lambda: ct.load(os.path.join(d, "t.pt"))
    except ImportError:
        pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dicts", type=int, default=16)
    ap.add_argument("--per-dict", type=int, default=8)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "crossings"))
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="ckptio-crossings-")
    rows = []
    try:
        for name, fn in walks(d, args.dicts, args.per_dict).items():
            fn()  # warm-up: imports, first-use tables
            got = count(fn)
            rows.append({"walk": name, **got})
            top = ", ".join(f"{k} {v}" for k, v in list(got["by_call"].items())[:4])
            print(f"{name:24s} {got['crossings']:5d} crossings, {got['walks']:2d} tree walks  ({top})",
                  flush=True)  # fmt: skip
    finally:
        shutil.rmtree(d, ignore_errors=True)
    doc = {"bench": "crossings", "dicts": args.dicts, "per_dict": args.per_dict,
           "tensors": args.dicts * args.per_dict, "rows": rows,
           "ckptio": getattr(ckptio, "__version__", "?")}  # fmt: skip
    print(write_results(doc, args.out))


if __name__ == "__main__":
    main()
