"""python -m tiledattention.study.advice build REFERENCE_DIR OUT.json [MODELS_ROWS ...]: the
shipped measured points of one GPU from its reference bundle (see advise.build)."""

import sys

from .advise import build

if len(sys.argv) < 4 or sys.argv[1] != "build":
    sys.exit("usage: python -m tiledattention.study.advice build REFERENCE_DIR OUT.json "
             "[MODELS_ROWS ...]")
d = build(sys.argv[2], sys.argv[3], sys.argv[4:])
print(f"{len(d['points'])} points -> {sys.argv[3]}")
