# Helpers shared by the rules. The config is validated here, before any job starts: the
# JSON schema checks the study keys (and fills defaults), tiledattention checks the
# benchmark sections.
import json
import os

from snakemake.utils import validate

from tiledattention.bench.config import from_dict as _bench_config


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


def launcher_options():
    return json.dumps(config["launcher_options"])


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
        extra.append(f"--ladder {os.path.dirname(input.ladder)}")
    if "tune" in input.keys():
        extra.append(f"--tune-table {input.tune}")
    return " ".join(extra)


def tune_restrictions():
    flags = (("seqs", "--seqs"), ("head_dims", "--head-dims"), ("dtypes", "--dtypes"))
    return " ".join(f"{flag} {' '.join(map(str, config['tune'][key]))}"
                    for key, flag in flags if config["tune"].get(key))


def bundle_profile_input():
    return [f"{RESULTS}/profile/summary.md"] if config["profile"]["enabled"] else []


def all_outputs():
    return [f"{RESULTS}/bundle/SHA256SUMS", f"{RESULTS}/bundle.verified"]
