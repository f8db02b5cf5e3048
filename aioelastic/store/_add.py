"""``add`` on transactions, for a backend with no atomic increment of its own (etcd).

:class:`CounterAdder` makes every attempt one transaction: put the new total if the key's
``mod_revision`` is still the one last seen, else (failure branch) read the key back, so a
conflict costs no separate read. The key-value last seen is remembered, so a client's next add
to a key usually commits at its first attempt (one round trip; a read plus a compare-and-swap
before). Concurrent adds to one key from one client are combined: while a transaction for the
key is in flight, later adds wait and then go together in one transaction of their summed
deltas, each caller getting the total its own delta made (in call order). So N tasks adding at
once cost a few transactions instead of N rounds of conflicts; between clients, contention is
resolved by the compare, and every add applies exactly once.
"""

from __future__ import annotations

import asyncio

from ._base import Store, _parse_counter
from ._txn import Compare, Get, GetResult, Put, PutResult
from ._types import KeyValue

__all__ = ["CounterAdder"]

#: Key-values remembered for the first attempt of the next add (the memo is emptied when full).
_MEMO_SIZE = 1024


class CounterAdder:
    """The adds of one store client (see the module docstring). ``transactions`` and
    ``conflicts`` count the transactions sent and those whose compare failed."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._seen: dict[str, KeyValue | None] = {}
        self._waiting: dict[str, list[tuple[int, asyncio.Future[int]]]] = {}
        self._flushers: dict[str, asyncio.Task[None]] = {}
        self.transactions = 0
        self.conflicts = 0

    async def add(self, key: str, delta: int) -> int:
        """Add ``delta`` to the decimal integer at ``key`` (absent: 0); return the new total.

        A caller cancelled before its delta was sent leaves it unapplied; one cancelled while
        its transaction is in flight may or may not have added (as with any write)."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, []).append((delta, future))
        if key not in self._flushers:
            self._flushers[key] = asyncio.ensure_future(self._flush(key))
        return await future

    async def _flush(self, key: str) -> None:
        """Send the waiting adds of ``key``, a batch per transaction, until none wait."""
        try:
            while batch := self._waiting.pop(key, None):
                batch = [(d, f) for d, f in batch if not f.done()]  # cancelled: never sent
                if not batch:
                    continue
                try:
                    total = await self._commit(key, sum(d for d, _ in batch))
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                except BaseException:  # the flusher itself was cancelled (the loop is closing)
                    for _, future in batch:
                        future.cancel()
                    raise
                total -= sum(d for d, _ in batch)
                for delta, future in batch:
                    total += delta
                    if not future.done():
                        future.set_result(total)
        finally:
            del self._flushers[key]
            for _, future in self._waiting.pop(key, []):  # only if the flusher was cancelled
                future.cancel()

    async def _commit(self, key: str, delta: int) -> int:
        """Add ``delta`` in one transaction per attempt; return the new total."""
        kv = self._seen.pop(key, None)
        while True:
            base = 0 if kv is None else _parse_counter(key, kv.value)
            expected = 0 if kv is None else kv.mod_revision
            lease = 0 if kv is None else kv.lease  # an add keeps the key's lease
            result = await self._store.txn(
                compare=[Compare.mod_revision(key) == expected],
                success=[Put(key, str(base + delta).encode(), lease)],
                failure=[Get(key)],
            )
            self.transactions += 1
            outcome = result[0]
            if isinstance(outcome, PutResult):
                if len(self._seen) >= _MEMO_SIZE:
                    self._seen.clear()
                self._seen[key] = outcome.kv
                return base + delta
            self.conflicts += 1
            assert isinstance(outcome, GetResult)
            kv = outcome.kv
