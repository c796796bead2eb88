# Helpers shared by the rules. The config is validated here, once, before any job starts:
# tiledattention checks the benchmark and stage sections, the JSON schema every key (its
# generated sections from the same classes, added here: study_schema), and Snakemake's
# validate fills the study keys' defaults from the schema file.
import json
import os
import shlex
import sys

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from snakemake.exceptions import WorkflowError
from snakemake.utils import update_config, validate

from tiledattention.bench.config import ConfigError
from tiledattention.bench.config import from_dict as _bench_config
from tiledattention.bench.config import stage_args as _stage_args
from tiledattention.bench.grid import expand as _expand_points
from tiledattention.bench.grid import pinned as _pinned
from tiledattention.launchers import LauncherError
from tiledattention.launchers import check_launcher as _check_launcher
from tiledattention.launchers import interrupt as _interrupt
from tiledattention.launchers import preflight_launcher as _preflight_launcher
from tiledattention.launchers import profiles as _profiles
from tiledattention.launchers.base import typed_options as _typed_options
from tiledattention.study.presentation import figures as _figures
from tiledattention.study.presentation import report_pages as _report_pages
from tiledattention.study.presentation import tables as _tables
from tiledattention.study import timeline as _timeline
from tiledattention.stages import SECTIONS as _STAGE_SECTIONS
from tiledattention.stages import STAGES as _STAGES
from tiledattention.stages import rule_files as _stage_rule_files
from tiledattention.stages import stage_from_dict as _stage_config
from tiledattention.stages import study_schema as _study_schema
from tiledattention.stages.bench import shapes_bench_config as _shapes_bench_config
from tiledattention.stages.bench import shapes_config as _shapes_config
from tiledattention.stages.bench import study_timing as _study_timing
from tiledattention.stages.profile import Shape as _ProfileShape
from tiledattention.yamlio import YAMLInputError, load_yaml


def check_config_files(paths):
    """Each config file through tiledattention's strict loader (no aliases, no duplicate
    keys, a size cap) before anything else: Snakemake's own loader accepts the first two
    silently, so a key written twice would otherwise lose one of the values."""
    for path in paths:
        try:
            load_yaml(path)
        except YAMLInputError as exc:
            raise WorkflowError(f"config: {exc}") from None


def check_config_shape(config):
    if not isinstance(config, dict) or not config:
        raise WorkflowError("the study config is empty: pass a study config with "
                            "--configfile (see config/README.md), e.g. config/smoke.yaml")


def config_files(paths):
    """The config files merged in order, as Snakemake merged them (for naming overrides)."""
    merged = {}
    for path in paths:
        loaded = load_yaml(path)
        if isinstance(loaded, dict):
            update_config(merged, loaded)
    return merged


def check_study_keys(config):
    """Every study key known, every value as the schema says: one line naming the key
    (and the valid keys), not the whole schema (Snakemake's validate prints all of it)."""
    with open(os.path.join(workflow.basedir, "workflow", "schemas", "config.schema.yaml")) as f:
        schema = _study_schema(yaml.safe_load(f))  # the file's keys + the generated sections
    valid = sorted(schema["properties"])
    unknown = sorted(set(map(str, config)) - set(valid))
    if unknown:
        raise WorkflowError(f"config: unknown key(s) {unknown}; valid keys are {valid}")
    error = best_match(Draft202012Validator(schema).iter_errors(config))
    if error is not None:
        where = ".".join(map(str, error.absolute_path)) or "config"
        raise WorkflowError(f"config: {where}: {' '.join(error.message.split())[:400]}")


def check_launcher_options(config):
    """The launcher's options through its own dataclass (the one definition of them), so
    a mistyped option stops the study here, before the first rule."""
    try:
        _check_launcher(config["launcher"], config["launcher_options"])
    except LauncherError as exc:
        raise WorkflowError(f"config: launcher_options: {exc}") from None


def check_shapes(config):
    """The shapes stage enabled with no grid would plan nothing and publish empty tables."""
    if config["shapes"]["enabled"] and not config["shapes"]["grids"]:
        raise WorkflowError("config: shapes: enabled with no grids; give at least one grid "
                            "(a bench grid section) or set enabled: false")


def refuse_config(check, *args):
    """A config check whose refusal is one line and exit 2 (bad input), not Snakemake's
    WorkflowError with its file frames and exit 1."""
    try:
        return check(*args)
    except (WorkflowError, ConfigError, LauncherError, ValueError) as exc:
        text = " ".join(str(exc.args[0] if exc.args else exc).split())
        print(text if text.startswith("config") else f"config: {text}", file=sys.stderr)
        sys.exit(2)


refuse_config(check_config_files, workflow.configfiles)
refuse_config(check_config_shape, config)
# A --config on the command line must not drop the profile's launcher: config files <
# profile < command line, key by key, and each value that lost is named.
_interrupt.export_pid()  # the steps of a run that has died cancel their jobs
# A run killed with -9 leaves its lock: when its process is gone, the rerun removes it.
_STALE = _interrupt.release_stale_lock()
if _STALE:
    print(_STALE, file=sys.stderr)
_UNKNOWN_LOCK = _interrupt.unrecorded_lock(sys.argv)  # no holder recorded: the command
if _UNKNOWN_LOCK:
    print(_UNKNOWN_LOCK, file=sys.stderr)
try:
    _RESTORED, _LOST = _profiles.apply(config, sys.argv[1:],
                                       dict(workflow.config_settings.config),
                                       _profiles.env_profile(),
                                       config_files(workflow.configfiles))
except LauncherError as exc:
    raise WorkflowError(str(exc)) from None
if _RESTORED:
    print(f"config: {', '.join(_RESTORED)} from the profile, under the command line's "
          "--config", file=sys.stderr)
for _line in _LOST:
    print(_line, file=sys.stderr)


def ladder_bench():
    """The ladder as a bench config: the study's timing, the reduced grid, one pinned
    tiledattention method per step next to the tuned table and PyTorch SDPA."""
    ladder = config["ladder"]
    steps = [_pinned(s) for s in ladder["steps"]]
    return {**_study_timing(config), "grid": ladder["grid"],
            "methods": steps + ["tiledattention", "torch_sdpa"]}


def shapes_bench(i):
    """Shapes grid ``i`` as a bench config: the study's timing, the grid's methods
    (default: the kernel next to PyTorch SDPA's automatic dispatch)."""
    return _shapes_config(config, i)


# The bench section and the GPU stages' sections first, each from its dataclass (the
# schema's sections are generated from them): tiledattention's errors name the key and list
# the valid ones.
BENCH = refuse_config(_bench_config, config.get("bench") or {})
# Every stage with a section of its own (tiledattention.stages' registry), validated once.
STAGE = {name: refuse_config(_stage_config, name, config.get(name))
         for name in _STAGE_SECTIONS}
refuse_config(check_study_keys, config)
# Fills the study keys' defaults (the generated sections have none: the dataclasses do).
validate(config, "../schemas/config.schema.yaml")
refuse_config(check_launcher_options, config)
for _shape in STAGE["profile"].shapes:  # a bad shape fails here, naming the expected form
    refuse_config(_ProfileShape.parse, _shape)
# A bad step label fails here, before any job.
LADDER = refuse_config(_bench_config, ladder_bench()) if config["ladder"]["enabled"] else None
SHAPE_GRIDS = (list(range(len(config["shapes"]["grids"]))) if config["shapes"]["enabled"]
               else [])
refuse_config(check_shapes, config)
SHAPES = {i: refuse_config(_shapes_bench_config, config, i) for i in SHAPE_GRIDS}  # bad grids

RESULTS = config["results_dir"]
# The SLURM launchers of this run (preflight, every step) say a waiting partition once per
# change, not once per step: they keep what they said in the study's logs.
_interrupt.export_said_file(RESULTS)
STAGE_RULE_FILES = _stage_rule_files()
SHARDS = config["shards"]
TABLES = list(_tables.NAMES)  # the modules that write them name them
FIGURES = _figures.names_for(BENCH, model=STAGE["model"].enabled)
REPORT_PAGES = _report_pages.PAGES


# The report's key figures (category "2. Key figures", after the headline); every figure
# has its own caption, workflow/report/figures/<stem>.rst: one per kind, whatever its pass and D
# (throughput_fwdbwd_d128 -> throughput, regime_map_fwd -> regime_map).
KEY_FIGURES = ("regime_map", "ratios_vs_seq", "baselines_d128", "decode", "utilisation")
_FIGURE_KINDS = ("throughput", "regime_map", "ratios_vs_seq", "baselines_d128")


def figure_stem(name):
    return next((k for k in _FIGURE_KINDS if name.startswith(f"{k}_")), name)


def figure_caption(name):
    return f"../report/figures/{figure_stem(name)}.rst"


def figure_category(name):
    return "2. Key figures" if figure_stem(name) in KEY_FIGURES else "3. More figures"


def n_points(bench):
    """Points of a validated bench config (the plan logs it), 0 for a stage that is off."""
    return len(_expand_points(bench)) if bench else 0


def shard_marker(i):
    return f"{RESULTS}/shards/shard{i}of{SHARDS}.done"


def launcher_args():
    """--launcher and --launcher-options of every GPU step, quoted for the shell."""
    # Typed first: a profile's values arrive as strings ("1", "null").
    options = _typed_options(config["launcher"], config["launcher_options"])
    return (f"--launcher {shlex.quote(config['launcher'])} --launcher-options "
            f"{shlex.quote(json.dumps(options))}")


def gpu_slots():
    """Local jobs hold one of the profile's `gpu` slots (one GPU each); SLURM jobs wait on
    the cluster and hold none: None leaves the resource out (a `gpu=0` shown beside a GPU
    step read as "this step uses no GPU")."""
    return 1 if config["launcher"] == "local" else None


def aggregate_inputs(wildcards):
    out = {"shards": [shard_marker(i) for i in range(SHARDS)]}
    if STAGE["tune"].enabled:
        out["tune"] = f"{RESULTS}/tune/schedule-table.json"
    # The stages whose own rows aggregate or figures read, by stage name: the ladder's and
    # the shapes grids' sweeps (bench.smk's markers), the others' rows files.
    if config["ladder"]["enabled"]:
        out["ladder"] = f"{RESULTS}/ladder/ladder.done"
    if SHAPE_GRIDS:
        out["shapes"] = [f"{RESULTS}/shapes/g{g}/shapes.done" for g in SHAPE_GRIDS]
    for name in ROWS_STAGES:
        if name in STAGE and STAGE[name].enabled:
            out[name] = f"{RESULTS}/{name}/{_STAGES[name].rows.file}"
    return out


# The stages with rows of their own that aggregate (or figures) take as --<name> DIR, in
# registry order; those figures reads too go with study_extras, the others after them.
ROWS_STAGES = [n for n, s in _STAGES.items() if s.rows and s.rows.verbs]
_FIGURES_STAGES = [n for n in ROWS_STAGES
                   if any(v == "figures" for v, _ in _STAGES[n].rows.verbs)]


def _stage_rows_flags(names, input):
    """--<name> DIR... for each stage named whose input is there: the directory of each of
    its input files."""
    return [f"--{n} " + " ".join(shlex.quote(os.path.dirname(p))
                                 for p in ([input[n]] if isinstance(input[n], str)
                                           else input[n]))
            for n in names if n in input.keys()]


def study_extras(wildcards, input):
    """--tune-table and --<stage> DIR (ladder, shapes, model, variants) for aggregate and
    figures, when the study ran those stages."""
    extra = []
    if "tune" in input.keys():
        extra.append(f"--tune-table {shlex.quote(input.tune)}")
    extra += _stage_rows_flags(_FIGURES_STAGES, input)
    return " ".join(extra)


def aggregate_rows_arg(wildcards, input):
    """--<stage> DIR for aggregate alone (the workloads stage's, for its tables), for each
    such stage the study ran."""
    return " ".join(_stage_rows_flags([n for n in ROWS_STAGES if n not in _FIGURES_STAGES],
                                      input))


def stage_args(name):
    """A GPU stage's tiledattn options, from its config dataclass (STAGE[name])."""
    return _stage_args(STAGE[name])


def bundle_stage_inputs():
    """What the bundle waits for from the stages whose results directory it takes whole
    (profile's, as profiles.zip), when the study runs them."""
    return [f"{RESULTS}/{n}/{s.publish.waits_for}" for n, s in _STAGES.items()
            if s.publish.waits_for and n in STAGE and STAGE[n].enabled]


def all_outputs():
    return [f"{RESULTS}/bundle/SHA256SUMS", f"{RESULTS}/bundle.verified",
            f"{RESULTS}/report/landing.html"]


# The study's timeline (logs/runs.jsonl): each run's start, end, GPUs and job times, for
# `tiledattn scaling` (study wall time against GPU count, and what stays serial).
_RUN = _timeline.run_id()


def preflight():
    """Ask the scheduler once, before any step, whether the GPU steps' request can ever run:
    a refusal is one line for the run (not one per parallel step) and no job is queued."""
    try:
        _preflight_launcher(config["launcher"], config["launcher_options"],
                            os.path.join(RESULTS, "logs", "preflight"))
    except LauncherError as exc:
        raise WorkflowError(f"tiledattn: {exc}") from None


def held_locks():
    """The lock files this run holds (none under --nolock)."""
    return list(getattr(workflow.persistence, "_lockfile", {}).values())


onstart:
    # Ctrl-C / SIGTERM: the GPU steps' launchers cancel their jobs, then Snakemake stops.
    _interrupt.forward()
    _interrupt.record_holder(held_locks())
    preflight()
    _timeline.start(RESULTS, workflow, config, _RUN)


onsuccess:
    _interrupt.forget_holder(held_locks())
    _timeline.end(RESULTS, workflow, _RUN, "ok")


onerror:
    _interrupt.forget_holder(held_locks())
    _timeline.end(RESULTS, workflow, _RUN, "failed")
    if _interrupt.stopped_line():  # Ctrl-C / SIGTERM: one line saying what the errors are
        print(_interrupt.stopped_line(), file=sys.stderr)
