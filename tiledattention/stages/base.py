"""What a GPU stage is: the descriptor each stage module exports as ``STAGE``.

Not a stage itself: every stage module imports this one, and the registry
(``stages/__init__.py``) collects their descriptors. The descriptor holds references to
functions that already exist (the stage's run entry, its row loader, the tables its rows
become); it adds no behaviour of its own.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

from ..bench.config import section_from_dict, section_schema


@dataclass(frozen=True)
class Rows:
    """A stage's rows of its own, as the CLI, the workflow, the presentation and compare read
    them. ``tiledattn aggregate`` / ``figures`` take them as ``--<stage> DIR`` (``many``: one
    or more DIRs) where ``verbs`` names the verb: (verb, what they feed there); ``what``
    names them in the option's help. The presentation's writers take them by stage name."""

    load: Callable[[str], list[dict]]  # the rows in one directory
    file: str | None = None  # the file in RESULTS/<name>/ that must be there (None: any rows)
    verbs: tuple[tuple[str, str], ...] = ()
    what: str = ""
    many: bool = False
    key: str | None = None  # a key only its rows hold (compare tells rows apart by it)
    # `tiledattn compare` checks its rows; ``measure``: the key of its own time in compare's
    # MEASURES and TOLERANCE (None: the benchmark's kernel and call times).
    compared: bool = False
    measure: str | None = None

    def from_dirs(self, dirs: list[str], flag: str) -> list[dict]:
        """The rows in each directory of ``dirs``, one ``RowsError`` naming ``flag`` (how
        the caller named them) where one is not a directory or lacks the rows file."""
        import os

        from ..bench.store import RowsError

        rows: list[dict] = []
        for path in dirs:
            if self.file is None:
                if not os.path.isdir(path):
                    raise RowsError(f"{flag} {path}: not a directory")
            elif not os.path.exists(os.path.join(path, self.file)):
                raise RowsError(f"{flag} {path}: no {self.file} there")
            rows += self.load(path)
        return rows


@dataclass(frozen=True)
class Publish:
    """What a bundle takes of a stage's results directory, RESULTS/<name>/."""

    data_name: str | None = None  # its rows file's name in data/ (compact: gzipped, + ".gz")
    data_what: str = ""  # what its rows are, in a compact bundle README's Files bullet
    data_readme: str = ""  # and in a full bundle README's (where it says when they are there)
    copies: tuple[str, ...] = ()  # files data/ takes as they are (tune's schedule table)
    archive: str | None = None  # the bundle zips RESULTS/<name>/ whole as this file
    waits_for: str | None = None  # the file in RESULTS/<name>/ the bundle rule waits for
    # The bundle README's "What did not run" bullets from its results dir (None: none).
    not_run: Callable[[str], list[str]] | None = None


@dataclass(frozen=True)
class Cli:
    """The stage's ``tiledattn <name>`` verb."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]  # the verb's options
    handler: Callable[[argparse.Namespace], int]  # the verb (its exit code)


@dataclass(frozen=True)
class Stage:
    name: str  # the `tiledattn` verb, the study config's key, RESULTS/<name>/
    config: type | None  # its config section's dataclass (None: none of its own)
    # The run entry the CLI verb calls in-process; None: measured by the bench stage's
    # sweep (the ladder, the shapes grids), whose rules are bench.smk's.
    run: Callable | None
    task: type | None  # the launcher task its workflow step submits
    rows: Rows | None = None  # rows of its own (None: the benchmark's rows, or none)
    publish: Publish = Publish()
    cli: Cli | None = None  # its verb (None: none of its own)

    @property
    def rule_file(self) -> str | None:
        """Its rule file, workflow/rules/<name>.smk (one per stage with a run entry)."""
        return f"{self.name}.smk" if self.run is not None else None


class SectionConfig:
    """What a stage's config section shares when its launcher job is the stage's run entry
    on the whole section (``ConfigTask``): its items, its digest, that job. A subclass (a
    frozen dataclass) names its stage in ``stage``."""

    stage = ""  # the stage's name (its STAGES key; a class attribute, no config field)

    def as_dict(self) -> dict:
        return asdict(self)

    def digest(self) -> str:
        import hashlib
        import json

        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()
                              ).hexdigest()[:16]

    def task(self, out_dir: str, run: Callable) -> ConfigTask:
        """The stage's launcher job: its run entry on this section (the config travels as
        items, validated on the node)."""
        return ConfigTask(run, type(self), out_dir, tuple(self.as_dict().items()))


class TimedSection(SectionConfig):
    """A section whose rows the harness times (``runner.measure``): its fields ``warmup``,
    ``reps``, ``rounds``, ``max_ref_heads``, ``seed`` and ``methods`` are the harness'
    config. The fields stay in each stage's dataclass: a base dataclass's fields would come
    first, moving their options ahead of the grid's in the verb's --help, and each stage
    words some of their help its own way."""

    def bench_config(self):
        """The harness' config of the stage's rows: its timing and correctness (the L2
        flushed before each timed call, as every benchmark row)."""
        from ..bench.config import BenchConfig, CorrectnessConfig, TimingConfig

        return BenchConfig(timing=TimingConfig(self.warmup, self.reps, self.rounds),
                           correctness=CorrectnessConfig(self.max_ref_heads),
                           seed=self.seed, methods=self.methods)

    def measure_digest(self) -> str:
        """What changes a row's numbers beyond its point and method (``BenchConfig``'s)."""
        return self.bench_config().measure_digest()


@dataclass(frozen=True)
class ConfigTask:
    """A stage's run entry on its config section as a picklable job, so a launcher puts it
    on a GPU (a SLURM GPU node, a local GPU); the config travels as items and is validated
    again on the node. ``run`` and ``cls`` pickle by reference (module and name)."""

    run: Callable  # the stage's run entry, run(cfg, out_dir)
    cls: type  # its SectionConfig
    out_dir: str
    config: tuple  # SectionConfig.as_dict() items (hashable, picklable)

    @property
    def job_name(self) -> str:
        return f"tiledattn-{self.cls.stage}"

    def __call__(self) -> dict:
        return self.run(section_from_dict(self.cls, self.cls.stage, dict(self.config)),
                        self.out_dir)


def one_line(text) -> str:
    """A reason as one Markdown line (a newline would end a bullet)."""
    return " ".join(str(text).split())


def section_json_schema(cls) -> dict:
    """A stage's section of the study config schema, from its dataclass (its docstring's
    first line says what it is)."""
    return section_schema(cls, f"{cls.__doc__.split(chr(10))[0].rstrip('.')}: generated by "
                          "`python -m tiledattention.stages`.")


# The stage verbs' argument vocabulary (the CLI's other verbs use it too): argparse types
# that refuse bad input in one line, and the defaults the config dataclasses hold.
def number(convert, noun: str, ok, refusal):
    """argparse type: ``convert(text)`` ("is not ``noun``" where it fails) that ``ok``
    accepts, else the line ``refusal(text, value)``."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(refusal(text, value))
        return value
    return parse


def count(minimum: int):
    """argparse type: an integer >= ``minimum`` (and below 2**31, which no count needs)."""
    return number(int, "an integer", lambda v: minimum <= v < 2 ** 31,
                  lambda _, v: f"{v} must be >= {minimum} (and < 2**31)")


def positive(what: str):
    """An argparse type: a finite number > 0 (``what`` names it in the error)."""
    import math

    return number(float, "a number", lambda v: math.isfinite(v) and v > 0,
                  lambda text, _: f"{text!r} must be a positive {what}")

seconds = positive("number of seconds")


def launcher_options(p) -> None:
    """--launcher-options, as every stage verb that runs through a launcher takes it."""
    p.add_argument("--launcher-options", default="{}", metavar="JSON",
                   help='launcher options as a JSON object, e.g. \'{"partition": "gpu"}\'')


# A stage verb's options: one per config field with a ``flag`` (``field_options``), and the
# few that are no config field, each written once here (--config, --launcher).
def config_file_option(p, stage: str) -> None:
    """--config, a YAML file of the stage's settings the field options override."""
    p.add_argument("--config", help=f"YAML with the stage's settings: a `{stage}:` section "
                   "(a study config) or the section itself; the options below override it "
                   "(default: the stage's defaults)")


def launcher_option(p) -> None:
    """--launcher and --launcher-options: where the verb's one job runs."""
    from ..launchers.base import LAUNCHERS

    p.add_argument("--launcher", choices=LAUNCHERS, help="run it as a job of this launcher "
                   "(slurm: on a GPU node; local: on a free local GPU) (default: in this "
                   "process)")
    launcher_options(p)


def flagged(cls) -> list:
    """The fields of a stage's config dataclass that are command-line options (a ``flag``):
    the same ones ``bench.config.stage_args`` writes the workflow's argv from."""
    from dataclasses import fields

    return [f for f in fields(cls) if "flag" in f.metadata]


def boolean(text: str) -> bool:
    """argparse type: true or false (as the config file spells them)."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def _parser_of(f) -> dict:
    """argparse keywords that read one field's values: its choices where they are words,
    else its element type. The field's other limits (min, max, a choice of numbers) are the
    config's to check: its errors name the key (``<stage>.<key>``)."""
    meta, typ = f.metadata, str(f.type)
    if isinstance(next(iter(meta.get("choices", ())), None), str):
        return {"choices": list(meta["choices"])}
    if "bool" in typ:
        return {"type": boolean}
    if "float" in typ:
        return {"type": positive(f.name) if "above" in meta else float}
    if "int" in typ:
        return {"type": count(1 if meta.get("min", 0) >= 1 else 0)}
    return {}


def _help_of(f, config_file: bool) -> str:
    """The field's help (the schema's description too) and the default it leaves."""
    value = f.default
    shown = ("null" if value is None else " ".join(map(str, value))
             if isinstance(value, tuple) else value)
    where = "the --config file's, else " if config_file else ""
    return f"{f.metadata['help']} (default: {where}{shown})".replace("%", "%%")


def field_options(p, cls, *, config_file: bool = False, required=()) -> None:
    """One option per flagged field of ``cls``: its flag, its values parsed as the field
    holds them (a list: one or more; ``repeat``: the flag repeated), its help. No argparse
    default: an option left out keeps the --config file's value, else the dataclass's
    (``given``), so the default lives in one place. ``required``: fields that must be given."""
    for f in flagged(cls):
        flag, kw = f.metadata["flag"], _parser_of(f)
        if f.metadata.get("repeat"):
            kw["action"] = "append"
        elif str(f.type).startswith("tuple"):
            kw["nargs"] = "+"
        if "choices" not in kw:  # argparse would name the values by the field, not the flag
            kw["metavar"] = flag[2:].upper().replace("-", "_")
        must = f.name in required
        p.add_argument(flag, dest=f.name, required=must, **kw,
                       help=f.metadata["help"] if must else _help_of(f, config_file))


def given(args, cls) -> dict:
    """The config fields given on the command line (an option left out is None)."""
    return {f.name: getattr(args, f.name) for f in flagged(cls)
            if getattr(args, f.name) is not None}


def json_object(text: str, option: str) -> dict:
    import json

    from ..errors import ConfigError

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{option}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise ConfigError(f"{option}: JSON nested too deeply") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{option}: expected a JSON object, e.g. '{{\"partition\": "
                          "\"gpu\"}'")
    return value


def config_section(args, stage: str, cls) -> dict:
    """A stage verb's settings: its ``--config`` file's ``stage`` section (or a file of the
    section alone), the options given on the command line (``cls``'s fields) on top,
    enabled."""
    from ..errors import ConfigError

    data = {}
    if args.config:
        from ..yamlio import YAMLInputError, load_yaml

        try:
            loaded = load_yaml(args.config)
        except YAMLInputError as exc:
            raise ConfigError(str(exc)) from None
        if isinstance(loaded, dict) and isinstance(loaded.get(stage), dict):
            loaded = loaded[stage]
        if not isinstance(loaded, dict):
            raise ConfigError(f"{args.config}: expected a mapping of the {stage} stage's "
                              f"settings (or a study config with a {stage} section)")
        data = dict(loaded)
    return {**data, **given(args, cls), "enabled": True}


def run_or_launch(args, cfg, run, load_rows, summary, out: str) -> int:
    """A stage verb's run: through its launcher (``--launcher``: one step, its rows'
    summary printed) or here; a run that left rows missing never exits 0."""
    import os
    import sys

    if args.launcher:
        from ..launchers import run_step

        options = json_object(args.launcher_options, "--launcher-options")
        run_step(args.launcher, options, os.path.join(out, "logs"), cfg.task(out, run))
        print(summary(load_rows(out)))
        return 0
    res = run(cfg, out, sys.stdout)
    if res["status"] == "incomplete":
        return 130 if res.get("stopped") else 1
    return 0


def section_cli(help: str, cls, run, load_rows, summary) -> Cli:
    """The verb of a stage that runs its config section (``cls``, a ``SectionConfig``):
    ``--out``, ``--config`` (the section's file), one option per config field on top, and
    ``--launcher``; it runs the section here or as one job (``run_or_launch``)."""
    def add_arguments(p) -> None:
        p.add_argument("--out", required=True, help="directory for rows.jsonl and the manifest")
        config_file_option(p, cls.stage)
        field_options(p, cls, config_file=True)
        launcher_option(p)

    def handler(args) -> int:
        import os

        cfg = section_from_dict(cls, cls.stage, config_section(args, cls.stage, cls))
        return run_or_launch(args, cfg, run, load_rows, summary,
                             os.path.abspath(args.out))

    return Cli(help, add_arguments, handler)


# A measured stage's rows file in its results directory, RESULTS/<name>/.
ROWS_FILE = "rows.jsonl"


def measured_run(cfg, out_dir: str, plan, digest: str, header: str, measure_rows, summary,
                 reason, log) -> dict:
    """A measured stage's run (or resume) into ``out_dir``, ``cfg.stage``'s: its rows file
    (``ROWS_FILE``) under a lock, rows of another config (``digest``) set aside, its manifest
    written before and after ``measure_rows(store)`` (which returns whether a signal stopped
    it) measures ``plan``; then its summary and status (``run_status``). ``header``: the
    log's first line, after the stage's name; ``reason``: why no GPU is there, or None."""
    import os

    from ..bench.manifest import capture, now
    from ..bench.runner import earlier_runs_of, resume, write_manifest
    from ..bench.store import Lock, ResultStore

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, ROWS_FILE)
    with Lock(path, log):
        store = ResultStore(path)
        resume(store, digest, True, log)  # rows of another config: aside
        open(path, "ab").close()  # the rule's output exists even if nothing is measured
        started = now()
        manifest = os.path.join(out_dir, f"manifest-{cfg.stage}.json")
        # A resumed run keeps the runs that measured its earlier rows, as the bench's does.
        earlier = earlier_runs_of(manifest) if store.rows else []
        write_manifest(manifest, dict(capture(cfg, started=started), earlier_runs=earlier))
        print(f"{cfg.stage}: {header}", file=log, flush=True)
        try:
            stopped = measure_rows(store)
        finally:
            write_manifest(manifest, dict(capture(cfg, started=started, finished=now()),
                                          earlier_runs=earlier))
        rows = list(store.rows.values())
        missing = [(p.key(), m) for p, ms in plan for m in ms if not store.done(p.key(), m)]
    print(summary(rows), file=log, flush=True)
    return run_status(cfg.stage, plan, missing, stopped, reason, out_dir, log)


def measured_rows(out_dir: str, stage: str, keys: tuple[str, ...]) -> list[dict]:
    """A measured stage's rows (bounded, regular file only): a line that is not a row with
    ``point_key``, ``method``, ``status`` and the stage's own ``keys`` is one StudyError
    naming the file and line. A resumed point keeps its last rows."""
    import os

    from ..safeio import read_row_objects

    rows = read_row_objects(os.path.join(out_dir, ROWS_FILE), f"{stage} rows",
                            ("point_key", "method", "status", *keys))
    return list({(r["point_key"], r["method"]): r for r in rows}.values())


def measured_stage(cls, run, load_rows, summary, help: str, *, verbs, key: str,
                   compared: bool = False) -> Stage:
    """The descriptor of a stage that ``measured_run`` measures: its section ``cls`` run as
    one ``ConfigTask``, its rows (``ROWS_FILE``: ``Rows``' ``verbs``, ``key``,
    ``compared``), in a bundle as ``<stage>-rows.jsonl`` with what did not run, and its
    ``tiledattn <stage>`` verb (``section_cli``, ``help``)."""
    what = f"the {cls.stage} stage's rows"
    return Stage(cls.stage, cls, run, ConfigTask,
                 rows=Rows(load_rows, ROWS_FILE, what=what, verbs=verbs, key=key,
                           compared=compared),
                 publish=Publish(f"{cls.stage}-rows.jsonl", what, f"{what}, when it ran",
                                 not_run=not_run_rows(cls.stage, ROWS_FILE, load_rows)),
                 cli=section_cli(help, cls, run, load_rows, summary))


def run_status(stage: str, plan, missing, stopped: bool, reason, out_dir: str, log) -> dict:
    """A measured stage's status: ``incomplete`` where rows of ``plan`` are ``missing``
    (never a silent gap: it says which, and why, in the log too), else ``unavailable``
    where no GPU was there (``reason``), else ``ok``."""
    if missing:
        why = ("stopped by a signal (Ctrl-C or SIGTERM) before they were measured; run "
               "again to resume" if stopped else "the harness returned no row for them")
        msg = (f"{len(missing)} of {sum(len(m) for _, m in plan)} rows missing ({why}), "
               f"e.g. {', '.join(f'{k} {m}' for k, m in missing[:3])}")
        print(f"{stage}: {msg}", file=log, flush=True)
        return {"status": "incomplete", "reason": msg, "out": out_dir, "stopped": stopped}
    return {"status": "unavailable" if reason else "ok", "reason": reason, "out": out_dir}


def results_file(out_dir: str, name: str, checked) -> str | None:
    """A stage's results file ``name`` for its bundle README bullets, through ``checked``
    (the study's guard on a path it reads); None where the stage left none."""
    import os

    path = os.path.join(out_dir, name)
    return checked(path) if os.path.lexists(path) else None


def not_run_bullets(stage: str, rows_file: str, load_rows, out_dir: str, checked) -> list[str]:
    """A stage's bundle README bullets: one per method and status that did not run, with
    its reason (``checked``: the study's guard on a path it reads)."""
    if results_file(out_dir, rows_file, checked) is None:
        return []
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in load_rows(out_dir):
        if r.get("status") != "ok":
            groups.setdefault((r["method"], r["status"]), []).append(r)
    return [f"- {stage}: {m} {st} at {len(g)} point(s): {one_line(g[0].get('reason') or '—')}"
            for (m, st), g in sorted(groups.items())]


def not_run_rows(stage: str, rows_file: str, load_rows) -> Callable[[str, object], list[str]]:
    """``Publish.not_run`` of a stage whose rows say why they did not run
    (``not_run_bullets``)."""
    return partial(not_run_bullets, stage, rows_file, load_rows)
