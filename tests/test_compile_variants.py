"""The variant kernels compile with tileiras, no GPU needed: every built-in variant's forward
(dense and block-sparse), backward and block classification for Hopper, and a slice for
Blackwell (sm_100, sm_120), each into a fresh cuTile cache (tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("cuda.tile", reason="cuTile not installed: pip install 'cuda-tile[tileiras]'")

import cuda.tile as ct  # noqa: E402

from tiledattention import mods as M  # noqa: E402
from tiledattention import variants  # noqa: E402
from tiledattention.kernel.compile import (  # noqa: E402
    export_bwd_cubins,
    export_classify_cubin,
    export_cubin,
)
from tiledattention.kernel.toolchain import tileiras_path  # noqa: E402
from tiledattention.kernel.variant import BwdVariant, Flags, Variant  # noqa: E402
from tiledattention.schedules.backward import default_bwd_schedule  # noqa: E402
from tiledattention.schedules.schedule import Schedule, default_schedule  # noqa: E402

if tileiras_path() is None:
    pytest.skip("tileiras not found: pip install 'cuda-tile[tileiras]'", allow_module_level=True)

_IDS = torch.zeros(1, 64, dtype=torch.int32)
VARIANTS = {
    "softcap": (variants.softcap(30.0), None),
    "alibi": (variants.alibi(torch.rand(16)), None),
    "window": (None, variants.sliding_window(1024)),
    "document": (None, variants.document(_IDS)),
    "prefix_lm": (None, variants.prefix_lm(torch.zeros(2, dtype=torch.int32))),
    "softcap+document": (variants.softcap(50.0), variants.document(_IDS)),
}
CASES = [(name, "sm_90", d) for name in VARIANTS for d in (64, 128)] + [
    ("softcap+document", "sm_100", 128), ("window", "sm_120", 96), ("alibi", "sm_120", 256)]


def _aux(mods):
    dt = {torch.float32: ct.float32, torch.int32: ct.int32}
    return tuple((dt[t.dtype], t.dim()) for t in mods.tensors())


@pytest.mark.compile
@pytest.mark.parametrize("name,target,d", CASES, ids=lambda x: str(x))
def test_variant_kernels_compile_forward_backward_and_classification(name, target, d):
    mods = M.mods_for(*VARIANTS[name])
    aux = _aux(mods)
    for sparse in (False, True) if mods.has_mask_mod else (False,):
        flags = Flags("bfloat16", d, True, mods=mods.key, has_score_mod=mods.has_score_mod,
                      has_mask_mod=mods.has_mask_mod,
                      block_axes=(True, False) if sparse else None)
        fwd = export_cubin(Variant("bfloat16", d, True, default_schedule(d, True), flags=flags),
                           target, mods=mods, aux=aux)
        assert fwd.cubin[:4] == b"\x7fELF" and b"attention_fwd" in fwd.cubin
        bwd = export_bwd_cubins(BwdVariant("bfloat16", d, True, default_bwd_schedule(d, True),
                                           flags=flags), target, mods=mods, aux=aux)
        assert all(c[:4] == b"\x7fELF" for c in bwd.values())
    if mods.has_mask_mod:
        mask_only = M.mods_for(None, VARIANTS[name][1])
        cubin = export_classify_cubin(mask_only, target, aux=_aux(mask_only))
        assert cubin[:4] == b"\x7fELF" and b"classify_tiles" in cubin


@pytest.mark.compile
def test_a_split_k_decode_variant_compiles():
    mods = M.mods_for(None, variants.sliding_window(256))
    flags = Flags("float16", 128, False, mods=mods.key, has_mask_mod=True, block_axes=(False,
                                                                                       False))
    v = Variant("float16", 128, False, Schedule(64, 64, 2), split_k=True, return_lse=True,
                flags=flags)
    assert export_cubin(v, "sm_90", mods=mods).cubin[:4] == b"\x7fELF"
