"""Every kernel variant compiles with tileiras for Hopper and Blackwell, no GPU needed.

dtype x causal x mask kind (none, key padding [B,1,1,Skv], full [B,H,Sq,Skv]) x head dim
{64, 96, 128, 160, 256}, each for sm_90, sm_100 and sm_120, into a fresh cuTile cache
(tests/conftest.py), so every cubin here comes from a real compile.
"""

from __future__ import annotations

import struct

import pytest

pytest.importorskip("cuda.tile", reason="cuTile not installed: pip install 'cuda-tile[tileiras]'")

from tiledattention.kernel.compile import export_cubin  # noqa: E402
from tiledattention.kernel.toolchain import (  # noqa: E402
    SASS_MISSING,
    cuobjdump_text,
    sass_tool,
    tileiras_path,
)
from tiledattention.kernel.variant import decode_variant_matrix, variant_matrix  # noqa: E402

if tileiras_path() is None:
    pytest.skip("tileiras not found: pip install 'cuda-tile[tileiras]'", allow_module_level=True)

TARGETS = ("sm_90", "sm_100", "sm_120")
EM_CUDA = 190


def test_variant_constants_are_named_as_the_kernels_constant_parameters():
    from tiledattention.kernel.spec import FWD

    assert len(FWD.constants()) > 10
    for variant in variant_matrix()[:3]:
        assert set(variant.constants()) == FWD.constants()


def test_kernel_arguments_are_placed_by_name_in_declaration_order():
    from tiledattention.kernel.spec import FWD

    names = FWD.names()
    values = {n: i for i, n in enumerate(names)}
    assert FWD.ordered(dict(reversed(values.items()))) == tuple(range(len(names)))
    tail = {n: i for n, i in values.items() if n not in FWD.tensors}
    assert FWD.ordered(tail, skip_tensors=True) == tuple(range(len(FWD.tensors), len(names)))
    with pytest.raises(TypeError, match="missing"):
        FWD.ordered({n: 0 for n in names[1:]})
    with pytest.raises(TypeError, match="unknown"):
        FWD.ordered({**values, "NOT_A_PARAMETER": 1})


@pytest.mark.compile
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("variant", variant_matrix(), ids=lambda v: v.label())
def test_variant_compiles_to_a_cuda_cubin(variant, target):
    res = export_cubin(variant, target)
    assert res.cubin[:4] == b"\x7fELF", "not an ELF file"
    (machine,) = struct.unpack_from("<H", res.cubin, 18)
    assert machine == EM_CUDA, f"ELF machine {machine}, expected EM_CUDA ({EM_CUDA})"
    assert b"attention_fwd" in res.cubin


# Split-K and GQA packing: bf16/fp16 x causal x D in {64, 96, 128, 256} on Hopper, and a
# slice of five on Blackwell (CI's 2 cores), plus the combine kernel per chunk layout.
_DECODE = decode_variant_matrix()
_DECODE_CASES = [(v, "sm_90") for v in _DECODE] + [
    (v, t) for t in ("sm_100", "sm_120") for v in _DECODE[2::3]]


@pytest.mark.compile
@pytest.mark.parametrize("variant,target", _DECODE_CASES,
                         ids=lambda x: x.label() if hasattr(x, "label") else x)
def test_split_k_and_packed_variants_compile(variant, target):
    res = export_cubin(variant, target)
    assert res.cubin[:4] == b"\x7fELF" and b"attention_fwd" in res.cubin


@pytest.mark.compile
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype,d,lse", [("bfloat16", 128, False), ("float16", 96, True),
                                         ("bfloat16", 256, True)])
def test_split_k_combine_kernel_compiles(dtype, d, lse, target):
    from tiledattention.kernel.compile import export_combine_cubin

    cubin = export_combine_cubin(dtype, d, lse, target)
    assert cubin[:4] == b"\x7fELF" and b"attention_combine" in cubin


def _worker_warp_variants():
    from tiledattention.kernel.variant import Variant
    from tiledattention.schedules.schedule import Schedule

    # Two of the quick space's 8-worker-warp schedules, one with a mask and the LSE store:
    # a small slice, since every target compiles each (CI has 2 cores).
    return [Variant("float16", 128, False, Schedule(128, 128, 1, worker_warps=8), even_n=True),
            Variant("bfloat16", 160, True, Schedule(128, 64, 2, worker_warps=8),
                    mask_dtype="bfloat16", mask_axes=(True, False, False), return_lse=True)]


@pytest.mark.compile
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("variant", _worker_warp_variants(), ids=lambda v: v.label())
def test_worker_warp_schedules_compile_for_every_target(variant, target):
    res = export_cubin(variant, target)
    assert res.cubin[:4] == b"\x7fELF" and b"attention_fwd" in res.cubin


def _pdl_variants():
    from tiledattention.kernel.variant import Variant
    from tiledattention.schedules.schedule import Schedule

    # The short-call shapes PDL is for: causal prefill D=128 on the shipped 64x128 o2, and
    # a split-K decode with a key-padding mask and the LSE store (the wait precedes the
    # mask loads too).
    return [Variant("float16", 128, True, Schedule(64, 128, 2, pdl=True), even_n=True),
            Variant("bfloat16", 128, False, Schedule(64, 64, 2, pdl=True),
                    mask_dtype="bfloat16", mask_axes=(True, False, False), return_lse=True,
                    split_k=True)]


@pytest.mark.compile
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("variant", _pdl_variants(), ids=lambda v: v.label())
def test_pdl_variants_compile_for_every_target(variant, target):
    res = export_cubin(variant, target)
    assert res.cubin[:4] == b"\x7fELF" and b"attention_fwd" in res.cubin
    assert res.cubin != export_cubin(_without_pdl(variant), target).cubin


@pytest.mark.compile
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("variant", _pdl_variants(), ids=lambda v: v.label())
def test_a_pdl_kernel_waits_for_its_predecessor_once_and_a_plain_one_never(variant, target):
    """griddepcontrol.wait is ACQBULK in Hopper and Blackwell SASS."""
    if sass_tool() is None:
        pytest.skip(SASS_MISSING)

    def waits(v) -> int:
        return cuobjdump_text(export_cubin(v, target).cubin).count("ACQBULK")

    assert (waits(variant), waits(_without_pdl(variant))) == (1, 0)


def _without_pdl(variant):
    import dataclasses

    return dataclasses.replace(variant, schedule=dataclasses.replace(variant.schedule,
                                                                     pdl=False))


def _shipped_variants():
    from tiledattention.kernel.variant import Variant
    from tiledattention.schedules.policy import shipped_table_paths
    from tiledattention.schedules.table import ScheduleTable

    seen = {}
    for path in shipped_table_paths():
        for e in ScheduleTable.load(path).entries.values():
            b = e.bucket
            target = "sm_" + b.cc.replace(".", "")
            v = Variant(b.dtype, b.head_dim, b.causal, e.best, even_n=True)
            seen[(v, target)] = None
    return list(seen)


@pytest.mark.compile
@pytest.mark.parametrize("variant,target", _shipped_variants(),
                         ids=lambda x: x.label() if hasattr(x, "label") else x)
def test_every_shipped_table_schedule_compiles_for_its_target(variant, target):
    res = export_cubin(variant, target)
    assert res.cubin[:4] == b"\x7fELF"


def _code_sections(cubin: bytes) -> dict[str, bytes]:
    """The cubin's machine code and launch attributes (``.text.*``, ``.nv.info.*``: the
    SASS and REQNTID, the threads a CTA runs), without the debug sections that name the
    schedule's label."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    size, count, names_at = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * size) for i in range(count)]
    names = cubin[headers[names_at][4]:headers[names_at][4] + headers[names_at][5]]
    out = {}
    for name_at, _, _, _, offset, length, *_ in headers:
        name = names[name_at:names.index(b"\0", name_at)].decode()
        if name.startswith((".text.", ".nv.info.")):
            out[name] = cubin[offset:offset + length]
    return out


@pytest.mark.compile
def test_the_dense_gqa_decode_already_runs_the_paged_decodes_four_worker_warps():
    # benchmarks/notes/decode.md §51a: the table's dense decode pick (64 x 128, no
    # worker-warp hint) compiles to the code of an explicit 4 (workload.
    # PAGED_DECODE_WORKER_WARPS), so open lead 1b has nothing to switch; a cuTile whose
    # default changes fails here.
    from tiledattention.kernel.variant import Variant
    from tiledattention.schedules.schedule import Schedule

    def code(warps):
        s = Schedule(64, 128, occupancy=3, latency_k=2, latency_v=4, worker_warps=warps)
        return _code_sections(export_cubin(Variant("bfloat16", 128, False, s, even_n=True,
                                                   split_k=True, packed=True), "sm_90").cubin)

    default, four = code(None), code(4)
    assert any(n.startswith(".text.") for n in default) and default == four
    assert code(8) != four
