"""The environment of one local worker: torchrun's variables for its rank in a round, plus the
agent's own (the timer socket, the worker store's URL and prefix), with no store secret in it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..rendezvous import RendezvousResult
from ._secrets import worker_secret_env
from ._spec import WorkerSpec
from .worker import ROUND_ENV, STORE_PREFIX_ENV, STORE_URL_ENV, TIMER_SOCKET_ENV

__all__ = ["WORKER_PREFIX", "WorkerEnvironment"]

WORKER_PREFIX = "w/"  # the workers' own namespace inside the round store


def _visible_device(local_rank: int) -> str:
    """``--virtual-local-rank``: the GPU of ``local_rank`` among the agent's visible devices."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return str(local_rank)
    devices = [d.strip() for d in visible.split(",")]
    if local_rank >= len(devices):
        raise ValueError(
            f"local rank {local_rank} has no device in CUDA_VISIBLE_DEVICES={visible!r}"
        )
    return devices[local_rank]


@dataclass(slots=True)
class WorkerEnvironment:
    """What every worker's environment is made from; :meth:`for_rank` makes one.

    ``config`` is the rendezvous config (its ``token_file``/``password_file`` are passed on as
    paths when ``give_files``); ``store_url`` (no password in it) reaches the workers when the
    round's store has a prefix to give them.
    """

    spec: WorkerSpec
    config: dict[str, object] = field(default_factory=dict)
    give_files: bool = True
    store_url: str | None = None
    timer_socket: str | None = None

    def for_rank(self, rdzv: RendezvousResult, local_rank: int, restarts: int) -> dict[str, str]:
        spec = self.spec
        nproc = spec.nproc_per_node
        rank = rdzv.rank * nproc + local_rank
        world = rdzv.world_size * nproc
        env = dict(os.environ)
        worker_secret_env(env, self.config, give_files=self.give_files)
        env.update(spec.env)  # what the caller asks for explicitly wins
        if nproc > 1 and "OMP_NUM_THREADS" not in env:
            env["OMP_NUM_THREADS"] = "1"  # as torchrun
        env.update(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(local_rank),
                "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(nproc),
                "GROUP_RANK": str(rdzv.rank),
                "GROUP_WORLD_SIZE": str(rdzv.world_size),
                "ROLE_NAME": spec.role,
                "ROLE_RANK": str(rank),
                "ROLE_WORLD_SIZE": str(world),
                "MASTER_ADDR": rdzv.bootstrap_store_info.master_addr,
                "MASTER_PORT": str(rdzv.bootstrap_store_info.master_port),
                "TORCHELASTIC_RUN_ID": rdzv.run_id,
                "TORCHELASTIC_RESTART_COUNT": str(restarts),
                "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
                "TORCHELASTIC_USE_AGENT_STORE": "False",
                ROUND_ENV: str(rdzv.round),
            }
        )
        if spec.virtual_local_rank:
            env["LOCAL_RANK"] = "0"
            env["CUDA_VISIBLE_DEVICES"] = _visible_device(local_rank)
        self._add_agent_env(env, rdzv)
        return env

    def _add_agent_env(self, env: dict[str, str], rdzv: RendezvousResult) -> None:
        if self.timer_socket is not None:
            env[TIMER_SOCKET_ENV] = self.timer_socket
        prefix = getattr(rdzv.store, "prefix", None)
        if self.store_url is not None and isinstance(prefix, str):
            env[STORE_URL_ENV] = self.store_url
            env[STORE_PREFIX_ENV] = prefix + WORKER_PREFIX
