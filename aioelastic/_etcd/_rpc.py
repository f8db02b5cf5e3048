"""Hand-written gRPC bindings for the etcd calls we use, keeping etcd's wire paths.

Request and response types come from the service descriptors of our renamed protos, so the paths
stay ``/etcdserverpb.KV/Range`` (what etcd serves) while our descriptors live under a private
package that never clashes with another etcd client in the same process.
"""

from __future__ import annotations

from typing import Any

INSTALL_HINT = "the etcd backend needs grpcio and protobuf: pip install 'aioelastic[etcd]'"

try:
    import grpc
    import grpc.aio

    from ._pb import kv_pb2, rpc_pb2
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"{INSTALL_HINT} (missing: {exc.name or exc})") from exc

__all__ = ["INSTALL_HINT", "EtcdStub", "grpc", "kv_pb2", "rpc_pb2"]

_UNARY: dict[str, tuple[str, ...]] = {
    "KV": ("Range", "Put", "DeleteRange", "Txn", "Compact"),
    "Lease": ("LeaseGrant", "LeaseRevoke", "LeaseTimeToLive"),
    "Cluster": ("MemberList",),
    "Maintenance": ("Status",),
    "Auth": ("AuthEnable", "AuthStatus", "Authenticate", "UserAdd", "UserGrantRole", "RoleAdd"),
}
_STREAM: dict[str, tuple[str, ...]] = {"Watch": ("Watch",), "Lease": ("LeaseKeepAlive",)}


def _types(service: str, method: str) -> tuple[Any, Any]:
    desc = rpc_pb2.DESCRIPTOR.services_by_name[service].methods_by_name[method]
    return getattr(rpc_pb2, desc.input_type.name), getattr(rpc_pb2, desc.output_type.name)


class EtcdStub:
    """Callables for every etcd method we use, by method name, on one ``grpc.aio`` channel
    (each made on first use: a client uses a handful of the methods)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.methods = _Methods(channel)


_KINDS = {
    method: (kind, service)
    for kind, table in (("unary_unary", _UNARY), ("stream_stream", _STREAM))
    for service, methods in table.items()
    for method in methods
}


class _Methods(dict[str, Any]):
    """``method name -> multicallable`` of one channel, filled in on first use."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        super().__init__()
        self._channel = channel

    def __missing__(self, method: str) -> Any:
        kind, service = _KINDS[method]
        request, response = _types(service, method)
        callable_ = self[method] = getattr(self._channel, kind)(
            f"/etcdserverpb.{service}/{method}",
            request_serializer=request.SerializeToString,
            response_deserializer=response.FromString,
        )
        return callable_
