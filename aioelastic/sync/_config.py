"""LeaseConfig: the timing of the lease behind a lock, a leadership or a barrier place.

The three numbers and their rules are those of Kubernetes leader election (client-go's
``LeaderElectionConfig``): a lease lives ``ttl`` seconds unless renewed; it is renewed every
``retry_period``; a holder that has not managed to renew for ``renew_deadline`` gives up *before*
the store can expire its lease, so the gap ``ttl - renew_deadline`` separates the old holder's
last action from the next holder's first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError
from ..store import LeaseKeeper, Store

__all__ = ["JITTER_FACTOR", "LeaseConfig"]

#: ``renew_deadline`` must exceed ``JITTER_FACTOR * retry_period`` (as in client-go), so that a
#: holder gets at least one retry before it gives up.
JITTER_FACTOR = 1.2


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(name, value, "a finite number of seconds > 0")
    return float(value)


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    """Lease timing for the coordination primitives, validated on construction.

    ``ttl``: seconds the lease (and so a lock, a leadership, a barrier place) outlives its last
    renewal; after a crash, others take over within ``ttl``. ``renew_deadline``: seconds a holder
    keeps going without a successful renewal before it cancels its own scope; must be shorter
    than ``ttl``. ``retry_period``: seconds between renewals; ``renew_deadline`` must exceed
    ``1.2 * retry_period``.

    The defaults are client-go's (15 s, 10 s, 2 s). An invalid combination raises
    :class:`~aioelastic.errors.ConfigError` naming the field and the rule it breaks.
    """

    ttl: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        ttl = _seconds("ttl", self.ttl)
        renew_deadline = _seconds("renew_deadline", self.renew_deadline)
        retry_period = _seconds("retry_period", self.retry_period)
        if renew_deadline >= ttl:
            raise ConfigError(
                "renew_deadline",
                renew_deadline,
                f"less than ttl ({ttl}s): a holder must give "
                "up before the store can expire its lease and hand it to someone else",
            )
        if renew_deadline <= JITTER_FACTOR * retry_period:
            raise ConfigError(
                "renew_deadline",
                renew_deadline,
                f"more than {JITTER_FACTOR} * retry_period ({JITTER_FACTOR * retry_period:g}s), "
                "so that a holder retries at least once before it gives up",
            )
        object.__setattr__(self, "ttl", ttl)
        object.__setattr__(self, "renew_deadline", renew_deadline)
        object.__setattr__(self, "retry_period", retry_period)

    @classmethod
    def for_ttl(cls, ttl: float) -> LeaseConfig:
        """A config for ``ttl`` with client-go's proportions (renew at 2/15, give up at 2/3)."""
        ttl = _seconds("ttl", ttl)
        return cls(ttl=ttl, renew_deadline=ttl * 2 / 3, retry_period=ttl * 2 / 15)

    def lease(self, store: Store) -> LeaseKeeper:
        """A :class:`~aioelastic.store.LeaseKeeper` with this timing, to share between primitives.

        ``async with config.lease(store) as lease:`` grants it; pass ``lease=lease`` to several
        locks or elections so they share one lease (like an etcd ``concurrency.Session``).
        """
        return LeaseKeeper(
            store,
            self.ttl,
            keep_alive_interval=self.retry_period,
            renew_deadline=self.renew_deadline,
        )
