"""Shared set-up of the test suite (loaded by pytest before any test module).

The test process forks a great deal (servers, agents, etcd members, workers) with gRPC loaded by
the etcd tests; gRPC's fork handlers crash such a child now and then ("epoll_wait error: Bad file
descriptor", SIGABRT before exec). aioelastic's etcd client turns fork support off when it is
imported first (aioelastic/_etcd/__init__.py); test modules that import grpc themselves come
first in some orders, so it is set here too, before any of them.
"""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
