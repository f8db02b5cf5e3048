"""The shared-state part of the coordination-primitives suite: event channels, typed parameters
and the job state record.

Mixed into :class:`~aioelastic.testing.sync_conformance.SyncConformance`, which runs each
test."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import anyio
import pytest

from ..errors import JobStateError, SyncTimeoutError
from ..store import Store
from ..sync import EventChannel, JobState, JobStateRecord, Parameters
from ._sync_kit import sync_test

if TYPE_CHECKING:
    from .sync_conformance import SyncEnv

__all__ = ["StateConformance"]


class StateConformance:
    """``EventChannel``, ``Parameters`` and ``JobState`` on every backend."""

    # -- events

    @sync_test
    async def test_events_publish_wait_and_stream(self, env: SyncEnv) -> None:
        a, b = await env.clients(2)
        pub, sub = EventChannel(a, "ev"), EventChannel(b, "ev")
        early = await pub.publish("started", {"rank": 0})
        assert (await sub.wait("started", timeout=1)) == early  # published before the wait
        waiting = asyncio.ensure_future(sub.wait("saved", timeout=30))
        async with sub.stream() as stream:
            await env.settle(0.1)
            assert not waiting.done()
            saved = await pub.publish("saved", {"step": 100, "path": "/ckpt/100"})
            with anyio.fail_after(env.slack + 1):
                assert (await waiting).payload == {"step": 100, "path": "/ckpt/100"}
            again = await pub.publish("saved", {"step": 200})
            with anyio.fail_after(env.slack + 1):
                got = [await stream.__anext__(), await stream.__anext__()]
        assert got == [saved, again]
        newer = await sub.wait("saved", after_revision=saved.revision, timeout=1)
        assert newer == again
        with pytest.raises(SyncTimeoutError, match="'never'"):
            await sub.wait("never", timeout=0.2)
        with pytest.raises(TypeError, match="JSON"):
            await pub.publish("bad", {"x": object()})
        assert await pub.clear() == 2

    @sync_test
    async def test_a_lease_bound_event_goes_with_its_publisher(self, env: SyncEnv) -> None:
        a, b = await env.clients(2)
        async with env.config.lease(a) as lease:
            await EventChannel(a).publish("alive", "a", lease=lease)
            assert await EventChannel(b).get("alive") is not None
        assert await EventChannel(b).get("alive") is None

    # -- parameters

    @sync_test
    async def test_parameters_typed_cas_and_watch(self, env: SyncEnv) -> None:
        a, b = await env.clients(2)
        schema: dict[str, type | tuple[type, ...]] = {"lr": float, "batch": int, "note": str}
        pa, pb = Parameters(a, "p", schema=schema), Parameters(b, "p", schema=schema)
        async with pb.watch() as changes:
            await pa.set("lr", 1)
            assert await pb.get("lr") == 1
            entry = await pb.get_entry("lr")
            assert entry is not None
            assert await pb.compare_and_set("lr", 0.5, expected_revision=entry.revision)
            assert not await pa.compare_and_set("lr", 0.1, expected_revision=entry.revision)
            assert not await pa.compare_and_set("lr", 0.1, expected_revision=0)
            await pa.delete("lr")
            with anyio.fail_after(env.slack + 1):
                got = [await changes.__anext__() for _ in range(3)]
        assert [(c.name, c.value, c.deleted) for c in got] == [
            ("lr", 1, False),
            ("lr", 0.5, False),
            ("lr", None, True),
        ]
        with pytest.raises(TypeError, match="'batch' must be int"):
            await pa.set("batch", True)
        with pytest.raises(KeyError, match="unknown parameter"):
            await pa.set("other", 1)
        with pytest.raises(KeyError, match="not set"):
            await pa.get("note")
        assert await pa.get("note", "none") == "none"

    @sync_test
    async def test_parameter_updates_do_not_lose_writes(self, env: SyncEnv) -> None:
        stores = await env.clients(4)

        async def bump(store: Store) -> None:
            params = Parameters(store, "p")
            for _ in range(10):
                await params.update("count", lambda n: n + 1, default=0)

        async with anyio.create_task_group() as tg:
            for store in stores:
                tg.start_soon(bump, store)
        assert await Parameters(stores[0], "p").snapshot() == {"count": 40}

    # -- job state

    @sync_test
    async def test_job_state_transitions_and_waits(self, env: SyncEnv) -> None:
        agent, worker = await env.clients(2)
        record, view = JobStateRecord(agent, "job"), JobStateRecord(worker, "job")
        assert (await view.get()).state is JobState.PENDING
        running = asyncio.ensure_future(view.wait("running", timeout=30))
        final = asyncio.ensure_future(view.wait_final(timeout=30))
        await env.settle(0.1)
        await record.set(JobState.RUNNING)
        with anyio.fail_after(env.slack + 1):
            assert (await running).state is JobState.RUNNING
        with pytest.raises(ValueError, match="reason"):
            await record.set("failed")
        status = await record.set("failed", "rank 3 exited with 1", details={"rank": 3})
        with anyio.fail_after(env.slack + 1):
            assert await final == status
        assert (await view.get()).reason == "rank 3 exited with 1"
        with pytest.raises(JobStateError, match="failed to running"):
            await view.set("running")

    @sync_test
    async def test_job_state_racing_writers_cannot_both_finish(self, env: SyncEnv) -> None:
        a, b = await env.clients(2)
        await JobStateRecord(a).set("running")
        outcomes: list[str] = []

        async def finish(store: Store, state: str) -> None:
            try:
                await JobStateRecord(store).set(state, "done" if state == "failed" else None)
                outcomes.append(state)
            except JobStateError:
                outcomes.append("refused")

        async with anyio.create_task_group() as tg:
            tg.start_soon(finish, a, "succeeded")
            tg.start_soon(finish, b, "failed")
        assert outcomes.count("refused") == 1
        final = await JobStateRecord(a).get()
        assert final.state.value in outcomes
