"""The bundle's README in words: the headline, the rows' count, what did not run, how to
install the recorded revision and re-run the study, and how a compact bundle's data rebuilds.
"""

from __future__ import annotations

import os

from ..presentation.frame import columns_markdown, columns_of
from ..presentation.hardware import clock_sentence, peak_sentence, utilisation_sentence
from .archive import SNAPSHOT, SNAPSHOT_SOURCE, study_file
from .measured import how_to_cite, points_by_kind, spread, stack_line
from .metadata import (
    Publication,
)

# Where the README's commands unpack the rows: outside the bundle, one directory per bundle
# (two bundles rebuilt side by side, H100 and H200, no longer write into one).
REBUILT = '../rebuilt-"$(basename "$PWD")"'


def headline(rows: list[dict], manifest: dict) -> str:
    """The README's headline on the benchmark rows (``presentation/headline.py`` computes it)."""
    from ..presentation.headline import bench_sentence

    return bench_sentence(rows, (manifest.get("gpu") or {}).get("name") or "a CPU (no GPU)")


def rows_summary(rows: list[dict]) -> str:
    """The README's count of the published rows (verify recomputes it from the rows)."""
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[str(r.get("status"))] = statuses.get(str(r.get("status")), 0) + 1
    return (f"{len({r.get('point_key') for r in rows})} benchmark points × "
            f"{len({r.get('method') for r in rows})} methods = {len(rows)} rows; rows by "
            "status: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())))


def readme_text(pub: Publication, rows: list[dict], manifest: dict, table4: str,
            config_name: str, snapshot: tuple[int, str], variants_line: str = "",
            compact: list[str] | None = None, checkout: str | None = None, *,
            wheel: str, present: set[str] | None = None,
            cli: dict[str, set[str]] | None = None,
            variant_rows: list[dict] | None = None,
            shape_rows: list[dict] | None = None) -> str:
    """The bundle's README; ``compact``: the data files of a compact bundle (its Files
    section names them, and how the figures and tables rebuild from them); ``checkout``:
    the revision whose source its snapshot leaves out; ``wheel``: the bundle's wheel of
    the package (source/…), which its install line installs; ``present``: the bundle's
    files (the Files section names only what is there; None: every kind); ``cli``: the
    options the wheel's ``tiledattn figures`` / ``aggregate`` take (None: today's);
    ``variant_rows``: the variants stage's (the standing block's variants lines and the
    by-head-shape sentences), ``shape_rows``: the shapes grids' (those sentences too)."""
    from ...stages import STAGES
    from ..presentation.headline import shape_sentences
    from ..presentation.standing import block as standing

    stack = manifest.get("stack") or {}
    gpu = manifest.get("gpu") or {}
    lines = [
        f"# {pub.title}", "", pub.description, "", "## Headline", "",
        headline(rows, manifest) + variants_line, table4, "",
        *standing(rows, variant_rows), *shape_sentences(rows, variant_rows, shape_rows),
        "## What was measured", "",
        rows_summary(rows)
        + " (`tables/status.*` groups the rows that are not ok by method, status and "
        "reason). Points by kind and pass: " + points_by_kind(rows) + ".", "",
        ("Timing: CUDA events around each call (L2 flushed before each call when the "
         "config says so), " if gpu else "Timing: wall clock around each call on the CPU, ")
        + "methods interleaved over rounds; throughput from the median time with the FLOP "
        "model "
        "4·B·H·Sq·Skv·D (halved when causal). Correctness: each method's output against a "
        "float64 reference on a slice of heads.", "",
        *([noise, ""] if (noise := spread(rows)) else []),
        *([best, ""] if (best := utilisation_sentence(rows, gpu.get("name"))) else []),
        "## On what", "",
        f"- GPU: {gpu.get('name', '—')} (compute capability "
        f"{gpu.get('compute_capability', '—')}, driver {gpu.get('driver', '—')})",
        *([f"- {peaks}"] if (peaks := peak_sentence(gpu.get("name"))) else []),
        *([f"- {clock}"] if (clock := clock_sentence(rows, gpu.get("name"))) else []),
        f"- Software: tiledattention {stack.get('tiledattention')}, torch {stack.get('torch')}"
        f" (CUDA {stack.get('cuda_runtime')}, cuDNN {stack.get('cudnn')}), cuda-tile "
        f"{stack.get('cuda_tile')}, tileiras {stack.get('tileiras')}, Python "
        f"{stack.get('python')}",
        f"- Source: {pub.repository or NO_REPOSITORY}"
        f" at revision {stack.get('git_commit')}"
        + (" (some runs from a tree with uncommitted changes: manifest.json)"
           if manifest.get("runs_from_dirty_tree") else ""),
        stack_line(manifest),
        f"- Container: {(manifest.get('container') or {}).get('image') or 'none'}", "",
        *how_to_cite(pub),
        *reproduce_section(pub, manifest, snapshot, checkout, wheel),
        "## Files", "",
        *(_compact_files(compact) if compact is not None else [
            "- `data/rows.parquet`, `data/rows.csv`, `data/rows.jsonl`: every row; "
            "`data/columns.md`: the column dictionary (also below)" + "".join(
                f"; `data/{s.publish.data_name}`: {s.publish.data_readme}"
                for s in STAGES.values() if s.publish.data_name)]),
        "- `tables/`: the headline (and per head shape and dtype: `headline_shapes`), "
        "Table 4 (ratios against the fastest fused baseline at each point and "
        "against each baseline), per-D, per-regime and per-point ratios, "
        "Table 5 (schedules), Table 6 (schedule ladder), throughput, status, fp8 (the FP8 "
        "forward against bf16 at the same shapes), shapes and shapes_cost, model_e2e (tiny "
        "Llama tokens/s per attention implementation), variants and variants_summary (against "
        "FlexAttention and SDPA + mask, and the targets), workloads_* (packed varlen batches "
        "and a paged KV cache against the fastest baseline; their length distributions in "
        "the headline and the tables' notes) — "
        + ("Markdown (their CSV and LaTeX rebuild from the rows, below)" if compact is not None
           else "Markdown, CSV, LaTeX"),
        *([] if compact is not None else ["- `figures/`: PNG and PDF"]),
        *_if_present(present, "compare/", "- `compare/`: `tiledattn compare` against a "
                     "reference (table and figure), when the study was compared "
                     "(`tiledattn reproduce`)"),
        *_if_present(present, "profiles.zip", "- `profiles.zip`: Nsight Compute reports, raw "
                     "CSV exports and `summary.md`"),
        f"- `{wheel}`: the package as it ran (a wheel of the recorded revision); the "
        "install line above installs it",
        "- `manifest.json`: merged version manifest",
        "- `config/`: the exact study config",
        *_if_present(present, "scaling/", "- `scaling/`: `tiledattn scaling`, study wall "
                     "time against GPU count (table and figure), when the study's runs were "
                     "set side by side"),
        "- `.zenodo.json`, `CITATION.cff`, "
        "`ro-crate-metadata.json`, `SHA256SUMS` (check: `sha256sum -c SHA256SUMS` or "
        "`tiledattn bundle verify`)", "", "## Column dictionary", "",
        columns_markdown(columns_of(rows)) if rows else "(no rows)", ""]
    if compact is not None:
        cut = lines.index("## Column dictionary")
        lines[cut:cut] = _rebuild_section(compact, cli)
    return "\n".join(lines)


def _if_present(present: set[str] | None, name: str, line: str) -> list[str]:
    """``line`` where the bundle holds ``name`` (a file, or a directory ending in "/")."""
    if present is None or any(p == name or (name.endswith("/") and p.startswith(name))
                              for p in present):
        return [line]
    return []


def _compact_files(data_files: list[str]) -> list[str]:
    """The Files bullet of a compact bundle's data/."""
    from ...stages import STAGES

    what = {"data/rows.jsonl.gz": "every row (the aggregate's rows.jsonl, gzipped)",
            **{f"data/{s.publish.data_name}.gz": s.publish.data_what for s in STAGES.values()
               if s.publish.data_name},
            "data/ladder-rows.jsonl.gz": "the schedule ladder's rows (Table 6, tile "
                                         "sensitivity)",
            "data/schedule-table.json": "the study's tuning table (Table 5)",
            "data/columns.md": "the column dictionary (also below)"}
    return ["- " + "; ".join(
        f"`{f}`: " + what.get(f, "a shapes grid's rows (tables/shapes*, the shapes figure)")
        for f in data_files) + ". A compact bundle: the rows gzipped (`gunzip -c`), "
        "no figures (they rebuild from the rows, below)"]


def _rebuild_section(data_files: list[str], cli: dict[str, set[str]] | None = None
                     ) -> list[str]:
    """## Figures and tables from the rows: the exact commands (tests run them)."""
    return ["## Figures and tables from the rows", "",
            "This compact bundle holds the measurements, not the figures, and its tables as "
            "Markdown only. In the directory holding this README, with tiledattention "
            "installed (above), these lines unpack the rows beside the bundle and rebuild "
            "every figure (`$R/figures`, PNG and PDF) and every table as Markdown, CSV and "
            "LaTeX (`$R/aggregate/tables`: its `*.md` are `tables/` again, `diff` shows at "
            "most a float's last digit where another machine's math library rounds "
            "differently) from them:", "",
            "```bash", *rebuild_commands(data_files, cli), "```", "",
            "Redrawing needs neither torch nor a GPU: `python -m pip install --no-deps "
            "../source` installs `tiledattn` alone, and the `figures` extra's packages "
            "(`python -m pip install \"matplotlib>=3.7\" \"pandas>=2\" \"pyarrow>=14\"`) "
            "are all these lines need besides.", ""]


# What the README says where no repository URL was known when the bundle was made.
NO_REPOSITORY = ("no repository URL recorded (none is needed: `source/` holds the package; "
                 "to record one, set `publication.repository` in the study config, or "
                 "`Repository` under `[project.urls]` in pyproject.toml, or a git remote "
                 "`origin`)")
CPU_TORCH = "https://download.pytorch.org/whl/cpu"  # PyTorch's CPU wheels (no CUDA)


def install_lines(manifest: dict, wheel: str) -> list[str]:
    """The README's install steps: tiledattention from the bundle's own wheel (``wheel``,
    source/…: no clone, no package index), with the gpu extra where the study ran on a GPU;
    a CPU study's torch from PyTorch's CPU wheels unless one is installed (PyPI's default
    Linux wheel carries the CUDA libraries, gigabytes)."""
    gpu = isinstance(manifest.get("gpu"), dict) and bool(manifest["gpu"].get("name"))
    lines = [] if gpu else [
        f'python -c "import torch" 2>/dev/null || python -m pip install torch '
        f"--index-url {CPU_TORCH}"]
    return lines + [f'python -m pip install "{wheel}[{"gpu,workflow" if gpu else "workflow"}]"'
                    "   # this run's package, from this bundle"]


def reproduce_section(pub: Publication, manifest: dict, snapshot: tuple[int, str],
                      checkout: str | None, wheel: str) -> list[str]:
    """## How to reproduce: the install step and the one command (tests/test_reproduce.py
    follows these lines literally), from the bundle alone. ``checkout``: the recorded
    revision a compact bundle's snapshot leaves the package source out for (its wheel
    holds it)."""
    from .source import wheel_revision

    image = (manifest.get("container") or {}).get("image")
    built = wheel_revision(wheel)
    where = (f"`{wheel}`, a wheel of revision {built}, one the manifest records"
             if built else f"`{wheel}`, a wheel of the package as it ran")
    return [
        "## How to reproduce", "",
        "In the directory holding this README (the unpacked bundle; nothing else is "
        f"needed: no clone, no package index release), install this run's package ({where}"
        + (f"; the source repository is `{pub.repository}`" if pub.repository else "")
        + ") with its workflow tools, "
        "then re-run the study: the same config and grid "
        "(`config/study-config.yaml`), the workflow of this run (`workflow-snapshot.zip`), "
        "through a Snakemake profile (`local`, `slurm`, or the path of your own). It ends "
        "with a verified bundle of the new run and `tiledattn compare` of it against this "
        "one (exit 1 on a regression beyond the tolerances; `--source checkout` takes the "
        "workflow from a checkout of the recorded revision instead). Offline, "
        "`pip install --no-index --find-links DIR` installs the dependencies from a wheel "
        "kit in DIR.", "",
        "```bash", *install_lines(manifest, wheel),
        "tiledattn reproduce . --out ../reproduction --profile local", "```", "",
        *([f"The study ran on {manifest['gpu']['name']}: on a machine without a CUDA GPU "
           "`tiledattn reproduce` with the local profile refuses it (it would measure on the "
           "CPU for hours); run it on such a GPU, or through `--profile slurm`.", ""]
          if isinstance(manifest.get("gpu"), dict) and manifest["gpu"].get("name") else []),
        (f"The jobs ran in the container image `{image}` (the config's "
         "`launcher_options.image`), so the reproduction's jobs do too." if image else
         "The jobs ran without a container image (the config names none)."), "",
        f"The snapshot holds {snapshot[0]} files: {snapshot[1]} under "
        f"{', '.join(SNAPSHOT)}"
        + (f" (not the package's source, {', '.join(SNAPSHOT_SOURCE)}: the wheel holds "
           f"revision {checkout}'s)" if checkout else "")
        + " — untracked and ignored files (a local `.env`, credentials) "
        "are never included. `tiledattn bundle verify .` checks this bundle's files.", ""]


def stage_rows_in(study_dir: str, name: str) -> list[dict]:
    """A stage's own rows in a study, where it ran: its rows file, or (a stage without one:
    the ladder, the shapes grids) its sweep's directory, each grid's (``many``: g0, g1...)."""
    import glob

    from ...stages import STAGES

    rows = STAGES[name].rows
    top = os.path.join(study_dir, name)
    dirs = sorted(glob.glob(os.path.join(top, "g*"))) if rows.many else [top]
    found: list[dict] = []
    for d in dirs:
        if rows.file is None:
            if os.path.isdir(d):
                found += rows.from_dirs([d], name)
        elif os.path.lexists(os.path.join(d, rows.file)):
            study_file(os.path.join(d, rows.file), study_dir)  # no link out, no FIFO
            found += rows.load(d)
    return found


def variant_rows_in(study_dir: str) -> list[dict]:
    """The variants stage's rows (the headline's variants sentence), when the study ran it."""
    return stage_rows_in(study_dir, "variants")


def not_run(study_dir: str, rows: list[dict]) -> list[str]:
    """One Markdown bullet per study step (or method) that did not run, with the reason
    its job recorded: GPU methods without a GPU, tuning and profiles on a node without
    one."""
    from ...bench.aggregate import load_checked

    out = []
    for step, step_rows in (("benchmark", rows),
                            ("schedule ladder", load_checked(os.path.join(study_dir, "ladder"))
                             if os.path.isdir(os.path.join(study_dir, "ladder")) else [])):
        by_method: dict[tuple[str, str], list[dict]] = {}
        for r in step_rows:
            if r.get("status") != "ok":
                by_method.setdefault((r["method"], r["status"]), []).append(r)
        for (method, status), group in sorted(by_method.items()):
            out.append(f"- {step}: {method} {status} at {len(group)} point(s): "
                       f"{_line(group[0].get('reason') or group[0].get('error') or '—')}")
    # The stages with rows of their own first, then the others, each in registry order.
    from ...stages import STAGES

    for stage in sorted((s for s in STAGES.values() if s.publish.not_run),
                        key=lambda s: s.rows is None):
        out += stage.publish.not_run(os.path.join(study_dir, stage.name),
                             lambda path: study_file(path, study_dir))
    out += [f"- figures: {name} not drawn, nothing to draw ({_line(why)})"
            for name, why in sorted(not_drawn(study_dir).items())]
    return out


def not_drawn(study_dir: str) -> dict[str, str]:
    """{figure: why} of the study's figures with nothing drawn (``tiledattn figures``
    lists them beside the figures): the bundle leaves them out and says why."""
    import json

    from ...safeio import JSON_MAX, read_bytes
    from ..presentation.plotting import NOT_DRAWN

    path = os.path.join(study_dir, "figures", NOT_DRAWN)
    if not os.path.lexists(path):
        return {}
    try:
        listed = json.loads(read_bytes(study_file(path, study_dir), cap=JSON_MAX))
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in listed.items()} if isinstance(listed, dict) else {}


def _line(text) -> str:
    """A reason as one Markdown line (a newline would end the bullet)."""
    return " ".join(str(text).split())


def rebuild_commands(data_files: list[str], cli: dict[str, set[str]] | None = None
                     ) -> list[str]:
    """The shell lines that unpack a compact bundle's rows (outside it, in REBUILT) and
    rebuild its figures and tables with ``tiledattn figures`` and ``tiledattn aggregate``;
    ``cli``: the options each verb of the bundle's own package takes (an option it lacks
    is left out of its line), None for today's."""
    from ...stages import STAGES

    have = set(data_files)
    stages = [s for s in STAGES.values() if s.publish.data_name and s.rows and s.rows.verbs
              and f"data/{s.publish.data_name}.gz" in have]  # their own rows, as aggregate reads
    grids = sorted(f[len("data/shapes-"):-len("-rows.jsonl.gz")] for f in have
                   if f.startswith("data/shapes-") and f.endswith("-rows.jsonl.gz"))
    unpack = [("rows.jsonl.gz", "rows/rows-shard0of1.jsonl"),
              ("ladder-rows.jsonl.gz", "ladder/rows-shard0of1.jsonl"),
              *[(f"shapes-{g}-rows.jsonl.gz", f"shapes/{g}/rows-shard0of1.jsonl")
                for g in grids],
              *[(f"{s.publish.data_name}.gz", f"{s.name}/{s.rows.file}") for s in stages]]
    unpack = [(src, dest) for src, dest in unpack if f"data/{src}" in have]
    r = REBUILT
    lines = [f"R={r}   # outside the bundle (SHA256SUMS lists exactly what is in it), one "
             "per bundle",
             "mkdir -p " + " ".join(sorted({f"$R/{os.path.dirname(d)}" for _, d in unpack}))]
    lines += [f"gunzip -c data/{src} > $R/{dest}" for src, dest in unpack]
    extra = []
    if "data/ladder-rows.jsonl.gz" in have:
        extra.append("--ladder $R/ladder")
    if "data/schedule-table.json" in have:
        extra.append("--tune-table data/schedule-table.json")
    if grids:
        extra.append("--shapes " + " ".join(f"$R/shapes/{g}" for g in grids))
    # A stage's --<name> DIR goes to both verbs when figures reads it, else to aggregate
    # alone, after the others.
    figures = (cli or {}).get("figures")
    aggregate = (cli or {}).get("aggregate")

    def takes(option: str) -> bool:
        return figures is None or option in figures
    extra += [f"--{s.name} $R/{s.name}" for s in stages
              if any(v == "figures" for v, _ in s.rows.verbs) and takes(f"--{s.name}")]
    only = "".join(f" --{s.name} $R/{s.name}" for s in stages
                   if not (any(v == "figures" for v, _ in s.rows.verbs)
                           and takes(f"--{s.name}")))
    opts = (" " + " ".join(extra)) if extra else ""
    manifest = " --manifest manifest.json" if takes("--manifest") else ""
    # The tables' % peak @ clock need the GPU too (a wheel before it has no --manifest).
    tables_gpu = (" --manifest manifest.json" if aggregate is None or "--manifest" in aggregate
                  else "")
    lines += [f"tiledattn figures --rows $R/rows/rows-shard0of1.jsonl --out $R/figures"
              f"{manifest}{opts}",
              f"tiledattn aggregate --rows $R/rows --out $R/aggregate{tables_gpu}{opts}{only}"]
    return lines
