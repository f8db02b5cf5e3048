"""The test suite's shared fixtures (its shared helpers are the ``helpers`` package here).

- ``out``: a directory for the agent's workers' records, checked for processes left behind;
- ``server``: an HTTP store server on the test's own loop (values up to 1,000 bytes, keys up to
  100), fresh for each test;
- ``http_server``: a real HTTP store server (``ServerThread``) for the test module;
- ``etcd``: a real single-member etcd for the test module (skipped without an etcd binary).

The last two are module-scoped, as each module had them: a module's tests share one server, and
no module sees another's keys or revisions. A module that needs a server configured otherwise (a
token, auth, metrics, no size limits) defines a fixture of the same name, which overrides these.
The public fixtures of ``aioelastic.testing.pytest_plugin`` (``aioelastic_etcd``,
``aioelastic_http_server``, ...) are session-wide, shared across modules.

The test process forks a great deal (servers, agents, etcd members, workers) with gRPC loaded by
the etcd tests; gRPC's fork handlers crash such a child now and then ("epoll_wait error: Bad file
descriptor", SIGABRT before exec). aioelastic's etcd client turns fork support off when it is
imported first (aioelastic/_etcd/__init__.py); test modules that import grpc themselves come
first in some orders, so it is set here too, before any of them.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio
from helpers.agent import _assert_no_orphans

from aioelastic.store.http.server import HttpStoreServer  # (imports no gRPC)
from aioelastic.testing.http import ServerThread

if TYPE_CHECKING:
    from aioelastic.etcd_server import EtcdServer

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


@pytest.fixture
def out(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "out"
    d.mkdir()
    yield d
    _assert_no_orphans(str(d))


@pytest_asyncio.fixture
async def server() -> AsyncIterator[HttpStoreServer]:
    async with HttpStoreServer(port=0, max_value_bytes=1000, max_key_bytes=100) as srv:
        yield srv


@pytest.fixture(scope="module")
def http_server() -> Iterator[ServerThread]:
    with ServerThread() as server:
        yield server


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    from aioelastic.testing.etcd import running_etcd

    with running_etcd() as server:
        yield server
