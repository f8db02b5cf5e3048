"""The memory engine's keys in order, for ranges: a sorted list cut into blocks.

One sorted ``list`` made adding or removing a key O(n) (``insort`` and ``del`` move every key
after it): at 10,000 participants, each join's new record and removed old one moved some 40,000
pointers twice, work that grew with N in every join. Here each block holds at most
:data:`BLOCK` keys and the blocks' last keys are kept in a list of their own, so finding a key is
two bisections and adding or removing one moves at most a block (a block that grows past the
bound is split in two; an empty one goes). A range reads the blocks it covers only.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator
from itertools import chain

__all__ = ["BLOCK", "SortedKeys"]

#: The most keys a block holds (then it is split in two halves).
BLOCK = 1024


class SortedKeys:
    """Distinct strings in order: :meth:`add`, :meth:`remove` (of a key present), :meth:`range`,
    iteration and ``len``. Every block holds a key, but for the one empty block of no keys."""

    __slots__ = ("_blocks", "_lasts", "_len")

    def __init__(self, keys: Iterable[str] = ()) -> None:
        """``keys``: distinct and in order (a snapshot's)."""
        ordered = list(keys)
        half = BLOCK // 2
        # (no keys: one empty block, kept, so that a first key allocates nothing)
        self._blocks: list[list[str]] = [
            ordered[i : i + half] for i in range(0, len(ordered), half)
        ] or [[]]
        self._lasts: list[str] = [block[-1] for block in self._blocks if block]
        self._len = len(ordered)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[str]:
        return chain.from_iterable(self._blocks)

    def add(self, key: str) -> None:
        """Add ``key`` (not present)."""
        blocks, lasts = self._blocks, self._lasts
        self._len += 1
        if not lasts:  # the first key, in the empty block
            blocks[0].append(key)
            lasts.append(key)
            return
        at = bisect_left(lasts, key)
        if at == len(lasts):  # after every key: the last block's new last
            at -= 1
            blocks[at].append(key)
            lasts[at] = key
        else:
            insort(blocks[at], key)
        block = blocks[at]
        if len(block) > BLOCK:
            half = len(block) // 2
            blocks.insert(at + 1, block[half:])
            del block[half:]
            lasts.insert(at, block[-1])

    def remove(self, key: str) -> None:
        """Remove ``key`` (present)."""
        blocks, lasts = self._blocks, self._lasts
        at = bisect_left(lasts, key)
        block = blocks[at]
        del block[bisect_left(block, key)]
        self._len -= 1
        if not block:
            del lasts[at]
            if lasts:  # (the last block left stays, empty)
                del blocks[at]
        elif lasts[at] == key:
            lasts[at] = block[-1]

    def range(self, start: str, end: str | None, limit: int | None) -> tuple[list[str], int]:
        """The keys from ``start`` up to ``end`` (excluded; None: to the last key), in order, at
        most ``limit`` of them (None: all), and how many there are in all."""
        blocks, lasts = self._blocks, self._lasts
        first = bisect_left(lasts, start)
        if first == len(lasts):
            return [], 0
        last = len(lasts) - 1 if end is None else min(bisect_left(lasts, end), len(lasts) - 1)
        lo = bisect_left(blocks[first], start)
        found: list[str] = []
        count = 0
        for at in range(first, last + 1):
            block = blocks[at]
            begin = lo if at == first else 0
            stop = len(block) if end is None or at != last else bisect_left(block, end)
            if stop <= begin:
                continue
            count += stop - begin
            if limit is None:
                found += block[begin:stop]
            elif len(found) < limit:
                found += block[begin : min(stop, begin + limit - len(found))]
        return found, count
