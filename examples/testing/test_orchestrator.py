"""Testing an orchestrator with aioelastic's test kit: the pytest fixtures (under pytest-asyncio
and anyio's plugin), virtual time, the fault-injecting store, the hypothesis strategies, the
state machines and the conformance suite.

Run it with ``python -m pytest examples/testing`` (needs ``aioelastic[test]``).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest
from hypothesis import given, settings
from orchestrator import register, wait_for_loss, wait_for_workers

from aioelastic.store import MemoryEngine, MemoryStore, Store, open_store
from aioelastic.testing import FaultPlan, run_virtual
from aioelastic.testing.conformance import StoreConformance
from aioelastic.testing.http import ServerThread
from aioelastic.testing.rendezvous_machine import RendezvousMachine, RendezvousMachineConfig
from aioelastic.testing.stateful import StoreMachine
from aioelastic.testing.strategies import StoreOp, run_ops, store_op_sequences


# --8<-- [start:fixtures]
@pytest.mark.asyncio
async def test_workers_gather(aioelastic_memory_store: MemoryStore) -> None:
    store = aioelastic_memory_store
    keepers = [await register(store, name) for name in ("a", "b")]
    with anyio.fail_after(5):
        assert await wait_for_workers(store, 2) == {"a", "b"}
    for keeper in keepers:
        await keeper.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_workers_gather_over_http(
    aioelastic_http_server: ServerThread, anyio_backend: str
) -> None:
    async with open_store(aioelastic_http_server.url) as client:
        store = client.namespace("test-workers-gather/")  # the server is shared: use a namespace
        keeper = await register(store, "a")
        with anyio.fail_after(5):
            assert await wait_for_workers(store, 1) == {"a"}
        await keeper.aclose()


# --8<-- [end:fixtures]


# --8<-- [start:faults]
def test_a_cut_off_worker_is_seen_gone() -> None:
    """Two worker processes, one cut off from the store longer than its TTL: virtual time makes
    the 30 s lease expire at once, and the orchestrator sees the loss."""

    async def scenario() -> None:
        engine = MemoryEngine()  # one store; a client per "process"
        plan = FaultPlan(seed=42)
        orchestrator = MemoryStore(engine)
        a = plan.client(MemoryStore(engine), "worker-a")
        b = plan.client(MemoryStore(engine), "worker-b")
        keepers = [await register(a, "a", ttl=30), await register(b, "b", ttl=30)]
        async with anyio.create_task_group() as tg:
            lost: list[str] = []

            async def watch() -> None:
                lost.append(await wait_for_loss(orchestrator))

            tg.start_soon(watch)
            await anyio.sleep(0.1)
            plan.partition("worker-b")  # b's keep-alives now fail; the server's TTL runs on
            with anyio.fail_after(60):
                await keepers[1].wait_lost()  # the worker learns it too
        assert lost == ["b"]
        await keepers[0].aclose()

    run_virtual(scenario())


# --8<-- [end:faults]


# --8<-- [start:strategies]
@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with ServerThread() as running:
        yield running


@settings(max_examples=20, deadline=None)
@given(ops=store_op_sequences(max_size=15))
def test_http_store_agrees_with_memory(server: ServerThread, ops: list[StoreOp]) -> None:
    async def main() -> None:
        async with MemoryStore() as memory, open_store(server.url) as http:
            namespace = http.namespace(f"diff/{uuid.uuid4().hex}/")  # a fresh key space
            assert await run_ops(namespace, ops) == await run_ops(memory, ops)

    asyncio.run(main())


# --8<-- [end:strategies]


# --8<-- [start:machines]
class MemoryStoreMachine(StoreMachine):
    time_travel = True  # in-process: lease expiry is explored on a virtual clock

    async def open_store(self) -> Store:
        return MemoryStore()


MemoryStoreMachine.TestCase.settings = settings(max_examples=20, deadline=None)
TestStoreMachine = MemoryStoreMachine.TestCase


class SmallRendezvous(RendezvousMachine):
    config = RendezvousMachineConfig(slots=4, max_min_nodes=2, lease_ttl=4.0)


SmallRendezvous.TestCase.settings = settings(max_examples=20, stateful_step_count=20, deadline=None)
TestRendezvousMachine = SmallRendezvous.TestCase
# --8<-- [end:machines]


# --8<-- [start:conformance]
class TestMyBackendConforms(StoreConformance):
    """Replace the memory store with your backend: every test of the protocol runs on it."""

    features = frozenset({"compaction", "fractional_ttl"})  # the optional features it has
    virtual_time = True  # only for in-process backends: lease tests take no real time

    @contextlib.asynccontextmanager
    async def open_store(self) -> AsyncIterator[Store]:
        async with MemoryStore() as store:
            yield store


# --8<-- [end:conformance]
