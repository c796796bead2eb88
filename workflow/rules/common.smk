# Helpers shared by the rules. The config is validated here, before any job starts: the
# JSON schema checks the study keys (and fills defaults), tiledattention checks the
# benchmark sections.
import json
import os
import shlex
import sys

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from tiledattention.bench.config import from_dict as _bench_config
from tiledattention.launchers import LauncherError
from tiledattention.launchers import profiles as _profiles


def check_config_shape(config):
    if not isinstance(config, dict) or not config:
        raise WorkflowError("the study config is empty: pass a study config with "
                            "--configfile (see config/README.md), e.g. config/smoke.yaml")


check_config_shape(config)
try:  # a --config on the command line must not drop the profile's launcher
    _RESTORED = _profiles.apply(config, sys.argv[1:], dict(workflow.config_settings.config),
                                _profiles.env_profile())
except LauncherError as exc:
    raise WorkflowError(str(exc)) from None
if _RESTORED:
    print(f"config: {', '.join(_RESTORED)} from the profile, under the command line's "
          "--config", file=sys.stderr)


def ladder_bench():
    """The ladder as a bench config: the study's timing, the reduced grid, one pinned
    tiledattention method per step next to the tuned table and PyTorch SDPA."""
    ladder = config["ladder"]
    steps = [f"tiledattention@{s}" for s in ladder["steps"]]
    return {**config["bench"], "grid": ladder["grid"],
            "methods": steps + ["tiledattention", "torch_sdpa"]}


validate(config, "../schemas/config.schema.yaml")
BENCH = _bench_config(config["bench"])  # raises ConfigError naming the key
if config["ladder"]["enabled"]:
    _bench_config(ladder_bench())  # a bad step label fails here, before any job

RESULTS = config["results_dir"]
SHARDS = config["shards"]
HEAD_DIMS = sorted(set(BENCH.grid.head_dims))
TABLES = ["headline", "table4_ratios", "ratios_by_head_dim", "ratios_by_regime", "table5_schedules",
          "table6_ladder", "throughput", "call_latency", "status"]
FIGURES = [f"throughput_vs_seq_d{d}" for d in HEAD_DIMS] + [
    "regime_map", "ratios_vs_seq", "baselines_d128", "bandwidth_vs_seq", "tile_sensitivity"]


def shard_marker(i):
    return f"{RESULTS}/shards/shard{i}of{SHARDS}.done"


def launcher_args():
    """--launcher and --launcher-options of every GPU step, quoted for the shell."""
    return (f"--launcher {shlex.quote(config['launcher'])} --launcher-options "
            f"{shlex.quote(json.dumps(config['launcher_options']))}")


def gpu_slots():
    """Local jobs hold one of the profile's `gpu` slots (one GPU each); SLURM jobs wait on
    the cluster and hold none."""
    return 1 if config["launcher"] == "local" else 0


def aggregate_inputs(wildcards):
    out = {"shards": [shard_marker(i) for i in range(SHARDS)]}
    if config["ladder"]["enabled"]:
        out["ladder"] = f"{RESULTS}/ladder/ladder.done"
    if config["tune"]["enabled"]:
        out["tune"] = f"{RESULTS}/tune/schedule-table.json"
    return out


def study_extras(wildcards, input):
    """--ladder/--tune-table for aggregate and figures, when the study ran those stages."""
    extra = []
    if "ladder" in input.keys():
        extra.append(f"--ladder {shlex.quote(os.path.dirname(input.ladder))}")
    if "tune" in input.keys():
        extra.append(f"--tune-table {shlex.quote(input.tune)}")
    return " ".join(extra)


def tune_restrictions():
    flags = (("seqs", "--seqs"), ("head_dims", "--head-dims"), ("dtypes", "--dtypes"))
    return " ".join(f"{flag} {' '.join(map(str, config['tune'][key]))}"
                    for key, flag in flags if config["tune"].get(key))


def bundle_profile_input():
    return [f"{RESULTS}/profile/summary.md"] if config["profile"]["enabled"] else []


def all_outputs():
    return [f"{RESULTS}/bundle/SHA256SUMS", f"{RESULTS}/bundle.verified"]
