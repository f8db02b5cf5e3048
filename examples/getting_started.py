"""Getting started: the store, a lease, a watch and a three-node rendezvous, in one process.

Run it with ``python examples/getting_started.py``: it needs no server (the ``memory://`` store
lives in the process). Swap the URL for ``http://host:29400`` (an ``aioelastic serve``) or
``etcd://h1:2379,h2:2379`` and the same code coordinates separate machines.
"""

from __future__ import annotations

import asyncio

from aioelastic import open_store
from aioelastic.rendezvous import DynamicRendezvousHandler


async def store_basics() -> None:
    async with open_store("memory://demo") as store:
        # --8<-- [start:store]
        revision = await store.put("jobs/1/state", b"starting")
        kv = await store.get("jobs/1/state")
        assert kv is not None
        print("put at revision", revision, "->", kv)
        # compare-and-swap on the revision we read: fails if anyone wrote in between
        swapped = await store.compare_and_swap("jobs/1/state", kv.mod_revision, b"running")
        print("swap applied:", swapped.succeeded)

        # a lease: keys bound to it vanish when it is revoked or expires
        async with store.watch("nodes/") as events, store.lease(ttl=10) as lease:
            await store.put("nodes/a", b"alive", lease=lease.id)
            print("event:", (await events.__anext__()).type.name, "nodes/a")
            await lease.aclose()  # revoke now (leaving the block would do it too)
            print("event:", (await events.__anext__()).type.name, "nodes/a")
        # --8<-- [end:store]


async def rendezvous() -> None:
    # --8<-- [start:rendezvous]
    async with open_store("memory://demo") as store:  # one client per node in real life
        nodes = [
            DynamicRendezvousHandler(store, "job-1", min_nodes=2, max_nodes=3, last_call_timeout=1)
            for _ in range(3)
        ]
        results = await asyncio.gather(*(node.next_rendezvous() for node in nodes))
        for result in sorted(results, key=lambda r: r.rank):
            print(f"round {result.round}: rank {result.rank} of {result.world_size}")
        for node in nodes:
            await node.aclose()
    # --8<-- [end:rendezvous]


async def main() -> None:
    await store_basics()
    await rendezvous()


if __name__ == "__main__":
    asyncio.run(main())
