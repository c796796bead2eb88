"""A partition whose nodes take no jobs (drained, down) while the request fits them: the
request is queued and waits. Every step of a workflow run asks sbatch --test-only, and each
used to say so (11 times in one run); the run says a waiting state once per change. The
steps are separate processes: what was said is kept only in the file the workflow names
(TILEDATTN_SLURM_SAID), for its run (TILEDATTN_WORKFLOW_PID)."""

from __future__ import annotations

import os

import pytest

from tiledattention.launchers import slurm, slurm_jobs

REFUSAL = "Requested node configuration is not available"
WAITS = "is queued and waits for a node"


def _node(state: str) -> slurm_jobs.Node:
    return slurm_jobs.Node("gpu", "n1", state, 2, 22220, 2, "1:00:00")


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A workflow run (this process stands for it) and its partition's one node."""
    monkeypatch.setenv(slurm.SAID_ENV, str(tmp_path / "logs" / "slurm-said"))
    monkeypatch.setenv("TILEDATTN_WORKFLOW_PID", str(os.getpid()))
    nodes = [_node("drained")]
    monkeypatch.setattr(slurm_jobs, "partition_nodes", lambda p: list(nodes))
    return nodes


def _steps(n: int, capsys) -> list[str]:
    """``n`` steps ask sbatch --test-only, refused by the nodes' state: the lines said."""
    o = slurm.check({"partition": "gpu", "cpus_per_job": 1, "mem_gb": 1, "time_min": 10})
    for _ in range(n):
        assert slurm.why_refused(o, REFUSAL) is None
    return [ln for ln in capsys.readouterr().err.splitlines() if WAITS in ln]


def test_a_drained_partition_is_said_once_per_change_in_a_run_not_once_per_step(run, capsys):
    said = _steps(11, capsys)  # the preflight and ten steps
    assert len(said) == 1 and "n1 drained" in said[0], said
    run[:] = [_node("down*")]  # a change: said once more
    said = _steps(3, capsys)
    assert len(said) == 1 and "n1 down*" in said[0], said
    slurm._say_changed(None)  # a step's sbatch --test-only passed: the node took jobs
    run[:] = [_node("drained")]  # drained again: a new wait, said again
    assert len(_steps(2, capsys)) == 1


def test_the_next_run_says_the_same_wait_again(run, capsys, monkeypatch):
    assert len(_steps(2, capsys)) == 1
    monkeypatch.setenv("TILEDATTN_WORKFLOW_PID", str(os.getppid()))  # another run
    assert len(_steps(2, capsys)) == 1


def test_outside_a_workflow_run_each_wait_is_said(run, capsys, monkeypatch):
    # A sweep started by hand is one process that asks once: nothing to deduplicate.
    monkeypatch.delenv(slurm.SAID_ENV)
    assert len(_steps(2, capsys)) == 2
