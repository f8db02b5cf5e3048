"""The elastic agent: run one node's workers of an elastic job (what torchrun's agent does).

:class:`ElasticAgent` joins a rendezvous, starts the local workers as asyncio subprocesses with
torchrun's environment, waits on their exits and on the rendezvous' membership events (no
polling), restarts the group on failure up to ``max_restarts``, re-forms the group when nodes come
or go, and never leaves a worker process behind. ``aioelastic run`` is its command line.
Worker-side helpers are in :mod:`aioelastic.agent.worker`. See ``docs/agent.md``.
"""

from __future__ import annotations

from .._public import publish as _publish
from ._agent import AgentState, ElasticAgent, RunResult, WorkerFailure, WorkerSpec
from ._workers import Std, parse_std

__all__ = [
    "AgentState",
    "ElasticAgent",
    "RunResult",
    "Std",
    "WorkerFailure",
    "WorkerSpec",
    "parse_std",
]

_publish(globals())
