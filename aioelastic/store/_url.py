"""open_store(url): choose a backend by URL scheme, importing it only when its scheme is used."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Generator
from types import TracebackType
from typing import Any
from urllib.parse import SplitResult, urlsplit

from .._secrets import redact_url
from ._base import Store

__all__ = ["StoreOpener", "open_store", "register_backend", "supported_schemes"]

#: A backend's opener: ``async (url parts, options) -> Store``.
BackendOpener = Callable[[SplitResult, dict[str, Any]], Awaitable[Store]]

# scheme -> "module:function" (imported on first use) or an opener registered at run time.
_BACKENDS: dict[str, str | BackendOpener] = {
    "memory": "aioelastic.store.memory:open_memory_store",
    "http": "aioelastic.store.http.client:open_http_store",
    "https": "aioelastic.store.http.client:open_http_store",
    "etcd": "aioelastic.store.etcd:open_etcd_store",
    "etcds": "aioelastic.store.etcd:open_etcd_store",
}


def register_backend(scheme: str, opener: str | BackendOpener) -> None:
    """Make ``open_store`` handle ``scheme://`` URLs with ``opener``.

    ``opener`` is ``async (SplitResult, options) -> Store`` or a ``"module:function"`` string
    naming one (imported on first use, so an unused backend costs nothing).
    """
    if not isinstance(scheme, str) or not scheme.isidentifier():
        raise ValueError(f"scheme must be a plain word such as 'redis', got {scheme!r}")
    _BACKENDS[scheme.lower()] = opener


def supported_schemes() -> list[str]:
    return sorted(_BACKENDS)


def _resolve(scheme: str) -> BackendOpener:
    entry = _BACKENDS[scheme]
    if isinstance(entry, str):
        module_name, _, attr = entry.partition(":")
        module = importlib.import_module(module_name)
        entry = getattr(module, attr)
        assert callable(entry)
        _BACKENDS[scheme] = entry
    return entry


def parse_store_url(url: str) -> SplitResult:
    """Split ``url`` and check it names a known backend; ``ValueError`` naming ``url`` (its
    password redacted) if not."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ValueError(f"url is malformed: {shown!r} ({exc})") from None
    if "://" not in url or not parts.scheme:
        raise ValueError(
            f"url must look like scheme://..., got {shown!r} "
            f"(supported schemes: {', '.join(supported_schemes())})"
        )
    if parts.scheme not in _BACKENDS:
        raise ValueError(
            f"url {shown!r} has an unsupported scheme {parts.scheme!r} "
            f"(supported: {', '.join(supported_schemes())})"
        )
    return parts


class StoreOpener:
    """What :func:`open_store` returns: ``await`` it for a store, or ``async with`` it."""

    def __init__(self, parts: SplitResult, options: dict[str, Any]) -> None:
        self._parts = parts
        self._options = options
        self._store: Store | None = None

    async def _open(self) -> Store:
        opener = _resolve(self._parts.scheme)
        return await opener(self._parts, dict(self._options))

    def __await__(self) -> Generator[Any, None, Store]:
        return self._open().__await__()

    async def __aenter__(self) -> Store:
        self._store = await self._open()
        return self._store

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._store is not None:
            await self._store.aclose()


def open_store(url: str, **options: Any) -> StoreOpener:
    """Open a store client for ``url``.

    ``memory://`` (a private in-process store), ``memory://NAME`` (shared by every client in this
    event loop that names it). ``http://host:port`` and ``https://host:port``: a client of
    ``aioelastic serve`` (see docs/http-api.md for its options). ``etcd://host:port[,host:port...]``
    (``etcds://``: TLS) speaks to an etcd cluster (needs ``pip install 'aioelastic[etcd]'``).
    ``options`` are backend-specific keyword arguments.

    ``store = await open_store(url)`` or ``async with open_store(url) as store: ...``.
    A malformed URL or an unknown scheme raises ``ValueError`` at once.
    """
    return StoreOpener(parse_store_url(url), options)
