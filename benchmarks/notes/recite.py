"""Rewrite old citations of the kernel notes to name the topic file that now holds the section.

benchmarks/NOTES.md was one file; its sections now live in benchmarks/notes/<topic>.md and
NOTES.md is their index (a table: section -> topic file -> title). This script reads that
table and rewrites, in every tracked text file, each

    NOTES §39e  /  benchmarks/NOTES.md §17b  /  NOTES §25, §28, §32  /  NOTES §13–16
    [NOTES §35c](../benchmarks/NOTES.md)

to name the file(s): ``benchmarks/notes/variants.md §39e``, ``benchmarks/notes/backward.md
§25, §28; benchmarks/notes/study-pipeline.md §32``, and a Markdown link to the topic file at
the first cited section's heading. Citations without a section (``benchmarks/NOTES.md`` as a
whole, ``NOTES "PDL"``) point at the index and are left alone. Idempotent: a second run
changes nothing. Prints each change as ``path:line: old -> new``.

    python benchmarks/notes/recite.py            # rewrite in place
    python benchmarks/notes/recite.py --dry-run  # print what it would change, write nothing
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INDEX = ROOT / "benchmarks" / "NOTES.md"
NOTES_DIR = "benchmarks/notes"
# The index, and the test whose examples are old citations on purpose.
SKIP = {"benchmarks/NOTES.md", "tests/test_notes_index.py"}

# One section id, and a list of them: "§28", "§17, §28", "§36g/§37a", "§13–16".
SECTION = r"\d+[a-z]?"
LIST = rf"§{SECTION}(?:(?:,[ \t]*|/)§{SECTION}|–\d+)*"
# "[NOTES §35c](../benchmarks/NOTES.md)"
OLD_LINK = (rf"\[NOTES(?P<lsep>\s+)(?P<lrefs>{LIST})\]"
            rf"\((?P<dir>(?:\.\./)*(?:benchmarks/)?)NOTES\.md\)")
# "NOTES §37a", "benchmarks/NOTES.md §17b", "NOTES\n§27"
OLD_PLAIN = (rf"(?<![\w/.-])(?:\.\./)*(?:benchmarks/)?NOTES(?:\.md)?"
             rf"(?P<sep>\s+)(?P<refs>{LIST})")
CITATION = re.compile(f"{OLD_LINK}|{OLD_PLAIN}")
_ROW = re.compile(r"^\| (?P<sec>\S+) \| \[(?P<file>[\w.-]+)\]\(notes/[\w.-]+#(?P<anchor>[^)]*)\)"
                  r" \| .* \|$")


def sections(index: Path = INDEX) -> dict[str, tuple[str, str]]:
    """Section id -> (topic file name, heading anchor), from the index's table."""
    out = {}
    for line in index.read_text().splitlines():
        m = _ROW.match(line)
        if m and m["sec"] != "–":
            out[m["sec"]] = (m["file"], m["anchor"])
    return out


def ids(refs: str) -> list[str]:
    """The section ids a list names, a range "§13–16" expanded."""
    out: list[str] = []
    for m in re.finditer(rf"§({SECTION})|–(\d+)", refs):
        if m[1]:
            out.append(m[1])
        else:
            out += [str(n) for n in range(int(out[-1]) + 1, int(m[2]) + 1)]
    return out


def _render(group: list[str]) -> str:
    """"§13, §14, §15" -> "§13–15" (runs of three or more plain numbers); else a list."""
    parts, i = [], 0
    while i < len(group):
        j = i
        while (j + 1 < len(group) and group[j].isdigit() and group[j + 1].isdigit()
               and int(group[j + 1]) == int(group[j]) + 1):
            j += 1
        parts += [f"§{group[i]}–{group[j]}"] if j - i >= 2 else [f"§{s}" for s in group[i:j + 1]]
        i = j + 1
    return ", ".join(parts)


def _groups(refs: str, table: dict) -> list[tuple[str, list[str]]] | None:
    """The cited ids by topic file, in order of first mention; None if one is unknown."""
    groups: dict[str, list[str]] = {}
    for sec in ids(refs):
        if sec not in table:
            return None
        groups.setdefault(table[sec][0], []).append(sec)
    return list(groups.items())


def recite_text(text: str, table: dict) -> tuple[str, list[tuple[int, str, str]], list[str]]:
    """``text`` with its old citations rewritten; (line, old, new) for each; unknown ones."""
    changes: list[tuple[int, str, str]] = []
    unknown: list[str] = []

    def one(m: re.Match) -> str:
        link = m["lrefs"] is not None
        groups = _groups(m["lrefs"] if link else m["refs"], table)
        if groups is None:
            unknown.append(m[0])
            return m[0]
        if link:
            new = "; ".join(f"[{NOTES_DIR}/{f}{m['lsep']}{_render(g)}]"
                            f"({m['dir']}notes/{f}#{table[g[0]][1]})" for f, g in groups)
        else:
            new = "; ".join(f"{NOTES_DIR}/{f}{m['sep'] if k == 0 else ' '}{_render(g)}"
                            for k, (f, g) in enumerate(groups))
        changes.append((text.count("\n", 0, m.start()) + 1, m[0], new))
        return new

    return CITATION.sub(one, text), changes, unknown


WIDTH = 100  # ruff's line-length (pyproject.toml)
_COMMENT = re.compile(r"^(\s*#+ ?)\S")
_BULLET = re.compile(r"^(?:[-*] |\d+[.)] |```|\"\"\"$)")


def _prefix(line: str, python: bool) -> str | None:
    """The prefix a rewrapped line keeps: a comment's ``  # `` or a docstring line's indent;
    None where the line is code, a string literal or a trailing comment (left to a person)."""
    m = _COMMENT.match(line)
    if m:
        return m[1]
    if not python:
        return None
    body = line.lstrip()
    if "#" in body or body[:1] in "'\"" and not body.startswith('\"\"\"'):
        return None
    return line[:len(line) - len(body)]


def reflow(text: str, lines: set[int], python: bool) -> tuple[str, list[int]]:
    """Bring each of ``lines`` (1-based) back within WIDTH by pushing its last words onto the
    next line of its comment or docstring paragraph (and so on down, as far as needed; a new
    line at the paragraph's end), so the rest of the text stays as it was. Returns the new
    text and the lines that are code or strings, left to a person."""
    rows = text.split("\n")
    left = []
    for n in sorted(lines, reverse=True):
        i = n - 1
        prefix = _prefix(rows[i], python) if len(rows[i]) > WIDTH else ""
        if prefix is None:
            left.append(n)
        while prefix is not None and len(rows[i]) > WIDTH:
            head, _, word = rows[i].rpartition(" ")
            while len(head) > WIDTH and " " in head[len(prefix):]:
                head, _, more = head.rpartition(" ")
                word = f"{more} {word}"
            if len(head) <= len(prefix):
                break  # one word wider than the line: nothing to push
            nxt = rows[i + 1] if i + 1 < len(rows) else ""
            ends = rows[i].rstrip().endswith('\"\"\"')
            if (not ends and nxt.startswith(prefix) and nxt[len(prefix):].strip()
                    and not nxt[len(prefix)].isspace() and not _BULLET.match(nxt[len(prefix):])):
                glue = "" if word.endswith("/") else " "  # a path broken at a slash
                rows[i:i + 2] = [head, prefix + word + glue + nxt[len(prefix):]]
            else:
                rows[i:i + 1] = [head, prefix + word]
            i += 1
    return "\n".join(rows), sorted(left)


def tracked_texts(root: Path = ROOT):
    """(path relative to root, text) of every tracked UTF-8 file but the notes and SKIP."""
    names = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in names:
        if not name or name in SKIP or name.startswith(NOTES_DIR + "/"):
            continue
        path = root / name
        if not path.is_file() or path.stat().st_size > 4_000_000:
            continue
        try:
            yield name, path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print, write nothing")
    args = parser.parse_args(argv)
    table = sections()
    changed = bad = 0
    for name, text in tracked_texts():
        new, changes, unknown = recite_text(text, table)
        for line, old, rep in changes:
            print(f"{name}:{line}: {' '.join(old.split())} -> {' '.join(rep.split())}")
        for old in unknown:
            print(f"{name}: no such section in {INDEX.relative_to(ROOT)}: {old!r}",
                  file=sys.stderr)
        bad += len(unknown)
        seen = set()
        for m in re.finditer(r"(?<![\w/.-])(?:\.\./)*(?:benchmarks/)?NOTES\b(?:\.md)?", new):
            line = new.count("\n", 0, m.start()) + 1
            context = " ".join(new[m.start():m.start() + 40].split())
            if line in seen:
                continue
            seen.add(line)
            print(f"{name}:{line}: left as is (no section: the index): {context}",
                  file=sys.stderr)
        if changes and name.endswith((".py", ".yaml", ".yml", ".sh")):
            # a rewrite keeps the old text's line breaks, so the old line numbers hold
            at = {line + k for line, _, rep in changes for k in range(rep.count("\n") + 1)}
            new, long_lines = reflow(new, at, python=name.endswith(".py"))
            for line in long_lines:
                print(f"{name}:{line}: over {WIDTH} characters, not rewrapped (code or a "
                      f"string): rewrap it by hand", file=sys.stderr)
        if new != text:
            changed += 1
            if not args.dry_run:
                (ROOT / name).write_text(new, encoding="utf-8")
    print(f"{'would change' if args.dry_run else 'changed'} {changed} files", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
