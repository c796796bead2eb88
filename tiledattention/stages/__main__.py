"""``python -m tiledattention.stages``: the generated sections of the workflow's config
schema (workflow/schemas/config.schema.yaml holds them verbatim; tests/test_schema.py)."""

import yaml

from . import schema

print(yaml.safe_dump(schema(), sort_keys=False, width=90, default_flow_style=None), end="")
