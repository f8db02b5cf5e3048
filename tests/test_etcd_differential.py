"""Differential test: the same random operation sequences on the memory backend and on a real
etcd give the same results, modulo the revision offset (etcd's revision is global and starts at
1) and lease ids. etcd is the oracle for our semantics.

Every result is compared: returned revisions, key-values (all fields), range counts and ``more``,
compare-and-swap outcomes, error types, lease TTLs and keys, compaction errors, and the events a
watch on the whole namespace delivers after each step.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioelastic import (
    CasResult,
    CompactedError,
    KeyValue,
    LeaseNotFoundError,
    MemoryStore,
    RangeResult,
    Store,
    WatchEvent,
)
from aioelastic.etcd_server import EtcdServer

pytestmark = pytest.mark.etcd

KEYS = ["a", "a/b", "a/c", "ab", "b", "é"]
PREFIXES = ["", "a", "a/", "b", "é"]

keys = st.sampled_from(KEYS)
NEVER_GRANTED = 0x7FFF_0000  # a lease id neither backend hands out in a test
lease_ref = st.integers(0, 3)  # 0: no lease; i: the i-th lease granted (maybe revoked, or none)

operations = st.one_of(
    st.tuples(st.just("put"), keys, st.binary(max_size=6), lease_ref),
    st.tuples(st.just("get"), keys),
    st.tuples(st.just("delete"), keys),
    st.tuples(st.just("delete_prefix"), st.sampled_from(PREFIXES)),
    st.tuples(st.just("range"), st.sampled_from(PREFIXES), st.none() | st.integers(1, 3)),
    st.tuples(st.just("cas"), keys, st.binary(max_size=6), st.sampled_from(["cur", "0", "old"])),
    st.tuples(st.just("cad"), keys, st.booleans()),
    st.tuples(st.just("add"), st.sampled_from(["n", "a"]), st.integers(-3, 3)),
    st.tuples(st.just("grant"), st.integers(30, 90)),
    st.tuples(st.just("revoke"), lease_ref),
    st.tuples(st.just("keep_alive"), lease_ref),
    st.tuples(st.just("ttl"), lease_ref),
    st.tuples(st.just("compact"), st.integers(1, 12)),
    st.tuples(st.just("watch_from"), st.integers(1, 12)),
)


@dataclass
class Side:
    """One backend under test, with what is needed to normalise its answers."""

    store: Store
    base: int  # the revision before the first operation
    leases: list[int]
    watch: Any = None

    def rev(self, revision: int) -> int:
        return revision - self.base if revision else 0

    def lease_index(self, lease_id: int) -> int:
        return self.leases.index(lease_id) + 1 if lease_id else 0

    def lease_id(self, ref: int) -> int:
        if ref == 0:
            return 0
        if ref <= len(self.leases):
            return self.leases[ref - 1]
        return NEVER_GRANTED + ref

    def kv(self, kv: KeyValue | None) -> tuple[Any, ...] | None:
        if kv is None:
            return None
        return (
            kv.key,
            kv.value,
            self.rev(kv.create_revision),
            self.rev(kv.mod_revision),
            kv.version,
            self.lease_index(kv.lease),
        )

    def event(self, event: WatchEvent) -> tuple[Any, ...]:
        return (event.type, self.kv(event.kv))


async def apply(side: Side, op: tuple[Any, ...]) -> Any:
    """Run ``op`` on one side; return a normalised, comparable result."""
    s = side.store
    name = op[0]
    try:
        if name == "put":
            return side.rev(await s.put(op[1], op[2], lease=side.lease_id(op[3])))
        if name == "get":
            return side.kv(await s.get(op[1]))
        if name == "delete":
            return await s.delete(op[1])
        if name == "delete_prefix":
            return await s.delete_prefix(op[1])
        if name == "range":
            r: RangeResult = await s.range(op[1], limit=op[2])
            return ([side.kv(kv) for kv in r], side.rev(r.revision), r.count, r.more)
        if name == "cas":
            current = await s.get(op[1])
            expected = {
                "cur": current.mod_revision if current else 0,
                "0": 0,
                "old": side.base + max(1, side.rev(current.mod_revision) - 1 if current else 1),
            }[op[3]]
            c: CasResult = await s.compare_and_swap(op[1], expected, op[2])
            return (c.succeeded, side.rev(c.revision), side.kv(c.kv))
        if name == "cad":
            current = await s.get(op[1])
            expected = (current.mod_revision if current else side.base + 1) + int(op[2])
            c = await s.compare_and_delete(op[1], expected)
            return (c.succeeded, side.rev(c.revision), side.kv(c.kv))
        if name == "add":
            return await s.add(op[1], op[2])
        if name == "grant":
            grant = await s.lease_grant(op[1])
            side.leases.append(grant.id)
            return grant.ttl
        if name == "revoke":
            await s.lease_revoke(side.lease_id(op[1]) or NEVER_GRANTED)
            return None
        if name == "keep_alive":
            return await s.lease_keep_alive(side.lease_id(op[1]) or NEVER_GRANTED)
        if name == "ttl":
            status = await s.lease_time_to_live(side.lease_id(op[1]) or NEVER_GRANTED)
            return (status.granted_ttl, status.keys)
        if name == "compact":
            await s.compact(side.base + op[1])
            return None
        if name == "watch_from":
            async with s.watch("", start_revision=side.base + op[1]) as w:
                assert w.start_revision == side.base + op[1]
                now = await s.current_revision()
                events: list[tuple[Any, ...]] = []
                while now > side.base + op[1] - 1 and (
                    not events or events[-1][1][3] < now - side.base
                ):
                    events.append(side.event(await asyncio.wait_for(w.__anext__(), 10)))
                return events
        raise AssertionError(name)
    except (LeaseNotFoundError, ValueError) as exc:
        return type(exc).__name__
    except CompactedError as exc:
        return ("CompactedError", side.rev(exc.compact_revision))


async def drain(side: Side, count: int) -> list[tuple[Any, ...]]:
    """The events the namespace watch has delivered up to revision ``count`` (normalised)."""
    out = []
    now = await side.store.current_revision()
    while side.watch.last < now:
        event = await asyncio.wait_for(side.watch.events.__anext__(), 10)
        side.watch.last = event.revision
        out.append(side.event(event))
    return out


@dataclass
class _Watching:
    events: Any
    last: int


async def run_both(
    server: EtcdServer,
    ops: list[tuple[Any, ...]],
    apply_one: Callable[[Side, tuple[Any, ...]], Awaitable[Any]] = apply,
    root: str = "diff",
) -> None:
    """Apply ``ops`` in turn on both sides (``apply_one``); after each, the results and the
    watch events seen must be the same (transactions' test uses it too, with its own steps)."""
    from aioelastic.store.etcd import EtcdStore

    async with EtcdStore(server.endpoints) as etcd_client, MemoryStore() as memory:
        etcd_ns = etcd_client.namespace(f"{root}/{uuid.uuid4().hex}/")
        sides = [
            Side(memory, await memory.current_revision(), []),
            Side(etcd_ns, await etcd_ns.current_revision(), []),
        ]
        for side in sides:
            events = side.store.watch("")
            await events.start()
            side.watch = _Watching(events, side.base)
        try:
            for step, op in enumerate(ops):
                results = [await apply_one(side, op) for side in sides]
                assert results[0] == results[1], (step, op, results)
                seen = [await drain(side, step) for side in sides]
                assert seen[0] == seen[1], (step, op, seen)
        finally:
            for side in sides:
                await side.watch.events.aclose()
            for lease_id in sides[1].leases:  # leave nothing to expire during a later example
                with contextlib.suppress(LeaseNotFoundError):
                    await etcd_client.lease_revoke(lease_id)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(operations, min_size=8, max_size=30))
def test_memory_and_etcd_agree(etcd: EtcdServer, ops: list[tuple[Any, ...]]) -> None:
    asyncio.run(run_both(etcd, ops))
