"""Random operation sequences against the memory backend, checked against a plain model."""

from __future__ import annotations

from hypothesis import settings

from aioelastic.store import MemoryStore, Store
from aioelastic.testing.stateful import StoreMachine


class MemoryMachine(StoreMachine):
    time_travel = True

    async def open_store(self) -> Store:
        return MemoryStore(history_limit=1_000)


MemoryMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestMemoryStateful = MemoryMachine.TestCase
