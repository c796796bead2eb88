"""Check inside a built image that its stack is the one this repository pins; exit 1 with
each difference. Run by the Dockerfile and the def file's %post (a wrong image never gets
built) and by %test (`apptainer test`):

    python containers/verify.py --tileiras 13.4.92 --require-ncu

- every pin of containers/requirements.lock is installed at exactly that version;
- `pip check` finds no conflict that involves a locked distribution or tiledattention
  (conflicts among the base image's own packages are printed, not fatal: they are
  NVIDIA's, e.g. requirements on a final torch release that its `2.x.0a0` build misses);
- tileiras runs and reports the pinned release; with --require-ncu, Nsight Compute runs.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version

LOCK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "requirements.lock")
OURS = "tiledattention"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins(path: str = LOCK) -> dict[str, str]:
    pins = {}
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                name, _, pinned = line.partition("==")
                if not pinned:
                    raise ValueError(f"{path}: {line!r} is not pinned with ==")
                pins[canonical(name)] = pinned
    return pins


def installed_mismatches(pins: dict[str, str],
                         installed: Callable[[str], str] = version) -> list[str]:
    out = []
    for name, pinned in sorted(pins.items()):
        try:
            have = installed(name)
        except PackageNotFoundError:
            out.append(f"{name}=={pinned} is locked but not installed")
            continue
        if have != pinned:
            out.append(f"{name}=={pinned} is locked but {have} is installed")
    return out


# pip check's lines: "X 1.0 has requirement Y>=2, but you have Y 1.0." and
# "X 1.0 requires Y, which is not installed." (and "... is not supported on this platform.")
_CONFLICT = re.compile(r"^(?P<who>\S+) \S+ (?:has requirement|requires) (?P<dep>[A-Za-z0-9._-]+)")
_PLATFORM = re.compile(r"^(?P<who>\S+) \S+ is not supported on this platform")


def split_conflicts(pip_check: str, ours: set[str]) -> tuple[list[str], list[str]]:
    """pip check's complaints as (those touching our distributions, the base image's own)."""
    mine, base = [], []
    for line in pip_check.splitlines():
        line = line.strip()
        m = _CONFLICT.match(line) or _PLATFORM.match(line)
        if not m:
            continue
        names = {canonical(v) for v in m.groupdict().values() if v}
        (mine if names & ours else base).append(line)
    return mine, base


def tileiras_problems(pinned: str) -> list[str]:
    from tiledattention.kernel.toolchain import tileiras_path

    path = tileiras_path()
    if path is None:
        return ["tileiras was not found (the gpu extra's nvidia-cuda-tileiras wheel)"]
    run = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=120)
    text = run.stdout + run.stderr
    if run.returncode != 0:
        return [f"{path} --version exited {run.returncode}: {text.strip()[-500:]}"]
    print(f"tileiras: {path}: {text.strip().splitlines()[-2:]}")
    if f"V{pinned}" not in text:
        return [f"tileiras is not the pinned V{pinned}: {text.strip()[-300:]}"]
    return []


def ncu_problems() -> list[str]:
    from tiledattention.stages.profile import find_ncu

    ncu = find_ncu()
    if ncu is None:
        return ["ncu (Nsight Compute, for `tiledattn profile`) is not in the image"]
    run = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        return [f"{ncu} --version exited {run.returncode}: {run.stderr.strip()[-300:]}"]
    print(f"ncu: {ncu}: {run.stdout.strip().splitlines()[-1:]}")
    return []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lock", default=LOCK)
    p.add_argument("--tileiras", required=True, help="the pinned tileiras, e.g. 13.4.92")
    p.add_argument("--require-ncu", action="store_true", help="fail without Nsight Compute")
    args = p.parse_args(argv)
    pins = lock_pins(args.lock)
    problems = installed_mismatches(pins)
    check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True,
                           text=True)
    mine, base = split_conflicts(check.stdout, set(pins) | {OURS})
    problems += [f"pip check: {c}" for c in mine]
    for c in base:
        print(f"note, the base image's own: {c}")
    problems += tileiras_problems(args.tileiras)
    if args.require_ncu:
        problems += ncu_problems()
    for problem in problems:
        print(f"verify: {problem}", file=sys.stderr)
    print(f"verify: {len(pins)} locked distributions, "
          + ("all as pinned" if not problems else f"{len(problems)} problem(s)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
