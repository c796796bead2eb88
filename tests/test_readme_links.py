"""README.md's own references and those of the docs/ pages it links (the reference material
moved out of it, one link away): in-page links and links between the pages resolve to a file
and a heading (GitHub's anchor rules), every docs page and every section of the API and study
pages is linked from the README, the Layout sections (the README's short one, docs/LAYOUT.md's
full one) name what the tree holds, paths the pages name exist, and each measured number is
quoted once, from the committed rows."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
# Every page: the README and each docs/*.md, by path from the root.
PAGES = {"README.md": README,
         **{f"docs/{p.name}": p.read_text() for p in sorted(DOCS.glob("*.md"))}}
MOVED = ("docs/API.md", "docs/STUDY.md", "docs/RESULTS.md", "docs/LAYOUT.md")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks (a `# comment` in a block is no heading)."""
    return "".join(part for i, part in enumerate(re.split(r"^```.*$", text, flags=re.M))
                   if i % 2 == 0)


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, markup and punctuation dropped (letters,
    digits, `_`, `-` and spaces kept), spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: Counter = Counter()
    out = set()
    for m in re.finditer(r"^#{1,6} +(.+?) *#*$", _prose(text), flags=re.M):
        slug = github_slug(m.group(1))
        out.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return out


def test_github_slug_follows_githubs_rules():
    assert github_slug("Results: the reference study on an H100 and an H200") == \
        "results-the-reference-study-on-an-h100-and-an-h200"
    assert github_slug("Shape advice: `tiledattn advise`") == "shape-advice-tiledattn-advise"
    assert github_slug("Any model that calls PyTorch's SDPA: `ta.sdpa_mode()`") == \
        "any-model-that-calls-pytorchs-sdpa-tasdpa_mode"
    assert anchors("# A\n```\n# A\n```\n## A\n") == {"a", "a-1"}


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_in_page_link_resolves_to_a_heading(page):
    text = PAGES[page]
    targets = re.findall(r"\]\(#([^)]+)\)", _prose(text))
    if page in ("README.md", "docs/API.md", "docs/STUDY.md"):
        assert targets, f"{page} links within itself"
    missing = sorted(set(targets) - anchors(text))
    assert not missing, f"{page}: in-page links with no heading: {missing}"


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_link_to_another_file_resolves_to_it_and_its_heading(page):
    """A relative link of the README or a docs page names a file that is here, and an
    ``#anchor`` on a Markdown file names one of its headings."""
    for target in _LINK.findall(_prose(PAGES[page])):
        if target.startswith(("#", "http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        file = (ROOT / page).parent / path
        assert file.exists(), f"{page} links {target}: no {path}"
        if anchor:
            assert file.suffix == ".md", (page, target)
            assert anchor in anchors(file.read_text()), f"{page} links {target}: no heading"


def test_every_docs_page_and_moved_section_is_one_link_from_the_readme():
    for page in PAGES:
        if page != "README.md":
            assert f"]({page})" in README, f"the README does not link {page}"
    for page in MOVED:
        assert page in PAGES, f"{page} is missing"
    # each section of the API and study pages, by its anchor
    for page in ("docs/API.md", "docs/STUDY.md"):
        for m in re.finditer(r"^## +(.+?) *$", _prose(PAGES[page]), flags=re.M):
            link = f"]({page}#{github_slug(m.group(1))})"
            assert link in README, f"the README does not link {page}'s {m.group(1)!r}"


def _layout(text: str = README) -> str:
    return text.split("# Layout", 1)[1].split("\n## ", 1)[0]


LAYOUTS = {"README.md": lambda: _layout(), "docs/LAYOUT.md": lambda: _layout(
    PAGES["docs/LAYOUT.md"])}


def _tracked_folders() -> list[str]:
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True,
                             text=True, check=True).stdout.splitlines()
    # the repository's own folders (build outputs and venvs are ignored, not part of it)
    return sorted(n for n in {f.split("/", 1)[0] for f in tracked if "/" in f}
                  if not n.startswith("."))


@pytest.mark.parametrize("page", sorted(LAYOUTS))
def test_the_layout_names_every_package_directory_and_top_level_folder(page):
    layout = LAYOUTS[page]()
    pkg = ROOT / "tiledattention"
    for d in sorted(p for p in pkg.iterdir() if (p / "__init__.py").exists()):
        assert f"{d.name}/" in layout, f"{page} Layout does not name tiledattention/{d.name}/"
    for name in _tracked_folders():
        assert f"{name}/" in layout, f"{page} Layout does not name {name}/"


def test_the_full_layout_names_every_module():
    layout = LAYOUTS["docs/LAYOUT.md"]()
    for m in sorted((ROOT / "tiledattention").glob("*.py")):
        if m.stem != "__init__":
            assert re.search(rf"\b{m.stem}\b", layout), f"docs/LAYOUT.md does not name {m.stem}"
    assert "(docs/LAYOUT.md)" in LAYOUTS["README.md"]()


@pytest.mark.parametrize("page", sorted(LAYOUTS))
def test_the_layout_names_only_what_exists(page):
    layout = LAYOUTS[page]()
    for script in re.findall(r"[\w-]+\.(?:sh|py)\b", layout):
        assert list(ROOT.glob(f"**/{script}")), f"{page} Layout names {script}, not here"


def test_the_reference_paths_the_pages_name_exist():
    for page, text in PAGES.items():
        for p in sorted(set(re.findall(r"results/reference[\w/.-]*", text))):
            p = p.rstrip(".")
            if "{" in p or p.endswith("<"):
                continue
            assert (ROOT / p).exists(), f"{page} names {p}, which does not exist"
        assert not re.search(r"results/reference-h\d00", text), page
    for page in ("README.md", "docs/RESULTS.md"):
        assert re.search(r"results/reference/h100", PAGES[page]), page


def _model_ratios(system: str) -> dict[tuple[int, str], float]:
    path = ROOT / "results" / "reference" / system / "data" / "model-rows.jsonl.gz"
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    time = {(r["batch"], r["phase"], r["method"]): r["tokens_per_s"] for r in rows
            if r["status"] == "ok" and not r.get("compiled")}
    return {(b, ph): time[(b, ph, "tiledattention")] / time[(b, ph, "sdpa")]
            for (b, ph, m) in time if m == "sdpa" and (b, ph, "tiledattention") in time}


def test_the_tiny_llama_speedups_are_quoted_once_from_the_committed_rows():
    # docs/RESULTS.md's bullet, the one such bullet on any page
    text = " ".join("\n".join(PAGES.values()).split())
    bullets = re.findall(r"\*\*Tiny Llama\*\*.*?training step [\d.]+× / [\d.]+×", text)
    assert len(bullets) == 1, bullets
    assert bullets[0] in " ".join(PAGES["docs/RESULTS.md"].split())
    r = _model_ratios("h100")
    want = (f"H100 prefill {r[1, 'prefill']:.2f}× (B1) / {r[8, 'prefill']:.2f}× (B8), "
            f"decode {r[1, 'decode']:.2f}× / {r[8, 'decode']:.2f}×, "
            f"training step {r[1, 'train']:.2f}× / {r[8, 'train']:.2f}×")
    assert want in bullets[0], (want, bullets[0])
    # no other section of any page quotes the model's ratios to sdpa with other numbers
    assert not re.search(r"B1 prefill [\d.]+×", text)


def test_the_readme_systems_command_rebuilds_the_committed_systems_table(tmp_path):
    # docs/STUDY.md, "For the committed references: `tiledattn systems
    # results/reference/h100 …`": the
    # bundles hold the model stage's rows too, which are no benchmark points (it failed on
    # them: "causal is missing").
    import os
    import shlex

    from tiledattention.cli import main

    line = re.search(r"`(tiledattn systems results/reference/h100 [^`]*)`",
                     " ".join(PAGES["docs/STUDY.md"].split())).group(1)
    argv = shlex.split(line)[1:]
    out = argv.index("--out") + 1
    assert argv[out] == "results/reference/systems"
    argv[out] = str(tmp_path)
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert main(argv) == 0
    finally:
        os.chdir(cwd)
    assert (tmp_path / "systems.csv").read_text() == \
        (ROOT / "results/reference/systems/systems.csv").read_text()


EXTENDING = ROOT / "docs" / "EXTENDING.md"
# A path in backticks (a file, or a folder ending in /), optionally ``::name`` of a def,
# class or assignment in it; placeholders such as ``<stage>`` are not paths to check.
_CITED = re.compile(r"`((?:[\w.-]+/)+[\w.-]*)(?:::(\w+))?`")


def _defines(path: Path, name: str) -> bool:
    """``name`` is a function, class or module-level name that ``path`` defines."""
    return bool(re.search(rf"^\s*(?:def|class) {name}\b|^{name}\b[^=\n]*=", path.read_text(),
                          flags=re.M))


def test_the_readme_links_to_the_extending_page():
    assert "(docs/EXTENDING.md)" in README


def test_every_path_and_name_the_extending_page_cites_exists():
    text = EXTENDING.read_text()
    cited = _CITED.findall(text)
    assert len(cited) > 20, "the page cites its files as `path` and `path::name`"
    for path, name in cited:
        assert (ROOT / path).exists(), f"docs/EXTENDING.md names {path}, which is not here"
        if name:
            assert _defines(ROOT / path, name), f"{path} defines no {name}"
    for target in re.findall(r"\]\(([^)#]+)(#[^)]*)?\)", text):
        assert (EXTENDING.parent / target[0]).resolve().exists(), target
    for path, anchor in re.findall(r"\]\(([^)#]+\.md)#([^)]+)\)", text):
        assert anchor in anchors((EXTENDING.parent / path).read_text()), (path, anchor)
