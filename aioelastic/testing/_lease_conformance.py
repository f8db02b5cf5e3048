"""The lease part of the store conformance suite: expiry, keep-alive, revoke, detached keys and
the lease keeper, mixed into :class:`~aioelastic.testing.conformance.StoreConformance` so that
every backend runs it."""

from __future__ import annotations

import asyncio
from typing import ClassVar

import anyio
import pytest

from ..errors import LeaseExpiredError, LeaseNotFoundError
from ..store import EventType, KeyValue, Store
from ._conformance_kit import collect, conformance_test, next_event

__all__ = ["LeaseConformance"]


class LeaseConformance:
    """Leases on every backend; fractional TTLs need the ``fractional_ttl`` feature."""

    #: A lease TTL in seconds that the backend honours (StoreConformance sets it).
    short_ttl: ClassVar[float]

    # -- leases

    @conformance_test()
    async def test_lease_expiry_deletes_keys_and_watchers_see_it(self, store: Store) -> None:
        grant = await store.lease_grant(self.short_ttl)
        assert grant.ttl >= self.short_ttl
        r1 = await store.put("l/a", b"1", lease=grant.id)
        await store.put("l/b", b"2", lease=grant.id)
        assert (await store.get("l/a")) == KeyValue("l/a", b"1", r1, r1, 1, grant.id)
        status = await store.lease_time_to_live(grant.id)
        assert sorted(status.keys) == ["l/a", "l/b"]
        assert 0 < status.remaining <= grant.ttl
        async with store.watch("l/") as events:
            gone = await collect(events, 2, timeout=grant.ttl * 3 + 5)
        assert {(e.type, e.kv.key) for e in gone} == {
            (EventType.DELETE, "l/a"),
            (EventType.DELETE, "l/b"),
        }
        assert gone[0].revision == gone[1].revision
        assert await store.get("l/a") is None
        with pytest.raises(LeaseNotFoundError):
            await store.lease_time_to_live(grant.id)

    @conformance_test()
    async def test_keep_alive_extends_and_revoke_deletes(self, store: Store) -> None:
        grant = await store.lease_grant(self.short_ttl)
        await store.put("k", b"v", lease=grant.id)
        loop = asyncio.get_running_loop()
        until = loop.time() + grant.ttl * 2.5
        while loop.time() < until:
            await anyio.sleep(grant.ttl / 4)
            assert await store.lease_keep_alive(grant.id) >= self.short_ttl
        assert await store.get("k") is not None
        await store.lease_revoke(grant.id)
        assert await store.get("k") is None
        with pytest.raises(LeaseNotFoundError):
            await store.lease_keep_alive(grant.id)
        with pytest.raises(LeaseNotFoundError):
            await store.lease_revoke(grant.id)

    @conformance_test()
    async def test_put_with_an_unknown_lease_fails(self, store: Store) -> None:
        grant = await store.lease_grant(self.short_ttl)
        await store.lease_revoke(grant.id)
        with pytest.raises(LeaseNotFoundError):
            await store.put("k", b"v", lease=grant.id)
        assert await store.get("k") is None

    @conformance_test()
    async def test_rewriting_a_key_without_its_lease_detaches_it(self, store: Store) -> None:
        grant = await store.lease_grant(self.short_ttl)
        await store.put("k", b"leased", lease=grant.id)
        await store.put("k", b"free")
        await store.lease_revoke(grant.id)
        kv = await store.get("k")
        assert kv is not None
        assert (kv.value, kv.lease) == (b"free", 0)

    @conformance_test(requires="fractional_ttl")
    async def test_fractional_ttl_is_honoured(self, store: Store) -> None:
        grant = await store.lease_grant(0.25)
        assert grant.ttl == 0.25
        await store.put("k", b"v", lease=grant.id)
        async with store.watch("k") as events:
            event = await next_event(events, timeout=5)
        assert event.type is EventType.DELETE

    @conformance_test()
    async def test_lease_keeper_keeps_and_reports_loss(self, store: Store) -> None:
        async with store.lease(self.short_ttl) as keeper:
            await store.put("held", b"v", lease=keeper.id)
            await anyio.sleep(keeper.ttl * 2)
            assert await store.get("held") is not None
            assert not keeper.lost
            await store.lease_revoke(keeper.id)  # someone else revokes it
            with anyio.fail_after(keeper.ttl * 2 + 5):
                error = await keeper.wait_lost()
            assert isinstance(error, LeaseExpiredError)
            with pytest.raises(LeaseExpiredError), keeper.guard():
                await anyio.sleep(keeper.ttl * 10)
        assert await store.get("held") is None

    @conformance_test()
    async def test_lease_keeper_revokes_on_exit(self, store: Store) -> None:
        async with store.lease(self.short_ttl) as keeper:
            await store.put("held", b"v", lease=keeper.id)
        assert await store.get("held") is None
