"""aioelastic's pytest plugin (entry point ``pytest11``): fixtures for stores and servers.

Installed with aioelastic, so any project's tests can request:

- ``aioelastic_memory_store`` — a fresh :class:`~aioelastic.store.MemoryStore` per test;
- ``aioelastic_http_server`` — one real HTTP store server on 127.0.0.1 for the session
  (``.url``; open clients with ``open_store(server.url)`` in your test's loop);
- ``aioelastic_etcd`` — one real single-member etcd for the session (``.url``, ``.endpoints``,
  ``await .open_store(run_id)``); skipped with a message if no etcd binary is installed;
- ``aioelastic_etcd_cluster`` — a real 3-member etcd cluster for the session.

Every fixture is synchronous and owns no event loop, cancel scope or task group across its
``yield``, so it works the same under pytest-asyncio (whose async fixtures set up and tear down
in different tasks), anyio's pytest plugin, or tests that run their own loop. Servers run in a
thread or in child processes; the memory store binds to the loop of its first use.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from ..store import MemoryStore

if TYPE_CHECKING:
    from ..etcd_server import EtcdServer
    from .http import ServerThread


@pytest.fixture
def aioelastic_memory_store() -> Iterator[MemoryStore]:
    """A fresh in-process store (private engine), closed after the test."""
    store = MemoryStore()
    yield store
    store.engine.close()


@pytest.fixture(scope="session")
def aioelastic_http_server() -> Iterator[ServerThread]:
    """A real HTTP store server on 127.0.0.1 (a free port) for the whole session."""
    from .http import ServerThread

    with ServerThread() as server:
        yield server


@pytest.fixture(scope="session")
def aioelastic_etcd() -> Iterator[EtcdServer]:
    """A real single-member etcd (fast election, no fsync) for the whole session."""
    from .etcd import running_etcd

    with running_etcd() as server:
        yield server


@pytest.fixture(scope="session")
def aioelastic_etcd_cluster() -> Iterator[EtcdServer]:
    """A real 3-member etcd cluster on loopback for the whole session."""
    from .etcd import running_etcd

    with running_etcd(members=3) as server:
        yield server
