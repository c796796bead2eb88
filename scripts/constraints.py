"""Print the pip constraints of a dev venv: containers/requirements.lock, with
containers/requirements-dev.lock added and winning where both pin a name (scripts/setup.sh)."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pins: dict[str, str] = {}
for rel in ("containers/requirements.lock", "containers/requirements-dev.lock"):
    with open(os.path.join(ROOT, rel)) as f:
        for line in f:
            if "==" in line and not line.startswith("#"):
                pins[re.sub(r"[-_.]+", "-", line.split("==")[0]).lower()] = line.strip()
print("\n".join(pins[n] for n in sorted(pins)))
