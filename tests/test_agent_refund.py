"""The agent's restart refund needs O(1) bytes per member: a round says how many members of the
round before it lost (``RendezvousResult.departed``, from the round record every member gets),
so the agent reads no roster (``participants`` off) and still gives back a restart that a
node's loss caused.

Real handlers over one memory engine, in virtual time; reads are counted in bytes (keys and
values returned to each member), at two sizes.
"""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

import pytest

from aioelastic.agent import ElasticAgent, WorkerSpec
from aioelastic.agent._progress import RunProgress
from aioelastic.rendezvous import (
    DynamicRendezvousHandler,
    RendezvousParameters,
    RendezvousResult,
    RendezvousStoreInfo,
)
from aioelastic.rendezvous._state import RoundRecord
from aioelastic.store import KeyValue, MemoryEngine, MemoryStore, RangeResult
from aioelastic.testing import run_virtual


class _ReadBytes(MemoryStore):
    """A memory store that counts the bytes (keys and values) its gets and ranges return."""

    def __init__(self, engine: MemoryEngine) -> None:
        super().__init__(engine)
        self.read = 0

    async def _get(self, key: str) -> KeyValue | None:
        kv = await super()._get(key)
        if kv is not None:
            self.read += len(kv.key) + len(kv.value)
        return kv

    async def _range(self, prefix: str, limit: int | None) -> RangeResult:
        result = await super()._range(prefix, limit)
        self.read += sum(len(kv.key) + len(kv.value) for kv in result.kvs)
        return result


def _handlers(engine: MemoryEngine, n: int, *, participants: bool) -> list[Any]:
    return [
        DynamicRendezvousHandler(
            _ReadBytes(engine),
            "refund",
            n - 1,
            n,
            node_id=f"node-{i:04d}",
            local_addr="127.0.0.1",
            participants=participants,
            owns_store=True,
        )
        for i in range(n)
    ]


async def _lose_one(n: int, participants: bool) -> tuple[list[RunProgress], list[int], int]:
    """A round of ``n``; each node's workers fail (a restart counted); one node is gone; the
    others form the next round. Each survivor's progress, the bytes each survivor read in the
    second round, and the second round's ``departed``."""
    engine = MemoryEngine()
    handlers = _handlers(engine, n, participants=participants)
    first = await asyncio.gather(*(h.next_rendezvous() for h in handlers))
    assert {r.departed for r in first} == {0}  # a first round lost nobody
    gone, survivors = handlers[-1], handlers[:-1]
    progress = [RunProgress(nproc_per_node=1, max_restarts=3) for _ in survivors]
    for p, r in zip(progress, first, strict=False):
        p.joined(r)
        p.count_restart(r)  # its workers failed: a restart, leaving round 0
    await gone.aclose()
    before = [h._store.read for h in survivors]
    second = await asyncio.gather(*(h.next_rendezvous() for h in survivors))
    read = [h._store.read - b for h, b in zip(survivors, before, strict=True)]
    for p, r in zip(progress, second, strict=True):
        assert r.round == 1
        p.joined(r)
    (departed,) = {r.departed for r in second}
    assert departed is not None
    await asyncio.gather(*(h.aclose() for h in survivors))
    return progress, read, departed


def test_a_round_that_lost_a_node_refunds_the_restart_without_a_roster() -> None:
    progress, _, departed = run_virtual(lambda: _lose_one(6, participants=False))
    assert departed == 1
    assert [p.restarts for p in progress] == [0] * 5  # given back: no participants to compare


def test_a_round_that_lost_nobody_keeps_the_restart() -> None:
    async def main() -> list[RunProgress]:
        handlers = _handlers(MemoryEngine(), 3, participants=False)
        first = await asyncio.gather(*(h.next_rendezvous() for h in handlers))
        progress = [RunProgress(nproc_per_node=1, max_restarts=3) for _ in handlers]
        for p, r in zip(progress, first, strict=True):
            p.joined(r)
            p.count_restart(r)
        second = await asyncio.gather(*(h.next_rendezvous() for h in handlers))
        assert {r.departed for r in second} == {0}
        for p, r in zip(progress, second, strict=True):
            p.joined(r)
        await asyncio.gather(*(h.aclose() for h in handlers))
        return progress

    assert [p.restarts for p in run_virtual(main)] == [1, 1, 1]


def _per_member(n: int, participants: bool) -> float:
    """The median of the bytes each survivor read in the second round (the driver's claim
    reads through its transaction: it counts 0 here)."""
    _, read, _ = run_virtual(lambda: _lose_one(n, participants))
    return statistics.median(read)


def test_the_refund_costs_each_member_o1_bytes() -> None:
    """Without the roster a member reads its own records only: the same bytes at 4N as at N.
    With it (what the agent needed before) each member reads O(N) bytes: the measure sees it."""
    small, large = _per_member(10, False), _per_member(40, False)
    assert 0 < large <= 1.1 * small, (small, large)
    small_roster, large_roster = _per_member(10, True), _per_member(40, True)
    assert large_roster > 2 * small_roster, (small_roster, large_roster)


def _result(round_: int, participants: tuple[str, ...], departed: int | None) -> RendezvousResult:
    return RendezvousResult(
        "r", round_, 0, 2, participants, "a", MemoryStore(), RendezvousStoreInfo("h", 1), departed
    )


@pytest.mark.parametrize(
    ("left", "joined", "refunded"),
    [
        ((0, ("a", "b"), 0), (1, (), 1), True),  # the next round says it lost one
        ((0, ("a", "b"), 0), (1, ("a", "b"), 0), False),
        ((0, ("a", "b"), 0), (1, ("a", "b"), None), False),  # it does not say: the rosters
        ((0, ("a", "b"), 0), (1, ("a",), None), True),
        ((0, ("a", "b"), 0), (3, ("a",), 0), True),  # a round missed: the rosters
        ((0, ("a", "b"), 0), (3, ("a", "b"), 1), False),
    ],
)
def test_the_refund_reads_departed_of_the_next_round_only(
    left: tuple[int, tuple[str, ...], int], joined: tuple[int, tuple[str, ...], int | None],
    refunded: bool,
) -> None:  # fmt: skip
    progress = RunProgress(nproc_per_node=1, max_restarts=3)
    progress.count_restart(_result(*left))
    progress.joined(_result(*joined))
    assert progress.restarts == (0 if refunded else 1)


def test_a_round_record_from_an_older_writer_has_no_departed() -> None:
    old = b'{"v":2,"kind":"round","r":1,"w":2,"ma":"h","mp":1,"c":1}'
    assert RoundRecord.decode("c/round", old).departed is None
    new = RoundRecord(1, 2, "h", 1, 1, departed=1)
    assert RoundRecord.decode("c/round", new.encode()) == new


def test_the_agent_reads_no_roster_unless_asked() -> None:
    """The agent's own handler has ``participants`` off; a config that sets it is kept."""

    async def main() -> list[bool]:
        seen = []
        for config in ({}, {"participants": "1"}):
            params = RendezvousParameters("memory", "agent-roster", "j", 1, 1, **config)
            agent = ElasticAgent(WorkerSpec(entrypoint=["true"]), params)
            handler = await agent._open_handler()
            assert isinstance(handler, DynamicRendezvousHandler)
            seen.append(handler._with_participants)
            await handler.aclose()
            assert params.config == config  # the caller's parameters are not changed
        return seen

    assert run_virtual(main) == [False, True]
