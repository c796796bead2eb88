"""tiledattn reproduce: a bundle's README "How to reproduce", followed literally in a fresh
directory (install the run's source from the bundle's own snapshot, then the one command),
re-runs the smoke study (CPU) through the local profile and ends with a verified bundle
holding the comparison against the original."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from tiledattention.cli import main
from tiledattention.study.publication import archive, verify

ROOT = Path(__file__).resolve().parent.parent
SNAKEMAKE = shutil.which("snakemake") or str(Path(sys.executable).with_name("snakemake"))
pytestmark = [pytest.mark.skipif(not Path(SNAKEMAKE).exists(),
                                 reason="snakemake not installed (pip install '.[workflow]')"),
              # one worker: the tests share the original study (a module fixture)
              pytest.mark.xdist_group("reproduce")]
WORKFLOW = ("Snakefile", "workflow", "config", "profiles", "containers", "pyproject.toml")


def _head() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    """The smoke study run as a user runs it, in a copy of the workflow (what git tracks),
    naming this checkout as its repository: its bundle."""
    tmp = tmp_path_factory.mktemp("original")
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--", *WORKFLOW],
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, tmp / rel)
    config = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    config["publication"]["repository"] = f"file://{ROOT}"
    (tmp / "config" / "repro.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    run = subprocess.run([SNAKEMAKE, "--profile", "profiles/local", "--configfile",
                          "config/repro.yaml"], cwd=tmp, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return tmp / "results" / "smoke" / "bundle"


def _readme_steps(readme: str) -> list[str]:
    section = readme.split("## How to reproduce", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [ln for ln in block.splitlines() if ln.strip()]


def _fresh_environment(tmp: Path) -> dict:
    """A new virtual environment whose packages are this one's (no network needed for the
    dependencies), without tiledattention: the README's install step puts it there."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "parent-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}")
    env.pop("PYTHONPATH", None)
    return env


def test_the_bundle_readme_names_the_repository_and_one_reproduce_command(original):
    readme = (original / "README.md").read_text()
    steps = _readme_steps(readme)
    wheel = json.loads((original / archive.MARKER).read_text())["source"]["wheel"]
    assert (original / wheel).is_file() and wheel.startswith("source/tiledattention-")
    assert steps == [  # a CPU study: the package from the bundle's wheel, torch's CPU wheels
        'python -c "import torch" 2>/dev/null || python -m pip install torch --index-url '
        "https://download.pytorch.org/whl/cpu",
        f'python -m pip install "{wheel}[workflow]"   # this run\'s package, from this bundle',
        "tiledattn reproduce . --out ../reproduction --profile local"]
    crate = json.loads((original / "ro-crate-metadata.json").read_text())
    workflow = next(e for e in crate["@graph"] if e["@id"] == "workflow-snapshot.zip")
    assert workflow["codeRepository"] == f"file://{ROOT}"
    assert f"Source: file://{ROOT} at revision {_head()}" in readme, \
        [ln for ln in readme.splitlines() if "Source:" in ln]


def test_following_the_bundle_readme_in_a_fresh_directory_reproduces_the_study(
        original, tmp_path):
    fresh = tmp_path / "fresh" / "downloaded-bundle"
    shutil.copytree(original, fresh)
    env = _fresh_environment(tmp_path)
    steps = _readme_steps((fresh / "README.md").read_text())
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(steps)], cwd=fresh,
                         env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-4000:])
    assert (tmp_path / "venv" / "bin" / "tiledattn").exists()  # the install step's
    out = tmp_path / "fresh" / "reproduction"
    new = out / "results" / "smoke" / "bundle"
    assert verify.verify(str(new)) == [] and verify.verify(str(new) + ".zip") == []
    # the same config, byte for byte; the same grid and methods
    assert (new / "config" / "study-config.yaml").read_bytes() == \
        (original / "config" / "study-config.yaml").read_bytes()
    keys = [{(r["point_key"], r["method"])
             for r in map(json.loads, (b / "data" / "rows.jsonl").read_text().splitlines())}
            for b in (original, new)]
    assert keys[0] == keys[1]
    # the comparison against the original, in the new bundle
    compare_md = (new / "compare" / "compare.md").read_text()
    assert compare_md.splitlines()[2].startswith("PASS")
    assert (new / "compare" / "compare.png").stat().st_size > 0
    assert "verified; compare against" in run.stderr and ": PASS: " in run.stderr
    # nothing was written into the downloaded bundle
    assert verify.verify(str(fresh)) == []


def test_reproduce_from_a_checkout_of_the_recorded_revision(original, tmp_path):
    out = tmp_path / "from-checkout"
    code = main(["reproduce", str(original), "--out", str(out), "--source", "checkout",
                 "--snakemake-args=-n"])
    assert code == 0
    head = subprocess.run(["git", "-C", str(out), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert head == _head()
    assert (out / "config" / "study-config.yaml").read_bytes() == \
        (original / "config" / "study-config.yaml").read_bytes()


def test_reproduce_again_into_its_own_out_continues_there_and_keeps_what_is_there(
        original, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["reproduce", str(original), "--out", str(out), "--snakemake-args=-n"]) == 0
    (out / "results").mkdir(exist_ok=True)
    (out / "results" / "measured-so-far.txt").write_text("rows")  # as a stopped run leaves
    (out / "config" / "study-config.yaml").write_bytes(b"# edited\n" + (
        original / "config" / "study-config.yaml").read_bytes())
    capsys.readouterr()
    assert main(["reproduce", str(original), "--out", str(out), "--snakemake-args=-n"]) == 0
    assert "holds this bundle's re-run already: continuing it" in capsys.readouterr().err
    assert (out / "results" / "measured-so-far.txt").read_text() == "rows"
    assert (out / "config" / "study-config.yaml").read_bytes().startswith(b"# edited")


def test_the_laid_out_workflow_keeps_the_snapshots_file_times(original, tmp_path):
    """Snakemake reruns a script's outputs when they are older than the script: laid out
    with today's times, a re-run continued in a new layout would start over."""
    import time
    import zipfile

    out = tmp_path / "out"
    assert main(["reproduce", str(original), "--out", str(out), "--snakemake-args=-n"]) == 0
    with zipfile.ZipFile(original / "workflow-snapshot.zip") as z:
        for info in z.infolist():
            if info.filename.endswith("/") or info.filename == "config/study-config.yaml":
                continue  # the bundle's exact config is written over the snapshot's
            if info.filename.split("/")[0] in archive.SNAPSHOT_SOURCE:
                assert not (out / info.filename).exists()  # the README installs it
                continue
            recorded = time.mktime((*info.date_time, 0, 0, -1))
            assert (out / info.filename).stat().st_mtime == recorded, info.filename


def test_reproduce_refuses_an_out_that_holds_another_bundles_re_run(original, tmp_path,
                                                                     capsys):
    out = tmp_path / "out"
    assert main(["reproduce", str(original), "--out", str(out), "--snakemake-args=-n"]) == 0
    mark = out / ".tiledattn-reproduce.json"
    mark.write_text(json.dumps(dict(json.loads(mark.read_text()), config_sha256="0" * 64)))
    capsys.readouterr()
    assert main(["reproduce", str(original), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds the re-run of another bundle" in err[0], err


def test_device_study_reproduce_re_runs_a_bundle_and_continues_a_stopped_re_run(
        original, tmp_path):
    """scripts/device-study.sh --reproduce (the GPU machines' route, here on the CPU): the
    bundle's study laid out in $WORKDIR, run, verified and compared; run again, it continues
    the finished re-run instead of refusing its directory."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               KIT=str(tmp_path / "no-kit"), SITE=str(tmp_path / "site"),
               TOOLCHAIN=str(tmp_path / "no-toolchain"),  # not a developer's carried one
               WORKDIR=str(tmp_path / "work"), OUT=str(tmp_path / "out"), PRECOMPILE="0")
    for _ in range(2):
        run = subprocess.run(["bash", "scripts/device-study.sh", "--reproduce", str(original),
                              "300"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=900)
        assert run.returncode == 0, run.stderr[-3000:]
        assert "verified; compare against" in run.stderr and ": PASS: " in run.stderr
    assert "holds this bundle's re-run already: continuing it" in run.stderr
    new = tmp_path / "work" / "results" / "smoke" / "bundle"
    assert verify.verify(str(new)) == [] and (new / "compare" / "compare.md").is_file()
    assert (tmp_path / "out" / "smoke-results.tar.gz").stat().st_size > 0


@pytest.mark.parametrize("case", ["tampered", "not-empty-out", "unknown-profile"])
def test_reproduce_refuses_bad_input_with_one_line(original, tmp_path, capsys, case):
    src, out, profile = original, tmp_path / "out", "local"
    if case == "tampered":
        src = tmp_path / "b"
        shutil.copytree(original, src)
        with open(src / "data" / "rows.csv", "a") as f:
            f.write("forged\n")
    elif case == "not-empty-out":
        out.mkdir()
        (out / "mine.txt").write_text("keep me")
    else:
        profile = "no-such-profile"
    assert main(["reproduce", str(src), "--out", str(out), "--profile", profile]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tiledattn reproduce: "), err
    if case == "not-empty-out":
        assert (out / "mine.txt").read_text() == "keep me"
