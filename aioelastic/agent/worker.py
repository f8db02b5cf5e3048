"""For the worker processes an :class:`~aioelastic.agent.ElasticAgent` starts: read what it passed.

The agent sets torchrun's variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...) plus its own:

- ``AIOELASTIC_TIMER_SOCKET``: the agent's :class:`~aioelastic.timer.UnixTimerServer`, so a hung
  worker is reaped;
- ``AIOELASTIC_STORE_URL`` and ``AIOELASTIC_STORE_PREFIX``: a namespace of the rendezvous store
  that the workers of one round share (when the store is reachable from other processes);
- ``AIOELASTIC_ROUND``: the rendezvous round the workers were started for;
- ``AIOELASTIC_TOKEN_FILE`` / ``AIOELASTIC_ETCD_PASSWORD_FILE``: when the store needs a secret,
  the path of a file holding it (never the secret itself; ``open_store`` reads them), unless the
  agent was told not to (``--no-worker-store-secrets``).

This module is light to import (no aiohttp).

```python
from aioelastic.agent.worker import WorkerEnv, configure_timers
from aioelastic.timer import expires

env = WorkerEnv.from_environ()
configure_timers()  # expires() now arms timers on the agent's server
async with expires(after=30):
    await train_step()
```
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..store import Store
    from ..timer import BlockingUnixTimerClient, UnixTimerClient

__all__ = [
    "ROUND_ENV",
    "STORE_PREFIX_ENV",
    "STORE_URL_ENV",
    "TIMER_SOCKET_ENV",
    "WorkerEnv",
    "blocking_timer_client",
    "configure_timers",
    "open_worker_store",
    "timer_client",
]

#: The path of the agent's Unix-socket timer server.
TIMER_SOCKET_ENV = "AIOELASTIC_TIMER_SOCKET"
#: The URL of the rendezvous store (absent when it is in-process only, ``memory://``).
STORE_URL_ENV = "AIOELASTIC_STORE_URL"
#: The key prefix the workers of this round share in that store.
STORE_PREFIX_ENV = "AIOELASTIC_STORE_PREFIX"
#: The rendezvous round these workers were started for.
ROUND_ENV = "AIOELASTIC_ROUND"


def _int(environ: Mapping[str, str], name: str) -> int:
    raw = environ.get(name)
    if raw is None:
        raise KeyError(f"{name} is not set: is this process started by an aioelastic agent?")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


@dataclass(frozen=True, slots=True)
class WorkerEnv:
    """The torchrun-compatible environment of one worker."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    group_rank: int
    group_world_size: int
    master_addr: str
    master_port: int
    run_id: str
    restart_count: int
    max_restarts: int
    round: int | None
    timer_socket: str | None
    store_url: str | None
    store_prefix: str | None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> WorkerEnv:
        """Read ``os.environ`` (or ``environ``); ``KeyError`` naming a missing variable."""
        env = os.environ if environ is None else environ
        round_ = env.get(ROUND_ENV)
        return cls(
            rank=_int(env, "RANK"),
            local_rank=_int(env, "LOCAL_RANK"),
            world_size=_int(env, "WORLD_SIZE"),
            local_world_size=_int(env, "LOCAL_WORLD_SIZE"),
            group_rank=_int(env, "GROUP_RANK"),
            group_world_size=_int(env, "GROUP_WORLD_SIZE"),
            master_addr=env.get("MASTER_ADDR", ""),
            master_port=_int(env, "MASTER_PORT"),
            run_id=env.get("TORCHELASTIC_RUN_ID", ""),
            restart_count=_int(env, "TORCHELASTIC_RESTART_COUNT"),
            max_restarts=_int(env, "TORCHELASTIC_MAX_RESTARTS"),
            round=int(round_) if round_ is not None else None,
            timer_socket=env.get(TIMER_SOCKET_ENV) or None,
            store_url=env.get(STORE_URL_ENV) or None,
            store_prefix=env.get(STORE_PREFIX_ENV) or None,
        )


def _socket_path() -> str:
    path = os.environ.get(TIMER_SOCKET_ENV)
    if not path:
        raise KeyError(f"{TIMER_SOCKET_ENV} is not set: is this process started by an agent?")
    return path


def timer_client(*, signal: int | None = None) -> UnixTimerClient:
    """An async client of the agent's timer server."""
    from ..timer import UnixTimerClient

    return UnixTimerClient(_socket_path(), signal=signal)


def blocking_timer_client(*, signal: int | None = None) -> BlockingUnixTimerClient:
    """A synchronous client of the agent's timer server (``with client.expires(after=30):``)."""
    from ..timer import BlockingUnixTimerClient

    return BlockingUnixTimerClient(_socket_path(), signal=signal)


def configure_timers() -> UnixTimerClient:
    """Make :func:`aioelastic.timer.expires` use the agent's timer server; return the client."""
    from ..timer import configure

    client = timer_client()
    configure(client)
    return client


@contextlib.asynccontextmanager
async def open_worker_store() -> AsyncIterator[Store]:
    """``async with open_worker_store() as store:`` the namespace this round's workers share."""
    from ..store import open_store

    url = os.environ.get(STORE_URL_ENV)
    if not url:
        raise KeyError(f"{STORE_URL_ENV} is not set: the agent's store is not reachable here")
    store = await open_store(url)
    try:
        prefix = os.environ.get(STORE_PREFIX_ENV)
        yield store.namespace(prefix) if prefix else store
    finally:
        await store.aclose()
