"""The command line that starts one member of an :class:`~aioelastic.etcd_server.EtcdServer`:
its URLs on loopback, the initial cluster, and the server's options as etcd's flags."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._member import Member

if TYPE_CHECKING:
    from ._server import EtcdServer

__all__ = ["etcd_command"]


def etcd_command(
    server: EtcdServer, m: Member, members: Sequence[Member], *, binary: str, token: str
) -> list[str]:
    """``binary`` and its flags for member ``m`` of ``members`` (``token``: the cluster's)."""
    h = f"[{server.host}]" if ":" in server.host else server.host
    client = "https" if server.tls else "http"
    cluster = ",".join(f"{x.name}=http://{h}:{x.peer_port}" for x in members)
    command = [
        binary,
        "--name", m.name,
        "--data-dir", str(m.data_dir),
        "--listen-client-urls", f"{client}://{h}:{m.client_port}",
        "--advertise-client-urls", f"{client}://{h}:{m.client_port}",
        "--listen-peer-urls", f"http://{h}:{m.peer_port}",
        "--initial-advertise-peer-urls", f"http://{h}:{m.peer_port}",
        "--initial-cluster", cluster,
        "--initial-cluster-state", "new",
        "--initial-cluster-token", token,
        "--log-level", server.log_level,
    ]  # fmt: skip
    if server.metrics:
        command += ["--listen-metrics-urls", f"http://{h}:{m.metrics_port}"]
    if server.tls_cert is not None and server.tls_key is not None:
        command += ["--cert-file", server.tls_cert, "--key-file", server.tls_key]
        # etcd turns on client-certificate auth whenever --trusted-ca-file is given, so the
        # CA goes to etcd only when client certificates are wanted; otherwise it is only what
        # clients verify the server with.
        if server.client_cert_auth:
            assert server.tls_ca is not None
            command += ["--trusted-ca-file", server.tls_ca, "--client-cert-auth"]
    if server.unsafe_no_fsync:
        command.append("--unsafe-no-fsync")
    if server.fast_election:
        command += ["--heartbeat-interval", "10", "--election-timeout", "50"]
    return command + list(server.extra_args)
