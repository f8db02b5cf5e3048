"""LeaseKeeper: keeps a lease alive through short outages, reports a loss exactly once, and
cancels guarded work; in virtual time."""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path

import anyio
import pytest

from aioelastic import open_store
from aioelastic.errors import LeaseExpiredError, StoreAuthError, StoreConnectionError
from aioelastic.store import MemoryStore
from aioelastic.store.http.server import HttpStoreServer
from aioelastic.testing import FaultInjectingStore, run_virtual


def test_survives_an_outage_shorter_than_the_ttl() -> None:
    async def main() -> None:
        store = FaultInjectingStore(MemoryStore())
        async with store, store.lease(9) as keeper:
            await store.put("k", b"v", lease=keeper.id)
            await anyio.sleep(10)
            store.partition()
            await anyio.sleep(5)  # a keep-alive fails; the lease still has time
            store.heal()
            await anyio.sleep(30)
            assert not keeper.lost
            stats = keeper.statistics()
            assert stats.failed_renewals >= 1
            assert stats.renewals >= 10
            assert await store.get("k") is not None

    run_virtual(main)


def test_an_outage_longer_than_the_ttl_is_reported_as_loss() -> None:
    async def main() -> None:
        store = FaultInjectingStore(MemoryStore())
        async with store, store.lease(6) as keeper:
            lost: list[LeaseExpiredError] = []
            keeper.on_lost(lost.append)
            store.partition()
            with anyio.fail_after(7):
                error = await keeper.wait_lost()
            assert "unreachable" in str(error)
            assert lost == [error]
            store.heal()

    run_virtual(main)


def test_guard_cancels_work_when_the_lease_is_lost() -> None:
    async def main() -> None:
        async with MemoryStore() as store, store.lease(3) as keeper:
            finished = False

            async def revoke_soon() -> None:
                await anyio.sleep(1)
                await store.lease_revoke(keeper.id)

            async def guarded_work() -> None:
                nonlocal finished
                with keeper.guard():
                    await anyio.sleep(3600)
                    finished = True

            async with anyio.create_task_group() as tg:
                tg.start_soon(revoke_soon)
                with pytest.raises(LeaseExpiredError):
                    await guarded_work()
            assert not finished
            assert keeper.lost
            late: list[LeaseExpiredError] = []
            keeper.on_lost(late.append)  # registering after the loss calls back at once
            assert late == [keeper.error]

    run_virtual(main)


def test_guard_without_loss_is_transparent() -> None:
    async def main() -> None:
        async with MemoryStore() as store, store.lease(3) as keeper:
            with keeper.guard():
                await anyio.sleep(10)
            assert not keeper.lost

    run_virtual(main)


def test_every_guard_held_at_once_is_cancelled_and_a_left_one_is_not_kept() -> None:
    """The keeper holds its first guard apart from the others: a loss cancels each of them,
    whichever was entered or left first, and a guard left before the loss is not touched."""

    async def main() -> None:
        async with MemoryStore() as store, store.lease(3) as keeper:
            with keeper.guard() as early:
                pass
            outcomes: list[str] = []

            async def guarded(name: str) -> None:
                with pytest.raises(LeaseExpiredError) as raised, keeper.guard():
                    await anyio.sleep(3600)
                assert raised.value is keeper.error
                outcomes.append(name)

            async with anyio.create_task_group() as tg:
                for name in ("first", "second", "third"):
                    tg.start_soon(guarded, name)
                    await anyio.sleep(0.1)
                with keeper.guard() as own, anyio.move_on_after(0.5):
                    await anyio.sleep(3600)  # entered last, left first (its own deadline)
                assert not own.cancel_called
                await store.lease_revoke(keeper.id)
                with anyio.fail_after(10):
                    await keeper.wait_lost()
            assert sorted(outcomes) == ["first", "second", "third"]
            assert not early.cancel_called
            with pytest.raises(LeaseExpiredError), keeper.guard():  # after the loss: at once
                await anyio.sleep(3600)

    run_virtual(main)


def test_a_held_guard_keeps_few_tracked_objects() -> None:
    """A waiting rendezvous participant holds its keeper's guard while it waits (10,000 in one
    process in ``benchmarks.scale``): what a held guard keeps, counted in objects the collector
    tracks (every full collection traverses them)."""

    async def main() -> float:
        store = MemoryStore()
        keepers = [store.lease(3) for _ in range(1000)]
        with keepers[0].guard():  # (the backend's first use imports and caches things)
            pass
        held: list[contextlib.AbstractContextManager[anyio.CancelScope]] = []
        gc.collect()
        before = len(gc.get_objects())
        for keeper in keepers:
            guard = keeper.guard()
            guard.__enter__()
            held.append(guard)  # (the list's own growth is untracked: a list is one object)
        gc.collect()
        grown = len(gc.get_objects()) - before
        for guard in reversed(held):
            guard.__exit__(None, None, None)
        return grown / len(keepers)

    # the guard and its anyio cancel scope (with its two sets); the generator context manager
    # before it also kept its generator (and more), and the keeper a set of scopes: 7 in all
    per_guard = run_virtual(main)
    assert per_guard <= 4.05, per_guard


def test_bad_intervals_are_rejected() -> None:
    store = MemoryStore()
    with pytest.raises(ValueError, match="keep_alive_interval"):
        store.lease(5, keep_alive_interval=5)
    with pytest.raises(ValueError, match="ttl"):
        store.lease(0)


def test_injected_one_off_failure() -> None:
    async def main() -> None:
        store = FaultInjectingStore(MemoryStore())
        store.fail_next("put", StoreConnectionError("boom"))
        with pytest.raises(StoreConnectionError, match="boom"):
            await store.put("k", b"v")
        await store.put("k", b"v")
        assert store.calls["put"] == 2
        await store.aclose()

    run_virtual(main)


@pytest.mark.asyncio
async def test_a_refused_token_after_a_restart_is_a_reported_loss(tmp_path: Path) -> None:
    # The real http server restarts on the same port and data dir (the lease survives it) with
    # a rotated token: renewal gets 401, which is no outage to wait out but the end of renewal.
    old = HttpStoreServer(port=0, data_dir=str(tmp_path), token="before", fsync="never")
    await old.start()
    port = old.port
    store = await open_store(old.url, token="before")
    new: HttpStoreServer | None = None
    try:
        async with store.lease(3, keep_alive_interval=0.2) as keeper:
            lost: list[LeaseExpiredError] = []
            keeper.on_lost(lost.append)
            await old.stop()
            new = HttpStoreServer(port=port, data_dir=str(tmp_path), token="after")
            await new.start()
            assert new.engine.lease_count == 1  # the lease itself is alive on the server

            async def guarded() -> None:
                with keeper.guard():
                    await keeper.wait_lost()
                    await anyio.sleep(30)  # the guard cancels this

            with anyio.fail_after(10), pytest.raises(LeaseExpiredError) as raised:
                await guarded()
            assert keeper.lost
            error = await keeper.wait_lost()
            assert raised.value is error
            assert lost == [error]
            assert isinstance(error.__cause__, StoreAuthError)
            assert "StoreAuthError" in str(error)
            assert keeper.statistics().lost
    finally:
        await store.aclose()
        if new is not None:
            await new.stop()
        await old.stop()
