"""open_store: URL validation, shared in-process stores, backends loaded by scheme."""

from __future__ import annotations

import pytest

from aioelastic.store import MemoryStore, open_store, register_backend, supported_schemes
from aioelastic.store._url import parse_store_url


@pytest.mark.parametrize(
    ("url", "error", "match"),
    [
        ("", ValueError, "url"),
        ("memory", ValueError, "scheme://"),
        ("localhost:2379", ValueError, "scheme"),
        ("gopher://x", ValueError, "unsupported scheme 'gopher'"),
        (42, TypeError, "url must be a str"),
    ],
)
def test_malformed_urls_raise_at_once(url: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        open_store(url)  # type: ignore[arg-type]


@pytest.mark.asyncio
@pytest.mark.parametrize("url", ["memory://name/with/path", "memory://?x=1", "memory://a:12"])
async def test_bad_memory_urls(url: str) -> None:
    with pytest.raises(ValueError, match="memory://NAME"):
        await open_store(url)


@pytest.mark.asyncio
async def test_private_and_shared_memory_stores() -> None:
    async with open_store("memory://") as a, open_store("memory://") as b:
        await a.put("k", b"a")
        assert await b.get("k") is None
    async with open_store("memory://job") as c, open_store("memory://job") as d:
        assert isinstance(c, MemoryStore)
        await c.put("k", b"shared")
        assert (await d.get("k")).value == b"shared"  # type: ignore[union-attr]
        await c.aclose()
        assert (await d.get("k")).value == b"shared"  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_unknown_memory_options_are_rejected() -> None:
    with pytest.raises(TypeError, match="bogus"):
        await open_store("memory://", bogus=1)
    async with open_store("memory://", history_limit=10) as store:
        assert isinstance(store, MemoryStore)
        assert store.engine.history_limit == 10


@pytest.mark.asyncio
async def test_register_backend_by_name_is_imported_lazily() -> None:
    register_backend("testmem", "aioelastic.store.memory:open_memory_store")
    assert "testmem" in supported_schemes()
    async with open_store("testmem://") as store:
        assert isinstance(store, MemoryStore)
    assert parse_store_url("testmem://x").netloc == "x"
    with pytest.raises(ValueError, match="scheme"):
        register_backend("not a scheme", "x:y")


# Uses the scheme (opens a store and calls it), then lists the optional backends' packages loaded.
_USE_A_SCHEME = """
import asyncio, sys
from aioelastic import StoreConnectionError, open_store

async def main(url):
    async with open_store("memory://") as store:
        await store.put("k", b"v")
    if url:
        try:
            # a short request timeout: the http client retries connecting within it
            async with asyncio.timeout(30), open_store(url, timeout=2) as store:
                await store.get("k")
        except StoreConnectionError:
            pass  # nothing listens on port 1: the backend was loaded and tried
    print(sorted({m.split(".")[0] for m in sys.modules} & {"grpc", "aiohttp", "yarl"}))

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.parametrize(
    ("url", "loaded"),
    [("", "[]"), ("etcd://127.0.0.1:1", "['grpc']"), ("http://127.0.0.1:1", "[]")],
)
def test_no_backend_is_loaded_unless_its_scheme_is_used(url: str, loaded: str) -> None:
    """The memory store loads neither gRPC nor aiohttp; the etcd client loads gRPC and not
    aiohttp; the http client neither: its session is asyncio's own transport, so a process that
    only connects to a store never imports aiohttp (nor yarl), which also keeps its first join
    cheap (the import-only check is in test_public_api)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _USE_A_SCHEME, url], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == loaded
