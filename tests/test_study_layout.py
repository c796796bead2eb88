"""The study package's import graph has no circle and the study is its four rooms. The
graph is tests/test_import_graph.py's (every import, module- and function-level, read with
ast; that file's own test shows a circle behind a function-level import is found)."""

from __future__ import annotations

from pathlib import Path

from test_import_graph import circles, graph

STUDY = Path(__file__).resolve().parent.parent / "tiledattention" / "study"


def test_the_study_modules_import_each_other_without_a_circle():
    edges = graph()
    assert "tiledattention.study.publication.create" in edges  # the reader saw the rooms
    assert "tiledattention.study.publication.archive" in \
        edges["tiledattention.study.publication.verify"]
    assert circles(edges, rooms=("tiledattention.study",)) == []


def test_the_study_is_split_into_its_rooms():
    rooms = {p.name for p in STUDY.iterdir() if (p / "__init__.py").is_file()}
    assert rooms == {"presentation", "publication", "references", "advice"}
    assert not (STUDY / "bundle.py").exists() and not (STUDY / "variants.py").exists()
