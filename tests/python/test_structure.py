# SPDX-License-Identifier: Apache-2.0
"""The Python package's import graph, from its source: no circle, and no import from a floor to one above it.

Every import counts, at module level or inside a function: a lower floor that imports a higher
one only when a function runs still depends on it. The floors are listed here bottom to top,
as ckptio/__init__.py's docstring draws them; a new module must be given one.
"""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

PKG = pathlib.Path(__file__).resolve().parents[2] / "python" / "ckptio"

#: Bottom to top. A module may import modules of its own floor (without a circle) and of the
#: floors below it, never one above.
FLOORS: list[tuple[str, list[str]]] = [
    ("base", ["ckptio._core", "ckptio._errors", "ckptio._dtypes", "ckptio._options",
              "ckptio._tree"]),
    ("framework common ground", ["ckptio.frameworks", "ckptio.frameworks._base",
                                 "ckptio.frameworks._gpu"]),
    ("framework adapters", ["ckptio.frameworks._numpy", "ckptio.frameworks._torch",
                            "ckptio.frameworks._jax", "ckptio.frameworks._cupy"]),
    ("framework registry", ["ckptio.frameworks._registry"]),
    ("staging", ["ckptio._stage"]),
    ("ranks", ["ckptio.ranks", "ckptio.ranks._comm", "ckptio.ranks._dist",
               "ckptio.ranks._share"]),
    ("save and load", ["ckptio._save", "ckptio._mapped", "ckptio._into", "ckptio._load",
                       "ckptio._async", "ckptio._tiers", "ckptio._manager"]),
    ("formats", ["ckptio.formats", "ckptio.safetensors", "ckptio.formats._hf",
                 "ckptio.orbax", "ckptio.formats._torch_state", "ckptio.formats._torch_dcp",
                 "ckptio.formats._torch_zip",
                 "ckptio._convert"]),
    ("public", ["ckptio", "ckptio.torch", "ckptio.__main__",
                "ckptio.lightning", "ckptio.hf", "ckptio.deepspeed"]),
]  # fmt: skip


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str, root: pathlib.Path) -> bool:
    """Whether ``name`` (ckptio....) is a module or package of the source tree (the C
    extension counts by its stub, _core.pyi)."""
    rel = pathlib.Path(*name.split(".")[1:]) if "." in name else pathlib.Path()
    base = root / rel
    return base.with_suffix(".py").is_file() or base.with_suffix(".pyi").is_file() or (
        base / "__init__.py"
    ).is_file()


def import_graph(root: pathlib.Path = PKG) -> dict[str, dict[str, int]]:
    """{module: {imported ckptio module: line of the first such import}}, every import of
    every module under ``root`` (module level and inside functions alike)."""
    graph: dict[str, dict[str, int]] = {}
    for path in sorted(root.rglob("*.py")):
        mod = _module_name(path, root)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        out = graph.setdefault(mod, {})
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                for a in node.names:
                    sub = f"{src}.{a.name}"
                    targets.append(sub if _is_module(sub, root) else src)
            for t in targets:
                if t == "ckptio" or t.startswith("ckptio."):
                    out.setdefault(t, node.lineno)
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module that imports
    itself), each sorted (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, {}):
                found.append(sorted(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def upward(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each import from a floor to a higher one, and each module no floor lists."""
    floor = {m: i for i, (_, mods) in enumerate(FLOORS) for m in mods}
    bad = [f"{m}: not on any floor (add it to FLOORS)" for m in sorted(graph) if m not in floor]
    for m, targets in sorted(graph.items()):
        for t, line in sorted(targets.items()):
            if m in floor and t in floor and floor[t] > floor[m]:
                bad.append(
                    f"{m} (line {line}, floor '{FLOORS[floor[m]][0]}') imports {t} "
                    f"(floor '{FLOORS[floor[t]][0]}')"
                )
    return bad


def test_no_circles() -> None:
    assert circles(import_graph()) == []


def test_imports_point_down() -> None:
    assert upward(import_graph()) == []


def test_floors_name_real_modules() -> None:
    graph = import_graph()
    missing = [m for _, mods in FLOORS for m in mods if m not in graph and m != "ckptio._core"]
    assert missing == []


def test_docstring_lists_the_floors() -> None:
    """ckptio/__init__.py's docstring names each floor, bottom to top, as FLOORS does."""
    doc = ast.get_docstring(ast.parse((PKG / "__init__.py").read_text())) or ""
    doc = doc[doc.find("Floors, bottom to top") :]
    at = [doc.find(name) for name, _ in FLOORS]
    assert -1 not in at, [name for name, _ in FLOORS if name not in doc]
    assert at == sorted(at)


@pytest.mark.parametrize(
    ("edges", "want"),
    [({"a": {"b": 1}, "b": {"a": 2}}, [["a", "b"]]), ({"a": {"b": 1}, "b": {}}, [])],
)
def test_circles_finds_a_loop(edges: dict[str, dict[str, int]], want: list[list[str]]) -> None:
    assert circles(edges) == want


#: What only ranks/_comm.py asks a runtime: who this process is among how many (rank and size).
RANK_CALLS = {"get_rank", "get_world_size", "is_initialized", "process_index", "process_count",
              "Get_rank", "Get_size"}  # fmt: skip


def rank_questions() -> list[str]:
    """'module:line call' for each call of RANK_CALLS outside ranks/_comm.py."""
    found = []
    for path in sorted(PKG.rglob("*.py")):
        if path == PKG / "ranks" / "_comm.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in RANK_CALLS:
                    found.append(f"{path.relative_to(PKG)}:{node.lineno} {node.func.attr}")
    return found


def test_ranks_come_from_comm_only() -> None:
    """A communicator becomes a rank and a size in one place (ranks/_comm.py: resolve, or
    running for a runtime already up); nowhere else asks torch, JAX or MPI who it is."""
    assert rank_questions() == []
