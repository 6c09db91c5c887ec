"""The ``tileops`` command (also ``python -m tileops``): one module per subcommand.

    tileops new-backend NAME [--device-type TYPE] [--ops OP,...] [--dest DIR]
    tileops check TARGET [--ops A,B] [--device D] [--junit FILE]
    tileops bench TARGET [--ops A,B] [--baseline eager|compile|TARGET] [--csv F] [--plot F.png]
    tileops profile-machine [--out F.yaml]
    tileops coverage TARGET --model CONFIG
    tileops doctor

Every command but new-backend prints a table (rich on a terminal where it is installed,
plain text elsewhere), takes ``--json [FILE]``, shows progress on stderr and exits 1 when
what it checks fails, 2 on a command line it cannot carry out.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import bench, check, coverage, doctor, profile_machine, scaffold
from ._common import UsageError
from .scaffold import (
    DEFAULT_OPS,
    LAYOUT,
    TEMPLATES,
    builder_name,
    builder_stub,
    check_device_type,
    check_name,
    check_ops,
    new_backend,
    registration,
    render,
)

__all__ = [
    "DEFAULT_OPS",
    "LAYOUT",
    "TEMPLATES",
    "UsageError",
    "builder_name",
    "builder_stub",
    "check_device_type",
    "check_name",
    "check_ops",
    "main",
    "new_backend",
    "registration",
    "render",
]

_COMMANDS = (scaffold, check, bench, profile_machine, coverage, doctor)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tileops",
        description="tileops command-line tools: a backend template, and the vendor kit "
        "(check, bench, profile-machine, coverage, doctor).",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _COMMANDS:
        module.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.run(args)
    except UsageError as error:
        print(f"tileops {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tileops {args.command}: interrupted", file=sys.stderr)
        return 130
