# SPDX-License-Identifier: Apache-2.0
"""The C library's rooms and the repository's folders, from their source: no circle, no edge up.

Three checks, each drawn from ``#include "..."`` lines (and, for the repository, Python imports):

- src/'s rooms stand on floors (doc/architecture.md draws them; ``SRC_FLOORS`` must match): a
  file includes headers of its own room and of rooms on lower floors only.
- tools/ and the extension's C files (python/ckptio/*.c, *.h) include only the public header
  (and their own folder's headers), never anything under src/.
- The repository's folders stand on floors too (``REPO_FLOORS``): bench/, tests/ and fuzz/ may
  reach anything below them and nothing reaches them; the front ends reach only the public header.

The generated build configuration ``ckptio_config.h`` (meson writes it beside the build) is no
folder's: it holds only CKPTIO_HAVE_* switches, and any C file may include it.
"""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess

import pytest
from test_structure import circles

ROOT = pathlib.Path(__file__).resolve().parents[2]

#: src/'s rooms, bottom to top, as doc/architecture.md draws them. A room includes its own
#: headers and those of rooms on lower floors; rooms on one floor never include each other.
#: ``system.c`` is the one file at src/'s top level.
SRC_FLOORS: list[list[str]] = [
    ["common"],
    ["format", "gpu", "codec"],
    ["io"],
    ["store"],
    ["commit"],
    ["read"],
    ["write"],
    ["ranks", "convert"],
    ["system.c"],
]

#: The repository's folders, bottom to top. A folder reaches its own files and folders on lower
#: floors, never one beside it or above it; ``PUBLIC_ONLY`` narrows that for the front ends.
REPO_FLOORS: list[tuple[str, list[str]]] = [
    ("the public header", ["include"]),
    ("the library", ["src"]),
    ("front ends", ["tools", "python/ckptio"]),
    ("examples", ["examples"]),
    ("checks and benchmarks", ["bench", "tests", "fuzz"]),
]

#: Front ends build on the public API alone: the header (and, for examples, the package).
PUBLIC_ONLY: dict[str, set[str]] = {
    "tools": {"include"},
    "python/ckptio": {"include"},
    "examples": {"include", "python/ckptio"},
}

CONFIG_HEADER = "ckptio_config.h"
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _files(root: pathlib.Path, folder: str, suffixes: tuple[str, ...]) -> list[pathlib.Path]:
    base = root / folder
    return sorted(p for p in base.rglob("*") if p.suffix in suffixes and p.is_file())


def c_includes(
    path: pathlib.Path, root: pathlib.Path
) -> list[tuple[str, int, pathlib.Path | None]]:
    """Each ``#include "..."`` of a C file: (as written, line, the file it names or None when
    it names the build configuration). A header is looked for beside the file, then in
    include/; one found nowhere is reported by the checks as unresolved."""
    text = path.read_text(errors="replace")
    out: list[tuple[str, int, pathlib.Path | None]] = []
    for m in _INCLUDE.finditer(text):
        name = m.group(1)
        line = text.count("\n", 0, m.start()) + 1
        if name == CONFIG_HEADER:
            out.append((name, line, None))
            continue
        for cand in (path.parent / name, root / "include" / name):
            if cand.is_file():
                out.append((name, line, cand.resolve()))
                break
        else:
            out.append((name, line, root / "<unresolved>" / name))
    return out


def _rel(p: pathlib.Path, root: pathlib.Path) -> str:
    try:
        return p.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return p.as_posix()


# ---- src/: rooms on floors ----


def src_room(rel: str) -> str:
    """The room of a path under src/ ("src/read/open.c" -> "read"; "src/system.c" -> "system.c")."""
    parts = rel.split("/")
    assert parts[0] == "src", rel
    return parts[1]


def src_graph(root: pathlib.Path = ROOT) -> dict[str, dict[str, str]]:
    """{room: {other room it includes: "file:line"}} over every C file of src/; an include that
    leaves src/ is not an edge here (the repository check sees it)."""
    graph: dict[str, dict[str, str]] = {}
    for path in _files(root, "src", (".c", ".h")):
        rel = _rel(path, root)
        room = src_room(rel)
        out = graph.setdefault(room, {})
        for _, line, target in c_includes(path, root):
            if target is None:
                continue
            trel = _rel(target, root)
            if trel.startswith("src/") and src_room(trel) != room:
                out.setdefault(src_room(trel), f"{rel}:{line}")
    return graph


def src_upward(graph: dict[str, dict[str, str]], floors: list[list[str]] = SRC_FLOORS) -> list[str]:
    """Each include from a room into one beside it or above it, and each room no floor lists."""
    floor = {room: i for i, rooms in enumerate(floors) for room in rooms}
    bad = [f"src/{r}: not on any floor (add it to SRC_FLOORS and doc/architecture.md)"
           for r in sorted(graph) if r not in floor]  # fmt: skip
    for room, targets in sorted(graph.items()):
        for target, where in sorted(targets.items()):
            if room not in floor or target not in floor:
                continue
            if floor[target] >= floor[room]:
                how = "beside" if floor[target] == floor[room] else "above"
                bad.append(f"{where}: room {room} includes {target}, a room {how} it")
    return bad


def doc_src_floors(text: str) -> list[list[str]]:
    """The floors of doc/architecture.md's drawing, bottom to top: the rooms named on each
    ``floor N`` line (rooms still to come, marked "(coming)", left out)."""
    floors: dict[int, list[str]] = {}
    for m in re.finditer(r"^\s*floor (\d+)\s+(.*)$", text, re.M):
        body = re.sub(r"\S+\s*\(coming\)", "", m.group(2))
        body = body.split("(")[0]
        floors[int(m.group(1))] = [t.rstrip("/") for t in re.findall(r"[\w.]+/|\w+\.c\b", body)]
    return [floors[k] for k in sorted(floors)]


def test_src_rooms_include_down() -> None:
    graph = src_graph()
    assert src_upward(graph) == []
    assert circles({r: dict.fromkeys(t, 0) for r, t in graph.items()}) == []


def test_src_floors_match_the_doc() -> None:
    doc = doc_src_floors((ROOT / "doc" / "architecture.md").read_text())
    assert [sorted(f) for f in doc] == [sorted(f) for f in SRC_FLOORS]


def test_src_floors_name_real_rooms() -> None:
    rooms = {p.name for p in (ROOT / "src").iterdir() if p.is_dir() or p.suffix == ".c"}
    assert sorted(r for f in SRC_FLOORS for r in f if r not in rooms) == []


# ---- src/: rooms on floors by calls ----

#: The library's object files, one per source: ``src_<room>_<file>.c.o``.
OBJECTS = ROOT / "build" / "libckptio.so.0.1.0.p"

#: Files that still call each other around a loop (whole loops, sorted): known, to go.

def _nm(obj: pathlib.Path, *flags: str) -> list[list[str]]:
    out = subprocess.run(["nm", *flags, str(obj)], capture_output=True, text=True, check=True)
    return [line.split() for line in out.stdout.splitlines() if line.strip()]


def call_graph(objects: pathlib.Path = OBJECTS) -> tuple[dict[str, str], dict[str, set[str]]]:
    """From the built objects: {symbol: the source file defining it} and {source file: the
    symbols it uses}, files named "room/file.c" ("system.c" at the top)."""
    defs: dict[str, str] = {}
    uses: dict[str, set[str]] = {}
    for obj in sorted(objects.glob("src_*.c.o")):
        parts = obj.name[len("src_"):-len(".c.o")].split("_", 1)
        name = "system.c" if parts == ["system"] else f"{parts[0]}/{parts[1]}.c"
        for f in _nm(obj, "--defined-only"):
            if len(f) == 3 and f[1] in "TDBR":
                defs[f[2]] = name
        uses[name] = {f[-1] for f in _nm(obj, "-u")}
    return defs, uses


def calls_up(defs: dict[str, str], uses: dict[str, set[str]],
             floors: list[list[str]] = SRC_FLOORS) -> set[tuple[str, str, str]]:  # fmt: skip
    """(caller, symbol, callee) for each call into a room beside or above the caller's."""
    floor = {room: i for i, rooms in enumerate(floors) for room in rooms}
    out = set()
    for f, syms in uses.items():
        for sym in syms:
            g = defs.get(sym)
            if g is None or g == f:
                continue
            a, b = f.split("/")[0], g.split("/")[0]
            if a != b and floor[b] >= floor[a]:
                out.add((f, sym, g))
    return out


def call_circles(defs: dict[str, str], uses: dict[str, set[str]]) -> set[tuple[str, ...]]:
    graph: dict[str, dict[str, int]] = {f: {} for f in uses}
    for f, syms in uses.items():
        for sym in syms:
            g = defs.get(sym)
            if g is not None and g != f:
                graph[f][g] = 0
    return {tuple(sorted(c)) for c in circles(graph)}


@pytest.fixture(scope="module")
def built_calls() -> tuple[dict[str, str], dict[str, set[str]]]:
    if not any(OBJECTS.glob("src_*.c.o")):
        pytest.fail(f"no objects under {OBJECTS}: run `make build` first")
    return call_graph()


def test_src_rooms_call_down(built_calls: tuple[dict[str, str], dict[str, set[str]]]) -> None:
    """A room calls its own files and rooms on lower floors only (no call up or beside), and
    no files call each other around a loop."""
    defs, uses = built_calls
    assert len(defs) > 300 and len(uses) > 60, (len(defs), len(uses))  # really read
    up = calls_up(defs, uses)
    assert sorted(up) == [], "calls into a room beside or above"
    assert sorted(call_circles(defs, uses)) == [], "files calling each other around a loop"


def test_call_check_sees_a_call_up() -> None:
    """The check finds what it is for: a write/ file calling into ranks/, and a loop."""
    defs = {"ckptio_save_dist": "ranks/save_dist.c", "helper": "write/a.c", "back": "write/b.c"}
    uses = {"write/a.c": {"ckptio_save_dist", "back"}, "write/b.c": {"helper"},
            "ranks/save_dist.c": set()}  # fmt: skip
    assert calls_up(defs, uses) == {("write/a.c", "ckptio_save_dist", "ranks/save_dist.c")}
    assert call_circles(defs, uses) == {("write/a.c", "write/b.c")}


# ---- tools/ and the extension: the public header only ----


def private_includes(root: pathlib.Path = ROOT) -> list[str]:
    """Each include of tools/ or of the extension's C files that names a file under src/ (or
    one that is nowhere to be found)."""
    paths = _files(root, "tools", (".c", ".h"))
    paths += sorted(p for p in (root / "python" / "ckptio").glob("*") if p.suffix in (".c", ".h"))
    bad = []
    for path in paths:
        for name, line, target in c_includes(path, root):
            if target is None:
                continue
            trel = _rel(target, root)
            if trel.startswith("src/") or "<unresolved>" in trel:
                bad.append(f"{_rel(path, root)}:{line} includes \"{name}\" ({trel})")
    return bad


def test_tools_and_extension_include_no_private_header() -> None:
    assert private_includes() == []


# ---- the repository: folders on floors ----


def repo_folder(rel: str) -> str | None:
    """The folder of REPO_FLOORS a repository path lies in, or None."""
    names = sorted((f for _, fs in REPO_FLOORS for f in fs), key=len, reverse=True)
    return next((f for f in names if rel == f or rel.startswith(f + "/")), None)


def _py_target(name: str, path: pathlib.Path, root: pathlib.Path) -> str | None:
    """The repository path an absolute import names: the package, or a module found beside
    the importing file or in a folder above it (scripts put their own folder on sys.path);
    None for anything else (the standard library, third parties)."""
    top = name.split(".")[0]
    if top == "ckptio":
        return "python/ckptio"
    d = path.parent
    while True:
        for cand in (d / f"{top}.py", d / top / "__init__.py"):
            if cand.is_file():
                return _rel(cand, root)
        if d == root or root not in d.parents:
            break
        d = d.parent
    if (root / top).is_dir() and repo_folder(top):
        return top
    return None


def py_imports(path: pathlib.Path, root: pathlib.Path) -> list[tuple[str, int, str]]:
    """Each import of a Python file that names something of this repository: (as written,
    line, its path). A relative import stays in the importer's folder."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                out.append(("." * node.level + (node.module or ""), node.lineno, _rel(path, root)))
                continue
            names = [node.module or ""]
        for n in names:
            t = _py_target(n, path, root)
            if t is not None:
                out.append((n, node.lineno, t))
    return out


def repo_graph(root: pathlib.Path = ROOT) -> dict[str, dict[str, str]]:
    """{folder: {folder it reaches: "file:line"}}, from every C include and Python import of
    the folders REPO_FLOORS lists."""
    graph: dict[str, dict[str, str]] = {}
    for folder in [f for _, fs in REPO_FLOORS for f in fs]:
        out = graph.setdefault(folder, {})
        if not (root / folder).is_dir():
            continue
        for path in _files(root, folder, (".c", ".h", ".py")):
            rel = _rel(path, root)
            if repo_folder(rel) != folder:
                continue  # a folder within another one is that one's (python/ckptio in python)
            if path.suffix == ".py":
                edges = [(t, line) for _, line, t in py_imports(path, root)]
            else:
                edges = [(_rel(t, root), line) for _, line, t in c_includes(path, root) if t]
            for trel, line in edges:
                target = repo_folder(trel) or trel
                if target != folder:
                    out.setdefault(target, f"{rel}:{line}")
    return graph


def repo_upward(graph: dict[str, dict[str, str]]) -> list[str]:
    """Each edge from a folder to one beside it or above it, to one outside the floors, or, from
    a front end, to anything but the public API."""
    floor = {f: i for i, (_, fs) in enumerate(REPO_FLOORS) for f in fs}
    bad = []
    for folder, targets in sorted(graph.items()):
        for target, where in sorted(targets.items()):
            if target not in floor:
                bad.append(f"{where}: {folder} reaches {target}, in no folder of REPO_FLOORS")
            elif folder in PUBLIC_ONLY and target not in PUBLIC_ONLY[folder]:
                bad.append(f"{where}: {folder} reaches {target}; it may reach only "
                           f"{', '.join(sorted(PUBLIC_ONLY[folder]))}")  # fmt: skip
            elif floor[target] >= floor[folder]:
                how = "beside" if floor[target] == floor[folder] else "above"
                bad.append(f"{where}: {folder} reaches {target}, a folder {how} it")
    return bad


def test_repository_folders_reach_down() -> None:
    graph = repo_graph()
    assert repo_upward(graph) == []
    assert circles({f: dict.fromkeys(t, 0) for f, t in graph.items()}) == []


def test_repository_graph_sees_edges() -> None:
    """The graph is drawn from real edges: the checks would see a break."""
    graph = repo_graph()
    assert "include" in graph["src"] and "include" in graph["tools"]
    assert "src" in graph["tests"] and "python/ckptio" in graph["tests"]
    assert "src" in graph["bench"] and "src" in graph["fuzz"]


# ---- each check fails on a broken tree ----


def _tree(tmp: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for rel, text in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    return tmp


_GOOD = {
    "include/ckptio.h": "",
    "src/common/common.h": '#include "ckptio.h"\n',
    "src/io/engine.h": '#include "../common/common.h"\n',
    "src/format/manifest.h": '#include "../common/common.h"\n',
    "tools/main.c": '#include "ckptio.h"\n',
    "python/ckptio/_core.c": '#include "ckptio.h"\n',
    "python/ckptio/__init__.py": "",
    "bench/merge.c": '#include "../src/format/manifest.h"\n',
    "bench/run.py": "import ckptio\nimport common\n",
    "bench/common.py": "import os\n",
    "tests/test_x.c": '#include "../src/io/engine.h"\n',
    "tests/python/test_y.py": "import ckptio\nimport numpy\n",
    "fuzz/f.c": '#include "../src/format/manifest.h"\n',
    "examples/e.c": '#include "ckptio.h"\n',
}


def test_good_tree_passes(tmp_path: pathlib.Path) -> None:
    root = _tree(tmp_path, _GOOD)
    assert src_upward(src_graph(root)) == []
    assert private_includes(root) == []
    assert repo_upward(repo_graph(root)) == []


@pytest.mark.parametrize(
    ("rel", "text", "want"),
    [
        ("src/common/util.c", '#include "../io/engine.h"\n', "common includes io, a room above"),
        ("src/format/x.c", '#include "../gpu/cuda.h"\n', "room format includes gpu, a room beside"),
        ("src/cache/x.c", '#include "../common/common.h"\n', "src/cache: not on any floor"),
    ],
)
def test_src_check_fails_on_a_break(tmp_path: pathlib.Path, rel: str, text: str, want: str) -> None:
    root = _tree(tmp_path, {**_GOOD, "src/gpu/cuda.h": "", rel: text})
    bad = src_upward(src_graph(root))
    assert any(want in b for b in bad), bad


def test_src_circle_is_seen(tmp_path: pathlib.Path) -> None:
    root = _tree(tmp_path, {**_GOOD, "src/common/x.c": '#include "../io/engine.h"\n'})
    graph = src_graph(root)
    assert circles({r: dict.fromkeys(t, 0) for r, t in graph.items()}) == [["common", "io"]]


@pytest.mark.parametrize(
    "rel", ["tools/inspect.c", "python/ckptio/_st.c", "python/ckptio/_core.h"]
)
def test_private_include_is_seen(tmp_path: pathlib.Path, rel: str) -> None:
    root = _tree(tmp_path, {**_GOOD, rel: '#include "../src/format/manifest.h"\n'})
    assert private_includes(root) == [
        f'{rel}:1 includes "../src/format/manifest.h" (src/format/manifest.h)'
    ]
    assert any(f"{rel}:1:" in b and "may reach only" in b for b in repo_upward(repo_graph(root)))


@pytest.mark.parametrize(
    ("rel", "text", "want"),
    [
        ("tests/python/test_z.py", "import bench.run\n", "tests reaches bench, a folder beside"),
        ("tests/test_b.c", '#include "../bench/merge.c"\n', "tests reaches bench, a folder beside"),
        ("bench/b.py", "from tests import conftest\n", "bench reaches tests, a folder beside"),
        ("tools/x.c", '#include "nowhere.h"\n', "tools reaches <unresolved>/nowhere.h"),
        ("src/common/x.c", '#include "../../tools/cli.h"\n', "src reaches tools, a folder above"),
        ("python/ckptio/_x.py", "import bench\n", "python/ckptio reaches bench; it may reach only"),
        ("examples/e2.c", '#include "../src/io/engine.h"\n', "examples reaches src; it may"),
        ("include/ckptio_x.h", '#include "../src/io/engine.h"\n', "include reaches src, a folder"),
    ],
)
def test_repository_check_fails_on_a_break(
    tmp_path: pathlib.Path, rel: str, text: str, want: str
) -> None:
    root = _tree(tmp_path, {**_GOOD, "tools/cli.h": "", rel: text})
    bad = repo_upward(repo_graph(root))
    assert any(want in b for b in bad), bad


def test_doc_floors_are_read(tmp_path: pathlib.Path) -> None:
    text = (ROOT / "doc" / "architecture.md").read_text()
    assert doc_src_floors(text)[1] == ["format", "gpu", "codec"]
    moved = text.replace("floor 4  commit/", "floor 4  commit/  gpu/")
    assert [sorted(f) for f in doc_src_floors(moved)] != [sorted(f) for f in SRC_FLOORS]
