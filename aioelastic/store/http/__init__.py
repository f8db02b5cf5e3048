"""The HTTP backend: ``aioelastic serve`` (an aiohttp server over the shared memory engine) and
its client for ``http://`` and ``https://`` store URLs.

The server and the client are imported only when used: ``open_store("http://...")`` loads
:mod:`.client`, ``aioelastic serve`` loads :mod:`.server`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["HttpStore", "HttpStoreServer", "make_app", "open_http_store"]

if TYPE_CHECKING:
    from .client import HttpStore, open_http_store
    from .server import HttpStoreServer, make_app


def __getattr__(name: str) -> Any:
    if name in ("HttpStore", "open_http_store"):
        from . import client

        return getattr(client, name)
    if name in ("HttpStoreServer", "make_app"):
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
