"""The static rendezvous: a fixed world size and a rank given to each node, for non-elastic jobs.

Each node registers ``rank<N>`` for round 0 (bound to its lease). Rank 0 watches the
registrations until all ``world_size`` ranks are there, then writes the round record ``c/round``
(bound to its lease); every other rank waits, on a watch of ``c/``, for that one write. So a
round of N costs O(N) events (rank 0 N, the others one each), not every rank each registration.
Every node returns the same single round. A rank taken by another live handler is an error.
Closing and membership events work as in the dynamic handler (a lost rank is a
``PARTICIPANT_LOST`` event).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import anyio

from .._checks import DEFAULT_LEASE_TTL, check_ttl
from ..errors import (
    LeaseExpiredError,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousTimeoutError,
    StoreError,
)
from ..store import EventType, LeaseKeeper, Watch
from ._addr import default_addr, free_port, prefetch_default_addr
from ._state import ClosedRecord, NodeRecord, RoundRecord, RunKeys, static_members
from .api import (
    RendezvousEvent,
    RendezvousEventKind,
    RendezvousResult,
    RendezvousStoreInfo,
    _BuiltinHandler,
)

if TYPE_CHECKING:
    from ..store import Store

__all__ = ["StaticRendezvousHandler"]


class StaticRendezvousHandler(_BuiltinHandler):
    """A fixed-size rendezvous: ``rank`` in ``0..world_size-1`` is given, not assigned.

    ``master_addr``/``master_port`` override what rank 0 publishes (default: its address and a
    free port). ``next_rendezvous`` waits up to ``join_timeout`` for every rank.
    """

    def __init__(
        self,
        store: Store,
        run_id: str,
        rank: int,
        world_size: int,
        *,
        join_timeout: float = 600.0,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        keep_alive_interval: float | None = None,
        local_addr: str | None = None,
        master_addr: str | None = None,
        master_port: int | None = None,
        backend: str = "static",
        owns_store: bool = False,
    ) -> None:
        for name, value in (("rank", rank), ("world_size", world_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
        if not join_timeout > 0:
            raise ValueError(f"join_timeout must be > 0 seconds, got {join_timeout}")
        if master_port is not None and not 0 < master_port < 65536:
            raise ValueError(f"master_port must be in 1..65535, got {master_port}")
        self._store = store
        self._keys = RunKeys(run_id)
        self._rank = rank
        self._world_size = world_size
        self._join_timeout = float(join_timeout)
        self._lease_ttl = check_ttl(lease_ttl, "lease_ttl")
        self._keep_alive_interval = keep_alive_interval
        self._local_addr = local_addr
        if local_addr is None and master_addr is None:
            prefetch_default_addr()  # a DNS lookup: in a thread, now, not inside the join
        self._master_addr = master_addr
        self._master_port = master_port
        self._backend = backend
        self._owns_store = owns_store
        self._keeper: LeaseKeeper | None = None
        self._result: RendezvousResult | None = None
        self._revision = 0
        self._watch: Watch | None = None
        self._closed_seen = False
        self._handler_closed = False
        self._error: BaseException | None = None
        self._lock = asyncio.Lock()

    @staticmethod
    def node_name(rank: int) -> str:
        """The node id of ``rank`` in the store (``rank<N>``)."""
        return f"rank{rank}"  # as _state.static_members names them

    def get_backend(self) -> str:
        return self._backend

    @property
    def run_id(self) -> str:
        return self._keys.run_id

    async def next_rendezvous(self) -> RendezvousResult:
        """Register this rank and wait until every rank has; the one round is round 0."""
        self._check_usable()
        async with self._lock:
            self._check_usable()
            with self._translate("next_rendezvous"):
                result = await self._join()
            self._error = None
            return result

    async def _join(self) -> RendezvousResult:
        store, keys = self._store, self._keys
        keeper = self._keeper
        if keeper is None or keeper.lost:
            keeper = self._store.lease(
                self._lease_ttl, keep_alive_interval=self._keep_alive_interval
            )
            await keeper.start()
            keeper.on_lost(self._on_lease_lost)
            self._keeper = keeper
        name = self.node_name(self._rank)
        addr = self._master_addr or self._local_addr or default_addr()
        port = self._master_port if self._master_port is not None else free_port()
        mine = NodeRecord(name, addr, port)
        key = keys.node(0, name)
        result = await store.compare_and_swap(key, 0, mine.encode(), lease=keeper.id)
        if not result.succeeded and (result.kv is None or result.kv.lease != keeper.id):
            raise RendezvousError(
                f"rank {self._rank} of {self.run_id!r} is already taken by another live handler"
            )
        try:
            with anyio.fail_after(self._join_timeout):
                if self._rank == 0:
                    record, revision = await self._gather_ranks(keeper)
                else:
                    record, revision = await self._wait_for_round()
        except TimeoutError:
            missing = await self._missing()
            raise RendezvousTimeoutError(
                f"static rendezvous {self.run_id!r}: ranks {missing} did not arrive within "
                f"join_timeout={self._join_timeout}s"
            ) from None
        self._revision = revision
        self._result = RendezvousResult(
            run_id=self.run_id,
            round=0,
            rank=self._rank,
            world_size=self._world_size,
            participants=static_members(self._world_size),
            node_id=name,
            store=store.namespace(keys.data(0)),
            bootstrap_store_info=RendezvousStoreInfo(record.master_addr, record.master_port),
        )
        return self._result

    def _on_lease_lost(self, error: LeaseExpiredError) -> None:
        """The lease was lost (also while nobody waited on the handler): it is in ERROR, and
        its next ``wait_for_change`` says why."""
        if not self._handler_closed:
            self._error = error

    async def _gather_ranks(self, keeper: LeaseKeeper) -> tuple[RoundRecord, int]:
        """Rank 0: watch the registrations until every rank is there, then write the round."""
        store, keys = self._store, self._keys
        found: dict[str, NodeRecord] = {}
        snapshot, events = await store.range_and_watch(keys.root)
        async with events:
            for kv in snapshot:
                self._apply(kv.key, kv.value, True, found)
            revision = snapshot.revision
            while len(found) < self._world_size:
                event = await events.__anext__()
                revision = event.revision
                put = event.type is EventType.PUT
                self._apply(event.kv.key, event.kv.value, put, found)
        rank0 = found[self.node_name(0)]
        record = RoundRecord(0, self._world_size, rank0.addr, rank0.port, chunks=0)
        await store.put(keys.round, record.encode(), lease=keeper.id)
        return record, revision

    async def _wait_for_round(self) -> tuple[RoundRecord, int]:
        """Any other rank: wait for rank 0's round record (a closed run raises)."""
        store, keys = self._store, self._keys
        snapshot, events = await store.range_and_watch(keys.ctl)
        async with events:
            for kv in snapshot:
                record = self._control(kv.key, kv.value)
                if record is not None:
                    return record, snapshot.revision
            while True:
                event = await events.__anext__()
                if event.type is EventType.PUT:
                    record = self._control(event.kv.key, event.kv.value)
                    if record is not None:
                        return record, event.revision

    def _control(self, key: str, value: bytes) -> RoundRecord | None:
        """The round record, if ``key`` is it; a close record raises."""
        if key == self._keys.closed:
            ClosedRecord.decode(key, value)
            self._closed_seen = True
            raise RendezvousClosedError(f"the rendezvous {self.run_id!r} is closed")
        if key != self._keys.round:
            return None
        record = RoundRecord.decode(key, value)
        if record.world_size != self._world_size or record.chunks != 0:
            raise RendezvousError(
                f"static rendezvous {self.run_id!r}: the round record has "
                f"{record.world_size} ranks, this handler expects {self._world_size}"
            )
        return record

    async def _missing(self) -> list[str]:
        """The ranks not registered now (for the timeout's message: read once, at the end)."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            present = {
                kv.key.rsplit("/", 1)[1] for kv in await self._store.range(self._keys.nodes_of(0))
            }
            return [n for r in range(self._world_size) if (n := self.node_name(r)) not in present]
        return []  # pragma: no cover - the store did not answer within 5 s

    def _apply(self, key: str, value: bytes, put: bool, found: dict[str, NodeRecord]) -> None:
        if key == self._keys.closed and put:
            ClosedRecord.decode(key, value)
            self._closed_seen = True
            raise RendezvousClosedError(f"the rendezvous {self.run_id!r} is closed")
        parsed = self._keys.parse_node_key(key)
        if parsed is None or parsed[0] != 0 or self._rank_of(parsed[1]) is None:
            return
        if put:
            found[parsed[1]] = NodeRecord.decode(key, value)
        else:
            found.pop(parsed[1], None)

    def _rank_of(self, node: str) -> int | None:
        """The rank of a node id ``rank<N>`` of this world, None for anything else."""
        digits = node[4:]
        if not node.startswith("rank") or not digits.isdigit() or digits != str(int(digits)):
            return None
        rank = int(digits)
        return rank if rank < self._world_size else None

    async def is_closed(self) -> bool:
        if self._closed_seen:
            return True
        with self._translate("is_closed"):
            kv = await self._store.get(self._keys.closed)
        if kv is not None:
            ClosedRecord.decode(kv.key, kv.value)
            self._closed_seen = True
        return self._closed_seen

    async def set_closed(self) -> None:
        if self._closed_seen:
            return
        with self._translate("set_closed"):
            await self._store.put(self._keys.closed, ClosedRecord(0).encode())
        self._closed_seen = True

    async def num_nodes_waiting(self) -> int:
        """Always 0: a static job takes no late nodes."""
        self._check_usable()
        return 0

    async def wait_for_change(self) -> RendezvousEvent:
        """``PARTICIPANT_LOST`` when a rank's lease goes, ``CLOSED``, or ``ERROR``."""
        if self._handler_closed:
            raise RendezvousClosedError(f"the rendezvous handler for {self.run_id!r} is closed")
        if self._result is None:
            raise RendezvousError("wait_for_change() needs a completed round: call next_rendezvous")
        if self._closed_seen:
            return RendezvousEvent(RendezvousEventKind.CLOSED, 0, 0)
        keeper = self._keeper
        if keeper is None or keeper.lost:
            return RendezvousEvent(RendezvousEventKind.ERROR, 0, 0, error=self._error)
        me = self._result.node_id
        try:
            with keeper.guard(), self._translate("wait_for_change"):
                if self._watch is None:
                    self._watch = self._store.watch(
                        self._keys.root, start_revision=self._revision + 1
                    )
                async for event in self._watch:
                    kv = event.kv
                    if kv.key == self._keys.closed and event.type is EventType.PUT:
                        self._closed_seen = True
                        return RendezvousEvent(RendezvousEventKind.CLOSED, 0, event.revision)
                    parsed = self._keys.parse_node_key(kv.key)
                    if (
                        event.type is EventType.DELETE
                        and parsed is not None
                        and parsed[0] == 0
                        and self._rank_of(parsed[1]) is not None
                        and parsed[1] != me
                    ):
                        return RendezvousEvent(
                            RendezvousEventKind.PARTICIPANT_LOST, 0, event.revision, parsed[1]
                        )
        except LeaseExpiredError as exc:
            self._error = exc
            return RendezvousEvent(RendezvousEventKind.ERROR, 0, 0, error=exc)
        raise RendezvousConnectionError(f"the watch of {self.run_id!r} ended")  # pragma: no cover

    async def shutdown(self) -> bool:
        """Close the run and leave; False if closing failed."""
        ok = True
        try:
            if not self._handler_closed:
                await self.set_closed()
        except RendezvousError:
            ok = False
        await self.aclose()
        return ok

    async def aclose(self) -> None:
        """Leave: revoke the lease (this rank's record vanishes)."""
        if self._handler_closed:
            return
        self._handler_closed = True
        watch, self._watch = self._watch, None
        if watch is not None:
            with contextlib.suppress(StoreError):
                await watch.aclose()
        if self._keeper is not None:
            await self._keeper.aclose()
        if self._owns_store:
            await self._store.aclose()
