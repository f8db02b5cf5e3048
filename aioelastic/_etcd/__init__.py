"""Private: the thin etcd v3 gRPC client behind the etcd store backend and EtcdServer.

``protos/`` holds the minimal, renamed ``.proto`` files; ``_pb/`` the messages generated from them
(``python scripts/gen_etcd_protos.py``); ``_rpc.py`` the hand-written gRPC bindings;
``_endpoints.py`` the members' addresses and TLS; ``_channels.py`` and ``_liveness.py`` the
channels and the pings that find a hung member; ``_errors.py`` the error mapping; ``client.py``
the call, auth and stream layer. It imports nothing of aioelastic but ``errors``: the ``etcd``
command and ``EtcdServer`` live above it. Importing any of it needs grpcio and protobuf
(``pip install 'aioelastic[etcd]'``).
"""

import os

# gRPC's fork handlers crash a forking process now and then (SIGABRT or SIGSEGV in the child
# between fork and exec, "epoll_wait error: Bad file descriptor") while other threads are in
# gRPC: an agent spawning workers, EtcdServer spawning members, any subprocess. This client is
# grpc.aio, which does not support fork anyway, so fork support is off unless the user set it.
# Read once, when grpc is first imported: this package is imported before it.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
