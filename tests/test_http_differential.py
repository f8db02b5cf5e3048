"""Differential state machine: random operation sequences on the HTTP store (a real server on
127.0.0.1 and the real client) and on the memory store give identical results, event streams
included."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from aioelastic.errors import CompactedError, LeaseNotFoundError
from aioelastic.store import MemoryStore, Store, WatchEvent, open_store
from aioelastic.store.http.server import HttpStoreServer

KEYS = st.sampled_from(["a", "a/b", "a/c d", "b%2F", "ü/1", "c", "counter"])
PREFIXES = st.sampled_from(["", "a", "a/", "b", "ü", "zzz"])
VALUES = st.binary(max_size=12)


class HttpMatchesMemory(RuleBasedStateMachine):
    """Each rule runs the same call on both stores (one event loop per example, driven here)."""

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.server = HttpStoreServer(port=0)
        self.run(self.server.start())
        self.http: Store = self.run(self._open())
        self.memory: Store = MemoryStore()
        self.leases: list[int] = []

    async def _open(self) -> Store:
        return await open_store(self.server.url, progress_interval=1.0)

    def run(self, coro: Any) -> Any:
        return self.runner.run(coro)

    def both(self, call: Any) -> Any:
        """``call(store)`` on both; the outcomes (value or exception type) must match."""

        async def outcome(store: Store) -> Any:
            try:
                return ("ok", await call(store))
            except (ValueError, LeaseNotFoundError, CompactedError) as exc:
                return ("error", type(exc).__name__)

        expected = self.run(outcome(self.memory))
        got = self.run(outcome(self.http))
        assert got == expected
        return got[1]

    @rule(key=KEYS, value=VALUES, leased=st.booleans())
    def put(self, key: str, value: bytes, leased: bool) -> None:
        lease = self.leases[-1] if leased and self.leases else 0
        self.both(lambda s: s.put(key, value, lease=lease))

    @rule(key=KEYS)
    def get(self, key: str) -> None:
        self.both(lambda s: s.get(key))

    @rule(prefix=PREFIXES, limit=st.none() | st.integers(1, 3))
    def range(self, prefix: str, limit: int | None) -> None:
        self.both(lambda s: s.range(prefix, limit=limit))

    @rule(key=KEYS)
    def delete(self, key: str) -> None:
        self.both(lambda s: s.delete(key))

    @rule(prefix=PREFIXES)
    def delete_prefix(self, prefix: str) -> None:
        self.both(lambda s: s.delete_prefix(prefix))

    @rule(key=KEYS, value=VALUES, stale=st.booleans())
    def compare_and_swap(self, key: str, value: bytes, stale: bool) -> None:
        current = self.run(self.memory.get(key))
        expected = 0 if current is None else current.mod_revision
        if stale:
            expected += 1
        self.both(lambda s: s.compare_and_swap(key, expected, value))

    @rule(key=KEYS, stale=st.booleans())
    def compare_and_delete(self, key: str, stale: bool) -> None:
        current = self.run(self.memory.get(key))
        expected = 1 if current is None else current.mod_revision + int(stale)
        self.both(lambda s: s.compare_and_delete(key, expected))

    @rule(delta=st.integers(-3, 3))
    def add(self, delta: int) -> None:
        self.both(lambda s: s.add("counter", delta))

    @rule()
    def lease_grant(self) -> None:
        grant = self.both(lambda s: s.lease_grant(3600))
        self.leases.append(grant.id)

    @precondition(lambda self: bool(self.leases))
    @rule()
    def lease_revoke(self) -> None:
        lease = self.leases.pop()
        self.both(lambda s: s.lease_revoke(lease))

    @rule(back=st.integers(0, 3))
    def compact(self, back: int) -> None:
        revision = self.run(self.memory.current_revision())
        if revision - back >= 1:
            self.both(lambda s: s.compact(revision - back))

    @invariant()
    def same_revision(self) -> None:
        self.both(lambda s: s.current_revision())

    def teardown(self) -> None:
        try:
            revision = self.run(self.memory.current_revision())

            async def history(store: Store) -> list[Any]:
                start = 1
                while True:
                    try:
                        async with store.watch("", start_revision=start) as events:
                            out: list[WatchEvent] = []
                            while revision and (not out or out[-1].revision < revision):
                                out.append(await asyncio.wait_for(events.__anext__(), 10))
                            return out
                    except CompactedError as exc:
                        start = exc.compact_revision
                        if start > revision:
                            return []

            if revision:
                assert self.run(history(self.http)) == self.run(history(self.memory))
        finally:
            self.run(self.http.aclose())
            self.run(self.memory.aclose())
            self.run(self.server.stop())
            self.runner.close()


HttpMatchesMemory.TestCase.settings = settings(
    max_examples=25, stateful_step_count=30, deadline=None
)
TestHttpMatchesMemory = HttpMatchesMemory.TestCase
