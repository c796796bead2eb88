"""What the bad-input tests share (not a test module): the CLI run in-process, a tiny
bench config, a tiny study with or without rows, its bundle, rows and shards, and the
one-line refusal every bad input must end in."""

from __future__ import annotations

import contextlib
import io
import json
import signal
from pathlib import Path

import pytest

from tiledattention.cli import main

ROOT = Path(__file__).resolve().parent.parent
TINY = ("grid: {seqs: [32], head_dims: [32], dtypes: [float32], causal: [false], "
        "shape_policy: explicit, batch: 1, heads: 2}\nmethods: [eager]\n"
        "timing: {warmup: 0, reps: 1, rounds: 1}\ndevice: cpu\n")


def cli(*argv: str) -> tuple[int, str]:
    """Run the real ``main`` in-process; (exit code, stderr). An uncaught exception (what
    would be a traceback) fails the test with it."""
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    return code, err.getvalue()


def tiny_config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(TINY + extra)
    return path


def _tiny_study(tmp_path: Path) -> Path:
    pytest.importorskip("rocrate")
    from tiledattention.study.publication import manifest

    study = tmp_path / "study"
    (study / "aggregate").mkdir(parents=True)
    row = {"format": "tiledattention-bench-row/1", "point_key": "k", "method": "eager",
           "status": "unavailable", "reason": "x", "config_hash": "h"}
    (study / "aggregate" / "rows.jsonl").write_text(json.dumps(row) + "\n")
    _tables(study)
    run = {"tiledattention": "0.1.0", "torch": "2.11.0", "gpu": None, "config_hash": "c",
           "started": "2026-01-01T00:00:00+00:00", "finished": "2026-01-01T01:00:00+00:00"}
    (study / "manifest.json").write_text(json.dumps(manifest.merge({"a": run})))
    return study


def _tables(study: Path) -> None:
    """The aggregate's table files (bundle create refuses a study without them)."""
    from tiledattention.study.presentation.tables import NAMES

    (study / "aggregate" / "tables").mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        (study / "aggregate" / "tables" / f"{name}.md").write_text(f"# {name}\n")


def _create(study: Path, out: Path, repo: Path = ROOT, force: bool = False) -> dict:
    from tiledattention.study.publication import create
    from tiledattention.study.publication.metadata import Publication

    return create.create(str(study), str(out), config={"results_dir": "x"},
                         config_name="c.yaml", repo_root=str(repo), publication=Publication(),
                         force=force)


DEEP = "[" * 100_000 + "]" * 100_000  # nests past Python's recursion limit


@contextlib.contextmanager
def within(seconds: int):
    """Fail (instead of hanging the suite) when the block blocks longer than ``seconds``."""
    def hung(signum, frame):
        raise AssertionError(f"blocked for more than {seconds}s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def one_line(code_err, code: int = 2) -> str:
    code_, err = code_err
    assert code_ == code and len(err.strip().splitlines()) == 1, (code_, err)
    assert "Traceback" not in err
    return err


def _row(key: str, method: str = "eager", **extra) -> dict:
    point = {"dtype": "float32", "causal": False, "head_dim": 32, "seq_q": 32, "seq_kv": 32,
             "batch": 1, "heads": 2, "gqa": 1}
    return {"format": "tiledattention-bench-row/1", "point_key": key, "method": method,
            "status": "ok", "config_hash": "h", "tflops": 1.0,
            "time_ms": {"median_ms": 2.0}, **point, **extra}


def _shard(d: Path, rows: list[dict], name: str = "rows-shard0of1.jsonl") -> Path:
    d.mkdir(exist_ok=True)
    (d / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def _study_with_rows(tmp_path: Path, n: int = 8) -> Path:
    from tiledattention.study.publication import manifest

    study = _tiny_study(tmp_path)
    run = {"config_hash": "c", "measure_hash": "h", "started": "2026-01-01T00:00:00+00:00"}
    (study / "manifest.json").write_text(json.dumps(manifest.merge(
        {"a": run}, config={"results_dir": "x"})))
    rows = [_row(f"p{i}", tflops=1.0 + i) for i in range(n)]
    (study / "aggregate" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n"
                                                            for r in rows))
    from tiledattention.study.presentation.frame import write_rows_table

    write_rows_table(rows, str(study / "aggregate"))
    return study


def _make(study: Path, out: Path, compact: bool) -> Path:
    from tiledattention.study.publication import create
    from tiledattention.study.publication.metadata import Publication

    return Path(create.create(str(study), str(out), config={"results_dir": "x"},
                              config_name="c.yaml", repo_root=str(ROOT),
                              publication=Publication(), compact=compact)["dir"])


def _resum(out: Path, rel: str) -> None:
    """SHA256SUMS rewritten for ``rel`` (added when new): a tamperer's checksums."""
    import hashlib

    digest = hashlib.sha256((out / rel).read_bytes()).hexdigest()
    lines = [ln for ln in (out / "SHA256SUMS").read_text().splitlines()
             if not ln.endswith(f"  {rel}")]
    (out / "SHA256SUMS").write_text("\n".join(lines + [f"{digest}  {rel}"]) + "\n")


def _gz(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data, mtime=0)


def _rows_file(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _pair(key: str, ours: float = 1.0, theirs: float = 2.0) -> list[dict]:
    return [_row(key, "tiledattention", time_ms={"median_ms": ours}),
            _row(key, "torch_sdpa", time_ms={"median_ms": theirs})]
