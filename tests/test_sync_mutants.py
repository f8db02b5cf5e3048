"""Tests that close the gaps mutation testing found in ``aioelastic.sync`` (``scripts/mutants
sync``): each pins a behaviour that a small, realistic bug (a flipped comparison, a dropped
argument, ``or`` for ``and``) changed while every other test still passed.

Unit level: clients of one memory engine (``FaultInjectingStore`` for cut-offs), virtual time.
"""

from __future__ import annotations

import json
import re
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from aioelastic.errors import ConfigError, JobStateError, NotLeaderError, SyncTimeoutError
from aioelastic.store import MemoryEngine, MemoryStore, Store
from aioelastic.sync import (
    Barrier,
    DoubleBarrier,
    Election,
    EventChannel,
    JobState,
    JobStateRecord,
    JobStatus,
    LeaseConfig,
    Lock,
    Parameters,
)
from aioelastic.testing import FaultInjectingStore, virtual_test

# -- LeaseConfig ---------------------------------------------------------------------------------


def test_for_ttl_gives_client_go_proportions_exactly() -> None:
    # client-go's defaults are 15 s / 10 s / 2 s: for_ttl(15) is exactly them
    assert LeaseConfig.for_ttl(15) == LeaseConfig()
    config = LeaseConfig.for_ttl(6)
    assert (config.ttl, config.renew_deadline, config.retry_period) == (6.0, 4.0, 0.8)


def test_for_ttl_names_the_ttl_in_its_errors() -> None:
    with pytest.raises(ConfigError) as info:
        LeaseConfig.for_ttl(0)
    assert info.value.key == "ttl"
    with pytest.raises(TypeError, match=r"^ttl must be a number of seconds, got str$"):
        LeaseConfig.for_ttl("15")  # type: ignore[arg-type]


# -- EventChannel --------------------------------------------------------------------------------


@virtual_test(timeout=60)
async def test_event_wait_checks_after_revision() -> None:
    channel = EventChannel(MemoryStore())
    for bad, kind in (("1", "str"), (True, "bool"), (None, "NoneType")):
        with pytest.raises(TypeError, match=f"^after_revision must be an int, got {kind}$"):
            await channel.wait("e", after_revision=bad)  # type: ignore[arg-type]


@virtual_test(timeout=60)
async def test_event_wait_after_a_future_revision_skips_the_publication_at_it() -> None:
    store = MemoryStore()
    channel = EventChannel(store)
    now = await store.put("other", b"")
    result: list[int] = []

    async def wait() -> None:
        result.append((await channel.wait("e", after_revision=now + 1, timeout=30)).revision)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.sleep(1)
        at = (await channel.publish("e", 1)).revision
        assert at == now + 1  # not newer than after_revision: still waiting
        await anyio.sleep(1)
        assert result == []
        later = (await channel.publish("e", 2)).revision
    assert result == [later]


@virtual_test(timeout=60)
async def test_event_wait_ignores_longer_names_and_clearing() -> None:
    # the wait watches the key as a prefix: "e" must not be woken by "ee", nor by its own delete
    channel = EventChannel(MemoryStore())
    await channel.publish("e", 0)
    seen = await channel.get("e")
    assert seen is not None
    result: list[object] = []

    async def wait() -> None:
        result.append((await channel.wait("e", after_revision=seen.revision, timeout=30)).payload)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.sleep(1)
        await channel.publish("ee", "longer name")
        assert await channel.clear("e") == 1
        await anyio.sleep(1)
        assert result == []
        await channel.publish("e", "mine")
    assert result == ["mine"]


@virtual_test(timeout=60)
async def test_event_wait_after_a_compacted_outage_keeps_waiting() -> None:
    engine = MemoryEngine()
    waiter = FaultInjectingStore(MemoryStore(engine))
    admin = MemoryStore(engine)
    result: list[object] = []

    async def wait() -> None:
        result.append((await EventChannel(waiter).wait("e", timeout=30)).payload)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.sleep(1)
        waiter.partition()
        waiter.drop_watches()
        other = EventChannel(admin)
        await other.publish("x", 1)
        await other.publish("x", 2)
        await admin.compact(await admin.current_revision())
        waiter.heal()
        await anyio.sleep(3)  # it read the state again (no "e" yet) and waits on
        assert result == []
        await other.publish("e", "late")
    assert result == ["late"]


@virtual_test(timeout=60)
async def test_event_clear_of_one_name_leaves_the_others() -> None:
    channel = EventChannel(MemoryStore())
    await channel.publish("a", 1)
    await channel.publish("b", 2)
    assert await channel.clear("a") == 1
    assert await channel.get("a") is None
    kept = await channel.get("b")
    assert kept is not None
    assert kept.payload == 2


@virtual_test(timeout=60)
async def test_event_stream_after_a_compaction_does_not_repeat_the_last_event() -> None:
    engine = MemoryEngine()
    reader = FaultInjectingStore(MemoryStore(engine))
    writer = EventChannel(MemoryStore(engine))
    async with EventChannel(reader).stream() as events:
        await writer.publish("a", 1)
        with anyio.fail_after(5):
            first = await events.__anext__()
        assert (first.name, first.payload) == ("a", 1)
        reader.partition()
        reader.drop_watches()
        await writer.publish("b", 2)
        await writer.publish("c", 3)
        await engine_compact(writer)
        reader.heal()
        with anyio.fail_after(5):
            names = [(await events.__anext__()).name, (await events.__anext__()).name]
        assert names == ["b", "c"]


async def engine_compact(channel: EventChannel) -> None:
    await channel.store.compact(await channel.store.current_revision())


# -- Parameters' schema --------------------------------------------------------------------------


@virtual_test(timeout=60)
async def test_parameter_schema_types_and_tuples() -> None:
    params = Parameters(
        MemoryStore(),
        schema={
            "n": int,
            "s": str,
            "num_or_str": (float, str),
            "int_or_str": (int, str),
            "int_or_bool": (int, bool),
            "opt": (type(None), str),
        },
    )
    accepted = [("n", 3), ("s", "x"), ("num_or_str", 1), ("int_or_bool", True), ("opt", None)]
    accepted += [("opt", "y"), ("int_or_str", 2)]
    for name, value in accepted:
        await params.set(name, value)
        assert await params.get(name) == value
    refused = [("n", None), ("n", True), ("s", None), ("int_or_str", True), ("opt", 1)]
    for name, value in refused:
        with pytest.raises(TypeError, match=f"^parameter {name!r} must be "):
            await params.set(name, value)
    with pytest.raises(TypeError, match=r"^parameter 'opt' must be NoneType \| str, got int 1 "):
        await params.set("opt", 1)
    with pytest.raises(TypeError, match=r"^parameter 'n' must be int, got str"):
        await params.compare_and_set("n", "3", expected_revision=0)
    assert await params.get("n") == 3


# -- JobStateRecord ------------------------------------------------------------------------------


@virtual_test(timeout=60)
async def test_job_state_malformed_records_are_named() -> None:
    store = MemoryStore()
    record = JobStateRecord(store)
    await store.put("job/state", b'{"state":"running","reason":5}')
    with pytest.raises(ValueError, match="malformed") as info:
        await record.get()
    assert str(info.value).startswith("the job state at 'job/state' is malformed: {")
    assert str(info.value).endswith(" (reason is not a string)")


@virtual_test(timeout=60)
async def test_job_state_keeps_details_and_the_write_revision() -> None:
    store = MemoryStore()
    record = JobStateRecord(store)
    status = await record.set("running", "started", details={"rank": 3})
    at = await store.current_revision()
    expected = JobStatus(JobState.RUNNING, "started", {"rank": 3}, at)
    assert status == expected
    assert await record.get() == expected
    assert json.loads((await store.get("job/state")).value) == {  # type: ignore[union-attr]
        "state": "running",
        "reason": "started",
        "details": {"rank": 3},
    }
    await record.set("running")  # no reason, no details: neither is written
    assert json.loads((await store.get("job/state")).value) == {"state": "running"}  # type: ignore[union-attr]


@virtual_test(timeout=60)
async def test_job_state_set_refuses_bad_arguments_clearly() -> None:
    record = JobStateRecord(MemoryStore())
    names = "['pending', 'running', 'succeeded', 'failed']"
    with pytest.raises(ValueError, match=re.escape(f"state must be one of {names}, got 'done'")):
        await record.set("done")
    with pytest.raises(TypeError, match=r"^reason must be a str or None, got int$"):
        await record.set("running", 5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("a failed job needs a reason (reason='...')")):
        await record.set("failed")
    with pytest.raises(TypeError, match=r"^the job state must be JSON-serialisable"):
        await record.set("running", details={1, 2})
    assert await record.get() == JobStatus(JobState.PENDING)


@virtual_test(timeout=60)
async def test_job_state_transition_errors_say_why() -> None:
    store = FaultInjectingStore(MemoryStore())
    record = JobStateRecord(store)
    await record.set("running")
    before = dict(store.calls)
    await record.set("running", "again")  # the same state again: updates the reason
    calls = {op: n - before.get(op, 0) for op, n in store.calls.items()}
    assert {op: n for op, n in calls.items() if n} == {"get": 1, "compare_and_swap": 1}
    await record.set("succeeded")
    with pytest.raises(JobStateError, match=r"^the job at 'job/state' is already succeeded$"):
        await record.set("succeeded")
    with pytest.raises(
        JobStateError, match=r"^the job at 'job/state' cannot go from succeeded to running$"
    ):
        await record.set("running")
    failed = JobStateRecord(store, "other")
    await failed.set("failed", "boom")
    with pytest.raises(JobStateError, match=re.escape("failed to running (it failed: boom)")):
        await failed.set("running")


@virtual_test(timeout=60)
async def test_job_state_wait_checks_and_times_out() -> None:
    record = JobStateRecord(MemoryStore())
    with pytest.raises(ValueError, match=r"^states must name at least one state$"):
        await record.wait([])
    started = anyio.current_time()
    wanted = re.escape("timed out after 2.0s waiting for the job to be ['failed', 'succeeded']")
    with pytest.raises(SyncTimeoutError, match=f"^{wanted}$"):
        await record.wait_final(timeout=2)
    assert anyio.current_time() - started == pytest.approx(2)
    with pytest.raises(SyncTimeoutError, match=r"^timed out after 1\.0s .* \['running'\]$"):
        await record.wait("running", timeout=1)


@virtual_test(timeout=60)
async def test_job_state_watch_of_an_existing_record_and_of_deletes() -> None:
    store = MemoryStore()
    record = JobStateRecord(store)
    written = await record.set("running")
    async with record.watch() as statuses:
        with anyio.fail_after(5):
            assert await statuses.__anext__() == written
            await store.put("job/state-of-another", b"{}")  # under the watched prefix, not ours
            assert await store.delete("job/state") == 1
            deleted_at = await store.current_revision()
            assert await statuses.__anext__() == JobStatus(JobState.PENDING, revision=deleted_at)
            again = await record.set("running")
            assert await statuses.__anext__() == again


async def _cut_off_and_compact(watcher: FaultInjectingStore, admin: Store, change: Any) -> int:
    """Cut ``watcher`` off, run ``change`` on ``admin``, write two other keys and compact, so
    the watcher must read the record again; return the revision of that read."""
    watcher.partition()
    watcher.drop_watches()
    await change()
    await admin.put("noise", b"1")
    await admin.put("noise", b"2")
    now = await admin.current_revision()
    await admin.compact(now)
    watcher.heal()
    return now


@virtual_test(timeout=60)
async def test_job_state_watch_after_compaction_reports_only_what_changed() -> None:
    engine = MemoryEngine()
    watcher, admin = FaultInjectingStore(MemoryStore(engine)), MemoryStore(engine)
    record, other = JobStateRecord(watcher), JobStateRecord(admin)
    async with record.watch() as statuses:
        with anyio.fail_after(10):
            assert await statuses.__anext__() == JobStatus(JobState.PENDING)
            # the record's first write is the store's revision 1, missed in a compacted gap
            set_first = other.set("running")
            await _cut_off_and_compact(watcher, admin, lambda: set_first)
            running = await other.get()
            assert running.revision == 1
            assert await statuses.__anext__() == running
            # nothing changed in the next gap: nothing is reported again
            await _cut_off_and_compact(watcher, admin, anyio.lowlevel.checkpoint)
            await anyio.sleep(2)
            done = await other.set("succeeded")
            assert await statuses.__anext__() == done

            # deleted in a gap: pending, at the revision of the read
            async def delete() -> None:
                await admin.delete("job/state")

            now = await _cut_off_and_compact(watcher, admin, delete)
            assert await statuses.__anext__() == JobStatus(JobState.PENDING, revision=now)


# -- Barrier, DoubleBarrier ----------------------------------------------------------------------

CONFIG = LeaseConfig(ttl=6, renew_deadline=4, retry_period=0.5)


@virtual_test(timeout=60)
async def test_barrier_repr_and_reset() -> None:
    store = MemoryStore()
    barrier = Barrier(store, "B", 1, config=CONFIG)
    assert repr(barrier) == "<Barrier 'B' parties=1>"
    assert repr(DoubleBarrier(store, "D", 3)) == "<DoubleBarrier 'D' parties=3>"
    await barrier.wait(timeout=5)
    await store.put("B-other/x", b"")  # not the barrier's, though its name starts alike
    assert (await store.range("B/")).count == 1  # the ready key
    await barrier.reset()
    assert (await store.range("B/")).count == 0
    assert (await store.range("B-other/")).count == 1


@virtual_test(timeout=60)
async def test_double_barrier_passes_its_lease_config_and_identity_on() -> None:
    store = MemoryStore()
    async with CONFIG.lease(store) as shared:
        with_lease = DoubleBarrier(store, "D1", 1, lease=shared, identity="me", timeout=5)
        async with with_lease:
            (kv,) = (await store.range(with_lease.parties_prefix)).kvs
            assert (kv.lease, kv.value) == (shared.id, b"me")
        assert not shared.lost
        assert (await store.lease_time_to_live(shared.id)).remaining > 0
    config = LeaseConfig(ttl=40, renew_deadline=30, retry_period=5)
    private = DoubleBarrier(store, "D2", 1, config=config, timeout=5)
    async with private:
        (kv,) = (await store.range(private.parties_prefix)).kvs
        assert (await store.lease_time_to_live(kv.lease)).granted_ttl == 40


@virtual_test(timeout=60)
async def test_double_barrier_timeouts_default_and_override() -> None:
    store = MemoryStore()
    for own, given, took in ((1.0, None, 1.0), (100.0, 2.0, 2.0)):
        barrier = DoubleBarrier(store, f"in-{own}", 2, config=CONFIG, timeout=own)
        started = anyio.current_time()
        with pytest.raises(SyncTimeoutError, match=f"^timed out after {took}s at the barrier"):
            await barrier.enter(timeout=given)
        assert anyio.current_time() - started == pytest.approx(took, abs=0.01)
    with pytest.raises(RuntimeError, match=r"^not in the barrier 'in-1.0'$"):
        await DoubleBarrier(store, "in-1.0", 2).leave()
    for own, given, took in ((1.0, None, 1.0), (100.0, 2.0, 2.0)):
        name = f"out-{own}"
        first = DoubleBarrier(store, name, 2, config=CONFIG, timeout=own)
        second = DoubleBarrier(store, name, 2, config=CONFIG, timeout=own)
        async with anyio.create_task_group() as tg:
            tg.start_soon(first.enter)
            await second.enter()
        started = anyio.current_time()
        message = f"^timed out after {took}s leaving the barrier {name!r}: 1 parties still in it$"
        with pytest.raises(SyncTimeoutError, match=message):
            await first.leave(timeout=given)
        assert anyio.current_time() - started == pytest.approx(took, abs=0.01)
        await second.leave(timeout=5)


@virtual_test(timeout=60)
async def test_double_barrier_leave_waits_for_late_parties_and_across_a_compaction() -> None:
    engine = MemoryEngine()
    leaver = FaultInjectingStore(MemoryStore(engine))
    admin = MemoryStore(engine)
    first = DoubleBarrier(leaver, "D", 2, config=CONFIG, timeout=30)
    second = DoubleBarrier(admin, "D", 2, config=CONFIG, timeout=30)
    late = DoubleBarrier(admin, "D", 2, config=CONFIG, timeout=30)
    async with anyio.create_task_group() as tg:
        tg.start_soon(first.enter)
        await second.enter()
    left = anyio.Event()

    async def leave() -> None:
        await first.leave()
        left.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(leave)
        await anyio.sleep(1)
        await late.enter()  # the barrier is open: a late party passes at once, and counts
        await _cut_off_and_compact(leaver, admin, anyio.lowlevel.checkpoint)
        await anyio.sleep(3)  # it read the parties again: two are still in
        tg.start_soon(second.leave)
        await anyio.sleep(1)
        assert not left.is_set()
        await late.leave()
        with anyio.fail_after(5):
            await left.wait()
    assert await admin.get("D/ready") is None


# -- Election, Lock ------------------------------------------------------------------------------


@virtual_test(timeout=60)
async def test_a_leader_whose_key_went_is_told_so_then_is_not_the_leader() -> None:
    store = MemoryStore()
    election = Election(store, "E", config=CONFIG)
    assert repr(election) == "<Election 'E' not leading>"
    with pytest.raises(NotLeaderError, match=r"^not the leader of 'E'$"):
        await election.proclaim("early")
    leader = await election.campaign("v1")
    assert repr(election) == f"<Election 'E' leading term={leader.term}>"
    (kv,) = (await store.range("E/")).kvs
    await store.delete(kv.key)
    with pytest.raises(NotLeaderError, match=r"^lost the leadership of 'E' \(its key is gone\)$"):
        await election.proclaim("v2")
    assert election.is_leader is False
    assert repr(election) == "<Election 'E' not leading>"
    with pytest.raises(NotLeaderError, match=r"^not the leader of 'E'$"):
        await election.proclaim("v3")
    await election.resign()


@virtual_test(timeout=60)
async def test_lock_repr() -> None:
    lock = Lock(MemoryStore(), "L", config=CONFIG)
    assert repr(lock) == "<Lock 'L' not held>"
    token = await lock.acquire()
    assert repr(lock) == f"<Lock 'L' held token={token}>"
    await lock.release()
    assert repr(lock) == "<Lock 'L' not held>"
