"""The etcd backend's lease keep-alive stream (one long-lived ``LeaseKeepAlive`` stream per kept
lease), and the read helper that it and the watch stream share."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import anyio

from .._etcd._liveness import CallAbandonedError
from .._etcd._rpc import grpc, rpc_pb2
from .._etcd.client import EtcdClient
from ..errors import StoreClosedError, StoreConnectionError, StoreTimeoutError

__all__ = ["KeepAliveStream", "retrieve"]


def retrieve(read: asyncio.Future[Any]) -> None:
    """Retrieve a finished read's outcome (one dropped with its stream is never awaited)."""
    if not read.cancelled():
        read.exception()


class KeepAliveStream:
    """One lease's long-lived ``LeaseKeepAlive`` stream: one ping in flight at a time.

    A keep-alive is idempotent, so a ping that fails on this stream in a way that says nothing
    about the lease (the member went away, hung or ended the stream) is sent once more on a
    fresh stream; a stream that may still carry an answer is never reused."""

    __slots__ = ("call", "channel", "lock")

    def __init__(self) -> None:
        self.call: Any = None
        self.channel: Any = None
        self.lock = asyncio.Lock()

    def drop(self) -> None:
        call, self.call = self.call, None
        if call is not None:
            call.cancel()

    async def ping(self, client: EtcdClient, lease_id: int, closed: Callable[[], bool]) -> float:
        """The TTL etcd answers (``<= 0``: the lease is gone). Hold :attr:`lock` around it.

        ``closed``: whether the store was closed (a call failing because of that raises
        ``StoreClosedError``)."""
        request = rpc_pb2.LeaseKeepAliveRequest(ID=lease_id)
        response = await self._send(client, request, closed, last=False)
        if response is None:  # one retry, on a fresh stream
            response = await self._send(client, request, closed, last=True)
        return float(response.TTL)

    async def _send(
        self, client: EtcdClient, request: Any, closed: Callable[[], bool], *, last: bool
    ) -> Any:
        """One keep-alive on this stream (opened if need be): the answer, or None when it is
        worth another try on a fresh stream (never on the ``last`` try: that raises)."""
        read: asyncio.Future[Any] | None = None
        try:
            if self.call is not None and self.call.done():
                self.drop()  # ended while idle (its channel was replaced: hung)
            if self.call is None:
                self.call, self.channel = await client.open_stream("LeaseKeepAlive")
            with anyio.fail_after(client.timeout):
                await self.call.write(request)
                read = asyncio.ensure_future(self.call.read())
                read.add_done_callback(retrieve)
                await client.wait_answer(self.channel, read, leader_bound=True)
                response = read.result()
        except CallAbandonedError as exc:
            self.drop()
            _raise_if(last, f"etcd LeaseKeepAlive: {exc}")
            return None
        except grpc.aio.AioRpcError as exc:
            self.drop()
            if closed():
                raise StoreClosedError("the etcd store is closed") from None
            if exc.code() is grpc.StatusCode.UNAVAILABLE and self.channel is not None:
                client.rotate(self.channel)
            message = f"etcd LeaseKeepAlive: {exc.code().name}: {exc.details()}"
            _raise_if(last or exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED, message)
            return None
        except TimeoutError:
            self.drop()
            raise StoreTimeoutError(
                f"etcd LeaseKeepAlive: no answer within {client.timeout:g}s"
            ) from None
        except asyncio.CancelledError:
            self.drop()  # an answer may still be on its way: never reuse the stream
            if read is not None and read.cancelled():
                # the stream was cancelled under us, not our caller: by the store's close, or
                # its channel was replaced
                if closed():
                    raise StoreClosedError("the etcd store is closed") from None
                _raise_if(last, "etcd LeaseKeepAlive: the stream ended")
                return None
            raise
        except BaseException:
            self.drop()  # an answer may still be on its way: never reuse the stream
            raise
        if response is grpc.aio.EOF:
            self.drop()
            _raise_if(last, "etcd LeaseKeepAlive: the stream ended")
            return None
        return response


def _raise_if(last: bool, message: str) -> None:
    """On the last try, the connection error; else nothing (the caller tries a fresh stream)."""
    if last:
        raise StoreConnectionError(message) from None
