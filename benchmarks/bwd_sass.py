"""What tileiras made of the backward's dK/dV (and dQ) kernels: SASS counts, no GPU needed.

Compiles each backward schedule given (labels as ``BwdSchedule.label``) for sm_90 with
``compile.export_bwd_cubins`` and reads the cubins with ``cuobjdump -sass -res-usage``:
per kernel, the registers per thread, the stack frame, and counts of the instructions that
decide the backward's speed — HGMMA (warp-group MMAs), UTMAREDG (TMA reduce-add of dQ),
UTMALDG / UTMASTG, per-element atomics (ATOMG / REDG / MEMBAR) and local-memory spills
(STL / LDL).

cuobjdump is not in cuda-tile's wheels: ``pip download nvidia-cuda-cuobjdump==13.4.92``,
unzip, and pass ``--cuobjdump PATH`` (or have it on PATH).

    python benchmarks/bwd_sass.py --head-dim 64,128 kv64x128_q128x64_o1_w8_atomic
    python benchmarks/bwd_sass.py --head-dim 256 --causal kv64x64_q64x64_o1_w8
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tiledattention.kernel.compile import export_bwd_cubins  # noqa: E402
from tiledattention.kernel.variant import BwdVariant  # noqa: E402
from tiledattention.schedules.backward import BwdSchedule  # noqa: E402

COUNTED = ("HGMMA", "UTMAREDG", "UTMALDG", "UTMASTG", "ATOMG", "REDG", "MEMBAR", "STL", "LDL")


def sass_counts(cubin: bytes, cuobjdump: str) -> dict[str, object]:
    """Instruction counts, registers and stack of one cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
        res = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    out: dict[str, object] = {k: sum(1 for op in ops if op.split(".")[0] == k)
                              for k in COUNTED}
    reg = re.search(r"REG:(\d+)", res)
    stack = re.search(r"STACK:(\d+)", res)
    out["REG"] = int(reg.group(1)) if reg else None
    out["STACK"] = int(stack.group(1)) if stack else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("schedules", nargs="+", help="backward schedule labels")
    ap.add_argument("--head-dim", default="128", help="comma-separated, e.g. 64,128,256")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--gpu-code", default="sm_90")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump"))
    args = ap.parse_args(argv)
    if not args.cuobjdump:
        print("cuobjdump not found: pass --cuobjdump PATH (pip nvidia-cuda-cuobjdump)")
        return 2
    print("D  causal  schedule  kernel  " + "  ".join(COUNTED) + "  REG  STACK")
    for d in (int(x) for x in args.head_dim.split(",")):
        for label in args.schedules:
            v = BwdVariant(args.dtype, d, args.causal, BwdSchedule.from_label(label),
                           even_n=True)
            cubins = export_bwd_cubins(v, args.gpu_code)
            for name, cubin in cubins.items():
                if name.endswith("delta") or (name.endswith("_dq")
                                              and v.schedule.dq == "atomic"):
                    continue
                c = sass_counts(cubin, args.cuobjdump)
                print(f"{d}  {args.causal}  {label}  {name.removeprefix('attention_bwd_')}  "
                      + "  ".join(str(c[k]) for k in COUNTED) + f"  {c['REG']}  {c['STACK']}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
