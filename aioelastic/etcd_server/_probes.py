"""The calls the launcher makes to its members: whether one serves yet, turning auth on, and
which member leads. (grpc is imported only when they run: it is the etcd extra's.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import StoreError
from ._member import Member

if TYPE_CHECKING:
    from .._etcd.client import EtcdClient

__all__ = ["ClientFactory", "PortTaken", "enable_auth", "find_leader", "wait_ready"]

#: ``client_for(endpoints, timeout, **options)``: a client of the server's members (its TLS set)
ClientFactory = Callable[..., "EtcdClient"]


class PortTaken(Exception):
    """A member exited while starting because one of its ports was taken in the meantime."""


async def wait_ready(
    members: Sequence[Member],
    endpoint: Callable[[Member], str],
    client_for: ClientFactory,
    timeout: float,
) -> None:
    """Wait until each of ``members`` serves reads (``TimeoutError`` after ``timeout``)."""
    deadline = asyncio.get_running_loop().time() + timeout
    await asyncio.gather(*(_wait_member(m, endpoint(m), client_for, deadline) for m in members))


async def _wait_member(
    m: Member, endpoint: str, client_for: ClientFactory, deadline: float
) -> None:
    from .._etcd._rpc import rpc_pb2

    loop = asyncio.get_running_loop()
    client = client_for([endpoint], 1.0)
    request = rpc_pb2.RangeRequest(key=b"\0", count_only=True)
    last = "no answer"
    try:
        while True:
            assert m.process is not None
            if m.process.poll() is not None:
                tail = m.log_tail()
                if "address already in use" in tail:
                    raise PortTaken()
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


async def enable_auth(client: EtcdClient, auth: tuple[str, str]) -> None:
    """Create ``auth``'s user (and ``root``) with the root role, then turn auth on."""
    from .._etcd._rpc import rpc_pb2

    user, password = auth
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


async def find_leader(
    members: Sequence[Member], clients: dict[int, EtcdClient], timeout: float
) -> int:
    """The index of the member the running members agree leads (asked again while an election
    runs, up to ``timeout``); ``clients``: one per member index."""
    from .._etcd._rpc import rpc_pb2

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        ids: dict[int, int] = {}
        leaders: set[int] = set()
        for m in members:
            if not m.running:
                continue
            try:
                status: Any = await clients[m.index].call(
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
