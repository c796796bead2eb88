"""The ``tiledattn`` command line."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tiledattn", description=__doc__)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    check = sub.add_parser("check", help="environment, correctness and speed check "
                           "(CPU checks always; GPU checks when a CUDA GPU is visible)")
    check.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    args = parser.parse_args(argv)
    if args.version:
        from . import __version__

        print(__version__)
        return 0
    if args.command == "check":
        from .check import run_check

        return run_check(args.json)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
