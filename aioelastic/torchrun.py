"""aioelastic's rendezvous inside torchrun: ``torchrun --rdzv-backend aioelastic ...``.

A synchronous adapter implementing torch's ``RendezvousHandler`` over aioelastic's async
:class:`~aioelastic.rendezvous.DynamicRendezvousHandler`, which runs on a private event loop in a
daemon thread (one per handler). torch's agent gets a ``torch.distributed.Store`` view of the
round's store (the same adapter pattern), used for its rank assignment and exit barrier.

``--rdzv-endpoint`` is a store URL (``http://host:port`` of an ``aioelastic serve``,
``https://...``, ``etcd://h1:2379,h2:2379``) or a bare ``host[:port]`` of an ``aioelastic
serve``. ``--rdzv-conf`` takes the keys of ``docs/rendezvous.md`` (``last_call_timeout``,
``lease_ttl``, ``join_timeout``, ...).

torch finds the backend through the ``torchrun.handlers`` entry-point group
(``aioelastic = "aioelastic._torchrun_entry:handler_creator"``, importable without torch, so
that the import order of torch and this module does not matter); :func:`register` registers it
by hand.
torch stays optional: this module imports it, nothing else in aioelastic does.

As torch's contract says, ``shutdown()`` closes the run (torch's agent calls it when it ends, so a
node out of restarts releases the others); a node killed or crashing only leaves, and the others
re-form without it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading
from collections.abc import Coroutine, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import anyio.lowlevel

# Bound before torch is imported: importing torch's rendezvous package runs its registry, which
# loads this package's entry point, possibly while this module is half-initialised.
from ._torchrun_entry import handler_creator

# isort: split
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import api as torch_api

from . import errors
from ._hints import CLOSED_RUN
from .rendezvous import RendezvousHandler, RendezvousParameters, create_handler
from .store import Compare, Get, GetResult, Put, Store

__all__ = [
    "BACKEND",
    "TorchRendezvousHandler",
    "TorchStore",
    "compare_set",
    "create_torch_handler",
    "handler_creator",
    "register",
]

BACKEND = "aioelastic"

T = TypeVar("T")


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop when it is installed (the client's CPU per request is about half of
    asyncio's, and a join is a few of them), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class _Call:
    """One coroutine run on the loop thread for a caller blocked in :meth:`_LoopThread.run`.

    Leaner than ``asyncio.run_coroutine_threadsafe`` (a join is a handful of requests, and this
    hop is paid per call): the task's own last step stores the outcome and releases the caller
    (no done-callback a loop turn later, no future state copied between two futures), and the
    caller waits on a bare lock (no condition variable)."""

    __slots__ = ("_coro", "_task", "cancelled", "done", "error", "result")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro = coro
        self._task: asyncio.Task[None] | None = None
        self.cancelled = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Lock()
        self.done.acquire()  # released once the outcome is stored

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """(On the loop thread.)"""
        if self.cancelled:  # the caller gave up before the loop got to it
            self._coro.close()
            self.error = concurrent.futures.CancelledError()
            self.done.release()
            return
        self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        try:
            self.result = await self._coro
        except asyncio.CancelledError:
            self.error = concurrent.futures.CancelledError()  # (as a cancelled future's result)
        except BaseException as exc:
            self.error = exc
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise  # (ends the loop, as asyncio does)
        finally:
            self.done.release()

    def cancel(self) -> None:
        """(On the loop thread.)"""
        self.cancelled = True
        if self._task is not None:
            self._task.cancel()


class _LoopThread:
    """An event loop in a daemon thread (uvloop's when installed); ``run(coro)`` blocks the
    caller until it completes."""

    def __init__(self) -> None:
        self.loop = _new_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="aioelastic-torchrun", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        call = _Call(coro)
        loop = self.loop
        loop.call_soon_threadsafe(call.start, loop)
        try:
            finished = call.done.acquire(timeout=-1 if timeout is None else max(0.0, timeout))
        except BaseException:
            # e.g. torch's SignalException raised in this thread: stop the coroutine too
            loop.call_soon_threadsafe(call.cancel)
            raise
        if not finished:
            loop.call_soon_threadsafe(call.cancel)
            raise TimeoutError(f"no answer within {timeout} s")
        if call.error is not None:
            error, call.error = call.error, None  # (no cycle through the traceback)
            raise error
        result: T = call.result
        return result

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()


def _translate(exc: BaseException) -> BaseException:
    """aioelastic's rendezvous errors as torch's (so torch's agent reacts as it would)."""
    kinds: list[tuple[tuple[type[BaseException], ...], Any]] = [
        ((errors.RendezvousGracefulExitError,), torch_api.RendezvousGracefulExitError),
        ((errors.RendezvousClosedError,), torch_api.RendezvousClosedError),
        ((errors.RendezvousTimeoutError, TimeoutError), torch_api.RendezvousTimeoutError),
        (
            (errors.RendezvousConnectionError, errors.StoreError, ConnectionError),
            torch_api.RendezvousConnectionError,
        ),
        ((errors.RendezvousStateError,), torch_api.RendezvousStateError),
        ((errors.RendezvousError,), torch_api.RendezvousError),
    ]
    for ours, theirs in kinds:
        if isinstance(exc, ours):
            translated: BaseException = theirs(str(exc))
            return translated
    return exc


def _bytes(value: str | bytes, name: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise TypeError(f"{name} must be str or bytes, got {type(value).__name__}")


class TorchStore(dist.Store):  # type: ignore[misc]
    """A ``torch.distributed.Store`` over an aioelastic :class:`~aioelastic.store.Store`.

    Blocking calls run on the adapter's loop thread; ``get``/``wait``/``multi_get`` wait (on a
    watch) up to the store's ``timeout`` and raise ``torch.distributed.DistStoreError`` after.
    """

    def __init__(self, store: Store, loop: _LoopThread) -> None:
        super().__init__()
        self._store = store
        self._loop = loop

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run(coro)

    def _wait_seconds(self, timeout: timedelta | None = None) -> float | None:
        value = timeout if timeout is not None else self.timeout
        seconds = float(value.total_seconds())
        return seconds if seconds > 0 else None

    def _wait_for(self, keys: Sequence[str], timeout: timedelta | None = None) -> list[bytes]:
        try:
            found = self._run(self._store.wait_for(list(keys), timeout=self._wait_seconds(timeout)))
        except errors.StoreTimeoutError as exc:
            raise dist.DistStoreError(str(exc)) from exc
        return [found[k].value for k in keys]

    def set(self, key: str, value: str | bytes) -> None:
        self._run(self._store.put(key, _bytes(value, "value")))

    def get(self, key: str) -> bytes:
        return self._wait_for([key])[0]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._wait_for(keys)

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        if len(keys) != len(values):
            raise ValueError(f"multi_set: {len(keys)} keys but {len(values)} values")

        async def put_all() -> None:
            for key, value in zip(keys, values, strict=True):
                await self._store.put(key, _bytes(value, "values[]"))

        self._run(put_all())

    def add(self, key: str, amount: int) -> int:
        return self._run(self._store.add(key, amount))

    def compare_set(
        self, key: str, expected_value: str | bytes, desired_value: str | bytes
    ) -> bytes:
        """torch's semantics: set ``desired`` if the value is ``expected`` (or the key is absent
        and ``expected`` is empty); return the value the key holds afterwards."""
        expected = _bytes(expected_value, "expected_value")
        desired = _bytes(desired_value, "desired_value")
        return self._run(compare_set(self._store, key, expected, desired))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._wait_for(keys, timeout)

    def check(self, keys: list[str]) -> bool:
        async def all_there() -> bool:
            for key in keys:
                if await self._store.get(key) is None:
                    return False
            return True

        return self._run(all_there())

    def delete_key(self, key: str) -> bool:
        return self._run(self._store.delete(key)) > 0

    def num_keys(self) -> int:
        return self._run(self._store.range("")).count


async def compare_set(store: Store, key: str, expected: bytes, desired: bytes) -> bytes:
    """torch's ``compare_set`` on a store, in one transaction (one request) unless the key
    holds an empty value and ``expected`` is empty (then two): set ``desired`` if the value is
    ``expected`` (or the key is absent and ``expected`` is empty); return the value the key holds
    afterwards (``expected`` when it is absent and ``expected`` is not empty)."""
    # swap if the value is the expected one (for an empty expected: if the key is absent), else
    # read it back at the same revision
    compare = Compare.value(key) == expected if expected else Compare.version(key) == 0
    while True:
        result = await store.txn(compare=[compare], success=[Put(key, desired)], failure=[Get(key)])
        if result.succeeded:
            return desired
        outcome = result[0]
        assert isinstance(outcome, GetResult)
        kv = outcome.kv
        if kv is None:  # absent, and a non-empty value expected
            return expected
        if kv.value != expected:
            return kv.value
        # present with the expected empty value: swap against exactly that write
        compare = Compare.mod_revision(key) == kv.mod_revision


class TorchRendezvousHandler(torch_api.RendezvousHandler):  # type: ignore[misc]
    """torch's synchronous ``RendezvousHandler`` over an aioelastic handler.

    ``use_agent_store`` is False: the workers create their own ``TCPStore`` at
    ``MASTER_ADDR:MASTER_PORT``, the free port rank 0 published in the round record.
    """

    def __init__(self, backend: str, handler: RendezvousHandler, loop: _LoopThread) -> None:
        self._backend = backend
        self._handler = handler
        self._loop = loop
        self._shut = False
        self._joined = False  # a round completed: a closed run is no longer a stale run id

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            return self._loop.run(coro)
        except Exception as exc:
            translated = _translate(exc)
            if translated is exc:
                raise
            raise translated from exc

    def get_backend(self) -> str:
        return self._backend

    @property
    def use_agent_store(self) -> bool:
        return False

    def next_rendezvous(self) -> torch_api.RendezvousInfo:
        try:
            result = self._run(self._handler.next_rendezvous())
        except torch_api.RendezvousClosedError as exc:
            if self._shut or self._joined:  # closed under a running job: no new job to start
                raise
            raise torch_api.RendezvousClosedError(f"{exc}; {CLOSED_RUN}") from exc
        self._joined = True
        info = result.bootstrap_store_info
        return torch_api.RendezvousInfo(
            TorchStore(result.store, self._loop),
            result.rank,
            result.world_size,
            torch_api.RendezvousStoreInfo(info.master_addr, info.master_port),
        )

    def is_closed(self) -> bool:
        return self._run(self._handler.is_closed())

    def set_closed(self) -> None:
        self._run(self._handler.set_closed())

    def num_nodes_waiting(self) -> int:
        return self._run(self._handler.num_nodes_waiting())

    def get_run_id(self) -> str:
        return self._handler.run_id

    def shutdown(self) -> bool:
        """Close the run and leave (torch's contract), then stop the loop thread."""
        if self._shut:
            return True
        self._shut = True
        try:
            return self._run(self._handler.shutdown())
        finally:
            self._loop.close()


def _parameters(params: torch_api.RendezvousParameters) -> RendezvousParameters:
    """torch's parameters as aioelastic's: the endpoint is a store URL or ``host[:port]``.

    torch's ``RendezvousInfo`` has no member list, so the handler does not read the round's
    roster (``participants`` off, unless the config asks for it): a member reads its own rank
    record only, O(1) bytes a join instead of O(N)."""
    config = dict(params.config)
    config.setdefault("participants", False)
    endpoint = params.endpoint or ""
    if "://" in endpoint:
        config.setdefault("store_url", endpoint)
        endpoint = ""
    return RendezvousParameters(
        "c10d",
        endpoint,
        params.run_id,
        params.min_nodes,
        params.max_nodes,
        getattr(params, "local_addr", None),
        **config,
    )


async def _warm_up(handler: RendezvousHandler) -> None:
    """Do the first join's one-time work now: anyio's backend import and the store's first
    connection (a real round trip: is the run closed?)."""
    await anyio.lowlevel.checkpoint()
    await handler.is_closed()


def create_torch_handler(params: torch_api.RendezvousParameters) -> TorchRendezvousHandler:
    """The creator torch's registry calls: build the async handler on a new loop thread.

    The one-time work of a first join is done here, not inside ``next_rendezvous()``: the lazy
    imports and the store's connection (:func:`_warm_up`), and a full garbage collection, so that
    the join does not pay for collecting torch's large heap (70-90 ms on a 2-core machine).
    """
    ours = _parameters(params)
    loop = _LoopThread()
    try:
        handler = loop.run(create_handler(ours))
        loop.run(_warm_up(handler))
        gc.collect()
    except BaseException as exc:
        loop.close()
        translated = _translate(exc)
        if translated is exc:
            raise
        raise translated from exc
    return TorchRendezvousHandler(params.backend, handler, loop)


def register(name: str = BACKEND) -> None:
    """Register the backend with torch's registry by hand (idempotent)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    # the creator the entry point gives, so that both ways of registering agree
    rendezvous_handler_registry.register(name, handler_creator())
