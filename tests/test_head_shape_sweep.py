"""benchmarks/head_shapes.py --sweep (issue 48): the candidate schedules it times per head
shape are ones the search spaces' rejection rules accept (nothing that cannot compile is
tried), the compile shards split its kernels, and a bad --shapes is one line, exit 2.
CPU only: the timed sweep needs a GPU (benchmarks/gpu_batch.sh sweep-shapes)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
from pathlib import Path

import pytest

from tiledattention.schedules.backward import bwd_rejection
from tiledattention.schedules.policy import _choose, _choose_bwd
from tiledattention.schedules.schedule import Schedule
from tiledattention.schedules.space import rejection
from tiledattention.schedules.table import Bucket

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("head_shapes_bench",
                                                  ROOT / "benchmarks/head_shapes.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


HS = _script()


@pytest.mark.parametrize("shape", HS.SHAPES, ids=lambda s: f"{s[0]}-{s[1]}")
def test_each_shapes_forward_candidates_are_schedules_the_space_accepts(shape):
    dqk, dv = shape[:2]
    got = HS.sweep_fwd_schedules(dqk, dv)
    assert got and len(set(got)) == len(got) <= HS.MAX_CANDIDATES
    # The head dim sdpa checks an explicit schedule at: the wider of D_qk and D_v.
    assert [s.label() for s in got if rejection(s, max(dqk, dv))] == []


@pytest.mark.parametrize("shape", [s for s in HS.SHAPES if s[3]], ids=lambda s: f"{s[0]}-{s[1]}")
def test_each_trained_shapes_backward_candidates_are_schedules_the_space_accepts(shape):
    dqk, dv = shape[:2]
    got = HS.sweep_bwd_schedules(dqk, dv)
    assert got and len(set(got)) == len(got) <= HS.MAX_CANDIDATES
    assert [s.label() for s in got if bwd_rejection(s, max(dqk, dv))] == []


def test_d512_times_the_eight_warp_tiles_that_fit_shared_memory_and_no_others():
    labels = {s.label() for s in HS.sweep_fwd_schedules(512, 512)}
    assert labels == {"64x64_o1_c1_lk2_lv4_w8", "64x64_o1_c1_lk3_lv3_w8",
                      "64x32_o1_c1_lk2_lv4_w8", "64x32_o1_c1_lk3_lv3_w8"}
    # 128 query rows: 288 KiB of fp32 state, past the register file (the offline SASS had
    # a 1 KB stack, head-shapes.md §40d); 128 keys: Q, K and V's tiles past 227 KiB.
    assert "register share" in rejection(Schedule(128, 64, 1, worker_warps=8), 512)
    assert "shared memory" in rejection(Schedule(64, 128, 1, worker_warps=8), 512)


@pytest.mark.parametrize("causal", [False, True])
def test_the_192_128_sweep_includes_the_schedules_the_policy_runs_today(causal):
    # The table's D 192 bucket (forward: the nearest, D 160's; backward: exact) on sm_90.
    bucket = Bucket("9.0", "bfloat16", 192, causal, 4096, 1)
    assert _choose(bucket)[0] in HS.sweep_fwd_schedules(192, 128)
    assert _choose_bwd(bucket, True)[0] in HS.sweep_bwd_schedules(192, 128)


def test_compile_shards_run_every_kernel_of_the_sweep_once():
    shapes = HS.parse_shapes(["192,128", "512,512"])
    tasks = HS.sweep_tasks(shapes, HS.SWEEPS["both"])
    # per causal flag: ta + 23 forward candidates at (192, 128), ta + 5 backward, ta + 4
    # forward at D 512 (forward only: no fwd+bwd task).
    assert len(tasks) == 2 * (24 + 6 + 5)
    shards = [tasks[i::14] for i in range(14)]
    assert sorted(map(repr, sum(shards, []))) == sorted(map(repr, tasks))
    assert not [t for t in tasks if t[0][0] == 512 and t[2] == "fwd+bwd"]


def _cli(*argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = HS.main(list(argv))
    return code, err.getvalue()


@pytest.mark.parametrize("argv,words", [
    (["--shapes", "192x128"], "--shapes 192x128: not among the known D_qk,D_v pairs"),
    (["--sweep", "fwd", "--shapes", "192,128", "100,100"], "--shapes 100,100: not among"),
    (["--sweep", "fwd", "--shapes", "192,128,64"], "--shapes 192,128,64: not among"),
    (["--sweep", "both", "--compile-only", "--shard", "3/2"], "--shard 3/2: I must be"),
    (["--sweep", "both", "--compile-only", "--shard", "a"], "--shard a: not I/N"),
    (["--compile-only"], "--compile-only compiles a sweep's kernels: give --sweep"),
])
def test_a_bad_argument_is_one_line_and_exit_2_before_any_gpu_work(argv, words):
    code, err = _cli(*argv)
    assert code == 2 and len(err.strip().splitlines()) == 1, (code, err)
    assert words in err and "Traceback" not in err
