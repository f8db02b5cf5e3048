"""The rendezvous API: the async RendezvousHandler, its results, events, parameters and registry.

Modelled on ``torch.distributed.elastic.rendezvous.api`` (same names, same config keys as
torchrun's ``--rdzv-conf``), with every waiting method a coroutine, an observable status, and
membership events an orchestrator can ``async for`` over instead of polling.
"""

from __future__ import annotations

import abc
import enum
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from anyio.abc import AsyncResource

from .._checks import check_run_id
from .._secrets import redact_url
from ..errors import (
    ConfigError,
    LeaseExpiredError,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousTimeoutError,
    StoreError,
)

if TYPE_CHECKING:
    from ..store import Store

__all__ = [
    "RendezvousEvent",
    "RendezvousEventKind",
    "RendezvousHandler",
    "RendezvousHandlerCreator",
    "RendezvousHandlerRegistry",
    "RendezvousInfo",
    "RendezvousParameters",
    "RendezvousResult",
    "RendezvousStatistics",
    "RendezvousStatus",
    "RendezvousStoreInfo",
    "create_handler",
    "handler_registry",
    "parse_rdzv_conf",
]


class RendezvousStatus(enum.Enum):
    """Where a handler stands: usable, closed (terminal for the run), or failed with an error."""

    ACTIVE = "ACTIVE"
    CLOSED = "CLOSED"
    ERROR = "ERROR"


@dataclass(frozen=True, slots=True)
class RendezvousStoreInfo:
    """Where the members bootstrap their collective (torch's ``MASTER_ADDR``/``MASTER_PORT``).

    Rank 0's address and a port it found free when it registered, published in the round record
    so every member has it when the round completes, without a further store round trip.
    """

    master_addr: str
    master_port: int


@dataclass(frozen=True, slots=True)
class RendezvousResult:
    """A completed round, as seen by one member.

    ``participants`` are the members' node ids in rank order (``participants[rank] == node_id``);
    ``store`` is a key-value store namespaced to this run and round, shared by the members.
    ``departed``: how many members of round ``round - 1`` are not in this round (0 for a first
    round; None when unknown: a static round, or a round record from an older version); it is
    in the round record every member receives, so it costs no roster read.
    """

    run_id: str
    round: int
    rank: int
    world_size: int
    participants: tuple[str, ...]
    node_id: str
    store: Store
    bootstrap_store_info: RendezvousStoreInfo
    departed: int | None = None


RendezvousInfo = RendezvousResult
"""torch's name for the result of ``next_rendezvous``."""


@dataclass(frozen=True, slots=True)
class RendezvousStatistics:
    """A snapshot of a handler, for logs, metrics and tests (times are event-loop times).

    ``rounds_driven``: rounds this node finalised as the driver; ``last_call_deadline``: when
    the last-call window it last ran as driver closes (None if it never ran one); ``lease_id``: 0
    when it holds no live lease.
    """

    node_id: str
    status: RendezvousStatus
    round: int
    world_size: int
    joins: int
    rounds_driven: int
    join_started: float | None
    completed_at: float | None
    last_call_deadline: float | None
    lease_id: int


class RendezvousEventKind(enum.Enum):
    """What changed for the members of a completed round."""

    #: nodes wait for a next round that could take them (restart to take them)
    NODES_WAITING = "NODES_WAITING"
    #: a member died (its lease expired) or left without registering for the next round
    PARTICIPANT_LOST = "PARTICIPANT_LOST"
    #: a newer round completed without this node
    ROUND_SUPERSEDED = "ROUND_SUPERSEDED"
    #: the run was closed
    CLOSED = "CLOSED"
    #: this handler failed (e.g. its lease was lost); see ``handler.error``
    ERROR = "ERROR"


@dataclass(frozen=True, slots=True)
class RendezvousEvent:
    """One membership change. ``node_id`` names the node concerned (PARTICIPANT_LOST);
    ``num_nodes_waiting`` is the count at the time of the event; ``revision`` the store revision
    it happened at."""

    kind: RendezvousEventKind
    round: int
    revision: int
    node_id: str | None = None
    num_nodes_waiting: int = 0
    error: BaseException | None = None


class RendezvousHandler(AsyncResource):
    """The async rendezvous: ``async with handler: result = await handler.next_rendezvous()``.

    Status is observable (``status``, ``is_active``, ``has_error``, ``error``). Using a closed
    handler raises :class:`~aioelastic.errors.RendezvousClosedError` (also a ``RuntimeError``).
    """

    # -- torch's surface

    @abc.abstractmethod
    def get_backend(self) -> str:
        """The registry name of this handler's backend (``memory``, ``c10d``, ``etcd``, ...)."""

    @property
    @abc.abstractmethod
    def run_id(self) -> str:
        """The run this handler belongs to."""

    def get_run_id(self) -> str:
        """torch's spelling of :attr:`run_id`."""
        return self.run_id

    @property
    def use_agent_store(self) -> bool:
        """Whether the result's store may be shared with the workers (always true here)."""
        return True

    @abc.abstractmethod
    async def next_rendezvous(self) -> RendezvousResult:
        """Wait for the next round this node is a member of, and return it."""

    @abc.abstractmethod
    async def is_closed(self) -> bool:
        """Whether the run is closed (reads the store)."""

    @abc.abstractmethod
    async def set_closed(self) -> None:
        """Close the run for every node: waiting nodes get ``RendezvousClosedError``, standbys
        ``RendezvousGracefulExitError``."""

    async def close(self) -> None:
        """Alias of :meth:`set_closed`."""
        await self.set_closed()

    @abc.abstractmethod
    async def num_nodes_waiting(self) -> int:
        """How many nodes wait for a next round that could take them (reads the store)."""

    @abc.abstractmethod
    async def shutdown(self) -> bool:
        """Close the run, stop heart-beating and leave (torch's ``shutdown``); False on error."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Leave without closing the run: this node's records vanish, the others see it go."""

    # -- status

    @property
    @abc.abstractmethod
    def status(self) -> RendezvousStatus:
        """ACTIVE, CLOSED or ERROR, from what this handler has seen."""

    @property
    @abc.abstractmethod
    def error(self) -> BaseException | None:
        """The error that put the handler in ERROR (None otherwise)."""

    def get_status(self) -> RendezvousStatus:
        return self.status

    @property
    def is_active(self) -> bool:
        return self.status is RendezvousStatus.ACTIVE

    @property
    def has_error(self) -> bool:
        return self.status is RendezvousStatus.ERROR

    def get_error_message(self) -> str | None:
        """``str(error)`` with its type, or None if there is no error."""
        error = self.error
        return None if error is None else f"{type(error).__name__}: {error}"

    # -- change notification

    @abc.abstractmethod
    async def wait_for_change(self) -> RendezvousEvent:
        """Wait for the next membership change of the round last returned to this node."""

    async def events(self) -> AsyncIterator[RendezvousEvent]:
        """``async for event in handler.events()``: every change until CLOSED or ERROR."""
        while True:
            event = await self.wait_for_change()
            yield event
            if event.kind in (RendezvousEventKind.CLOSED, RendezvousEventKind.ERROR):
                return


# -- parameters -----------------------------------------------------------------------------------

_TRUE = {"1", "true", "t", "yes", "y"}
_FALSE = {"0", "false", "f", "no", "n"}


def parse_rdzv_conf(text: str) -> dict[str, str]:
    """Parse torchrun's ``--rdzv-conf`` (``"k=v,k2=v2"``): split on ``,``, then the first ``=``.

    An empty item is skipped; an empty key or value raises :class:`~aioelastic.ConfigError`.
    """
    if not isinstance(text, str):
        raise TypeError(f"rdzv_conf must be a str, got {type(text).__name__}")
    config: dict[str, str] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ConfigError("rdzv_conf", item, "key=value pairs separated by ','")
        config[key] = value
    return config


class RendezvousParameters:
    """torch's ``RendezvousParameters(backend, endpoint, run_id, min_nodes, max_nodes, **config)``.

    ``config`` holds torchrun's ``--rdzv-conf`` keys, as strings or typed values; the ``get_as_*``
    accessors parse them and raise :class:`~aioelastic.ConfigError` naming the key and the
    expected form.
    """

    def __init__(
        self,
        backend: str,
        endpoint: str,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        local_addr: str | None = None,
        **config: Any,
    ) -> None:
        if not isinstance(backend, str) or not backend:
            raise ValueError("backend must be a non-empty string")
        if not isinstance(endpoint, str):
            raise TypeError(f"endpoint must be a str, got {type(endpoint).__name__}")
        check_run_id(run_id)  # here, at the edge: a bad id fails before any handler is made
        for name, value in (("min_nodes", min_nodes), ("max_nodes", max_nodes)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if min_nodes < 1:
            raise ValueError(f"min_nodes must be >= 1, got {min_nodes}")
        if max_nodes < min_nodes:
            raise ValueError(f"max_nodes ({max_nodes}) must be >= min_nodes ({min_nodes})")
        self.backend = backend
        self.endpoint = endpoint
        self.run_id = run_id
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.local_addr = local_addr
        self.config = config

    def __repr__(self) -> str:
        return (
            f"RendezvousParameters(backend={self.backend!r}, "
            f"endpoint={redact_url(self.endpoint)!r}, run_id={self.run_id!r}, "
            f"min_nodes={self.min_nodes}, max_nodes={self.max_nodes}, "
            f"config={ {k: _redacted(v) for k, v in self.config.items()}!r})"
        )

    @classmethod
    def from_rdzv_conf(
        cls,
        backend: str,
        endpoint: str,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        rdzv_conf: str = "",
        local_addr: str | None = None,
    ) -> RendezvousParameters:
        """Build from torchrun-style arguments, ``rdzv_conf`` being ``"k=v,k2=v2"``."""
        return cls(
            backend,
            endpoint,
            run_id,
            min_nodes,
            max_nodes,
            local_addr,
            **parse_rdzv_conf(rdzv_conf),
        )

    def get(self, key: str, default: Any = None) -> Any:
        """The raw value of ``key`` (``default`` if absent)."""
        return self.config.get(key, default)

    def get_as_bool(self, key: str, default: bool | None = None) -> bool | None:
        """``1/true/t/yes/y`` or ``0/false/f/no/n`` (any case), ints 1/0, or bools."""
        value = self.config.get(key, default)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            lowered = value.strip().lower()
            if lowered in _TRUE:
                return True
            if lowered in _FALSE:
                return False
        raise ConfigError(key, value, "a boolean: 1/true/t/yes/y or 0/false/f/no/n")

    def get_as_int(self, key: str, default: int | None = None) -> int | None:
        """An integer (a str of digits or an int)."""
        value = self.config.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool):
            raise ConfigError(key, value, "an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ConfigError(key, value, "an integer")

    def get_as_seconds(
        self, key: str, default: float | None = None, *, allow_zero: bool = False
    ) -> float | None:
        """A finite number of seconds > 0 (>= 0 with ``allow_zero``), e.g. ``30`` or ``0.5``."""
        value = self.config.get(key, default)
        if value is None:
            return None
        form = "a number of seconds >= 0" if allow_zero else "a number of seconds > 0"
        if isinstance(value, bool):
            raise ConfigError(key, value, form)
        number: float
        if isinstance(value, (int, float)):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                raise ConfigError(key, value, form) from None
        else:
            raise ConfigError(key, value, form)
        if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
            raise ConfigError(key, value, form)
        return number


# -- registry -------------------------------------------------------------------------------------

RendezvousHandlerCreator = Callable[[RendezvousParameters], Awaitable[RendezvousHandler]]


class _BuiltinHandler(RendezvousHandler):
    """What the built-in handlers share: ``status`` and ``error`` from three flags they keep
    (CLOSED once the run was seen closed or this handler was closed, else ERROR while an error
    stands, else ACTIVE), and the check that the handler is still usable."""

    _closed_seen: bool
    _handler_closed: bool
    _error: BaseException | None

    @property
    def status(self) -> RendezvousStatus:
        if self._closed_seen or self._handler_closed:
            return RendezvousStatus.CLOSED
        if self._error is not None:
            return RendezvousStatus.ERROR
        return RendezvousStatus.ACTIVE

    @property
    def error(self) -> BaseException | None:
        return self._error

    def _translate(self, what: str) -> _Translate:
        """Store errors become RendezvousConnectionError; errors put the handler in ERROR."""
        return _Translate(self, what)

    def _check_usable(self) -> None:
        if self._handler_closed:
            raise RendezvousClosedError(f"the rendezvous handler for {self.run_id!r} is closed")
        if self._closed_seen:
            raise RendezvousClosedError(f"the rendezvous {self.run_id!r} is closed")


class _Translate:
    """``RendezvousHandler._translate``: a class rather than a generator context manager, since
    every waiting participant holds one (one object the collector tracks, not two)."""

    __slots__ = ("_handler", "_what")

    def __init__(self, handler: _BuiltinHandler, what: str) -> None:
        self._handler = handler
        self._what = what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            error = translated(self._handler, self._what, exc)
            if error is not None:
                raise error from exc


#: a handler's own outcomes, raised as they are (its status stays what it was)
_NOT_TRANSLATED = (RendezvousClosedError, RendezvousGracefulExitError, RendezvousTimeoutError)


def translated(handler: _BuiltinHandler, what: str, exc: BaseException) -> BaseException | None:
    """What ``handler._translate(what)`` makes of ``exc``: the error to raise instead (from
    ``exc``), or None to let it through; an error that is the handler's puts it in ERROR.

    For the hottest wait (``next_rendezvous``, held by every waiting participant) without the
    context manager: one object fewer per participant for the collector (two with its bound
    ``__exit__``)."""
    if isinstance(
        exc, RendezvousClosedError | RendezvousGracefulExitError | RendezvousTimeoutError
    ):
        return None
    if isinstance(exc, RendezvousError):
        handler._error = exc
    elif isinstance(exc, StoreError | LeaseExpiredError):
        error = RendezvousConnectionError(f"{what} failed for run {handler.run_id!r}: {exc}")
        handler._error = error
        return error
    return None


class RendezvousHandlerRegistry:
    """Backend name -> ``async creator(params) -> RendezvousHandler``.

    Registering the same creator twice does nothing; a different creator under a taken name raises
    ``ValueError`` (as torch's registry does).
    """

    def __init__(self) -> None:
        self._creators: dict[str, RendezvousHandlerCreator] = {}

    def register(self, backend: str, creator: RendezvousHandlerCreator) -> None:
        if not isinstance(backend, str) or not backend:
            raise ValueError("backend must be a non-empty string")
        current = self._creators.get(backend)
        if current is not None and current is not creator:
            raise ValueError(
                f"the rendezvous backend {backend!r} is already registered with {current!r}"
            )
        self._creators[backend] = creator

    def backends(self) -> list[str]:
        return sorted(self._creators)

    async def create_handler(self, params: RendezvousParameters) -> RendezvousHandler:
        """Create the handler for ``params.backend``; ``ValueError`` naming it if unknown."""
        creator = self._creators.get(params.backend)
        if creator is None:
            raise ValueError(
                f"unknown rendezvous backend {params.backend!r} "
                f"(registered: {', '.join(self.backends())})"
            )
        handler = await creator(params)
        if handler.get_backend() != params.backend:
            await handler.aclose()
            raise RendezvousError(
                f"the handler created for {params.backend!r} reports backend "
                f"{handler.get_backend()!r}"
            )
        return handler


handler_registry = RendezvousHandlerRegistry()
"""The process-wide registry (``memory``, ``http``, ``https``, ``c10d``, ``etcd``, ``static``)."""


async def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """``await create_handler(RendezvousParameters(...))`` from the process-wide registry."""
    from . import _backends

    _backends.register_builtin_backends()
    return await handler_registry.create_handler(params)


def _redacted(value: Any) -> Any:
    return redact_url(value) if isinstance(value, str) else value
