"""The launcher a Snakemake profile names, kept when the command line's --config drops it.

Snakemake turns a profile's keys into default command-line arguments, so a ``--config``
given on the command line replaces the profile's whole ``config:`` list, launcher included
(``snakemake --profile profiles/slurm --config shards=4`` would run every shard locally).
The workflow reads the profile again and puts its entries back under the command line's:
config file < profile < command line. A command line naming another launcher than the
profile's is refused with one line.
"""

from __future__ import annotations

import argparse
import copy
import os

import yaml

from .base import LauncherError


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


def restore(config: dict, profile: dict, cli: dict) -> list[str]:
    """Put back into ``config`` the profile entries the command line's ``cli`` dropped;
    return their keys. A command line naming another launcher raises LauncherError."""
    from snakemake.utils import update_config

    want = profile.get("launcher")
    if want is not None and cli.get("launcher", want) != want:
        raise LauncherError(f"this profile runs the study with launcher={want}, but --config "
                            f"says launcher={cli['launcher']}: use profiles/{cli['launcher']} "
                            "instead, or put the override in a --configfile")
    restored = sorted(k for k in profile if k not in cli)
    for key in restored:
        update_config(config, {key: copy.deepcopy(profile[key])})
    return restored


def apply(config: dict, argv: list[str], cli: dict, env_profile: str | None = None) -> list[str]:
    """Restore the profile's entries in the workflow's ``config`` (see ``restore``)."""
    profile = profile_config(argv, env_profile)
    return restore(config, profile, cli) if cli != profile else []


def env_profile() -> str | None:
    return os.environ.get("SNAKEMAKE_PROFILE")
