"""End to end: prefill, decode and training-step tokens/s (eager and compiled) of the tiny
Llama with each attention implementation (tiledattention, transformers' sdpa and eager),
side by side in one process, and the ratio to sdpa. The measuring lives in
``tiledattention/stages/model.py`` (the study's ``model`` stage and ``tiledattn model`` run
the same code); this prints its table and, with ``--out``, keeps the rows.

    python benchmarks/model_e2e.py [--batch 1 8] [--prompt 2048] [--steps 64] [--reps 5]
                                   [--phases prefill decode train prefill_compiled
                                    train_compiled] [--out DIR]
"""

from __future__ import annotations

import argparse
import tempfile

from tiledattention.bench.config import ConfigError
from tiledattention.stages.model import MODEL_PHASES, load_rows, model_from_dict, run_model, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--phases", nargs="+", default=list(MODEL_PHASES), choices=MODEL_PHASES)
    ap.add_argument("--out", help="directory for rows.jsonl and manifest-model.json")
    args = ap.parse_args()
    try:
        cfg = model_from_dict({"enabled": True, "batches": args.batch, "prompt": args.prompt,
                               "steps": args.steps, "reps": args.reps,
                               "phases": args.phases})
    except ConfigError as exc:
        ap.error(str(exc))  # one line, exit 2
    out = args.out or tempfile.mkdtemp(prefix="model-e2e-")
    run_model(cfg, out)
    print(summary(load_rows(out)))


if __name__ == "__main__":
    main()
