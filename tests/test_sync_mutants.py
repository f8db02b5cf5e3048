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

from aioelastic.errors import (
    CompactedError,
    ConfigError,
    JobStateError,
    LeaseExpiredError,
    NotLeaderError,
    StoreConnectionError,
    SyncTimeoutError,
    WriteOutcomeUnknownError,
)
from aioelastic.store import (
    CasResult,
    KeyValue,
    MemoryEngine,
    MemoryStore,
    Put,
    Store,
    Txn,
    TxnResult,
    Watch,
    WatchEvent,
)
from aioelastic.sync import (
    Barrier,
    DoubleBarrier,
    Election,
    EventChannel,
    JobState,
    JobStateRecord,
    JobStatus,
    Leader,
    LeaseConfig,
    Lock,
    ParameterChange,
    Parameters,
    store_lock,
)
from aioelastic.sync._common import (
    QueueEntry,
    ResumingWatch,
    decode_json,
    default_identity,
    queue_name_of,
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


@virtual_test(timeout=60)
async def test_a_shared_lease_is_renewed_every_retry_period() -> None:
    # client-go's timing: renewals every retry_period (0.5 s here), not the keeper's TTL / 3 (2 s)
    store = FaultInjectingStore(MemoryStore())
    async with LeaseConfig(ttl=6, renew_deadline=4, retry_period=0.5).lease(store):
        await anyio.sleep(5.25)
    assert store.calls["lease_keep_alive"] == 10


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


class _RacingStore(MemoryStore):
    """A store whose next compare-and-swap first lets ``rival`` write the same key (another
    process's write landing between a read and the swap)."""

    rival: tuple[str, bytes] | None = None
    swaps = 0

    async def _compare_and_swap(
        self, key: str, expected_mod_revision: int, value: bytes, lease: int
    ) -> CasResult:
        self.swaps += 1
        if self.swaps > 10:  # a retry loop that never reads the new value would spin
            raise RuntimeError("compare-and-swap retried more than 10 times")
        if self.rival is not None:
            rival_key, rival_value = self.rival
            self.rival = None
            await self._put(rival_key, rival_value, 0)
        return await super()._compare_and_swap(key, expected_mod_revision, value, lease)


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
    with pytest.raises(
        ValueError, match=re.escape("a failed job needs a reason (reason='...')") + "$"
    ):
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
    seen: list[JobStatus] = []

    async def follow() -> None:
        async with record.watch() as statuses:
            async for status in statuses:
                seen.append(status)

    async def settle() -> None:
        await anyio.sleep(3)

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)
        await settle()
        assert seen == [JobStatus(JobState.PENDING)]
        # the record's first write is the store's revision 1, missed in a compacted gap
        await _cut_off_and_compact(watcher, admin, lambda: other.set("running"))
        await settle()
        running = await other.get()
        assert running.revision == 1
        assert seen[1:] == [running]
        # nothing changed in the next gap: nothing is reported again
        await _cut_off_and_compact(watcher, admin, anyio.lowlevel.checkpoint)
        await settle()
        assert seen[2:] == []

        # deleted in a gap: pending, at the revision of the read
        async def delete() -> None:
            await admin.delete("job/state")

        now = await _cut_off_and_compact(watcher, admin, delete)
        await settle()
        assert seen[2:] == [JobStatus(JobState.PENDING, revision=now)]
        done = await other.set("succeeded")  # seen live
        await settle()
        assert seen[3:] == [done]
        now = await _cut_off_and_compact(watcher, admin, delete)  # deleted after a live write
        await settle()
        assert seen[4:] == [JobStatus(JobState.PENDING, revision=now)]
        tg.cancel_scope.cancel()


@virtual_test(timeout=60)
async def test_job_state_set_checks_the_transition_again_after_a_rival_write() -> None:
    store = _RacingStore()
    record = JobStateRecord(store)
    await record.set("running")
    store.rival = ("job/state", b'{"state":"succeeded"}')
    with pytest.raises(JobStateError, match="cannot go from succeeded to failed"):
        await record.set("failed", "late")
    assert store.swaps == 2  # its own, then the one after the rival's write
    store.rival = ("job/state2", b'{"state":"running"}')
    other = JobStateRecord(store, "job/state2")
    done = await other.set("succeeded")  # pending -> the rival's running -> succeeded
    assert done.state is JobState.SUCCEEDED


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
        await _cut_off_and_compact(leaver, admin, anyio.lowlevel.checkpoint)
        await anyio.sleep(3)  # it read the parties again: one is still in
        await late.enter()  # the barrier is open: a late party passes at once, and counts
        await anyio.sleep(1)
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
    assert lock.held is False
    assert repr(lock) == "<Lock 'L' not held>"
    token = await lock.acquire()
    assert repr(lock) == f"<Lock 'L' held token={token}>"
    await lock.release()
    assert repr(lock) == "<Lock 'L' not held>"


# -- queue entries -------------------------------------------------------------------------------


def test_queue_name_of_recognises_only_entries_bound_to_the_lease_they_name() -> None:
    def kv(key: str, lease: int) -> KeyValue:
        return KeyValue(key, b"", create_revision=1, mod_revision=1, version=1, lease=lease)

    assert queue_name_of(kv("jobs/lock/1f_a", 0x1F)) == "jobs/lock"
    assert queue_name_of(kv("lock/10_2", 16)) == "lock"  # the lease id is hex
    assert queue_name_of(kv("lock/10_2", 10)) is None  # another lease than the key names
    assert queue_name_of(kv("lock/0_2", 0)) is None  # no lease at all
    assert queue_name_of(kv("lock/1f", 0x1F)) is None  # not the entry form
    assert queue_name_of(kv("lock/1f_2/x", 0x1F)) is None


@virtual_test(timeout=60)
async def test_a_queue_key_rewritten_by_someone_else_is_left_to_them() -> None:
    # a leader on a shared lease whose key someone else rewrote: proclaim says the leadership
    # is lost, and resigning does not delete the key it no longer owns
    store = MemoryStore()
    async with CONFIG.lease(store) as shared:
        election = Election(store, "E", lease=shared)
        await election.campaign("mine")
        (kv,) = (await store.range("E/")).kvs
        await store.put(kv.key, b"theirs", lease=shared.id)
        with pytest.raises(NotLeaderError, match="lost the leadership"):
            await election.proclaim("again")
        await election.resign()
        kept = await store.get(kv.key)
        assert kept is not None
        assert kept.value == b"theirs"


# -- checks and messages of the views ------------------------------------------------------------


@virtual_test(timeout=60)
async def test_views_refuse_a_non_store_and_name_their_arguments() -> None:
    for view in (EventChannel, JobStateRecord, Parameters):
        with pytest.raises(TypeError, match=r"^store must be a Store, got str$"):
            view("memory://")  # type: ignore[arg-type]
    store = MemoryStore()
    with pytest.raises(ValueError, match=r"^prefix must be a non-empty str"):
        Parameters(store, "")
    with pytest.raises(ValueError, match=r"^schema key must be a non-empty str"):
        Parameters(store, schema={"": int})
    channel = EventChannel(store)
    with pytest.raises(ValueError, match=r"^event name must be a non-empty str"):
        await channel.publish("")
    with pytest.raises(ValueError, match=r"^names\[\] must be a non-empty str"):
        channel.stream([""])
    with pytest.raises(TypeError, match=r"^the payload of event 'e' must be JSON-serialisable"):
        await channel.publish("e", float("nan"))
    await store.put("events/bad", b"{not json")
    with pytest.raises(ValueError, match=r"^event 'bad' is not valid JSON: b'\{not json' \("):
        await channel.get("bad")
    params = Parameters(store)
    with pytest.raises(ValueError, match=r"^parameter name must be a non-empty str"):
        await params.get("")
    with pytest.raises(TypeError, match=r"^parameter 'x' must be JSON-serialisable"):
        await params.set("x", float("inf"))
    await store.put("params/bad", b"[1,")
    with pytest.raises(ValueError, match=r"^parameter 'bad' is not valid JSON"):
        await params.get("bad")


def test_decode_json_quotes_at_most_60_bytes() -> None:
    data = b"x" * 100
    with pytest.raises(ValueError, match=re.escape(f"v is not valid JSON: {data[:60]!r} (")):
        decode_json(data, "v")


@virtual_test(timeout=60)
async def test_event_channel_default_prefix_and_keys() -> None:
    store = MemoryStore()
    published = await EventChannel(store).publish("e", {"n": 1})
    kv = await store.get("events/e")
    assert kv is not None
    assert (kv.value, kv.mod_revision) == (b'{"n":1}', published.revision)
    assert await EventChannel(store, "other").get("e") is None


@virtual_test(timeout=60)
async def test_event_stream_of_some_names_from_a_revision() -> None:
    store = MemoryStore()
    channel = EventChannel(store)
    first = await channel.publish("a", 1)
    await channel.publish("b", 2)
    await channel.publish("a", 3)
    async with channel.stream(["a"], start_revision=first.revision) as events:
        with anyio.fail_after(5):
            got = [(await events.__anext__()).payload, (await events.__anext__()).payload]
    assert got == [1, 3]


@virtual_test(timeout=60)
async def test_event_stream_backlog_after_a_compaction_is_filtered_and_ends_on_close() -> None:
    engine = MemoryEngine()
    reader = FaultInjectingStore(MemoryStore(engine))
    writer = EventChannel(MemoryStore(engine))
    events = EventChannel(reader).stream(["a", "b", "c"])
    async with events:
        await writer.publish("a", 0)
        with anyio.fail_after(5):
            assert (await events.__anext__()).name == "a"
        reader.partition()
        reader.drop_watches()
        for name in ("b", "z", "c"):
            await writer.publish(name, 1)
        await engine_compact(writer)
        reader.heal()
        with anyio.fail_after(5):
            assert (await events.__anext__()).name == "b"
    # "c" is still in the backlog: a closed stream does not report it
    with pytest.raises(StopAsyncIteration):
        await events.__anext__()


# -- Parameters ----------------------------------------------------------------------------------


@virtual_test(timeout=60)
async def test_parameter_errors_say_where_and_entries_have_versions() -> None:
    store = MemoryStore()
    params = Parameters(store, schema={"n": int})
    with pytest.raises(TypeError, match=r"^parameter 'n' must be int, got str 'x' \(writing\)$"):
        await params.set("n", "x")
    at = await store.put("params/n", b'"x"')
    wanted = rf"^parameter 'n' must be int, got str 'x' \(stored at revision {at}\)$"
    with pytest.raises(TypeError, match=wanted):
        await params.get("n")
    await params.set("n", 1)
    entry = await params.get_entry("n")
    assert entry is not None
    assert (entry.value, entry.version) == (1, 2)
    with pytest.raises(TypeError, match=r"^parameter 'n' must be int, got str"):
        await params.update("n", lambda value: "no")
    assert await params.get("n") == 1


@virtual_test(timeout=60)
async def test_parameter_update_reads_once_and_reruns_on_the_rivals_value() -> None:
    store = _RacingStore()
    params = Parameters(store)
    await params.set("n", 5)
    seen: list[int] = []

    def add_one(value: int) -> int:
        seen.append(value)
        return value + 1

    store.rival = ("params/n", b"10")
    result = await params.update("n", add_one)
    assert seen == [5, 10]  # its first read, then the rival's value: never the default
    assert result.value == 11
    assert await params.get("n") == 11


@virtual_test(timeout=60)
async def test_parameter_watch_of_some_names_from_a_revision() -> None:
    store = MemoryStore()
    params = Parameters(store, schema={"a": int, "b": int})
    with pytest.raises(KeyError, match="unknown parameter 'c'"):
        params.watch(["c"])
    first = await params.set("a", 1)
    await params.set("b", 2)
    await params.delete("a")
    deleted_at = await store.current_revision()
    async with params.watch(["a"], start_revision=first) as changes:
        with anyio.fail_after(5):
            assert await changes.__anext__() == ParameterChange("a", 1, first)
            assert await changes.__anext__() == ParameterChange("a", None, deleted_at, deleted=True)
            later = await params.set("b", 3)
            again = await params.set("a", 4)
            assert later < again
            assert await changes.__anext__() == ParameterChange("a", 4, again)
    async with params.watch() as changes:  # from now on
        with anyio.fail_after(5):
            now = await params.set("b", 5)
            assert await changes.__anext__() == ParameterChange("b", 5, now)


@virtual_test(timeout=60)
async def test_parameter_watch_after_a_compaction_reports_changes_and_deletes_once() -> None:
    engine = MemoryEngine()
    reader = FaultInjectingStore(MemoryStore(engine))
    writer = Parameters(MemoryStore(engine))
    await writer.set("kept", 0)
    await writer.set("gone", 0)
    await writer.set("live", 0)
    changes = Parameters(reader).watch(["kept", "gone", "live", "new", "other"])
    async with changes:
        with anyio.fail_after(10):
            await writer.delete("live")  # seen live, as a delete
            change = await changes.__anext__()
            assert (change.name, change.deleted) == ("live", True)
            kept_at = await writer.set("kept", 1)  # seen live, the last change before the gap
            assert await changes.__anext__() == ParameterChange("kept", 1, kept_at)
            reader.partition()
            reader.drop_watches()
            await writer.delete("gone")
            new_at = await writer.set("new", 1)
            other_at = await writer.set("other", 2)
            await writer.store.compact(await writer.store.current_revision())
            read_at = await writer.store.current_revision()
            reader.heal()
            got = [await changes.__anext__() for _ in range(3)]
            assert got == [
                ParameterChange("new", 1, new_at),
                ParameterChange("other", 2, other_at),
                ParameterChange("gone", None, read_at, deleted=True),
            ]
            # nothing is reported twice ("live" was deleted before the gap); then it follows on
            next_at = await writer.set("kept", 9)
            assert await changes.__anext__() == ParameterChange("kept", 9, next_at)


@virtual_test(timeout=60)
async def test_parameter_watch_backlog_ends_on_close() -> None:
    engine = MemoryEngine()
    reader = FaultInjectingStore(MemoryStore(engine))
    writer = Parameters(MemoryStore(engine))
    changes = Parameters(reader).watch()
    async with changes:
        reader.partition()
        reader.drop_watches()
        await writer.set("a", 1)
        await writer.set("b", 2)
        await writer.store.compact(await writer.store.current_revision())
        reader.heal()
        with anyio.fail_after(5):
            assert (await changes.__anext__()).name == "a"
    with pytest.raises(StopAsyncIteration):
        await changes.__anext__()


@virtual_test(timeout=60)
async def test_parameter_watch_replaying_from_before_its_open_cannot_bridge_a_compaction() -> None:
    # Replaying changes older than its open, it cannot tell which names were deleted in a
    # compacted gap: CompactedError (re-read with snapshot() and watch again)
    for consumed in (1, 3):  # still before its open's revision, or exactly at it
        engine = MemoryEngine()
        reader = FaultInjectingStore(MemoryStore(engine))
        writer = Parameters(MemoryStore(engine))
        first = await writer.set("a", 1)
        await writer.set("b", 2)
        await writer.set("c", 3)
        async with Parameters(reader).watch(start_revision=first) as changes:
            with anyio.fail_after(10):
                for _ in range(consumed):
                    await changes.__anext__()
                reader.partition()
                reader.drop_watches()
                await writer.set("d", 4)
                await writer.store.compact(await writer.store.current_revision())
                reader.heal()
                with pytest.raises(CompactedError):
                    await changes.__anext__()


# -- closing and opening the followers -----------------------------------------------------------


@virtual_test(timeout=60)
async def test_followers_closed_before_their_first_item_report_nothing() -> None:
    store = MemoryStore()
    await JobStateRecord(store).set("running")
    statuses = JobStateRecord(store).watch()
    async with statuses:  # entering reads the current status already
        pass
    with pytest.raises(StopAsyncIteration):
        await statuses.__anext__()
    election = Election(store, "E", config=CONFIG)
    await election.campaign("me")
    observer = election.observe()
    await observer.aclose()
    with pytest.raises(StopAsyncIteration):
        await observer.__anext__()
    await election.resign()


@virtual_test(timeout=60)
async def test_a_stream_from_a_revision_opens_through_an_outage_on_one_watch() -> None:
    engine = MemoryEngine()
    reader = FaultInjectingStore(MemoryStore(engine))
    writer = EventChannel(MemoryStore(engine))
    first = await writer.publish("a", 1)
    await writer.publish("b", 2)
    reader.partition()
    refused: list[int] = []

    async def heal() -> None:
        await anyio.sleep(1)
        refused.append(reader.calls["watch"])
        reader.heal()

    async with anyio.create_task_group() as tg:
        tg.start_soon(heal)
        async with EventChannel(reader).stream(start_revision=first.revision) as events:
            with anyio.fail_after(5):
                names = [(await events.__anext__()).name, (await events.__anext__()).name]
    assert names == ["a", "b"]
    # refused at 0, 0.05, 0.15, 0.35 and 0.75 s: the backoff doubles from 0.05 s
    assert refused[0] == 5
    assert reader.calls["watch"] == refused[0] + 1  # those the partition refused, one that ran


# -- Election and Lock: arguments, options, clean-up under cancellation --------------------------


@virtual_test(timeout=60)
async def test_election_and_lock_arguments() -> None:
    for primitive in (Election, Lock):
        with pytest.raises(TypeError, match=r"^store must be a Store, got str$"):
            primitive("memory://", "E")  # type: ignore[arg-type]
    store = MemoryStore()
    with pytest.raises(TypeError, match=r"^value must be str or bytes, got int$"):
        await Election(store, "E").campaign(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^identity must be a str or None, got int$"):
        Lock(store, "L", identity=5)  # type: ignore[arg-type]
    for lock in (Lock(store, "L1", identity="me"), store_lock(store, "L2", identity="me")):
        await lock.acquire()
        holder = await lock.holder()
        assert holder is not None
        assert holder.value == b"me"
        with pytest.raises(RuntimeError, match=r"^the lock 'L\d' is already held or being acq"):
            await lock.acquire()
        await lock.release()
        assert lock.held is False


@virtual_test(timeout=60)
async def test_election_state_and_options() -> None:
    store = FaultInjectingStore(MemoryStore())
    election = Election(store, "E", config=CONFIG)
    assert election.is_leader is False
    with pytest.raises(NotLeaderError, match=r"^not the leader of 'E'$"):
        election.guard()
    me = await election.campaign("v")
    with pytest.raises(RuntimeError, match=r"^already campaigning in 'E'$"):
        await election.campaign("again")
    proclaimed = await election.proclaim("w")
    kv = await store.get(me.key)
    assert kv is not None
    assert proclaimed == Leader(me.key, b"w", me.term, kv.mod_revision)
    assert await election.leader() == proclaimed
    await election.resign()  # a private lease: revoking it deletes the key, no delete of its own
    assert store.calls["compare_and_delete"] == 0
    assert await store.get(me.key) is None
    assert election.is_leader is False
    assert repr(election) == "<Election 'E' not leading>"
    await election.resign()  # idempotent
    async with CONFIG.lease(store) as shared:
        on_shared = Election(store, "S", lease=shared)
        mine = await on_shared.campaign("v")
        kv = await store.get(mine.key)
        assert kv is not None
        assert kv.lease == shared.id
        await on_shared.resign()  # its own key goes; the shared lease stays
        assert await store.get(mine.key) is None
        assert not shared.lost
        await on_shared.resign()


@virtual_test(timeout=60)
async def test_campaign_and_acquire_timeouts() -> None:
    store = MemoryStore()
    leader = Election(store, "E", config=CONFIG)
    await leader.campaign("first")
    started = anyio.current_time()
    wanted = r"^timed out after 1\.0s campaigning in the election 'E'$"
    with pytest.raises(SyncTimeoutError, match=wanted):
        await Election(store, "E", config=CONFIG).campaign("second", timeout=1)
    assert anyio.current_time() - started == pytest.approx(1)
    holder = Lock(store, "L", config=CONFIG)
    await holder.acquire()
    started = anyio.current_time()
    with pytest.raises(SyncTimeoutError, match=r"^timed out after 2\.0s waiting for the lock"):
        await Lock(store, "L", config=CONFIG, timeout=2).acquire()
    assert anyio.current_time() - started == pytest.approx(2)
    await holder.release()
    await leader.resign()


@virtual_test(timeout=60)
async def test_a_contended_acquire_reads_the_queue_once_before_it_waits() -> None:
    # the read made with the queue put (and the one full read of a longer queue) is where the
    # wait starts: no second read of the queue before watching
    store = FaultInjectingStore(MemoryStore())
    holder = Lock(store, "L", config=CONFIG)
    await holder.acquire()
    candidate = Election(store, "E", config=CONFIG)
    await candidate.campaign("first")
    before = store.calls["range"]
    got: list[int] = []

    async def contend() -> None:
        lock = Lock(store, "L", config=CONFIG)
        got.append(await lock.acquire())
        await lock.release()
        second = Election(store, "E", config=CONFIG)
        got.append((await second.campaign("second")).term)
        await second.resign()

    async with anyio.create_task_group() as tg:
        tg.start_soon(contend)
        await anyio.sleep(1)
        assert store.calls["range"] - before == 1  # the full read of the two-entry queue
        await holder.release()
        await anyio.sleep(1)
        assert (
            store.calls["range"] - before == 3
        )  # again after the holder went; then the election's
        await candidate.resign()
    assert len(got) == 2


@virtual_test(timeout=60)
async def test_a_failed_queue_put_leaves_the_lock_free_to_try_again() -> None:
    store = FaultInjectingStore(MemoryStore())
    lock = Lock(store, "L", config=CONFIG)
    store.fail_next("txn", StoreConnectionError("injected"))
    with pytest.raises(StoreConnectionError):
        await lock.acquire()
    assert store.granted_leases == frozenset()  # its private lease was revoked
    await lock.acquire()
    await lock.release()


@virtual_test(timeout=60)
async def test_clean_up_runs_to_completion_in_a_cancelled_task() -> None:
    # the store answers after a delay, so an unshielded clean-up would be cut short
    store = FaultInjectingStore(MemoryStore())
    store.latency = 0.01
    async with CONFIG.lease(store) as shared:
        for lease in (None, shared):
            lock = Lock(store, "L", lease=lease, config=CONFIG)
            await lock.acquire()
            with anyio.CancelScope() as scope:
                scope.cancel()
                await lock.release()
            assert (await store.range("L/")).count == 0
            election = Election(store, "E", lease=lease, config=CONFIG)
            await election.campaign("v")
            with anyio.CancelScope() as scope:
                scope.cancel()
                await election.resign()
            assert (await store.range("E/")).count == 0
            with anyio.CancelScope() as scope:
                async with Lock(store, "A", lease=lease, config=CONFIG):
                    scope.cancel()  # the block ends cancelled: the release still completes
            assert (await store.range("A/")).count == 0
        # a queue put cancelled in flight: the private lease is revoked all the same
        store.hang("txn")
        lock = Lock(store, "H", config=CONFIG)
        with anyio.move_on_after(1):
            await lock.acquire()
        store.release()
        assert store.granted_leases == frozenset({shared.id})


@virtual_test(timeout=60)
async def test_the_lock_block_s_own_error_comes_out_as_it_was() -> None:
    store = MemoryStore()
    error = ValueError("boom")
    with pytest.raises(ValueError, match=r"^boom$") as info:
        async with Lock(store, "L", config=CONFIG):
            raise error
    assert info.value is error
    assert (await store.range("L/")).count == 0


@virtual_test(timeout=60)
async def test_a_barrier_timeout_count_is_bounded_and_shielded() -> None:
    # the count in a timeout's message is bounded (5 s) and shielded: a store that stopped
    # answering, and a caller cancelled meanwhile, still get the timeout, 5 s later at most
    store = FaultInjectingStore(MemoryStore())
    barrier = Barrier(store, "B", 2, config=LeaseConfig(ttl=60, renew_deadline=40))
    errors: list[BaseException] = []
    ended: list[float] = []

    async def wait(scope: anyio.CancelScope) -> None:
        with scope:
            try:
                await barrier.wait(timeout=1)
            except SyncTimeoutError as exc:
                errors.append(exc)
        ended.append(anyio.current_time())

    started = anyio.current_time()
    async with anyio.create_task_group() as tg:
        outer = anyio.CancelScope()
        tg.start_soon(wait, outer)
        await anyio.sleep(0.5)
        store.hang("range")
        await anyio.sleep(1.5)  # the timeout's count is under way
        outer.cancel()
        await anyio.sleep(20)  # (an unbounded count would end only now)
        store.release()
    assert ended[0] - started == pytest.approx(6, abs=0.01)
    assert [str(e) for e in errors] == [
        "timed out after 1.0s at the barrier 'B': an unknown number of 2 parties entered"
    ]


# -- the shared checks and JSON ------------------------------------------------------------------


@virtual_test(timeout=60)
async def test_primitive_arguments_are_named_in_their_errors() -> None:
    store = MemoryStore()
    with pytest.raises(TypeError, match=r"^name must be a str, got int$"):
        Lock(store, 5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^name must be a non-empty str not ending in '/', got"):
        Lock(store, "jobs/")
    with pytest.raises(TypeError, match=r"^config must be a LeaseConfig, got int$"):
        Lock(store, "L", config=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^lease must be a LeaseKeeper or None, got int$"):
        Lock(store, "L", lease=5)  # type: ignore[arg-type]


@virtual_test(timeout=60)
async def test_json_payloads_are_utf8_and_up_to_64_kib() -> None:
    store = MemoryStore()
    channel = EventChannel(store)
    await channel.publish("e", "é")
    kv = await store.get("events/e")
    assert kv is not None
    assert kv.value == '"é"'.encode()
    at_limit = "x" * (64 * 1024 - 2)  # with its quotes, exactly the limit
    await channel.publish("big", at_limit)
    with pytest.raises(ValueError, match=r"^the payload of event 'big' is 65537 bytes as JSON; "):
        await channel.publish("big", at_limit + "x")


@virtual_test(timeout=60)
async def test_closing_a_stream_from_another_task_ends_its_consumer() -> None:
    channel = EventChannel(MemoryStore())
    stream = channel.stream()
    got: list[str] = []

    async def consume() -> None:
        async with stream:
            async for event in stream:
                got.append(event.name)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await anyio.sleep(1)
            await channel.publish("a")
            await anyio.sleep(1)
            await stream.aclose()  # the consumer, waiting for the next event, stops
            await anyio.sleep(1)
            await channel.publish("after")
    assert got == ["a"]


@virtual_test(timeout=60)
async def test_a_wait_whose_first_read_fails_reads_again() -> None:
    engine = MemoryEngine()
    reader = FaultInjectingStore(MemoryStore(engine))
    running = await JobStateRecord(MemoryStore(engine)).set("running")
    reader.fail_next("range", StoreConnectionError("injected"))
    assert await JobStateRecord(reader).wait("running", timeout=5) == running
    assert reader.calls["range"] == 2


@virtual_test(timeout=60)
async def test_barrier_ready_record_and_entering_twice() -> None:
    store = MemoryStore()
    first = Barrier(store, "B", 2, config=CONFIG)
    async with anyio.create_task_group() as tg:
        tg.start_soon(first.wait)
        await Barrier(store, "B", 2, config=CONFIG).wait(timeout=5)
    ready = await store.get("B/ready")
    assert ready is not None
    assert json.loads(ready.value) == {"parties": 2, "present": 2}
    double = DoubleBarrier(store, "D", 1, config=CONFIG)
    await double.enter()
    with pytest.raises(RuntimeError, match=r"^already entered the barrier 'D'$"):
        await double.enter()
    await double.leave()


@virtual_test(timeout=60)
async def test_a_barrier_party_whose_key_went_in_a_compacted_gap_is_told_so() -> None:
    engine = MemoryEngine()
    waiter = FaultInjectingStore(MemoryStore(engine))
    admin = MemoryStore(engine)
    barrier = Barrier(waiter, "B", 2, config=CONFIG)
    errors: list[LeaseExpiredError] = []

    async def wait() -> None:
        try:
            await barrier.wait(timeout=30)
        except LeaseExpiredError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.sleep(1)
        (kv,) = (await admin.range("B/parties/")).kvs

        async def delete() -> None:
            await admin.delete(kv.key)

        await _cut_off_and_compact(waiter, admin, delete)
    assert [(e.lease_id, e.reason) for e in errors] == [
        (kv.lease, f"the barrier key {kv.key!r} was deleted")
    ]


def test_lease_config_says_why_renew_deadline_must_be_below_ttl() -> None:
    with pytest.raises(ConfigError) as info:
        LeaseConfig(ttl=10, renew_deadline=10)
    assert (info.value.key, info.value.value) == ("renew_deadline", 10.0)
    assert info.value.expected == (
        "less than ttl (10.0s): a holder must give up before the store can expire its lease "
        "and hand it to someone else"
    )


@virtual_test(timeout=60)
async def test_barrier_arguments_identity_and_clean_up() -> None:
    with pytest.raises(TypeError, match=r"^store must be a Store, got str$"):
        Barrier("memory://", "B", 2)  # type: ignore[arg-type]
    store = FaultInjectingStore(MemoryStore())
    with pytest.raises(TypeError, match=r"^parties must be an int, got str$"):
        Barrier(store, "B", "2")  # type: ignore[arg-type]
    barrier = Barrier(store, "B", 2, config=CONFIG)
    with anyio.move_on_after(1):
        async with anyio.create_task_group() as tg:
            tg.start_soon(barrier.wait)
            await anyio.sleep(0.5)
            (kv,) = (await store.range("B/parties/")).kvs
            assert kv.value == default_identity().encode()
    # the timed-out wait left through its private lease: revoked, no delete of its own
    assert (await store.range("B/parties/")).count == 0
    assert store.calls["compare_and_delete"] == 0
    # cancelled while the store answers slowly, on a shared lease: its key still goes
    store.latency = 0.01
    async with CONFIG.lease(store) as shared:
        with anyio.move_on_after(1):
            await Barrier(store, "C", 2, lease=shared).wait()
        assert (await store.range("C/parties/")).count == 0
        assert not shared.lost


@virtual_test(timeout=60)
async def test_a_barrier_waiter_opens_it_when_the_last_party_cannot() -> None:
    # the last party entered but cannot read (its store hangs): the first one counts both
    # and writes the ready key itself; its own failed write of it is written again
    engine = MemoryEngine()
    first_store, last_store = (FaultInjectingStore(MemoryStore(engine)) for _ in range(2))
    first = Barrier(first_store, "B", 2, config=CONFIG)
    last = Barrier(last_store, "B", 2, config=CONFIG)
    first_passed = anyio.Event()

    async def wait_first() -> None:
        await first.wait(timeout=30)
        first_passed.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_first)
        await anyio.sleep(1)
        last_store.hang("range")
        first_store.fail_next("compare_and_swap", StoreConnectionError("injected"))
        tg.start_soon(last.wait)
        with anyio.fail_after(5):
            await first_passed.wait()
        last_store.release()
    assert first.passed
    assert first_store.calls["compare_and_swap"] == 2


@virtual_test(timeout=60)
async def test_a_barrier_waiter_keeps_waiting_across_a_compacted_gap_and_a_lost_key() -> None:
    engine = MemoryEngine()
    waiter = FaultInjectingStore(MemoryStore(engine))
    admin = MemoryStore(engine)
    barrier = Barrier(waiter, "B", 2, config=CONFIG)
    errors: list[LeaseExpiredError] = []

    async def wait() -> None:
        try:
            await barrier.wait(timeout=30)
        except LeaseExpiredError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.sleep(1)
        await _cut_off_and_compact(waiter, admin, anyio.lowlevel.checkpoint)
        await anyio.sleep(3)  # read again: still one party, still waiting
        assert not barrier.passed
        assert errors == []
        (kv,) = (await admin.range("B/parties/")).kvs
        await admin.delete(kv.key)  # seen live
    assert [(e.lease_id, e.reason) for e in errors] == [
        (kv.lease, f"the barrier key {kv.key!r} was deleted")
    ]


@virtual_test(timeout=60)
async def test_a_barrier_waiter_counts_parties_from_their_puts_and_deletes() -> None:
    # the late parties cannot read (their store hangs), so the first one counts them
    engine = MemoryEngine()
    first_store, late_store = (FaultInjectingStore(MemoryStore(engine)) for _ in range(2))
    admin = MemoryStore(engine)
    first = Barrier(first_store, "B", 3, config=CONFIG)
    first_passed = anyio.Event()

    async def wait_first() -> None:
        await first.wait(timeout=30)
        first_passed.set()

    async def enter() -> None:
        await Barrier(late_store, "B", 3, config=CONFIG).wait(timeout=30)

    async def parties() -> list[KeyValue]:
        kvs = (await admin.range("B/parties/")).kvs
        return sorted(kvs, key=lambda kv: kv.create_revision)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_first)
        await anyio.sleep(1)
        late_store.hang("range")
        tg.start_soon(enter)  # a party that dies before the barrier opens
        await anyio.sleep(1)
        dead = (await parties())[1]
        await admin.delete(dead.key)
        tg.start_soon(enter)
        await anyio.sleep(1)
        assert not first_passed.is_set()  # two parties now, not three
        tg.start_soon(enter)
        with anyio.fail_after(5):
            await first_passed.wait()
        late_store.release()
        tg.cancel_scope.cancel()
    assert first.passed


def test_lease_config_errors_carry_the_value_and_the_jitter_rule() -> None:
    with pytest.raises(ConfigError) as info:
        LeaseConfig(ttl=-1.5)
    assert (info.value.key, info.value.value) == ("ttl", -1.5)
    assert info.value.expected == "a finite number of seconds > 0"
    with pytest.raises(ConfigError) as info:
        LeaseConfig(ttl=10, renew_deadline=2.4, retry_period=2)
    assert (info.value.key, info.value.value) == ("renew_deadline", 2.4)
    assert info.value.expected == (
        "more than 1.2 * retry_period (2.4s), so that a holder retries at least once before it "
        "gives up"
    )


@virtual_test(timeout=60)
async def test_a_lock_waiter_watches_the_entry_before_it_not_the_contenders_behind_it() -> None:
    # etcd's recipe: a waiter wakes when the one key ahead of it goes. Watching the whole queue
    # would hand every waiter each contender that queues behind it: N^2 events for N waiters.
    engine = MemoryEngine()
    store = MemoryStore(engine)
    holder = Lock(store, "L", config=CONFIG)
    await holder.acquire()
    tokens: list[int] = []

    async def contend() -> None:
        lock = Lock(store, "L", config=CONFIG)
        tokens.append(await lock.acquire())
        await lock.release()

    async with anyio.create_task_group() as tg:
        tg.start_soon(contend)
        await anyio.sleep(1)  # the first waiter watches the holder's key
        delivered = engine.work().events_delivered
        for _ in range(5):
            tg.start_soon(contend)
            await anyio.sleep(1)
        assert engine.work().events_delivered == delivered  # nobody woken by a newcomer
        await holder.release()
    assert tokens == sorted(tokens)
    assert len(tokens) == 6


# -- QueueEntry: a lost answer, a deleted key, the reads' sizes ---------------------------------


class _LosesTxnAnswers(MemoryStore):
    """The next transaction's answer is lost (``WriteOutcomeUnknownError``) after it was
    applied (``lose = "after"``) or before it reached the store (``lose = "before"``)."""

    lose: str | None = None

    async def _txn(self, txn: Txn) -> TxnResult:
        lose, self.lose = self.lose, None
        if lose == "before":
            raise WriteOutcomeUnknownError("injected: lost before applying")
        result = await super()._txn(txn)
        if lose == "after":
            raise WriteOutcomeUnknownError("injected: lost after applying")
        return result


@virtual_test(timeout=60)
async def test_a_lock_whose_queue_put_answer_was_lost_reads_back_whether_it_applied() -> None:
    store = _LosesTxnAnswers()
    lock = Lock(store, "L", config=CONFIG)
    store.lose = "after"  # applied: the key read back is ours, and the lock is held
    token = await lock.acquire()
    (kv,) = (await store.range("L/")).kvs
    assert (kv.create_revision, kv.lease) == (token, lock.lease.id)
    await lock.release()
    assert (await store.range("L/")).kvs == ()
    store.lose = "before"  # not applied: nothing to read back, the error stands
    with pytest.raises(WriteOutcomeUnknownError, match="lost before applying"):
        await Lock(store, "L", config=CONFIG).acquire()
    assert await Lock(store, "L", config=CONFIG, timeout=1).acquire() > token  # free


@virtual_test(timeout=60)
async def test_a_queue_entry_whose_key_was_deleted_says_so_with_its_lease() -> None:
    store = MemoryStore()
    leases = [(await store.lease_grant(60)).id for _ in range(3)]
    entries = [QueueEntry(store, "Q/", lease) for lease in leases]
    for entry in entries:
        await entry.create(b"")
    mine = entries[1]
    assert (await mine.position())[0] == entries[0].kv
    await store.delete(mine.key)
    wanted = rf"^lease {leases[1]:#x} lost: the queue key {re.escape(repr(mine.key))} was deleted$"
    with pytest.raises(LeaseExpiredError, match=wanted) as info:  # the full read of the queue
        await mine.position()
    assert info.value.lease_id == leases[1]
    await store.delete(entries[2].key)  # the one key left is another's: the short read says so
    with pytest.raises(LeaseExpiredError, match=wanted):
        await mine.position()


@virtual_test(timeout=60)
async def test_a_queue_put_and_a_position_read_the_head_alone_first_however_long_the_queue() -> (
    None
):
    engine = MemoryEngine()
    store = MemoryStore(engine)
    for _ in range(20):  # twenty entries ahead
        await QueueEntry(store, "Q/", (await store.lease_grant(60)).id).create(b"")
    entry = QueueEntry(store, "Q/", (await store.lease_grant(60)).id)
    scanned = engine.work().keys_scanned
    await entry.create(b"")
    assert engine.work().keys_scanned - scanned == 1  # the head, read with the put
    await entry.position()  # the read made with the put, then the whole queue
    scanned = engine.work().keys_scanned
    await entry.position()  # read afresh: the head (one key), then the whole queue (21)
    assert engine.work().keys_scanned - scanned == 1 + 21
    alone = QueueEntry(store, "R/", (await store.lease_grant(60)).id)
    await alone.create(b"")
    await alone.position()  # the read made with the put
    scanned = engine.work().keys_scanned
    assert await alone.position() == (None, await store.current_revision())
    assert engine.work().keys_scanned - scanned == 1


@virtual_test(timeout=60)
async def test_a_lock_waiter_keeps_waiting_after_its_watch_fell_behind_a_compaction() -> None:
    engine = MemoryEngine()
    admin = MemoryStore(engine)
    waiter_store = FaultInjectingStore(MemoryStore(engine))
    holder = Lock(admin, "L", config=CONFIG)
    await holder.acquire()
    got: list[int] = []

    async def wait() -> None:
        got.append(await Lock(waiter_store, "L", config=CONFIG).acquire())

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.sleep(1)

        async def nothing() -> None:
            pass

        await _cut_off_and_compact(waiter_store, admin, nothing)
        await anyio.sleep(3)  # the waiter read the queue again: the holder is still there
        assert got == []
        await holder.release()
    assert len(got) == 1


@virtual_test(timeout=60)
async def test_a_waiting_candidate_reads_nothing_when_the_leader_proclaims() -> None:
    store = FaultInjectingStore(MemoryStore())
    leader = Election(store, "E", config=CONFIG)
    await leader.campaign("first")
    terms: list[int] = []

    async def campaign() -> None:
        second = Election(store, "E", config=CONFIG)
        terms.append((await second.campaign("second")).term)
        await second.resign()

    async with anyio.create_task_group() as tg:
        tg.start_soon(campaign)
        await anyio.sleep(1)
        ranges = store.calls["range"]
        for value in ("a", "b", "c"):
            await leader.proclaim(value)  # a PUT of the key the candidate waits on
        await anyio.sleep(1)
        assert store.calls["range"] == ranges
        await leader.resign()
    assert len(terms) == 1


# -- ResumingWatch: breaks, ends and replays -------------------------------------------------------


@virtual_test(timeout=60)
async def test_a_resuming_watch_rides_out_a_break_mid_revision_without_loss_or_repeats() -> None:
    engine = MemoryEngine()
    watcher = FaultInjectingStore(MemoryStore(engine))
    admin = MemoryStore(engine)
    async with ResumingWatch(watcher, "k/", "a test watch") as watch:
        await watch.open(None)
        await admin.txn(success=[Put("k/a", b"1"), Put("k/b", b"1")])  # one revision, two events
        first, second = await watch.next(), await watch.next()
        assert first is not None
        assert second is not None
        assert (first.kv.key, second.kv.key) == ("k/a", "k/b")
        watcher.drop_watches()  # the stream breaks: it is watched again from that revision
        watcher.fail_next("watch", StoreConnectionError("injected"))  # and once more
        await admin.put("k/c", b"1")
        third = await watch.next()  # k/a and k/b again, skipped: delivered already
        assert third is not None
        assert (third.kv.key, third.revision) == ("k/c", second.revision + 1)
        assert watch._watch is not None
        await watch._watch.aclose()  # the stream ends underneath (a server going away)
        await admin.put("k/d", b"1")
        fourth = await watch.next()
        assert fourth is not None
        assert fourth.kv.key == "k/d"


class _ScriptedWatch(Watch):
    """A memory watch whose stream fails on request, and whose closing takes a round trip (as
    an http watch's unwatch does)."""

    def __init__(self, store: _ScriptedStore, inner: Watch) -> None:
        super().__init__(inner.prefix, inner.requested_revision)
        self._store = store
        self._inner = inner

    @property
    def start_revision(self) -> int:
        return self._inner.start_revision

    async def _start(self) -> None:
        await self._inner.start()
        self._store.open_watches += 1

    async def _next(self) -> WatchEvent:
        error, self._store.stream_error = self._store.stream_error, None
        if error is not None:
            raise error
        return await self._inner.__anext__()

    async def _aclose(self) -> None:
        await anyio.sleep(0.01)
        await self._inner.aclose()
        self._store.open_watches -= 1


class _ScriptedStore(MemoryStore):
    stream_error: BaseException | None = None  # what the next read of a stream raises
    open_watches = 0

    def _watch(self, prefix: str, start_revision: int | None) -> Watch:
        return _ScriptedWatch(self, super()._watch(prefix, start_revision))


@virtual_test(timeout=60)
async def test_parameter_watch_replaying_its_past_fails_if_a_compaction_overtakes_its_stream() -> (
    None
):
    # as above, but connected: the compaction fails the stream itself (not the watch opened
    # again after a break)
    engine = MemoryEngine()
    writer = Parameters(MemoryStore(engine))
    reader = _ScriptedStore(engine)
    first = await writer.set("a", 1)
    await writer.set("b", 2)
    await writer.set("c", 3)
    async with Parameters(reader).watch(start_revision=first) as changes:
        with anyio.fail_after(10):
            assert (await changes.__anext__()).name == "a"
            now = await writer.store.current_revision()
            await writer.store.compact(now)
            reader.stream_error = CompactedError(first + 1, now)
            with pytest.raises(CompactedError):
                await changes.__anext__()


@virtual_test(timeout=60)
async def test_a_lock_wait_that_times_out_closes_its_watch_on_the_store() -> None:
    # closing a watch takes a round trip on a remote store: cut short by the timed-out wait's
    # cancellation, it would leave the watch open on the server
    store = _ScriptedStore()
    holder = Lock(store, "L", config=CONFIG)
    await holder.acquire()
    with pytest.raises(SyncTimeoutError):
        await Lock(store, "L", config=CONFIG, timeout=1).acquire()
    assert store.open_watches == 0
    await holder.release()


@virtual_test(timeout=60)
async def test_a_campaign_on_a_shared_lease_whose_queue_put_failed_raises_that_failure() -> None:
    # the failed put left no key: the clean-up has nothing to delete, and the caller sees the
    # store's error, not one of the clean-up's
    store = FaultInjectingStore(MemoryStore())
    async with CONFIG.lease(store) as shared:
        election = Election(store, "E", lease=shared)
        store.fail_next("txn", StoreConnectionError("injected"))
        with pytest.raises(StoreConnectionError, match="injected"):
            await election.campaign("me")
        assert store.calls["compare_and_delete"] == 0
        assert (await election.campaign("me")).term > 0
        await election.resign()


@virtual_test(timeout=60)
async def test_a_queue_put_never_overwrites_a_key_that_exists() -> None:
    # keys are unique by lease and a per-process number: two processes queueing on one shared
    # lease could still meet; the put is refused rather than taking the other's place
    store = MemoryStore()
    lease = (await store.lease_grant(60)).id
    first = QueueEntry(store, "Q/", lease)
    kv = await first.create(b"first")
    second = QueueEntry(store, "Q/", lease)
    second.key = first.key
    wanted = rf"^queue key {re.escape(repr(first.key))} already exists$"
    with pytest.raises(RuntimeError, match=wanted):
        await second.create(b"second")
    assert await store.get(first.key) == kv
