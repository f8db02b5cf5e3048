"""``aioelastic serve``'s watch limit and history: room for 10,000 sessions' rendezvous watches by
default (the library's 10,000 refused the driver's watch of the 10,000th node and stalled the
round), both settable, and a watch beyond the limit refused with a clear error."""

from __future__ import annotations

import argparse

import pytest
from helpers.http import ServerProcess

from aioelastic.errors import StoreConnectionError
from aioelastic.store import memory, open_store
from aioelastic.store.http import _cli


def _parse(*argv: str) -> dict[str, object] | str:
    parser = argparse.ArgumentParser()
    _cli.configure(parser)
    return _cli._options(parser.parse_args(list(argv)))


def test_the_defaults_hold_ten_thousand_sessions_watches() -> None:
    options = _parse()
    assert isinstance(options, dict)
    assert options["max_watch_streams"] == 100_000
    # a round of 10,000 writes ~20,000 events: serve keeps ten times the in-process default
    assert options["history_limit"] == 100_000 == 10 * memory.DEFAULT_HISTORY_LIMIT
    options = _parse("--max-watches", "7", "--history-limit", "40000")
    assert isinstance(options, dict)
    assert (options["max_watch_streams"], options["history_limit"]) == (7, 40_000)
    assert _parse("--max-watches", "0") == "--max-watches must be >= 1, got 0"
    assert _parse("--history-limit", "0") == "--history-limit must be >= 1, got 0"


@pytest.mark.asyncio
async def test_a_watch_beyond_max_watches_is_refused_clearly() -> None:
    with ServerProcess("--max-watches", "2") as server:
        async with open_store(server.url) as store:
            first, second = store.watch("a/"), store.watch("b/")
            await first.start()
            await second.start()
            with pytest.raises(StoreConnectionError, match=r"too_many_watches|at most 2 watch"):
                await store.watch("c/").start()
            await first.aclose()
            await second.aclose()
