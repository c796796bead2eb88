"""What tileiras made of one kernel variant: remarks, SASS instruction counts, registers.

Runs on a CPU-only machine. Exports the variant's Tile IR bytecode with cuTile, compiles it
with ``tileiras --remarks=all`` (the one cuTile uses, or ``--tileiras PATH`` for an A/B
against another version), then reads the cubin with ``cuobjdump`` (``-res-usage`` and
``-sass``) and prints: the remarks (TMA or not per load/store, tensor-core MMAs, latency
hints used or defaulted), counts of the memory and MMA instructions that
decide how data moves (UTMALDG, UTMASTG, LDG, LDGSTS, STG, HGMMA, MUFU.EX2, ...), and the
registers per thread, overall and per warp group (``setmaxnreg``, the producer/consumer
split of a warp-specialised kernel).

cuobjdump is not part of cuda-tile's wheels: install ``nvidia-cuda-cuobjdump`` and
``nvidia-cuda-nvdisasm`` (the same CUDA major.minor; cuobjdump finds nvdisasm on PATH) or
pass ``--cuobjdump PATH``; without them the remarks are still printed.

    python benchmarks/inspect_kernel.py                     # 64x128 o2, D=128 fp16 full
    python benchmarks/inspect_kernel.py --schedule 128x128_o1_c1_lk2_lv4_w8 --head-dim 64
    python benchmarks/inspect_kernel.py --tileiras /tmp/cu135/nvidia/cu13/bin/tileiras
"""

from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tiledattention.kernel.compile import kernel_for, signature_for  # noqa: E402
from tiledattention.kernel.toolchain import (  # noqa: E402
    SASS_MISSING,
    cuobjdump_text,
    sass_tool,
)
from tiledattention.kernel.variant import Variant  # noqa: E402
from tiledattention.schedules.schedule import Schedule  # noqa: E402

COUNTED = ("UTMALDG", "UTMASTG", "UBLKCP", "LDGSTS", "LDG", "STG", "LDS", "STS", "LDSM",
           "HGMMA", "HMMA", "MUFU.EX2", "SYNCS", "WARPSYNC", "BAR",
           # programmatic dependent launch (schedule suffix _pdl): griddepcontrol
           # .launch_dependents and .wait
           "PREEXIT", "ACQBULK")


def bytecode_for(variant: Variant, gpu_code: str) -> bytes:
    from cuda.tile.compilation import export_kernel

    buf = io.BytesIO()
    export_kernel(kernel_for(variant.schedule), [signature_for(variant)], buf,
                  gpu_code=gpu_code, output_format="tileir_bytecode")
    return buf.getvalue()


def default_tileiras() -> str:
    from cuda.tile._compile import _find_compiler_bin

    return _find_compiler_bin().path


def run_tileiras(tileiras: str, bytecode: bytes, gpu_code: str, workdir: Path) -> tuple[Path, str]:
    """(cubin path, remarks text); ptxas is looked up next to the tileiras binary."""
    src = workdir / "kernel.bytecode"
    src.write_bytes(bytecode)
    cubin, remarks = workdir / "kernel.cubin", workdir / "remarks.yaml"
    env = dict(os.environ)
    bindir = str(Path(tileiras).resolve().parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["CUDA_HOME"] = str(Path(bindir).parent)
    subprocess.run([tileiras, str(src), "-o", str(cubin), "--gpu-name", gpu_code, "-O3",
                    "--lineinfo", "--remark-format=yaml", "--remarks=all",
                    f"--remarks-output-file={remarks}"], env=env, check=True,
                   capture_output=True, timeout=600)
    return cubin, remarks.read_text(errors="replace") if remarks.exists() else ""


def parse_remarks(remarks: str) -> list[dict]:
    """The remarks YAML as flat dicts (line, name, remark, instruction, shape), deduplicated."""
    out, seen = [], set()
    for doc in remarks.split("\n---")[1:]:
        fields = dict(re.findall(r"^\s*-?\s*(Name|Remark|Instruction|Shape):\s*(.+)$", doc, re.M))
        line = re.search(r"Line:\s*(\d+)", doc)
        item = (int(line.group(1)) if line else 0, fields.get("Name", "?"),
                fields.get("Remark", ""), fields.get("Instruction", ""),
                fields.get("Shape", "").strip("'"))
        if item not in seen:
            seen.add(item)
            out.append(dict(zip(("line", "name", "remark", "instruction", "shape"), item)))
    return sorted(out, key=lambda r: r["line"])


def source_line(n: int) -> str:
    from tiledattention.kernel import attention

    lines = Path(attention.__file__).read_text().splitlines()
    return lines[n - 1].strip()[:60] if 0 < n <= len(lines) else ""


def sass_counts(sass: str) -> Counter:
    counts: Counter = Counter()
    for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass):
        op = m.group(1)
        for name in COUNTED:
            if op == name or op.startswith(name + "."):
                counts[name] += 1
                break
    return counts


def mma_shapes(sass: str) -> Counter:
    return Counter(re.findall(r"\b(HGMMA\.\w+(?:\.\w+)*)", sass))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedule", default="64x128_o2_c1_lk2_lv4",
                    help="a Schedule label (default: %(default)s)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--gpu-code", default="sm_90")
    ap.add_argument("--tileiras", default=None, help="tileiras binary (default: cuTile's)")
    ap.add_argument("--cuobjdump", default=None, help="cuobjdump binary (default: PATH)")
    ap.add_argument("--keep", default=None, help="directory to keep cubin, remarks and SASS in")
    args = ap.parse_args(argv)

    variant = Variant(dtype=args.dtype, head_dim=args.head_dim, causal=args.causal,
                      schedule=Schedule.from_label(args.schedule), even_n=True)
    tileiras = args.tileiras or default_tileiras()
    version = subprocess.run([tileiras, "--version"], capture_output=True, text=True).stdout
    release = next((line.split("release", 1)[1].strip() for line in version.splitlines()
                    if "release" in line), "(version unknown)")
    print(f"variant {variant.label()} for {args.gpu_code}; "
          f"tileiras {release}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        cubin, remarks = run_tileiras(tileiras, bytecode_for(variant, args.gpu_code),
                                      args.gpu_code, work)
        found = parse_remarks(remarks)
        print(f"remarks ({len(found)} distinct; line numbers in kernel/attention.py):")
        for r in found:
            what = " ".join(x for x in (r["instruction"], r["shape"]) if x)
            print(f"  line {r['line']:>3} {source_line(r['line'])!r}: {r['remark']}"
                  f"{' -> ' + what if what else ''}")
        cuobjdump = args.cuobjdump or sass_tool()
        if cuobjdump is None:
            print(f"{SASS_MISSING}, or pass --cuobjdump PATH: no SASS counts")
            return 0
        res = cuobjdump_text(cubin, "-res-usage", cuobjdump)
        sass = cuobjdump_text(cubin, "-sass", cuobjdump)
        (work / "kernel.sass").write_text(sass)
        for line in res.splitlines():
            if "REG" in line:
                print("resources:", " ".join(line.split()))
        counts = sass_counts(sass)
        print("SASS:", ", ".join(f"{n} {counts[n]}" for n in COUNTED))
        print("HGMMA shapes:", dict(mma_shapes(sass)))
        # setmaxnreg: TRY_ALLOC raises the consumer warp groups' registers, DEALLOC lowers
        # the producer's (a warp-specialised kernel's register split).
        regs = sorted({(kind, int(n, 16)) for kind, n in re.findall(
            r"USETMAXREG\.(TRY_ALLOC|DEALLOC|ALLOC)\S*\s+(?:U?P\d+,\s*)?(0x[0-9a-f]+)", sass)})
        print("setmaxnreg:", ", ".join(f"{k} {n}" for k, n in regs) or "none (no split)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
