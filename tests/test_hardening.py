"""The study side under careless and hostile input (issue 15, "Harden"): nothing the user
wrote is lost, nothing untracked is published, nothing unlisted is installed, rows of two
configs are never mixed, an untrusted bundle cannot reach outside itself, and every bad
input ends in one line naming it, exit 2."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from speed import scaled  # tests/speed.py

from tiledattention.bench.config import ConfigError, from_dict, load_config
from tiledattention.bench.runner import run_bench
from tiledattention.bench.store import read_rows
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


# -- YAML ---------------------------------------------------------------------------------

# 9**9 strings once expanded; an error message that prints the value never ends (grid is
# validated before methods, so the alias is reached first).
BOMB = "methods:\n  - &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"  - &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, c in zip("abcdefgh", "bcdefghi")) + "grid: {seqs: [*i]}\n"


def test_a_yaml_alias_bomb_is_refused_at_once_without_echoing_it(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    budget = scaled(2)  # expanded, the bomb never ends; refused, it takes milliseconds
    start = time.monotonic()
    with pytest.raises(ConfigError, match="line 3: YAML aliases") as info:
        load_config(str(path))
    assert time.monotonic() - start < budget and len(str(info.value)) < 200
    code, err = cli("bench", "--config", str(path), "--out", str(tmp_path / "o"))
    assert code == 2 and "aliases" in err and len(err.splitlines()) == 1


def test_duplicate_yaml_keys_are_refused_naming_the_key(tmp_path):
    path = tiny_config(tmp_path, "seed: 1\nseed: 2\n")
    with pytest.raises(ConfigError, match="key 'seed' is given more than once"):
        load_config(str(path))


def test_an_empty_or_non_mapping_bench_config_is_refused(tmp_path):
    for text, got in (("", "an empty file"), ("- 1\n", "a list")):
        (tmp_path / "c.yaml").write_text(text)
        with pytest.raises(ConfigError, match=f"expected a mapping.*got {got}"):
            load_config(str(tmp_path / "c.yaml"))


@pytest.mark.parametrize("value", [float("nan"), -1.0, float("inf"), 0.0])
def test_non_finite_negative_or_zero_tolerances_are_refused(value):
    with pytest.raises(ConfigError, match=r"rtol_float16: \S+ must be"):
        from_dict({"correctness": {"rtol_float16": value}})


# -- bundle create: --out -----------------------------------------------------------------

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


def test_bundle_create_never_deletes_a_users_directory_or_the_study(tmp_path):
    from tiledattention.study.presentation.frame import StudyError

    study = _tiny_study(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    with pytest.raises(StudyError, match="not empty and not a bundle.*--force"):
        _create(study, mine)
    with pytest.raises(StudyError, match="--force replaces only a bundle of ours"):
        _create(study, mine, force=True)
    assert (mine / "thesis.tex").read_text() == "years of work"
    before = sorted(p.name for p in study.rglob("*"))
    for out in (study, tmp_path):  # the study itself, and a directory holding it
        with pytest.raises(StudyError, match="is or contains the study directory"):
            _create(study, out, force=True)
    assert sorted(p.name for p in study.rglob("*")) == before
    code, err = cli("bundle", "create", "--study", str(study), "--config",
                    str(tiny_config(tmp_path)), "--out", str(mine))
    assert code == 2 and err.count("\n") == 1 and (mine / "thesis.tex").exists()


def test_bundle_create_replaces_its_own_previous_bundle_and_forced_dirs_only(tmp_path):
    from tiledattention.study.presentation.frame import StudyError
    from tiledattention.study.publication import verify

    study = _tiny_study(tmp_path)
    out = tmp_path / "bundle"
    _create(study, out)
    (out / "SHA256SUMS").unlink()  # as Snakemake does before re-running the rule
    assert verify.verify(str(_create(study, out)["zip"])) == []
    (out / "notes.txt").write_text("mine")  # a user's file in it: no longer ours alone
    with pytest.raises(StudyError, match="not empty and not a bundle"):
        _create(study, out)
    _create(study, out, force=True)
    assert not (out / "notes.txt").exists() and verify.verify(str(out)) == []


def test_the_workflow_snapshot_holds_only_tracked_files(tmp_path):
    from tiledattention.study.publication import create

    repo = tmp_path / "repo"
    (repo / "config").mkdir(parents=True)
    (repo / "Snakefile").write_text("include: 'x'\n")
    (repo / "config" / "config.yaml").write_text("a: 1\n")
    (repo / ".gitignore").write_text("config/.env\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "Snakefile", "config/config.yaml", ".gitignore"], check=True)
    (repo / "config" / ".env").write_text("TOKEN=hunter2\n")  # ignored
    (repo / "config" / "scratch.yaml").write_text("b: 2\n")  # untracked
    files, how = create.snapshot_files(str(repo))
    assert files == ["Snakefile", "config/config.yaml"] and "git tracks" in how
    subprocess.run(["rm", "-rf", str(repo / ".git")], check=True)
    files, how = create.snapshot_files(str(repo))  # no git: the allow-list, no dotfiles
    assert ".env" not in " ".join(files) and "config/config.yaml" in files
    out = _create(_tiny_study(tmp_path), tmp_path / "b", repo=repo)
    with zipfile.ZipFile(Path(out["dir"]) / "workflow-snapshot.zip") as z:
        assert b"hunter2" not in b"".join(z.read(n) for n in z.namelist())
    assert "are never included" in (Path(out["dir"]) / "README.md").read_text()


# -- bundle verify on untrusted input --------------------------------------------------------

def _sums(path: Path, entries: dict[str, bytes]) -> None:
    (path / "SHA256SUMS").write_text("".join(
        f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in entries.items()))


@pytest.mark.parametrize("listed", ["/etc/passwd", "../outside", "/dev/zero", "a/../../x"])
def test_verify_never_reads_a_path_outside_the_bundle(tmp_path, listed):
    from tiledattention.study.publication import verify

    b = tmp_path / "b"
    b.mkdir()
    (tmp_path / "outside").write_text("secret")
    _sums(b, {listed: b"whatever"})
    problems = verify.verify(str(b))
    assert any("is not a path inside the bundle" in p for p in problems), problems


def test_verify_refuses_links_and_special_files_in_a_directory(tmp_path):
    from tiledattention.study.publication import verify

    b = tmp_path / "b"
    b.mkdir()
    os.symlink("/etc/passwd", b / "passwd")
    os.mkfifo(b / "fifo")
    _sums(b, {})
    problems = verify.verify(str(b))
    assert "link: passwd (links are not allowed in a bundle)" in problems
    assert "special file: fifo (only regular files allowed)" in problems


def test_verify_refuses_zip_bombs_links_and_unsafe_names_without_extracting(tmp_path,
                                                                            monkeypatch):
    from tiledattention.study.publication import archive, verify

    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("b/big", b"\0" * (8 << 20))  # 8 MiB of zeros: ratio ~1000
        link = zipfile.ZipInfo("b/link")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        z.writestr(link, "/etc/passwd")
        z.writestr("b/../../evil", b"x")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    problems = verify.verify(str(bomb))
    assert any("compression ratio of b/big" in p for p in problems), problems
    assert any(p.startswith("link: b/link") for p in problems)
    assert any("unsafe zip member name: 'b/../../evil'" in p for p in problems)
    assert not (tmp_path / "evil").exists() and os.listdir(tmp_path / "tmp") == []
    monkeypatch.setattr(archive, "MAX_TOTAL_BYTES", 1 << 20)
    assert f"bytes uncompressed, more than the {1 << 20} allowed" in verify.verify(str(bomb))[0]
    monkeypatch.setattr(archive, "MAX_MEMBERS", 2)
    assert "zip members, more than the 2 allowed" in verify.verify(str(bomb))[0]


def test_verify_removes_its_scratch_dir_when_terminated(tmp_path):
    study = _tiny_study(tmp_path)
    zip_path = _create(study, tmp_path / "bundle")["zip"]
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    # SIGTERM arrives while verify holds its scratch dir (in the metadata check).
    code = ("import os, signal, sys, time\n"
            "from tiledattention.study.publication import verify\n"
            "def stall(path):\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    time.sleep(30)\n"
            "verify.check_ro_crate = stall\n"
            f"verify.verify({zip_path!r})\n")
    env = {**os.environ, "TMPDIR": str(scratch), "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         timeout=120)
    assert run.returncode in (143, -signal.SIGTERM)
    assert os.listdir(scratch) == [], "the scratch dir outlived the process"


# -- rows: config hash, lock, torn and non-object lines ------------------------------------

def test_resume_under_a_changed_seed_is_refused_and_remeasure_sets_old_rows_aside(tmp_path):
    from tiledattention.bench.store import RowsError

    out = tmp_path / "out"
    assert run_bench(load_config(str(tiny_config(tmp_path))), str(out)) == 0
    changed = load_config(str(tiny_config(tmp_path, "seed: 7\n")))
    with pytest.raises(RowsError, match="measured under another config.*--remeasure"):
        run_bench(changed, str(out))
    assert run_bench(changed, str(out), remeasure=True) == 0
    rows = read_rows(str(out / "rows-shard0of1.jsonl"))
    assert [r["config_hash"] for r in rows] == [changed.measure_digest()]
    assert [r["seed"] for r in rows] == [7]
    assert len(list(out.glob("stale-rows-shard0of1-*.jsonl"))) == 1


def test_aggregate_refuses_rows_of_two_configs(tmp_path):
    rows = tmp_path / "rows"
    rows.mkdir()
    for i, h in enumerate(("aaa", "bbb")):
        (rows / f"rows-shard{i}of2.jsonl").write_text(json.dumps(
            {"point_key": f"p{i}", "method": "eager", "status": "ok", "config_hash": h}) + "\n")
    code, err = cli("aggregate", "--rows", str(rows), "--out", str(tmp_path / "a"),
                    "--rows-only")
    assert code == 2 and "2 different configs (aaa: 1 rows, bbb: 1 rows)" in err
    assert not (tmp_path / "a").exists()


def test_bundle_verify_flags_published_rows_of_two_configs(tmp_path):
    from tiledattention.study.publication import verify

    out = Path(_create(_tiny_study(tmp_path), tmp_path / "bundle")["dir"])
    data = out / "data" / "rows.jsonl"
    data.write_text(data.read_text() + json.dumps({"point_key": "q", "method": "eager",
                                                   "config_hash": "other"}) + "\n")
    lines = [ln for ln in (out / "SHA256SUMS").read_text().splitlines()
             if not ln.endswith("data/rows.jsonl")]
    lines.append(f"{hashlib.sha256(data.read_bytes()).hexdigest()}  data/rows.jsonl")
    (out / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    assert any("2 different configs" in p for p in verify.verify(str(out)))


def test_aggregate_counts_unreadable_lines_and_fails_on_zero_rows(tmp_path):
    rows = tmp_path / "rows"
    rows.mkdir()
    good = {"point_key": "p", "method": "eager", "status": "ok", "config_hash": "h"}
    (rows / "rows-shard0of1.jsonl").write_text('[1, 2]\n"text"\n{"point_key": "torn\n'
                                               + json.dumps(good) + "\n")
    code, err = cli("aggregate", "--rows", str(rows), "--out", str(tmp_path / "a"),
                    "--rows-only")
    assert code == 0 and "skipped 3 unreadable line(s)" in err
    (rows / "rows-shard0of1.jsonl").write_text("[1]\n")
    code, err = cli("aggregate", "--rows", str(rows), "--out", str(tmp_path / "b"),
                    "--rows-only")
    assert code == 2 and "no rows in" in err and "1 unreadable lines" in err


def test_bench_skips_a_valid_json_line_that_is_not_a_row(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "rows-shard0of1.jsonl").write_text("[1]\nnull\n")
    code, err = cli("bench", "--config", str(tiny_config(tmp_path)), "--out", str(out))
    assert code == 0 and "skipped 2 unreadable line(s)" in err
    assert [r["method"] for r in read_rows(str(out / "rows-shard0of1.jsonl"))] == ["eager"]


def test_a_second_bench_into_the_same_results_file_is_refused(tmp_path):
    from tiledattention.bench.store import Lock

    out = tmp_path / "out"
    out.mkdir()
    with Lock(str(out / "rows-shard0of1.jsonl")):
        code, err = cli("bench", "--config", str(tiny_config(tmp_path)), "--out", str(out))
    assert code == 2 and "another tiledattn bench is writing" in err
    assert not (out / "rows-shard0of1.jsonl").exists()


# -- offline pack --------------------------------------------------------------------------

def _wheel(dest: Path, name: str, version: str, body: str, build: str = "") -> str:
    tag = f"{name}-{version}" + (f"-{build}" if build else "") + "-py3-none-any.whl"
    di = f"{name}-{version}.dist-info"
    files = {f"{name}.py": body,
             f"{di}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{di}/WHEEL": "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\n"
                            "Tag: py3-none-any\n" + (f"Build: {build}\n" if build else "")}
    record = "".join(
        f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(c.encode()).digest()).rstrip(b'=').decode()},{len(c)}\n"  # noqa: E501
        for p, c in files.items()) + f"{di}/RECORD,,\n"
    with zipfile.ZipFile(dest / tag, "w") as z:
        for p, c in files.items():
            z.writestr(p, c)
        z.writestr(f"{di}/RECORD", record)
    return tag


def test_install_sh_installs_only_listed_wheels_checked_by_hash(tmp_path):
    from tiledattention.offline import write_installer

    house = tmp_path / "house"
    house.mkdir()
    good = _wheel(house, "demo", "1.0", "X = 'good'\n")
    write_installer(str(house), [good], ["demo==1.0"])
    assert "--require-hashes" in (house / "install.sh").read_text()
    _wheel(house, "demo", "1.0", "X = 'evil'\n", build="1")  # pip prefers a higher build tag
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "PIP_NO_INPUT": "1"}
    run = subprocess.run(["sh", str(house / "install.sh"), "-q", "--target",
                          str(tmp_path / "t")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "t" / "demo.py").read_text() == "X = 'good'\n"
    # A listed wheel swapped for another: pip's hash check refuses it.
    (house / good).unlink()
    _wheel(house, "demo", "1.0", "X = 'evil'\n")
    run = subprocess.run(["sh", str(house / "install.sh"), "--target", str(tmp_path / "u")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and not (tmp_path / "u" / "demo.py").exists()


def test_offline_pack_takes_only_a_torch_requirement(tmp_path):
    code, err = cli("offline", "pack", str(tmp_path / "w"), "--torch=--index-url=http://x")
    assert code == 2 and "expected a requirement on torch" in err
    assert not (tmp_path / "w").exists()


# -- the CLI: one line, exit 2, for every bad input -----------------------------------------

@pytest.fixture
def probe_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("ok.yaml").write_text(TINY)
    Path("bomb.yaml").write_text(BOMB)
    Path("dup.yaml").write_text(TINY + "device: cpu\n")
    Path("empty.yaml").write_text("")
    Path("list.yaml").write_text("- 1\n")
    Path("bin.dat").write_bytes(bytes(range(256)) * 8)
    Path("nan.yaml").write_text(TINY + "correctness: {rtol_bfloat16: .nan}\n")
    Path("huge.yaml").write_text(TINY + "seed: 999999999999999999999999999\n")
    Path("afile").write_text("x")
    Path("list.json").write_text("[1]\n")
    Path("rows").mkdir()
    Path("rows/rows-shard0of1.jsonl").write_text('[1]\n{"torn')
    return tmp_path


BAD = [
    "bench --config bomb.yaml", "bench --config dup.yaml", "bench --config empty.yaml",
    "bench --config list.yaml", "bench --config bin.dat", "bench --config nosuch.yaml",
    "bench --config rows", "bench --config nan.yaml", "bench --config huge.yaml",
    "bench --config ok.yaml --out afile", "bench --config ok.yaml --out afile/sub",
    "bench --config ok.yaml --out /sys/tiledattn-probe", "bench --config ok.yaml --shard 2/2",
    "bench --config ok.yaml --shard x", "bench --nosuchflag",
    "sweep --config ok.yaml --shards 2 --only 2", "sweep --config ok.yaml --only 0 0",
    "sweep --config ok.yaml --shards 0", "sweep --config ok.yaml --launcher nope",
    "sweep --config ok.yaml --launcher-options [1]",
    "sweep --config ok.yaml --launcher-options {bad", "sweep --config bomb.yaml",
    "aggregate --rows rows --out a", "aggregate --rows nosuch --out a",
    "aggregate --rows afile --out a", "aggregate --rows rows --out a --expect-shards 3",
    "figures --rows nosuch.jsonl --out f", "figures --rows bin.dat --out f",
    "figures --rows empty.yaml --out f",
    "manifest --runs nosuch --out m.json", "manifest --runs rows --config bomb.yaml --out m",
    "bundle create --study nosuch --config ok.yaml --out b",
    "bundle create --study rows --config bomb.yaml --out b",
    "bundle create --study rows --config empty.yaml --out b",
    "bundle verify nosuch", "bundle verify bin.dat", "bundle verify afile",
    "profile --shape bad --out p", "profile --shape float16:causal:128:4096 --out p --warmup -1",
    "profile --shape float16:causal:128:4096 --out p --tokens 0",
    "profile --shape float16:causal:128:4096 --out afile",
    "offline pack w --torch=--index-url=http://x", "offline pack w --python 3.x",
    "offline pack w --extras nope", "offline pack w --platform a/b",
    "tune --seqs 0", "tune --reps -5", "tune --compile-timeout nan",
    "tune --state afile/x/s.jsonl --out t.json", "check --json rows",
]


@pytest.mark.parametrize("command", BAD)
def test_every_bad_input_ends_in_one_line_and_exit_2(probe_dir, command):
    code, err = cli(*shlex.split(command))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, (code, err)
    verb = command.split(" --")[0].split(" ")[0]
    assert lines[0].startswith("tiledattn") and "Traceback" not in err, err
    assert verb in lines[0] or "unrecognized arguments" in lines[0]


def test_bad_input_through_the_installed_command_has_no_traceback(tmp_path):
    (tmp_path / "bomb.yaml").write_text(BOMB)
    run = subprocess.run([sys.executable, "-m", "tiledattention.cli", "bench", "--config",
                          str(tmp_path / "bomb.yaml")], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    assert "Traceback" not in run.stderr
