"""Tests for rendezvous/'s stable modules that mutation testing showed missing (issue 22).

Each pins a behaviour a small, realistic bug would break and no other test checked: see
docs/testing.md, "Mutation testing". Memory stores only; the CLI's ``main`` runs in this process
(test_status.py runs it as a child process, which mutmut does not see).
"""

from __future__ import annotations

import argparse

import pytest

from aioelastic.rendezvous import _status_cli


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
