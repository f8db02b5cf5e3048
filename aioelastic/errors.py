"""aioelastic's one exception hierarchy.

Every error aioelastic raises on purpose derives from :class:`AioelasticError`. Errors of the
libraries underneath (aiohttp, grpc, OS sockets) are translated at the backend boundary; they never
escape to the caller. Argument errors are plain :class:`ValueError` / :class:`TypeError` naming the
argument, as Python users expect::

    AioelasticError
    ├── ConfigError (also ValueError)              a bad config value: names the key and the form
    ├── StoreError
    │   ├── StoreConnectionError (also ConnectionError)   the store could not be reached
    │   │   └── WriteOutcomeUnknownError           a write was sent but its outcome is unknown
    │   │       └── WriteTimeoutError (also StoreTimeoutError)  ... and its deadline passed
    │   ├── StoreTimeoutError (also TimeoutError)  a store call ran past its deadline
    │   ├── StoreClosedError                       the store client was closed
    │   ├── StoreAuthError                         authentication failed or permission denied
    │   ├── CompactedError                         a watch started below the compacted revision
    │   ├── ValueTooLargeError (also ValueError)   the backend refuses a key or value this big
    │   │   └── TxnTooLargeError                   a transaction over a size limit (named)
    │   ├── TxnConflictError                       an STM gave up: its keys kept changing
    │   └── LeaseError
    │       ├── LeaseNotFoundError                 the lease does not exist (never or no longer)
    │       └── LeaseExpiredError                  a lease someone relied on was lost
    ├── RendezvousError
    │   ├── RendezvousClosedError (also RuntimeError)
    │   ├── RendezvousTimeoutError (also TimeoutError)
    │   ├── RendezvousConnectionError
    │   ├── RendezvousStateError
    │   ├── RendezvousNotFoundError (also LookupError)  no rendezvous state for the run id
    │   └── RendezvousGracefulExitError
    ├── TimerError
    │   └── TimerExpiredError (also TimeoutError; alias TimeoutException)
    └── SyncError                                  coordination primitives (aioelastic.sync)
        ├── SyncTimeoutError (also TimeoutError)   a lock/election/barrier/event wait timed out
        ├── NotLeaderError                         the call needs leadership this side lacks
        └── JobStateError (also ValueError)        an illegal job state transition

``WriteOutcomeUnknownError`` matters for compare-and-swap: when it is raised the write may or may
not have been applied, so a caller must read back before deciding. aioelastic never retries a
write silently.
"""

from __future__ import annotations

__all__ = [
    "AioelasticError",
    "CompactedError",
    "ConfigError",
    "JobStateError",
    "LeaseError",
    "LeaseExpiredError",
    "LeaseNotFoundError",
    "NotLeaderError",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousGracefulExitError",
    "RendezvousNotFoundError",
    "RendezvousStateError",
    "RendezvousTimeoutError",
    "StoreAuthError",
    "StoreClosedError",
    "StoreConnectionError",
    "StoreError",
    "StoreTimeoutError",
    "SyncError",
    "SyncTimeoutError",
    "TimeoutException",
    "TimerError",
    "TimerExpiredError",
    "TxnConflictError",
    "TxnTooLargeError",
    "ValueTooLargeError",
    "WriteOutcomeUnknownError",
    "WriteTimeoutError",
]


class AioelasticError(Exception):
    """Base class of every error aioelastic raises on purpose."""


class ConfigError(AioelasticError, ValueError):
    """A configuration value is malformed; the message names the key and the expected form."""

    def __init__(self, key: str, value: object, expected: str) -> None:
        self.key = key
        self.value = value
        self.expected = expected
        super().__init__(f"bad value for {key!r}: {value!r} (expected {expected})")


# -- store ---------------------------------------------------------------------------------------


class StoreError(AioelasticError):
    """Base class of errors raised by a store backend."""


class StoreConnectionError(StoreError, ConnectionError):
    """The store could not be reached, or the connection was lost.

    Reads that fail this way had no effect. A write that fails this way *before it was sent* had
    no effect either; a write whose outcome is unknown raises :class:`WriteOutcomeUnknownError`.
    """


class WriteOutcomeUnknownError(StoreConnectionError):
    """A write was sent but the connection was lost before its outcome was known.

    The write may or may not have been applied. Read the key back before deciding what to do;
    aioelastic never retries a write silently.
    """


class StoreTimeoutError(StoreError, TimeoutError):
    """A store operation did not finish before its deadline."""


class WriteTimeoutError(WriteOutcomeUnknownError, StoreTimeoutError):
    """A write was sent but no answer came before its deadline: its outcome is unknown.

    Both a :class:`WriteOutcomeUnknownError` (read back before deciding) and a
    :class:`StoreTimeoutError` (so ``except TimeoutError`` handlers see it).
    """


class StoreClosedError(StoreError):
    """The store (client) was closed; no further operations are possible on it."""


class StoreAuthError(StoreError):
    """The store refused the credentials, or the user lacks permission for the operation."""


class ValueTooLargeError(StoreError, ValueError):
    """The backend refuses a key or value of this size."""


class TxnTooLargeError(ValueTooLargeError):
    """A transaction is over one of its size limits; nothing was sent or applied.

    ``limit`` names it: ``"ops"`` (compares, or operations in one branch) or ``"bytes"`` (keys
    and values in all); ``maximum`` is the limit and ``size`` what the transaction has.
    """

    def __init__(self, limit: str, maximum: int, size: int, what: str) -> None:
        self.limit = limit
        self.maximum = maximum
        self.size = size
        unit = "operations" if limit == "ops" else "bytes"
        super().__init__(
            f"transaction too large: {what} has {size} {unit}, the limit is {maximum} "
            f"(max_txn_{limit}); split it into smaller transactions"
        )


class TxnConflictError(StoreError):
    """A software transaction (``Store.stm``) found its keys changed at every attempt and gave
    up after ``attempts``; nothing of it was applied. ``keys``: the keys it read last."""

    def __init__(self, attempts: int, keys: tuple[str, ...]) -> None:
        self.attempts = attempts
        self.keys = keys
        shown = ", ".join(repr(k) for k in keys[:5]) + (", ..." if len(keys) > 5 else "")
        super().__init__(
            f"transaction gave up after {attempts} attempts: other writers kept changing the "
            f"keys it read ({shown or 'none'}); raise max_attempts or reduce contention"
        )


class CompactedError(StoreError):
    """A watch asked for history that the store has already compacted away.

    ``compact_revision`` is the oldest revision the store still has history for; restart the
    watch at it (after re-reading the state) or later.
    """

    def __init__(self, requested_revision: int, compact_revision: int) -> None:
        self.requested_revision = requested_revision
        self.compact_revision = compact_revision
        super().__init__(
            f"revision {requested_revision} has been compacted; the oldest revision still "
            f"available is {compact_revision}"
        )


class LeaseError(StoreError):
    """Base class of lease errors."""


class LeaseNotFoundError(LeaseError):
    """The lease does not exist: it was never granted, was revoked, or has expired."""

    def __init__(self, lease_id: int) -> None:
        self.lease_id = lease_id
        super().__init__(f"lease {lease_id:#x} not found (never granted, revoked or expired)")


class LeaseExpiredError(LeaseError):
    """A lease that a scope of work depended on was lost (expired or revoked)."""

    def __init__(self, lease_id: int, reason: str = "expired") -> None:
        self.lease_id = lease_id
        self.reason = reason
        super().__init__(f"lease {lease_id:#x} lost: {reason}")


# -- rendezvous ----------------------------------------------------------------------------------


class RendezvousError(AioelasticError):
    """Base class of rendezvous errors (the set torch.distributed.elastic users know)."""


class RendezvousClosedError(RendezvousError, RuntimeError):
    """The rendezvous is closed. Also a :class:`RuntimeError`, so code written for torch keeps
    working."""


class RendezvousTimeoutError(RendezvousError, TimeoutError):
    """The rendezvous did not complete before its deadline."""


class RendezvousConnectionError(RendezvousError):
    """The rendezvous lost its store."""


class RendezvousStateError(RendezvousError):
    """The rendezvous state in the store is corrupt or foreign."""


class RendezvousNotFoundError(RendezvousError, LookupError):
    """The store holds no rendezvous state for the run id (never created, or a typo)."""


class RendezvousGracefulExitError(RendezvousError):
    """A surplus (standby) node should exit cleanly because the run closed."""


# -- timers --------------------------------------------------------------------------------------


class TimerError(AioelasticError):
    """Base class of watchdog-timer errors."""


class TimerExpiredError(TimerError, TimeoutError):
    """A scope guarded by a watchdog timer ran past its deadline."""


TimeoutException = TimerExpiredError
"""Alias for readers of older torch tutorials."""


# -- coordination primitives ---------------------------------------------------------------------


class SyncError(AioelasticError):
    """Base class of errors of the coordination primitives (locks, elections, barriers, ...)."""


class SyncTimeoutError(SyncError, TimeoutError):
    """A lock acquire, campaign, barrier or event wait did not finish before its timeout."""


class NotLeaderError(SyncError):
    """The call needs leadership (or the lock) that this side does not hold (any more)."""


class JobStateError(SyncError, ValueError):
    """A job state transition that the state machine does not allow (e.g. out of a final state)."""
