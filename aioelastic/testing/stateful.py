"""A hypothesis state machine for the store protocol: random operation sequences against a
backend, checked step by step against a plain model (a dict, a revision counter, leases with
deadlines, and the list of events a watch must deliver).

hypothesis has no async rules (HypothesisWorks/hypothesis#4107), so the machine owns one event
loop per example and drives the store with ``loop.run_until_complete``. Subclass
:class:`StoreMachine` and implement :meth:`StoreMachine.open_store`; set ``time_travel = True``
for backends on a :class:`~aioelastic.testing.VirtualTimeLoop` (lease expiry is then explored
too). Then ``TestX = MyMachine.TestCase``. Needs hypothesis (``aioelastic[test]``).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import anyio
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from ..errors import LeaseNotFoundError, StoreClosedError
from ..store import (
    CasResult,
    Compare,
    Delete,
    DeleteResult,
    EventType,
    Get,
    GetResult,
    KeyValue,
    OpResult,
    Put,
    PutResult,
    Range,
    RangeResult,
    Store,
    Txn,
    TxnOp,
    TxnResult,
    Watch,
)
from ..store._txn import DeletePrefix, check_txn
from . import strategies
from ._virtual_time import VirtualTimeLoop
from .strategies import KEYS, PREFIXES

__all__ = ["KEYS", "PREFIXES", "StoreMachine", "StoreModel"]

T = TypeVar("T")

keys = strategies.keys()
values = strategies.values()


@dataclass
class ModelLease:
    ttl: float
    deadline: float
    keys: set[str] = field(default_factory=set)


class StoreModel:
    """The reference semantics in a few lines: what every backend must agree with."""

    def __init__(self, base_revision: int) -> None:
        self.data: dict[str, KeyValue] = {}
        self.revision = base_revision
        self.leases: dict[int, ModelLease] = {}
        self.events: list[tuple[EventType, str, int]] = []
        self.now = 0.0

    def put(self, key: str, value: bytes, lease: int) -> int:
        if lease and lease not in self.leases:
            raise LeaseNotFoundError(lease)
        self.revision += 1
        old = self.data.get(key)
        if old is not None and old.lease and old.lease in self.leases:
            self.leases[old.lease].keys.discard(key)
        if old is None:
            kv = KeyValue(key, value, self.revision, self.revision, 1, lease)
        else:
            kv = KeyValue(key, value, old.create_revision, self.revision, old.version + 1, lease)
        if lease:
            self.leases[lease].keys.add(key)
        self.data[key] = kv
        self.events.append((EventType.PUT, key, self.revision))
        return self.revision

    def delete(self, keys: list[str]) -> int:
        present = sorted(k for k in keys if k in self.data)
        if present:
            self.revision += 1
            for key in present:
                old = self.data.pop(key)
                if old.lease and old.lease in self.leases:
                    self.leases[old.lease].keys.discard(key)
                self.events.append((EventType.DELETE, key, self.revision))
        return len(present)

    def txn(self, txn: Txn) -> TxnResult:
        """A checked transaction (its puts carry no lease): compares on the state before it,
        then one branch's operations in order, every write at one new revision (none if
        nothing changed)."""
        succeeded = all(c.holds(self.data.get(c.key)) for c in txn.compare)
        revision = self.revision + 1
        changed = False
        results: list[OpResult] = []
        for op in txn.success if succeeded else txn.failure:
            if isinstance(op, Put):
                old = self.data.get(op.key)
                kv = KeyValue(op.key, op.value, revision, revision, 1, 0)
                if old is not None:
                    kv = KeyValue(op.key, op.value, old.create_revision, revision, old.version + 1)
                self._detach(old)
                self.data[op.key] = kv
                self.events.append((EventType.PUT, op.key, revision))
                results.append(PutResult(kv, old))
                changed = True
            elif isinstance(op, Get):
                results.append(GetResult(self.data.get(op.key)))
            elif isinstance(op, Range):
                found = sorted((k, kv) for k, kv in self.data.items() if k.startswith(op.prefix))
                shown = found if op.limit is None else found[: op.limit]
                kvs = tuple(kv for _, kv in shown)
                results.append(RangeResult(kvs, 0, len(found), len(shown) < len(found)))
            else:
                if isinstance(op, Delete):
                    gone = [op.key] if op.key in self.data else []
                else:
                    gone = sorted(k for k in self.data if k.startswith(op.prefix))
                for key in gone:
                    self._detach(self.data.pop(key))
                    self.events.append((EventType.DELETE, key, revision))
                results.append(DeleteResult(len(gone)))
                changed = changed or bool(gone)
        if changed:
            self.revision = revision
        final = [
            RangeResult(r.kvs, self.revision, r.count, r.more) if isinstance(r, RangeResult) else r
            for r in results
        ]
        return TxnResult(succeeded, self.revision, tuple(final))

    def _detach(self, kv: KeyValue | None) -> None:
        """``kv`` is overwritten or deleted: its lease no longer holds its key."""
        if kv is not None and kv.lease and kv.lease in self.leases:
            self.leases[kv.lease].keys.discard(kv.key)

    def end_lease(self, lease_id: int) -> None:
        lease = self.leases.pop(lease_id)
        self.delete(sorted(lease.keys))

    def advance(self, seconds: float) -> None:
        target = self.now + seconds
        while True:
            due = [(lease.deadline, i) for i, lease in self.leases.items()]
            due = [d for d in due if d[0] <= target]
            if not due:
                break
            _, lease_id = min(due)
            self.end_lease(lease_id)
        self.now = target


_COMPARE_SPECS = st.tuples(
    keys,
    st.sampled_from(["value", "version", "create_revision", "mod_revision", "lease"]),
    st.sampled_from(["==", "!=", "<", ">"]),
    st.sampled_from([-1, 0, 1]),
)
_TXN_OP_SPECS = st.one_of(
    st.tuples(st.just("put"), keys, values),
    st.tuples(st.just("get"), keys),
    st.tuples(st.just("range"), strategies.prefixes(), strategies.range_limits()),
    st.tuples(st.just("delete"), keys),
    st.tuples(st.just("delete_prefix"), strategies.prefixes()),
)


def _txn_op(spec: tuple[Any, ...]) -> TxnOp:
    kind, *args = spec
    op: TxnOp = {"put": Put, "get": Get, "range": Range, "delete": Delete}.get(kind, DeletePrefix)(
        *args
    )
    return op


class StoreMachine(RuleBasedStateMachine):
    """Random store operations, each checked against :class:`StoreModel`."""

    #: Explore lease expiry by moving a virtual clock (needs an in-process backend).
    time_travel: ClassVar[bool] = False

    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.loop: asyncio.AbstractEventLoop = (
            VirtualTimeLoop() if self.time_travel else asyncio.new_event_loop()
        )
        self.store: Store | None = None
        self.watch: Watch | None = None
        self.received: list[tuple[EventType, str, int]] = []
        self.grants = 0

    # -- to implement

    async def open_store(self) -> Store:
        """A connected store with an empty key space (a fresh namespace is fine)."""
        raise NotImplementedError

    # -- plumbing

    def run(self, awaitable: Any) -> Any:
        return self.loop.run_until_complete(awaitable)

    @property
    def s(self) -> Store:
        assert self.store is not None
        return self.store

    @initialize()
    def start(self) -> None:
        self.store = self.run(self.open_store())
        self.model = StoreModel(self.run(self.s.current_revision()))
        self.model.now = self.loop.time()
        self.watch = self.s.watch("")
        self.run(self.watch.start())

    def teardown(self) -> None:
        try:
            if self.watch is not None:
                self.run(self.watch.aclose())
            if self.store is not None:
                # A clean exit revokes its leases: over an http session, closing would revoke
                # them anyway once the session's grace passes, in the middle of the next example.
                for lease_id in list(self.model.leases):
                    # (a subclass may have revoked them and closed its store already)
                    with contextlib.suppress(LeaseNotFoundError, StoreClosedError):
                        self.run(self.s.lease_revoke(lease_id))
                self.run(self.store.aclose())
        finally:
            self.loop.close()

    def expect_same(self, got: KeyValue | None, key: str) -> None:
        assert got == self.model.data.get(key), (key, got, self.model.data.get(key))

    # -- rules

    @rule(key=keys, value=values, lease=leases)
    def put_leased(self, key: str, value: bytes, lease: int) -> None:
        self._put(key, value, lease)

    @rule(keys=st.lists(keys, min_size=2, max_size=4, unique=True), lease=leases)
    def put_several_leased(self, keys: list[str], lease: int) -> None:
        for key in keys:
            self._put(key, b"leased", lease)

    def _put(self, key: str, value: bytes, lease_id: int) -> None:
        try:
            expected: int | Exception = self.model.put(key, value, lease_id)
        except LeaseNotFoundError as exc:
            expected = exc
        try:
            got: int | Exception = self.run(self.s.put(key, value, lease=lease_id))
        except LeaseNotFoundError as exc:
            got = exc
        assert type(got) is type(expected)
        if isinstance(expected, int):
            assert got == expected

    @rule(key=keys, value=values)
    def put_plain(self, key: str, value: bytes) -> None:
        assert self.run(self.s.put(key, value)) == self.model.put(key, value, 0)

    @rule(key=keys)
    def get(self, key: str) -> None:
        self.expect_same(self.run(self.s.get(key)), key)

    @rule(key=keys)
    def delete(self, key: str) -> None:
        assert self.run(self.s.delete(key)) == self.model.delete([key])

    @rule(prefix=strategies.prefixes())
    def delete_prefix(self, prefix: str) -> None:
        matching = [k for k in self.model.data if k.startswith(prefix)]
        assert self.run(self.s.delete_prefix(prefix)) == self.model.delete(matching)

    @rule(prefix=strategies.prefixes(), limit=strategies.range_limits())
    def range(self, prefix: str, limit: int | None) -> None:
        result = self.run(self.s.range(prefix, limit=limit))
        expected = sorted((k, kv) for k, kv in self.model.data.items() if k.startswith(prefix))
        shown = expected if limit is None else expected[:limit]
        assert list(result.kvs) == [kv for _, kv in shown]
        assert result.count == len(expected)
        assert result.more == (len(shown) < len(expected))
        assert result.revision == self.model.revision

    @rule(key=keys, value=values, which=strategies.cas_expectations())
    def compare_and_swap(self, key: str, value: bytes, which: str) -> None:
        current = self.model.data.get(key)
        expected_rev = {
            "current": current.mod_revision if current else 0,
            "absent": 0,
            "stale": (current.mod_revision - 1) if current and current.mod_revision > 1 else 1,
        }[which]
        result: CasResult = self.run(self.s.compare_and_swap(key, expected_rev, value))
        applies = (current.mod_revision if current else 0) == expected_rev
        assert result.succeeded == applies
        if applies:
            self.model.put(key, value, 0)
            self.expect_same(result.kv, key)
        else:
            assert result.kv == current
        assert result.revision == self.model.revision

    @rule(key=keys, stale=st.booleans())
    def compare_and_delete(self, key: str, stale: bool) -> None:
        current = self.model.data.get(key)
        expected_rev = (current.mod_revision if current else 1) + (1 if stale else 0)
        result: CasResult = self.run(self.s.compare_and_delete(key, expected_rev))
        applies = current is not None and current.mod_revision == expected_rev
        assert result.succeeded == applies
        if applies:
            self.model.delete([key])
            assert result.kv is None
        else:
            assert result.kv == current

    @rule(key=st.sampled_from(["n1", "n2"]), delta=strategies.add_deltas())
    def add(self, key: str, delta: int) -> None:
        current = self.model.data.get(key)
        total = (int(current.value) if current else 0) + delta
        assert self.run(self.s.add(key, delta)) == total
        self.model.put(key, str(total).encode(), current.lease if current else 0)

    @rule(
        compares=st.lists(_COMPARE_SPECS, max_size=3),
        success=st.lists(_TXN_OP_SPECS, max_size=4),
        failure=st.lists(_TXN_OP_SPECS, max_size=3),
    )
    def txn(
        self,
        compares: list[tuple[str, Any, Any, int]],
        success: list[tuple[Any, ...]],
        failure: list[tuple[Any, ...]],
    ) -> None:
        built = [self._compare(*spec) for spec in compares]
        ops = ([_txn_op(spec) for spec in success], [_txn_op(spec) for spec in failure])
        try:
            checked = check_txn(built, *ops)
        except ValueError:  # one write per key: the store refuses it too, and applies nothing
            try:
                self.run(self.s.txn(compare=built, success=ops[0], failure=ops[1]))
            except ValueError:
                return
            raise AssertionError("the store applied a txn that writes a key twice") from None
        got = self.run(self.s.txn(compare=built, success=ops[0], failure=ops[1]))
        assert got == self.model.txn(checked), (got, checked)

    def _compare(self, key: str, target: Any, op: Any, shift: int) -> Compare:
        """A compare of ``key``'s ``target`` against its current value shifted by ``shift``
        (so that every outcome is likely)."""
        kv = self.model.data.get(key)
        if target == "value":
            current = kv.value if kv is not None else b"x"
            operand: int | bytes = {0: current, 1: current + b"\0", -1: current[:-1]}[shift]
        else:
            operand = max(0, (getattr(kv, target) if kv is not None else 0) + shift)
        return Compare(key, target, op, operand)

    @rule(target=leases, ttl=strategies.lease_ttls())
    def grant(self, ttl: int) -> int:
        self.grants += 1
        # A per-grant offset keeps every deadline distinct, so the expiry order is defined.
        exact = ttl + self.grants * 1e-4 if self.time_travel else float(ttl * 10)
        grant = self.run(self.s.lease_grant(exact))
        self.model.leases[grant.id] = ModelLease(grant.ttl, self.model.now + grant.ttl)
        return int(grant.id)

    @rule(lease=leases)
    def keep_alive(self, lease: int) -> None:
        known = self.model.leases.get(lease)
        if known is None:
            try:
                self.run(self.s.lease_keep_alive(lease))
            except LeaseNotFoundError:
                return
            raise AssertionError(f"keep-alive of lease {lease} that the model says is gone")
        assert self.run(self.s.lease_keep_alive(lease)) == known.ttl
        known.deadline = self.model.now + known.ttl

    @rule(lease=consumes(leases))
    def revoke(self, lease: int) -> None:
        if lease in self.model.leases:
            self.run(self.s.lease_revoke(lease))
            self.model.end_lease(lease)
        else:
            try:
                self.run(self.s.lease_revoke(lease))
            except LeaseNotFoundError:
                return
            raise AssertionError(f"revoked lease {lease} that the model says is gone")

    @precondition(lambda self: self.time_travel)
    @rule(seconds=st.integers(1, 3))
    def advance_time(self, seconds: int) -> None:
        self.run(asyncio.sleep(seconds))
        self.model.advance(seconds)

    # -- invariants

    @invariant()
    def watch_saw_every_event_in_order(self) -> None:
        if self.watch is None:
            return
        watch = self.watch

        async def drain() -> None:
            with anyio.fail_after(10):
                while len(self.received) < len(self.model.events):
                    event = await watch.__anext__()
                    self.received.append((event.type, event.kv.key, event.revision))

        self.run(drain())
        assert self.received == self.model.events

    @invariant()
    def revision_matches(self) -> None:
        if self.store is not None:
            assert self.run(self.s.current_revision()) == self.model.revision
