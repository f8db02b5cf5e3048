"""``EtcdServer``: the members' options, addresses and lifecycle, composed of the package's
rooms (the binary, the data directory, each member's process, its command line, the probes)."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from anyio.abc import AsyncResource

from ._binary import find_etcd_binary
from ._clients import member_client, open_server_store, store_options
from ._command import etcd_command
from ._datadir import open_root, remove_root
from ._member import Member, free_ports, wait_process
from ._probes import PortTaken, enable_auth, find_leader, wait_ready

if TYPE_CHECKING:
    from .._etcd.client import EtcdClient
    from ..store import Store

__all__ = ["EtcdServer"]

_Path = str | os.PathLike[str]


def _check_options(
    members: object,
    auth: object,
    tls: tuple[_Path | None, _Path | None, _Path | None],
    client: tuple[_Path | None, _Path | None],
    client_cert_auth: bool,
) -> None:
    """Refuse bad options with the reason (``tls``: cert, key, CA; ``client``: cert, key)."""
    if isinstance(members, bool) or not isinstance(members, int) or members < 1:
        raise ValueError(f"members must be an int >= 1, got {members!r}")
    if auth is not None and (
        not isinstance(auth, tuple)
        or len(auth) != 2
        or not all(isinstance(a, str) and a for a in auth)
    ):
        shown = type(auth).__name__ if not isinstance(auth, tuple) else f"{len(auth)} items"
        raise ValueError(f"auth must be a (user, password) pair of non-empty str, got {shown}")
    (tls_cert, tls_key, tls_ca), (client_cert, client_key) = tls, client
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("tls_cert and tls_key must be given together")
    if (client_cert is None) != (client_key is None):
        raise ValueError("client_cert and client_key must be given together")
    if client_cert_auth and (tls_cert is None or tls_ca is None or client_cert is None):
        raise ValueError("client_cert_auth needs tls_cert/tls_key, tls_ca and client_cert/key")


def _fspath(path: _Path | None) -> str | None:
    return os.fspath(path) if path is not None else None


class EtcdServer(AsyncResource):
    """A real etcd: one member, or a cluster of ``members`` on loopback.

    ``async with EtcdServer() as etcd: store = await etcd.open_store("run-1")``.

    Options: ``binary`` (default: :func:`find_etcd_binary`); ``data_dir`` (kept on close; default a
    temporary directory removed on close); ``auth=("root", "pw")`` creates that user with the root
    role (and the ``root`` user), then turns auth on; ``metrics=True`` serves Prometheus metrics
    (``metrics_urls``); ``log_file`` appends the members' logs there (``log_level``, default
    ``error``); ``fast_election`` (default: on for a single member) uses 10 ms heartbeats and
    50 ms elections so a member is ready in well under a second; ``unsafe_no_fsync`` (default on:
    throwaway data); ``extra_args`` go to every member.

    TLS on the client port: ``tls_cert``/``tls_key`` (the server certificate, which must name the
    host, e.g. ``IP:127.0.0.1``), ``tls_ca`` (the CA that signed it; clients verify with it);
    ``client_cert_auth=True`` also demands client certificates signed by ``tls_ca``, and
    ``client_cert``/``client_key`` is the one the server's own connections and
    :meth:`store_options` use. ``url`` is then ``etcds://...``.
    """

    def __init__(
        self,
        members: int = 1,
        *,
        binary: _Path | None = None,
        data_dir: _Path | None = None,
        auth: tuple[str, str] | None = None,
        metrics: bool = False,
        log_file: _Path | None = None,
        log_level: str = "error",
        fast_election: bool | None = None,
        unsafe_no_fsync: bool = True,
        host: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
        name: str = "aioelastic",
        tls_cert: _Path | None = None,
        tls_key: _Path | None = None,
        tls_ca: _Path | None = None,
        client_cert_auth: bool = False,
        client_cert: _Path | None = None,
        client_key: _Path | None = None,
    ) -> None:
        tls, client = (tls_cert, tls_key, tls_ca), (client_cert, client_key)
        _check_options(members, auth, tls, client, client_cert_auth)
        self.members = members
        self._binary = _fspath(binary)
        self._given_data_dir = Path(data_dir) if data_dir is not None else None
        self.auth = auth
        self.metrics = bool(metrics)
        self.log_file = Path(log_file) if log_file is not None else None
        self.log_level = log_level
        self.fast_election = members == 1 if fast_election is None else bool(fast_election)
        self.unsafe_no_fsync = unsafe_no_fsync
        self.host = host
        self.extra_args = tuple(extra_args)
        self.name = name
        self.tls_cert, self.tls_key, self.tls_ca = map(_fspath, tls)
        self.client_cert_auth = client_cert_auth
        self.client_cert, self.client_key = map(_fspath, client)
        self._token = f"{name}-{uuid.uuid4().hex[:12]}"
        self._members: list[Member] = []
        self._root: Path | None = None
        self._owns_root = False
        self._started = False

    def __repr__(self) -> str:
        state = ",".join(self.endpoints) if self._started else "not started"
        return f"<EtcdServer members={self.members} {state}>"

    # -- addresses

    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeError("the etcd server has not been started (await server.start())")

    @property
    def endpoints(self) -> list[str]:
        """``host:port`` of every member's client port."""
        self._require_started()
        return [self._endpoint(m) for m in self._members]

    @property
    def tls(self) -> bool:
        """Whether the client port speaks TLS."""
        return self.tls_cert is not None

    @property
    def client_urls(self) -> list[str]:
        """``http(s)://host:port`` of every member (what ``etcdctl --endpoints`` takes)."""
        scheme = "https" if self.tls else "http"
        return [f"{scheme}://{e}" for e in self.endpoints]

    @property
    def url(self) -> str:
        """The store URL for every member: ``etcd://host:port,host:port...`` (``etcds://``)."""
        return ("etcds://" if self.tls else "etcd://") + ",".join(self.endpoints)

    @property
    def metrics_urls(self) -> list[str]:
        """``http://host:port/metrics`` of every member (needs ``metrics=True``)."""
        self._require_started()
        if not self.metrics:
            raise RuntimeError("metrics were not enabled (EtcdServer(metrics=True))")
        return [f"http://{self._host_literal}:{m.metrics_port}/metrics" for m in self._members]

    @property
    def pids(self) -> list[int | None]:
        """The process id of every member (None for one that is not running), e.g. to read its
        CPU time and memory from ``/proc``."""
        self._require_started()
        return [m.process.pid if m.running and m.process else None for m in self._members]

    @property
    def data_dir(self) -> Path:
        self._require_started()
        assert self._root is not None
        return self._root

    @property
    def _host_literal(self) -> str:
        return f"[{self.host}]" if ":" in self.host else self.host

    def _endpoint(self, m: Member) -> str:
        return f"{self._host_literal}:{m.client_port}"

    def store_options(self) -> dict[str, Any]:
        """Keyword arguments for ``open_store(server.url, ...)``: credentials and TLS files."""
        return store_options(self)

    def _client(self, endpoints: Sequence[str], timeout: float, **options: Any) -> EtcdClient:
        return member_client(self, endpoints, timeout, **options)

    def _credentials(self) -> dict[str, str]:
        if self.auth is None:
            return {}
        return {"username": self.auth[0], "password": self.auth[1]}

    async def open_store(self, run_id: str | None = None, **options: Any) -> Store:
        """An etcd store on this server (credentials filled in), namespaced to ``run_id``.

        With ``run_id`` the store's keys live under ``/aioelastic/<run_id>/``; closing the returned
        store closes its connection.
        """
        self._require_started()
        return open_server_store(self, run_id, options)

    # -- lifecycle

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def start(self, timeout: float = 60.0) -> None:
        """Start every member and wait until the cluster serves linearizable reads."""
        if self._started:
            raise RuntimeError("the etcd server is already started")
        self._binary = self._binary or find_etcd_binary()
        self._root, self._owns_root = open_root(self._given_data_dir)
        self._members = [
            Member(
                i,
                f"{self.name}{i}",
                self._root / f"member-{i}",
                self.log_file or self._root / f"member-{i}.log",
            )
            for i in range(self.members)
        ]
        try:
            await self._start_members(timeout)
            if self.auth is not None:
                client = self._client(self.endpoints, 10.0)
                try:
                    await enable_auth(client, self.auth)
                finally:
                    await client.aclose()
        except BaseException:
            await self.aclose()
            raise

    async def _start_members(self, timeout: float, tries: int = 5) -> None:
        """Start the members on free ports; on others if one was taken before etcd bound it."""
        for attempt in range(tries):
            ports = free_ports(self.host, 3 * self.members)
            for m in self._members:
                m.client_port, m.peer_port, m.metrics_port = ports[3 * m.index : 3 * m.index + 3]
            for m in self._members:
                self._spawn(m)
            self._started = True
            try:
                await self._wait_ready(self._members, timeout)
                return
            except PortTaken:
                await self._terminate_all()
                self._started = False
                if attempt == tries - 1:
                    raise RuntimeError(
                        f"etcd could not bind free ports after {tries} tries"
                    ) from None
                for m in self._members:
                    remove_root(m.data_dir)

    def _spawn(self, m: Member) -> None:
        assert self._binary is not None
        m.spawn(etcd_command(self, m, self._members, binary=self._binary, token=self._token))

    async def _wait_ready(self, members: Sequence[Member], timeout: float) -> None:
        await wait_ready(members, self._endpoint, self._client, timeout)

    async def aclose(self) -> None:
        """Stop every member and remove a temporary data dir (what ``async with`` does on exit).

        Members with a data dir of the caller's get SIGTERM (SIGKILL after 10 s) so their data
        is consistent; throwaway members are killed at once (a cluster's graceful shutdown can
        take seconds while members wait for peers that are already gone).
        """
        if self._owns_root:
            await self.kill()
        else:
            await self._terminate_all()
        self._started = False
        if self._owns_root and self._root is not None:
            remove_root(self._root)
            self._root = None
            self._owns_root = False

    async def stop(self) -> None:
        """:meth:`aclose` under the name of torch's ``EtcdServer.stop``, for code written for it."""
        await self.aclose()

    async def _terminate_all(self) -> None:
        await asyncio.gather(*(m.terminate(signal.SIGTERM) for m in self._members))

    async def join(self) -> None:
        """Wait until every member has exited (killed, crashed or stopped)."""
        self._require_started()
        await asyncio.gather(*(wait_process(m.process) for m in self._members if m.process))

    # -- faults

    def _member(self, index: int) -> Member:
        self._require_started()
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"member index must be an int, got {type(index).__name__}")
        if not 0 <= index < len(self._members):
            raise ValueError(f"member index must be in 0..{len(self._members) - 1}, got {index}")
        return self._members[index]

    def is_running(self, index: int) -> bool:
        """Whether member ``index`` is running."""
        return self._member(index).running

    async def kill_member(self, index: int) -> None:
        """SIGKILL member ``index`` (its data stays, for :meth:`restart_member`)."""
        await self._member(index).terminate(signal.SIGKILL)

    def freeze_member(self, index: int) -> None:
        """SIGSTOP member ``index``: it hangs with its connections open (a wedged process, a
        stuck disk), answering nothing; :meth:`thaw_member` resumes it."""
        self._member(index).freeze()

    def thaw_member(self, index: int) -> None:
        """SIGCONT member ``index`` after :meth:`freeze_member`."""
        self._member(index).thaw()

    async def restart_member(self, index: int, timeout: float = 60.0) -> None:
        """Start member ``index`` again on its ports and data; wait until it serves."""
        m = self._member(index)
        if m.running:
            raise RuntimeError(f"etcd member {index} is running; kill_member({index}) first")
        self._spawn(m)
        await self._wait_ready([m], timeout)

    async def kill(self) -> None:
        """SIGKILL every member (the whole cluster goes down; restart with :meth:`restart`)."""
        await asyncio.gather(*(m.terminate(signal.SIGKILL) for m in self._members))

    async def restart(self, timeout: float = 60.0) -> None:
        """Start every stopped member again and wait until they all serve."""
        stopped = [m for m in self._members if not m.running]
        for m in stopped:
            self._spawn(m)
        await self._wait_ready(stopped, timeout)

    async def leader(self, timeout: float = 30.0) -> int:
        """The index of the current leader (waits up to ``timeout`` while an election runs)."""
        self._require_started()
        clients = {
            m.index: self._client([self._endpoint(m)], 1.0, **self._credentials())
            for m in self._members
        }
        try:
            return await find_leader(self._members, clients, timeout)
        finally:
            for client in clients.values():
                await client.aclose()
