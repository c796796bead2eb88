"""Same kernels, same bytes: compile a representative set of kernels for sm_90 on the CPU
and record (``--save``) or compare (``--check``) the sha256 of each cubin and of its SASS.

A restructuring of the kernel sources that is meant to change nothing (flags by name, a
shared visit-range helper) must give identical machine code. The set: forward plain /
causal / masked / D = 64, 96, 128, 256, split-K and GQA-packed decode, a forward with a
score_mod, a mask_mod and a block mask, the three backward kernels plain, with dQ by TMA
reduce-add, D = 256 (``MASK_ALL``), a variant with captured-tensor gradients (G0..G3) and a
block-sparse variant, the combine and the block classification kernels, and the paged
forward (GQA decode and chunked prefill) at pages 16, 32, 64 and 256.

``cuobjdump`` (``--cuobjdump`` or on PATH) adds the SASS text's hash and its instruction
count per kernel, so that a cubin differing only in embedded metadata can be told apart
from different code.

    python benchmarks/kernel_identity.py --save benchmarks/results/kernel_identity.json
    python benchmarks/kernel_identity.py --check benchmarks/results/kernel_identity.json
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tiledattention.kernel.toolchain import cuobjdump_text, sass_tool  # noqa: E402


def cases():
    """(name, thunk returning {kernel name: cubin bytes})."""
    import cuda.tile as ct
    import torch

    from tiledattention import mods as M
    from tiledattention import variants
    from tiledattention.kernel.compile import (
        export_bwd_cubins,
        export_classify_cubin,
        export_combine_cubin,
        export_cubin,
        export_workload_cubins,
    )
    from tiledattention.kernel.variant import BwdVariant, Flags, Variant, mask_axes_for
    from tiledattention.kernel.workload_check import Workload
    from tiledattention.schedules.backward import BwdSchedule, default_bwd_schedule
    from tiledattention.schedules.schedule import Schedule, default_schedule

    def fwd(dtype, d, causal, mask="none", *, lse=False, even=True, split=False,
            packed=False, schedule=None, flags=None, mods=None, aux=()):
        v = Variant(dtype, d, causal, schedule or default_schedule(d, causal), even_n=even,
                    mask_dtype=None if mask == "none" else dtype, mask_axes=mask_axes_for(mask),
                    return_lse=lse, split_k=split, packed=packed, flags=flags)
        return lambda: {"attention_fwd": export_cubin(v, "sm_90", mods=mods, aux=aux).cubin}

    def bwd(dtype, d, causal, mask="none", *, even=True, dlse=False, schedule=None,
            flags=None, mods=None, aux=()):
        v = BwdVariant(dtype, d, causal, schedule or default_bwd_schedule(d, causal),
                       even_n=even, mask_dtype=None if mask == "none" else dtype,
                       mask_axes=mask_axes_for(mask), has_dlse=dlse, flags=flags)
        return lambda: export_bwd_cubins(v, "sm_90", mods=mods, aux=aux)

    def vflags(d, mods, sparse):
        return Flags("bfloat16", d, True, mods=mods.key, has_score_mod=mods.has_score_mod,
                     has_mask_mod=mods.has_mask_mod, block_axes=(True, False) if sparse else None)

    def paged(page, prefill=False):
        # GQA 32/8 D 128 causal: a paged decode (split-K, packed heads) or chunked prefill
        w = Workload(4, 32, 8, 128, torch.bfloat16, 512 if prefill else 1, 4096, True,
                     128 ** -0.5, (-1, -1), 0.0, page_size=page, packed_q=prefill)
        return lambda: {"attention_fwd_seqs": export_workload_cubins(
            w, "sm_90", paged=True)["attention_fwd_seqs"]}

    ids = torch.zeros(1, 64, dtype=torch.int32)
    both = M.mods_for(variants.softcap(50.0), variants.document(ids))
    both_aux = ((ct.int32, 2),)
    window = M.mods_for(None, variants.sliding_window(256))
    slopes = torch.rand(16, requires_grad=True)
    alibi = M.with_captured_grads(M.mods_for(variants.alibi(slopes), None), (True,))
    alibi_aux = ((ct.float32, 1, True),)
    out = [
        ("fwd_f16_d64_full", fwd("float16", 64, False)),
        ("fwd_bf16_d128_causal_tail", fwd("bfloat16", 128, True, even=False)),
        ("fwd_f16_d96_causal_keypad_lse", fwd("float16", 96, True, "key_padding", lse=True)),
        ("fwd_bf16_d256_full_mask_lse", fwd("bfloat16", 256, False, "full", lse=True)),
        ("fwd_f16_d128_splitk_packed", fwd("float16", 128, True, split=True, packed=True,
                                           lse=True, schedule=Schedule(64, 64, 2))),
        ("fwd_bf16_d128_variant_dense", fwd("bfloat16", 128, True, flags=vflags(128, both, False),
                                            mods=both, aux=both_aux)),
        ("fwd_bf16_d128_variant_sparse", fwd("bfloat16", 128, True, flags=vflags(128, both, True),
                                             mods=both, aux=both_aux)),
        ("fwd_f16_d128_variant_splitk", fwd(
            "float16", 128, False, split=True, lse=True, schedule=Schedule(64, 64, 2),
            flags=Flags("float16", 128, False, mods=window.key, has_mask_mod=True,
                        block_axes=(False, False)), mods=window)),
        ("bwd_f16_d64_full", bwd("float16", 64, False)),
        ("bwd_bf16_d128_causal_keypad_tail", bwd("bfloat16", 128, True, "key_padding",
                                                 even=False, dlse=True)),
        ("bwd_bf16_d128_causal_reduceadd", bwd(
            "bfloat16", 128, True,
            schedule=BwdSchedule.from_label("kv64x128_q128x64_o1_w8_atomic"))),
        ("bwd_f16_d256_causal_maskall", bwd("float16", 256, True, even=False)),
        ("bwd_bf16_d64_variant_capgrad", bwd("bfloat16", 64, True,
                                             flags=vflags(64, alibi, False), mods=alibi,
                                             aux=alibi_aux)),
        ("bwd_bf16_d128_variant_sparse", bwd("bfloat16", 128, True,
                                             flags=vflags(128, both, True), mods=both,
                                             aux=both_aux)),
        ("combine_bf16_d128", lambda: {"attention_combine": export_combine_cubin(
            "bfloat16", 128, True, "sm_90")}),
        ("classify_window", lambda: {"classify_tiles": export_classify_cubin(
            window, "sm_90", causal=True)}),
    ]
    out += [(f"paged_{kind}_page{page}", paged(page, kind == "prefill"))
            for kind in ("decode", "prefill") for page in (16, 32, 64, 256)]
    return out


def elf_sections(cubin: bytes) -> dict[str, bytes]:
    """The cubin's ELF64 sections by name."""
    import struct

    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize)
             for i in range(shnum)]
    names = heads[shstrndx]
    out = {}
    for h in heads:
        raw = cubin[names[4] + h[0]:cubin.index(b"\0", names[4] + h[0])].decode()
        out[raw] = b"" if h[1] == 8 else cubin[h[4]:h[4] + h[5]]  # SHT_NOBITS: no bytes
    return out


def differing_sections(a: bytes, b: bytes) -> list[str]:
    sa, sb = elf_sections(a), elf_sections(b)
    return sorted(n for n in set(sa) | set(sb) if sa.get(n) != sb.get(n))


def sass_digest(cubin: bytes, cuobjdump: str | None, dump: Path | None = None,
                name: str = "") -> dict:
    if cuobjdump is None:
        return {}
    sass = cuobjdump_text(cubin, "-sass", cuobjdump)
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    # Only the instruction lines: the header names the temporary file.
    code = "\n".join(ln for ln in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", ln))
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
        (dump / (name.replace("/", "--") + ".sass")).write_text(code + "\n")
    return {"sass_sha256": hashlib.sha256(code.encode()).hexdigest(), "instructions": len(ops)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--save", type=Path, help="write the digests to this JSON file")
    mode.add_argument("--check", type=Path, help="compare with the digests in this file")
    ap.add_argument("--cuobjdump", default=sass_tool())
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--dump", type=Path, help="also write each kernel's SASS into this folder")
    args = ap.parse_args(argv)
    only = set(filter(None, args.only.split(",")))
    found: dict[str, dict] = {}
    for name, build in cases():
        if only and name not in only:
            continue
        start = time.perf_counter()
        for kernel, cubin in build().items():
            # Sections other than the line tables (which name source files and lines).
            code = b"".join(n.encode() + v for n, v in sorted(elf_sections(cubin).items())
                            if "line" not in n and "debug" not in n)
            found[f"{name}/{kernel}"] = {"cubin_sha256": hashlib.sha256(cubin).hexdigest(),
                                         "nodebug_sha256": hashlib.sha256(code).hexdigest(),
                                         **sass_digest(cubin, args.cuobjdump, args.dump,
                                                       f"{name}/{kernel}")}
        print(f"{name}: {time.perf_counter() - start:.1f} s", flush=True)
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        print(f"saved {len(found)} kernels to {args.save}")
        return 0
    raw = args.check.read_bytes()  # a saved file, gzipped when archived (.json.gz)
    saved = json.loads(gzip.decompress(raw) if args.check.suffix == ".gz" else raw)
    bad = 0
    for key, now in sorted(found.items()):
        then = saved.get(key)
        if then is None:
            print(f"NEW       {key}")
            bad += 1
        elif then == now:
            print(f"same      {key}")
        else:
            same_sass = then.get("sass_sha256") == now.get("sass_sha256")
            rest = then.get("nodebug_sha256")
            rest = "?" if rest is None else "same" if rest == now["nodebug_sha256"] else "differ"
            print(f"{'META' if same_sass else 'DIFFERENT'} {key}: cubin differs, SASS "
                  f"{'same' if same_sass else 'differs'} (instructions "
                  f"{then.get('instructions')} -> {now.get('instructions')}); sections "
                  f"other than debug/line tables {rest}")
            bad += 1
    print(f"{len(found) - bad}/{len(found)} kernels identical")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
