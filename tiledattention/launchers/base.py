"""What every launcher shares: the options check, waiting with a limit. A task is any
picklable callable with a ``job_name`` (and a ``tag`` where one step has many jobs): the
stages' tasks (``tiledattention/stages/``), e.g. the bench stage's ``ShardTask``."""

from __future__ import annotations

import importlib
import time
from dataclasses import fields

from ..errors import TiledAttentionError

LAUNCHERS = ("debug", "local", "slurm")  # one module of this package each


class LauncherError(TiledAttentionError, RuntimeError):
    """A launcher was misconfigured, or a shard's job failed (state and log path named)."""


class LauncherOptionError(LauncherError, ValueError):
    """A launcher option (or the request it makes of the cluster) is invalid: bad input,
    exit 2, with the option and what would be accepted."""


def job_name(task) -> str:
    """The name a task's job carries (sbatch --job-name, so sacct shows the step)."""
    return getattr(task, "job_name", "tiledattn")


def run_step(launcher: str, options: dict, folder: str, task):
    """Run one GPU step (tune, profile, ...) as a job of ``launcher`` and wait for it; a
    failed job raises LauncherError naming its id, state and log."""
    return get_launcher(launcher, folder, options).run([task])[0]


def _typed(value, annotation: str, where: str):
    # Options may arrive as strings (Snakemake's --config, profiles): convert them to the
    # field's type, and refuse what does not convert.
    if value is None or not isinstance(value, str):
        return value
    text = value.strip()
    if "None" in annotation and text.lower() in ("none", "null", ""):
        return None
    try:
        if annotation.startswith("int"):
            return int(text)
        if annotation.startswith("float"):
            return float(text)
        if annotation.startswith("bool"):
            if text.lower() in ("true", "false"):
                return text.lower() == "true"
            raise ValueError(text)
    except ValueError as exc:
        raise LauncherOptionError(f"{where}: {value!r} is not a valid {annotation}") from exc
    return value


_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,), "dict": (dict,)}


def _checked(value, annotation: str, where: str):
    # A value of the wrong type (a list, a bool for a count) and any text with a line
    # break or control character (it would become its own line of a job script) refused.
    if value is None:
        if "None" not in annotation:
            raise LauncherOptionError(f"{where}: may not be null")
        return value
    kind = annotation.split("|")[0].strip()
    allowed = _TYPES.get(kind)
    if allowed and (not isinstance(value, allowed) or (kind != "bool" and isinstance(value, bool))):
        raise LauncherOptionError(f"{where}: {value!r} is not a valid {annotation}")
    if isinstance(value, str) and any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise LauncherOptionError(f"{where}: {value!r} contains a line break or control "
                                  "character; give it on one line")
    return value


def check_options(cls, options: dict, launcher: str):
    """Build a typed options dataclass, refusing unknown keys with the valid ones."""
    if not isinstance(options, dict):
        raise LauncherOptionError(f"{launcher} launcher: options must be a mapping, got "
                                  f"{options!r}")
    valid = [f.name for f in fields(cls)]
    unknown = sorted(set(map(str, options)) - set(valid))
    if unknown:
        raise LauncherOptionError(f"{launcher} launcher: unknown option(s) {unknown}; valid "
                                  f"options are {valid}")
    types = {f.name: str(f.type) for f in fields(cls)}
    return cls(**{k: _checked(_typed(v, types[k], f"{launcher} launcher option {k}"), types[k],
                              f"{launcher} launcher option {k}")
                  for k, v in options.items()})


def check_launcher(name: str, options: dict) -> None:
    """Validate ``options`` for launcher ``name`` without starting anything (the workflow
    calls this once, before the first rule)."""
    if name not in LAUNCHERS:
        raise LauncherOptionError(f"unknown launcher {name!r}; valid launchers are "
                                  f"{sorted(LAUNCHERS)}")
    importlib.import_module(f"{__package__}.{name}").Launcher.check(options or {})


def typed_options(name: str, options: dict) -> dict:
    """``options`` as the launcher reads them (numbers as numbers, "null" as None): what a
    displayed command line shows."""
    checked = importlib.import_module(f"{__package__}.{name}").Launcher.check(options or {})
    return {k: getattr(checked, k) for k in options or {}}


def preflight_launcher(name: str, options: dict, folder: str) -> None:
    """Ask the scheduler once, before the first step, whether the request can ever run
    (a launcher without such a check passes); LauncherOptionError says what to change."""
    check_launcher(name, options)
    module = importlib.import_module(f"{__package__}.{name}")
    if hasattr(module, "preflight"):
        module.preflight(options or {}, folder)


def get_launcher(name: str, folder: str, options: dict | None = None):
    """The launcher called ``name`` (slurm, local, debug), its logs under ``folder``."""
    if name not in LAUNCHERS:
        raise LauncherOptionError(f"unknown launcher {name!r}; valid launchers are "
                                  f"{sorted(LAUNCHERS)}")
    module = importlib.import_module(f"{__package__}.{name}")
    return module.Launcher(folder, options or {})


class Launcher:
    """What each launcher module's ``Launcher`` shares (as submitit's executors share
    theirs): its ``name``, its checked ``options`` (``Options``, a frozen dataclass, through
    ``check``) and the ``folder`` its jobs' logs go to; a subclass adds ``run(tasks)``."""

    name = ""
    Options: type = type(None)

    def __init__(self, folder: str, options: dict):
        self.options = self.check(options)
        self.folder = folder

    @classmethod
    def check(cls, options: dict):
        """The typed options, or LauncherOptionError naming the option and the valid ones."""
        return check_options(cls.Options, options, cls.name)


class interrupts_raise:
    """SIGTERM and SIGHUP raise KeyboardInterrupt while the block runs (as Ctrl-C does), so
    a launcher stopped by Snakemake cancels its jobs on the way out instead of dying."""

    def __enter__(self):
        import signal

        def stop(signum, frame):
            raise KeyboardInterrupt

        self.previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM,
                                                                    signal.SIGHUP)}
        return self

    def __exit__(self, *exc):
        import signal

        for sig, old in self.previous.items():
            signal.signal(sig, old)
        return False


def wait(jobs, describe, timeout_s: float | None, poll_s: float = 1.0) -> list:
    """Results of submitit jobs in order; a failed job raises naming its state and log."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while not all(j.done() for j in jobs):
            if deadline is not None and time.monotonic() > deadline:
                for j in jobs:
                    if not j.done():
                        j.cancel(check=False)
                raise LauncherError(f"shards did not finish within {timeout_s:.0f}s; "
                                    f"cancelled {[describe(j) for j in jobs if not j.done()]}")
            time.sleep(poll_s)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM through interrupts_raise: no orphans
        for j in jobs:
            if not j.done():
                j.cancel(check=False)
        raise
    results = []
    for j in jobs:
        try:
            results.append(j.result())
        except Exception as exc:
            raise LauncherError(f"{describe(j)} failed: {job_error(str(exc))}") from exc
    return results


def job_error(text: str) -> str:
    """The error a failed job raised, without the traceback submitit wraps it in (the full
    trace stays in the job's log): its last ``SomeError: message`` line."""
    import re

    found = [m for m in re.finditer(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception|Exit|Interrupt)"
                                    r"\b.*)$", text, re.M)]
    return found[-1].group(1).strip()[-1500:] if found else text.strip()[-1500:]
