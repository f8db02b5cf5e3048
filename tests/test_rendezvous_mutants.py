"""Tests for rendezvous/'s stable modules that mutation testing showed missing (issue 22).

Each pins a behaviour a small, realistic bug would break and no other test checked: see
docs/testing.md, "Mutation testing". Memory stores only; the CLI's ``main`` runs in this process
(test_status.py runs it as a child process, which mutmut does not see).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
from typing import Any

import pytest

from aioelastic.errors import ConfigError, RendezvousError
from aioelastic.rendezvous import (
    RendezvousHandler,
    RendezvousHandlerRegistry,
    RendezvousParameters,
    StaticRendezvousHandler,
    _backends,
    _status_cli,
    handler_registry,
    parse_rdzv_conf,
    store_url_for,
)
from aioelastic.store import MemoryStore


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
    assert _bad("k", params.get_as_int, "k").expected == "an integer"


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
