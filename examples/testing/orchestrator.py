"""A small orchestrator to test: workers register under a prefix, bound to their lease; the
orchestrator waits (on a watch) until enough of them are there, and sees a dead one vanish."""

from __future__ import annotations

from aioelastic import EventType, LeaseKeeper, Store


async def register(store: Store, name: str, ttl: float = 10.0) -> LeaseKeeper:
    """Register worker ``name``; it stays registered while the returned keeper runs."""
    keeper = store.lease(ttl)
    await keeper.start()
    await store.put(f"workers/{name}", b"ready", lease=keeper.id)
    return keeper


async def wait_for_workers(store: Store, count: int) -> set[str]:
    """The registered workers, once there are at least ``count`` of them (no polling)."""
    listing = await store.range("workers/")
    present = {kv.key.removeprefix("workers/") for kv in listing}
    async with store.watch("workers/", start_revision=listing.revision + 1) as events:
        while len(present) < count:
            event = await events.__anext__()
            name = event.kv.key.removeprefix("workers/")
            if event.type is EventType.PUT:
                present.add(name)
            else:
                present.discard(name)
    return present


async def wait_for_loss(store: Store) -> str:
    """The name of the next worker whose registration disappears (it left, or its lease ended)."""
    async with store.watch("workers/") as events:
        async for event in events:
            if event.type is EventType.DELETE:
                return event.kv.key.removeprefix("workers/")
    raise AssertionError("the watch ended")
