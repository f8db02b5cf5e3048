"""A hypothesis state machine over the dynamic rendezvous: random joins, leaves, crashes (lease
expiry), lease revocations, closes, late joins and the passing of time, over several rounds.

hypothesis has no async support, so each example owns one virtual-time event loop and every rule
drives it with ``run_until_complete``. Time jumps to the next timer whenever the loop is idle, so
lease TTLs and last-call windows cost no real time.

Invariants, checked after every step:
- every completed round agrees across its members: round, membership and world size; each member's
  rank is its index in the ordered membership; ``min <= world_size <= max``;
- a node's rounds only increase; no node is registered for two rounds at once in the store;
- once the run is closed it stays closed: every later join fails with the closed error (the
  graceful-exit error for a standby) and no new round is returned;
and, at ``quiesce``, liveness: once the live nodes could form a round they do, with
``min(live, max)`` members, ranks exactly ``0..n-1``, the surplus waiting as standbys.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from aioelastic.errors import (
    LeaseNotFoundError,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousGracefulExitError,
    RendezvousTimeoutError,
)
from aioelastic.rendezvous import DynamicRendezvousHandler, RendezvousResult
from aioelastic.rendezvous._state import RunKeys
from aioelastic.store import MemoryEngine, MemoryStore
from aioelastic.testing import VirtualTimeLoop

TTL = 6.0
JOIN_TIMEOUT = 400.0
SLOTS = 6


@dataclass
class Node:
    handler: DynamicRendezvousHandler
    task: asyncio.Task[RendezvousResult] | None = None
    last_round: int = -1
    alive: bool = True  # False once crashed or closed (a restart is a new Node)
    revoked: bool = False  # its lease was revoked since its last join started


class RendezvousMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = VirtualTimeLoop()
        self.engine: MemoryEngine | None = None
        self.slots: list[Node | None] = [None] * SLOTS
        self.dead: list[Node] = []
        self.rounds: dict[int, RendezvousResult] = {}  # round -> the first result seen of it
        self.closed = False
        self.min_nodes = 1
        self.max_nodes = 1
        self.last_call = 0.0
        self.keys = RunKeys("job")

    # -- plumbing

    def run(self, coro: object) -> object:
        return self.loop.run_until_complete(coro)  # type: ignore[arg-type]

    def advance(self, seconds: float) -> None:
        self.run(asyncio.sleep(seconds))
        self.harvest()

    def new_node(self) -> Node:
        assert self.engine is not None
        handler = DynamicRendezvousHandler(
            MemoryStore(self.engine),
            "job",
            self.min_nodes,
            self.max_nodes,
            lease_ttl=TTL,
            last_call_timeout=self.last_call,
            join_timeout=JOIN_TIMEOUT,
        )
        return Node(handler)

    def start_join(self, node: Node) -> None:
        async def join() -> RendezvousResult:
            return await node.handler.next_rendezvous()

        node.task = self.loop.create_task(join())

    def live(self) -> list[Node]:
        return [n for n in self.slots if n is not None and n.alive]

    def harvest(self) -> None:
        """Collect finished joins and check what they returned."""
        for node in self.live():
            task = node.task
            if task is None or not task.done():
                continue
            node.task = None
            if task.cancelled():
                continue
            error = task.exception()
            if error is None:
                node.revoked = False
                self.record(node, task.result())
            elif isinstance(error, (RendezvousClosedError, RendezvousGracefulExitError)):
                assert self.closed, f"closed error while the run is open: {error!r}"
            elif isinstance(error, RendezvousTimeoutError):
                pass
            elif isinstance(error, RendezvousConnectionError):
                assert node.revoked, f"store error without a fault: {error!r}"
            else:
                raise error

    def record(self, node: Node, result: RendezvousResult) -> None:
        assert result.round > node.last_round, "a node's rounds only increase"
        node.last_round = result.round
        assert self.min_nodes <= result.world_size <= self.max_nodes
        assert len(result.participants) == result.world_size
        assert len(set(result.participants)) == result.world_size
        assert result.participants[result.rank] == result.node_id == node.handler.node_id
        first = self.rounds.setdefault(result.round, result)
        assert (first.participants, first.world_size, first.bootstrap_store_info) == (
            result.participants,
            result.world_size,
            result.bootstrap_store_info,
        ), "members disagree on a round"

    # -- rules

    @initialize(
        min_nodes=st.integers(1, 3),
        extra=st.integers(0, 2),
        last_call=st.sampled_from([0.0, 5.0]),
    )
    def setup(self, min_nodes: int, extra: int, last_call: float) -> None:
        self.min_nodes, self.max_nodes, self.last_call = min_nodes, min_nodes + extra, last_call

        async def make() -> MemoryEngine:
            return MemoryEngine()

        engine = self.run(make())
        assert isinstance(engine, MemoryEngine)
        self.engine = engine

    @rule(slot=st.integers(0, SLOTS - 1))
    def join(self, slot: int) -> None:
        """A node joins: a new (late, or restarted) node, or a member re-rendezvousing."""
        node = self.slots[slot]
        if node is None or not node.alive:
            node = self.slots[slot] = self.new_node()
        if node.task is None:
            self.start_join(node)
        self.advance(0.001)

    @rule(slot=st.integers(0, SLOTS - 1))
    def leave(self, slot: int) -> None:
        """A node leaves cleanly (aclose): its records go now; the run stays open."""
        node = self.slots[slot]
        if node is None or not node.alive:
            return
        self.run(node.handler.aclose())
        self.harvest_closed(node)
        self.advance(0.001)

    @rule(slot=st.integers(0, SLOTS - 1))
    def crash(self, slot: int) -> None:
        """A node's process dies: no keep-alive, no clean exit; its lease expires after TTL."""
        node = self.slots[slot]
        if node is None or not node.alive:
            return
        node.alive = False
        handler = node.handler

        async def die() -> None:
            if handler.lease is not None:
                await handler.lease.aclose(revoke=False)
            await handler.store.aclose()
            if node.task is not None:
                await asyncio.wait([node.task])

        self.run(die())
        if node.task is not None and not node.task.cancelled():
            node.task.exception()  # a dead node's outcome does not matter
        self.dead.append(node)
        self.advance(0.001)

    @rule(slot=st.integers(0, SLOTS - 1))
    def revoke(self, slot: int) -> None:
        """A node's lease is lost (e.g. a partition longer than the TTL); the node lives on."""
        node = self.slots[slot]
        if node is None or not node.alive:
            return
        lease = node.handler.lease
        if lease is None or lease.lost:
            return
        assert self.engine is not None
        with contextlib.suppress(LeaseNotFoundError):  # already revoked, not yet noticed
            self.engine.lease_revoke(lease.id)
        node.revoked = True
        self.advance(0.001)

    @rule(slot=st.integers(0, SLOTS - 1))
    def close(self, slot: int) -> None:
        node = self.slots[slot]
        if node is None or not node.alive:
            return
        self.run(node.handler.set_closed())
        self.closed = True
        self.advance(0.001)

    @rule(seconds=st.sampled_from([0.5, 2.0, 5.0, 7.0, 30.0]))
    def wait(self, seconds: float) -> None:
        self.advance(seconds)

    def harvest_closed(self, node: Node) -> None:
        node.alive = False
        if node.task is not None:
            task = node.task
            self.run(asyncio.wait([task]))
            if not task.cancelled() and task.exception() is None:
                self.record(node, task.result())
            elif not task.cancelled():
                assert isinstance(task.exception(), RendezvousClosedError)
            node.task = None

    @precondition(lambda self: self.engine is not None)
    @rule()
    def quiesce(self) -> None:
        """No more faults: every live node (re)joins until the rounds settle; check liveness."""
        settle = self.last_call + TTL + 1.0
        if self.closed:
            for node in self.live():
                if node.task is None:
                    self.start_join(node)
            self.advance(1.0)
            assert all(node.task is None for node in self.live()), "a node waits after close"
            return
        for _ in range(3):
            for node in self.live():
                if node.task is None:
                    self.start_join(node)
            self.advance(settle)
        live = self.live()
        pending = [n for n in live if n.task is not None]
        members = [n for n in live if n.task is None]
        if len(live) < self.min_nodes:
            assert not members, "a round formed below min_nodes"
            return
        size = min(len(live), self.max_nodes)
        assert len(members) == size, (
            f"{len(live)} live nodes, min={self.min_nodes} max={self.max_nodes}: "
            f"{len(members)} members, {len(pending)} waiting"
        )
        rounds = {n.last_round for n in members}
        assert len(rounds) == 1, "members of the settled round disagree on the round"
        final = self.rounds[rounds.pop()]
        assert sorted(final.participants) == sorted(n.handler.node_id for n in members)
        assert final.world_size == size  # ranks are exactly 0..size-1 (record() checks each)
        for node in pending:  # the surplus are standbys: no timeout applies to them
            assert node.handler.node_id not in final.participants

    # -- invariants

    @invariant()
    def one_registration_per_node(self) -> None:
        if self.engine is None:
            return
        seen: set[str] = set()
        for kv in self.engine.range(self.keys.nodes).kvs:
            parsed = self.keys.parse_node_key(kv.key)
            assert parsed is not None
            assert parsed[1] not in seen, f"node {parsed[1]} registered for two rounds"
            seen.add(parsed[1])

    @invariant()
    def closed_stays_closed(self) -> None:
        if self.engine is None or not self.closed:
            return
        assert self.engine.get(self.keys.closed) is not None
        for node in self.live():
            assert node.task is None or not node.task.done() or node.task.exception() is not None

    def teardown(self) -> None:
        async def close_all() -> None:
            for node in [*(n for n in self.slots if n is not None), *self.dead]:
                await node.handler.aclose()
                if node.task is not None:
                    node.task.cancel()
                    await asyncio.wait([node.task])
            # let cancelled keep-alive tasks finish
            await asyncio.sleep(0)

        try:
            self.run(close_all())
        finally:
            self.loop.close()


RendezvousMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRendezvousStateMachine = RendezvousMachine.TestCase
