"""Coordination primitives on the store protocol: lock, election, barriers, events, shared
parameters and the job state record.

They use only the :class:`~aioelastic.store.Store` protocol, so they work on every backend
(memory, http, etcd). Liveness comes from leases (:class:`LeaseConfig` sets their timing, in
the style of Kubernetes leader election); every wait is a watch, never a poll.
"""

from __future__ import annotations

from .._public import publish as _publish
from ._config import LeaseConfig
from .barrier import Barrier, DoubleBarrier
from .election import Election, Leader, LeaderObserver
from .events import EventChannel, EventStream, PublishedEvent
from .jobstate import JobState, JobStateRecord, JobStateWatch, JobStatus
from .lock import Lock, store_lock
from .params import ParameterChange, Parameters, ParameterValue, ParameterWatch

__all__ = [
    "Barrier",
    "DoubleBarrier",
    "Election",
    "EventChannel",
    "EventStream",
    "JobState",
    "JobStateRecord",
    "JobStateWatch",
    "JobStatus",
    "Leader",
    "LeaderObserver",
    "LeaseConfig",
    "Lock",
    "ParameterChange",
    "ParameterValue",
    "ParameterWatch",
    "Parameters",
    "PublishedEvent",
    "store_lock",
]

for _name in __all__:  # tracebacks and docs show aioelastic.sync.X (as httpx does)
    globals()[_name].__module__ = __name__
del _name

_publish(globals())
