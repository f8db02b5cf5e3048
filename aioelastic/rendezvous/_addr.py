"""What a node publishes for rank 0's collective: its host name and a free TCP port.

The host name is ``socket.getfqdn()``, a DNS lookup that can block for seconds on a host with a
slow resolver. :func:`prefetch_default_addr` starts it in a thread when a handler is created, and
the handler creators of the registry wait for it off the event loop, so that a join never looks
it up itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading

_lock = threading.Lock()
_lookup: concurrent.futures.Future[str] | None = None


def prefetch_default_addr() -> concurrent.futures.Future[str]:
    """Start looking this host's name up in a thread (once per process); the lookup's future."""
    global _lookup
    with _lock:
        if _lookup is None:
            _lookup = concurrent.futures.Future()
            threading.Thread(
                target=_look_up, args=(_lookup,), name="aioelastic-getfqdn", daemon=True
            ).start()
        return _lookup


def _look_up(future: concurrent.futures.Future[str]) -> None:
    future.set_running_or_notify_cancel()  # running: a waiter's cancellation cannot cancel it
    try:
        future.set_result(socket.getfqdn())
    except BaseException as exc:  # pragma: no cover - getfqdn falls back, it does not raise
        future.set_exception(exc)


def default_addr() -> str:
    """This host's fully qualified name, from the lookup started when the handler was created.

    At once when that lookup is done (the usual case: creation and the first join are apart, or
    the creator awaited :func:`looked_up_default_addr`); else it waits for the rest of it.
    """
    return prefetch_default_addr().result()


async def looked_up_default_addr() -> str:
    """Wait for this host's name without blocking the event loop (for handler creators)."""
    lookup = prefetch_default_addr()
    if lookup.done():
        return lookup.result()
    return await asyncio.shield(asyncio.wrap_future(lookup))


def free_port() -> int:
    """A TCP port free right now, for rank 0's collective (torch picks it the same way)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        port: int = sock.getsockname()[1]
        return port
