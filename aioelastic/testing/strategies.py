"""Hypothesis strategies for store operations and rendezvous scenarios.

Store operations (usable against any :class:`~aioelastic.store.Store`)::

    from aioelastic.testing.strategies import run_ops, store_op_sequences

    @given(store_op_sequences())
    def test_my_backend_matches_memory(ops):
        async def main():
            async with MemoryStore() as reference, open_my_store() as mine:
                assert await run_ops(mine, ops) == await run_ops(reference, ops)
        asyncio.run(main())

Each op is a small frozen dataclass with ``await op.apply(store)``; :func:`run_ops` applies a
sequence and returns comparable outcomes (revisions relative to the store's revision before the
first op, errors as their class name), so two backends can be compared whatever revision or
namespace they start at. The building blocks (:func:`keys`, :func:`values`, :func:`prefixes`,
:func:`lease_ttls`, ...) are what :class:`~aioelastic.testing.stateful.StoreMachine` draws from.

Rendezvous scenarios: :func:`rendezvous_scenarios` draws sizes (``min_nodes``, ``max_nodes``,
a last-call window) and a sequence of :class:`RendezvousStep` (join, late join, leave, crash,
lease revocation, close, wait, quiesce); :func:`~aioelastic.testing.rendezvous_machine.
run_rendezvous_scenario` replays one with every invariant checked, and
:class:`~aioelastic.testing.rendezvous_machine.RendezvousMachine` draws its rules from the same
strategies. Needs hypothesis (``aioelastic[test]``).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from hypothesis import strategies as st

from ..errors import StoreError
from ..store import CasResult, KeyValue, RangeResult, Store
from ._keys import UNUSUAL_KEYS

__all__ = [
    "KEYS",
    "PREFIXES",
    "STEP_KINDS",
    "UNUSUAL_KEYS",
    "Add",
    "CompareAndDelete",
    "CompareAndSwap",
    "Delete",
    "DeletePrefix",
    "Get",
    "Put",
    "Range",
    "RendezvousScenario",
    "RendezvousStep",
    "StoreOp",
    "add_deltas",
    "any_keys",
    "cas_expectations",
    "keys",
    "lease_ttls",
    "node_slots",
    "prefixes",
    "range_limits",
    "rendezvous_scenarios",
    "rendezvous_sizes",
    "rendezvous_steps",
    "run_ops",
    "store_op_sequences",
    "store_ops",
    "values",
    "wait_seconds",
]

# -- store operations: the building blocks --------------------------------------------------------

#: Keys chosen to collide on prefixes (``a`` is a prefix of ``a/b``, ``ab`` and ``a\nb``), with
#: a few :data:`UNUSUAL_KEYS` among them so that every backend's transport is checked too.
KEYS: tuple[str, ...] = ("a", "a/b", "a/c", "ab", "a\nb", "b", "b/a", "b\r\n", "..", " ?#%0A")
#: Prefixes that split :data:`KEYS` in different ways (``""`` is every key).
PREFIXES: tuple[str, ...] = ("", "a", "a/", "a\n", "b", ".", " ?#%")


def keys(pool: Sequence[str] = KEYS) -> st.SearchStrategy[str]:
    """Keys from a small pool, so that operations hit the same keys and prefixes often."""
    return st.sampled_from(tuple(pool))


def any_keys(max_size: int = 12) -> st.SearchStrategy[str]:
    """Any key the protocol allows (a non-empty ``str`` of Unicode scalar values: no lone
    surrogates, which have no UTF-8 form), :data:`UNUSUAL_KEYS` drawn often."""
    text = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=max_size)
    return st.sampled_from(UNUSUAL_KEYS) | text


def prefixes(pool: Sequence[str] = PREFIXES) -> st.SearchStrategy[str]:
    """Prefixes for ``range`` / ``delete_prefix`` / ``watch``."""
    return st.sampled_from(tuple(pool))


def values(max_size: int = 8) -> st.SearchStrategy[bytes]:
    """Values: any bytes (empty included) up to ``max_size``."""
    return st.binary(max_size=max_size)


def range_limits(max_limit: int = 4) -> st.SearchStrategy[int | None]:
    """``limit`` of a ``range``: none, or 1..``max_limit``."""
    return st.none() | st.integers(1, max_limit)


#: What a compare-and-swap expects: the key's current ``mod_revision``, absence (0), or a stale
#: revision.
CasExpectation = Literal["current", "absent", "stale"]


def cas_expectations() -> st.SearchStrategy[CasExpectation]:
    """``"current"``, ``"absent"`` or ``"stale"`` (see :class:`CompareAndSwap`)."""
    return st.sampled_from(("current", "absent", "stale"))


def add_deltas(bound: int = 5) -> st.SearchStrategy[int]:
    """Deltas for ``add``, negative included."""
    return st.integers(-bound, bound)


def lease_ttls(low: int = 2, high: int = 8) -> st.SearchStrategy[int]:
    """Whole-second lease TTLs (etcd grants whole seconds)."""
    return st.integers(low, high)


# -- store operations: ops usable against any store ----------------------------------------------


def _shift(kv: KeyValue | None, base: int) -> tuple[Any, ...] | None:
    if kv is None:
        return None
    kv = replace(kv, create_revision=kv.create_revision - base, mod_revision=kv.mod_revision - base)
    return (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)


class StoreOp(abc.ABC):
    """One store operation: ``await op.apply(store)`` returns the store's answer."""

    @abc.abstractmethod
    async def apply(self, store: Store) -> Any:
        """Run the operation on ``store`` and return what the store returned."""

    def normalise(self, result: Any, base: int) -> Any:
        """``result`` made comparable across stores: revisions relative to ``base``."""
        return result


@dataclass(frozen=True)
class Put(StoreOp):
    key: str
    value: bytes

    async def apply(self, store: Store) -> int:
        return await store.put(self.key, self.value)

    def normalise(self, result: Any, base: int) -> Any:
        return result - base


@dataclass(frozen=True)
class Get(StoreOp):
    key: str

    async def apply(self, store: Store) -> KeyValue | None:
        return await store.get(self.key)

    def normalise(self, result: Any, base: int) -> Any:
        return _shift(result, base)


@dataclass(frozen=True)
class Delete(StoreOp):
    key: str

    async def apply(self, store: Store) -> int:
        return await store.delete(self.key)


@dataclass(frozen=True)
class DeletePrefix(StoreOp):
    prefix: str

    async def apply(self, store: Store) -> int:
        return await store.delete_prefix(self.prefix)


@dataclass(frozen=True)
class Range(StoreOp):
    prefix: str
    limit: int | None = None

    async def apply(self, store: Store) -> RangeResult:
        return await store.range(self.prefix, limit=self.limit)

    def normalise(self, result: Any, base: int) -> Any:
        return (
            [_shift(kv, base) for kv in result.kvs],
            result.revision - base,
            result.count,
            result.more,
        )


@dataclass(frozen=True)
class CompareAndSwap(StoreOp):
    """Swap ``key`` to ``value`` if its ``mod_revision`` is what ``expect`` says: ``current``
    (read first: succeeds unless another writer intervened), ``absent`` (0: only if absent) or
    ``stale`` (a revision the key does not have: always fails)."""

    key: str
    value: bytes
    expect: CasExpectation = "current"

    async def apply(self, store: Store) -> CasResult:
        current = await store.get(self.key)
        revision = current.mod_revision if current is not None else 0
        expected = {
            "current": revision,
            "absent": 0,
            "stale": revision + 1,  # never the key's revision (and not 0 when absent)
        }[self.expect]
        return await store.compare_and_swap(self.key, expected, self.value)

    def normalise(self, result: Any, base: int) -> Any:
        return (result.succeeded, result.revision - base, _shift(result.kv, base))


@dataclass(frozen=True)
class CompareAndDelete(StoreOp):
    """Delete ``key`` if its ``mod_revision`` is the one read just before (``stale``: one past
    it, which must fail)."""

    key: str
    stale: bool = False

    async def apply(self, store: Store) -> CasResult:
        current = await store.get(self.key)
        revision = (current.mod_revision if current is not None else 1) + int(self.stale)
        return await store.compare_and_delete(self.key, revision)

    def normalise(self, result: Any, base: int) -> Any:
        return (result.succeeded, result.revision - base, _shift(result.kv, base))


@dataclass(frozen=True)
class Add(StoreOp):
    key: str
    delta: int

    async def apply(self, store: Store) -> int:
        return await store.add(self.key, self.delta)


def store_ops(
    key_pool: Sequence[str] = KEYS, prefix_pool: Sequence[str] = PREFIXES
) -> st.SearchStrategy[StoreOp]:
    """One operation of any kind (counters for :class:`Add` live under keys of their own)."""
    k, p = keys(key_pool), prefixes(prefix_pool)
    return st.one_of(
        st.builds(Put, k, values()),
        st.builds(Get, k),
        st.builds(Delete, k),
        st.builds(DeletePrefix, p),
        st.builds(Range, p, range_limits()),
        st.builds(CompareAndSwap, k, values(), cas_expectations()),
        st.builds(CompareAndDelete, k, st.booleans()),
        st.builds(Add, st.sampled_from(("n1", "n2")), add_deltas()),
    )


def store_op_sequences(
    min_size: int = 1,
    max_size: int = 30,
    key_pool: Sequence[str] = KEYS,
    prefix_pool: Sequence[str] = PREFIXES,
) -> st.SearchStrategy[list[StoreOp]]:
    """Lists of :func:`store_ops`."""
    return st.lists(store_ops(key_pool, prefix_pool), min_size=min_size, max_size=max_size)


async def run_ops(store: Store, ops: Sequence[StoreOp]) -> list[tuple[str, Any]]:
    """Apply ``ops`` in order; each outcome is ``("ok", normalised result)`` or ``("error",
    exception class name)`` for store and argument errors. Run it on a fresh key space (a new
    store, or ``store.namespace(...)``)."""
    base = await store.current_revision()
    outcomes: list[tuple[str, Any]] = []
    for op in ops:
        try:
            result = await op.apply(store)
        except (StoreError, ValueError, TypeError) as exc:
            outcomes.append(("error", type(exc).__name__))
        else:
            outcomes.append(("ok", op.normalise(result, base)))
    return outcomes


# -- rendezvous scenarios -----------------------------------------------------------------------

#: The kinds of :class:`RendezvousStep`.
STEP_KINDS: tuple[str, ...] = (
    "join",
    "late_join",
    "leave",
    "crash",
    "revoke",
    "close",
    "wait",
    "quiesce",
)

StepKind = Literal["join", "late_join", "leave", "crash", "revoke", "close", "wait", "quiesce"]


@dataclass(frozen=True)
class RendezvousStep:
    """One step of a rendezvous scenario, acting on the node in ``slot``:

    - ``join``: a new node joins the slot (a late node, or a restart if the slot's node died), or
      the slot's live node re-rendezvouses;
    - ``late_join``: a brand-new node joins the ``slot``-th free slot (none free: nothing);
    - ``leave``: the node leaves cleanly (``aclose``); ``crash``: its process dies (no keep-alive,
      no clean exit; its lease expires after the TTL); ``revoke``: its lease is lost while it
      lives on (a partition longer than the TTL); ``close``: it closes the run;
    - ``wait``: ``seconds`` pass; ``quiesce``: faults stop and every live node rejoins until
      the rounds settle, then liveness is checked.
    """

    kind: StepKind
    slot: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class RendezvousScenario:
    """Sizes and steps: what :func:`rendezvous_scenarios` draws."""

    min_nodes: int
    max_nodes: int
    last_call: float
    steps: tuple[RendezvousStep, ...]


#: Waits that cross the interesting deadlines of the default machine config (TTL 6 s, last
#: call 5 s).
WAITS: tuple[float, ...] = (0.5, 2.0, 5.0, 7.0, 30.0)


def rendezvous_sizes(
    max_min_nodes: int = 3, max_extra: int = 2, last_calls: Sequence[float] = (0.0, 5.0)
) -> st.SearchStrategy[tuple[int, int, float]]:
    """``(min_nodes, max_nodes, last_call_timeout)`` with ``1 <= min <= max <= min + extra``."""
    return st.tuples(
        st.integers(1, max_min_nodes), st.integers(0, max_extra), st.sampled_from(tuple(last_calls))
    ).map(lambda t: (t[0], t[0] + t[1], t[2]))


def node_slots(slots: int = 6) -> st.SearchStrategy[int]:
    """A node slot: an index in ``0..slots-1`` (a slot holds one node at a time)."""
    return st.integers(0, slots - 1)


def wait_seconds(choices: Sequence[float] = WAITS) -> st.SearchStrategy[float]:
    """How long a ``wait`` step lets (virtual) time pass."""
    return st.sampled_from(tuple(choices))


def rendezvous_steps(
    slots: int = 6,
    waits: Sequence[float] = WAITS,
    kinds: Sequence[str] = STEP_KINDS,
) -> st.SearchStrategy[RendezvousStep]:
    """One :class:`RendezvousStep` of the given ``kinds``."""
    unknown = set(kinds) - set(STEP_KINDS)
    if unknown or not kinds:
        raise ValueError(f"kinds must be a non-empty subset of {STEP_KINDS}, got {list(kinds)}")
    options: list[st.SearchStrategy[RendezvousStep]] = []
    for kind in kinds:
        if kind == "wait":
            options.append(st.builds(RendezvousStep, st.just("wait"), seconds=wait_seconds(waits)))
        elif kind == "quiesce":
            options.append(st.just(RendezvousStep("quiesce")))
        else:
            options.append(st.builds(RendezvousStep, st.just(kind), node_slots(slots)))
    return st.one_of(options)


def rendezvous_scenarios(
    slots: int = 6,
    min_steps: int = 1,
    max_steps: int = 30,
    max_min_nodes: int = 3,
    max_extra: int = 2,
    last_calls: Sequence[float] = (0.0, 5.0),
    waits: Sequence[float] = WAITS,
    kinds: Sequence[str] = STEP_KINDS,
) -> st.SearchStrategy[RendezvousScenario]:
    """A whole scenario: sizes from :func:`rendezvous_sizes`, then steps."""
    return st.builds(
        lambda sizes, steps: RendezvousScenario(sizes[0], sizes[1], sizes[2], tuple(steps)),
        rendezvous_sizes(max_min_nodes, max_extra, last_calls),
        st.lists(rendezvous_steps(slots, waits, kinds), min_size=min_steps, max_size=max_steps),
    )
