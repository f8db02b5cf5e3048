"""``aioelastic serve``: run the HTTP store server until SIGTERM or SIGINT (light to import)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from typing import Any

HELP = "run the HTTP store server (single-host coordination, like torch's TCPStore)"
#: ``--max-watches``: every participant of a rendezvous holds a watch or two, so the library's
#: 10,000 (``HttpStoreServer(max_watch_streams=)``) would refuse the 10,000th node's driver
#: watch and stall the round; a watch over a session costs no connection or task of its own.
SERVE_MAX_WATCHES = 100_000
#: ``--history-limit``: ten times the memory engine's 10,000 (``memory.DEFAULT_HISTORY_LIMIT``,
#: for a store in one process): a round of 10,000 sessions writes about 20,000 events, and a
#: watcher that falls behind a compaction reads the run's state again. A full history costs the
#: server about 420 bytes an event (~40 MiB).
SERVE_HISTORY_LIMIT = 100_000


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``serve`` flags."""
    _bind_flags(parser)
    _data_dir_flags(parser)
    _security_flags(parser)
    _limit_flags(parser)
    _serving_flags(parser)


def _bind_flags(parser: argparse.ArgumentParser) -> None:
    """Where to listen."""
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, loopback only)"
    )
    parser.add_argument(
        "--port", type=int, default=29400, help="port to bind (default: 29400; 0 picks a free one)"
    )


def _data_dir_flags(parser: argparse.ArgumentParser) -> None:
    """Keeping the store on disk (``--data-dir`` and what tunes it)."""
    parser.add_argument(
        "--data-dir",
        metavar="DIR",
        help="keep an append-only log and snapshots in DIR so a restart loses nothing "
        "(default: in memory only)",
    )
    parser.add_argument(
        "--fsync",
        choices=("always", "interval", "never"),
        default="always",
        help="with --data-dir: fsync before acknowledging each write (always; concurrent writes "
        "share an fsync), every 50 ms in the background (interval), or only at snapshots "
        "(never). A killed process loses nothing under any policy; a power cut can lose "
        "unsynced writes.",
    )
    parser.add_argument(
        "--snapshot-every",
        type=int,
        default=10_000,
        metavar="N",
        help="with --data-dir: write a snapshot and restart the log every N records",
    )
    parser.add_argument(
        "--accept-data-loss",
        action="store_true",
        help="with --data-dir: start although the directory is damaged (a damaged or missing "
        "snapshot or log, a gap in the records), from its last consistent state; the damaged "
        "files are kept aside and the loss is logged. Without it such a directory is refused "
        "with what is damaged and how many records that affects.",
    )


def _security_flags(parser: argparse.ArgumentParser) -> None:
    """The bearer token and TLS."""
    parser.add_argument(
        "--token-file",
        metavar="F",
        help="require 'Authorization: Bearer <token>' with the token in F on every route but "
        "/healthz",
    )
    parser.add_argument("--tls-cert", metavar="F", help="serve HTTPS with this PEM certificate")
    parser.add_argument("--tls-key", metavar="F", help="the PEM private key of --tls-cert")


def _limit_flags(parser: argparse.ArgumentParser) -> None:
    """The largest key and value accepted, the watches served, the history kept."""
    parser.add_argument(
        "--max-value-bytes",
        type=int,
        default=1024 * 1024,
        metavar="N",
        help="largest value accepted (default: 1 MiB)",
    )
    parser.add_argument(
        "--max-key-bytes",
        type=int,
        default=4096,
        metavar="N",
        help="largest key accepted, in UTF-8 bytes (default: 4096)",
    )
    parser.add_argument(
        "--max-watches",
        type=int,
        default=SERVE_MAX_WATCHES,
        metavar="N",
        help="serve at most N watches at once, over sessions and REST streams together: beyond, "
        f"503 too_many_watches (default: {SERVE_MAX_WATCHES:,}, room for 10,000 sessions' "
        "rendezvous watches)",
    )
    parser.add_argument(
        "--history-limit",
        type=int,
        default=SERVE_HISTORY_LIMIT,
        metavar="N",
        help="keep the last N events for watches to resume from; older ones are compacted "
        f"(default: {SERVE_HISTORY_LIMIT:,}; a rendezvous of N nodes writes N events at once: "
        "below that, slow watchers fall behind a compaction and read everything again)",
    )


def _serving_flags(parser: argparse.ArgumentParser) -> None:
    """The event loop, timeouts, connections and sessions."""
    parser.add_argument(
        "--loop",
        choices=("auto", "asyncio", "uvloop"),
        default="auto",
        help="event loop: uvloop roughly halves the CPU per request (auto: uvloop when it is "
        "installed, as with pip install uvloop)",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="on SIGTERM, wait up to S seconds for in-flight requests",
    )
    parser.add_argument(
        "--read-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="close a connection (408) whose first request's headers take more than S seconds "
        "to arrive after it connects (or its TLS handshake more than S), a request's headers "
        "more than S after their first byte, or its body more than S after them (default: 30; "
        "idle keep-alive connections and watch streams are not affected)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=None,
        metavar="N",
        help="hold at most N client connections: beyond, the oldest one that has sent nothing "
        "is closed, or the new one is answered 503 too_many_connections (/healthz still "
        "answers). Default: what the open-file limit allows (raised to its hard limit at start)",
    )
    parser.add_argument(
        "--session-grace",
        type=float,
        default=0.25,
        metavar="S",
        help="revoke the leases of a session S seconds after its connection ends, unless the "
        "client resumed it meanwhile (default: 0.25; 0: at once)",
    )


def main(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; 0 on a clean stop, 2 on bad flags."""
    import sys

    options = _options(args)
    if isinstance(options, str):
        print(f"aioelastic serve: {options}", file=sys.stderr)
        return 2
    loop_factory = _loop_factory(args.loop)
    if isinstance(loop_factory, str):
        print(f"aioelastic serve: {loop_factory}", file=sys.stderr)
        return 2
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(_serve(options))


def _loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | str | None:
    """The loop factory for ``--loop`` (None: asyncio's), or an error message."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            return "--loop uvloop needs the uvloop package (pip install uvloop)"
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _options(args: argparse.Namespace) -> dict[str, Any] | str:
    import math
    import ssl

    from .client import read_token_file

    if not 0 <= args.port <= 65535:
        return f"--port must be in 0..65535, got {args.port}"
    if args.max_value_bytes < 0:
        return f"--max-value-bytes must be >= 0, got {args.max_value_bytes}"
    if args.max_key_bytes < 1:
        return f"--max-key-bytes must be >= 1, got {args.max_key_bytes}"
    if args.snapshot_every < 1:
        return f"--snapshot-every must be >= 1, got {args.snapshot_every}"
    if not math.isfinite(args.read_timeout) or args.read_timeout <= 0:
        return f"--read-timeout must be a finite number of seconds > 0, got {args.read_timeout}"
    if not math.isfinite(args.session_grace) or args.session_grace < 0:
        return f"--session-grace must be a number of seconds >= 0, got {args.session_grace}"
    if args.max_connections is not None and args.max_connections < 1:
        return f"--max-connections must be >= 1, got {args.max_connections}"
    if args.max_watches < 1:
        return f"--max-watches must be >= 1, got {args.max_watches}"
    if args.history_limit < 1:
        return f"--history-limit must be >= 1, got {args.history_limit}"
    options: dict[str, Any] = {
        "host": args.host,
        "port": args.port,
        "data_dir": args.data_dir,
        "fsync": args.fsync,
        "snapshot_every": args.snapshot_every,
        "accept_data_loss": args.accept_data_loss,
        "max_value_bytes": args.max_value_bytes,
        "max_key_bytes": args.max_key_bytes,
        "shutdown_timeout": args.shutdown_timeout,
        "read_timeout": args.read_timeout,
        "session_grace": args.session_grace,
        "max_connections": args.max_connections,
        "max_watch_streams": args.max_watches,
        "history_limit": args.history_limit,
    }
    if args.token_file is not None:
        try:
            options["token"] = read_token_file(args.token_file)
        except ValueError as exc:
            return f"--token-file: {exc}"
    if (args.tls_cert is None) != (args.tls_key is None):
        return "--tls-cert and --tls-key go together"
    if args.tls_cert is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as exc:
            return f"--tls-cert/--tls-key cannot be loaded: {exc}"
        options["ssl_context"] = context
    return options


async def _serve(options: dict[str, Any]) -> int:
    import signal
    import sys

    from ._connections import raise_open_file_limit
    from ._persist import CorruptDataDirError
    from .server import HttpStoreServer

    before, after = raise_open_file_limit()
    if after != before:
        print(f"aioelastic serve: open-file limit raised from {before} to {after}", flush=True)
    server = HttpStoreServer(**options)
    # This process is the server's: asyncio's accept errors (EMFILE) are limited too, to its end.
    server.log_limiter.attach("asyncio")
    try:
        await server.start()
    except (OSError, RuntimeError, CorruptDataDirError) as exc:
        print(f"aioelastic serve: cannot start: {exc}", file=sys.stderr)
        return 1
    if server.data is not None and server.data.data_loss is not None:
        print(f"aioelastic serve: ACCEPTED DATA LOSS: {server.data.data_loss}", file=sys.stderr)
    if server.data is not None:
        where = (
            f"data dir {str(server.data.path)!r} (fsync {server.data.fsync}), "
            f"revision {server.engine.revision}, {len(server.engine)} keys, "
            f"{server.engine.lease_count} leases restored with their TTL restarted"
        )
    else:
        where = "in memory only: everything is lost when the server stops (use --data-dir)"
    auth = "token required" if options.get("token") else "no authentication"
    loop = type(asyncio.get_running_loop()).__module__.partition(".")[0]
    limits = f"at most {server.max_connections} connections, backlog {server.backlog}"
    print(
        f"aioelastic serve: listening on {server.url} ({where}; {auth}; {loop} loop; {limits})",
        flush=True,
    )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        print("aioelastic serve: stopping (finishing requests, ending watches)", flush=True)
        await server.stop()
        print("aioelastic serve: stopped", flush=True)
    return 0
