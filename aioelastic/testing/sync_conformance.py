"""The coordination-primitives conformance suite: lock, election, barriers, events, parameters
and job state, run against any store backend.

Subclass :class:`SyncConformance` in a pytest module, name it ``Test...``, and implement
:meth:`~SyncConformance.open_store` so that each call opens a *new client of the same store*
(several clients act as separate processes)::

    class TestSyncOnMyStore(SyncConformance):
        def open_store(self):
            return open_store("http://127.0.0.1:2380")

Each test runs in its own event loop (virtual time when ``virtual_time = True``), inside a fresh
namespace of the store. Every client is wrapped in a
:class:`~aioelastic.testing.FaultInjectingStore`, so tests can count store calls (no polling, no
thundering herd) and cut a client off (a crashed or partitioned process).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import ClassVar

import anyio

from ..store import Store
from ..sync import LeaseConfig
from ._barrier_sync_conformance import BarrierConformance
from ._election_sync_conformance import ElectionConformance
from ._lock_sync_conformance import LockConformance
from ._state_sync_conformance import StateConformance
from ._sync_kit import _Body
from ._virtual_time import virtual_time_loop
from .faults import FaultInjectingStore

__all__ = ["SyncConformance", "SyncEnv"]


class SyncEnv:
    """What a test gets: new clients of the store under test, and the lease timing to use."""

    def __init__(self, suite: SyncConformance, stack: contextlib.AsyncExitStack) -> None:
        self.suite = suite
        self.config = suite.config
        self.slack = suite.timing_slack
        self._settle_factor = suite.settle_factor
        self._stack = stack
        self._namespace = f"sync-conformance/{uuid.uuid4().hex}/"

    async def settle(self, seconds: float) -> None:
        """Let a step land before the next (a few store round trips), scaled for the backend."""
        await anyio.sleep(seconds * self._settle_factor)

    async def client(self) -> FaultInjectingStore:
        """A new client (a separate "process"), namespaced to this test."""
        store = await self._stack.enter_async_context(self.suite.open_store())
        faulty = FaultInjectingStore(store.namespace(self._namespace))
        self._stack.push_async_callback(faulty.aclose)
        return faulty

    async def clients(self, count: int) -> list[FaultInjectingStore]:
        return [await self.client() for _ in range(count)]

    def now(self) -> float:
        return asyncio.get_running_loop().time()


class SyncConformance(LockConformance, ElectionConformance, BarrierConformance, StateConformance):
    """The suite. Subclasses implement :meth:`open_store` and may set the class attributes.

    The tests live in themed mixins (lock, election, barriers, events/parameters/job state);
    this class holds the hooks and runs each test."""

    #: Lease timing for the primitives under test (etcd grants whole seconds: keep ttl >= 2).
    config: ClassVar[LeaseConfig] = LeaseConfig(ttl=3.0, renew_deadline=2.0, retry_period=0.5)
    #: Allowed lateness of a timed event, in seconds (generous for real servers under load).
    timing_slack: ClassVar[float] = 1.0
    #: Scales the short pauses that let a step land before the next (3x for real servers, whose
    #: round trips stretch on a loaded machine; free on a virtual-time loop).
    settle_factor: ClassVar[float] = 3.0
    #: Run each test on a virtual-time loop (only for in-process backends).
    virtual_time: ClassVar[bool] = False
    #: Bound on each test, in (loop) seconds.
    test_timeout: ClassVar[float] = 60.0

    def open_store(self) -> contextlib.AbstractAsyncContextManager[Store]:
        """A new client of the store under test (each call: another "process")."""
        raise NotImplementedError("subclasses of SyncConformance implement open_store()")

    def run(self, body: _Body) -> None:
        factory = virtual_time_loop if self.virtual_time else None
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(self._run(body))

    async def _run(self, body: _Body) -> None:
        with anyio.fail_after(self.test_timeout):
            async with contextlib.AsyncExitStack() as stack:
                await body(self, SyncEnv(self, stack))
