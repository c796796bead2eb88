"""End to end: prefill and decode tokens/s of the tiny Llama with each attention
implementation (tiledattention, transformers' sdpa and eager), side by side in one
process, and the ratio to sdpa. The measuring lives in ``tiledattention/bench/model.py``
(the study's ``model`` stage and ``tiledattn model`` run the same code); this prints its
table and, with ``--out``, keeps the rows.

    python benchmarks/model_e2e.py [--batch 1 8] [--prompt 2048] [--steps 64] [--reps 5]
                                   [--out DIR]
"""

from __future__ import annotations

import argparse
import tempfile

from tiledattention.bench.config import ConfigError, model_from_dict
from tiledattention.bench.model import load_rows, run_model, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", help="directory for rows.jsonl and manifest-model.json")
    args = ap.parse_args()
    try:
        cfg = model_from_dict({"enabled": True, "batches": args.batch, "prompt": args.prompt,
                               "steps": args.steps, "reps": args.reps})
    except ConfigError as exc:
        ap.error(str(exc))  # one line, exit 2
    out = args.out or tempfile.mkdtemp(prefix="model-e2e-")
    run_model(cfg, out)
    print(summary(load_rows(out)))


if __name__ == "__main__":
    main()
