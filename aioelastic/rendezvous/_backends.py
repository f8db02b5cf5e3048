"""The built-in rendezvous backends: build a store with ``open_store(url)`` and a handler on it.

``memory`` (endpoint = a shared in-process store name), ``http``/``https``/``c10d`` (endpoint =
``host[:port]`` of an ``aioelastic serve``; port 29400 like torch's c10d), ``etcd`` (endpoint =
``host[:port][,host[:port]...]``, port 2379), ``static`` (a fixed rank from ``rank``; its store
is chosen by ``store_url`` or else the endpoint as for ``c10d``, or ``memory`` when the endpoint
is empty). ``store_url`` in the config overrides the store URL for any backend.

torchrun ``--rdzv-conf`` keys understood: ``join_timeout``, ``last_call_timeout``,
``close_timeout``, ``keep_alive_interval``, ``keep_alive_max_attempt`` (the lease TTL is their
product unless ``lease_ttl`` is given), ``lease_ttl``, ``node_id``, ``reopen_closed``,
``fast_reform``, ``participants``, ``rank`` (static), ``store_url``, and the store's
credentials: ``token_file``
(http/https: a file holding the bearer token), ``username`` and ``password_file`` (etcd: a file
holding the password; never the password itself, which would show in ``ps``). Keys torch accepts
that mean nothing here (``timeout``, ``heartbeat_timeout``, ``read_timeout``, ``is_host``,
``store_type``, ``use_libuv``) are accepted and ignored; any other key is logged and ignored,
as torch does.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from .._secrets import redact_url
from ..errors import ConfigError
from ..store import open_store
from ._addr import looked_up_default_addr
from .api import RendezvousHandler, RendezvousParameters, handler_registry
from .dynamic import DEFAULTS, DynamicRendezvousHandler
from .static import StaticRendezvousHandler

if TYPE_CHECKING:
    from ..store import Store

__all__ = ["check_params", "register_builtin_backends", "store_url_for"]

log = logging.getLogger("aioelastic.rendezvous")

_KNOWN_KEYS = {
    "join_timeout",
    "last_call_timeout",
    "close_timeout",
    "keep_alive_interval",
    "keep_alive_max_attempt",
    "lease_ttl",
    "node_id",
    "reopen_closed",
    "fast_reform",
    "participants",
    "rank",
    "store_url",
    "token_file",
    "username",
    "password_file",
    "master_addr",
    "master_port",
    # accepted for torchrun compatibility, no effect here
    "timeout",
    "heartbeat_timeout",
    "read_timeout",
    "is_host",
    "store_type",
    "use_libuv",
    "local_addr",
}

_DEFAULT_PORTS = {"http": 29400, "https": 29400, "c10d": 29400, "etcd": 2379, "static": 29400}


def _host_port(endpoint: str, default_port: int) -> str:
    """``host[:port]`` or ``[v6]:port`` with the default port filled in ('' -> localhost)."""
    endpoint = endpoint.strip()
    if not endpoint:
        return f"localhost:{default_port}"
    if endpoint.startswith("["):
        host, sep, rest = endpoint.partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ConfigError("endpoint", redact_url(endpoint), "host[:port] or [ipv6]:port")
        host += "]"
        port_text = rest[1:]
    elif endpoint.count(":") == 1:
        host, _, port_text = endpoint.partition(":")
    elif ":" in endpoint:  # a bare IPv6 address
        host, port_text = f"[{endpoint}]", ""
    else:
        host, port_text = endpoint, ""
    if not host:
        raise ConfigError("endpoint", redact_url(endpoint), "host[:port] or [ipv6]:port")
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ConfigError("endpoint", redact_url(endpoint), "a port in 1..65535 after ':'")
        return f"{host}:{int(port_text)}"
    return f"{host}:{default_port}"


def store_url_for(params: RendezvousParameters) -> str:
    """The store URL a backend opens for ``params`` (``store_url`` in the config wins)."""
    url = params.get("store_url")
    if url is not None:
        if not isinstance(url, str) or "://" not in url:
            raise ConfigError("store_url", redact_url(url), "a store URL such as http://host:port")
        return url
    backend, endpoint = params.backend, params.endpoint
    if backend == "memory" or (backend == "static" and not endpoint.strip()):
        # a run id may hold ':' and '@', which a memory store's name may not: quote them
        name = endpoint.strip() or f"rdzv-{quote(params.run_id, safe='')}"
        if any(c in name for c in "/:?#@[] "):
            raise ConfigError("endpoint", endpoint, "a plain name for the shared memory store")
        return f"memory://{name}"
    if backend == "etcd":
        hosts = [_host_port(part, 2379) for part in endpoint.split(",") if part.strip()]
        return "etcd://" + ",".join(hosts or [_host_port("", 2379)])
    scheme = "https" if backend == "https" else "http"
    return f"{scheme}://{_host_port(endpoint, _DEFAULT_PORTS.get(backend, 29400))}"


def _lease(params: RendezvousParameters) -> tuple[float, float]:
    """``(lease_ttl, keep_alive_interval)`` from the config."""
    unknown = sorted(set(params.config) - _KNOWN_KEYS)
    if unknown:
        log.warning("rendezvous config keys %s are unknown and ignored", unknown)
    interval = params.get_as_seconds("keep_alive_interval", DEFAULTS["keep_alive_interval"])
    attempts = params.get_as_int("keep_alive_max_attempt", int(DEFAULTS["keep_alive_max_attempt"]))
    assert interval is not None
    assert attempts is not None
    if attempts < 1:
        raise ConfigError("keep_alive_max_attempt", attempts, "an integer >= 1")
    ttl = params.get_as_seconds("lease_ttl", interval * attempts)
    assert ttl is not None
    if interval >= ttl:
        interval = ttl / 3
    return ttl, interval


async def _open(params: RendezvousParameters) -> Store:
    url = store_url_for(params)
    scheme = url.partition("://")[0]
    allowed = {"http": ("token_file",), "https": ("token_file",)}.get(
        scheme, ("username", "password_file") if scheme in ("etcd", "etcds") else ()
    )
    options: dict[str, str] = {}
    for key in ("token_file", "username", "password_file"):
        value = params.get(key)
        if value is None:
            continue
        if key not in allowed or not isinstance(value, str) or not value:
            raise ConfigError(key, value, _CREDENTIAL_FORMS[key])
        options[key] = value
    return await open_store(url, **options)


_CREDENTIAL_FORMS = {
    "token_file": "a file holding the bearer token, for http(s) stores",
    "username": "an etcd user name, for etcd stores",
    "password_file": "a file holding the etcd password, for etcd stores",
}


def _dynamic_options(params: RendezvousParameters) -> dict[str, Any]:
    """The dynamic handler's keyword arguments from the config (``ConfigError`` naming a key)."""
    ttl, interval = _lease(params)
    join_timeout = params.get_as_seconds("join_timeout", DEFAULTS["join_timeout"])
    last_call = params.get_as_seconds(
        "last_call_timeout", DEFAULTS["last_call_timeout"], allow_zero=True
    )
    close_timeout = params.get_as_seconds("close_timeout", DEFAULTS["close_timeout"])
    reopen = params.get_as_bool("reopen_closed", False)
    fast_reform = params.get_as_bool("fast_reform", True)
    participants = params.get_as_bool("participants", True)
    node_id = params.get("node_id")
    if node_id is not None and not isinstance(node_id, str):
        raise ConfigError("node_id", node_id, "a string")
    assert join_timeout is not None
    assert last_call is not None
    assert close_timeout is not None
    return {
        "join_timeout": join_timeout,
        "last_call_timeout": last_call,
        "close_timeout": close_timeout,
        "lease_ttl": ttl,
        "keep_alive_interval": interval,
        "node_id": node_id,
        "local_addr": params.local_addr,
        "reopen_closed": bool(reopen),
        "fast_reform": bool(fast_reform),
        "participants": bool(participants),
    }


async def _create_dynamic(params: RendezvousParameters) -> RendezvousHandler:
    options = _dynamic_options(params)
    store = await _open(params)
    try:
        handler = DynamicRendezvousHandler(
            store,
            params.run_id,
            params.min_nodes,
            params.max_nodes,
            **options,
            backend=params.backend,
            owns_store=True,
        )
        await handler._prepare()  # a first join's one-time work, now
        return handler
    except BaseException:
        await store.aclose()
        raise


def _static_options(params: RendezvousParameters) -> dict[str, Any]:
    """The static handler's keyword arguments from the config (``ConfigError`` naming a key)."""
    if params.min_nodes != params.max_nodes:
        raise ConfigError(
            "nnodes",
            f"{params.min_nodes}:{params.max_nodes}",
            "a fixed N: the static rendezvous needs min_nodes == max_nodes",
        )
    rank = params.get_as_int("rank")
    if rank is None:
        raise ConfigError("rank", None, "this node's rank, an integer in 0..world_size-1")
    if not 0 <= rank < params.max_nodes:
        raise ConfigError("rank", rank, f"an integer in 0..{params.max_nodes - 1}")
    ttl, interval = _lease(params)
    join_timeout = params.get_as_seconds("join_timeout", DEFAULTS["join_timeout"])
    master_port = params.get_as_int("master_port")
    master_addr = params.get("master_addr")
    assert join_timeout is not None
    return {
        "rank": rank,
        "join_timeout": join_timeout,
        "lease_ttl": ttl,
        "keep_alive_interval": interval,
        "local_addr": params.local_addr,
        "master_addr": master_addr if isinstance(master_addr, str) else None,
        "master_port": master_port,
    }


async def _create_static(params: RendezvousParameters) -> RendezvousHandler:
    options = _static_options(params)
    rank = options.pop("rank")
    store = await _open(params)
    try:
        handler = StaticRendezvousHandler(
            store, params.run_id, rank, params.max_nodes, **options, owns_store=True
        )
        if options["local_addr"] is None and options["master_addr"] is None:
            await looked_up_default_addr()  # the lookup the handler started, off the loop
        return handler
    except BaseException:
        await store.aclose()
        raise


def check_params(params: RendezvousParameters) -> None:
    """Check ``params`` as creating its handler would, without opening a store.

    ``ConfigError`` names the bad key and the expected form (``rdzv_backend`` for an unknown
    backend). A backend registered by someone else is only checked for being registered.
    """
    register_builtin_backends()
    if params.backend not in handler_registry.backends():
        raise ConfigError(
            "rdzv_backend", params.backend, "one of " + ", ".join(handler_registry.backends())
        )
    if params.backend == "static":
        _static_options(params)
    elif params.backend in _DYNAMIC:
        _dynamic_options(params)
    else:
        return
    store_url_for(params)


_DYNAMIC = ("memory", "http", "https", "c10d", "etcd")
_registered = False


def register_builtin_backends() -> None:
    """Register ``memory``, ``http``, ``https``, ``c10d``, ``etcd`` and ``static`` (idempotent)."""
    global _registered
    if _registered:
        return
    for name in _DYNAMIC:
        handler_registry.register(name, _create_dynamic)
    handler_registry.register("static", _create_static)
    _registered = True
