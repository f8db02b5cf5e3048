"""Helpers of the HTTP backend tests: ``aioelastic serve`` in a subprocess, a self-signed
certificate (a server on its own thread and loop is the public kit's ``ServerThread``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aioelastic.store import MemoryEngine
from aioelastic.testing.http import ServerThread

from . import ROOT

__all__ = [
    "ROOT",
    "ServerProcess",
    "ServerThread",
    "request_meter",
    "self_signed_cert",
    "server_state",
    "watcher_removed",
]


class ServerProcess:
    """``python -m aioelastic serve`` in a subprocess, with the URL it prints."""

    def __init__(self, *args: str, file_size_limit: int | None = None) -> None:
        self.args = args
        self.file_size_limit = file_size_limit  # RLIMIT_FSIZE (``ulimit -f``), SIGXFSZ ignored
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.banner: list[str] = []

    def start(self) -> ServerProcess:
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aioelastic", "serve", "--port", "0", *self.args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=None if self.file_size_limit is None else self._limit_file_size,
        )
        assert self.proc.stdout is not None
        for _ in range(50):
            line = self.proc.stdout.readline()
            if not line:
                break
            self.banner.append(line)
            match = re.search(r"listening on (\S+)", line)
            if match:
                self.url = match.group(1)
                return self
        self.kill()
        raise RuntimeError("server did not start: " + "".join(self.banner))

    def _limit_file_size(self) -> None:
        import resource

        # ignored, SIGXFSZ does not kill the server: a write past the limit fails with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        limit = self.file_size_limit
        assert limit is not None
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    def kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()

    def terminate(self, timeout: float = 20) -> tuple[int, str]:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()


@contextlib.contextmanager
def self_signed_cert(directory: Path) -> Iterator[tuple[Path, Path]]:
    """A certificate for 127.0.0.1/localhost and its key, made with ``cryptography``."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "aioelastic test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path = directory / "cert.pem"
    key_path = directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    yield cert_path, key_path


def watcher_removed(engine: MemoryEngine) -> asyncio.Event:
    """An event set once ``engine`` removes a watcher: a server learns of a client's close or
    hang-up asynchronously, and a test waits on this for it (the engine stays patched)."""
    removed = asyncio.Event()
    remove_watcher = engine.remove_watcher

    def remove(watcher: Any) -> None:
        remove_watcher(watcher)
        removed.set()

    engine.remove_watcher = remove  # type: ignore[method-assign]
    return removed


def server_state(server: Any) -> Any:
    """The running ``HttpStoreServer``'s ``ServerState`` (its answers, limits and metrics)."""
    from aioelastic.store.http._app import STATE

    app = server._app
    assert app is not None, "the server has not started"
    return app[STATE]


def request_meter(server: Any) -> Any:
    """The running server's request counters (``count(op, status)``; needs prometheus-client)."""
    from aioelastic.store.http._metrics import ServerMetrics

    metrics = server_state(server).metrics
    assert isinstance(metrics, ServerMetrics)
    return metrics.requests
