"""Write the benchmark section of the study config as the shards' own config file."""

import yaml

from tiledattention.bench.config import from_dict
from tiledattention.bench.grid import expand

bench = snakemake.params.bench  # noqa: F821 (injected by Snakemake)
points = expand(from_dict(bench))
with open(snakemake.output[0], "w") as f:  # noqa: F821
    yaml.safe_dump(bench, f, sort_keys=False)
with open(snakemake.log[0], "w") as f:  # noqa: F821
    f.write(f"{len(points)} points in {snakemake.config['shards']} shards\n")  # noqa: F821
