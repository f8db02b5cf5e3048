"""The ``aioelastic`` command: ``serve | run | status | etcd``.

Each subcommand lives in its own module that exports ``HELP`` (one line), ``configure(parser)``
(adds its flags) and ``main(args) -> int``. Those modules keep their top-level imports light; a
subcommand imports its backend only when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

__all__ = ["main"]

# subcommand -> module implementing it (imported when the parser is built; keep them light)
COMMANDS: dict[str, str] = {
    "etcd": "aioelastic._etcd_server_cli",
    "run": "aioelastic.agent._cli",
    "serve": "aioelastic.store.http._cli",
    "status": "aioelastic.rendezvous._status_cli",
}


def _load(name: str) -> ModuleType:
    return importlib.import_module(COMMANDS[name])


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="aioelastic",
        description="asyncio-native coordination for elastic distributed jobs",
    )
    parser.add_argument("--version", action="version", version=f"aioelastic {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = _load(name)
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.configure(command)
        command.set_defaults(command_parser=command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the subcommand's usage, not the top-level one (argparse reports them there)
        culprit: argparse.ArgumentParser = getattr(args, "command_parser", parser)
        culprit.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        result: int = _load(args.command).main(args)
    except KeyboardInterrupt:
        return 130
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
