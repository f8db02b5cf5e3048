"""``GET /v1/session`` through aiohttp's route (``SessionHub.handle`` and
``_session_raw.upgrade``), the path a head cut over several reads takes (``pieces=2``): the 101
and its headers, a ``Connection`` list without spaces, the 426 with its exact words and headers,
the 503 while stopping, and a session ended there that aiohttp forgets. The direct path (one
read) is ``tests/test_http_session_raw.py``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from helpers.session_wire import session_wire, upgrade_answer
from helpers.waiting import eventually

from aioelastic.store.http._session_raw import upgrade
from aioelastic.store.http._session_server import SessionHub
from aioelastic.store.http._session_stream import UPGRADE
from aioelastic.store.http.server import HttpStoreServer
from aioelastic.store.memory import MemoryEngine

#: The 426's message for a request that is not a session upgrade, before what it got.
NOT_SESSION = (
    f"/v1/session speaks the session protocol: send 'Connection: Upgrade' and "
    f"'Upgrade: {UPGRADE}' (got Upgrade "
)


def _hub() -> SessionHub:
    return SessionHub(MemoryEngine(), max_key_bytes=100, max_value_bytes=1000, max_watches=10)


def _json(response: web.StreamResponse) -> Any:
    assert isinstance(response, web.Response)
    assert isinstance(response.body, bytes)
    return json.loads(response.body)


@pytest.mark.asyncio
async def test_the_routes_101_names_the_protocol_and_its_end_is_forgotten_by_aiohttp(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with HttpStoreServer(port=0) as server:
        status, headers, _ = await upgrade_answer(server.url, UPGRADE, pieces=2)
        assert status == 101
        assert headers["upgrade"] == UPGRADE
        assert headers["connection"].lower() == "upgrade"
        async with session_wire(server.url, pieces=2) as wire:
            assert (await wire.hello())["resumed"] is False
        runner = server._runner.server if server._runner else None
        assert runner is not None
        await eventually(lambda: not runner.connections, 10, "aiohttp forgot the connections")
        await eventually(lambda: server.statistics()["sessions"] == 0, 10, "the sessions ended")
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


@pytest.mark.asyncio
@pytest.mark.parametrize("connection", ["keep-alive,Upgrade", "keep-alive, upgrade"])
async def test_a_connection_list_upgrades_with_or_without_spaces(connection: str) -> None:
    async with HttpStoreServer(port=0) as server:
        for pieces in (1, 2):  # the direct path and aiohttp's route
            status, _, _ = await upgrade_answer(
                server.url, UPGRADE, connection=connection, pieces=pieces
            )
            assert status == 101, (connection, pieces)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("upgrade_header", "got"),
    [("", "''"), ("h2c", "'h2c'"), ("x" * 100, repr("x" * 60))],
    ids=["none", "other", "long"],
)
async def test_a_request_that_is_not_a_session_upgrade_gets_a_426_that_says_what_it_got(
    upgrade_header: str, got: str
) -> None:
    async with HttpStoreServer(port=0) as server:
        status, headers, body = await upgrade_answer(server.url, upgrade_header, pieces=2)
    assert status == 426
    assert headers["upgrade"] == UPGRADE
    assert headers["connection"].lower() == "upgrade"
    answer = json.loads(body)
    assert answer["error"] == "upgrade_required"
    assert answer["message"] == f"{NOT_SESSION}{got})"
    assert answer["upgrade"] == UPGRADE


@pytest.mark.asyncio
async def test_a_websocket_upgrade_gets_the_426_that_says_to_upgrade_the_client() -> None:
    async with HttpStoreServer(port=0) as server:
        status, _, body = await upgrade_answer(server.url, "websocket", pieces=2)
    assert status == 426
    assert json.loads(body)["message"] == (
        f"this server's sessions are {UPGRADE}, no longer a WebSocket: the client is "
        "older than the server; upgrade aioelastic on the client"
    )


@pytest.mark.asyncio
async def test_an_upgrade_header_without_a_connection_header_is_a_426() -> None:
    request = make_mocked_request("GET", "/v1/session", headers={"Upgrade": UPGRADE})
    response = await _hub().handle(request)
    assert response.status == 426
    assert _json(response)["message"] == f"{NOT_SESSION}{UPGRADE!r})"


@pytest.mark.asyncio
async def test_a_stopping_hub_answers_503_unavailable() -> None:
    hub = _hub()
    hub.shutdown()
    request = make_mocked_request(
        "GET", "/v1/session", headers={"Upgrade": UPGRADE, "Connection": "Upgrade"}
    )
    response = await hub.handle(request)
    assert response.status == 503
    assert _json(response) == {"error": "unavailable", "message": "the server is shutting down"}


class _Closing:
    def is_closing(self) -> bool:
        return True


@pytest.mark.asyncio
@pytest.mark.parametrize("transport", [None, _Closing()], ids=["gone", "closing"])
async def test_a_client_gone_before_the_routes_upgrade_is_a_connection_reset(
    transport: Any,
) -> None:
    hub = _hub()
    request = make_mocked_request(
        "GET", "/v1/session", headers={"Upgrade": UPGRADE, "Connection": "Upgrade"}
    )
    request._protocol.transport = transport
    with pytest.raises(ConnectionResetError, match="the client went away before the upgrade"):
        await upgrade(hub, request)
    assert not hub.raw_sessions
