"""Random operation sequences against the memory backend, checked against a plain model; and the
public op-sequence strategy, run on two memory stores that must agree."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings

from aioelastic.store import MemoryStore, Store
from aioelastic.testing.stateful import StoreMachine
from aioelastic.testing.strategies import StoreOp, run_ops, store_op_sequences


class MemoryMachine(StoreMachine):
    time_travel = True

    async def open_store(self) -> Store:
        return MemoryStore(history_limit=1_000)


MemoryMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestMemoryStateful = MemoryMachine.TestCase


@settings(max_examples=60, deadline=None)
@given(store_op_sequences())
def test_op_sequences_agree_across_namespaces(ops: list[StoreOp]) -> None:
    """The same ops on a fresh store and in a namespace of a busy one: identical outcomes
    (revisions are relative, so the busy store's head start does not show)."""

    async def main() -> None:
        async with MemoryStore() as fresh, MemoryStore() as busy:
            for i in range(5):
                await busy.put(f"other/{i}", b"x")
            assert await run_ops(busy.namespace("ns/"), ops) == await run_ops(fresh, ops)

    asyncio.run(main())
