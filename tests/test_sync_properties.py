"""Property tests of the primitives under random schedules, crashes and partitions (virtual time).

Each example runs a few "processes" (clients of one memory engine, each behind a fault injector)
that acquire and release, hold for random times, crash (cut off and killed, their lease revoked or
left to expire) or get partitioned while running. A shared log, appended synchronously, records
who entered and left the critical section; the properties are checked on it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import NamedTuple

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioelastic.errors import LeaseExpiredError, StoreError, SyncTimeoutError
from aioelastic.store import MemoryEngine, MemoryStore, Store
from aioelastic.store.memory import Commit
from aioelastic.sync import Barrier, Election, LeaseConfig, Lock
from aioelastic.testing import FaultInjectingStore, run_virtual

CONFIG = LeaseConfig(ttl=3.0, renew_deadline=2.0, retry_period=0.5)
FATES = ("release", "crash_expire", "crash_revoke", "partition")


@dataclass(frozen=True)
class Op:
    delay: float
    mode: str  # "acquire" | "try" | "timeout"
    hold: float
    fate: str
    fate_after: float


class Mark(NamedTuple):
    """One line of the critical-section log."""

    what: str  # "enter" | "exit"
    who: int
    token: int  # fencing token / term
    at: float  # loop time
    lost: bool = False  # (exit) left because the lease was lost


ops_strategy = st.lists(
    st.builds(
        Op,
        delay=st.integers(0, 40).map(lambda n: n / 10),
        mode=st.sampled_from(["acquire", "acquire", "try", "timeout"]),
        hold=st.integers(0, 60).map(lambda n: n / 10),  # up to twice the TTL
        fate=st.sampled_from(FATES),
        fate_after=st.integers(0, 40).map(lambda n: n / 10),
    ),
    min_size=1,
    max_size=6,
)

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


async def _apply_fate(op: Op, store: FaultInjectingStore, scope: anyio.CancelScope) -> None:
    await anyio.sleep(op.fate_after)
    if op.fate == "release":
        return
    store.partition()  # cut off: nothing it does reaches the store any more
    if op.fate != "partition":  # (a partitioned process runs on: it must stop on its own)
        scope.cancel()  # the process dies


def _run_contenders(ops: list[Op], kind: str) -> list[Mark]:
    """Run ``ops`` against a lock or an election; return the enter/exit log."""
    log: list[Mark] = []
    observed: list[int] = []

    async def main() -> None:
        engine = MemoryEngine()
        admin = MemoryStore(engine)

        async def process(index: int, op: Op) -> None:
            await anyio.sleep(op.delay)
            store = FaultInjectingStore(MemoryStore(engine))
            lease: list[int] = []
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_apply_fate, op, store, scope)
                    with contextlib.suppress(LeaseExpiredError, SyncTimeoutError, StoreError):
                        await contend(index, op, store, lease)
                    tg.cancel_scope.cancel()
            if scope.cancelled_caught and op.fate == "crash_revoke" and lease:
                # once the process is dead, an operator (or a supervisor) revokes its lease
                with contextlib.suppress(StoreError):
                    await admin.lease_revoke(lease[0])  # (unless it expired already)

        async def contend(index: int, op: Op, store: Store, lease: list[int]) -> None:
            if kind == "lock":
                lock = Lock(store, "L", config=CONFIG)
                if op.mode == "try":
                    if not await lock.try_acquire():
                        return
                else:
                    await lock.acquire(timeout=1.0 if op.mode == "timeout" else None)
                lease.append(lock.lease.id)
                try:
                    with lock.guard():
                        token = lock.fencing_token
                        log.append(Mark("enter", index, token, anyio.current_time()))
                        try:
                            await anyio.sleep(op.hold)
                        finally:
                            lost = lock.lease.lost
                            log.append(Mark("exit", index, token, anyio.current_time(), lost))
                finally:
                    with anyio.CancelScope(shield=True):
                        await lock.release()
            else:
                election = Election(store, "E", config=CONFIG)
                timeout = 1.0 if op.mode == "timeout" else None
                async with election.leadership(f"p{index}", timeout=timeout) as me:
                    lease.append(election.lease.id)
                    log.append(Mark("enter", index, me.term, anyio.current_time()))
                    try:
                        await anyio.sleep(op.hold)
                    finally:
                        lost = election.lease.lost
                        log.append(Mark("exit", index, me.term, anyio.current_time(), lost))

        async def observe() -> None:
            async with Election(MemoryStore(engine), "E").observe() as leaders:
                async for leader in leaders:
                    if leader is not None:
                        observed.append(leader.term)

        with anyio.fail_after(3600):
            async with anyio.create_task_group() as outer:
                if kind == "election":
                    outer.start_soon(observe)
                async with anyio.create_task_group() as tg:
                    for index, op in enumerate(ops):
                        tg.start_soon(process, index, op)
                await anyio.sleep(CONFIG.ttl * 2)  # every abandoned lease has expired by now
                outer.cancel_scope.cancel()
            assert len(engine) == 0, f"keys left behind: {engine.range('').kvs}"
        if kind == "election":  # an observer sees terms in order, and every leader that led
            assert observed == sorted(observed), observed
            assert {m.token for m in log if m.what == "enter"} <= set(observed)

    run_virtual(main)
    return log


def _check_exclusion(log: list[Mark]) -> None:
    holder: int | None = None
    tokens: list[int] = []
    last_exit: Mark | None = None
    for mark in log:
        if mark.what == "enter":
            assert holder is None, f"{mark.who} entered while {holder} held it: {log}"
            holder = mark.who
            tokens.append(mark.token)
            if last_exit is not None and last_exit.lost:
                # a holder cut off from the store stops at the renew deadline, the store hands
                # its lease on at the TTL: the gap between the two is the safety margin
                margin = CONFIG.ttl - CONFIG.renew_deadline
                gap = mark.at - last_exit.at
                assert gap >= margin - 0.05, f"only {gap:.3f}s after a lost holder: {log}"
        else:
            assert holder == mark.who, log
            holder = None
            last_exit = mark
    assert tokens == sorted(tokens), f"tokens not increasing: {tokens}"
    assert len(set(tokens)) == len(tokens), f"a token was reused: {tokens}"


@SETTINGS
@given(ops=ops_strategy)
def test_lock_never_has_two_holders(ops: list[Op]) -> None:
    log = _run_contenders(ops, "lock")
    _check_exclusion(log)
    # liveness: a plain acquire of a process that never failed got the lock
    for index, op in enumerate(ops):
        if op.mode == "acquire" and op.fate == "release":
            assert ("enter", index) in {(m.what, m.who) for m in log}, (index, log)


@SETTINGS
@given(ops=ops_strategy)
def test_election_has_at_most_one_leader_per_term(ops: list[Op]) -> None:
    log = _run_contenders(ops, "election")
    _check_exclusion(log)
    for index, op in enumerate(ops):
        if op.mode == "acquire" and op.fate == "release":
            assert ("enter", index) in {(m.what, m.who) for m in log}, (index, log)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parties=st.integers(1, 4),
    arrivals=st.lists(
        st.tuples(st.integers(0, 50).map(lambda n: n / 10), st.booleans()),
        min_size=1,
        max_size=6,
    ),
)
def test_nobody_passes_a_barrier_before_n_entered(
    parties: int, arrivals: list[tuple[float, bool]]
) -> None:
    """``arrivals``: (when, dies) per party; a dying party is cut off and killed 0.5 s in."""
    log: list[tuple[str, int]] = []
    present: set[str] = set()

    def on_commit(commit: Commit) -> None:
        for event in commit.events:
            if "/parties/" not in event.kv.key:
                continue
            if event.type.value == "PUT":
                present.add(event.kv.key)
            else:
                present.discard(event.kv.key)
        log.append(("present", len(present)))

    async def main() -> None:
        engine = MemoryEngine()
        engine.on_commit.append(on_commit)

        async def party(index: int, when: float, dies: bool) -> None:
            await anyio.sleep(when)
            store = FaultInjectingStore(MemoryStore(engine))
            with anyio.CancelScope() as scope:
                if dies:

                    async def die() -> None:
                        await anyio.sleep(0.5)
                        store.partition()
                        scope.cancel()

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(die)
                        try:
                            await Barrier(store, "B", parties, config=CONFIG).wait(timeout=30)
                            log.append(("pass", index))
                        except StoreError:
                            pass  # cut off while waiting
                        tg.cancel_scope.cancel()
                else:
                    try:
                        await Barrier(store, "B", parties, config=CONFIG).wait(timeout=30)
                        log.append(("pass", index))
                    except SyncTimeoutError:
                        log.append(("timeout", index))

        async with anyio.create_task_group() as tg:
            for index, (when, dies) in enumerate(arrivals):
                tg.start_soon(party, index, when, dies)

    run_virtual(main)
    passes = [i for i, (what, _) in enumerate(log) if what == "pass"]
    if passes:
        opened = next(i for i, (what, n) in enumerate(log) if what == "present" and n >= parties)
        assert opened < passes[0], log
    survivors = [index for index, (_, dies) in enumerate(arrivals) if not dies]
    if len(survivors) >= parties:  # enough live parties: every survivor passes
        assert {i for what, i in log if what == "pass"} >= set(survivors), log
