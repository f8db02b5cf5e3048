"""TLS and mutual TLS against a real etcd, with throwaway certificates made by openssl."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import anyio
import pytest

from aioelastic import StoreConnectionError, open_store
from aioelastic.etcd_server import EtcdServer
from aioelastic.testing.etcd import running_etcd

pytestmark = pytest.mark.etcd

ROOT = str(Path(__file__).resolve().parent.parent)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_ca(d: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-subj", f"/CN={name}", cwd=d,
    )  # fmt: skip


def _make_cert(d: Path, name: str, ca: str, usage: str) -> None:
    (d / f"{name}.ext").write_text(
        f"subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\n"
    )
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
        "-subj", f"/CN={name}", cwd=d,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "1", "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=d,
    )  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make test certificates")
    d = tmp_path_factory.mktemp("certs")
    _make_ca(d, "ca")
    _make_ca(d, "other-ca")
    _make_cert(d, "server", "ca", "serverAuth,clientAuth")
    _make_cert(d, "client", "ca", "clientAuth")
    return d


@pytest.fixture(scope="module")
def etcd_mtls(certs: Path) -> Iterator[EtcdServer]:
    with running_etcd(
        tls_cert=certs / "server.crt",
        tls_key=certs / "server.key",
        tls_ca=certs / "ca.crt",
        client_cert_auth=True,
        client_cert=certs / "client.crt",
        client_key=certs / "client.key",
    ) as server:
        yield server


@pytest.mark.asyncio
async def test_mutual_tls_round_trip(etcd_mtls: EtcdServer, certs: Path) -> None:
    assert etcd_mtls.url.startswith("etcds://")
    async with open_store(etcd_mtls.url, **etcd_mtls.store_options()) as store:
        async with store.watch("tls/") as events:
            revision = await store.put("tls/k", b"secret")
            with anyio.fail_after(10):
                event = await events.__anext__()
        assert (event.kv.value, event.revision) == (b"secret", revision)
    options = {
        "ca_file": str(certs / "ca.crt"),
        "cert_file": str(certs / "client.crt"),
        "key_file": str(certs / "client.key"),
    }
    query = "&".join(f"{k}={v}" for k, v in options.items())
    async with open_store(f"{etcd_mtls.url}?{query}") as store:
        assert (await store.get("tls/k")).value == b"secret"  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_tls_refusals_are_clear_errors(etcd_mtls: EtcdServer, certs: Path) -> None:
    plain = etcd_mtls.url.replace("etcds://", "etcd://")
    wrong_ca = {"ca_file": str(certs / "other-ca.crt")}
    no_client_cert = {"ca_file": str(certs / "ca.crt")}
    for url, options in ((plain, {}), (etcd_mtls.url, wrong_ca), (etcd_mtls.url, no_client_cert)):
        async with open_store(url, timeout=5, connect_timeout=2, **options) as store:
            with anyio.fail_after(20), pytest.raises(StoreConnectionError, match="connect"):
                await store.get("tls/k")


def test_server_tls_with_password_auth_and_no_client_certificates(certs: Path) -> None:
    """TLS on the client port with a CA to verify it by, but no client certificates: etcd must
    not be handed --trusted-ca-file (it would demand client certificates), and a client with the
    CA and a password gets in over an etcds:// URL."""

    with running_etcd(
        auth=("root", "pw"),
        tls_cert=certs / "server.crt",
        tls_key=certs / "server.key",
        tls_ca=certs / "ca.crt",
    ) as server:

        async def main() -> None:
            url = f"{server.url.replace('etcds://', 'etcds://root:pw@')}?ca_file={certs / 'ca.crt'}"
            async with open_store(url) as store:
                revision = await store.put("tls/server-only", b"v")
                assert (await store.get("tls/server-only")).mod_revision == revision  # type: ignore[union-attr]

        anyio.run(main)


@pytest.mark.asyncio
async def test_cli_serves_tls_and_prints_a_url_with_the_ca(certs: Path) -> None:
    """``aioelastic etcd --tls-cert ... --tls-ca ... --auth``: the printed store URL carries the
    CA file, so it can be pasted as it is (credentials apart)."""
    env = {**os.environ, "PYTHONPATH": ROOT, "AIOELASTIC_ETCD_PASSWORD": "pw"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aioelastic", "etcd", "--auth", "root",
        "--tls-cert", str(certs / "server.crt"), "--tls-key", str(certs / "server.key"),
        "--tls-ca", str(certs / "ca.crt"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    assert process.stdout is not None
    lines: list[str] = []
    try:
        with anyio.fail_after(60):
            while not lines or not lines[-1].startswith("press Ctrl-C"):
                line = (await process.stdout.readline()).decode()
                assert line, "".join(lines)
                lines.append(line.strip())
        url = next(line.split(": ", 1)[1] for line in lines if line.startswith("store url:"))
        assert url.startswith("etcds://")
        assert f"ca_file={quote(str(certs / 'ca.crt'), safe='')}" in url
        assert "tls: on" in lines
        async with open_store(url, username="root", password="pw") as store:
            await store.put("tls/from-cli", b"yes")
        process.send_signal(signal.SIGINT)
        with anyio.fail_after(30):
            await process.stdout.read()
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
