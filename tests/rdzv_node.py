"""One rendezvous node as a process, for the end-to-end tests.

``python tests/rdzv_node.py URL RUN_ID MIN MAX TTL LAST_CALL`` joins rounds over the store at URL;
prints ``ROUND {json}`` for each round it is a member of and ``EVENT {json}`` for each change, and
re-rendezvouses on NODES_WAITING / PARTICIPANT_LOST until the run closes.
"""

from __future__ import annotations

import asyncio
import json
import sys


async def main(url: str, run_id: str, min_nodes: int, max_nodes: int, ttl: float, lc: float) -> int:
    from aioelastic.errors import RendezvousClosedError
    from aioelastic.rendezvous import DynamicRendezvousHandler, RendezvousEventKind
    from aioelastic.store import open_store

    store = await open_store(url)
    handler = DynamicRendezvousHandler(
        store, run_id, min_nodes, max_nodes, lease_ttl=ttl, last_call_timeout=lc,
        join_timeout=120, local_addr="127.0.0.1", owns_store=True,
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    try:
        while True:
            result = await handler.next_rendezvous()
            line = {"node": result.node_id, "round": result.round, "rank": result.rank,
                    "world_size": result.world_size, "participants": list(result.participants),
                    "t": loop.time()}  # fmt: skip
            print("ROUND", json.dumps(line), flush=True)
            event = await handler.wait_for_change()
            print("EVENT", json.dumps({"kind": event.kind.value, "node": event.node_id,
                                       "t": loop.time()}), flush=True)  # fmt: skip
            if event.kind in (RendezvousEventKind.CLOSED, RendezvousEventKind.ERROR):
                return 0
    except RendezvousClosedError:
        return 0
    finally:
        await handler.aclose()


if __name__ == "__main__":
    url, run_id, lo, hi, ttl, lc = sys.argv[1:7]
    sys.exit(asyncio.run(main(url, run_id, int(lo), int(hi), float(ttl), float(lc))))
