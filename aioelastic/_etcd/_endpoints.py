"""Where the members are and how to reach them: :class:`Endpoint` (``host:port``, parsed by
:func:`parse_endpoint`) and :class:`TLSConfig` (the CA and an optional client certificate)."""

from __future__ import annotations

from dataclasses import dataclass

from ._rpc import grpc

__all__ = ["DEFAULT_PORT", "Endpoint", "TLSConfig", "parse_endpoint"]

DEFAULT_PORT = 2379


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """TLS settings: a CA bundle (None: the system roots), an optional client certificate."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: str | None, what: str) -> bytes | None:
            if path is None:
                return None
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as exc:
                raise ValueError(f"{what}: cannot read {path!r}: {exc.strerror}") from None

        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file must be given together (client certificate)")
        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file, "ca_file"),
            private_key=read(self.key_file, "key_file"),
            certificate_chain=read(self.cert_file, "cert_file"),
        )


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One etcd member's client address."""

    host: str
    port: int

    @property
    def target(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return self.target


def parse_endpoint(text: str) -> Endpoint:
    """``host[:port]``, ``[v6]:port`` or ``http(s)://host:port`` (default port 2379)."""
    original = text
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"endpoint must look like host:port, got {original!r}")
    text = text.strip()
    for scheme in ("http://", "https://", "etcd://", "etcds://"):
        if text.startswith(scheme):
            text = text[len(scheme) :]
    text = text.rstrip("/")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"endpoint must look like [ipv6]:port, got {original!r}")
        port_text = rest[1:]
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    elif ":" in text:  # a bare IPv6 address
        host, port_text = text, ""
    else:
        host, port_text = text, ""
    if not host or "/" in host or "@" in host:
        raise ValueError(f"endpoint must look like host:port, got {original!r}")
    try:
        port = int(port_text) if port_text else DEFAULT_PORT
    except ValueError:
        raise ValueError(f"endpoint {original!r} has a bad port {port_text!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"endpoint {original!r} has a port out of range")
    return Endpoint(host, port)
