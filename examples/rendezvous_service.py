"""An asyncio service that embeds a rendezvous: it keeps itself in the membership of a group,
reacts to membership events, and serves its current place over HTTP (aiohttp).

Run the demo with ``python examples/rendezvous_service.py``: it starts an HTTP store server and
three services in this process, shows them form a round of three, stops one, and shows the other
two re-form a round of two, reading each service's ``GET /membership``.

Run one real service per process against a shared store::

    aioelastic serve --port 29400 &
    python examples/rendezvous_service.py --store http://127.0.0.1:29400 --nodes 2:3 --port 8081
    python examples/rendezvous_service.py --store http://127.0.0.1:29400 --nodes 2:3 --port 8082
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from aiohttp import ClientSession, web

from aioelastic import open_store
from aioelastic.rendezvous import DynamicRendezvousHandler, RendezvousEventKind


# --8<-- [start:service]
class MembershipService:
    """Joins the rendezvous, re-joins on every membership change, and publishes where it stands."""

    def __init__(self, store_url: str, run_id: str, min_nodes: int, max_nodes: int) -> None:
        self.store_url, self.run_id = store_url, run_id
        self.min_nodes, self.max_nodes = min_nodes, max_nodes
        self.state: dict[str, Any] = {"status": "joining"}
        self.changed = asyncio.Condition()

    async def run(self) -> None:
        """The membership loop: runs until the run is closed or the task is cancelled."""
        store = await open_store(self.store_url)
        handler = DynamicRendezvousHandler(
            store,
            self.run_id,
            self.min_nodes,
            self.max_nodes,
            last_call_timeout=0.5,  # wait this long for more nodes once min_nodes are there
            lease_ttl=5,  # a crashed service vanishes from the group after 5 s
            owns_store=True,
        )
        async with handler:  # leaving (even by cancellation) revokes our lease at once
            while True:
                result = await handler.next_rendezvous()  # waits on a watch, never polls
                await self.publish(
                    status="member",
                    node_id=result.node_id,
                    round=result.round,
                    rank=result.rank,
                    world_size=result.world_size,
                    participants=list(result.participants),
                )
                # Work happens here (in other tasks); this one waits for the next change.
                event = await handler.wait_for_change()
                await self.publish(status="re-forming", last_event=event.kind.name)
                if event.kind in (RendezvousEventKind.CLOSED, RendezvousEventKind.ERROR):
                    await self.publish(status="closed")
                    return
                # NODES_WAITING, PARTICIPANT_LOST, ROUND_SUPERSEDED: form the next round

    async def publish(self, **changes: Any) -> None:
        async with self.changed:
            self.state.update(changes)
            self.changed.notify_all()

    async def wait_until(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        async with self.changed:
            await self.changed.wait_for(lambda: predicate(self.state))
            return dict(self.state)

    def app(self) -> web.Application:
        async def membership(request: web.Request) -> web.Response:
            return web.json_response(self.state)

        app = web.Application()
        app.router.add_get("/membership", membership)
        return app


# --8<-- [end:service]


async def serve(service: MembershipService, port: int) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(service.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    host, bound_port = runner.addresses[0][:2]
    return runner, f"http://{host}:{bound_port}/membership"


async def demo() -> None:
    from aioelastic.store.http.server import HttpStoreServer

    store_server = HttpStoreServer(host="127.0.0.1", port=0)
    await store_server.start()
    services = [MembershipService(store_server.url, "demo", 2, 3) for _ in range(3)]
    tasks = [asyncio.create_task(s.run()) for s in services]
    servers = [await serve(s, 0) for s in services]
    try:
        async with ClientSession() as http:

            async def show(title: str, count: int) -> None:
                print(title)
                for _, url in servers[:count]:
                    async with http.get(url) as response:
                        state = await response.json()
                    print(
                        f"  rank {state['rank']} of {state['world_size']} (round {state['round']})"
                    )

            for service in services:
                await service.wait_until(lambda s: s.get("world_size") == 3)
            await show("three services formed a round:", 3)

            tasks[2].cancel()  # one service stops; the others see PARTICIPANT_LOST
            with contextlib.suppress(asyncio.CancelledError):
                await tasks[2]
            for service in services[:2]:
                await service.wait_until(lambda s: s.get("world_size") == 2)
            await show("one stopped; the other two re-formed:", 2)
            print("last event seen:", services[0].state["last_event"])
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for runner, _ in servers:
            await runner.cleanup()
        await store_server.stop()


async def one_service(args: argparse.Namespace) -> None:
    low, _, high = args.nodes.partition(":")
    service = MembershipService(args.store, args.run_id, int(low), int(high or low))
    runner, url = await serve(service, args.port)
    print(f"membership at {url}", flush=True)
    try:
        await service.run()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", help="store URL; without it, run the in-process demo")
    parser.add_argument("--run-id", default="service-group")
    parser.add_argument("--nodes", default="2:3", metavar="MIN:MAX")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(demo() if args.store is None else one_service(args))


if __name__ == "__main__":
    main()
