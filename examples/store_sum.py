"""Workers that coordinate through the agent's store: no extra packages needed.

Run it with ``aioelastic run --standalone --nproc-per-node 4 examples/store_sum.py``.

Every worker reads its rank and world size from the environment the agent passes (torchrun's
variables), publishes a number in the store namespace its round shares, waits (on a watch, not by
polling) for everyone's, and checks the sum. Each step runs under a watchdog timer from the
agent's timer server: a worker that hangs is killed and the agent restarts the group.
"""

from __future__ import annotations

import asyncio
import os
import sys

from aioelastic.agent.worker import WorkerEnv, configure_timers, open_worker_store
from aioelastic.timer import expires


async def main() -> None:
    env = WorkerEnv.from_environ()
    client = configure_timers()
    try:
        async with open_worker_store() as store, expires(after=30, scope="exchange"):
            await store.put(f"value/{env.rank}", str(env.rank * env.rank).encode())
            found = await store.wait_for(
                [f"value/{rank}" for rank in range(env.world_size)], timeout=25
            )
            total = sum(int(kv.value) for kv in found.values())
    finally:
        await client.aclose()
    expected = sum(rank * rank for rank in range(env.world_size))
    assert total == expected, (total, expected)
    # One write per line, so that lines of workers sharing the terminal never interleave.
    sys.stdout.write(
        f"rank {env.rank}/{env.world_size} (node {env.group_rank}, local rank {env.local_rank}, "
        f"pid {os.getpid()}, restart {env.restart_count}): sum of squares = {total}\n"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main())
