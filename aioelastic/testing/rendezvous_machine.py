"""A hypothesis state machine over the dynamic rendezvous: random joins, late joins, leaves,
crashes (lease expiry), lease revocations, closes and the passing of time, over many rounds, with
every result checked. Importable, so you can run it over your own store backend or settings.

hypothesis has no async rules (HypothesisWorks/hypothesis#4107), so each example owns one event
loop (a :class:`~aioelastic.testing.VirtualTimeLoop` by default: lease TTLs and last-call windows
cost no real time) and every step drives it with ``run_until_complete``.

Invariants, checked after every step:

- every completed round agrees across its members: round, membership and world size; each
  member's rank is its index in the ordered membership; ``min <= world_size <= max``;
- a node's rounds only increase; no node is registered for two rounds at once in the store;
- once the run is closed it stays closed: every later join fails with the closed error (the
  graceful-exit error for a standby) and no new round is returned;

and, at ``quiesce``, liveness: once the live nodes could form a round they do, with
``min(live, max)`` members, ranks exactly ``0..n-1``, the surplus waiting as standbys.

Three ways to use it::

    TestRendezvous = RendezvousMachine.TestCase        # the memory store, virtual time

    class OverMyStore(RendezvousMachine):              # another backend, other settings
        config = RendezvousMachineConfig(lease_ttl=2.0, waits=(0.5, 3.0), last_calls=(0.0, 1.0))
        virtual_time = False                           # a real server: real time

        async def open_store(self):                    # a new client of the same store per call
            return await open_store("http://127.0.0.1:29400")

    @given(rendezvous_scenarios())                     # one scenario at a time
    def test_scenario(scenario):
        run_rendezvous_scenario(scenario)

Needs hypothesis (``aioelastic[test]``).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ..errors import (
    LeaseNotFoundError,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousGracefulExitError,
    RendezvousTimeoutError,
)
from ..rendezvous import DynamicRendezvousHandler, RendezvousResult
from ..rendezvous._state import RoundRecord, RunKeys
from ..store import MemoryEngine, MemoryStore, Store
from ._virtual_time import VirtualTimeLoop
from .strategies import (
    WAITS,
    RendezvousScenario,
    RendezvousStep,
    node_slots,
    rendezvous_sizes,
    wait_seconds,
)

__all__ = [
    "RendezvousHarness",
    "RendezvousMachine",
    "RendezvousMachineConfig",
    "run_rendezvous_scenario",
]

T = TypeVar("T")


@dataclass(frozen=True)
class RendezvousMachineConfig:
    """Settings of the machine (and of :func:`run_rendezvous_scenario`)."""

    #: The nodes' lease TTL (seconds).
    lease_ttl: float = 6.0
    #: The join timeout; long, so that the scenarios explore rounds rather than timeouts.
    join_timeout: float = 400.0
    #: How many node slots (at most this many live nodes at once).
    slots: int = 6
    #: What a ``wait`` step may let pass.
    waits: tuple[float, ...] = WAITS
    #: ``min_nodes`` is drawn from ``1..max_min_nodes``, ``max_nodes`` up to ``max_extra`` more.
    max_min_nodes: int = 3
    max_extra: int = 2
    #: The last-call windows drawn.
    last_calls: tuple[float, ...] = (0.0, 5.0)
    #: The pause after each action, letting its store round trips land.
    step_pause: float = 0.001


@dataclass
class _Node:
    handler: DynamicRendezvousHandler
    task: asyncio.Task[RendezvousResult] | None = None
    last_round: int = -1
    alive: bool = True  # False once crashed or closed (a restart is a new node)
    # Its lease was revoked, and no join started after that has succeeded yet: until then its
    # joins may fail with a store error (the handler learns of the revoke by failing to use it).
    revoked: bool = False
    joins_started: int = 0
    revoked_after_join: int = 0  # joins_started when the lease was revoked
    label: str = field(default="")


class RendezvousHarness:
    """Runs rendezvous steps on one event loop and checks every invariant (see the module
    docstring). :class:`RendezvousMachine` and :func:`run_rendezvous_scenario` drive it.

    ``open_store`` is called (on ``loop``) once per node and once for an observer, and must
    return a new client of the same store each time. The run id is new per harness, so one
    store can serve many examples.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        open_store: Callable[[], Awaitable[Store]],
        *,
        min_nodes: int,
        max_nodes: int,
        last_call: float,
        config: RendezvousMachineConfig = RendezvousMachineConfig(),
    ) -> None:
        if not 1 <= min_nodes <= max_nodes:
            raise ValueError(f"need 1 <= min_nodes <= max_nodes, got {min_nodes}, {max_nodes}")
        self.loop = loop
        self.config = config
        self.open_store = open_store
        self.min_nodes, self.max_nodes, self.last_call = min_nodes, max_nodes, last_call
        self.run_id = f"machine-{uuid.uuid4().hex[:12]}"
        self.keys = RunKeys(self.run_id)
        self.slots: list[_Node | None] = [None] * config.slots
        self.dead: list[_Node] = []
        self.rounds: dict[int, RendezvousResult] = {}  # round -> the first result seen of it
        self.closed = False
        self.observer: Store = self.run(open_store())

    # -- plumbing

    def run(self, awaitable: Awaitable[T]) -> T:
        return self.loop.run_until_complete(awaitable)

    def advance(self, seconds: float) -> None:
        self.run(asyncio.sleep(seconds))
        self.harvest()

    def pause(self) -> None:
        self.advance(self.config.step_pause)

    def new_node(self) -> _Node:
        handler = DynamicRendezvousHandler(
            self.run(self.open_store()),
            self.run_id,
            self.min_nodes,
            self.max_nodes,
            lease_ttl=self.config.lease_ttl,
            last_call_timeout=self.last_call,
            join_timeout=self.config.join_timeout,
            owns_store=True,
        )
        return _Node(handler)

    def start_join(self, node: _Node) -> None:
        async def join() -> RendezvousResult:
            return await node.handler.next_rendezvous()

        node.joins_started += 1
        node.task = self.loop.create_task(join())

    def live(self) -> list[_Node]:
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
                if node.joins_started > node.revoked_after_join:  # began after the revoke
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

    def record(self, node: _Node, result: RendezvousResult) -> None:
        """Check one returned round against the node's history and the other members'."""
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

    # -- steps

    def apply(self, step: RendezvousStep) -> None:
        """Run one :class:`~aioelastic.testing.strategies.RendezvousStep`."""
        if step.kind == "wait":
            self.wait(step.seconds)
        elif step.kind == "quiesce":
            self.quiesce()
        else:
            getattr(self, step.kind)(step.slot % self.config.slots)

    def join(self, slot: int) -> None:
        """A node joins: a new (late, or restarted) node, or a member re-rendezvousing."""
        node = self.slots[slot]
        if node is None or not node.alive:
            node = self.slots[slot] = self.new_node()
        if node.task is None:
            self.start_join(node)
        self.pause()

    def late_join(self, slot: int) -> None:
        """A brand-new node joins the ``slot``-th free slot (nothing if every slot is taken)."""
        free = [i for i, n in enumerate(self.slots) if n is None or not n.alive]
        if free:
            self.join(free[slot % len(free)])

    def leave(self, slot: int) -> None:
        """A node leaves cleanly (aclose): its records go now; the run stays open."""
        node = self.slots[slot]
        if node is None or not node.alive:
            return
        self.run(node.handler.aclose())
        node.alive = False
        if node.task is not None:
            task = node.task
            self.run(asyncio.wait([task]))
            if not task.cancelled() and task.exception() is None:
                self.record(node, task.result())
            elif not task.cancelled():
                error = task.exception()
                # (a join writing when its revoked lease is found out fails with that, as in
                # harvest(), rather than with the close that followed)
                lost = isinstance(error, RendezvousConnectionError) and node.revoked
                # (a standby of a closed run exits gracefully, as in harvest())
                exits = isinstance(error, RendezvousGracefulExitError) and self.closed
                assert lost or exits or isinstance(error, RendezvousClosedError), repr(error)
            node.task = None
        self.pause()

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
        self.pause()

    def revoke(self, slot: int) -> None:
        """A node's lease is lost (e.g. a partition longer than the TTL); the node lives on."""
        node = self.slots[slot]
        if node is None or not node.alive:
            return
        lease = node.handler.lease
        if lease is None or lease.lost:
            return
        with contextlib.suppress(LeaseNotFoundError):  # already revoked, not yet noticed
            self.run(self.observer.lease_revoke(lease.id))
        node.revoked = True
        node.revoked_after_join = node.joins_started
        self.pause()

    def close(self, slot: int) -> None:
        """The node closes the run (sticky for the run id)."""
        node = self.slots[slot]
        if node is None or not node.alive:
            return
        self.run(node.handler.set_closed())
        _harvest_before_close(self)
        self.pause()

    def wait(self, seconds: float) -> None:
        """Let ``seconds`` pass (on a virtual-time loop: at once)."""
        self.advance(seconds)

    def quiesce(self) -> None:
        """No more faults: every live node (re)joins until the rounds settle; check liveness."""
        settle = self.last_call + self.config.lease_ttl + 1.0
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

    def check_one_registration_per_node(self) -> None:
        """No node is registered for two rounds — checked for the nodes between joins: a node
        moves to the next round by registering for it, then deleting its old record (two
        writes, so on a store with latency a join in flight can be seen between them; so can a
        process that crashed between them, until its lease expires)."""
        in_flight = {
            n.handler.node_id for n in self.live() if n.task is not None and not n.task.done()
        }
        in_flight.update(n.handler.node_id for n in self.dead)
        seen: set[str] = set()
        for kv in self.run(self.observer.range(self.keys.nodes)).kvs:
            parsed = self.keys.parse_node_key(kv.key)
            assert parsed is not None, f"a foreign key under the node records: {kv.key!r}"
            node_id = parsed[1]
            if node_id in in_flight:
                continue
            assert node_id not in seen, f"node {node_id} registered for two rounds"
            seen.add(node_id)

    def check_closed_stays_closed(self) -> None:
        if not self.closed:
            return
        assert self.run(self.observer.get(self.keys.closed)) is not None
        for node in self.live():
            assert node.task is None or not node.task.done() or node.task.exception() is not None

    def check(self) -> None:
        """Every invariant that must hold between steps."""
        self.check_one_registration_per_node()
        self.check_closed_stays_closed()

    def aclose_all(self) -> None:
        """Close every handler, cancel every join, close the observer."""

        async def close_all() -> None:
            for node in [*(n for n in self.slots if n is not None), *self.dead]:
                await node.handler.aclose()
                if node.task is not None:
                    node.task.cancel()
                    await asyncio.wait([node.task])
            await self.observer.aclose()
            await asyncio.sleep(0)  # let cancelled keep-alive tasks finish

        self.run(close_all())


def _memory_opener() -> Callable[[], Awaitable[Store]]:
    engine: list[MemoryEngine] = []

    async def open_memory_store() -> Store:
        if not engine:
            engine.append(MemoryEngine())
        return MemoryStore(engine[0])

    return open_memory_store


def _harvest_before_close(h: RendezvousHarness) -> None:
    """The run is closed: collect the joins that returned while the close was written (each
    must return a round whose record was written before the close record: it formed first)."""
    closed = h.run(h.observer.get(h.keys.closed))
    latest = h.run(h.observer.get(h.keys.round))
    for node in h.live():
        task = node.task
        if task is None or not task.done() or task.cancelled() or task.exception():
            continue
        assert closed is not None, "the close was not recorded"
        assert latest is not None, "a join returned, but no round was recorded"
        formed = RoundRecord.decode(latest.key, latest.value).round
        assert latest.mod_revision < closed.mod_revision, "a round formed after the close"
        assert task.result().round <= formed, "a join returned a round never formed"
    h.closed = True
    h.harvest()


def run_rendezvous_scenario(
    scenario: RendezvousScenario,
    *,
    open_store: Callable[[], Awaitable[Store]] | None = None,
    config: RendezvousMachineConfig = RendezvousMachineConfig(),
    virtual_time: bool = True,
) -> None:
    """Replay ``scenario`` (see :func:`~aioelastic.testing.strategies.rendezvous_scenarios`) on
    a new event loop, checking every invariant after every step, and quiesce at the end.

    ``open_store`` (default: clients of one new in-process memory store) is called once per
    node and must return a new client of the same store each time; ``virtual_time=False`` for
    a real server.
    """
    loop = VirtualTimeLoop() if virtual_time else asyncio.new_event_loop()
    try:
        harness = RendezvousHarness(
            loop,
            open_store or _memory_opener(),
            min_nodes=scenario.min_nodes,
            max_nodes=scenario.max_nodes,
            last_call=scenario.last_call,
            config=config,
        )
        try:
            for step in scenario.steps:
                harness.apply(step)
                harness.check()
            harness.quiesce()
            harness.check()
        finally:
            harness.aclose_all()
    finally:
        loop.close()


class RendezvousMachine(RuleBasedStateMachine):
    """The rendezvous state machine. Subclass to change :attr:`config`, :attr:`virtual_time` or
    the store (:meth:`open_store`); then ``TestX = MyMachine.TestCase``."""

    #: Settings (TTL, join timeout, slots, waits, sizes).
    config: ClassVar[RendezvousMachineConfig] = RendezvousMachineConfig()
    #: Run on a :class:`VirtualTimeLoop` (only for in-process stores).
    virtual_time: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self.loop: asyncio.AbstractEventLoop = (
            VirtualTimeLoop() if self.virtual_time else asyncio.new_event_loop()
        )
        self.harness: RendezvousHarness | None = None
        self._memory = _memory_opener()

    async def open_store(self) -> Store:
        """A new client of the store under test (one per node and one observer, each example).

        Default: clients of one in-process memory store per example."""
        return await self._memory()

    @property
    def h(self) -> RendezvousHarness:
        assert self.harness is not None
        return self.harness

    @initialize(data=st.data())
    def setup(self, data: st.DataObject) -> None:
        c = self.config
        min_nodes, max_nodes, last_call = data.draw(
            rendezvous_sizes(c.max_min_nodes, c.max_extra, c.last_calls), label="sizes"
        )
        self.harness = RendezvousHarness(
            self.loop,
            self.open_store,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            last_call=last_call,
            config=c,
        )

    def _slot(self, data: st.DataObject) -> int:
        return data.draw(node_slots(self.config.slots), label="slot")

    @rule(data=st.data())
    def join(self, data: st.DataObject) -> None:
        self.h.join(self._slot(data))

    @rule(data=st.data())
    def late_join(self, data: st.DataObject) -> None:
        self.h.late_join(self._slot(data))

    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        self.h.leave(self._slot(data))

    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        self.h.crash(self._slot(data))

    @rule(data=st.data())
    def revoke(self, data: st.DataObject) -> None:
        self.h.revoke(self._slot(data))

    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        self.h.close(self._slot(data))

    @rule(data=st.data())
    def wait(self, data: st.DataObject) -> None:
        self.h.wait(data.draw(wait_seconds(self.config.waits), label="seconds"))

    @precondition(lambda self: self.harness is not None)
    @rule()
    def quiesce(self) -> None:
        self.h.quiesce()

    @invariant()
    def one_registration_per_node(self) -> None:
        if self.harness is not None:
            self.h.check_one_registration_per_node()

    @invariant()
    def closed_stays_closed(self) -> None:
        if self.harness is not None:
            self.h.check_closed_stays_closed()

    def teardown(self) -> None:
        try:
            if self.harness is not None:
                self.harness.aclose_all()
        finally:
            self.loop.close()
