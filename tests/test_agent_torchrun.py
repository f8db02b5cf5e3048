"""The torchrun plugin: torch's own agent (``torch.distributed.run``) rendezvousing through
aioelastic (``--rdzv-backend aioelastic``) on loopback. Skipped when torch is not installed."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import signal
import time
from pathlib import Path

import pytest
from helpers import finish
from helpers.agent import (
    PY,
    ROOT,
    WORKER,
    _assert_no_orphans,
    _env,
    _lines,
    _parent_of,
    wait_records,
)

from aioelastic.store import MemoryEngine, MemoryStore, Store
from aioelastic.store.http.server import HttpStoreServer

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None, reason="torch is not installed (optional)"
    ),
]

# torchrun with the backend registered by hand (the entry point needs the package installed)
LAUNCH = (
    "import sys; from aioelastic.torchrun import register; register(); "
    "from torch.distributed.run import main; sys.exit(main())"
)


async def _torchrun(*args: str) -> asyncio.subprocess.Process:
    env = _env()
    env["GLOO_SOCKET_IFNAME"] = "lo"
    return await asyncio.create_subprocess_exec(
        PY,
        "-c",
        LAUNCH,
        "--rdzv-backend=aioelastic",
        "--local-addr=127.0.0.1",
        "--monitor-interval=0.1",
        *args,
        env=env,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


@pytest.mark.slow
@pytest.mark.asyncio
async def test_two_torchrun_nodes_allreduce_over_aioelastic() -> None:
    example = str(ROOT / "examples" / "torch_allreduce.py")
    async with HttpStoreServer(port=0) as server:
        args = (
            f"--rdzv-endpoint={server.url}",
            "--rdzv-id=torchrun-two",
            "--nnodes=2",
            "--nproc-per-node=1",
            example,
        )
        nodes = [await _torchrun(*args) for _ in range(2)]
        results = [await finish(node, 120, "torchrun") for node in nodes]
    for code, _stdout, stderr in results:
        assert code == 0, stderr
    outputs = "".join(stdout for _code, stdout, _stderr in results)
    assert outputs.count("all_reduce(sum of rank+1) = 3") == 2, outputs


@pytest.mark.slow
@pytest.mark.asyncio
async def test_killed_torchrun_node_makes_the_other_reform(out: Path) -> None:
    async with HttpStoreServer(port=0) as server:
        args = (
            f"--rdzv-endpoint=127.0.0.1:{server.port}",
            "--rdzv-id=torchrun-shrink",
            "--nnodes=1:2",
            "--nproc-per-node=2",
            "--rdzv-conf=last_call_timeout=3,keep_alive_interval=0.3,keep_alive_max_attempt=3",
            WORKER,
            "elastic",
            str(out),
        )
        nodes = [await _torchrun(*args) for _ in range(2)]
        victim_workers: set[int] = set()
        try:
            big = await wait_records(
                out / "starts.jsonl", 4, 60, "the 2-node round did not start", WORLD_SIZE="4"
            )
            (out / "shrink").touch()
            group = big[-1]["GROUP_RANK"]
            victim_workers = {s["pid"] for s in big if s["GROUP_RANK"] == group}
            parents = {_parent_of(pid) for pid in victim_workers}
            (victim,) = [n for n in nodes if n.pid in parents]
            (survivor,) = [n for n in nodes if n is not victim]
            victim.send_signal(signal.SIGKILL)
            code, _stdout, stderr = await finish(survivor, 120, "torchrun")
            await victim.wait()
        finally:
            for node in nodes:
                if node.returncode is None:
                    node.kill()
                    await node.wait()
            # torch's agent gives its workers no death signal: its orphans are cleaned up here
            for pid in victim_workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    assert code == 0, stderr
    small = [s for s in _lines(out / "starts.jsonl") if s["WORLD_SIZE"] == "2"]
    assert sorted(s["RANK"] for s in small) == ["0", "1"]
    _assert_no_orphans(str(out))


def test_torch_store_adapter_semantics() -> None:
    from datetime import timedelta

    import torch.distributed as dist

    from aioelastic.torchrun import TorchStore, _LoopThread

    loop = _LoopThread()
    try:
        store = TorchStore(loop.run(_memory_store()), loop)
        assert isinstance(store, dist.Store)
        store.set("a", "1")
        store.set("b", b"\x00\xff")
        assert store.get("a") == b"1"
        assert store.multi_get(["a", "b"]) == [b"1", b"\x00\xff"]
        store.multi_set(["c", "d"], ["3", b"4"])
        assert store.check(["c", "d"])
        assert not store.check(["c", "missing"])
        assert store.add("n", 2) == 2
        assert store.add("n", 3) == 5
        # torch's compare_set: absent + empty expected sets; a mismatch returns the current value
        assert store.compare_set("k", "", "v1") == b"v1"
        assert store.compare_set("k", "nope", "v2") == b"v1"
        assert store.compare_set("k", "v1", "v2") == b"v2"
        assert store.compare_set("absent", "x", "y") == b"x"
        assert store.get("k") == b"v2"
        assert store.delete_key("k") is True
        assert store.delete_key("k") is False
        assert store.num_keys() == 5  # a, b, c, d, n
        store.set_timeout(timedelta(seconds=0.2))
        started = time.monotonic()
        with pytest.raises(dist.DistStoreError, match="missing"):
            store.get("missing")
        assert time.monotonic() - started < 5
        with pytest.raises(dist.DistStoreError):
            store.wait(["missing"], timedelta(seconds=0.1))
        store.wait(["a"])
        # a PrefixStore over it, as torch's agent may use
        prefixed = dist.PrefixStore("p", store)
        prefixed.set("x", "1")
        assert prefixed.get("x") == b"1"
    finally:
        loop.close()


def test_the_adapters_loop_thread_runs_uvloop_when_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from aioelastic.torchrun import _LoopThread

    async def loop_type() -> type[asyncio.AbstractEventLoop]:
        return type(asyncio.get_running_loop())

    uvloop = pytest.importorskip("uvloop")
    loop = _LoopThread()
    try:
        assert loop.run(loop_type(), 10) is uvloop.Loop
    finally:
        loop.close()
    monkeypatch.setitem(sys.modules, "uvloop", None)  # not installed: asyncio's own
    loop = _LoopThread()
    try:
        assert not issubclass(loop.run(loop_type(), 10), uvloop.Loop)
    finally:
        loop.close()


async def _memory_store() -> Store:
    return MemoryStore(MemoryEngine())


def test_errors_are_translated_for_torch() -> None:
    from torch.distributed.elastic.rendezvous import api as torch_api

    from aioelastic import errors
    from aioelastic.torchrun import _translate

    cases = [
        (errors.RendezvousGracefulExitError("x"), torch_api.RendezvousGracefulExitError),
        (errors.RendezvousClosedError("x"), torch_api.RendezvousClosedError),
        (errors.RendezvousTimeoutError("x"), torch_api.RendezvousTimeoutError),
        (errors.RendezvousConnectionError("x"), torch_api.RendezvousConnectionError),
        (errors.StoreConnectionError("x"), torch_api.RendezvousConnectionError),
        (errors.RendezvousStateError("x"), torch_api.RendezvousStateError),
    ]
    for ours, theirs in cases:
        assert type(_translate(ours)) is theirs
    other = ValueError("x")
    assert _translate(other) is other


def test_handler_creator_and_registration() -> None:
    from torch.distributed.elastic.rendezvous import api as torch_api
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    from aioelastic.torchrun import (
        BACKEND,
        TorchRendezvousHandler,
        handler_creator,
        register,
    )

    creator = handler_creator()  # what torch's registry registers
    handler = creator(torch_api.RendezvousParameters("aioelastic", "memory://creator", "j", 1, 1))
    try:
        assert isinstance(handler, TorchRendezvousHandler)
    finally:
        handler.shutdown()
    register()
    register()  # idempotent
    assert rendezvous_handler_registry._registry[BACKEND] is creator


def test_torch_handlers_do_not_read_the_roster_unless_asked() -> None:
    """torch's RendezvousInfo has no member list: the adapter's handler skips the roster read
    (O(N) bytes per member at every round), unless the config sets ``participants``."""
    from torch.distributed.elastic.rendezvous import api as torch_api

    from aioelastic.rendezvous import DynamicRendezvousHandler
    from aioelastic.torchrun import create_torch_handler

    for config, reads_roster in (({}, False), ({"participants": "1"}, True)):
        params = torch_api.RendezvousParameters(
            "aioelastic", "memory://roster", "j", 1, 1, node_id="only", **config
        )
        handler = create_torch_handler(params)
        try:
            handler.next_rendezvous()
            inner = handler._handler
            assert isinstance(inner, DynamicRendezvousHandler)
            assert inner._with_participants is reads_roster
        finally:
            handler.shutdown()


def test_torchrun_finds_the_backend_through_its_entry_point() -> None:
    """torchrun loads rendezvous plugins from the ``torchrun.handlers`` entry-point group."""
    from importlib.metadata import entry_points

    from torch.distributed.elastic.rendezvous.registry import _register_out_of_tree_handlers

    (entry,) = [e for e in entry_points(group="torchrun.handlers") if e.name == "aioelastic"]
    assert entry.value == "aioelastic._torchrun_entry:handler_creator"
    _register_out_of_tree_handlers()
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    assert rendezvous_handler_registry._registry.get("aioelastic") is not None


@pytest.mark.parametrize(
    "imports",
    [
        "import aioelastic.torchrun",
        "import aioelastic.torchrun, torch.distributed.elastic.rendezvous.registry",
        "import torch.distributed.elastic.rendezvous.registry, aioelastic.torchrun",
    ],
)
def test_the_import_order_of_torch_and_the_plugin_does_not_matter(imports: str) -> None:
    """torch's registry loads the entry point while ``aioelastic.torchrun`` may be half-imported:
    that printed a warning with a traceback ("partially initialized module")."""
    import subprocess

    check = (
        f"{imports}\n"
        "from torch.distributed.elastic.rendezvous import rendezvous_handler_registry as r\n"
        "assert r._registry.get('aioelastic') is not None, 'not registered'\n"
    )
    done = subprocess.run(
        [PY, "-W", "error", "-c", check], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Exception while registering" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_the_first_join_does_its_lazy_work_at_handler_creation() -> None:
    """The first ``next_rendezvous()`` in a fresh process imports nothing and runs no full
    garbage collection of torch's heap (both cost 70-300 ms in the join before)."""
    import subprocess

    check = """
import gc, sys
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
import aioelastic.torchrun as tr
tr.register()
h = get_rendezvous_handler(RendezvousParameters("aioelastic", "memory://warm", "j", 1, 1))
full = []
gc.callbacks.append(lambda phase, info: full.append(info) if info["generation"] == 2 else None)
before = set(sys.modules)
h.next_rendezvous()
new = sorted(m for m in set(sys.modules) - before if m.startswith(("anyio", "aioelastic")))
h.shutdown()
assert not new, new
assert not [i for i in full if i.get("collected") is not None], full
"""
    done = subprocess.run(
        [PY, "-W", "error", "-c", check], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
