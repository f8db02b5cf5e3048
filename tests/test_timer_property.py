"""Property tests: random acquire/release/cancel/expire sequences, in virtual time.

Invariants: a released (or cancelled) timer is never reaped; every timer that expired while
armed is reaped exactly once, at its deadline (virtual time: the reap times are compared with
the deadlines to the microsecond).

Durations are whole odd milliseconds and waits whole even milliseconds, so no deadline ever
coincides with the end of a wait: which of two callbacks due at the same instant runs first is
up to the event loop, and the model must not depend on it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioelastic.errors import TimerExpiredError
from aioelastic.testing import run_virtual
from aioelastic.timer import ExpiredTimer, LocalTimerServer, expires

WORKERS = ["w0", "w1", "w2"]
SCOPES = ["a", "b", "c"]

odd_ms = st.integers(min_value=0, max_value=2000).map(lambda n: (2 * n + 1) / 1000)
even_ms = st.integers(min_value=0, max_value=1500).map(lambda n: (2 * n) / 1000)

operations = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.sampled_from(WORKERS), st.sampled_from(SCOPES), odd_ms),
        st.tuples(st.just("release"), st.sampled_from(WORKERS), st.sampled_from(SCOPES)),
        st.tuples(st.just("advance"), even_ms),
        st.tuples(st.just("drop"), st.sampled_from(WORKERS)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations)
def test_server_reaps_exactly_the_expired_unreleased_timers(ops: list[tuple[object, ...]]) -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        reaped: list[tuple[object, str, float]] = []

        def reaper(timer: ExpiredTimer) -> None:
            reaped.append((timer.worker_id, timer.scope_id, round(loop.time(), 6)))

        model: dict[tuple[str, str], float] = {}  # armed (worker, scope) -> deadline
        expected: list[tuple[object, str, float]] = []
        async with LocalTimerServer(reaper) as server:
            clients = {w: server.client(w) for w in WORKERS}
            now = loop.time()

            def settle(until: float) -> None:
                for key, deadline in sorted(model.items(), key=lambda kv: kv[1]):
                    if deadline < until:
                        expected.append((key[0], key[1], round(deadline, 6)))
                        del model[key]

            for op in ops:
                if op[0] == "acquire":
                    _, worker, scope, after = op
                    assert isinstance(worker, str)
                    assert isinstance(scope, str)
                    assert isinstance(after, float)
                    await clients[worker].acquire(scope, after)
                    model[(worker, scope)] = now + after
                elif op[0] == "release":
                    _, worker, scope = op
                    assert isinstance(worker, str)
                    assert isinstance(scope, str)
                    await clients[worker].release(scope)
                    model.pop((worker, scope), None)
                elif op[0] == "drop":
                    worker = op[1]
                    assert isinstance(worker, str)
                    server._drop_worker(worker, "test")
                    for key in [k for k in model if k[0] == worker]:
                        del model[key]
                else:
                    delay = op[1]
                    assert isinstance(delay, float)
                    await asyncio.sleep(delay)
                    now = loop.time()
                    settle(now)
                assert now == loop.time()  # acquire/release never advance time
                assert sorted(reaped) == sorted(expected)
                assert server.armed == len(model)
            await asyncio.sleep(10)
            settle(loop.time())
            assert sorted(reaped) == sorted(expected)
            assert server.armed == 0

    run_virtual(body)


@dataclass(frozen=True)
class Plan:
    after: float  # the guard's duration (odd ms)
    work: float  # how long the block runs (even ms)
    end: str  # "finish" | "cancel_task" | "cancel_guard"


plans = st.lists(
    st.builds(Plan, odd_ms, even_ms, st.sampled_from(["finish", "cancel_task", "cancel_guard"])),
    min_size=1,
    max_size=25,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans=plans)
def test_guards_are_reaped_iff_their_block_overran(plans: list[Plan]) -> None:
    """Concurrent guarded workers: each is reaped (once) exactly when its block overran."""

    async def body() -> None:
        reaped: list[str] = []
        outcomes: dict[str, str] = {}
        async with LocalTimerServer(lambda t: reaped.append(t.scope_id)) as server:
            client = server.client()  # worker id: the task

            async def worker(name: str, plan: Plan) -> None:
                try:
                    async with expires(after=plan.after, scope=name, client=client) as guard:
                        if plan.end == "cancel_guard":
                            await asyncio.sleep(plan.work)
                            await guard.cancel()
                            await asyncio.sleep(1)  # runs on unguarded
                        else:
                            await asyncio.sleep(plan.work if plan.end == "finish" else 3600)
                    outcomes[name] = "finished"
                except TimerExpiredError:
                    outcomes[name] = "expired"
                except asyncio.CancelledError:
                    outcomes[name] = "cancelled"
                    raise

            tasks = {
                f"s{i}": asyncio.create_task(worker(f"s{i}", plan)) for i, plan in enumerate(plans)
            }
            for name, plan in zip(tasks, plans, strict=True):
                if plan.end == "cancel_task":

                    def cancel(task: asyncio.Task[None] = tasks[name]) -> None:
                        task.cancel()

                    asyncio.get_running_loop().call_later(plan.work, cancel)
            await asyncio.wait(tasks.values())
            await asyncio.sleep(10)
            assert server.armed == 0
        for name, plan in zip(tasks, plans, strict=True):
            overran = plan.work > plan.after
            assert reaped.count(name) == (1 if overran else 0), (name, plan)
            if overran:
                assert outcomes[name] == "expired"
            elif plan.end == "cancel_task":
                assert outcomes[name] == "cancelled"
            else:
                assert outcomes[name] == "finished"

    run_virtual(body)


@pytest.mark.parametrize("count", [1000])
def test_many_concurrent_guards(count: int) -> None:
    """A thousand guards at once: the overrunning half is reaped, the rest released."""

    async def body() -> None:
        reaped: list[str] = []
        async with LocalTimerServer(lambda t: reaped.append(t.scope_id)) as server:
            client = server.client()

            async def worker(i: int) -> None:
                try:
                    async with expires(after=1 + i % 7, scope=f"s{i}", client=client):
                        await asyncio.sleep(0.5 + (i % 7) + (2 if i % 2 else 0))
                except TimerExpiredError:
                    pass

            await asyncio.gather(*(worker(i) for i in range(count)))
            assert server.armed == 0
        assert sorted(reaped) == sorted(f"s{i}" for i in range(count) if i % 2)

    run_virtual(body)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=6)
    ),
    max_leaves=12,
)
request_like = st.fixed_dictionaries(
    {},
    optional={
        "v": st.one_of(st.just(1), json_values),
        "worker": st.one_of(st.integers(), st.text(max_size=8), json_values),
        "scope": st.one_of(st.text(max_size=8), json_values),
        "expiration": st.one_of(st.floats(), st.integers(), st.none(), json_values),
        "pid": st.one_of(st.integers(), json_values),
        "signal": st.one_of(st.integers(min_value=-5, max_value=80), json_values),
        "id": json_values,
    },
)


@settings(max_examples=500, deadline=None)
@given(raw=st.one_of(st.binary(max_size=64), json_values.map(repr).map(str.encode)))
def test_wire_parser_rejects_garbage_with_value_error(raw: bytes) -> None:
    from aioelastic.timer import TimerRequest

    message = "parsed"
    try:
        TimerRequest.from_json(raw)
    except ValueError as exc:
        message = str(exc)
    assert message  # a rejection says what is wrong


@settings(max_examples=500, deadline=None)
@given(data=request_like)
def test_wire_parser_accepts_only_valid_requests(data: dict[str, object]) -> None:
    """Every object either parses into a valid request that round-trips, or is a ValueError."""
    import json
    import math

    from aioelastic.timer import TimerRequest

    try:
        raw = json.dumps(data).encode()
    except ValueError:
        return
    try:
        request = TimerRequest.from_json(raw)
    except ValueError:
        return
    assert isinstance(request.worker_id, (int, str))
    assert not isinstance(request.worker_id, bool)
    assert isinstance(request.scope_id, str)
    assert request.scope_id
    if request.expiration_time is not None:
        assert math.isfinite(request.expiration_time)
        assert request.expiration_time >= 0
    assert TimerRequest.from_json(request.to_json()) == request
