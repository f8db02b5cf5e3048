"""Rendezvous: rounds of membership for elastic jobs, over any store backend.

``DynamicRendezvousHandler`` (elastic, ``min..max`` nodes) and ``StaticRendezvousHandler`` (fixed
ranks) implement the async :class:`RendezvousHandler`; ``create_handler(RendezvousParameters(...))``
builds one from torchrun-style parameters through the registry; ``read_run_status`` /
``watch_run_status`` observe a run from outside (``aioelastic status``). See
``docs/rendezvous.md``.
"""

from __future__ import annotations

from .._public import publish as _publish
from ..errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousNotFoundError,
    RendezvousStateError,
    RendezvousTimeoutError,
)
from ._backends import check_params, register_builtin_backends, store_url_for
from ._state import read_standby_round
from ._status import (
    MemberStatus,
    NodeStatus,
    RunStatus,
    TimerStatus,
    read_run_status,
    watch_run_status,
)
from .api import (
    RendezvousEvent,
    RendezvousEventKind,
    RendezvousHandler,
    RendezvousHandlerCreator,
    RendezvousHandlerRegistry,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousResult,
    RendezvousStatistics,
    RendezvousStatus,
    RendezvousStoreInfo,
    create_handler,
    handler_registry,
    parse_rdzv_conf,
)
from .dynamic import DynamicRendezvousHandler, assign_ranks
from .static import StaticRendezvousHandler

__all__ = [
    "DynamicRendezvousHandler",
    "MemberStatus",
    "NodeStatus",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousEvent",
    "RendezvousEventKind",
    "RendezvousGracefulExitError",
    "RendezvousHandler",
    "RendezvousHandlerCreator",
    "RendezvousHandlerRegistry",
    "RendezvousInfo",
    "RendezvousNotFoundError",
    "RendezvousParameters",
    "RendezvousResult",
    "RendezvousStateError",
    "RendezvousStatistics",
    "RendezvousStatus",
    "RendezvousStoreInfo",
    "RendezvousTimeoutError",
    "RunStatus",
    "StaticRendezvousHandler",
    "TimerStatus",
    "assign_ranks",
    "check_params",
    "create_handler",
    "handler_registry",
    "parse_rdzv_conf",
    "read_run_status",
    "read_standby_round",
    "register_builtin_backends",
    "store_url_for",
    "watch_run_status",
]

register_builtin_backends()

_publish(globals())
