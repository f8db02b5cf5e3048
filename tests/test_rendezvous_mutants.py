"""Tests for rendezvous/'s stable modules that mutation testing showed missing (issue 22).

Each pins a behaviour a small, realistic bug would break and no other test checked: see
docs/testing.md, "Mutation testing". Memory stores only; the CLI's ``main`` runs in this process
(test_status.py runs it as a child process, which mutmut does not see).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import math
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from aioelastic.errors import (
    ConfigError,
    LeaseExpiredError,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousNotFoundError,
    RendezvousTimeoutError,
    StoreClosedError,
)
from aioelastic.rendezvous import (
    DynamicRendezvousHandler,
    RendezvousEvent,
    RendezvousEventKind,
    RendezvousHandler,
    RendezvousHandlerRegistry,
    RendezvousParameters,
    RendezvousStatus,
    RendezvousStoreInfo,
    StaticRendezvousHandler,
    _addr,
    _backends,
    _status_cli,
    create_handler,
    handler_registry,
    parse_rdzv_conf,
    store_url_for,
)
from aioelastic.rendezvous._state import (
    ClosedRecord,
    DriverRecord,
    NodeRecord,
    RoundRecord,
    RunKeys,
)
from aioelastic.rendezvous._status import (
    MemberStatus,
    NodeStatus,
    RunStatus,
    TimerStatus,
    format_run_status,
    read_run_status,
    watch_run_status,
)
from aioelastic.store import MemoryEngine, MemoryStore, open_store
from aioelastic.testing import FaultInjectingStore, run_virtual, virtual_test
from aioelastic.timer import TimerRequest, timer_key


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _status_cli.configure(parser)
    return parser.parse_args(list(argv))


def _status(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = _status_cli.main(_args(*argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- aioelastic status, in-process ----------------------------------------------------------------


def test_status_defaults() -> None:
    args = _args("--endpoint", "h", "--run-id", "r")
    assert (args.backend, args.timeout, args.watch, args.json) == ("c10d", 10.0, False, False)
    assert (args.token_file, args.password_file, args.timers_prefix) == (None, None, None)


def test_status_flags_parse() -> None:
    args = _args(
        "--endpoint", "e", "--run-id", "r", "--backend", "etcd", "--token-file", "/t",
        "--password-file", "/p", "--timeout", "2.5", "--watch", "--json", "--timers-prefix", "x/",
    )  # fmt: skip
    assert (args.endpoint, args.run_id, args.backend) == ("e", "r", "etcd")
    assert (args.token_file, args.password_file, args.timeout) == ("/t", "/p", 2.5)
    assert (args.watch, args.json, args.timers_prefix) == (True, True, "x/")
    for backend in ("c10d", "http", "https"):
        assert _args("--endpoint", "e", "--run-id", "r", "--backend", backend).backend == backend


@pytest.mark.parametrize(
    "argv",
    [
        ("--run-id", "r"),
        ("--endpoint", "e"),
        ("--endpoint", "e", "--run-id", "r", "--backend", "memory"),
        ("--endpoint", "e", "--run-id", "r", "--timeout", "soon"),
        ("--endpoint", "e", "--run-id", "r", "--watch", "1"),
    ],
)
def test_status_flags_refused(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]) -> None:
    with pytest.raises(SystemExit) as caught:
        _args(*argv)
    assert caught.value.code == 2
    capsys.readouterr()


@pytest.mark.parametrize(
    ("endpoint", "backend", "url"),
    [
        ("h1", "c10d", "http://h1:29400"),
        (" h1:5 ", "http", "http://h1:5"),
        ("h1", "https", "https://h1:29400"),
        ("h1,h2:3", "etcd", "etcd://h1:2379,h2:3"),
        (" memory://x ", "etcd", "memory://x"),
    ],
)
def test_store_url_of_an_endpoint(endpoint: str, backend: str, url: str) -> None:
    assert _status_cli.store_url(endpoint, backend, "run") == url


def test_status_of_an_unknown_run_fails_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _status(capsys, "--endpoint", "memory://mutants-none", "--run-id", "nobody")
    assert (code, out) == (2, "")
    assert err.startswith("aioelastic status: ")
    assert err.count("\n") == 1
    assert "nobody" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--timeout", "0"), "--timeout must be a number of seconds > 0, got 0.0"),
        (("--timeout", "nan"), "--timeout must be a number of seconds > 0, got nan"),
        (("--timers-prefix", ""), "--timers-prefix must not be empty"),
        (
            ("--run-id", "a/b"),
            "--run-id must be 1-128 characters of letters, digits and '_.:@-' (no '/'), got 'a/b'",
        ),
        (("--run-id", "u:pw@h/x"), "--run-id must be 1-128 characters"),
        (("--endpoint", "h:0"), "--endpoint 'h:0' is malformed: bad value for 'endpoint': "),
        (("--endpoint", "foo://u:pw@x"), "--endpoint 'foo://u:***@x' is malformed: url "),
        (("--token-file", "/t"), "--token-file applies to http(s) stores only"),
        (("--endpoint", "h", "--password-file", "/p"), "--password-file applies to etcd "),
    ],
)
def test_status_refuses_bad_flags_in_one_line(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    base = {"--endpoint": "memory://mutants-flags", "--run-id": "job"}
    flags = dict(zip(argv[::2], argv[1::2], strict=True))
    args = [item for pair in {**base, **flags}.items() for item in pair]
    code, out, err = _status(capsys, *args)
    assert (code, out) == (2, "")
    assert err.startswith(f"aioelastic status: {message}")
    assert err.count("\n") == 1
    assert "pw" not in err


def test_status_says_only_its_own_failure(capsys: pytest.CaptureFixture[str]) -> None:
    store_log = logging.getLogger("aioelastic.store")
    level = store_log.level
    try:
        _status(capsys, "--endpoint", "memory://mutants-log", "--run-id", "job")
        assert store_log.level == logging.ERROR  # not the client's "retrying" warnings
    finally:
        store_log.setLevel(level)


async def _seeded(url: str) -> StaticRendezvousHandler:
    """A completed static round of one (rank 0 at h:7) in the shared memory store ``url``."""
    store = await open_store(url)
    handler = StaticRendezvousHandler(
        store, "job", 0, 1, local_addr="h", master_port=7, owns_store=True
    )
    await handler.next_rendezvous()
    return handler


def test_status_prints_one_snapshot(capsys: pytest.CaptureFixture[str]) -> None:
    url = "memory://mutants-once"

    async def body(*argv: str) -> int:
        handler = await _seeded(url)
        try:
            return await _status_cli._main(_args("--endpoint", url, "--run-id", "job", *argv))
        finally:
            await handler.aclose()

    assert run_virtual(body("--json")) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    status = json.loads(out)
    assert (status["round"], status["master_addr"], status["master_port"]) == (0, "h", 7)
    assert status["timers_prefix"] == "aioelastic/run-timers/job/"
    assert run_virtual(body("--timers-prefix", "mine/")) == 0
    out = capsys.readouterr().out
    assert out.startswith("run job  (store revision ")
    assert out.endswith("\ntimers: none under mine/\n")  # one frame, no blank line after it


@pytest.mark.parametrize(
    ("argv", "tty", "frame_end"),
    [((), False, "\n\n"), (("--json",), False, "}\n"), ((), True, "\n")],
)
def test_status_watch_prints_a_frame_per_change(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: tuple[str, ...],
    tty: bool,
    frame_end: str,
) -> None:
    url = "memory://mutants-watch"
    monkeypatch.setattr(sys.stdout, "isatty", lambda: tty)

    async def body() -> None:
        handler = await _seeded(url)
        args = _args("--endpoint", url, "--run-id", "job", "--watch", *argv)
        watching = asyncio.ensure_future(_status_cli._main(args))
        await asyncio.sleep(1)
        await handler.set_closed()
        await asyncio.sleep(1)
        assert not watching.done()
        watching.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watching
        await handler.aclose()

    run_virtual(body())
    out = capsys.readouterr().out
    frames = out.split(_status_cli._CLEAR)[1:] if tty else None
    if tty:
        assert frames is not None
        assert out.startswith(_status_cli._CLEAR)
        assert len(frames) == 2
        assert "state: closed after round 0" in frames[1]
    elif argv:
        lines = out.splitlines()
        assert len(lines) == 2
        assert [json.loads(line)["closed"] for line in lines] == [False, True]
    else:
        assert out.count("run job  (store revision ") == 2
        assert "\n\nrun job" in out  # a blank line between frames
        assert _status_cli._CLEAR not in out
    assert out.endswith(frame_end)


def test_status_gives_up_on_a_store_that_does_not_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A store that takes the connection and never answers: the first snapshot's timeout."""
    accepted = socket.create_server(("127.0.0.1", 0))
    port = accepted.getsockname()[1]
    try:
        code, out, err = _status(
            capsys, "--endpoint", f"127.0.0.1:{port}", "--run-id", "job", "--timeout", "0.5"
        )
    finally:
        accepted.close()
    assert (code, out) == (2, "")
    url = f"http://127.0.0.1:{port}"
    assert err == f"aioelastic status: no answer from the store at {url} within 0.5s\n"


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (StoreClosedError("lost http://u:pw2@h:1 now\nmore"), "lost http://u:***@h:1 now"),
        (OSError(), "OSError"),  # no text: the error's type
        (ValueError(""), "ValueError"),
    ],
)  # fmt: skip
def test_status_failure_is_one_redacted_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    error: Exception,
    said: str,
) -> None:
    """What ``main`` says of an error ``_main`` raised: its first line, with any URL's password
    redacted (a store error may name the URL it was given), or its type when it has no text."""

    async def failing(args: argparse.Namespace) -> int:
        raise error

    monkeypatch.setattr(_status_cli, "_main", failing)
    code, out, err = _status(capsys, "--endpoint", "h", "--run-id", "job")
    assert (code, out, err) == (2, "", f"aioelastic status: {said}\n")


def test_status_watch_flushes_each_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--watch`` into a pipe (``| tee``, a log collector): each frame is flushed as it is
    printed, not left in stdout's buffer until the command ends."""
    url = "memory://mutants-flush"
    flushed: list[str] = []

    class Pipe:
        def __init__(self) -> None:
            self.pending = ""

        def write(self, text: str) -> int:
            self.pending += text
            return len(text)

        def flush(self) -> None:
            flushed.append(self.pending)
            self.pending = ""

        def isatty(self) -> bool:
            return False

    monkeypatch.setattr(sys, "stdout", Pipe())

    async def body() -> None:
        handler = await _seeded(url)
        args = _args("--endpoint", url, "--run-id", "job", "--watch", "--json")
        watching = asyncio.ensure_future(_status_cli._main(args))
        await asyncio.sleep(1)
        assert len(flushed) == 1  # the first frame is out while the command still watches
        await handler.set_closed()
        await asyncio.sleep(1)
        assert [json.loads(frame)["closed"] for frame in flushed] == [False, True]
        watching.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watching
        await handler.aclose()

    run_virtual(body())


# -- the built-in backends' configuration ---------------------------------------------------------


def _params(backend: str = "memory", endpoint: str = "", **config: Any) -> RendezvousParameters:
    return RendezvousParameters(backend, endpoint, "job", 2, 2, **config)


def _bad(key: str, call: Any, *args: Any, **kwargs: Any) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        call(*args, **kwargs)
    assert caught.value.key == key
    return caught.value


@pytest.mark.parametrize(
    ("endpoint", "hostport"),
    [
        ("  ", "localhost:7"),
        ("h", "h:7"),
        ("h:", "h:7"),
        ("h:080", "h:80"),
        ("h:1", "h:1"),
        ("h:65535", "h:65535"),
        ("[::1]", "[::1]:7"),
        ("[::1]:9", "[::1]:9"),
        ("fe80::1", "[fe80::1]:7"),
    ],
)
def test_host_port_fills_in_the_default_port(endpoint: str, hostport: str) -> None:
    assert _backends._host_port(endpoint, 7) == hostport


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("[::1", "host[:port] or [ipv6]:port"),
        ("[::1]9", "host[:port] or [ipv6]:port"),
        (":9", "host[:port] or [ipv6]:port"),
        ("h:65536", "a port in 1..65535 after ':'"),
        ("h:0", "a port in 1..65535 after ':'"),
        ("h:-1", "a port in 1..65535 after ':'"),
    ],
)
def test_host_port_names_the_endpoint(endpoint: str, expected: str) -> None:
    error = _bad("endpoint", _backends._host_port, endpoint, 7)
    assert error.expected == expected
    assert error.value == endpoint


@pytest.mark.parametrize(
    ("backend", "endpoint", "url"),
    [
        ("memory", " name ", "memory://name"),
        ("static", "  ", "memory://rdzv-a%3Ab%40c"),
        ("etcd", "", "etcd://localhost:2379"),
        ("etcd", " , ", "etcd://localhost:2379"),
        ("etcd", "a, b:1 ,", "etcd://a:2379,b:1"),
        ("https", "h", "https://h:29400"),
        ("c10d", "h", "http://h:29400"),
        ("static", "h", "http://h:29400"),
        ("mine", "h", "http://h:29400"),
    ],
)
def test_store_url_for_each_backend(backend: str, endpoint: str, url: str) -> None:
    params = RendezvousParameters(backend, endpoint, "a:b@c", 1, 1)
    assert store_url_for(params) == url


@pytest.mark.parametrize("name", ["a/b", "a:b", "a?b", "a#b", "a@b", "a[b", "a]b", "a b"])
def test_a_memory_store_name_must_be_plain(name: str) -> None:
    error = _bad("endpoint", store_url_for, _params("memory", name))
    assert error.expected == "a plain name for the shared memory store"


@pytest.mark.parametrize("url", [7, "http:/h"])
def test_a_store_url_must_be_a_url(url: Any) -> None:
    error = _bad("store_url", store_url_for, _params(store_url=url))
    assert error.expected == "a store URL such as http://host:port"


def test_lease_from_the_config() -> None:
    assert _backends._lease(_params()) == (15.0, 5.0)  # torch's 5 s x 3 attempts
    assert _backends._lease(_params(keep_alive_interval="2", keep_alive_max_attempt="1")) == (
        2.0,
        2.0 / 3,
    )
    assert _backends._lease(_params(lease_ttl="9", keep_alive_interval="1")) == (9.0, 1.0)
    assert _backends._lease(_params(lease_ttl="3", keep_alive_interval="3")) == (3.0, 1.0)
    assert _backends._lease(_params(lease_ttl="2.9", keep_alive_interval="3")) == (2.9, 2.9 / 3)
    error = _bad("keep_alive_max_attempt", _backends._lease, _params(keep_alive_max_attempt="0"))
    assert error.expected == "an integer >= 1"


def test_unknown_config_keys_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "aioelastic.rendezvous"):
        _backends._lease(_params(timeout="9", zeta="1", alpha="2"))
    assert [r.getMessage() for r in caplog.records] == [
        "rendezvous config keys ['alpha', 'zeta'] are unknown and ignored"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, "aioelastic.rendezvous"):
        _backends._lease(_params(**dict.fromkeys(_backends._KNOWN_KEYS, "1")))
    assert caplog.records == []


def test_dynamic_options_defaults_and_each_key() -> None:
    assert _backends._dynamic_options(_params()) == {
        "join_timeout": 600.0,
        "last_call_timeout": 30.0,
        "close_timeout": 30.0,
        "lease_ttl": 15.0,
        "keep_alive_interval": 5.0,
        "node_id": None,
        "local_addr": None,
        "reopen_closed": False,
        "fast_reform": True,
        "participants": True,
    }
    params = RendezvousParameters(
        "memory",
        "",
        "job",
        1,
        1,
        local_addr="10.0.0.1",
        join_timeout="1",
        last_call_timeout="0",
        close_timeout="3",
        reopen_closed="1",
        fast_reform="0",
        participants="no",
        node_id="n",
    )
    assert _backends._dynamic_options(params) == {
        "join_timeout": 1.0,
        "last_call_timeout": 0.0,
        "close_timeout": 3.0,
        "lease_ttl": 15.0,
        "keep_alive_interval": 5.0,
        "node_id": "n",
        "local_addr": "10.0.0.1",
        "reopen_closed": True,
        "fast_reform": False,
        "participants": False,
    }
    assert _bad("node_id", _backends._dynamic_options, _params(node_id=3)).expected == "a string"
    _bad("close_timeout", _backends._dynamic_options, _params(close_timeout="0"))


def test_static_options_defaults_and_each_key() -> None:
    assert _backends._static_options(_params("static", rank="1")) == {
        "rank": 1,
        "join_timeout": 600.0,
        "lease_ttl": 15.0,
        "keep_alive_interval": 5.0,
        "local_addr": None,
        "master_addr": None,
        "master_port": None,
    }
    params = _params("static", rank="0", join_timeout="4", master_addr="m", master_port="9")
    options = _backends._static_options(params)
    assert (options["join_timeout"], options["master_addr"], options["master_port"]) == (
        4.0,
        "m",
        9,
    )
    assert (
        _backends._static_options(_params("static", rank="0", master_addr=5))["master_addr"] is None
    )


@pytest.mark.parametrize(
    ("nodes", "rank", "key", "expected"),
    [
        ((1, 2), "0", "nnodes", "a fixed N: the static rendezvous needs min_nodes == max_nodes"),
        ((2, 2), None, "rank", "this node's rank, an integer in 0..world_size-1"),
        ((2, 2), "2", "rank", "an integer in 0..1"),
        ((2, 2), "-1", "rank", "an integer in 0..1"),
    ],
)
def test_static_options_name_the_bad_key(
    nodes: tuple[int, int], rank: str | None, key: str, expected: str
) -> None:
    config: dict[str, Any] = {} if rank is None else {"rank": rank}
    params = RendezvousParameters("static", "", "job", nodes[0], nodes[1], **config)
    error = _bad(key, _backends._static_options, params)
    assert error.expected == expected
    if key == "nnodes":
        assert error.value == "1:2"


def test_check_params_checks_as_creating_would() -> None:
    _backends.check_params(_params("static", rank="1"))
    _backends.check_params(_params("etcd", "e1"))
    error = _bad("rdzv_backend", _backends.check_params, _params("nope"))
    assert error.expected.startswith("one of ")
    assert "static" in error.expected.split(", ")
    _bad("rank", _backends.check_params, _params("static"))
    _bad("join_timeout", _backends.check_params, _params("c10d", join_timeout="x"))
    _bad("endpoint", _backends.check_params, _params("c10d", "h:0"))
    _bad("endpoint", _backends.check_params, _params("static", "h:0", rank="0"))


def test_check_params_leaves_another_backend_to_its_creator() -> None:
    async def creator(params: RendezvousParameters) -> RendezvousHandler:
        raise AssertionError

    name = "mutants-other"
    if name not in handler_registry.backends():
        handler_registry.register(name, creator)
    _backends.check_params(_params(name, "h:0", join_timeout="x"))  # nothing of it checked here


@pytest.mark.parametrize(
    ("backend", "key", "value"),
    [
        ("memory", "token_file", "/t"),
        ("memory", "username", "u"),
        ("memory", "password_file", "/p"),
        ("c10d", "username", "u"),
        ("c10d", "password_file", "/p"),
        ("c10d", "token_file", ""),
        ("c10d", "token_file", 3),
    ],
)
def test_a_credential_for_another_store_is_refused(backend: str, key: str, value: Any) -> None:
    params = _params(backend, "h" if backend == "c10d" else "", **{key: value})
    with pytest.raises(ConfigError) as caught:
        asyncio.run(_backends._open(params))
    assert caught.value.key == key
    assert caught.value.expected == _backends._CREDENTIAL_FORMS[key]


# -- api: parameters, the registry, the handler's shared surface ----------------------------------


def test_parse_rdzv_conf_messages() -> None:
    assert parse_rdzv_conf(" a = 1 ,b=2=3, ") == {"a": "1", "b": "2=3"}
    error = _bad("rdzv_conf", parse_rdzv_conf, "a=1, k= ")
    assert (error.value, error.expected) == ("k=", "key=value pairs separated by ','")
    with pytest.raises(TypeError, match=r"^rdzv_conf must be a str, got int$"):
        parse_rdzv_conf(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((3, "", "job", 1, 1), ValueError, "^backend must be a non-empty string$"),
        (("m", 3, "job", 1, 1), TypeError, "^endpoint must be a str, got int$"),
        (("m", "", "", 1, 1), ValueError, "run_id"),
        (("m", "", "job", True, 1), TypeError, "^min_nodes must be an int, got bool$"),
        (("m", "", "job", 1, 1.0), TypeError, "^max_nodes must be an int, got float$"),
        (("m", "", "job", 0, 1), ValueError, r"^min_nodes must be >= 1, got 0$"),
        (("m", "", "job", 3, 2), ValueError, r"^max_nodes \(2\) must be >= min_nodes \(3\)$"),
    ],
)
def test_parameters_name_what_is_wrong(args: tuple[Any, ...], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        RendezvousParameters(*args)


def test_parameters_keep_every_argument_and_redact_their_repr() -> None:
    params = RendezvousParameters.from_rdzv_conf(
        "etcd", "etcd://u:pw@h:1", "job", 1, 3, "token=x,n=1", local_addr="10.0.0.2"
    )
    assert (params.backend, params.endpoint, params.run_id) == ("etcd", "etcd://u:pw@h:1", "job")
    assert (params.min_nodes, params.max_nodes, params.local_addr) == (1, 3, "10.0.0.2")
    assert params.config == {"token": "x", "n": "1"}
    assert RendezvousParameters.from_rdzv_conf("m", "", "job", 1, 1).config == {}
    text = repr(RendezvousParameters("m", "http://u:pw@h:1", "job", 1, 2, url="http://a:pw@b", n=1))
    assert "pw" not in text
    assert text.startswith("RendezvousParameters(backend='m', endpoint='http://u:")
    assert text.endswith(
        ", run_id='job', min_nodes=1, max_nodes=2, config={'url': 'http://a:***@b', 'n': 1})"
    )


def test_get_and_the_typed_getters_defaults() -> None:
    params = RendezvousParameters("m", "", "job", 1, 1, n=" 7 ", s=" 2.5 ", i=3, f=0.5, z=0)
    assert (params.get("n"), params.get("x"), params.get("x", 4)) == (" 7 ", None, 4)
    assert params.get_as_bool("x") is None
    assert params.get_as_bool("x", True) is True
    assert params.get_as_int("n") == 7
    assert params.get_as_int("i") == 3
    assert params.get_as_int("x") is None
    assert params.get_as_seconds("s") == 2.5
    assert params.get_as_seconds("i") == 3.0
    assert params.get_as_seconds("f") == 0.5
    assert params.get_as_seconds("x") is None
    assert params.get_as_seconds("x", 4) == 4.0
    assert params.get_as_seconds("z", allow_zero=True) == 0.0
    assert _bad("n", params.get_as_bool, "n").expected == (
        "a boolean: 1/true/t/yes/y or 0/false/f/no/n"
    )


@pytest.mark.parametrize("value", [True, 2.0, "1.5", [1]])
def test_get_as_int_refuses(value: Any) -> None:
    params = RendezvousParameters("m", "", "job", 1, 1, k=value)
    error = _bad("k", params.get_as_int, "k")
    assert (error.value, error.expected) == (value, "an integer")  # the error names the value


@pytest.mark.parametrize("value", [2, "maybe", 1.0, [1]])
def test_get_as_bool_names_the_refused_value(value: Any) -> None:
    params = RendezvousParameters("m", "", "job", 1, 1, k=value)
    error = _bad("k", params.get_as_bool, "k")
    assert error.value == value
    assert repr(value) in str(error)


@pytest.mark.parametrize(
    ("value", "allow_zero"),
    [(True, False), (False, True), ([1], False), ("x", True), ("nan", False), (math.inf, True),
     (-1, True), ("-0.5", True), (0, False), ("0", False)],
)  # fmt: skip
def test_get_as_seconds_refuses(value: Any, allow_zero: bool) -> None:
    params = RendezvousParameters("m", "", "job", 1, 1, k=value)
    error = _bad("k", params.get_as_seconds, "k", None, allow_zero=allow_zero)
    form = "a number of seconds >= 0" if allow_zero else "a number of seconds > 0"
    assert (error.value, error.expected) == (value, form)


def test_registry_messages() -> None:
    registry = RendezvousHandlerRegistry()

    async def creator(params: RendezvousParameters) -> RendezvousHandler:
        return StaticRendezvousHandler(MemoryStore(), params.run_id, 0, 1, local_addr="h")

    for bad in ("", 3):
        with pytest.raises(ValueError, match=r"^backend must be a non-empty string$"):
            registry.register(bad, creator)  # type: ignore[arg-type]
    registry.register("b", creator)
    registry.register("a", creator)
    assert registry.backends() == ["a", "b"]
    with pytest.raises(ValueError, match=r"^the rendezvous backend 'a' is already registered"):
        registry.register("a", _backends._create_static)

    async def body() -> None:
        with pytest.raises(
            ValueError, match=r"^unknown rendezvous backend 'c' \(registered: a, b\)$"
        ):
            await registry.create_handler(RendezvousParameters("c", "", "job", 1, 1))
        with pytest.raises(
            RendezvousError, match=r"^the handler created for 'a' reports backend 'static'$"
        ):
            await registry.create_handler(RendezvousParameters("a", "", "job", 1, 1))

    asyncio.run(body())


# -- the static handler ---------------------------------------------------------------------------


def _static(
    engine: MemoryEngine, rank: int, world: int = 2, run_id: str = "job", **options: Any
) -> StaticRendezvousHandler:
    options.setdefault("local_addr", f"host{rank}")
    options.setdefault("lease_ttl", 6.0)
    return StaticRendezvousHandler(MemoryStore(engine), run_id, rank, world, **options)


@pytest.mark.parametrize(
    ("args", "options", "error", "message"),
    [
        ((True, 2), {}, TypeError, "^rank must be an int, got bool$"),
        ((0, 2.0), {}, TypeError, "^world_size must be an int, got float$"),
        ((0, 0), {}, ValueError, "^world_size must be >= 1, got 0$"),
        ((-1, 2), {}, ValueError, r"^rank must be in 0\.\.1, got -1$"),
        ((2, 2), {}, ValueError, r"^rank must be in 0\.\.1, got 2$"),
        ((0, 1), {"join_timeout": 0}, ValueError, "^join_timeout must be > 0 seconds, got 0$"),
        ((0, 1), {"master_port": 0}, ValueError, r"^master_port must be in 1\.\.65535, got 0$"),
        ((0, 1), {"master_port": 65536}, ValueError, "got 65536$"),
    ],
)
def test_static_handler_names_a_bad_argument(
    args: tuple[Any, Any], options: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        StaticRendezvousHandler(MemoryStore(), "job", *args, local_addr="h", **options)


def test_static_handler_accepts_the_edges() -> None:
    h = StaticRendezvousHandler(MemoryStore(), "job", 1, 2, master_port=65535, backend="mine")
    assert (h.get_backend(), h.run_id, h.node_name(3)) == ("mine", "job", "rank3")
    assert StaticRendezvousHandler(MemoryStore(), "job", 0, 1, master_port=1).get_backend() == (
        "static"
    )


@virtual_test
async def test_static_round_publishes_rank0s_address_and_the_rounds_store() -> None:
    engine = MemoryEngine()
    hs = [_static(engine, 0, master_addr="m", master_port=7), _static(engine, 1)]
    results = await asyncio.gather(*(h.next_rendezvous() for h in hs))
    for rank, r in enumerate(results):
        assert (r.run_id, r.round, r.rank, r.world_size) == ("job", 0, rank, 2)
        assert (r.node_id, r.participants) == (f"rank{rank}", ("rank0", "rank1"))
        assert r.bootstrap_store_info == RendezvousStoreInfo("m", 7)
    await results[1].store.put("k", b"v")
    kv = await MemoryStore(engine).get(RunKeys("job").data(0) + "k")
    assert kv is not None
    assert kv.value == b"v"
    lease = hs[0]._keeper
    again = await hs[0].next_rendezvous()  # its own registration, under its own lease
    assert again.rank == 0
    assert hs[0]._keeper is lease
    for h in hs:
        await h.aclose()
    # rank 0's local address, and a free port, when nothing overrides them
    hs = [
        _static(engine, 0, run_id="job2"),
        _static(engine, 1, run_id="job2", master_addr="not-rank-0", master_port=9),
    ]
    results = await asyncio.gather(*(h.next_rendezvous() for h in hs))
    info = results[1].bootstrap_store_info
    assert info.master_addr == "host0"
    assert 0 < info.master_port < 65536
    assert info.master_port != 9
    for h in hs:
        await h.aclose()


@virtual_test
async def test_static_rank0_counts_only_live_ranks_of_its_world() -> None:
    engine = MemoryEngine()
    store = MemoryStore(engine)
    keys = RunKeys("job")
    record = NodeRecord("x", "h", 1).encode()
    for key in (keys.node(0, "rank3"), keys.node(0, "rank01"), keys.node(0, "rankx"),
                keys.node(0, "x2"), keys.node(1, "rank2"), keys.root + "other"):  # fmt: skip
        await store.put(key, record)
    rank0 = _static(engine, 0, 3, join_timeout=50)
    rank1 = _static(engine, 1, 3)
    joining = asyncio.ensure_future(rank0.next_rendezvous())
    waiting = asyncio.ensure_future(rank1.next_rendezvous())
    await asyncio.sleep(10)
    await rank1.aclose()  # registered, then gone before the round: not counted
    waiting.cancel()
    await asyncio.sleep(1)
    await store.put(keys.node(0, "rank2"), NodeRecord("rank2", "h", 1).encode())
    with pytest.raises(RendezvousTimeoutError) as caught:
        await joining
    assert str(caught.value) == (
        "static rendezvous 'job': ranks ['rank1'] did not arrive within join_timeout=50.0s"
    )
    assert asyncio.get_running_loop().time() == pytest.approx(50)
    assert rank0.status is RendezvousStatus.ACTIVE  # a timeout is not the handler's error
    await rank0.aclose()
    await store.aclose()


@pytest.mark.parametrize(
    ("record", "world"),
    [(RoundRecord(0, 3, "h", 1, chunks=0), 3), (RoundRecord(0, 2, "h", 1, chunks=1), 2)],
)
def test_static_rank_refuses_a_round_record_not_of_its_world(
    record: RoundRecord, world: int
) -> None:
    async def body() -> None:
        engine = MemoryEngine()
        store = MemoryStore(engine)
        await store.put(RunKeys("job").round, record.encode())
        h = _static(engine, 1)
        with pytest.raises(RendezvousError) as caught:
            await h.next_rendezvous()
        assert str(caught.value) == (
            f"static rendezvous 'job': the round record has {world} ranks, this handler expects 2"
        )
        assert h.status is RendezvousStatus.ERROR
        assert h.error is caught.value
        assert h.get_error_message() == f"RendezvousError: {caught.value}"
        await h.aclose()
        await store.aclose()

    run_virtual(body())


@virtual_test
async def test_static_ranks_see_a_closed_run() -> None:
    engine = MemoryEngine()
    closer = _static(engine, 0)
    assert (closer.error, closer.get_error_message()) == (None, None)  # no error: no message
    await closer.set_closed()
    for rank in (0, 1):
        h = _static(engine, rank)
        with pytest.raises(RendezvousClosedError, match=r"^the rendezvous 'job' is closed$"):
            await h.next_rendezvous()
        assert h.status is RendezvousStatus.CLOSED
        # once seen closed, the next call is refused before it reads anything, as clearly
        with pytest.raises(RendezvousClosedError, match=r"^the rendezvous 'job' is closed$"):
            await h.next_rendezvous()
        assert await h.is_closed()
        await h.aclose()
    # closed while a rank waits
    engine = MemoryEngine()
    waiting = [asyncio.ensure_future(_static(engine, rank, 3).next_rendezvous()) for rank in (0, 1)]
    await asyncio.sleep(5)
    other = _static(engine, 2, 3)
    assert not await other.is_closed()
    assert other.status is RendezvousStatus.ACTIVE
    await other.set_closed()
    for task in waiting:
        with pytest.raises(RendezvousClosedError):
            await task
    assert await _static(engine, 2, 3).is_closed()  # read from the store


@virtual_test
async def test_static_wait_for_change_reports_only_another_ranks_loss() -> None:
    engine = MemoryEngine()
    hs = [_static(engine, rank, 3) for rank in range(3)]
    with pytest.raises(RendezvousError, match=r"^wait_for_change\(\) needs a completed round"):
        await hs[0].wait_for_change()
    await asyncio.gather(*(h.next_rendezvous() for h in hs))
    store = MemoryStore(engine)
    keys = RunKeys("job")
    await store.put(keys.node(0, "rank7"), b"x")
    await store.delete(keys.node(0, "rank7"))  # not of this world
    await store.put(keys.node(1, "rank2"), b"x")
    await store.delete(keys.node(1, "rank2"))  # not round 0
    await store.delete(keys.node(0, "rank0"))  # its own
    await hs[2].aclose()
    event = await hs[0].wait_for_change()
    assert (event.kind, event.node_id, event.round) == (
        RendezvousEventKind.PARTICIPANT_LOST,
        "rank2",
        0,
    )
    assert event.revision == (await store.range(keys.root)).revision  # the deletion's
    await hs[1].set_closed()
    kinds = [e.kind async for e in hs[0].events()]
    assert kinds == [RendezvousEventKind.CLOSED]
    assert (await hs[0].wait_for_change()).kind is RendezvousEventKind.CLOSED
    await hs[0].aclose()
    with pytest.raises(
        RendezvousClosedError, match=r"^the rendezvous handler for 'job' is closed$"
    ):
        await hs[0].wait_for_change()
    with pytest.raises(
        RendezvousClosedError, match=r"^the rendezvous handler for 'job' is closed$"
    ):
        await hs[0].num_nodes_waiting()
    await hs[1].aclose()
    await store.aclose()


@virtual_test
async def test_static_lost_lease_is_an_error_event() -> None:
    engine = MemoryEngine()
    hs = [_static(engine, rank) for rank in range(2)]
    await asyncio.gather(*(h.next_rendezvous() for h in hs))
    keeper = hs[0]._keeper
    assert keeper is not None
    store = MemoryStore(engine)
    await store.lease_revoke(keeper.id)
    event = await hs[0].wait_for_change()
    assert event.kind is RendezvousEventKind.ERROR
    assert isinstance(event.error, LeaseExpiredError)
    assert hs[0].error is event.error
    assert hs[0].status is RendezvousStatus.ERROR
    again = await hs[0].wait_for_change()  # the keeper is lost: at once
    assert (again.kind, again.error) == (RendezvousEventKind.ERROR, event.error)
    result = await hs[0].next_rendezvous()  # a new lease, the round again; the error is gone
    assert result.rank == 0
    assert hs[0]._keeper is not keeper
    assert hs[0].is_active
    for h in hs:
        await h.aclose()
    await store.aclose()


@virtual_test
async def test_static_shutdown_closes_the_run_and_its_own_store() -> None:
    engine = MemoryEngine()
    store = MemoryStore(engine)
    h = StaticRendezvousHandler(store, "job", 0, 1, local_addr="h", owns_store=True)
    await h.next_rendezvous()
    assert await h.num_nodes_waiting() == 0
    assert await h.shutdown() is True
    assert h.status is RendezvousStatus.CLOSED
    with pytest.raises(StoreClosedError):
        await store.get("x")  # the handler closed the store it owns
    observer = MemoryStore(engine)
    assert await observer.get(RunKeys("job").closed) is not None
    assert await observer.get(RunKeys("job").node(0, "rank0")) is None  # its lease revoked
    await h.aclose()  # again: nothing
    kept = StaticRendezvousHandler(observer, "job2", 0, 1, local_addr="h")
    await kept.aclose()
    assert await observer.get("x") is None  # a store it does not own stays open
    assert await kept.shutdown() is True  # closed already: nothing to close
    assert await observer.get(RunKeys("job2").closed) is None
    await observer.aclose()


@virtual_test
async def test_static_store_errors_become_connection_errors() -> None:
    store = MemoryStore()
    h = StaticRendezvousHandler(store, "job", 0, 1, local_addr="h")
    await store.aclose()
    with pytest.raises(RendezvousConnectionError, match=r"^next_rendezvous failed for run 'job': "):
        await h.next_rendezvous()
    assert isinstance(h.error, RendezvousConnectionError)
    with pytest.raises(RendezvousConnectionError, match=r"^is_closed failed for run 'job': "):
        await h.is_closed()
    with pytest.raises(RendezvousConnectionError, match=r"^set_closed failed for run 'job': "):
        await h.set_closed()
    assert await h.shutdown() is False


@virtual_test
async def test_static_defaults_and_edges_of_its_arguments() -> None:
    engine = MemoryEngine()
    alone = StaticRendezvousHandler(MemoryStore(engine), "job", 0, 2, local_addr="h")
    with pytest.raises(RendezvousTimeoutError, match=r"within join_timeout=600\.0s$"):
        await alone.next_rendezvous()
    assert asyncio.get_running_loop().time() == pytest.approx(600)  # the default join_timeout
    await alone.aclose()
    StaticRendezvousHandler(MemoryStore(), "job", 0, 1, join_timeout=0.5)  # any time > 0
    for ttl, error in ((0, ValueError), ("1", TypeError)):
        with pytest.raises(error, match=r"^lease_ttl must be a"):
            StaticRendezvousHandler(MemoryStore(), "job", 0, 1, lease_ttl=ttl)  # type: ignore[arg-type]


@virtual_test
async def test_static_timeout_message_waits_at_most_5s_for_the_missing_ranks() -> None:
    """At the join timeout the message lists the ranks not there, read once: a store that does
    not answer that read delays the timeout by 5 s at most (the list is then empty)."""
    slow = FaultInjectingStore(MemoryStore(MemoryEngine()))
    slow.hang("range")  # the registration and the watch do not range; only that read does
    h = StaticRendezvousHandler(slow, "job", 0, 2, local_addr="h", join_timeout=10)
    with pytest.raises(RendezvousTimeoutError) as caught:
        await asyncio.wait_for(h.next_rendezvous(), 60)
    assert str(caught.value) == (
        "static rendezvous 'job': ranks [] did not arrive within join_timeout=10.0s"
    )
    assert asyncio.get_running_loop().time() == pytest.approx(15)
    slow.release()
    await h.aclose()


@virtual_test
async def test_static_lease_is_renewed_at_the_given_interval() -> None:
    engine = MemoryEngine()
    stores = [FaultInjectingStore(MemoryStore(engine)) for _ in range(2)]
    hs = [
        StaticRendezvousHandler(store, "job", rank, 2, local_addr="h", lease_ttl=30.0,
                                keep_alive_interval=1.0 if rank == 0 else None)
        for rank, store in enumerate(stores)
    ]  # fmt: skip
    await asyncio.gather(*(h.next_rendezvous() for h in hs))
    before = [store.calls["lease_keep_alive"] for store in stores]
    await asyncio.sleep(30)
    renewals = [
        store.calls["lease_keep_alive"] - b for store, b in zip(stores, before, strict=True)
    ]
    assert 28 <= renewals[0] <= 31  # every second
    assert 2 <= renewals[1] <= 4  # the keeper's default: a third of the TTL
    for h in hs:
        await h.aclose()


@virtual_test
async def test_static_rejoin_after_the_round_returns_at_once() -> None:
    engine = MemoryEngine()
    hs = [_static(engine, rank) for rank in range(2)]
    first = await asyncio.gather(*(h.next_rendezvous() for h in hs))
    start = asyncio.get_running_loop().time()
    again = await hs[1].next_rendezvous()  # the round record is in the snapshot
    assert asyncio.get_running_loop().time() == start
    assert (again.round, again.rank, again.bootstrap_store_info) == (
        0, 1, first[1].bootstrap_store_info,
    )  # fmt: skip
    for h in hs:
        await h.aclose()


@pytest.mark.parametrize("which", ["round", "closed"])
def test_static_names_the_key_of_a_corrupt_record(which: str) -> None:
    async def body() -> None:
        engine = MemoryEngine()
        keys = RunKeys("job")
        key = keys.round if which == "round" else keys.closed
        await MemoryStore(engine).put(key, b"not json")
        h = _static(engine, 1)
        with pytest.raises(RendezvousError, match=f"^rendezvous state at {key!r} is not JSON"):
            await h.next_rendezvous()
        await h.aclose()
        if which == "closed":
            reader = _static(engine, 1)
            with pytest.raises(RendezvousError, match=f"^rendezvous state at {key!r} is not"):
                await reader.is_closed()
            await reader.aclose()

    run_virtual(body())


@virtual_test
async def test_static_rank_0_names_the_key_of_a_corrupt_close_record() -> None:
    # rank 0 reads the close record in its watch of the whole run (the other ranks in c/'s)
    engine = MemoryEngine()
    key = RunKeys("job").closed
    await MemoryStore(engine).put(key, b"not json")
    h = _static(engine, 0)
    with pytest.raises(RendezvousError, match=f"^rendezvous state at {key!r} is not JSON"):
        await h.next_rendezvous()
    await h.aclose()


@virtual_test
async def test_static_rank_0_arriving_last_still_watches_for_losses() -> None:
    # every other rank registered before rank 0: its snapshot completes the round at once,
    # and a rank lost after the round is still reported to it
    engine = MemoryEngine()
    hs = [_static(engine, rank) for rank in range(2)]
    waiting = asyncio.ensure_future(hs[1].next_rendezvous())
    await asyncio.sleep(1.0)  # (virtual time: rank 1 registered and waits for the round)
    await hs[0].next_rendezvous()
    await waiting
    await hs[1].aclose()
    event = await hs[0].wait_for_change()
    assert (event.kind, event.node_id) == (RendezvousEventKind.PARTICIPANT_LOST, "rank1")
    await hs[0].aclose()


@virtual_test
async def test_static_round_record_goes_with_rank_0s_lease() -> None:
    # a rank joining after rank 0 left must not find its old round (a master that is gone):
    # it waits for a new rank 0 instead
    engine = MemoryEngine()
    hs = [_static(engine, rank) for rank in range(2)]
    await asyncio.gather(*(h.next_rendezvous() for h in hs))
    for h in hs:
        await h.aclose()
    assert await MemoryStore(engine).get(RunKeys("job").round) is None
    late = _static(engine, 1, join_timeout=5.0)
    with pytest.raises(RendezvousTimeoutError):
        await late.next_rendezvous()
    await late.aclose()


@virtual_test
async def test_static_close_and_its_events_in_full() -> None:
    engine = MemoryEngine()
    hs = [_static(engine, rank) for rank in range(2)]
    assert await hs[0].is_closed() is False
    await asyncio.gather(*(h.next_rendezvous() for h in hs))
    store = MemoryStore(engine)
    waiting = asyncio.ensure_future(hs[0].wait_for_change())
    await asyncio.sleep(1)
    await hs[1].set_closed()
    assert hs[1].status is RendezvousStatus.CLOSED  # without reading it back
    kv = await store.get(RunKeys("job").closed)
    assert kv is not None
    assert await waiting == RendezvousEvent(RendezvousEventKind.CLOSED, 0, kv.mod_revision)
    assert await hs[0].wait_for_change() == RendezvousEvent(RendezvousEventKind.CLOSED, 0, 0)
    for h in hs:
        await h.aclose()
    # a lost lease: the error event, in full, then again at once
    hs = [_static(engine, rank, run_id="job2") for rank in range(2)]
    await asyncio.gather(*(h.next_rendezvous() for h in hs))
    keeper = hs[0]._keeper
    assert keeper is not None
    await store.lease_revoke(keeper.id)
    event = await hs[0].wait_for_change()
    assert event == RendezvousEvent(RendezvousEventKind.ERROR, 0, 0, error=event.error)
    assert event.error is not None
    again = await hs[0].wait_for_change()
    assert again == RendezvousEvent(RendezvousEventKind.ERROR, 0, 0, error=event.error)
    for h in hs:
        await h.aclose()
    await store.aclose()


@virtual_test
async def test_static_wait_for_change_names_itself_in_a_store_error() -> None:
    engine = MemoryEngine()
    store = MemoryStore(engine)
    hs = [StaticRendezvousHandler(store, "job", 0, 2, local_addr="h"), _static(engine, 1)]
    await asyncio.gather(*(h.next_rendezvous() for h in hs))
    await store.aclose()
    with pytest.raises(RendezvousConnectionError, match=r"^wait_for_change failed for run 'job'"):
        await hs[0].wait_for_change()
    for h in hs:
        await h.aclose()


# -- this host's address --------------------------------------------------------------------------


def test_the_lookup_thread_does_not_hold_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A DNS lookup that hangs must not keep the process from exiting: a daemon thread."""
    started, release = threading.Event(), threading.Event()
    seen: list[threading.Thread] = []

    def getfqdn() -> str:
        seen.append(threading.current_thread())
        started.set()
        release.wait(30)
        return "slow.example"

    monkeypatch.setattr(socket, "getfqdn", getfqdn)
    monkeypatch.setattr(_addr, "_lookup", None)
    lookup = _addr.prefetch_default_addr()
    try:
        assert _addr.prefetch_default_addr() is lookup  # once per process
        assert started.wait(30)
        assert seen[0].daemon
        assert seen[0].name == "aioelastic-getfqdn"
        assert not lookup.done()
    finally:
        release.set()
    assert lookup.result(30) == "slow.example"
    assert _addr.default_addr() == "slow.example"


def test_a_pending_lookup_is_awaited_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    pending: concurrent.futures.Future[str] = concurrent.futures.Future()
    monkeypatch.setattr(_addr, "_lookup", pending)

    async def body() -> str:
        waiter = asyncio.ensure_future(_addr.looked_up_default_addr())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        pending.set_result("later.example")
        return await waiter

    assert asyncio.run(body()) == "later.example"


def test_free_port_is_an_ephemeral_tcp_port() -> None:
    port = _addr.free_port()
    assert 1024 <= port < 65536
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))  # free for TCP right after


# -- the status snapshot's text -------------------------------------------------------------------


def _run_status(**changes: Any) -> RunStatus:
    base = RunStatus(
        run_id="job",
        revision=42,
        round=3,
        members=(
            MemberStatus(0, "node-a", True, 5.25, "10.0.0.1", False, 6.0),
            MemberStatus(1, "b", False, None, None, True),
        ),
        master_addr="10.0.0.1",
        master_port=29500,
        forming_round=4,
        driver="b",
        waiting=(NodeStatus("b", "10.0.0.2", 4.0, 40, True, 6.0),),
        standby=(),
        closed=False,
        closed_after_round=None,
        reopened=False,
        timers=(
            TimerStatus(7, "ckpt", None, 86400.25, -1.25, "t/7/ckpt"),
            TimerStatus("node-a:0", "train/step", 1234, 86401.0, 12.0, "t/x"),
        ),
        timers_prefix="t/",
    )
    return dataclasses.replace(base, **changes)


def test_status_text_of_a_run_with_everything() -> None:
    assert format_run_status(_run_status()).splitlines() == [
        "run job  (store revision 42)",
        "state: open",
        "round: 3  nodes 2  master 10.0.0.1:29500",
        "members:",
        "  RANK  NODE    STATE  LEASE LEFT  ADDR      REJOINED",
        "  0     node-a  alive  5.2s        10.0.0.1",
        "  1     b       gone   -           -         yes",
        "forming round: 4  driver b",
        "waiting:",
        "  NODE  LEASE LEFT  ADDR      MEMBER",
        "  b     4.0s        10.0.0.2  yes",
        "standby: none",
        "timers (2 under t/):",
        "  WORKER    SCOPE       PID   DEADLINE (UTC)         TIME LEFT",
        "  7         ckpt        -     1970-01-02 00:00:00.2  overdue 1.2s",
        "  node-a:0  train/step  1234  1970-01-02 00:00:01.0  12.0s",
    ]


def test_status_text_of_a_new_closed_or_reopened_run() -> None:
    new = _run_status(
        round=None,
        members=(),
        driver=None,
        waiting=(),
        timers=(),
        closed=True,
        closed_after_round=-1,
    )
    assert format_run_status(new).splitlines() == [
        "run job  (store revision 42)",
        "state: closed after round -1",
        "round: none completed yet",
        "forming round: 4  driver none",
        "waiting: none",
        "standby: none",
        "timers: none under t/",
    ]
    standby = NodeStatus("c", "h", None, 41, False)
    reopened = _run_status(
        members=(), waiting=(), standby=(standby,), reopened=True, closed_after_round=2
    )
    lines = format_run_status(reopened).splitlines()
    assert lines[1] == "state: open (reopened; closed after round 2 before)"
    assert lines[3:10] == [
        "members:",
        "  RANK  NODE  STATE  LEASE LEFT  ADDR  REJOINED",
        "forming round: 4  driver b",
        "waiting: none",
        "standby:",
        "  NODE  LEASE LEFT  ADDR  MEMBER",
        "  c     -           h",
    ]


def test_status_json_is_one_sorted_line() -> None:
    text = format_run_status(_run_status(), as_json=True)
    assert "\n" not in text
    data = json.loads(text)
    assert list(data) == sorted(data)
    assert data["members"][0] == {
        "rank": 0,
        "node_id": "node-a",
        "alive": True,
        "lease_remaining": 5.25,
        "addr": "10.0.0.1",
        "rejoined": False,
        "lease_ttl": 6.0,
    }
    assert data["timers"][1]["worker_id"] == "node-a:0"


# -- the status snapshot's reads ------------------------------------------------------------------


@virtual_test
async def test_status_reads_each_record_of_the_run() -> None:
    store = MemoryStore()
    keys = RunKeys("job")
    lease = await store.lease_grant(10.0)
    record = RoundRecord(2, 2, "m", 9, chunks=0)
    await store.put(keys.round, record.encode())
    await store.put(keys.node(2, "rank0"), NodeRecord("rank0", "a0", 1).encode(), lease=lease.id)
    await store.put(keys.node(2, "rank1"), NodeRecord("rank1", "a1", 1).encode())  # no lease
    await store.put(keys.node(1, "old"), NodeRecord("old", "o", 1).encode())  # an old round's
    await store.put(keys.node(3, "late"), NodeRecord("late", "l", 1).encode(), lease=lease.id)
    await store.put(keys.node(3, "early"), NodeRecord("early", "e", 1).encode())
    await store.put(keys.driver, DriverRecord(2, "stale").encode())  # not the forming round's
    await store.put(keys.closed, ClosedRecord(1, reopened=True).encode())
    await asyncio.sleep(4)
    status = await read_run_status(store, "job")
    assert (status.run_id, status.round, status.forming_round) == ("job", 2, 3)
    assert (status.master_addr, status.master_port, status.driver) == ("m", 9, None)
    assert (status.closed, status.closed_after_round, status.reopened) == (False, 1, True)
    assert status.members == (
        MemberStatus(0, "rank0", True, 6.0, "a0", False, 10.0),
        MemberStatus(1, "rank1", True, None, "a1", False, None),
    )
    assert status.waiting == ()  # the round is intact: the registered nodes stand by
    assert [(n.node_id, n.lease_remaining, n.lease_ttl, n.member) for n in status.standby] == [
        ("late", 6.0, 10.0, False),
        ("early", None, None, False),
    ]  # in registration order
    assert status.standby[0].registered_revision < status.standby[1].registered_revision
    assert status.revision == (await store.range(keys.root)).revision
    # a member re-registers: the round is no longer intact, the others wait
    await store.put(keys.node(3, "rank1"), NodeRecord("rank1", "a1", 1).encode())
    await store.put(keys.driver, DriverRecord(3, "late").encode())
    await store.put(keys.closed, ClosedRecord(2).encode())
    status = await read_run_status(store, "job")
    assert status.members[1].rejoined
    assert not status.members[0].rejoined
    assert status.standby == ()
    assert [n.node_id for n in status.waiting] == ["late", "early", "rank1"]
    assert status.waiting[2].member
    assert (status.driver, status.closed, status.closed_after_round) == ("late", True, 2)
    assert status.reopened is False
    # a member gone, its lease revoked: gone, and its candidates wait
    await store.delete(keys.node(3, "rank1"))
    await store.lease_revoke(lease.id)
    status = await read_run_status(store, "job")
    assert status.members[0] == MemberStatus(0, "rank0", False, None, None, False, None)
    assert [n.node_id for n in status.waiting] == ["early"]
    await store.aclose()


@virtual_test
async def test_status_of_a_run_with_no_round_yet() -> None:
    store = MemoryStore()
    keys = RunKeys("job")
    await store.put(keys.node(0, "b"), NodeRecord("b", "hb", 1).encode())
    await store.put(keys.node(0, "a"), NodeRecord("a", "ha", 1).encode())
    await store.put(keys.driver, DriverRecord(0, "a").encode())
    status = await read_run_status(store, "job")
    assert (status.round, status.members, status.master_addr, status.master_port) == (
        None,
        (),
        None,
        None,
    )
    assert (status.forming_round, status.driver, status.standby) == (0, "a", ())
    assert [n.node_id for n in status.waiting] == ["b", "a"]
    assert (status.closed, status.closed_after_round, status.reopened) == (False, None, False)
    await store.aclose()


@virtual_test
async def test_status_asks_for_each_lease_once() -> None:
    store = MemoryStore()
    asked: list[int] = []
    ask = store.lease_time_to_live

    async def counted(lease: int) -> Any:
        asked.append(lease)
        return await ask(lease)

    store.lease_time_to_live = counted  # type: ignore[method-assign,assignment]
    keys = RunKeys("job")
    lease = await store.lease_grant(10.0)
    await store.put(keys.round, RoundRecord(0, 1, "m", 9, chunks=0).encode())
    await store.put(keys.node(0, "rank0"), NodeRecord("rank0", "a", 1).encode(), lease=lease.id)
    await store.put(keys.node(1, "rank0"), NodeRecord("rank0", "a", 1).encode(), lease=lease.id)
    status = await read_run_status(store, "job")
    assert status.members[0].rejoined
    assert status.waiting[0].lease_remaining == 10.0
    assert asked == [lease.id]
    await store.aclose()


@virtual_test
async def test_status_lists_only_armed_timers_of_the_prefix() -> None:
    store = MemoryStore()
    keys = RunKeys("job")
    await store.put(keys.node(0, "a"), NodeRecord("a", "ha", 1).encode())
    prefix = "tp/"
    soon = TimerRequest("w/1", "s 1", time.time() + 50, pid=5)
    late = TimerRequest(2, "s", time.time() + 90)
    await store.put(timer_key(prefix, "2", "s"), late.to_json())
    await store.put(timer_key(prefix, "w/1", "s 1"), soon.to_json())
    await store.put(prefix + "junk", b"not json")
    await store.put(prefix + "wrong/key", soon.to_json())  # not where its timer lives
    unarmed = TimerRequest(3, "s", None)
    await store.put(timer_key(prefix, "3", "s"), unarmed.to_json())
    status = await read_run_status(store, "job", timers_prefix=prefix)
    assert [(t.worker_id, t.scope_id, t.pid, t.key) for t in status.timers] == [
        ("w/1", "s 1", 5, timer_key(prefix, "w/1", "s 1")),
        (2, "s", None, timer_key(prefix, "2", "s")),
    ]
    assert status.timers[0].expiration_time == soon.expiration_time
    assert 45 < status.timers[0].time_left <= 50
    assert status.timers_prefix == prefix
    for bad in ("", 3):
        with pytest.raises(ValueError, match=r"^timers_prefix must be a non-empty str, got "):
            await read_run_status(store, "job", timers_prefix=bad)  # type: ignore[arg-type]
    with pytest.raises(RendezvousNotFoundError, match=r"^no rendezvous state for run id 'x' in"):
        await read_run_status(store, "x")
    await store.aclose()


@virtual_test
async def test_status_watch_yields_once_per_burst_and_waits_for_a_vanished_run() -> None:
    store = MemoryStore()
    keys = RunKeys("job")
    with pytest.raises(RendezvousNotFoundError, match=r"^no rendezvous state for run id 'job'"):
        await anext(watch_run_status(store, "job"))
    await store.put(keys.node(0, "a"), NodeRecord("a", "ha", 1).encode())
    snapshots = watch_run_status(store, "job", timers_prefix="tp/")
    first = await anext(snapshots)
    assert [n.node_id for n in first.waiting] == ["a"]
    for name in ("b", "c", "d"):  # a burst: one snapshot covers it
        await store.put(keys.node(0, name), NodeRecord(name, "h", 1).encode())
    burst = await anext(snapshots)
    assert [n.node_id for n in burst.waiting] == ["a", "b", "c", "d"]
    revision = await store.put(keys.node(0, "e"), NodeRecord("e", "h", 1).encode())
    after = await anext(snapshots)
    assert after.revision == revision
    # the run's records vanish: nothing to yield, even when its timers change
    await store.delete_prefix(keys.root)
    timer = TimerRequest(1, "s", time.time() + 60)
    await store.put(timer_key("tp/", "1", "s"), timer.to_json())
    nothing = asyncio.ensure_future(anext(snapshots))
    await asyncio.sleep(10)
    assert not nothing.done()
    back = await store.put(keys.node(0, "f"), NodeRecord("f", "h", 1).encode())
    again = await nothing
    assert [n.node_id for n in again.waiting] == ["f"]
    assert [t.scope_id for t in again.timers] == ["s"]
    assert again.revision == back
    await snapshots.aclose()
    await store.aclose()


@virtual_test
async def test_status_watch_reads_afresh_after_a_compaction() -> None:
    """The history the watch would resume from was compacted while nobody read: the next
    snapshot is read afresh and yielded, and the watch goes on from there."""
    store = MemoryStore()
    keys = RunKeys("job")
    await store.put(keys.node(0, "a"), NodeRecord("a", "ha", 1).encode())
    snapshots = watch_run_status(store, "job", timers_prefix="tp/")
    await anext(snapshots)
    await store.put(keys.node(0, "b"), NodeRecord("b", "h", 1).encode())
    revision = await store.put(keys.node(0, "c"), NodeRecord("c", "h", 1).encode())
    await store.compact(revision)
    fresh = await asyncio.wait_for(anext(snapshots), 5)
    assert ([n.node_id for n in fresh.waiting], fresh.revision) == (["a", "b", "c"], revision)
    assert [n.addr for n in fresh.waiting] == ["ha", "h", "h"]
    timer = TimerRequest(1, "s", time.time() + 60)
    await store.put(timer_key("tp/", "1", "s"), timer.to_json())
    later = await asyncio.wait_for(anext(snapshots), 5)
    assert [t.scope_id for t in later.timers] == ["s"]
    await store.put(keys.node(0, "d"), NodeRecord("d", "h", 1).encode())
    await store.put(keys.node(0, "e"), NodeRecord("e", "h", 1).encode())
    last = await asyncio.wait_for(anext(snapshots), 5)
    assert [n.node_id for n in last.waiting] == ["a", "b", "c", "d", "e"]
    nothing = asyncio.ensure_future(anext(snapshots))  # d and e were one burst: one snapshot
    await asyncio.sleep(10)
    assert not nothing.done()
    nothing.cancel()
    await asyncio.wait([nothing])
    await snapshots.aclose()
    await store.aclose()


@pytest.mark.parametrize("which", ["driver", "closed"])
def test_status_names_the_key_of_a_corrupt_record(which: str) -> None:
    async def body() -> None:
        store = MemoryStore()
        key = getattr(RunKeys("job"), which)
        await store.put(key, b"not json")
        with pytest.raises(RendezvousError, match=f"^rendezvous state at {key!r} is not JSON"):
            await read_run_status(store, "job")
        await store.aclose()

    run_virtual(body())


def test_status_text_of_a_timer_at_its_deadline_and_tenths() -> None:
    timers = (
        TimerStatus(1, "now", None, 0.95, 0.0, "t/1/now"),
        TimerStatus(2, "soon", None, 1.0, 0.5, "t/2/soon"),
    )
    lines = format_run_status(_run_status(timers=timers)).splitlines()
    assert lines[-2:] == [
        "  1       now    -    1970-01-01 00:00:00.9  0.0s",  # due now, not overdue; tenths cut
        "  2       soon   -    1970-01-01 00:00:01.0  0.5s",
    ]


# -- the built-in backends' creators --------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "endpoint", "config", "url"),
    [
        ("c10d", "h", {"token_file": "/t"}, "http://h:29400"),
        ("https", "h", {"token_file": "/t"}, "https://h:29400"),
        ("etcd", "h", {"username": "u", "password_file": "/p"}, "etcd://h:2379"),
        ("c10d", "", {"store_url": "etcds://h:1", "password_file": "/p"}, "etcds://h:1"),
        ("memory", "m", {}, "memory://m"),
    ],
)
def test_open_passes_the_credentials_of_its_store(
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
    endpoint: str,
    config: dict[str, str],
    url: str,
) -> None:
    opened: list[tuple[str, dict[str, str]]] = []

    async def open_store(url: str, **options: str) -> Any:
        opened.append((url, options))
        return None

    monkeypatch.setattr(_backends, "open_store", open_store)
    params = RendezvousParameters(backend, endpoint, "job", 1, 1, **config)
    asyncio.run(_backends._open(params))
    assert opened == [(url, {k: v for k, v in config.items() if k != "store_url"})]


def test_bad_values_are_named_in_the_error() -> None:
    assert _bad("node_id", _backends._dynamic_options, _params(node_id=3)).value == 3
    assert _bad("rank", _backends._static_options, _params("static", rank="5")).value == 5
    assert _bad("rdzv_backend", _backends.check_params, _params("nope")).value == "nope"
    assert _bad("endpoint", _backends._host_port, "[a]]", 1).expected == (
        "host[:port] or [ipv6]:port"
    )


@pytest.mark.parametrize("backend", ["memory", "c10d", "static"])
def test_created_handlers_report_their_backend_and_own_their_store(backend: str) -> None:
    async def body() -> None:
        config: dict[str, Any] = {"store_url": "memory://mutants-own", "last_call_timeout": "0"}
        if backend == "static":
            config["rank"] = "0"
        params = RendezvousParameters(backend, "", "job", 1, 1, local_addr="h", **config)
        handler = await create_handler(params)
        assert handler.get_backend() == backend
        await handler.next_rendezvous()
        store = handler._store  # type: ignore[attr-defined]
        await handler.aclose()
        with pytest.raises(StoreClosedError):
            await store.get("x")

    run_virtual(body())


def test_a_static_handler_with_an_address_looks_nothing_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    looked_up: list[str] = []

    def getfqdn() -> str:
        looked_up.append("getfqdn")
        return "node.example"

    monkeypatch.setattr(socket, "getfqdn", getfqdn)
    monkeypatch.setattr(_addr, "_lookup", None)

    async def body(**config: str) -> str:
        params = RendezvousParameters("static", "", "job", 1, 1, rank="0", **config)
        handler = await create_handler(params)
        result = await handler.next_rendezvous()
        await handler.aclose()
        return result.bootstrap_store_info.master_addr

    assert asyncio.run(body(master_addr="m")) == "m"
    assert looked_up == []
    params = RendezvousParameters("static", "", "job", 1, 1, local_addr="l", rank="0")
    handler = asyncio.run(create_handler(params))
    asyncio.run(handler.aclose())
    assert looked_up == []
    assert asyncio.run(body()) == "node.example"
    assert looked_up == ["getfqdn"]


def test_register_builtin_backends_once(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = RendezvousHandlerRegistry()
    monkeypatch.setattr(_backends, "handler_registry", registry)
    monkeypatch.setattr(_backends, "_registered", False)
    _backends.register_builtin_backends()
    assert registry.backends() == ["c10d", "etcd", "http", "https", "memory", "static"]
    creators = registry._creators
    assert {name for name, c in creators.items() if c is _backends._create_dynamic} == {
        "c10d",
        "etcd",
        "http",
        "https",
        "memory",
    }
    assert creators["static"] is _backends._create_static
    assert _backends._registered is True
    registry._creators.clear()
    _backends.register_builtin_backends()  # registered already: nothing done
    assert registry.backends() == []


def test_every_refused_value_is_in_its_error() -> None:
    error = _bad("keep_alive_max_attempt", _backends._lease, _params(keep_alive_max_attempt="-2"))
    assert error.value == -2
    with pytest.raises(ConfigError) as caught:
        asyncio.run(_backends._open(_params("memory", token_file="/t")))
    assert caught.value.value == "/t"
    assert _bad("store_url", store_url_for, _params(store_url="u:pw@h")).value == "u:***@h"


@pytest.mark.parametrize(
    ("endpoint", "flag"),
    [
        ("http://127.0.0.1:1", "--token-file"),
        ("https://127.0.0.1:1", "--token-file"),
        ("etcd://u@127.0.0.1:1", "--password-file"),
        ("etcds://u@127.0.0.1:1", "--password-file"),
    ],
)
def test_status_passes_a_secret_file_to_its_store(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, endpoint: str, flag: str
) -> None:
    missing = tmp_path / "missing"
    code, out, err = _status(
        capsys, "--endpoint", endpoint, "--run-id", "job", flag, str(missing), "--timeout", "5"
    )
    assert (code, out) == (2, "")
    assert "applies to" not in err
    assert str(missing) in err  # the store read the file it was given


# -- the join path (dynamic): its driver claim --------------------------------------------------


def _dynamic(engine: MemoryEngine, n: int, nodes: int) -> list[DynamicRendezvousHandler]:
    return [
        DynamicRendezvousHandler(
            MemoryStore(engine), "job", nodes, nodes, lease_ttl=6.0, join_timeout=100.0
        )
        for _ in range(n)
    ]


@virtual_test
async def test_a_join_interrupted_after_its_claim_drives_again() -> None:
    """A join cancelled while it drives (it claimed ``c/driver`` with its registration) and
    started again with the same lease still gets the round formed: the others' joins complete
    at once, not at ``join_timeout``."""
    engine = MemoryEngine()
    first, other = _dynamic(engine, 2, 2)
    joining = asyncio.ensure_future(first.next_rendezvous())
    await asyncio.sleep(1)
    driver = await MemoryStore(engine).get(RunKeys("job").driver)
    assert driver is not None
    assert DriverRecord.decode(driver.key, driver.value).node_id == first.node_id
    joining.cancel()
    await asyncio.wait([joining])
    again = asyncio.ensure_future(first.next_rendezvous())
    await asyncio.sleep(1)
    start = asyncio.get_running_loop().time()
    results = await asyncio.gather(again, other.next_rendezvous())
    assert asyncio.get_running_loop().time() == start
    assert sorted(r.node_id for r in results) == sorted((first.node_id, other.node_id))
    assert {r.round for r in results} == {0}
    for h in (first, other):
        await h.aclose()


@virtual_test
async def test_a_run_closed_before_any_round_says_so() -> None:
    """The close record of a run closed before any round completed is after round -1 (its
    members, of no round, are all of the closed generation), as the status shows it."""
    engine = MemoryEngine()
    (h,) = _dynamic(engine, 1, 2)
    await h.set_closed()
    store = MemoryStore(engine)
    kv = await store.get(RunKeys("job").closed)
    assert kv is not None
    assert ClosedRecord.decode(kv.key, kv.value) == ClosedRecord(-1)
    status = await read_run_status(store, "job")
    assert (status.closed, status.closed_after_round) == (True, -1)
    await h.aclose()
    await store.aclose()
