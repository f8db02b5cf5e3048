"""What the conformance suites share: the test decorator and watch helpers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from ..store import Store, Watch, WatchEvent

__all__ = ["collect", "conformance_test", "next_event"]

_Body = Callable[[Any, Store], Awaitable[None]]


def conformance_test(
    *, requires: str | None = None, namespaced: bool = True
) -> Callable[[_Body], Callable[[Any], None]]:
    """Turn ``async def test_x(self, store)`` into a plain pytest test run by the suite."""

    def decorate(body: _Body) -> Callable[[Any], None]:
        def test(self: Any) -> None:
            if requires is not None and requires not in self.features:
                pytest.skip(f"the backend does not declare the {requires!r} feature")
            self.run(body, namespaced=namespaced)

        test.__name__ = body.__name__
        test.__qualname__ = body.__qualname__
        test.__doc__ = body.__doc__
        return test

    return decorate


async def next_event(watch: Watch, timeout: float = 10.0) -> WatchEvent:
    """The watch's next event, or fail after ``timeout`` seconds."""
    with anyio.fail_after(timeout):
        return await watch.__anext__()


async def collect(watch: Watch, count: int, timeout: float = 10.0) -> list[WatchEvent]:
    return [await next_event(watch, timeout) for _ in range(count)]
