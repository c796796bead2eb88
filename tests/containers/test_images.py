"""The built images, run: the Docker image (podman, no network) and the SIF (Apptainer)
each pass `tiledattn check`, benchmark the smoke grid into a bound directory, and the SIF
aggregates, records its own digest in the study manifest and bundles the result; both carry
the locked transformers that the model stage needs.

The images come from containers/ci.sh (CI's container stage), which builds them over a
locally made CPU base and then runs these tests; elsewhere they skip with that reason."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

IMAGE_CONFIG = "/opt/tiledattention/config"
SMOKE_ROWS = 64  # config/bench-smoke.yaml: 8 shapes x 8 methods


def _images() -> dict[str, str]:
    keys = ("TILEDATTN_CI_IMAGE", "TILEDATTN_CI_IMAGE_DIGEST", "TILEDATTN_CI_SIF",
            "TILEDATTN_CI_APPTAINER")
    missing = [k for k in keys if not os.environ.get(k)]
    if missing:
        why = (f"{', '.join(missing)} unset: the images are built and these tests run by "
               "containers/ci.sh (CI's container stage)")
        (pytest.fail if os.environ.get("TILEDATTN_CI_IMAGES_REQUIRED") else pytest.skip)(why)
    return {k: os.environ[k] for k in keys}


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    return _images()


def run(cmd: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def ok(cmd: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    out = run(cmd, timeout)
    assert out.returncode == 0, f"{' '.join(cmd)} exited {out.returncode}:\n{out.stderr[-3000:]}"
    return out


def rows_of(directory: Path) -> list[dict]:
    files = sorted(directory.glob("rows-shard*.jsonl"))
    assert files, f"no rows in {directory}"
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line]


def assert_smoke_rows(rows: list[dict]) -> None:
    assert len(rows) == SMOKE_ROWS
    statuses = {r["status"] for r in rows}
    assert statuses <= {"ok", "unavailable"} and "ok" in statuses, statuses


def label(images: dict[str, str], name: str) -> str:
    out = ok(["podman", "image", "inspect", "--format", f'{{{{index .Labels "{name}"}}}}',
              images["TILEDATTN_CI_IMAGE"]])
    return out.stdout.strip()


# --- the Docker image, under podman with no network ----------------------------------------

def podman_run(images, *args: str, mounts: tuple[str, ...] = ()) -> list[str]:
    cmd = ["podman", "run", "--rm", "--network", "none"]
    for m in mounts:
        cmd += ["-v", m]
    return cmd + [images["TILEDATTN_CI_IMAGE"], *args]


def test_docker_image_passes_tiledattn_check_offline(images):
    out = ok(podman_run(images, "check"))
    assert "tileiras" in out.stdout + out.stderr


def test_docker_image_benchmarks_the_smoke_grid_offline_into_a_mount(images, tmp_path):
    ok(podman_run(images, "bench", "--config", f"{IMAGE_CONFIG}/bench-smoke.yaml",
                  "--out", "/out/bench", mounts=(f"{tmp_path}:/out",)))
    assert_smoke_rows(rows_of(tmp_path / "bench"))
    manifest = json.loads(next((tmp_path / "bench").glob("manifest-*.json")).read_text())
    # The image's revision (no .git inside), from its label and ENV.
    assert manifest["git_commit"] == label(images, "org.opencontainers.image.revision")
    assert manifest["environment"]["TILEDATTENTION_SOURCE_REVISION"] == manifest["git_commit"]
    # The study manifest records the image by digest.
    ref = f"{images['TILEDATTN_CI_IMAGE']}@{images['TILEDATTN_CI_IMAGE_DIGEST']}"
    ok(podman_run(images, "manifest", "--runs", "/out/bench", "--image", ref,
                  "--out", "/out/manifest.json", mounts=(f"{tmp_path}:/out",)))
    study = json.loads((tmp_path / "manifest.json").read_text())
    assert study["container"] == {"image": ref, "digest": images["TILEDATTN_CI_IMAGE_DIGEST"]}


def test_docker_image_refuses_a_bad_config_with_exit_2(images, tmp_path):
    (tmp_path / "bad.yaml").write_text("grid: {seqs: [64]}\nmethods: [nonsense]\n")
    out = run(podman_run(images, "bench", "--config", "/out/bad.yaml", "--out", "/out/b",
                         mounts=(f"{tmp_path}:/out",)))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]


# --- the SIF, under Apptainer ----------------------------------------------------------------

def apptainer(images, *args: str) -> list[str]:
    return [images["TILEDATTN_CI_APPTAINER"], *args]


def test_sif_passes_apptainer_test(images):
    out = ok(apptainer(images, "test", images["TILEDATTN_CI_SIF"]))
    assert "all as pinned" in out.stdout, out.stdout[-2000:]


def test_sif_refuses_an_unknown_command_with_exit_2(images):
    out = run(apptainer(images, "run", images["TILEDATTN_CI_SIF"], "bnech"))
    assert out.returncode == 2 and "invalid choice: 'bnech'" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def _cli_verbs() -> list[str]:
    from tiledattention.cli import build_parser

    action = next(a for a in build_parser()._actions if a.dest == "command")
    return sorted(action.choices)


def test_both_images_run_every_cli_verb(images):
    # The runscript and the entry point pass every verb the CLI has (advise, model, offline
    # included), not a list of their own.
    for verb in _cli_verbs():
        sif = run(apptainer(images, "run", images["TILEDATTN_CI_SIF"], verb, "--help"))
        assert sif.returncode == 0 and f"usage: tiledattn {verb}" in sif.stdout, sif.stderr
        docker = run(podman_run(images, verb, "--help"))
        assert docker.returncode == 0 and f"usage: tiledattn {verb}" in docker.stdout, \
            docker.stderr
    advice = ok(apptainer(images, "run", images["TILEDATTN_CI_SIF"], "advise", "--heads", "16",
                          "--head-dim", "128", "--seq", "4096", "--batch", "4"))
    assert "prediction" in advice.stdout


def test_sif_bench_rows_manifest_and_bundle_in_a_bound_directory(images, tmp_path):
    sif = images["TILEDATTN_CI_SIF"]
    bind = ["-B", f"{tmp_path}:/data"]
    ok(apptainer(images, "run", *bind, sif, "bench", "--config",
                 f"{IMAGE_CONFIG}/bench-smoke.yaml", "--out", "/data/bench"))
    assert_smoke_rows(rows_of(tmp_path / "bench"))
    ok(apptainer(images, "run", *bind, sif, "aggregate", "--rows", "/data/bench", "--out",
                 "/data/study/aggregate", "--expect-shards", "1"))
    ok(apptainer(images, "run", *bind, sif, "manifest", "--runs", "/data/bench", "--config",
                 f"{IMAGE_CONFIG}/smoke.yaml", "--image", sif,
                 "--out", "/data/study/manifest.json"))
    study = json.loads((tmp_path / "study" / "manifest.json").read_text())
    digest = "sha256:" + hashlib.sha256(Path(sif).read_bytes()).hexdigest()
    assert study["container"] == {"image": sif, "digest": digest}
    assert study["consistent"] and study["stack"]["git_commit"]
    ok(apptainer(images, "run", "--app", "bundle", *bind, sif, "create", "--study",
                 "/data/study", "--config", f"{IMAGE_CONFIG}/smoke.yaml",
                 "--out", "/data/bundle"))
    verified = ok(apptainer(images, "run", "--app", "bundle", *bind, sif, "verify",
                            "/data/bundle.zip"))
    assert (tmp_path / "bundle.zip").stat().st_size > 0, verified.stdout
    bundled = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert bundled["container"]["digest"] == digest


def _decoy(tmp_path: Path) -> Path:
    """A working directory holding a `tiledattention` that must not be imported."""
    (tmp_path / "tiledattention").mkdir()
    (tmp_path / "tiledattention" / "__init__.py").write_text("raise ImportError('decoy')\n")
    return tmp_path


WHERE = "import tiledattention; print(tiledattention.__file__)"

# The model stage (`tiledattn model`) needs the transformers integration in the image.
HF = ("import transformers; from tiledattention.integrations import transformers as hf; "
      "hf.register(); print(transformers.__version__)")


def _locked(name: str) -> str:
    lock = Path(__file__).resolve().parents[2] / "containers" / "requirements.lock"
    return next(ln.split("==")[1] for ln in lock.read_text().splitlines()
                if ln.startswith(f"{name}=="))


def test_both_images_carry_the_locked_transformers_and_register_the_integration(images):
    sif = ok(apptainer(images, "exec", images["TILEDATTN_CI_SIF"], "python3", "-c", HF))
    docker = ok(["podman", "run", "--rm", "--network", "none", "--entrypoint", "python",
                 images["TILEDATTN_CI_IMAGE"], "-c", HF])
    assert sif.stdout.split()[-1] == docker.stdout.split()[-1] == _locked("transformers")


def test_a_checkout_in_the_working_directory_does_not_shadow_the_images_package(
        images, tmp_path):
    # The workflow's jobs run `python3 -m submitit...` from the checkout they were
    # submitted from; Apptainer binds that directory.
    cwd = _decoy(tmp_path)
    sif = subprocess.run(apptainer(images, "exec", images["TILEDATTN_CI_SIF"], "python3", "-c",
                                   WHERE), capture_output=True, text=True, timeout=300, cwd=cwd)
    assert sif.returncode == 0, sif.stderr[-2000:]
    assert sif.stdout.strip().startswith("/opt/venv/"), sif.stdout
    docker = ok(["podman", "run", "--rm", "--network", "none", "-v", f"{cwd}:/work", "-w",
                 "/work", "--entrypoint", "python", images["TILEDATTN_CI_IMAGE"], "-c", WHERE])
    assert docker.stdout.strip().startswith("/opt/venv/"), docker.stdout
