"""Variants, side by side in one run: a thin client of the study's variants stage
(``tiledattn variants``, ``tiledattention/stages/variants.py``: the one harness, L2
flushed before each call, methods interleaved, every row checked against float64).

    python benchmarks/variants.py --sparsity   # window 1024 and 4 documents vs causal, S=16384
    python benchmarks/variants.py --flex       # B8 H16 S4096 D128 bf16, each variant vs Flex

Rows go to --out (resumable); FlexAttention is reported unavailable (with the reason) where
Triton is missing.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tiledattention.stages import stage_from_dict  # noqa: E402
from tiledattention.stages.variants import load_rows, run_variants  # noqa: E402
from tiledattention.study.presentation.variants_report import ratio_rows  # noqa: E402

# The issue-21 sparsity targets: B1 H16 S16384 D128 bf16, forward, ours only.
SPARSITY = {"variants": ["causal", "window", "documents"], "methods": ["tiledattention"],
            "seqs": [16384], "head_dims": [128], "dtypes": ["bfloat16"], "passes": ["fwd"]}
# FlexAttention's numbers in issue 23: B8 H16 S4096 D128 bf16 (B*S = 32768).
FLEX = {"variants": ["causal", "window", "softcap", "alibi", "documents"],
        "seqs": [4096], "head_dims": [128], "dtypes": ["bfloat16"], "tokens": 32768}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sparsity", action="store_true")
    ap.add_argument("--flex", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="results/variants-bench")
    args = ap.parse_args()
    if args.sparsity:
        out = os.path.join(args.out, "sparsity")
        run_variants(stage_from_dict("variants", {**SPARSITY, "rounds": args.rounds}), out)
        ours = {r["variant"]: r["ours_ms"] for r in ratio_rows(load_rows(out))}
        for name in ("window", "documents"):
            if isinstance(ours.get(name), float) and isinstance(ours.get("causal"), float):
                print(f"  {name}: {ours['causal'] / ours[name]:.2f}x faster than causal "
                      "(targets: window >= 5x, 4 documents >= 3x)")
    if args.flex:
        run_variants(stage_from_dict("variants", {**FLEX, "rounds": args.rounds}),
                     os.path.join(args.out, "flex"))


if __name__ == "__main__":
    main()
