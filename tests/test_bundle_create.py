"""bundle create never loses what is the user's and never publishes what is not the
study's: --out and --force (the marker decides, never $HOME), the workflow snapshot
(tracked or allow-listed files only), links and special files, unsafe names, a study
without its tables, publication metadata of the wrong shape."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from study_kit import (
    ROOT,
    _create,
    _make,
    _study_with_rows,
    _tiny_study,
    cli,
    one_line,
    tiny_config,
    within,
)


def _run_cli(*argv: str, env: dict | None = None, cwd: Path | None = None,
             timeout: int = 120) -> subprocess.CompletedProcess:
    """The real ``tiledattn`` in a child process (the environment is the child's own)."""
    base = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "tiledattention.cli", *argv],
                          env={**base, **(env or {})}, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def _cli_inproc(*argv):
    return cli(*argv)


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


def test_bundle_create_force_never_replaces_a_directory_in_the_study_or_the_checkout(
        tmp_path):
    from tiledattention.study.presentation.frame import StudyError

    study = _tiny_study(tmp_path)
    (study / "aggregate" / "notes.md").write_text("mine")
    before = sorted(p.name for p in study.rglob("*"))
    err = one_line(cli("bundle", "create", "--study", str(study), "--config",
                       str(tiny_config(tmp_path)), "--out", str(study / "aggregate"),
                       "--force"))
    assert "inside the study directory, --force never replaces" in err
    assert sorted(p.name for p in study.rglob("*")) == before
    repo = tmp_path / "repo"
    (repo / "profiles" / "mine").mkdir(parents=True)
    (repo / "profiles" / "mine" / "config.yaml").write_text("account: secret\n")
    with pytest.raises(StudyError, match="inside the source checkout"):
        _create(study, repo / "profiles", repo=repo, force=True)
    assert (repo / "profiles" / "mine" / "config.yaml").exists()
    # a new directory (or our own bundle) inside the study is still where bundles go
    out = _create(study, study / "bundle", force=True)
    assert _create(study, study / "bundle", force=True)["dir"] == out["dir"]


def test_bundle_create_force_never_removes_a_directory_without_its_marker_whatever_home_says(
        tmp_path):
    study = _tiny_study(tmp_path)
    home = tmp_path / "realhome"  # a user's directory; HOME names somewhere else
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("key")
    (home / "thesis.tex").write_text("years of work")
    before = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    proc = _run_cli("bundle", "create", "--study", str(study), "--config",
                    str(tiny_config(tmp_path)), "--out", str(home), "--force",
                    env={"HOME": str(tmp_path / "elsewhere")})
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "not a bundle tiledattn made" in proc.stderr
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == before
    assert not (tmp_path / "realhome.zip").exists()
    # a marker that is not ours (a list, another format) does not make it ours either
    (home / ".tiledattention-bundle").write_text("[]")
    proc = _run_cli("bundle", "create", "--study", str(study), "--config",
                    str(tiny_config(tmp_path)), "--out", str(home), "--force")
    assert proc.returncode == 2 and (home / "thesis.tex").exists()


def test_bundle_create_force_never_replaces_a_zip_it_did_not_make(tmp_path):
    study = _tiny_study(tmp_path)
    (tmp_path / "b.zip").write_bytes(b"my archive")
    err = one_line(_cli_inproc("bundle", "create", "--study", str(study), "--config",
                               str(tiny_config(tmp_path)), "--out", str(tmp_path / "b"),
                               "--force"))
    assert "not a bundle zip of tiledattn's" in err
    assert (tmp_path / "b.zip").read_bytes() == b"my archive"
    assert not (tmp_path / "b").exists()


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


def test_nothing_untracked_or_outside_the_study_goes_into_a_bundle(tmp_path):
    from tiledattention.study.presentation.frame import StudyError
    from tiledattention.study.publication import create, verify

    repo = tmp_path / "repo"  # a source tree without .git
    for rel, text in (("Snakefile", "x"), ("config/config.yaml", "a: 1"),
                      ("config/mine.yaml", "token: hunter2"),
                      ("profiles/slurm/config.yaml", "x: 1"),
                      ("profiles/mycluster/config.yaml", "account: hunter2"),
                      ("workflow/rules/bench.smk", "rule x:")):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    files, how = create.snapshot_files(str(repo))
    assert files == ["Snakefile", "config/config.yaml", "profiles/slurm/config.yaml",
                     "workflow/rules/bench.smk"] and "allow-list" in how
    outside = tmp_path / "outside.txt"
    outside.write_text("hunter2")
    study = _tiny_study(tmp_path)
    (study / "figures").mkdir()
    (study / "figures" / "leak.png").symlink_to(outside)
    with pytest.raises(StudyError, match="leak.png is a link to .*outside the study"):
        _create(study, tmp_path / "b", repo=repo)
    (study / "figures" / "leak.png").unlink()
    os.mkfifo(study / "figures" / "pipe.png")
    with within(20), pytest.raises(StudyError, match="pipe.png is not a regular file"):
        _create(study, tmp_path / "b", repo=repo)
    (study / "figures" / "pipe.png").unlink()
    (study / "figures" / "fine.png").write_text("png")
    (study / "figures" / "alias.png").symlink_to(study / "figures" / "fine.png")  # inside
    out = Path(_create(study, tmp_path / "b", repo=repo)["dir"])
    with zipfile.ZipFile(out / "workflow-snapshot.zip") as z:
        assert b"hunter2" not in b"".join(z.read(n) for n in z.namelist())
    assert (out / "figures" / "alias.png").read_text() == "png"
    assert verify.verify(str(out)) == []


def test_the_shipped_snapshot_allow_list_names_every_tracked_config_and_profile():
    from tiledattention.study.publication import archive

    run = subprocess.run(["git", "-C", str(ROOT), "ls-files", "config", "profiles"],
                         capture_output=True, text=True)
    if run.returncode != 0 or not run.stdout:
        pytest.skip("not a git checkout: the tracked files cannot be listed here")
    assert set(run.stdout.split()) <= set(archive.SNAPSHOT_SHIPPED), \
        "add the new tracked file to archive.SNAPSHOT_SHIPPED"


def test_bundle_create_refuses_a_study_file_whose_name_holds_a_newline(tmp_path):
    from tiledattention.study.presentation.frame import StudyError

    study = _study_with_rows(tmp_path)
    (study / "aggregate" / "tables" / "evil\nname.md").write_text("x")
    with pytest.raises(StudyError, match="control character"):
        _make(study, tmp_path / "b", compact=True)
    assert not (tmp_path / "b").exists()


def test_publication_of_the_wrong_shape_is_one_line(tmp_path):
    from tiledattention.study.presentation.frame import StudyError
    from tiledattention.study.publication.metadata import Publication

    for bad, words in (("str", "publication: a mapping"),
                       ({"keywords": "attention"}, "publication.keywords: a list"),
                       ({"title": 5}, "publication.title: a string"),
                       ({"creators": "me"}, "publication.creators: a list")):
        with pytest.raises(StudyError, match=words):
            Publication.from_dict(bad, "0.1.0")
    study = _study_with_rows(tmp_path)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("results_dir: x\npublication: 'str'\n")
    assert "publication: a mapping" in one_line(cli(
        "bundle", "create", "--study", str(study), "--config", str(cfg), "--out",
        str(tmp_path / "b")))
