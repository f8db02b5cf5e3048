"""The dynamic rendezvous under random joins, late joins, leaves, crashes (lease expiry), lease
revocations, closes and waits: the public machine of ``aioelastic.testing.rendezvous_machine``
(see its docstring for the invariants), on the memory store in virtual time.

Also: whole scenarios drawn from ``aioelastic.testing.strategies.rendezvous_scenarios`` and
replayed with ``run_rendezvous_scenario``, once on the plain memory store and once through a
seeded ``FaultInjectingStore`` (jittered latency on every call), so the store factory of the
public runner is exercised too.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from aioelastic.store import MemoryEngine, MemoryStore, Store
from aioelastic.testing.faults import FaultInjectingStore
from aioelastic.testing.rendezvous_machine import RendezvousMachine, run_rendezvous_scenario
from aioelastic.testing.strategies import RendezvousScenario, rendezvous_scenarios

RendezvousMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRendezvousStateMachine = RendezvousMachine.TestCase


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rendezvous_scenarios(max_steps=20))
def test_scenarios_replay_with_every_invariant(scenario: RendezvousScenario) -> None:
    run_rendezvous_scenario(scenario)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rendezvous_scenarios(max_steps=15))
def test_scenarios_over_a_slow_store(scenario: RendezvousScenario) -> None:
    engine: list[MemoryEngine] = []
    seed = len(scenario.steps)

    async def open_slow_store() -> Store:
        if not engine:
            engine.append(MemoryEngine())
        slow = FaultInjectingStore(MemoryStore(engine[0]), seed=seed)
        slow.latency, slow.jitter = 0.001, 0.004  # virtual seconds: free
        return slow

    run_rendezvous_scenario(scenario, open_store=open_slow_store)
