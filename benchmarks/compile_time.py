"""Cold, disk-warm and in-memory time of the first sdpa call of a variant.

Runs one child process against an empty cuTile cache (cold compile) and a second
against the cache it left (disk-warm), each timing a first and a second call.

    python benchmarks/compile_time.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CHILD = """
import json, torch, tiledattention as ta
q, k, v = (torch.randn(2, 4, 1000, {d}, device="cuda", dtype=torch.float16) for _ in range(3))
first = ta.timed_call(q, k, v, causal={causal})
second = ta.timed_call(q, k, v, causal={causal})
print(json.dumps({{"first_s": first, "second_s": second}}))
"""


def main() -> int:
    print(f"{'D':>4} {'causal':6} {'cold first':>11} {'disk-warm first':>16} {'in-memory':>10}")
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, CUDA_TILE_CACHE_DIR=cache)
        for d, causal in ((64, False), (128, True), (160, False)):
            runs = []
            for _ in range(2):
                out = subprocess.run([sys.executable, "-c", CHILD.format(d=d, causal=causal)],
                                     env=env, capture_output=True, text=True, check=True)
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"{d:>4} {str(causal):6} {runs[0]['first_s']:10.2f}s {runs[1]['first_s']:15.2f}s "
                  f"{runs[1]['second_s'] * 1e3:8.2f}ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
