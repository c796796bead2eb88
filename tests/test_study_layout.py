"""The study package's import graph has no circle: every import between its modules, at
module level and inside functions alike, read from the source (ast), so a circle hidden
behind a function-level import is found too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUDY = ROOT / "tiledattention" / "study"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in STUDY.rglob("*.py")}


def _imported(path: Path, name: str, known: set[str]) -> set[str]:
    """The study modules that ``path`` (module ``name``) imports, anywhere in its code."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from pkg import mod` imports the module pkg.mod, and pkg itself
            targets = [target] + [f"{target}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # a name inside a module: the module
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imported(path, name, set(mods)) for name, path in mods.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_reader_finds_a_circle_behind_a_function_level_import(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from .b import f\n")
    b.write_text("def g():\n    from .a import h\n")
    known = {"pkg.a", "pkg.b"}
    graph = {"pkg.a": _imported(a, "pkg.a", known), "pkg.b": _imported(b, "pkg.b", known)}
    assert _circles(graph) == [["pkg.a", "pkg.b"]]


def test_the_study_modules_import_each_other_without_a_circle():
    graph = _graph()
    assert "tiledattention.study.publication.create" in graph  # the reader saw the rooms
    assert "tiledattention.study.publication.archive" in \
        graph["tiledattention.study.publication.verify"]
    assert _circles(graph) == []


def test_the_study_is_split_into_its_rooms():
    rooms = {p.name for p in STUDY.iterdir() if (p / "__init__.py").is_file()}
    assert rooms == {"presentation", "publication", "references", "advice"}
    assert not (STUDY / "bundle.py").exists() and not (STUDY / "variants.py").exists()
