"""A committed reference re-runs from the bundle alone: copied into an empty directory with no
checkout around it, its README's install line installs the package from the bundle's own
wheel (offline, into a fresh environment), that package is the recorded revision, and its
tables rebuild from the rows with it.

The references are H100 and H200 studies: on a machine without a CUDA GPU the README's
reproduce step refuses them by design (one line, exit 2: it would measure on the CPU for
hours), so the strongest thing a CPU can do is what this test does: install from the
bundled wheel, check it is the recorded revision, see reproduce refuse in one line, rebuild
every table from the rows."""

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

from tiledattention.study.presentation.table import Table
from tiledattention.study.publication.verify import verify

ROOT = Path(__file__).resolve().parent.parent
REFERENCES = ["results/reference/h100", "results/reference/h200"]
pytestmark = pytest.mark.slow  # a fresh environment and every table rebuilt: about a minute


def _block(readme: str, section: str) -> list[str]:
    text = readme.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return [ln for ln in re.search(r"```bash\n(.*?)```", text, re.S).group(1).splitlines()
            if ln.strip()]


def _fresh_environment(tmp: Path) -> dict:
    """A new virtual environment that sees this one's packages (the dependencies: no
    network) but not tiledattention, which the README's install step puts there."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    # Path lines, not site dirs: the parent's .pth files (its editable tiledattention) stay
    # unread, so the only tiledattention there is the one installed from the bundle. Every
    # directory the parent imports from but a checkout's (a torch that setup.sh lent the
    # venv through its own .pth, numpy with it, is on sys.path, not in purelib).
    paths = [sysconfig.get_paths()["purelib"]] + [
        p for p in sys.path if p and os.path.isdir(p)
        and not os.path.isdir(os.path.join(p, "tiledattention"))]
    (site / "parent-environment.pth").write_text("\n".join(dict.fromkeys(paths)) + "\n")
    env = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
               PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    for key in ("PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(key, None)
    return env


def _run(script: str, cwd: Path, env: dict, timeout: int = 900):
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _same_groups(want: Table, got: Table) -> bool:
    """``got``, a status table with a row per row, groups to ``want``'s (method, status,
    reason, rows): the same rows, in a later layout."""
    if got.columns[:4] != ["point", "method", "status", "reason"]:
        return False
    counts: dict[tuple, int] = {}
    for r in got.rows:
        counts[tuple(r[1:4])] = counts.get(tuple(r[1:4]), 0) + 1
    return sorted(counts.items()) == sorted((tuple(r[:3]), int(r[3])) for r in want.rows)


@pytest.mark.parametrize("ref", REFERENCES)
def test_a_committed_reference_reruns_from_the_bundle_alone(ref, tmp_path):
    bundle = tmp_path / "empty" / "downloaded-bundle"
    shutil.copytree(ROOT / ref, bundle)
    assert subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=bundle,
                          capture_output=True).returncode != 0  # no checkout around it
    env = _fresh_environment(tmp_path)
    readme = (bundle / "README.md").read_text()
    steps = _block(readme, "How to reproduce")
    assert not [s for s in steps if "git " in s or "../source" in s]
    install = [s for s in steps if "pip install" in s]
    assert len(install) == 1 and '"source/tiledattention-' in install[0], steps
    # The gpu extra's cuTile compiler packages are a GPU node's; a CPU installs the rest.
    run = _run(install[0].replace("[gpu,workflow]", "[workflow]"), bundle, env)
    assert run.returncode == 0, run.stderr[-3000:]

    manifest = json.loads((bundle / "manifest.json").read_text())
    stack = manifest["stack"]
    recorded = {stack["git_commit"], *manifest.get("mismatches", {}).get("git_commit", [])}
    probe = _run('python -c "import importlib.metadata as m, tiledattention as t; '
                 "print(t.__file__); print(t.__version__); print(m.version('tiledattention'))\"",
                 bundle, env)
    assert probe.returncode == 0, probe.stderr[-2000:]
    where, version, dist = probe.stdout.split()
    assert where.startswith(str(tmp_path / "venv")), where  # the bundle's, not this checkout's
    assert version == stack["tiledattention"]
    base, _, label = dist.partition("+g")
    assert base == version and label in recorded, (dist, recorded)

    # Reproduce: on this CPU the H100/H200 study is refused in one line, by design.
    reproduce = [s for s in steps if s.startswith("tiledattn reproduce")]
    assert reproduce == ["tiledattn reproduce . --out ../reproduction --profile local"]
    run = _run(reproduce[0], bundle, env, timeout=300)
    assert run.returncode == 2 and "no CUDA GPU" in run.stderr, (run.stdout, run.stderr)
    assert len(run.stderr.strip().splitlines()) == 1 and not (tmp_path / "empty" /
                                                             "reproduction").exists()

    # Every table rebuilds from the rows with the bundle's own package.
    run = _run("\n".join(_block(readme, "Figures and tables from the rows")), bundle, env)
    assert run.returncode == 0, run.stderr[-3000:]
    rebuilt = tmp_path / "empty" / "rebuilt-downloaded-bundle" / "aggregate" / "tables"
    for name in sorted(os.listdir(bundle / "tables")):
        want, got = (bundle / "tables" / name).read_text(), (rebuilt / name).read_text()
        # The committed status table was grouped by a later revision than the one that
        # measured (the wheel's): the same rows, one line per reason there.
        assert want == got or name == "status.md" and _same_groups(
            Table.from_markdown("status", want), Table.from_markdown("status", got)), name
    # Nothing was written into the bundle.
    assert verify(str(bundle)) == []
