"""The conveniences and errors of the store conformance suite: ``wait_for``, namespaces, a
closed store, bad arguments; mixed into :class:`~aioelastic.testing.conformance.StoreConformance`
so that every backend runs it."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable

import anyio
import pytest

from ..errors import StoreClosedError, StoreTimeoutError
from ..store import Store, open_store
from ._conformance_kit import conformance_test, next_event

__all__ = ["UsageConformance"]


class UsageConformance:
    """What users lean on beyond the core calls: ``wait_for``, namespaces, a closed store raising
    ``StoreClosedError``, and bad arguments named in their errors."""

    # -- conveniences

    @conformance_test()
    async def test_wait_for_keys(self, store: Store) -> None:
        await store.put("ready/a", b"a")

        async def later() -> None:
            await anyio.sleep(0.05)
            await store.put("ready/b", b"b")

        async with anyio.create_task_group() as tg:
            tg.start_soon(later)
            found = await store.wait_for(["ready/a", "ready/b"], timeout=10)
        assert {k: kv.value for k, kv in found.items()} == {"ready/a": b"a", "ready/b": b"b"}
        with pytest.raises(StoreTimeoutError, match="ready/never"):
            await store.wait_for(["ready/a", "ready/never"], timeout=0.1)

    @conformance_test()
    async def test_namespaces_isolate_keys(self, store: Store) -> None:
        one, two = store.namespace("one/"), store.namespace("two/")
        await one.put("k", b"1")
        await two.put("k", b"2")
        assert (await one.get("k")).value == b"1"  # type: ignore[union-attr]
        assert [kv.key for kv in await store.range("")] == ["one/k", "two/k"]
        async with two.watch("") as events:
            await one.put("x", b"not seen")
            await two.put("x", b"seen")
            event = await next_event(events)
        assert (event.kv.key, event.kv.value) == ("x", b"seen")

    # -- errors

    @conformance_test(namespaced=False)
    async def test_a_closed_store_raises_closed(self, store: Store) -> None:
        events = store.watch("closing/")
        await events.start()

        async def pending() -> BaseException | None:
            try:
                await events.__anext__()
            except (StoreClosedError, StopAsyncIteration) as exc:
                return exc
            return None

        task = asyncio.ensure_future(pending())
        await asyncio.sleep(0.05)
        await store.aclose()
        with anyio.fail_after(10):
            outcome = await task
        assert isinstance(outcome, (StoreClosedError, StopAsyncIteration))
        for call in (
            store.get("k"),
            store.put("k", b"v"),
            store.range(""),
            store.delete("k"),
            store.compare_and_swap("k", 0, b"v"),
            store.add("k"),
            store.lease_grant(5),
            store.current_revision(),
        ):
            with pytest.raises(StoreClosedError):
                await call
        with pytest.raises(StoreClosedError):
            store.watch("k")
        await store.aclose()  # idempotent

    @conformance_test()
    async def test_bad_arguments_name_the_argument(self, store: Store) -> None:
        bad: list[tuple[Callable[[], Awaitable[object]], type[Exception], str]] = [
            (lambda: store.put("", b"v"), ValueError, "key"),
            (lambda: store.put(b"k", b"v"), TypeError, "key"),  # type: ignore[arg-type]
            (lambda: store.put("k", "text"), TypeError, "value"),  # type: ignore[arg-type]
            (lambda: store.put("k", 5), TypeError, "value"),  # type: ignore[arg-type]
            (lambda: store.get(""), ValueError, "key"),
            (lambda: store.range("p", limit=0), ValueError, "limit"),
            (lambda: store.compare_and_swap("k", -1, b"v"), ValueError, "expected_mod_revision"),
            (lambda: store.lease_grant(0), ValueError, "ttl"),
            (lambda: store.lease_grant(-1), ValueError, "ttl"),
            (lambda: store.lease_grant(math.nan), ValueError, "ttl"),
            (lambda: store.lease_grant("5"), TypeError, "ttl"),  # type: ignore[arg-type]
            (lambda: store.add("k", 1.5), TypeError, "delta"),  # type: ignore[arg-type]
            (lambda: store.wait_for(["k"], timeout=-1), ValueError, "timeout"),
            (lambda: open_store("not a url"), ValueError, "url"),
            (lambda: open_store("nosuchscheme://x"), ValueError, "scheme"),
        ]
        for call, error, word in bad:
            with pytest.raises(error, match=word):
                await call()
        with pytest.raises(ValueError, match="start_revision"):
            store.watch("p", start_revision=0)
        assert len(await store.range("")) == 0  # nothing was written
