"""docs/API.md's "Writing your own variant" (moved out of the README; the README links it)
as its tests run it: the section's three Python blocks (the variant's module, its test
file, its variants-stage entry), and the first one written out as the module
``my_variants`` the others import."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "docs" / "API.md"
SECTION = "## Writing your own variant"


def blocks() -> list[str]:
    text = README.read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def install_module(tmp_path, monkeypatch) -> list[str]:
    """Write the first block as my_variants.py on the import path; returns the blocks."""
    found = blocks()
    (tmp_path / "my_variants.py").write_text(found[0])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "my_variants", raising=False)
    return found
