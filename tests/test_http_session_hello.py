"""The hub's side of a hello (``store/http/_session_server.py``: ``SessionHub.greet``, resume,
adoption, the end of a session) over a recording sender, no socket: the welcome's every field,
the version and progress interval chosen, each refusal's code and words, a resume that replaces
the connection it finds, and the leases a session owns, adopts and revokes. The same over real
sockets: ``tests/test_http_session.py`` and ``tests/test_http_session_raw.py``."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest
from helpers.session_conn import Recorder, make_hub, message_body

from aioelastic.store.http._frames import ERROR, REQUEST, RESULT, WATCH_END, pack, unpack_all
from aioelastic.store.http._session_conn import Connection
from aioelastic.store.http._session_server import SessionHub
from aioelastic.store.memory import MemoryEngine


def _hello(hub: SessionHub, **fields: Any) -> tuple[Connection | None, Recorder]:
    recorder = Recorder()
    body = pack([REQUEST, 0, "hello", {"versions": [1], **fields}])
    return hub.greet(recorder, body), recorder


def _welcome(recorder: Recorder) -> dict[str, Any]:
    (frame,) = recorder.frames(0)
    assert frame[:2] == [RESULT, 0]
    welcome: dict[str, Any] = frame[2]
    return welcome


def _refusal(recorder: Recorder) -> list[Any]:
    assert recorder.writes == []
    assert recorder.closed is not None
    code, error, abort = recorder.closed
    assert not abort
    (frame,) = unpack_all(error, max_len=1 << 20)
    assert frame[:3] == [ERROR, 0, code]
    return list(frame)


def _hub(grace: float = 0.25, **options: Any) -> SessionHub:
    """A hub over a new engine with small bounds (``options``: max_watches, other_watches)."""
    options.setdefault("max_watches", 10)
    return SessionHub(
        MemoryEngine(), grace=grace, max_key_bytes=100, max_value_bytes=1000, **options
    )


def _greeted(hub: SessionHub, **fields: Any) -> tuple[Connection, Recorder]:
    connection, recorder = _hello(hub, **fields)
    assert connection is not None
    return connection, recorder


def _owned_lease(hub: SessionHub, connection: Connection) -> int:
    """A new lease of ``connection``'s session (as its lease_grant makes one)."""
    lease = hub.engine.lease_grant(30.0).id
    hub.own_lease(connection.state, lease)
    return lease


@pytest.mark.asyncio
async def test_the_welcome_says_the_session_its_token_grace_bound_and_leases() -> None:
    hub = make_hub(MemoryEngine())
    connection, recorder = _hello(hub)
    assert connection is not None
    welcome = _welcome(recorder)
    state = connection.state
    assert welcome == {
        "version": 1,
        "session": state.id,
        "resume": state.resume_token,
        "resumed": False,
        "grace": hub.grace,
        "max_message": 4 * (100_000 + 100) + 1024 * 1024,  # four maximal values and keys, 1 MiB
        "leases": [],
    }
    assert hub.max_message_bytes == welcome["max_message"]
    assert len(state.id) == 16  # 8 random bytes, in hex
    assert len(state.resume_token) == 32  # 24 random bytes (192 bits), base64url
    assert hub.session_count == 1
    assert state.connection is connection


@pytest.mark.parametrize(
    ("offered", "version"), [([1], 1), ([2], 2), ([1, 2], 2), ([2, 1, 99], 2), ([0, 1], 1)]
)
@pytest.mark.asyncio
async def test_the_connection_speaks_the_highest_version_both_sides_know(
    offered: list[int], version: int
) -> None:
    connection, recorder = _hello(make_hub(MemoryEngine()), versions=offered)
    assert connection is not None
    assert connection.version == version
    assert _welcome(recorder)["version"] == version


@pytest.mark.parametrize("offered", [[], [0, 3], "1", None])
@pytest.mark.asyncio
async def test_no_common_version_is_refused_with_the_versions_of_both_sides(offered: Any) -> None:
    hub = make_hub(MemoryEngine())
    connection, recorder = _hello(hub, versions=offered)
    assert connection is None
    frame = _refusal(recorder)
    assert frame[2] == "unsupported_version"
    assert frame[3] == (
        f"this server speaks session protocol versions [1, 2], the client offered {offered!r}"
    )
    assert frame[4] == {"supported": [1, 2]}
    assert hub.session_count == 0


@pytest.mark.parametrize(
    ("given", "interval"), [(None, 5.0), (1.5, 1.5), (0.001, 0.05), (10_000, 300.0)]
)
@pytest.mark.asyncio
async def test_the_progress_interval_is_the_hellos_within_50ms_and_300s(
    given: float | None, interval: float
) -> None:
    fields = {} if given is None else {"progress_interval": given}
    connection, _ = _hello(make_hub(MemoryEngine()), **fields)
    assert connection is not None
    assert connection.progress_interval == interval


@pytest.mark.parametrize("given", [0, -1, "5", True, float("inf")])
@pytest.mark.asyncio
async def test_a_progress_interval_that_is_not_seconds_is_a_bad_hello(given: Any) -> None:
    connection, recorder = _hello(make_hub(MemoryEngine()), progress_interval=given)
    assert connection is None
    frame = _refusal(recorder)
    assert frame[2] == "bad_hello"
    assert frame[3].startswith("progress_interval must be a")


@pytest.mark.parametrize(
    "body",
    [
        pack([REQUEST, 0, "get", {}]),
        pack([REQUEST, 1, "hello", {}]),
        pack([RESULT, 0, "hello", {}]),
        pack([REQUEST, 0, "hello", []]),
        pack([REQUEST, 0, "hello"]),
        msgpack.packb("hello"),
        b"\xc1",
        message_body([REQUEST, 0, "hello", {"versions": [1], "pad": "x" * (64 * 1024 + 1)}]),
    ],
    ids=["op", "id", "kind", "fields", "short", "not-a-frame", "not-msgpack", "over-64KiB"],
)
@pytest.mark.asyncio
async def test_a_first_message_that_is_not_a_hello_frame_is_a_bad_hello(body: bytes) -> None:
    hub = make_hub(MemoryEngine())
    recorder = Recorder()
    assert hub.greet(recorder, body) is None
    frame = _refusal(recorder)
    assert frame[2] == "bad_hello"
    assert frame[3].startswith("not a hello frame: ")
    assert len(frame[3]) <= 300
    assert hub.session_count == 0


@pytest.mark.asyncio
async def test_a_resume_is_the_same_session_and_replaces_the_connection_it_finds() -> None:
    hub = make_hub(MemoryEngine())
    first, first_recorder = _hello(hub)
    assert first is not None
    lease = hub.engine.lease_grant(30.0).id
    hub.own_lease(first.state, lease)
    token = first.state.resume_token
    second, recorder = _hello(hub, resume=token)
    assert second is not None
    assert second.state is first.state
    welcome = _welcome(recorder)
    assert welcome["resumed"] is True
    assert welcome["resume"] == token
    assert welcome["session"] == first.state.id
    assert welcome["leases"] == [lease]
    assert first_recorder.closed is not None
    assert first_recorder.closed[0] == "replaced"
    assert hub.session_count == 1
    assert first.state.connection is second
    assert hub.engine.has_lease(lease)  # no grace ran: nothing revoked
    hub.detach(first)  # its transport's end, later: already detached, harmless
    assert hub.session_count == 1
    assert first.state.connection is second


@pytest.mark.parametrize("token", ["unknown", 42, None, ["a", "list"]])
@pytest.mark.asyncio
async def test_a_resume_token_the_hub_does_not_know_is_a_new_session(token: Any) -> None:
    hub = make_hub(MemoryEngine())
    old, _ = _hello(hub)
    assert old is not None
    connection, recorder = _hello(hub, resume=token)
    assert connection is not None
    assert connection.state is not old.state
    assert _welcome(recorder)["resumed"] is False


@pytest.mark.asyncio
async def test_a_new_session_adopts_only_live_leases_no_session_owns() -> None:
    hub = make_hub(MemoryEngine())
    engine = hub.engine
    owner, _ = _hello(hub)
    assert owner is not None
    owned = engine.lease_grant(30.0).id
    hub.own_lease(owner.state, owned)
    free = engine.lease_grant(30.0).id
    gone = engine.lease_grant(30.0).id
    engine.lease_revoke(gone)
    claimed = [owned, free, gone, "x", 2.5, 2**64 - 1]
    connection, recorder = _hello(hub, leases=claimed)
    assert connection is not None
    assert _welcome(recorder)["leases"] == [free]
    assert connection.state.leases == {free}


@pytest.mark.asyncio
async def test_leases_claimed_not_as_a_list_are_ignored() -> None:
    hub = make_hub(MemoryEngine())
    lease = hub.engine.lease_grant(30.0).id
    connection, recorder = _hello(hub, leases={"id": lease})
    assert connection is not None
    assert _welcome(recorder)["leases"] == []


@pytest.mark.asyncio
async def test_an_ended_lease_is_forgotten_by_its_session() -> None:
    hub = make_hub(MemoryEngine())
    connection, _ = _hello(hub)
    assert connection is not None
    kept, ended = (hub.engine.lease_grant(30.0).id for _ in range(2))
    hub.own_lease(connection.state, kept)
    hub.own_lease(connection.state, ended)
    hub.engine.lease_revoke(ended)
    assert connection.state.leases == {kept}
    other, recorder = _hello(hub, leases=[ended, kept])
    assert other is not None
    assert _welcome(recorder)["leases"] == []  # kept is owned; ended is gone


@pytest.mark.asyncio
async def test_grace_zero_revokes_a_detached_sessions_leases_at_once() -> None:
    hub = _hub(grace=0)
    connection, _ = _greeted(hub)
    leases = [_owned_lease(hub, connection) for _ in range(3)]
    token = connection.state.resume_token
    hub.detach(connection)
    assert not any(hub.engine.has_lease(lease) for lease in leases)
    assert connection.state.leases == set()
    assert hub.session_count == 0
    resumed, recorder = _hello(hub, resume=token)  # the session is gone: a new one
    assert resumed is not None
    assert _welcome(recorder)["resumed"] is False


@pytest.mark.asyncio
async def test_a_shutdown_keeps_the_leases_and_refuses_new_detaches_nothing() -> None:
    hub = _hub(grace=0)
    connection, recorder = _greeted(hub)
    lease = _owned_lease(hub, connection)
    connection.received([message_body([REQUEST, 3, "watch", ["p/", None, False]])])
    recorder.writes.clear()
    hub.shutdown()
    # the watch's end, then the connection's, both saying why
    assert recorder.frames(0) == [[WATCH_END, 3, "closing", "the server is shutting down", {}]]
    assert recorder.closed is not None
    code, error, _ = recorder.closed
    assert code == "unavailable"
    assert list(unpack_all(error, max_len=1 << 20)) == [
        [ERROR, 0, "unavailable", "the server is shutting down", {}]
    ]
    assert hub.closing
    hub.detach(connection)
    assert hub.engine.has_lease(lease)  # to its TTL
    assert hub._on_lease not in hub.engine.on_lease
    hub.shutdown()  # (twice: the engine's listener is already gone)


@pytest.mark.parametrize("grace", [-1, True, "1", 1e6, float("nan")])
def test_a_grace_that_is_not_seconds_is_refused_at_once(grace: Any) -> None:
    with pytest.raises(ValueError, match="session grace must be a number of seconds >= 0"):
        SessionHub(MemoryEngine(), grace=grace, max_key_bytes=1, max_value_bytes=1, max_watches=1)


@pytest.mark.asyncio
async def test_a_string_of_64_kib_is_read_and_the_first_frame_must_be_a_hello() -> None:
    hub = make_hub(MemoryEngine())
    connection, _ = _hello(hub, pad="x" * (64 * 1024))
    assert connection is not None
    recorder = Recorder()
    assert hub.greet(recorder, pack([REQUEST, 0, "get", {}])) is None
    assert _refusal(recorder)[3] == (
        "not a hello frame: the first frame must be [0, 0, 'hello', {...}]"
    )


@pytest.mark.asyncio
async def test_a_hello_adopts_from_its_first_100_000_lease_ids_only() -> None:
    hub = make_hub(MemoryEngine())
    lease = hub.engine.lease_grant(30.0).id
    claimed = [0] * 100_000 + [lease]
    connection, recorder = _hello(hub, leases=claimed)
    assert connection is not None
    assert _welcome(recorder)["leases"] == []
    connection, recorder = _hello(hub, leases=claimed[1:])
    assert connection is not None
    assert _welcome(recorder)["leases"] == [lease]


@pytest.mark.asyncio
async def test_the_hubs_watch_limit_counts_the_other_watches_only_when_told() -> None:
    alone = _hub(max_watches=2)
    connection, recorder = _hello(alone)
    assert connection is not None
    connection.received(
        [message_body(*([REQUEST, i, "watch", ["p/", None, False]] for i in (1, 2)))]
    )
    assert [frame[0] for frame in recorder.frames(1)] == [RESULT, RESULT]
    shared = _hub(max_watches=2, other_watches=lambda: 1)  # (a REST watch stream)
    connection, recorder = _hello(shared)
    assert connection is not None
    connection.received(
        [message_body(*([REQUEST, i, "watch", ["p/", None, False]] for i in (1, 2)))]
    )
    assert [frame[2] if frame[0] == ERROR else frame[0] for frame in recorder.frames(1)] == [
        RESULT,
        "too_many_watches",
    ]


@pytest.mark.asyncio
async def test_a_session_resumed_twice_in_a_row_is_the_same_session() -> None:
    hub = _hub(grace=30.0)
    first, _ = _hello(hub)
    assert first is not None
    token = first.state.resume_token
    hub.detach(first)  # the grace starts
    assert first.state.revoke_timer is not None
    second, _ = _hello(hub, resume=token)  # back within the grace: the revocation is off
    assert second is not None
    assert second.state.revoke_timer is None
    third, recorder = _hello(hub, resume=token)  # again, before the server saw the second end
    assert third is not None
    assert _welcome(recorder)["resumed"] is True
    assert third.state is first.state
    assert hub.session_count == 1


@pytest.mark.asyncio
async def test_a_shutdown_during_the_grace_keeps_the_leases() -> None:
    hub = _hub(grace=0.02)
    connection, _ = _greeted(hub)
    lease = _owned_lease(hub, connection)
    hub.detach(connection)
    hub.shutdown()
    await asyncio.sleep(0.1)  # past the grace
    assert hub.engine.has_lease(lease)


@pytest.mark.asyncio
async def test_the_end_of_a_session_revokes_its_leases_past_one_gone_or_a_closed_store() -> None:
    hub = _hub(grace=0)
    connection, _ = _greeted(hub)
    leases = [_owned_lease(hub, connection) for _ in range(2)]
    hub.own_lease(connection.state, max(leases) + 1)  # (an id the engine does not have)
    hub.detach(connection)
    assert not any(hub.engine.has_lease(lease) for lease in leases)
    closed = _hub(grace=0)
    connection, _ = _greeted(closed)
    _owned_lease(closed, connection)
    closed.engine.close()
    closed.detach(connection)  # (the store closed first: nothing to revoke, no error)
    assert connection.state.leases == set()
