# Helpers shared by the rules. The config is validated here, before any job starts: the
# JSON schema checks the study keys, tiledattention checks the benchmark section.
import json
import os

from snakemake.utils import validate

from tiledattention.bench.config import from_dict as _bench_config


validate(config, "../schemas/config.schema.yaml")
_bench_config(config["bench"])  # raises ConfigError naming the key

RESULTS = config["results_dir"]
SHARDS = config["shards"]


def shard_marker(i):
    return f"{RESULTS}/shards/shard{i}of{SHARDS}.done"


def launcher_options():
    return json.dumps(config["launcher_options"])


def all_outputs():
    out = [f"{RESULTS}/aggregate/rows.csv"]
    if config["tune"]["enabled"]:
        out.append(f"{RESULTS}/tune/schedule-table.json")
    return out
