"""The store conformance suite: one set of tests that every :class:`~aioelastic.store.Store`
backend must pass, importable by third-party backends.

Subclass :class:`StoreConformance` in a pytest module, name it ``Test...``, and implement
:meth:`~StoreConformance.open_store`::

    class TestMyStore(StoreConformance):
        features = frozenset({"compaction"})   # optional features the backend has
        short_ttl = 1.0                        # a lease TTL (s) the backend honours

        @contextlib.asynccontextmanager
        async def open_store(self):
            async with MyStore(...) as store:
                yield store

Each test runs in its own event loop (a virtual-time loop when ``virtual_time = True``, for
in-process backends), inside a fresh namespace of the store, so a shared server is fine. Tests of
a feature the backend does not declare are skipped with a reason, never silently passed. The
suite needs pytest (``aioelastic[test]``).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import ClassVar, TypeVar

import anyio

from ..store import MemoryStore, Store, open_store
from ..store._base import ALL_FEATURES
from ._conformance_kit import _Body
from ._kv_conformance import KvConformance
from ._lease_conformance import LeaseConformance
from ._stm_conformance import StmConformance
from ._txn_conformance import TxnConformance
from ._usage_conformance import UsageConformance
from ._virtual_time import virtual_time_loop
from ._watch_conformance import WatchConformance

__all__ = ["ALL_FEATURES", "StoreConformance"]

T = TypeVar("T")


class StoreConformance(
    KvConformance,
    WatchConformance,
    LeaseConformance,
    UsageConformance,
    TxnConformance,
    StmConformance,
):
    """The suite. Subclasses implement :meth:`open_store` and may set the class attributes.

    The tests live in themed mixins (key-values, watches, leases, conveniences and errors,
    transactions, software transactions); this class holds the hooks and runs each test."""

    #: Optional features of the backend (see ``aioelastic.store._base.ALL_FEATURES``).
    features: ClassVar[frozenset[str]] = ALL_FEATURES
    #: A lease TTL in seconds that the backend honours; lease tests wait a few of these.
    short_ttl: ClassVar[float] = 1.0
    #: Run each test on a virtual-time loop (only for backends with no real I/O).
    virtual_time: ClassVar[bool] = False
    #: How long (s) a watch sits idle in the idle-watch test: past a few of the backend's
    #: progress intervals, if it has them (the http suite's is 0.5 s).
    watch_idle: ClassVar[float] = 2.0
    #: The connected client a test's store belongs to (set while the test runs).
    client: Store
    #: Bound on each test, in (loop) seconds.
    test_timeout: ClassVar[float] = 60.0

    def open_store(self) -> contextlib.AbstractAsyncContextManager[Store]:
        """An async context manager yielding a connected store client (closed on exit)."""
        raise NotImplementedError("subclasses of StoreConformance implement open_store()")

    @contextlib.asynccontextmanager
    async def open_peer(self, client: Store) -> AsyncIterator[Store]:
        """A second client of the same store as ``client`` (for tests of two clients at once).

        The default is another client of the same engine for a :class:`MemoryStore`, else
        another :meth:`open_store`; a backend whose clients do not share a store that way
        overrides it (the tests check that the two see each other's writes)."""
        if isinstance(client, MemoryStore):
            async with MemoryStore(client.engine) as peer:
                yield peer
            return
        async with self.open_store() as peer:
            yield peer

    # -- running

    def run(self, body: _Body, *, namespaced: bool = True) -> None:
        factory = virtual_time_loop if self.virtual_time else None
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(self._run(body, namespaced))

    async def _run(self, body: _Body, namespaced: bool) -> None:
        with anyio.fail_after(self.test_timeout):
            async with self.open_store() as client:
                self.client = client
                store = (
                    client.namespace(f"conformance/{uuid.uuid4().hex}/") if namespaced else client
                )
                await body(self, store)


@contextlib.asynccontextmanager
async def memory_store() -> AsyncIterator[Store]:  # pragma: no cover - convenience for users
    async with open_store("memory://") as store:
        yield store
