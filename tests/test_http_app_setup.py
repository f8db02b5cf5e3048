"""The aiohttp application ``make_app`` builds (``_app.py``) and its metrics (``_metrics.py``):
its limits refused, the fast path's requests metered by their operation, REST watch streams and
session watches under one limit, the metrics' help texts, and the answer without
prometheus-client. Real servers on 127.0.0.1."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import pytest
from helpers.http import request_meter
from helpers.waiting import eventually

from aioelastic.store import MemoryEngine, open_store
from aioelastic.store.http._app import STATE, make_app
from aioelastic.store.http._errors import ApiError
from aioelastic.store.http._metrics import NoMetrics, ServerMetrics
from aioelastic.store.http.server import HttpStoreServer

LIMITS = "max_key_bytes and max_watch_streams must be >= 1 and max_value_bytes >= 0"


@pytest.mark.parametrize(
    "limits",
    [{"max_key_bytes": 0}, {"max_value_bytes": -1}, {"max_watch_streams": 0}],
    ids=["key", "value", "watches"],
)
def test_make_app_refuses_limits_below_their_minimum(limits: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(LIMITS)}$"):
        make_app(MemoryEngine(), **limits)


def test_make_app_takes_each_limit_at_its_minimum() -> None:
    app = make_app(MemoryEngine(), max_key_bytes=1, max_value_bytes=0, max_watch_streams=1)
    limits = app[STATE].limits
    assert (limits.max_key_bytes, limits.max_value_bytes) == (1, 0)


@pytest.mark.asyncio
async def test_the_fast_path_meters_its_requests_by_operation() -> None:
    pytest.importorskip("prometheus_client")
    async with HttpStoreServer(port=0) as server, aiohttp.ClientSession() as http:
        async with http.put(f"{server.url}/v1/kv/a", data=b"1") as response:
            assert response.status == 200
        for _ in range(2):
            async with http.get(f"{server.url}/v1/kv/a") as response:
                assert response.status == 200
        meter = request_meter(server)
        assert meter.count("put", 200) == 1
        assert meter.count("get", 200) == 2


@pytest.mark.asyncio
async def test_rest_watch_streams_and_session_watches_share_one_limit() -> None:
    async with (
        HttpStoreServer(port=0, max_watch_streams=2) as server,
        aiohttp.ClientSession() as http,
        open_store(server.url) as store,
        http.get(f"{server.url}/v1/watch/r/?progress_interval=300") as stream,
    ):
        assert stream.status == 200
        await eventually(lambda: server.statistics()["watch_streams"] == 1, 10, "the stream")
        first = store.watch("a/")
        await first.start()  # one stream and one watch: at the limit of 2
        with pytest.raises(ConnectionError, match="this server serves at most 2 watches"):
            await store.watch("b/").start()
        await first.aclose()


@pytest.mark.asyncio
async def test_the_request_metrics_say_what_they_count() -> None:
    pytest.importorskip("prometheus_client")
    metrics = ServerMetrics(MemoryEngine())
    metrics.observe("get", 200, 0.001)
    text = metrics.render()[0].decode()
    assert (
        "# HELP aioelastic_requests_total HTTP requests answered, by operation and status code"
        in text
    )
    assert (
        "# HELP aioelastic_request_duration_seconds Time to answer a request (a watch: the "
        "stream's lifetime), by operation" in text
    )


def test_without_prometheus_client_metrics_answer_501_saying_what_to_install() -> None:
    with pytest.raises(ApiError) as refused:
        NoMetrics().render()
    assert refused.value.status == 501
    assert refused.value.code == "metrics_unavailable"
    assert refused.value.message == (
        "this server has no metrics: install prometheus-client (pip install "
        "'aioelastic[server]') and restart it"
    )


#: (method, path, JSON body, the op it is metered as), in an order that works: a lease granted
#: (id 1) before the routes that name it.
ROUTES = [
    ("GET", "/healthz", None, "healthz"),
    ("GET", "/metrics", None, "metrics"),
    ("GET", "/openapi.json", None, "openapi"),
    ("GET", "/v1/revision", None, "revision"),
    ("DELETE", "/v1/kv/a", None, "delete"),
    ("POST", "/v1/add/n", b'{"delta": 2}', "add"),
    ("POST", "/v1/txn", b"{}", "txn"),
    ("GET", "/v1/range/p/", None, "range"),
    ("DELETE", "/v1/range/p/", None, "delete_range"),
    ("POST", "/v1/compact", b'{"revision": 1}', "compact"),
    ("POST", "/v1/lease", b'{"ttl": 30}', "lease_grant"),
    ("GET", "/v1/leases", None, "leases"),
    ("GET", "/v1/lease/1", None, "lease_status"),
    ("POST", "/v1/lease/1/keepalive", None, "lease_keep_alive"),
    ("DELETE", "/v1/lease/1", None, "lease_revoke"),
    ("GET", "/v1/session", None, "session"),
]


@pytest.mark.asyncio
async def test_each_route_is_metered_as_its_operation() -> None:
    pytest.importorskip("prometheus_client")
    async with HttpStoreServer(port=0) as server, aiohttp.ClientSession() as http:
        meter = request_meter(server)

        def metered(op: str) -> int:
            return sum(n for (name, _), n in meter._counts.items() if name == op)

        server.engine.put("n", b"1")
        for method, path, body, op in ROUTES:
            async with http.request(method, server.url + path, data=body) as response:
                await response.read()
            assert metered(op) == 1, (method, path, op, response.status)
        assert metered("other") == 0


@pytest.mark.asyncio
async def test_the_server_s_gauges_and_counters_as_scraped() -> None:
    """Each gauge, counter and help text of ``/metrics`` but the request ones (above), as a
    scrape shows them: names, what they say they count, and their values."""
    pytest.importorskip("prometheus_client")
    engine = MemoryEngine()
    engine.put("a", b"1")
    engine.put("b", b"2")
    engine.lease_grant(30)
    metrics = ServerMetrics(engine)
    metrics.refused("over_limit")
    metrics.log_event("suppressed")
    metrics.log_event("suppressed")
    lines = [
        line
        for line in metrics.render()[0].decode().splitlines()
        if not line.startswith(("aioelastic_request", "# HELP aioelastic_request"))
        and not line.startswith(("# TYPE aioelastic_request",))
        and "_created" not in line
    ]
    refused = (
        "Connections over --max-connections, by what became of them: silent_closed (an idle "
        "connection closed to make room), over_limit (answered /healthz or 503)"
    )
    logged = (
        "Log lines suppressed by the one-line-a-second limit (suppressed), and errors for lack "
        "of file descriptors, EMFILE/ENFILE (fd_exhausted)"
    )
    assert lines == [
        "# HELP aioelastic_keys Keys in the store",
        "# TYPE aioelastic_keys gauge",
        "aioelastic_keys 2.0",
        "# HELP aioelastic_leases Live leases",
        "# TYPE aioelastic_leases gauge",
        "aioelastic_leases 1.0",
        "# HELP aioelastic_revision Store revision",
        "# TYPE aioelastic_revision gauge",
        "aioelastic_revision 2.0",
        "# HELP aioelastic_watch_streams Open watch streams and session watches",
        "# TYPE aioelastic_watch_streams gauge",
        "aioelastic_watch_streams 0.0",
        "# HELP aioelastic_connections Open client connections",
        "# TYPE aioelastic_connections gauge",
        "aioelastic_connections 0.0",
        "# HELP aioelastic_sessions Connected sessions (/v1/session)",
        "# TYPE aioelastic_sessions gauge",
        "aioelastic_sessions 0.0",
        f"# HELP aioelastic_connections_refused_total {refused}",
        "# TYPE aioelastic_connections_refused_total counter",
        'aioelastic_connections_refused_total{reason="over_limit"} 1.0',
        f"# HELP aioelastic_log_events_total {logged}",
        "# TYPE aioelastic_log_events_total counter",
        'aioelastic_log_events_total{event="suppressed"} 2.0',
    ]


def test_a_request_count_never_seen_is_zero() -> None:
    pytest.importorskip("prometheus_client")
    metrics = ServerMetrics(MemoryEngine())
    metrics.observe("get", 200, 0.001)
    assert metrics.requests.count("get", 200) == 1
    assert metrics.requests.count("get", 404) == 0
    assert metrics.requests.count("never", 200) == 0


@pytest.mark.asyncio
async def test_the_routed_get_and_put_are_metered_as_the_fast_path_s() -> None:
    """A GET or PUT of a key with ``Expect`` takes the router's way, not the fast path: it is
    metered as ``get`` and ``put`` all the same."""
    pytest.importorskip("prometheus_client")
    async with HttpStoreServer(port=0) as server, aiohttp.ClientSession() as http:
        url = f"{server.url}/v1/kv/a"
        async with http.put(url, data=b"1", expect100=True) as response:
            assert response.status == 200
        async with http.get(url, headers={"Expect": "100-continue"}) as response:
            assert response.status == 200
        meter = request_meter(server)
        assert (meter.count("put", 200), meter.count("get", 200)) == (1, 1)
