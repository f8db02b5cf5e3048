"""Tests for the round's driver (``rendezvous/_driver.py``) that mutation testing showed missing
(issue 22; see docs/testing.md, "Mutation testing"). Each pins a behaviour a small, realistic bug
would break and no other test checked. Memory stores, virtual time; the drivers are made by hand
(as a join makes one after its claim landed) so that each starts from the state it names.
"""

from __future__ import annotations

import asyncio

import pytest

from aioelastic.rendezvous import DynamicRendezvousHandler
from aioelastic.rendezvous._driver import _BATCH_BYTES, _BATCH_OPS, RoundDriver, _batches
from aioelastic.rendezvous._state import (
    DriverRecord,
    DueRecord,
    NodeRecord,
    RoundRecord,
    RunKeys,
    roster_chunks,
)
from aioelastic.store import KeyValue, MemoryEngine, MemoryStore, Put
from aioelastic.testing import run_virtual, virtual_test

KEYS = RunKeys("job")


async def _register(store: MemoryStore, round_: int, *nodes: str) -> None:
    for node in nodes:
        await store.put(KEYS.node(round_, node), NodeRecord(node, "h", 1).encode())


async def _previous_round(
    store: MemoryStore, members: tuple[str, ...], round_: int = 0
) -> KeyValue:
    """Round ``round_`` as its driver wrote it: the roster's chunks and the round record."""
    chunks = roster_chunks(members)
    for index, chunk in enumerate(chunks):
        await store.put(KEYS.chunk(round_, index), chunk.encode())
    record = RoundRecord(round_, len(members), "h", 1, len(chunks), 0)
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


async def _run_until_waiting(driver: RoundDriver) -> None:
    """Run ``driver`` until it waits for a registration (virtual time: a second), then stop."""
    task = asyncio.ensure_future(driver.run())
    await asyncio.sleep(1.0)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@virtual_test
async def test_the_members_are_told_of_a_restart_once_and_of_a_newcomer_once() -> None:
    # two members of round 0 register again (one restart, not two) and a newcomer registers,
    # then writes its record again: each is one word to round 0's members
    store = _DueLog(MemoryEngine())
    prev = await _previous_round(store, ("node-a", "node-b", "node-c"))
    h = DynamicRendezvousHandler(store, "job", 5, 5, node_id="node-a")
    claim = await _claim(store, h, 1)
    await _register(store, 1, "node-a", "node-b", "node-n")
    await _register(store, 1, "node-n")  # (a second write of its record)
    roster = (await store.range(KEYS.roster_of(0))).kvs
    driver = RoundDriver(h, 1, prev, claim, prev_roster=roster)
    await _run_until_waiting(driver)
    assert store.told == [DueRecord("node-a", 1, True), DueRecord("node-n", 3, True)]
    await h.aclose()


@virtual_test
async def test_the_members_of_a_full_round_are_not_told_of_a_standby() -> None:
    # round 0 has max_nodes members: a restart could not take a newcomer, so it is not news
    store = _DueLog(MemoryEngine())
    prev = await _previous_round(store, ("node-a", "node-b"))
    h = DynamicRendezvousHandler(store, "job", 2, 2, node_id="node-n")
    claim = await _claim(store, h, 1)
    await _register(store, 1, "node-n")
    roster = (await store.range(KEYS.roster_of(0))).kvs
    driver = RoundDriver(h, 1, prev, claim, prev_roster=roster)
    await _run_until_waiting(driver)
    assert store.told == []
    await h.aclose()


@virtual_test
async def test_a_driver_whose_claim_was_replaced_does_not_write_the_round() -> None:
    store = MemoryStore(MemoryEngine())
    h = DynamicRendezvousHandler(store, "job", 1, 1, node_id="node-a")
    claim = await _claim(store, h, 0)
    await store.put(KEYS.driver, DriverRecord(0, "node-x").encode())  # (another's claim now)
    await _register(store, 0, "node-a")
    driver = RoundDriver(h, 0, None, claim, await store.range(KEYS.nodes))
    await asyncio.wait_for(driver.run(), 5)
    assert driver.members is None
    assert await store.get(KEYS.round) is None
    await h.aclose()


@virtual_test
async def test_a_round_takes_max_nodes_of_more_registrations() -> None:
    store = MemoryStore(MemoryEngine())
    h = DynamicRendezvousHandler(store, "job", 1, 2, node_id="node-a")
    claim = await _claim(store, h, 0)
    await _register(store, 0, "node-a", "node-b", "node-c")
    driver = RoundDriver(h, 0, None, claim, await store.range(KEYS.nodes))
    await asyncio.wait_for(driver.run(), 5)
    assert driver.members == ("node-a", "node-b")  # the first two to register
    await h.aclose()


@pytest.mark.parametrize("prev_round", [1, 2])
def test_a_round_drops_the_member_records_of_the_round_before_the_last(prev_round: int) -> None:
    async def main() -> None:
        store = MemoryStore(MemoryEngine())
        prev = await _previous_round(store, ("node-a",), prev_round)
        for round_ in (prev_round - 1, prev_round):  # (older ones went with earlier rounds)
            await store.put(KEYS.member(round_, "node-a"), b"{}")
        h = DynamicRendezvousHandler(store, "job", 1, 1, node_id="node-a")
        claim = await _claim(store, h, prev_round + 1)
        await _register(store, prev_round + 1, "node-a")
        roster = (await store.range(KEYS.roster_of(prev_round))).kvs
        snapshot = await store.range(KEYS.nodes)
        driver = RoundDriver(h, prev_round + 1, prev, claim, snapshot, prev_roster=roster)
        await asyncio.wait_for(driver.run(), 5)
        left = {kv.key for kv in await store.range(KEYS.members)}
        # the round before the last (prev_round - 1) goes; the last one's and the new one's stay
        assert left == {
            KEYS.member(prev_round, "node-a"),
            KEYS.next_marker(prev_round),
            KEYS.member(prev_round + 1, "node-a"),
        }
        await h.aclose()

    run_virtual(main())


def _puts(count: int, cost: int) -> list[Put]:
    return [Put(f"k{i:05d}", b"v" * (cost - 6)) for i in range(count)]


def test_a_roster_is_cut_into_transactions_of_at_most_half_the_byte_limit() -> None:
    per_batch = 8
    cost = _BATCH_BYTES // per_batch  # (exactly: a batch of 8 is at the limit, not over it)
    assert cost * per_batch == _BATCH_BYTES
    puts = _puts(2 * per_batch + 1, cost)
    batches = _batches(puts)
    assert [len(batch) for batch in batches] == [per_batch, per_batch, 1]
    assert [op for batch in batches for op in batch] == puts


def test_a_roster_is_cut_into_transactions_of_at_most_the_op_limit() -> None:
    puts = _puts(_BATCH_OPS + 1, 7)
    assert [len(batch) for batch in _batches(puts)] == [_BATCH_OPS, 1]
    assert _batches([]) == [[]]


@virtual_test
async def test_a_newcomer_that_left_does_not_hold_up_a_fast_reform() -> None:
    """With ``fast_reform``, a round of the last round's members only forms at once: a newcomer
    that registered and withdrew before the members were all back is not waited for (a count
    that kept it as a newcomer would wait the whole last call)."""
    store = MemoryStore(MemoryEngine())
    prev = await _previous_round(store, ("node-a", "node-b"))
    h = DynamicRendezvousHandler(store, "job", 2, 3, node_id="node-a", last_call_timeout=30.0)
    claim = await _claim(store, h, 1)
    await _register(store, 1, "node-a")
    driver = RoundDriver(h, 1, prev, claim)
    task = asyncio.ensure_future(driver.run())
    await asyncio.sleep(1.0)  # (virtual time: its watch of n/ is open, one registration counted)
    assert not task.done()
    await _register(store, 1, "node-n")  # a newcomer: min_nodes reached, the last call starts
    await store.delete(KEYS.node(1, "node-n"))  # ... and it leaves again
    await _register(store, 1, "node-b")  # the last round's members are all back
    await asyncio.wait_for(task, 5)  # at once, not at the last call's end (30 s)
    assert driver.members == ("node-a", "node-b")
    await h.aclose()
