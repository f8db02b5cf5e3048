"""Tests for the round's driver (``rendezvous/_driver.py``) that mutation testing showed missing
(issue 22; see docs/testing.md, "Mutation testing"). Each pins a behaviour a small, realistic bug
would break and no other test checked. Memory stores, virtual time; the drivers are made by hand
(as a join makes one after its claim landed) so that each starts from the state it names.
"""

from __future__ import annotations

import asyncio

from aioelastic.rendezvous import DynamicRendezvousHandler
from aioelastic.rendezvous._driver import RoundDriver
from aioelastic.rendezvous._state import (
    DriverRecord,
    DueRecord,
    NodeRecord,
    RoundRecord,
    RunKeys,
    roster_chunks,
)
from aioelastic.store import KeyValue, MemoryEngine, MemoryStore
from aioelastic.testing import virtual_test

KEYS = RunKeys("job")


async def _register(store: MemoryStore, round_: int, *nodes: str) -> None:
    for node in nodes:
        await store.put(KEYS.node(round_, node), NodeRecord(node, "h", 1).encode())


async def _previous_round(store: MemoryStore, members: tuple[str, ...]) -> KeyValue:
    """Round 0 as its driver wrote it: the roster's chunks and the round record."""
    chunks = roster_chunks(members)
    for index, chunk in enumerate(chunks):
        await store.put(KEYS.chunk(0, index), chunk.encode())
    record = RoundRecord(0, len(members), "h", 1, len(chunks), 0)
    await store.put(KEYS.round, record.encode())
    kv = await store.get(KEYS.round)
    assert kv is not None
    return kv


async def _claim(store: MemoryStore, h: DynamicRendezvousHandler, target: int) -> int:
    return await store.put(KEYS.driver, DriverRecord(target, h.node_id).encode())


@virtual_test
async def test_a_driver_reads_the_previous_roster_itself_when_nobody_gave_it() -> None:
    """A driver that claimed by itself (no roster read with the claim) and was not in the last
    round (no result of its own) reads the roster: its members keep their ranks."""
    store = MemoryStore(MemoryEngine())
    prev = await _previous_round(store, ("node-b", "node-a"))
    h = DynamicRendezvousHandler(store, "job", 3, 3, node_id="node-c")
    claim = await _claim(store, h, 1)
    await _register(store, 1, "node-c", "node-a", "node-b")  # (in this order: newest last)
    driver = RoundDriver(h, 1, prev, claim)
    await asyncio.wait_for(driver.run(), 5)
    assert driver.members == ("node-b", "node-a", "node-c")
    await h.aclose()


@virtual_test
async def test_a_driver_whose_claim_found_the_previous_roster_gone_counts_on() -> None:
    """The claim's read of the last round's roster came back empty (a later round completed
    and its driver deleted it): the driver has no previous members, not a corrupt roster."""
    store = MemoryStore(MemoryEngine())
    record = RoundRecord(0, 2, "h", 1, 1, 0)  # (its roster chunk is gone)
    await store.put(KEYS.round, record.encode())
    prev = await store.get(KEYS.round)
    h = DynamicRendezvousHandler(store, "job", 1, 1, node_id="node-x")
    claim = await _claim(store, h, 1)
    await _register(store, 1, "node-x")
    driver = RoundDriver(h, 1, prev, claim, await store.range(KEYS.nodes), prev_roster=())
    await asyncio.wait_for(driver.run(), 5)
    assert driver.members == ("node-x",)
    await h.aclose()


class _DueLog(MemoryStore):
    """Logs what is put at ``m/0/~due`` (what the members of round 0 are told)."""

    def __init__(self, engine: MemoryEngine) -> None:
        super().__init__(engine)
        self.told: list[DueRecord] = []

    async def _put(self, key: str, value: bytes, lease: int) -> int:
        if key == KEYS.due(0):
            self.told.append(DueRecord.decode(key, value))
        return await super()._put(key, value, lease)


@virtual_test
async def test_a_count_afresh_does_not_tell_the_members_of_a_newcomer_twice() -> None:
    """The members of round 0 are told of each registration once (``m/0/~due``): after the
    watch's history was compacted, the driver counts afresh, and a newcomer it counted before
    is not told of again (only the member's restart, new since, is)."""
    engine = MemoryEngine(history_limit=4)
    store = _DueLog(engine)
    prev = await _previous_round(store, ("node-a", "node-b"))
    h = DynamicRendezvousHandler(store, "job", 3, 3, node_id="node-n", last_call_timeout=0)
    claim = await _claim(store, h, 1)
    await _register(store, 1, "node-n")
    snapshot = await store.range(KEYS.nodes)
    await _register(store, 1, "node-a", "node-b")
    for _ in range(10):
        await store.put("elsewhere", b"x")
    assert engine.compact_revision > snapshot.revision
    roster = (await store.range(KEYS.roster_of(0))).kvs
    driver = RoundDriver(h, 1, prev, claim, snapshot, prev_roster=roster)
    await asyncio.wait_for(driver.run(), 5)
    assert driver.members == ("node-a", "node-b", "node-n")
    assert store.told == [DueRecord("node-n", 1, False), DueRecord("node-a", 2, True)]
    await h.aclose()
