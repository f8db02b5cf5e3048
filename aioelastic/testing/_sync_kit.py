"""What the coordination-primitives suite's mixins share: the test decorator and a call count."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .faults import FaultInjectingStore

if TYPE_CHECKING:
    from .sync_conformance import SyncConformance, SyncEnv

__all__ = ["call_count", "sync_test"]

_Body = Callable[[Any, "SyncEnv"], Awaitable[None]]


def sync_test(body: _Body) -> Callable[[Any], None]:
    """Turn ``async def test_x(self, env)`` into a plain pytest test run by the suite."""

    def test(self: SyncConformance) -> None:
        self.run(body)

    test.__name__ = body.__name__
    test.__qualname__ = body.__qualname__
    test.__doc__ = body.__doc__
    return test


async def call_count(stores: list[FaultInjectingStore]) -> int:
    return sum(sum(store.calls.values()) for store in stores)
