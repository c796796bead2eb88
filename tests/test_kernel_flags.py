"""Kernel flags travel by name: each score kernel's ``ct.Constant`` parameters are the
fields of its family's frozen dataclass (``kernel.flags``), and every entry point builds
that dataclass by keyword, each field from the parameter of the same name, so two flags
of one type cannot be swapped without a test failing."""

from __future__ import annotations

import ast
import dataclasses
import inspect

import pytest

pytest.importorskip("cuda.tile", reason="cuTile not installed: pip install 'cuda-tile[tileiras]'")

from tiledattention.kernel.flags import FAMILIES, SeqFlags  # noqa: E402
from tiledattention.kernel.spec import (  # noqa: E402
    DKDV_SEQS,
    DQ_SEQS,
    FWD_FP8,
    FWD_SEQS,
    score_specs,
)

# the packed/paged entry points' own: the sequences' fields and a family's "seqs"-scoped
# ones (the packed backward's WHOLE_LOADS)
SEQ_FIELDS = {f.name for f in dataclasses.fields(SeqFlags)} | {
    f.name for fam in FAMILIES.values() for f in dataclasses.fields(fam)
    if f.metadata.get("scope") == "seqs"}
FP8_FIELDS = {f.name for fam in FAMILIES.values() for f in dataclasses.fields(fam)
              if f.metadata.get("scope") == "fp8"}


def _family(spec):
    return next(cls for prefix, cls in FAMILIES.items() if spec.name.startswith(prefix))


@pytest.mark.parametrize("plain", (True, False), ids=("plain", "variant"))
def test_each_kernels_constants_are_its_familys_fields(plain):
    for spec in score_specs(plain):
        fields = dataclasses.fields(_family(spec))
        required = {f.name for f in fields if f.default is dataclasses.MISSING}
        names = {f.name for f in fields}
        constants = spec.constants()
        # plain kernels leave the variant fields at their defaults (off); the dense ones
        # leave the packed/paged sequences' fields off
        assert required <= constants | SEQ_FIELDS and constants <= names, spec.name
        if not plain:
            assert constants == names - SEQ_FIELDS - FP8_FIELDS, spec.name


def test_the_fp8_forward_takes_the_plain_forwards_flags_and_fp8():
    plain = score_specs(True)[0]
    assert {"FP8"} == FP8_FIELDS
    assert FWD_FP8.constants() == plain.constants() | {"FP8"}
    assert "FP8" not in plain.constants()


def test_the_packed_and_paged_kernels_constants_are_their_familys_fields():
    # each takes the sequences' fields it reads; every constant is a field of its family
    for spec in (FWD_SEQS, DKDV_SEQS, DQ_SEQS):
        names = {f.name for f in dataclasses.fields(_family(spec))}
        assert spec.constants() <= names, spec.name
        assert {"CAUSAL", "WINDOW", "SEQUSED"} <= spec.constants(), spec.name


def test_entry_points_build_their_flags_by_keyword_from_same_named_parameters():
    # the entry points are written out from the flag dataclasses (``kernel.entry``): read
    # the source cuTile compiles
    built = 0
    for spec in (*score_specs(True), *score_specs(False), FWD_SEQS, DKDV_SEQS, DQ_SEQS,
                 FWD_FP8):
        fn = ast.parse(inspect.getsource(spec.pyfunc())).body[0]
        params = {a.arg for a in fn.args.args}
        for call in ast.walk(fn):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                    and call.func.id in {c.__name__ for c in FAMILIES.values()}):
                continue
            built += 1
            assert not call.args, f"{fn.name}: {call.func.id} built by position"
            for kw in call.keywords:
                if isinstance(kw.value, ast.Constant):
                    continue  # a field this entry point fixes (by name all the same)
                assert isinstance(kw.value, ast.Name) and kw.value.id == kw.arg, (
                    f"{fn.name}: {call.func.id}({kw.arg}=...) is not its own parameter")
                assert kw.arg in params, f"{fn.name}: {kw.arg} is not a parameter"
    assert built == 10  # forward, dK/dV, dQ: plain, variant, packed/paged; the FP8 forward


def test_entry_points_take_their_scopes_flags_in_declaration_order():
    from tiledattention.kernel import flags as F
    from tiledattention.kernel.entry import entry_fields

    for spec, scopes in ((FWD_SEQS, F.FWD_SEQS), (DKDV_SEQS, F.BWD_SEQS), (DQ_SEQS, F.BWD_SEQS),
                         (FWD_FP8, F.FWD_FP8),
                         *((s, F.PLAIN) for s in score_specs(True)),
                         *((s, F.VARIANT) for s in score_specs(False))):
        taken = [n for n in entry_fields(_family(spec), scopes)
                 if spec is FWD_SEQS or n not in ("VARLEN_Q", "VARLEN_K")]
        assert [n for n in spec.names() if n in spec.constants()] == taken, spec.name
