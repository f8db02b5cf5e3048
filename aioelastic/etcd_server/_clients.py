"""Clients of an :class:`~aioelastic.etcd_server.EtcdServer`'s members: the gRPC clients the
launcher itself uses, and the stores it opens for users (credentials and TLS filled in)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._etcd.client import EtcdClient
    from ..store import Store
    from ._server import EtcdServer

__all__ = ["member_client", "open_server_store", "store_options"]


def store_options(server: EtcdServer) -> dict[str, Any]:
    """Keyword arguments for ``open_store(server.url, ...)``: credentials and TLS files."""
    options: dict[str, Any] = {}
    if server.auth is not None:
        options.update(username=server.auth[0], password=server.auth[1])
    if server.tls_ca is not None:
        options["ca_file"] = server.tls_ca
    if server.client_cert is not None:
        options.update(cert_file=server.client_cert, key_file=server.client_key)
    return options


def member_client(
    server: EtcdServer, endpoints: Sequence[str], timeout: float, **options: Any
) -> EtcdClient:
    """A gRPC client of ``endpoints`` speaking TLS as the server's clients do."""
    from .._etcd.client import EtcdClient, TLSConfig

    tls = None
    if server.tls:
        tls = TLSConfig(server.tls_ca, server.client_cert, server.client_key)
    return EtcdClient(endpoints, tls=tls, timeout=timeout, **options)


def open_server_store(server: EtcdServer, run_id: str | None, options: dict[str, Any]) -> Store:
    """:meth:`EtcdServer.open_store <aioelastic.etcd_server.EtcdServer.open_store>`."""
    from ..store import PrefixedStore
    from ..store.etcd import EtcdStore, TLSConfig

    settings = {**store_options(server), **options}
    tls_files = {k: settings.pop(k) for k in ("ca_file", "cert_file", "key_file") if k in settings}
    tls = TLSConfig(**tls_files) if server.tls or tls_files else None
    store = EtcdStore(server.endpoints, tls=tls, **settings)
    if run_id is None:
        return store

    class _OwningNamespace(PrefixedStore):
        async def _aclose(self) -> None:
            await self.parent.aclose()

    return _OwningNamespace(store, f"/aioelastic/{run_id}/")
