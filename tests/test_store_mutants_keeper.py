"""Gaps that mutation testing of the lease keeper found (``scripts/mutants store _keeper.py``,
session 14): each test here fails on a realistic bug of the shape of a mutant the rest of the
suite let through. Memory store, virtual time."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable

import anyio

from aioelastic.errors import LeaseExpiredError
from aioelastic.store import MemoryStore
from aioelastic.store._keeper import LeaseKeeper, _by_loop
from aioelastic.testing import FaultInjectingStore, virtual_test

_JOB: contextvars.ContextVar[str] = contextvars.ContextVar("job")


class _SeesTheJob(MemoryStore):
    """Records the caller's context variable at each keep-alive (as a log filter or a tracing
    wrapper of a store would read it)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str | None] = []

    async def _lease_keep_alive(self, lease_id: int) -> float:
        self.seen.append(_JOB.get(None))
        return await super()._lease_keep_alive(lease_id)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@virtual_test
async def test_the_keepers_of_one_loop_share_one_renewal_table_and_closing_leaves_nothing() -> None:
    """One timer per event loop, not one per keeper; a closed keeper's renewal is cancelled, not
    left in the table until it comes due."""
    async with MemoryStore() as store:
        first, second = LeaseKeeper(store, 3.0), LeaseKeeper(store, 6.0)
        await first.start()
        await second.start()
        renewals = _by_loop[asyncio.get_running_loop()]
        assert len(renewals) == 2
        await first.aclose()
        assert len(renewals) == 1
        await second.aclose()
        assert len(renewals) == 0


@virtual_test
async def test_closing_a_keeper_mid_renewal_leaves_the_other_keepers_renewals_alone() -> None:
    async with MemoryStore() as inner:
        faulty = FaultInjectingStore(inner)
        steady = LeaseKeeper(inner, 30.0)  # the loop's first renewal: due at 10 s
        await steady.start()
        stuck = LeaseKeeper(faulty, 3.0)  # renews at 1 s, and that renewal hangs
        await stuck.start()
        faulty.hang("lease_keep_alive")
        await anyio.sleep(1.5)
        assert faulty.calls["lease_keep_alive"] == 1  # in flight
        await stuck.aclose(revoke=False)
        await anyio.sleep(35.0)
        assert steady.statistics().renewals == 3  # at 10, 20 and 30 s
        assert inner.engine.has_lease(steady.id)
        assert not steady.lost
        await steady.aclose()


@virtual_test
async def test_every_lost_callback_runs_once_in_order_and_a_loss_logs_no_callback_error() -> None:
    handler = _Records()
    logger = logging.getLogger("aioelastic.store")
    logger.addHandler(handler)
    try:
        async with MemoryStore() as store:
            called: list[tuple[str, int]] = []
            keeper = LeaseKeeper(store, 3.0)
            bare = LeaseKeeper(store, 3.0)  # no callback at all
            await keeper.start()
            await bare.start()

            def record(name: str) -> Callable[[LeaseExpiredError], None]:
                return lambda error: called.append((name, error.lease_id))

            for name in ("first", "second", "third"):
                keeper.on_lost(record(name))
                # the one callback a participant registers takes no list (one object fewer
                # per keeper for every full collection to traverse)
                assert (keeper._callbacks is None) == (name == "first")
            await store.lease_revoke(keeper.id)
            await store.lease_revoke(bare.id)
            assert isinstance(await keeper.wait_lost(), LeaseExpiredError)
            assert isinstance(await bare.wait_lost(), LeaseExpiredError)
            assert called == [("first", keeper.id), ("second", keeper.id), ("third", keeper.id)]
            keeper.on_lost(lambda e: called.append(("late", e.lease_id)))  # at once, once
            assert called[3:] == [("late", keeper.id)]
            await keeper.aclose()
            await bare.aclose()
    finally:
        logger.removeHandler(handler)
    failed = [r for r in handler.records if r.levelno >= logging.ERROR]
    assert failed == []


@virtual_test
async def test_renewals_run_in_the_context_the_keeper_was_started_in() -> None:
    async with _SeesTheJob() as store:
        token = _JOB.set("job-7")
        keeper = LeaseKeeper(store, 3.0)
        await keeper.start()
        _JOB.reset(token)
        await anyio.sleep(2.5)  # renewals at 1 and 2 s, off the loop's shared timer
        assert store.seen == ["job-7", "job-7"]
        await keeper.aclose()
