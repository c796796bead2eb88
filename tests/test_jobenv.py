"""A signal or exception that belongs to the job environment (submitit's time-limit error,
an interrupt, SystemExit, the harness's own stop on SIGTERM) is never stored as a
measurement row: it escapes the harness's per-method error handling, and SIGTERM stops
the point being measured at once."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
from submitit.core.utils import UncompletedJobError

from tiledattention.bench import methods as M
from tiledattention.bench import runner
from tiledattention.bench.config import from_dict
from tiledattention.bench.grid import Point
from tiledattention.bench.store import read_rows
from tiledattention.launchers import jobenv

CPU = torch.device("cpu")
POINT = Point("float32", False, 32, 48, 40, 1, 4, 2)
JOB_ENVIRONMENT = [
    UncompletedJobError("Job not requeued because: timed-out too many times."),
    KeyboardInterrupt(), SystemExit(-1), jobenv.JobStopped("SIGTERM")]


def _cfg(methods, reps=4):
    return from_dict({"methods": list(methods), "timing": {"warmup": 1, "reps": reps,
                                                           "rounds": 2}, "device": "cpu"})


def _raising(monkeypatch, exc, when: str):
    """A method that raises ``exc`` on its first call (``when="check"``) or once timing
    starts (``when="timing"``: its first correctness call passes)."""
    calls = []

    def run(q, k, v, p):
        calls.append(1)
        if when == "check" or len(calls) > 1:
            raise exc
        return M.eager_attention(q, k, v, p)

    monkeypatch.setitem(M.METHODS, "fake_env", M.Method("fake_env", "", False, run))


@pytest.mark.parametrize("when", ["check", "timing"])
@pytest.mark.parametrize("exc", JOB_ENVIRONMENT, ids=lambda e: type(e).__name__)
def test_a_job_environment_exception_escapes_run_point_instead_of_becoming_a_row(
        monkeypatch, exc, when):
    _raising(monkeypatch, exc, when)
    with pytest.raises(type(exc)):
        runner.run_point(POINT, ["eager", "fake_env"], _cfg(["eager", "fake_env"]), CPU, None)


@pytest.mark.parametrize("when", ["check", "timing"])
def test_a_method_s_own_error_is_still_its_error_row(monkeypatch, when):
    _raising(monkeypatch, RuntimeError("kernel exploded"), when)
    rows = {r["method"]: r for r in runner.run_point(POINT, ["eager", "fake_env"],
                                                     _cfg(["eager", "fake_env"]), CPU, None)}
    assert rows["fake_env"]["status"] == "error"
    assert "kernel exploded" in rows["fake_env"]["reason"]
    assert rows["eager"]["status"] == "ok"


@pytest.mark.parametrize("exc", JOB_ENVIRONMENT, ids=lambda e: type(e).__name__)
def test_the_shared_classifier_model_and_tune_use_reraises_job_environment_exceptions(exc):
    with pytest.raises(type(exc)):
        runner.classify(exc)
    assert runner.classify(RuntimeError("x"))[0] == "error"


def test_a_time_limit_in_a_bench_run_stores_no_row_for_the_point_it_cut(tmp_path, monkeypatch):
    # submitit's USR2 handler raises UncompletedJobError in the middle of a method's timing
    # (the last allowed attempt): the run fails with it and the rows file has no error row.
    _raising(monkeypatch, UncompletedJobError("Job not requeued because: timed-out too many "
                                              "times."), "timing")
    c = _cfg(["eager", "fake_env"])
    with pytest.raises(UncompletedJobError):
        runner.run_bench(c, str(tmp_path))
    path = tmp_path / "rows-shard0of1.jsonl"
    assert not path.exists() or read_rows(str(path)) == []


def test_sigterm_while_a_point_is_measured_stops_it_at_once(tmp_path, monkeypatch):
    # A cancelled job (scancel sends SIGTERM) stops measuring now, not after its point
    # (here ~40 s of reps): nothing of the cut point is stored, the run says it stopped.
    # Order, not seconds (a 10 s budget failed on a loaded 2-core box): no call of the
    # method starts after the signal, but the one the timer thread may race into.
    sent, after = [], []

    def slow(q, k, v, p):
        if sent:
            after.append(1)  # a call that started once the signal was sent
            if len(after) > 1:
                raise RuntimeError("still measuring")  # ends the old behaviour's point soon
        time.sleep(0.1)
        return M.eager_attention(q, k, v, p)

    def term():
        sent.append(1)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setitem(M.METHODS, "fake_slow", M.Method("fake_slow", "", False, slow))
    c = _cfg(["fake_slow"], reps=400)
    timer = threading.Timer(1.0, term)
    previous = signal.signal(signal.SIGTERM, lambda *a: None)  # as under submitit: bypassed
    try:
        timer.start()
        code = runner.run_bench(c, str(tmp_path))
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, previous)
    assert code == 130 and len(after) <= 1, len(after)
    assert read_rows(str(tmp_path / "rows-shard0of1.jsonl")) == []


def test_the_sigterm_of_a_requeue_lets_submitit_end_the_attempt_itself(tmp_path, monkeypatch):
    # submitit's USR2 handler calls the task's checkpoint, then `scontrol requeue`, whose
    # SIGTERM (SLURM cancels the step) arrives while the handler waits for scontrol; then
    # it logs "Requeued job" and exits. A JobStopped raised at that SIGTERM unwound the
    # handler instead: no requeue line, and the attempt ended in an error (the requeue test
    # on the CI cluster, 1 run in 4).
    from tiledattention.stages.bench import ShardTask

    monkeypatch.setattr(jobenv, "_requeueing", [False])
    requeued = []

    def usr2_handler(q, k, v, p):  # what submitit does, in the measuring thread
        ShardTask("c.yaml", str(tmp_path), 0, 1).checkpoint()
        os.kill(os.getpid(), signal.SIGTERM)  # SLURM, during `scontrol requeue`
        requeued.append("Requeued job")
        raise SystemExit(-1)  # submitit's _exit

    monkeypatch.setitem(M.METHODS, "fake_usr2", M.Method("fake_usr2", "", False, usr2_handler))
    previous = signal.signal(signal.SIGTERM, lambda *a: None)  # as under submitit: bypassed
    try:
        with pytest.raises(SystemExit):
            runner.run_bench(_cfg(["fake_usr2"]), str(tmp_path))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert requeued == ["Requeued job"]
    assert jobenv.requeueing()
    assert read_rows(str(tmp_path / "rows-shard0of1.jsonl")) == []  # nothing of the cut point


@pytest.mark.parametrize("exc", JOB_ENVIRONMENT, ids=lambda e: type(e).__name__)
def test_a_job_environment_exception_wrapped_by_the_code_it_hit_is_still_the_jobs(exc):
    # A signal landing inside a kernel compile comes back as CompileError("...") from it.
    from tiledattention.errors import CompileError

    try:
        try:
            raise exc
        except BaseException as inner:
            raise CompileError("compiling fwd failed") from inner
    except CompileError as wrapped:
        with pytest.raises(type(exc)):
            runner.classify(wrapped)
    assert runner.classify(CompileError("compiling fwd failed"))[0] == "error"
