"""The election part of the coordination-primitives suite: campaign, resign, terms, observers and
a leader cancelled when it loses its leadership.

Mixed into :class:`~aioelastic.testing.sync_conformance.SyncConformance`, which runs each
test."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import anyio
import pytest

from ..errors import LeaseExpiredError, NotLeaderError
from ..sync import Election, Leader
from ._sync_kit import sync_test

if TYPE_CHECKING:
    from .sync_conformance import SyncEnv

__all__ = ["ElectionConformance"]


class ElectionConformance:
    """``Election`` on every backend."""

    # -- election

    @sync_test
    async def test_election_campaign_resign_and_terms(self, env: SyncEnv) -> None:
        a, b = await env.clients(2)
        ea, eb = Election(a, "E", config=env.config), Election(b, "E", config=env.config)
        assert await ea.leader() is None
        me = await ea.campaign("node-a")
        assert ea.is_leader
        assert me.text() == "node-a"
        assert await eb.leader() == me
        campaign = asyncio.ensure_future(eb.campaign(b"node-b"))
        await env.settle(0.2)
        assert not campaign.done()
        proclaimed = await ea.proclaim("node-a2")
        assert proclaimed.term == me.term
        assert (await eb.leader()) == proclaimed
        await ea.resign()
        with anyio.fail_after(env.slack + 1):
            second = await campaign
        assert second.text() == "node-b"
        assert second.term > me.term
        assert eb.term == second.term
        with pytest.raises(NotLeaderError):
            await ea.proclaim("x")
        await eb.resign()
        assert await ea.leader() is None

    @sync_test
    async def test_observe_reports_leader_changes(self, env: SyncEnv) -> None:
        a, b, watcher = await env.clients(3)
        seen: list[Leader | None] = []
        ea, eb = Election(a, "E", config=env.config), Election(b, "E", config=env.config)
        async with Election(watcher, "E").observe() as changes:
            seen.append(await changes.__anext__())
            await ea.campaign("a")
            with anyio.fail_after(env.slack + 1):
                seen.append(await changes.__anext__())
            async with watcher.watch(ea.prefix) as queue:
                campaign = asyncio.ensure_future(eb.campaign("b"))
                with anyio.fail_after(env.slack + 1):
                    await queue.__anext__()  # b is queued behind a (not a sleep: a race on etcd)
            await ea.proclaim("a2")
            with anyio.fail_after(env.slack + 1):
                seen.append(await changes.__anext__())
            await ea.resign()
            with anyio.fail_after(env.slack + 1):
                seen.append(await changes.__anext__())
                await campaign
            await eb.resign()
            with anyio.fail_after(env.slack + 1):
                seen.append(await changes.__anext__())
        values = [None if leader is None else leader.text() for leader in seen]
        assert values == [None, "a", "a2", "b", None]

    @sync_test
    async def test_leadership_loss_cancels_the_leader(self, env: SyncEnv) -> None:
        a, b, admin = await env.clients(3)
        finished = False
        terms: list[int] = []

        async def lead() -> None:
            nonlocal finished
            async with Election(a, "E", config=env.config).leadership("a") as me:
                terms.append(me.term)
                assert await Election(admin, "E").leader() == me
                kv = await admin.get(me.key)
                assert kv is not None
                await admin.lease_revoke(kv.lease)
                await anyio.sleep(env.config.ttl * 3)
                finished = True

        with pytest.raises(LeaseExpiredError):
            await lead()
        assert not finished
        async with Election(b, "E", config=env.config).leadership("b", timeout=1) as other:
            assert other.term > terms[0]
