"""The kernel notes, split by topic: benchmarks/NOTES.md is the index (a table of every section,
its topic file and title), benchmarks/notes/<topic>.md hold the sections. Every "§NN" cited
anywhere in the repository resolves: in the topic file a citation names
("benchmarks/notes/backward.md §28"), else in the index ("NOTES §28", and a bare "§28" in the
notes or the code). benchmarks/notes/recite.py rewrites the old citations; the repository
passes these checks before and after it runs."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from test_readme_links import anchors

ROOT = Path(__file__).resolve().parent.parent
NOTES = ROOT / "benchmarks" / "notes"
_spec = importlib.util.spec_from_file_location("recite", NOTES / "recite.py")
recite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recite)

TOPICS = sorted(p.name for p in NOTES.glob("*.md"))
HEADING = re.compile(r"^#{2,3} (\d+[a-z]?)\. ", flags=re.M)
# Files that number their own sections: a bare "§2" there is theirs, not the notes'.
OWN_SECTIONS = {"benchmarks/repro/README.md"}
NEW = re.compile(rf"(?<![\w./-])(?:\.\./)*(?:benchmarks/)?notes/(?P<file>[\w-]+\.md)\s+"
                 rf"(?P<refs>{recite.LIST})")
OLD = re.compile(rf"NOTES(?:\.md)?\s+(?P<refs>{recite.LIST})")
BARE = re.compile(rf"{recite.LIST}")
LINK = re.compile(r"\]\((?:\.\./)*(?:benchmarks/)?notes/([\w-]+\.md)#([^)\s]+)\)")


def _numbered(text: str) -> set[str]:
    return set(HEADING.findall(text))


INDEX = recite.sections()
IN_FILE = {name: _numbered((NOTES / name).read_text()) for name in TOPICS}


def test_each_topic_file_starts_with_a_title_and_a_two_line_summary():
    for name in TOPICS:
        lines = (NOTES / name).read_text().split("\n")
        assert lines[0].startswith("# "), name
        assert lines[1].strip() and lines[2].strip() and lines[3] == "", name


def test_the_index_gives_every_section_its_file_and_heading_once():
    text = (ROOT / "benchmarks" / "NOTES.md").read_text()
    rows = re.findall(r"^\| (\S+) \| \[([\w.-]+)\]\(notes/([\w.-]+)#([^)]*)\) \| (.+) \|$",
                      text, flags=re.M)
    numbered = [r[0] for r in rows if r[0] != "–"]
    assert len(numbered) == len(set(numbered)), "a section listed twice"
    for sec, shown, name, anchor, _title in rows:
        assert shown == name and name in TOPICS, (sec, name)
        assert anchor in anchors((NOTES / name).read_text()), (sec, name, anchor)
        if sec != "–":
            assert sec in IN_FILE[name], f"§{sec} is not in {name}"
    for name, secs in IN_FILE.items():
        for sec in secs:
            assert INDEX.get(sec, ("",))[0] == name, f"{name} §{sec} is not in the index"
    # each topic file is linked once from the index's topic list
    for name in TOPICS:
        assert f"- [{name}](notes/{name})" in text, name


def citation_errors(name: str, text: str) -> list[str]:
    """What in ``text`` (the file ``name``) cites a section that is not where it points."""
    errors = []
    where = lambda m: f"{name}:{text.count(chr(10), 0, m.start()) + 1}"  # noqa: E731
    spans = []
    for m in NEW.finditer(text):
        spans.append(m.span())
        if m["file"] not in IN_FILE:
            errors.append(f"{where(m)}: no topic file {m['file']}")
            continue
        missing = [s for s in recite.ids(m["refs"]) if s not in IN_FILE[m["file"]]]
        errors += [f"{where(m)}: §{s} is not in {m['file']}" for s in missing]
    for m in OLD.finditer(text):
        spans.append(m.span())
        errors += [f"{where(m)}: §{s} is not in the index" for s in recite.ids(m["refs"])
                   if s not in INDEX]
    for m in LINK.finditer(text):
        if m[1] in IN_FILE and m[2] not in anchors((NOTES / m[1]).read_text()):
            errors.append(f"{where(m)}: no heading #{m[2]} in {m[1]}")
    own = _numbered(text) if name in OWN_SECTIONS else None
    for m in BARE.finditer(text):
        if any(a <= m.start() < b for a, b in spans):
            continue
        for s in recite.ids(m[0]):
            if s not in (own if own is not None else INDEX):
                errors.append(f"{where(m)}: §{s} is not in "
                              f"{'this file' if own is not None else 'the index'}")
    return errors


def _texts():
    yield "benchmarks/NOTES.md", (ROOT / "benchmarks" / "NOTES.md").read_text()
    for name in TOPICS:
        yield f"benchmarks/notes/{name}", (NOTES / name).read_text()
    yield from recite.tracked_texts(ROOT)


TEXTS = dict(_texts())


def test_every_section_cited_in_the_repository_exists_where_it_points():
    errors = [e for name, text in TEXTS.items() for e in citation_errors(name, text)]
    assert not errors, "\n".join(errors)


def test_the_citations_recite_writes_resolve_and_a_second_run_changes_nothing():
    for name, text in TEXTS.items():
        if not name.startswith("benchmarks/notes/") and name != "benchmarks/NOTES.md":
            new, changes, unknown = recite.recite_text(text, INDEX)
            assert not unknown, (name, unknown)
            assert not citation_errors(name, new), citation_errors(name, new)
            assert recite.recite_text(new, INDEX)[0] == new, name
            assert not OLD.search(new), (name, changes)


@pytest.mark.parametrize("old,new", [
    ("(NOTES §39e)", "(benchmarks/notes/variants.md §39e)"),
    ("benchmarks/NOTES.md §17b's", "benchmarks/notes/backward.md §17b's"),
    ("NOTES §25, §28, §32", "benchmarks/notes/backward.md §25, §28; "
                            "benchmarks/notes/study-pipeline.md §32"),
    ("NOTES\n§27)", "benchmarks/notes/study-pipeline.md\n§27)"),
    ("NOTES §36g, §37a", "benchmarks/notes/backward.md §36g, §37a"),
    ('NOTES "PDL"', 'NOTES "PDL"'),  # no section: the index, as before
    ("[the notes](../benchmarks/NOTES.md)", "[the notes](../benchmarks/NOTES.md)"),
])
def test_recite_names_the_topic_file_of_each_cited_section(old, new):
    assert recite.recite_text(old, INDEX)[0] == new


def test_recite_links_a_markdown_citation_to_the_sections_heading():
    new = recite.recite_text("[NOTES §35c](../benchmarks/NOTES.md)", INDEX)[0]
    assert new == ("[benchmarks/notes/decode.md §35c](../benchmarks/notes/decode.md"
                   f"#{INDEX['35c'][1]})")
    assert INDEX["35c"][1] in anchors((NOTES / "decode.md").read_text())
    # a range across topic files: one link per file, runs of three kept as a range
    new = recite.recite_text("[NOTES §13–16](NOTES.md)", INDEX)[0]
    assert new.count("](notes/") == len({INDEX[s][0] for s in ("13", "14", "15", "16")})


def test_recite_leaves_an_unknown_section_and_reports_it():
    text, changes, unknown = recite.recite_text("see NOTES §99z", INDEX)
    assert text == "see NOTES §99z" and not changes and unknown == ["NOTES §99z"]


def test_recite_pushes_a_long_comment_line_onto_the_next_within_the_width():
    text = ("    # " + "word " * 17 + "benchmarks/notes/backward.md §28 ends\n"
            "    # the next line.\n")
    new, left = recite.reflow(text, {1}, python=True)
    assert not left and all(len(r) <= recite.WIDTH for r in new.split("\n"))
    words = lambda t: [w for w in t.split() if w != "#"]  # noqa: E731
    assert words(new) == words(text)
    # a trailing comment after code is left to a person
    code = "x = 1  # " + "w " * 50 + "\n"
    assert recite.reflow(code, {1}, python=True) == (code, [1])
