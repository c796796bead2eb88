"""What tileiras made of the backward's dK/dV (and dQ) kernels: SASS counts, no GPU needed.

Compiles each backward schedule given (labels as ``BwdSchedule.label``) for sm_90 with
``compile.export_bwd_cubins`` and reads the cubins with ``cuobjdump -sass -res-usage``:
per kernel, the registers per thread, the stack frame, and counts of the instructions that
decide the backward's speed — HGMMA (warp-group MMAs), UTMAREDG (TMA reduce-add of dQ),
UTMALDG / UTMASTG, per-element atomics (ATOMG / REDG / MEMBAR), local-memory spills
(STL / LDL) and warp-group MMA waits (WGWAIT: WARPGROUP.DEPBAR; about one per MMA when
tileiras serializes the MMAs, as at D = 256 without the group loop, benchmarks/notes/backward.md
§37a).

``--step`` adds what one iteration of the dK/dV program's query loop does, per thread
(``step_counts``): the instructions of the loop body, its warp-group MMAs by where their
row operand comes from (registers or a shared-memory descriptor), shared-memory stores
and loads (STS, STSM, LDS: the transposes of P and dS show here), CTA barriers and
fences, local-memory loads and stores (LOCAL: STL + LDL). ``--loops`` prints every
innermost loop with MMAs (the masked and unmasked versions of a causal loop).

cuobjdump is not in cuda-tile's wheels: tiledattention[dev] installs it
(nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm), or pass ``--cuobjdump PATH``.

    python benchmarks/bwd_sass.py --head-dim 64,128 kv64x128_q128x64_o1_w8_atomic
    python benchmarks/bwd_sass.py --head-dim 256 --causal kv64x64_q64x64_o1_w8
    python benchmarks/bwd_sass.py --step kv64x128_q128x64_o1_w8_atomic_keyrows
    python benchmarks/bwd_sass.py --step --loops --causal --head-dim 128 kv64x64_q64x64_o2_atomic
    python benchmarks/bwd_sass.py --head-dim 256 --group-loop none kv64x64_q64x64_o1_w8
    python benchmarks/bwd_sass.py --causal --step --loops --variant none,causal,softcap,window

``--variant`` (none, causal, softcap, window, user-softcap) compiles the variant entry
points (``attention_bwd_dkdv_variant`` / ``attention_bwd_dq_variant``) with a built-in's
functions, as a call passes them: softcap 30 (``variants.softcap``) as a score_mod on the
dense causal path, or written as FlexAttention users write it (``30.0 * torch.tanh(score /
30.0)``, lifted and differentiated as a user's function); window 1024
(``variants.sliding_window``) and causality itself (the mask_mod ``q_idx >= kv_idx``,
non-causal flags) as a mask_mod through a block mask (the
block-sparse path: a loop over the partial tiles, where the mask_mod runs per element, and
one over the full tiles, where it must not). Without schedule labels the schedule is the
one a call of that kind gets: the table's for ``none`` (plain), the default for a variant
(``choose_bwd_schedule(..., variant=True)``). The step columns add MUFU (TANH, EX2, RCP),
FMUL, FFMA, FSEL, ISETP and WGWAIT per loop iteration; with ``--loops`` a block-sparse
program prints its partial loop first, then its full loop.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tiledattention.kernel.compile import export_bwd_cubins  # noqa: E402
from tiledattention.kernel.toolchain import (  # noqa: E402
    SASS_MISSING,
    cuobjdump_text,
    sass_tool,
)
from tiledattention.kernel.variant import BwdVariant, Flags  # noqa: E402
from tiledattention.schedules.backward import BwdSchedule  # noqa: E402

COUNTED = ("HGMMA", "UTMAREDG", "UTMALDG", "UTMASTG", "ATOMG", "REDG", "MEMBAR", "STL", "LDL")
STEP = ("INSTR", "HGMMA_REG", "HGMMA_SMEM", "STS", "STSM", "LDS", "BAR", "PRMT", "MEMBAR",
        "FENCE", "LOCAL", "WGWAIT", "TANH", "EX2", "RCP", "FMUL", "FFMA", "FSEL", "ISETP")
MUFU = ("TANH", "EX2", "RCP")
_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);")


def disassemble(cubin: bytes, cuobjdump: str) -> tuple[str, str]:
    """(SASS listing, resource usage) of one cubin."""
    return (cuobjdump_text(cubin, "-sass", cuobjdump),
            cuobjdump_text(cubin, "-res-usage", cuobjdump))


def sass_counts(cubin: bytes, cuobjdump: str) -> dict[str, object]:
    """Instruction counts, registers and stack of one cubin."""
    sass, res = disassemble(cubin, cuobjdump)
    ops = [m.group(2) for m in _INSTR.finditer(sass)]
    out: dict[str, object] = {k: sum(1 for op in ops if op.split(".")[0] == k)
                              for k in COUNTED}
    out["WGWAIT"] = sum(1 for op in ops if op.startswith("WARPGROUP.DEPBAR"))
    reg = re.search(r"REG:(\d+)", res)
    stack = re.search(r"STACK:(\d+)", res)
    out["REG"] = int(reg.group(1)) if reg else None
    out["STACK"] = int(stack.group(1)) if stack else None
    return out


def step_counts(sass: str) -> dict[str, int] | None:
    """Per-thread counts of one iteration of the query loop: the first innermost loop (a
    backward branch) whose body holds warp-group MMAs, leaving out the retry stubs of the
    barrier waits at the function's end (their bodies span an EXIT). None: no such loop."""
    loops = loop_counts(sass)
    return loops[0] if loops else None


def loop_counts(sass: str) -> list[dict[str, int]]:
    """``step_counts`` of every innermost loop with warp-group MMAs, in address order: the
    query loop's versions (masked and unmasked, a staggered loop's two halves)."""
    instrs = [(int(m.group(1), 16), m.group(2), m.group(3)) for m in _INSTR.finditer(sass)]
    loops = []
    for addr, op, rest in instrs:
        target = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if target and int(target.group(1), 16) < addr:
            body = [i for i in instrs if int(target.group(1), 16) <= i[0] <= addr]
            ops = [o for _, o, _ in body]
            if any(o.startswith("HGMMA") for o in ops) and "EXIT" not in ops:
                loops.append(body)
    inner = [b for b in loops
             if not any(o is not b and b[0][0] <= o[0][0] and o[-1][0] <= b[-1][0] for o in loops)]
    return [_body_counts(b) for b in sorted(inner, key=lambda b: b[0][0])]


def _body_counts(body) -> dict[str, int]:
    out = dict.fromkeys(STEP, 0)
    out["INSTR"] = len(body)
    for _, op, rest in body:
        name = op.split(".")[0]
        if name == "HGMMA":
            # HGMMA Rd, Ra, gdesc[...]: the row operand in registers; Rd, gdesc, gdesc: both
            # operands in shared memory
            out["HGMMA_REG" if re.match(r"\s*R\d+,\s*R\d+", rest) else "HGMMA_SMEM"] += 1
        elif op.startswith("BAR.SYNC"):
            out["BAR"] += 1
        elif name in ("STL", "LDL"):
            out["LOCAL"] += 1
        elif op.startswith("WARPGROUP.DEPBAR"):
            out["WGWAIT"] += 1
        elif name == "MUFU":
            kind = op.split(".")[1] if "." in op else ""
            if kind in MUFU:
                out[kind] += 1
        elif name in ("INSTR",) + MUFU:
            pass
        elif name in out:
            out[name] += 1
    return out


# --group-loop -> BwdVariant.one_head
ONE_HEAD = {"shipped": None, "runtime": False, "none": True}
VARIANTS = ("none", "causal", "softcap", "window", "user-softcap")


def _causal_mask(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _user_softcap(score, b, h, q_idx, kv_idx):  # as FlexAttention users write it
    return 30.0 * torch.tanh(score / 30.0)


def variant_parts(name: str, causal: bool):
    """(mods, aux, causal flag, block axes) of a built-in variant as a call compiles it:
    softcap 30 a score_mod on the dense path; window 1024 and causality a mask_mod through
    a block mask (causality as a mask_mod drops the kernel's own causal flag)."""
    import cuda.tile as ct
    import torch

    from tiledattention import mods as M
    from tiledattention import variants

    if name == "none":
        return M.NONE, (), causal, None
    score, mask = {"softcap": (variants.softcap(30.0), None),
                   "user-softcap": (_user_softcap, None),
                   "window": (None, variants.sliding_window(1024)),
                   "causal": (None, _causal_mask)}[name]
    mods = M.mods_for(score, mask)
    dt = {torch.float32: ct.float32, torch.int32: ct.int32}
    aux = tuple((dt[t.dtype], t.dim()) for t in mods.tensors())
    return (mods, aux, causal and name != "causal",
            (False, False) if mods.has_mask_mod else None)


def schedule_for(name: str, head_dim: int, causal: bool, seq: int) -> BwdSchedule:
    """The backward schedule a call of this kind picks on sm_90 (bf16, MHA, S = seq): the
    table's for plain attention, the default for a variant."""
    from tiledattention.schedules.backward import default_bwd_schedule

    if name != "none":
        return default_bwd_schedule(head_dim, causal)
    from tiledattention.schedules.policy import _choose_bwd, bucket_for

    return _choose_bwd(bucket_for(cc="9.0", dtype="torch.bfloat16", head_dim=head_dim,
                                  causal=causal, seq_q=seq, seq_kv=seq, gqa=1), False)[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("schedules", nargs="*",
                    help="backward schedule labels (none: the one a call picks, --variant)")
    ap.add_argument("--variant", default="none",
                    help="comma-separated built-in variants: " + ", ".join(VARIANTS))
    ap.add_argument("--seq", type=int, default=4096, help="the table's bucket (no labels)")
    ap.add_argument("--head-dim", default="128", help="comma-separated, e.g. 64,128,256")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--group-loop", choices=("shipped", "runtime", "none"), default="shipped",
                    help="dK/dV's loop over a GQA group: as an MHA plan ships it "
                         "(variant.ONE_HEAD_DIMS), the runtime loop (GQA), or none")
    ap.add_argument("--gpu-code", default="sm_90")
    ap.add_argument("--cuobjdump", default=sass_tool())
    ap.add_argument("--step", action="store_true",
                    help="also count one iteration of the query loop (per thread)")
    ap.add_argument("--loops", action="store_true",
                    help="with --step: every innermost MMA loop, not only the first")
    args = ap.parse_args(argv)
    if not args.cuobjdump:
        print(f"{SASS_MISSING}; or pass --cuobjdump PATH")
        return 2
    print("D  causal  variant  schedule  kernel  " + "  ".join(COUNTED) + "  WGWAIT  REG  STACK"
          + ("  | step: " + "  ".join(STEP) if args.step else ""))
    for d, name in ((int(x), n) for x in args.head_dim.split(",")
                    for n in args.variant.split(",")):
        if name not in VARIANTS:
            ap.error(f"--variant {name!r} is not one of {VARIANTS}")
        mods, aux, causal, block = variant_parts(name, args.causal)
        flags = None if name == "none" else Flags(
            args.dtype, d, causal, mods=mods.key, has_score_mod=mods.has_score_mod,
            has_mask_mod=mods.has_mask_mod, block_axes=block)
        labels = args.schedules or [schedule_for(name, d, args.causal, args.seq).label()]
        for label in labels:
            v = BwdVariant(args.dtype, d, causal, BwdSchedule.from_label(label),
                           even_n=True, one_head=ONE_HEAD[args.group_loop], flags=flags)
            cubins = export_bwd_cubins(v, args.gpu_code, mods=mods, aux=aux)
            for kname, cubin in cubins.items():
                variant = name
                if kname.endswith("delta") or ("_dq" in kname
                                               and v.schedule.dq == "atomic"):
                    continue
                c = sass_counts(cubin, args.cuobjdump)
                step = ""
                if args.step:
                    loops = loop_counts(disassemble(cubin, args.cuobjdump)[0])
                    step = "  | " + (" | ".join("  ".join(str(st[k]) for k in STEP)
                                                for st in loops[:None if args.loops else 1])
                                     or "no loop")
                print(f"{d}  {args.causal}  {variant}  {label}  "
                      f"{kname.removeprefix('attention_bwd_')}  "
                      + "  ".join(str(c[k]) for k in COUNTED)
                      + f"  {c['WGWAIT']}  {c['REG']}  {c['STACK']}"
                      + step, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
