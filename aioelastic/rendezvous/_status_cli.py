"""``aioelastic status``: show a run's rendezvous state once, or live with ``--watch`` (light).

The store is given as ``--endpoint``: ``host[:port]`` of an ``aioelastic serve`` (``--backend``
chooses another, as ``--rdzv-backend`` does for ``aioelastic run``) or a full store URL such as
``etcd://h1:2379,h2:2379``. Bad input (a malformed endpoint, an unreachable store, an unknown run
id, corrupt state) prints one line on stderr and exits with 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

HELP = (
    "show a run's rendezvous state: round, members, ranks, leases, waiting nodes, closed, "
    "active store timers"
)

_CLEAR = "\x1b[H\x1b[2J"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``status`` flags."""
    parser.add_argument(
        "--endpoint",
        required=True,
        metavar="URL",
        help="the store: host[:port] (default port 29400 for c10d/http, 2379 for etcd) or a full "
        "store URL such as http://host:29400 or etcd://h1:2379,h2:2379",
    )
    parser.add_argument("--run-id", required=True, metavar="ID", help="the run id of the job")
    parser.add_argument(
        "--backend",
        default="c10d",
        choices=("c10d", "http", "https", "etcd"),
        help="how to read a host[:port] endpoint (default: c10d, an aioelastic serve)",
    )
    parser.add_argument(
        "--token-file",
        metavar="F",
        help="http(s) stores: the bearer token of the server, in F (default: $AIOELASTIC_TOKEN)",
    )
    parser.add_argument(
        "--password-file",
        metavar="F",
        help="etcd stores: the password of the user in the endpoint (etcd://USER@host), in F "
        "(default: $AIOELASTIC_ETCD_PASSWORD)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="give up reading the first snapshot after S seconds (default: 10)",
    )
    parser.add_argument(
        "--watch",
        action="store_true",
        help="stay and print a new snapshot after every change (driven by a store watch)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print JSON (one object per line with --watch)"
    )
    parser.add_argument(
        "--timers-prefix",
        default=None,
        metavar="PREFIX",
        help="list the armed store timers under PREFIX (default: the run's own, "
        "aioelastic/run-timers/<run id>/, as aioelastic.timer.run_prefix gives)",
    )


def _fail(message: str, *, redact: bool = True) -> int:
    """Say ``message`` on stderr (passwords in it redacted unless the caller did) and return 2."""
    from .._secrets import redact_url

    print(f"aioelastic status: {redact_url(message) if redact else message}", file=sys.stderr)
    return 2


def main(args: argparse.Namespace) -> int:
    """Run ``aioelastic status``; 0 on success, 2 on bad input or an unreachable store."""
    import asyncio
    import logging

    from ..errors import AioelasticError

    # A one-shot query says its own failure, in one line: not the client's "retrying" warning.
    logging.getLogger("aioelastic.store").setLevel(logging.ERROR)
    if not args.timeout > 0:
        return _fail(f"--timeout must be a number of seconds > 0, got {args.timeout}")
    if args.timers_prefix is not None and not args.timers_prefix:
        return _fail("--timers-prefix must not be empty")
    try:
        return asyncio.run(_main(args))
    except (AioelasticError, ValueError, TypeError, OSError) as exc:
        return _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def store_url(endpoint: str, backend: str, run_id: str) -> str:
    """The store URL for ``--endpoint`` (a full URL is taken as is)."""
    from . import RendezvousParameters, store_url_for

    endpoint = endpoint.strip()
    if "://" in endpoint:
        return endpoint
    return store_url_for(RendezvousParameters(backend, endpoint, run_id, 1, 1))


async def _main(args: argparse.Namespace) -> int:
    import asyncio

    from .._checks import RUN_ID_FORM
    from .._secrets import redact_url
    from ..store import open_store
    from ._state import check_run_id
    from ._status import format_run_status, watch_run_status

    try:
        run_id = check_run_id(args.run_id)
    except ValueError:
        # redact the run id only: the allowed characters ':@' look like a password to redact_url
        return _fail(
            f"--run-id must be {RUN_ID_FORM}, got {redact_url(args.run_id)!r}", redact=False
        )
    try:
        url = store_url(args.endpoint, args.backend, run_id)
    except ValueError as exc:
        return _fail(f"--endpoint {redact_url(args.endpoint)!r} is malformed: {exc}")
    options: dict[str, Any] = {}
    if args.token_file is not None:
        if not url.startswith(("http://", "https://")):
            return _fail("--token-file applies to http(s) stores only")
        options["token_file"] = args.token_file
    if args.password_file is not None:
        if not url.startswith(("etcd://", "etcds://")):
            return _fail("--password-file applies to etcd stores only")
        options["password_file"] = args.password_file
    try:
        opener = open_store(url, **options)
    except ValueError as exc:
        return _fail(f"--endpoint {redact_url(args.endpoint)!r} is malformed: {exc}")
    interactive = sys.stdout.isatty() and not args.json
    async with opener as store:
        snapshots = watch_run_status(store, run_id, timers_prefix=args.timers_prefix)
        try:
            try:
                async with asyncio.timeout(args.timeout):
                    first = await anext(snapshots)
            except TimeoutError:
                return _fail(
                    f"no answer from the store at {redact_url(url)} within {args.timeout:g}s"
                )
            status = first
            while True:
                text = format_run_status(status, as_json=args.json)
                if interactive and args.watch:
                    text = _CLEAR + text
                elif args.watch and not args.json:
                    text += "\n"  # a blank line between frames
                print(text, flush=True)
                if not args.watch:
                    return 0
                status = await anext(snapshots)
        finally:
            await snapshots.aclose()
