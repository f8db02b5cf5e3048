"""A worker that fails on its first attempt, to watch ``aioelastic run`` restart a group.

Run it with ``aioelastic run --standalone --nproc-per-node 2 --max-restarts 1
examples/flaky_worker.py``: the last rank exits with code 3 on attempt 0, the agent stops the
group and starts it again through a new rendezvous round (``TORCHELASTIC_RESTART_COUNT`` is then
1), and every worker succeeds. With ``--max-restarts 0`` the job fails and the agent's summary
names the failed rank, its exit code and its log.
"""

from __future__ import annotations

import sys

from aioelastic.agent.worker import WorkerEnv

env = WorkerEnv.from_environ()
if env.restart_count == 0 and env.rank == env.world_size - 1:
    sys.stderr.write(f"rank {env.rank}: failing on purpose (attempt {env.restart_count})\n")
    sys.exit(3)
sys.stdout.write(
    f"rank {env.rank}/{env.world_size}: ok in round {env.round} "
    f"after {env.restart_count} restart(s)\n"
)
