"""The launcher a Snakemake profile names, kept when the command line's --config drops it.

Snakemake turns a profile's keys into default command-line arguments, so a ``--config``
given on the command line replaces the profile's whole ``config:`` list, launcher included
(``snakemake --profile profiles/slurm --config shards=4`` would run every shard locally).
The workflow reads the profile again and merges, key by key: config files < profile <
command line, and says which values lost. A command line naming another launcher than the
profile's is refused with one line.
"""

from __future__ import annotations

import argparse
import copy
import os

import yaml

from .base import LAUNCHERS, LauncherOptionError


def profile_config(argv: list[str], env_profile: str | None = None) -> dict:
    """The merged ``config:`` entries of the profiles named in ``argv`` (Snakemake's own
    arguments; SNAKEMAKE_PROFILE when none), parsed as Snakemake parses them."""
    from snakemake.cli import get_profile_dir, parse_config
    from snakemake.utils import update_config

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--profile", action="append", default=[])
    names = parser.parse_known_args(argv)[0].profile or ([env_profile] if env_profile else [])
    merged: dict = {}
    for name in names:
        found = get_profile_dir(name) if name != "none" else None
        if found is None:
            continue
        with open(found[1]) as f:
            entries = (yaml.safe_load(f) or {}).get("config") or {}
        update_config(merged, entries if isinstance(entries, dict) else parse_config(entries))
    return merged


def restore(config: dict, profile: dict, cli: dict, profile_dirs: str = "profiles") -> list[str]:
    """Make ``config`` (Snakemake's: the config files under the command line's --config)
    the config files < the profile < the command line, merged key by key; return the
    profile's top-level keys the command line had dropped. A command line naming another
    launcher than the profile's raises LauncherOptionError with advice that works."""
    from snakemake.utils import update_config

    want = profile.get("launcher")
    said = cli.get("launcher", want)
    if want is not None and said != want:
        if said not in LAUNCHERS:
            raise LauncherOptionError(f"--config launcher={said}: unknown launcher; valid "
                                      f"launchers are {sorted(LAUNCHERS)}")
        other = os.path.join(profile_dirs, str(said))
        advice = (f"use --profile {other} instead" if os.path.isdir(other) else
                  f"run without a profile (snakemake --cores N ... --config launcher={said})")
        raise LauncherOptionError(f"this profile runs the study with launcher={want}, but "
                                  f"--config says launcher={said}: {advice}")
    restored = sorted(k for k in profile if k not in cli)
    update_config(config, copy.deepcopy(profile))
    update_config(config, copy.deepcopy(cli))
    return restored


def losing(files: dict, profile: dict, final: dict) -> list[str]:
    """One line per value of the config files that the profile replaced (config files <
    profile < command line): the command line winning is what the user asked for, the
    profile winning over their config file is what they may not expect."""
    lines = []
    for path, value in _leaves(files):
        now, theirs = _get(final, path), _get(profile, path)
        if now != value and theirs is not _MISSING and now == theirs:
            lines.append(f"config: {'.'.join(path)}: {value!r} from the config file is "
                         f"overridden by the profile ({now!r}); precedence: config files < "
                         "profile < command line --config")
    return lines


def _leaves(d: dict, prefix: tuple = ()):
    for k, v in d.items():
        if isinstance(v, dict):  # an empty mapping sets nothing
            yield from _leaves(v, (*prefix, k))
        else:
            yield (*prefix, k), v


_MISSING = object()


def _get(d, path: tuple):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return _MISSING
        d = d[k]
    return d


def apply(config: dict, argv: list[str], cli: dict, env_profile: str | None = None,
          files: dict | None = None) -> tuple[list[str], list[str]]:
    """Restore the profile's entries in the workflow's ``config`` (see ``restore``);
    return the restored keys and the lines naming each override that lost."""
    profile = profile_config(argv, env_profile)
    restored = restore(config, profile, cli) if profile and cli != profile else []
    return restored, losing(files or {}, profile, config)


def env_profile() -> str | None:
    return os.environ.get("SNAKEMAKE_PROFILE")
