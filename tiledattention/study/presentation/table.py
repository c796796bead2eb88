"""One study table, written as Markdown, CSV and LaTeX (its own module: the tables, the
shapes tables and the comparison all write through it, without importing each other)."""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field

from ...safeio import write_text


@dataclass
class Table:
    name: str  # file stem
    title: str
    columns: list[str]
    rows: list[list] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_markdown(cls, name: str, text: str) -> Table:
        """The table ``to_markdown`` wrote, its cells as the formatted strings (so
        ``to_latex`` of it is byte for byte the LaTeX written with it: a summary that keeps
        the Markdown need not keep the LaTeX)."""
        lines = text.splitlines()
        columns = lines[2][2:-2].split(" | ")
        i, rows = 4, []
        while i < len(lines) and lines[i].startswith("|"):
            rows.append(lines[i][2:-2].split(" | "))
            i += 1
        if rows == [["—"] * len(columns)]:  # an empty table's placeholder row
            rows = []
        notes = [ln.removesuffix("  ") for ln in lines[i + 1:] if ln.strip()]
        return cls(name, lines[0].removeprefix("### "), columns, rows, notes)

    def cells(self) -> list[list[str]]:
        return [[_fmt(v) for v in r] for r in self.rows]

    def to_markdown(self) -> str:
        out = [f"### {self.title}", "", "| " + " | ".join(self.columns) + " |",
               "|" + "---|" * len(self.columns)]
        out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in self.cells()]
        if not self.rows:
            out.append("| " + " | ".join(["—"] * len(self.columns)) + " |")
        out += [""] + [f"{' '.join(n.split())}  " for n in self.notes]
        return "\n".join(out).rstrip() + "\n"

    def to_csv(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(self.columns)
        w.writerows(["" if v is None else v for v in r] for r in self.rows)
        return buf.getvalue()

    def to_latex(self) -> str:
        esc = _latex_escape
        out = [r"\begin{table}[t]", r"\centering", f"\\caption{{{esc(self.title)}}}",
               f"\\label{{tab:{self.name}}}", r"\begin{tabular}{" + "l" * len(self.columns)
               + "}", r"\hline", " & ".join(esc(c) for c in self.columns) + r" \\", r"\hline"]
        out += [" & ".join(esc(c) for c in r) + r" \\" for r in self.cells()]
        out += [r"\hline", r"\end{tabular}"]
        out += [f"\\par\\footnotesize {esc(n)}" for n in self.notes]
        out.append(r"\end{table}")
        return "\n".join(out) + "\n"

    def write(self, out_dir: str) -> list[str]:
        os.makedirs(out_dir, exist_ok=True)
        paths = []
        for ext, text in (("md", self.to_markdown()), ("csv", self.to_csv()),
                          ("tex", self.to_latex())):
            path = os.path.join(out_dir, f"{self.name}.{ext}")
            write_text(path, text)  # atomic: a killed aggregate leaves no half table
            paths.append(path)
        return paths


def _fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
    return str(v)


def _md_cell(text: str) -> str:
    """A Markdown table cell: one line (a newline would end the row), pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _latex_escape(text: str) -> str:
    text = " ".join(text.split())  # a blank line inside a tabular is a LaTeX error
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"),
                 ("#", r"\#"), ("$", r"\$"), ("{", r"\{"), ("}", r"\}"), ("—", "--"),
                 ("×", r"$\times$"), ("≥", r"$\geq$"), ("·", r"$\cdot$")):
        text = text.replace(a, b)
    return text
