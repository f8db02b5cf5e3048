"""Private: the thin etcd v3 gRPC client behind the etcd store backend and EtcdServer.

``protos/`` holds the minimal, renamed ``.proto`` files; ``_pb/`` the messages generated from them
(``python scripts/gen_etcd_protos.py``); ``_rpc.py`` the hand-written gRPC bindings; ``client.py``
the channel, call, error-mapping and auth layer. Importing any of it needs grpcio and protobuf
(``pip install 'aioelastic[etcd]'``).
"""
