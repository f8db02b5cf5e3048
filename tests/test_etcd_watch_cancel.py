"""An etcd watch's ``__anext__`` cancelled in the loop turn its stream's read ended: the caller's
cancellation goes through, and the read's answer is the next call's (nothing lost).

Unit-level, with a stand-in for the gRPC stream (no etcd): the race needs the read to end after
the caller was woken and before it runs, which a real server cannot be made to do on cue. It
hung a ``StoreTimerServer``'s close for a minute in the suite (its watch's caller was cancelled
as the reap's delete event arrived): the cancellation was taken for the stream's own."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

from aioelastic._etcd._rpc import kv_pb2, rpc_pb2  # noqa: E402
from aioelastic.store._etcd_watch import EtcdWatch  # noqa: E402


class _Stream:
    """A watch stream whose one read ends when the test says (``answer``)."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.cancelled = False

    async def read(self) -> Any:
        return await self.answer

    def cancel(self) -> None:
        self.cancelled = True


async def _wait_answer(channel: Any, answer: asyncio.Future[Any]) -> None:
    await asyncio.wait((answer,))  # as the client's, with one endpoint


def _put(key: bytes, revision: int) -> Any:
    kv = kv_pb2.KeyValue(
        key=key, value=b"v", create_revision=revision, mod_revision=revision, version=1
    )
    return rpc_pb2.WatchResponse(events=[kv_pb2.Event(type=kv_pb2.Event.PUT, kv=kv)])


def _watch(stream: _Stream) -> EtcdWatch:
    store: Any = SimpleNamespace(client=SimpleNamespace(wait_answer=_wait_answer))
    watch = EtcdWatch(store, "p/", None)
    watch._call, watch._channel = stream, object()
    return watch


@pytest.mark.asyncio
async def test_a_cancel_in_the_turn_the_read_ended_goes_through_and_keeps_the_event() -> None:
    stream = _Stream()
    watch = _watch(stream)
    reader = asyncio.ensure_future(watch._next())
    for _ in range(3):
        await asyncio.sleep(0)
    read = watch._read
    assert read is not None
    assert not read.done()
    # the read ends; its done-callbacks wake the reader, then this one cancels it, before the
    # reader runs again: it sees a CancelledError with the read done
    read.add_done_callback(lambda _: reader.cancel())
    stream.answer.set_result(_put(b"p/a", 5))
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(reader, 5)
    assert reader.cancelled()
    assert not stream.cancelled  # the stream lives on
    event = await asyncio.wait_for(watch._next(), 5)  # the read's answer, not lost
    assert (event.kv.key, event.revision) == ("p/a", 5)


@pytest.mark.asyncio
async def test_a_read_cancelled_under_a_running_caller_is_not_the_callers_cancel() -> None:
    """The other way a CancelledError arrives: the stream's read was cancelled (the stream
    dropped) while the caller was not: the caller goes on (here, to an error set meanwhile)."""
    stream = _Stream()
    watch = _watch(stream)
    reader = asyncio.ensure_future(watch._next())
    for _ in range(3):
        await asyncio.sleep(0)
    assert watch._read is not None
    watch._fail(RuntimeError("the store was closed"))  # drops the stream
    stream.answer.cancel()  # what grpc does to a dropped stream's read
    with pytest.raises(RuntimeError, match="the store was closed"):
        await asyncio.wait_for(reader, 5)
    assert stream.cancelled
