"""`tiledattn check` runs its CPU checks anywhere and says clearly when no GPU is there."""

import argparse
import json
import subprocess
import sys

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_check_without_gpu_passes_cpu_checks_and_says_no_gpu(tmp_path):
    out = subprocess.run([sys.executable, "-m", "tiledattention.cli", "check", "--json",
                          str(tmp_path / "check.json")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no CUDA GPU" in out.stdout
    report = json.loads((tmp_path / "check.json").read_text())
    names = {r["name"]: r["ok"] for r in report["results"]}
    assert names["reference algorithm (CPU)"] and names["input validation (CPU)"]
    assert all(names.values())


def test_cli_without_command_prints_help_and_fails():
    out = subprocess.run([sys.executable, "-m", "tiledattention.cli"], capture_output=True,
                         text=True)
    assert out.returncode == 2 and "check" in out.stdout


def test_building_the_parser_and_help_do_not_import_torch():
    code = ("import sys; import tiledattention.cli as c; p = c.build_parser(); "
            "p.format_help(); [a.format_help() for a in c._subparsers(p)]; "
            "print(sorted(m for m in ('torch', 'numpy', 'cuda.tile') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_every_subcommand_and_option_has_help_and_shows_its_default():
    from tiledattention.cli import _subparsers, build_parser

    parser = build_parser()
    subs = _subparsers(parser)
    assert len(subs) >= 12  # every verb, bundle's and offline's actions
    for p in [parser, *subs]:
        for action in p._actions:
            if action.dest in ("help", "handler"):
                continue
            assert action.help, f"{p.prog}: {action.dest} has no help"
            if isinstance(action, argparse._SubParsersAction):
                assert all(c.help for c in action._choices_actions), p.prog
                continue
            text = p._get_formatter()._format_action(action)
            shown = "(default:" in text or "default" in action.help
            assert shown or action.required or action.default in (None, False), \
                f"{p.prog} {action.option_strings}: default {action.default!r} not shown"
            if action.default is None and action.option_strings and not action.required:
                assert "default" in action.help, \
                    f"{p.prog} {action.option_strings}: say what leaving it out means"
    assert "(default: quick)" in _help(parser, "tune")
    # A config field's option shows the dataclass's default (null: its help says what).
    assert "(null: the paper's 512..8192). (default: null)" in _help(parser, "tune")


def test_every_subcommand_help_has_a_description_above_its_options():
    # `tiledattn bundle create --help` once printed only its usage and options.
    from tiledattention.cli import _subparsers, build_parser

    for p in _subparsers(build_parser()):
        text = p.format_help()
        usage, rest = text.split("\n\n", 1)
        assert not rest.lstrip().startswith(("positional arguments", "options")), p.prog
        assert p.description and len(p.description) > 20, p.prog
    assert "SHA256SUMS" in _help(build_parser(), "bundle verify")
    assert "never changes it" in _help(build_parser(), "bundle create")


def _help(parser, verb):
    from tiledattention.cli import _subparsers

    text = next(p for p in _subparsers(parser) if p.prog.endswith(verb)).format_help()
    return " ".join(text.split())


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("grid: {seqs: [0]}\n")
    out = subprocess.run([sys.executable, "-m", "tiledattention.cli", "bench", "--config",
                          str(bad), "--out", str(tmp_path / "out")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"tiledattn bench: {bad}: grid.seqs: 0 must be >= 1"]
