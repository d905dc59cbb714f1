# SPDX-License-Identifier: Apache-2.0
"""The parts the tier tests save: each rank's tree at each step, built the same way by the rank
programs (dist/tier_*.py) and by the tests that check what is on disk."""

from __future__ import annotations

from typing import Any

import numpy as np

SMALL = 64 << 10  # bytes of "w" in a part unless a test asks for more


def part(rank: int, step: int, nbytes: int = SMALL) -> dict[str, Any]:
    """Rank ``rank``'s tree at ``step``: "w" (int64, ``nbytes`` bytes, different for every
    rank and step), "b" (float64), and the rank and step as plain ints."""
    w = np.arange(nbytes // 8, dtype=np.int64) * (rank + 1) + step * 1_000_003
    b = np.full((3,), rank * 100.0 + step + 0.5)
    return {"w": w, "b": b, "rank": rank, "step": step}


def same(got: Any, rank: int, step: int, nbytes: int = SMALL) -> bool:
    """Whether a restored tree (torch tensors or numpy arrays) is ``part(rank, step, nbytes)``
    exactly: equal values, dtypes and shapes, and the same plain leaves."""
    want = part(rank, step, nbytes)
    if not isinstance(got, dict) or sorted(got) != sorted(want):
        return False
    for k in ("w", "b"):
        g = got[k]
        g = g.numpy() if hasattr(g, "numpy") else np.asarray(g)
        if g.dtype != want[k].dtype or not np.array_equal(g, want[k]):
            return False
    return bool(got["rank"] == rank and got["step"] == step)


def size_of(sizes: dict[str, Any], rank: int, step: int) -> int:
    """The bytes of rank ``rank``'s "w" at ``step`` in a test's ``sizes`` ({"<step>": [bytes
    per rank]}), SMALL where it says nothing."""
    per = sizes.get(str(step))
    return int(per[rank]) if per is not None and rank < len(per) else SMALL


def save_lose_restore(
    comm: Any,
    rank: int,
    node: int,
    barrier: Any,
    run: dict[str, Any],
    tree: Any = None,
    check: Any = None,
) -> dict[str, Any]:
    """The flow of the MPI and JAX rank programs: every rank saves steps 1 and 2 of its part
    (``tree(step)``, default part(rank, step)) through a Manager with the peer tier on (node
    ``node``: its id is "n<node>", its root run["roots"][node]); then the first rank of node
    run["lose"] deletes that node's whole root; then a new Manager restores, and
    ``check(restored)`` says which step it holds and whether it is exact (default: same()).
    ``barrier()`` is the runtime's own barrier, between the phases. Returns what the test
    checks."""
    import os
    import shutil

    import ckptio

    tree = tree or (lambda s: part(rank, s))
    check = check or (lambda out: (out["step"], same(out, rank, out["step"])))

    def manager() -> ckptio.Manager:
        return ckptio.Manager(run["persist"], comm=comm, local=run["roots"][node],
                              node=f"n{node}", replicas=1, persist_every=None, timeout=20)

    m = manager()
    for s in (1, 2):
        m.save(s, tree(s))
    m.wait_until_finished()
    last_save = m.last_save
    barrier()  # every push has ended before any rank stops serving
    m.close()
    barrier()
    if rank == run["first_of_lost"]:
        shutil.rmtree(run["roots"][run["lose"]])
    barrier()
    m = manager()
    step, ok = check(m.restore())
    res = {"step": step, "ok": ok, "last_restore": m.last_restore, "last_save": last_save,
           "root": sorted(os.listdir(os.path.join(run["roots"][node], "2"))), "m": m}
    barrier()  # every rank has fetched what it needed before peers stop serving
    return res
