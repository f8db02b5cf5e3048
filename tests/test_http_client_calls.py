"""Each call of the http store, one by one, against a fake session server (``helpers.
fake_session``): the name (and key) an error gives it, and whether it is a read, sent again
after a lost connection, or a write, sent once and then of unknown outcome; the types its answer
is converted to; the token file and the TLS context the options make."""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.fake_session import Peer, fake_session_server

from aioelastic.errors import WriteOutcomeUnknownError
from aioelastic.store import Delete, Get, Put, Range, open_store
from aioelastic.store.http import HttpStore
from aioelastic.store.http._frames import ERROR, RESULT
from aioelastic.store.http.client import _ssl_context, read_token_file

Call = Callable[[Any], Awaitable[Any]]

#: (the op on the wire, how an error names the call, the call, a write)
CALLS: list[tuple[str, str, Call, bool]] = [
    ("get", "get 'k'", lambda s: s.get("k"), False),
    ("range", "range 'p/'", lambda s: s.range("p/"), False),
    ("revision", "revision", lambda s: s.current_revision(), False),
    ("lease_keep_alive", "lease_keep_alive", lambda s: s.lease_keep_alive(5), False),
    ("lease_ttl", "lease_time_to_live", lambda s: s.lease_time_to_live(5), False),
    ("txn", "txn", lambda s: s.txn(success=[Get("k"), Range("p/")]), False),
    ("put", "put 'k'", lambda s: s.put("k", b"v"), True),
    ("delete", "delete 'k'", lambda s: s.delete("k"), True),
    ("cas", "compare_and_swap 'k'", lambda s: s.compare_and_swap("k", 0, b"v"), True),
    ("cad", "compare_and_delete 'k'", lambda s: s.compare_and_delete("k", 3), True),
    ("add", "add 'k'", lambda s: s.add("k", 2), True),
    ("compact", "compact", lambda s: s.compact(3), True),
    ("lease_grant", "lease_grant", lambda s: s.lease_grant(5), True),
    ("lease_revoke", "lease_revoke", lambda s: s.lease_revoke(5), True),
    ("txn", "txn", lambda s: s.txn(success=[Get("k")], failure=[Put("k", b"v")]), True),
    ("txn", "txn", lambda s: s.txn(success=[Delete("k")]), True),
]
IDS = [f"{what}{'(write)' if write else ''}" for _, what, _, write in CALLS]


async def _refuse(peer: Peer, frame: list[Any]) -> None:
    peer.send([ERROR, frame[1], "bad_request", "nope", {}])


@pytest.mark.parametrize(("op", "what", "call", "write"), CALLS, ids=IDS)
@pytest.mark.asyncio
async def test_an_error_names_the_call_and_its_key(
    op: str, what: str, call: Call, write: bool
) -> None:
    async with fake_session_server(_refuse) as (url, seen), open_store(url) as store:
        with pytest.raises(ValueError, match=f"^{what}: nope$"):
            await call(store)
    assert seen.ops == [op]


@pytest.mark.parametrize(("op", "what", "call", "write"), CALLS, ids=IDS)
@pytest.mark.asyncio
async def test_a_read_is_sent_again_after_a_lost_connection_and_a_write_is_not(
    op: str, what: str, call: Call, write: bool
) -> None:
    """The server hangs up at the call's first request: a read is sent again on a new
    connection (and gets its answer, here a refusal); a write's outcome is unknown, sent once."""
    hung_up: list[int] = []

    async def hang_up_once(peer: Peer, frame: list[Any]) -> str | None:
        if not hung_up:
            hung_up.append(frame[1])
            return "hang up"
        await _refuse(peer, frame)
        return None

    async with fake_session_server(hang_up_once) as (url, seen), open_store(url) as store:
        if write:
            with pytest.raises(WriteOutcomeUnknownError, match=f"^{what}"):
                await call(store)
            assert seen.ops == [op]
        else:
            with pytest.raises(ValueError, match=f"^{what}: nope$"):
                await call(store)
            assert seen.ops == [op, op]
            assert seen.connections == 2


@pytest.mark.asyncio
async def test_a_keep_alive_s_ttl_is_a_float_and_a_grant_s_lease_is_claimed() -> None:
    """The TTL comes back a float whatever the wire carried (an int here); a granted lease is
    the session's, and a revoked one is no longer."""

    async def answer(peer: Peer, frame: list[Any]) -> None:
        values = {"lease_keep_alive": 5, "lease_grant": [9, 5], "lease_revoke": None}
        peer.send([RESULT, frame[1], values[frame[2]]])

    async with fake_session_server(answer) as (url, _), open_store(url) as store:
        ttl = await store.lease_keep_alive(9)
        assert type(ttl) is float
        assert ttl == 5.0
        assert isinstance(store, HttpStore)
        grant = await store.lease_grant(5)
        assert grant.id == 9
        assert type(grant.ttl) is float
        assert store.session.leases == {9}
        await store.lease_revoke(9)
        assert store.session.leases == set()


@pytest.mark.asyncio
async def test_a_malformed_txn_answer_says_so() -> None:
    async def answer(peer: Peer, frame: list[Any]) -> None:
        peer.send([RESULT, frame[1], {"not": "a txn result"}])

    async with fake_session_server(answer) as (url, _), open_store(url) as store:
        with pytest.raises(ConnectionError, match=r"^txn: malformed answer \("):
            await store.txn(success=[Get("k")])


def test_a_token_file_is_read_whitespace_stripped_and_refused_when_empty_or_unreadable(
    tmp_path: Path,
) -> None:
    path = tmp_path / "token"
    path.write_text("  s3cret\n")
    assert read_token_file(path) == "s3cret"
    path.write_text(" \n")
    with pytest.raises(ValueError, match=f"^token file {str(path)!r} is empty$"):
        read_token_file(path)
    missing = tmp_path / "missing"
    with pytest.raises(ValueError, match=f"^token file {str(missing)!r} cannot be read: "):
        read_token_file(missing)


def test_ssl_true_verifies_and_ssl_false_checks_nothing() -> None:
    verifying = _ssl_context(True)
    assert verifying.check_hostname is True
    assert verifying.verify_mode == ssl.CERT_REQUIRED
    lax = _ssl_context(False)
    assert lax.check_hostname is False
    assert lax.verify_mode == ssl.CERT_NONE
    given = ssl.create_default_context()
    assert _ssl_context(given) is given


# -- the URL, the options and where the token comes from ------------------------------------------


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://user@127.0.0.1:1", "http store URL must not carry credentials; pass token= or "),
        ("http://:pw@127.0.0.1:1", "http store URL must not carry credentials; pass token= or "),
        ("http://:1", "http store URL must name a host, got 'http://:1'"),
        ("http://127.0.0.1:1?timeout=3", "http store URL takes no query or fragment"),
    ],
)
@pytest.mark.asyncio
async def test_a_url_the_store_would_misread_is_refused(url: str, words: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(words)):
        await open_store(url)


@pytest.mark.asyncio
async def test_an_unknown_option_is_refused_naming_every_known_one() -> None:
    with pytest.raises(TypeError) as refused:
        await open_store("http://127.0.0.1:1", tiemout=3)
    known = sorted(
        {"token", "ssl", "timeout", "connect_timeout", "read_retries", "progress_interval"}
        | {"reconnect_timeout", "max_connections", "token_file", "cafile", "verify"}
    )
    assert (
        str(refused.value) == f"unknown option(s) for the http store: ['tiemout'] (known: {known})"
    )


async def _authorization(url_options: dict[str, Any]) -> str | None:
    """The ``Authorization`` header a store opened with these options sends."""

    async def revision(peer: Peer, frame: list[Any]) -> None:
        peer.send([RESULT, frame[1], 1])

    async with fake_session_server(revision) as (url, seen):
        async with open_store(url, **url_options) as store:
            await store.current_revision()
        return seen.headers[0].get("authorization")


@pytest.mark.asyncio
async def test_the_token_comes_from_the_option_its_file_or_the_environment_in_that_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AIOELASTIC_TOKEN", raising=False)
    monkeypatch.delenv("AIOELASTIC_TOKEN_FILE", raising=False)
    given, in_env_file = tmp_path / "given", tmp_path / "env"
    given.write_text("from-token-file\n")
    in_env_file.write_text("from-env-file\n")
    assert await _authorization({}) is None
    assert await _authorization({"token": "t"}) == "Bearer t"
    assert await _authorization({"token_file": str(given)}) == "Bearer from-token-file"
    with pytest.raises(ValueError, match=r"^give token or token_file, not both$"):
        await _authorization({"token": "t", "token_file": str(given)})
    assert await _authorization({"token": None, "token_file": str(given)}) == (
        "Bearer from-token-file"
    )
    monkeypatch.setenv("AIOELASTIC_TOKEN_FILE", str(in_env_file))
    assert await _authorization({}) == "Bearer from-env-file"  # what an agent gives its workers
    assert await _authorization({"token": "t"}) == "Bearer t"
    assert await _authorization({"token_file": str(given)}) == "Bearer from-token-file"
    monkeypatch.setenv("AIOELASTIC_TOKEN", "from-env")
    assert await _authorization({}) == "Bearer from-env"  # the variable before the file's


# -- the options' defaults, refusals and TLS -------------------------------------------------------


def test_the_options_defaults() -> None:
    store = HttpStore("http://127.0.0.1:1")
    session = store.session
    assert (session.request_timeout, session.dialer.connect_timeout) == (30.0, 5.0)
    assert (session.read_retries, session.progress_interval) == (2, 2.0)
    assert (session.reconnect_timeout, store.reconnect_timeout) == (10.0, 10.0)
    assert session._limit is not None
    assert session._limit.free == 100
    assert session.dialer._ssl is None  # (http://: no TLS)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"timeout": 0}, "timeout must be a number of seconds > 0, got 0"),
        ({"connect_timeout": -1}, "connect_timeout must be a number of seconds > 0, got -1"),
        (
            {"progress_interval": True},
            "progress_interval must be a number of seconds > 0, got True",
        ),
        ({"reconnect_timeout": "5"}, "reconnect_timeout must be a number of seconds > 0, got '5'"),
        ({"progress_interval": 0.01}, "progress_interval must be in [0.05, 300] s, got 0.01"),
        ({"read_retries": -1}, "read_retries must be an int >= 0, got -1"),
        ({"max_connections": -1}, "max_connections must be an int >= 0 (0: no limit), got -1"),
    ],
)
def test_a_bad_option_is_refused_naming_it(options: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(words) + "$"):
        HttpStore("http://127.0.0.1:1", **options)


def test_a_url_that_is_not_http_is_refused() -> None:
    for url in ("ftp://127.0.0.1:1", "http://"):
        words = f"url must be http://host:port or https://host:port, got {url!r}"
        with pytest.raises(ValueError, match="^" + re.escape(words) + "$"):
            HttpStore(url)


@pytest.mark.asyncio
async def test_cafile_and_verify_make_the_tls_context(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    from helpers.http import self_signed_cert

    with self_signed_cert(tmp_path) as (cert, _):
        store = await open_store("https://127.0.0.1:1", cafile=str(cert))
        context = store.session.dialer._ssl  # type: ignore[attr-defined]
        assert isinstance(context, ssl.SSLContext)
        assert context.verify_mode == ssl.CERT_REQUIRED
        assert len(context.get_ca_certs()) == 1  # the file's, not the system's
        await store.aclose()
    lax = await open_store("https://127.0.0.1:1", verify=False)
    assert lax.session.dialer._ssl.verify_mode == ssl.CERT_NONE  # type: ignore[attr-defined]
    await lax.aclose()
    given = ssl.create_default_context()
    chosen = await open_store("https://127.0.0.1:1", ssl=given, verify=False)
    assert chosen.session.dialer._ssl is given  # type: ignore[attr-defined]
    await chosen.aclose()
    missing = tmp_path / "missing.pem"
    with pytest.raises(
        ValueError, match=f"^cafile {re.escape(repr(str(missing)))} cannot be loaded: "
    ):
        await open_store("https://127.0.0.1:1", cafile=str(missing))
    for option in ({"verify": False}, {"cafile": str(missing)}):
        with pytest.raises(ValueError, match=r"^cafile and verify apply to https:// URLs only$"):
            await open_store("http://127.0.0.1:1", **option)


@pytest.mark.asyncio
async def test_callers_woken_by_one_message_send_their_next_requests_in_one_write() -> None:
    """Three answers in one message wake three callers; the requests they make at once go to
    the server in one message, not three (a wake-up and a write saved per caller)."""
    held: list[tuple[Peer, int]] = []
    first = [True]

    async def answer(peer: Peer, frame: list[Any]) -> None:
        held.append((peer, frame[1]))
        if first or len(held) == 3:  # (the first request alone, then three at a time)
            first.clear()
            peer.send(*([RESULT, rid, 1] for _, rid in held))
            held.clear()

    async def twice(store: Any) -> None:
        await store.current_revision()
        await store.current_revision()

    async with fake_session_server(answer) as (url, seen), open_store(url) as store:
        await store.current_revision()  # (connected, answered alone)
        await asyncio.wait_for(asyncio.gather(*(twice(store) for _ in range(3))), 10)
    assert seen.messages[-1] == 3  # the second round: one message of three requests


def test_the_bounds_of_the_options_and_the_url_kept() -> None:
    for interval in (0.05, 300):
        assert HttpStore("http://127.0.0.1:1", progress_interval=interval).progress_interval == (
            interval
        )
    with pytest.raises(
        ValueError, match=r"^progress_interval must be in \[0\.05, 300\] s, got 300\.5$"
    ):
        HttpStore("http://127.0.0.1:1", progress_interval=300.5)
    for option in ("read_retries", "max_connections"):
        for bad in (True, "2"):
            options: dict[str, Any] = {option: bad}
            with pytest.raises(ValueError, match=f"^{option} must be an int >= 0"):
                HttpStore("http://127.0.0.1:1", **options)
    assert HttpStore("http://127.0.0.1:1/").url == "http://127.0.0.1:1"
    assert HttpStore("http://127.0.0.1:1/prefix//").url == "http://127.0.0.1:1/prefix"
    assert HttpStore("http://127.0.0.1:1/pathX").url == "http://127.0.0.1:1/pathX"


def test_a_token_is_refused_only_for_a_line_break_or_nul() -> None:
    for token in ("X", "tok-en_X.9"):
        HttpStore("http://127.0.0.1:1", token=token)
    for bad in ("a\rb", "a\nb", "a\0b"):
        with pytest.raises(ValueError, match=r"^token must not contain CR, LF or NUL characters$"):
            HttpStore("http://127.0.0.1:1", token=bad)


def test_https_verifies_the_server_unless_told_otherwise() -> None:
    context = HttpStore("https://127.0.0.1:1").session.dialer._ssl
    assert context is not None
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname is True


@pytest.mark.asyncio
async def test_the_store_s_repr_names_its_url_and_says_when_it_is_closed() -> None:
    store = await open_store("http://127.0.0.1:1/")
    assert repr(store) == "<HttpStore http://127.0.0.1:1>"
    await store.aclose()
    assert repr(store) == "<HttpStore http://127.0.0.1:1 closed>"
