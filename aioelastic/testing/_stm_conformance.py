"""The software-transaction part of the store conformance suite (``store.stm``), mixed into
:class:`~aioelastic.testing.conformance.StoreConformance`: no lost update under contention,
bounded retries with a clear error, reads that see the function's own writes."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from ..errors import TxnConflictError
from ..store import StmTxn, Store
from ._conformance_kit import conformance_test

__all__ = ["StmConformance"]


class StmConformance:
    """``store.stm`` on every backend."""

    @conformance_test()
    async def test_stm_under_contention_loses_no_update(self, store: Store) -> None:
        """Tasks move units between two keys and count their moves; each function yields to
        the loop between its reads and its commit, so attempts really collide."""
        await store.txn()
        await store.put("a", b"100")
        attempts = 0

        async def move(tx: StmTxn) -> int:
            nonlocal attempts
            attempts += 1
            a = int(await tx.get("a") or b"0")
            await anyio.lowlevel.checkpoint()  # let the others read the same values
            b = int(await tx.get("b") or b"0")
            moves = int(await tx.get("moves") or b"0")
            tx.put("a", str(a - 1).encode())
            tx.put("b", str(b + 1).encode())
            tx.put("moves", str(moves + 1).encode())
            return moves + 1

        async def worker(returned: list[int]) -> None:
            for _ in range(4):
                returned.append(await store.stm(move, keys=["a", "b"], max_attempts=200))

        returned: list[int] = []
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(worker, returned)
        values = {kv.key: int(kv.value) for kv in await store.range("")}
        assert values == {"a": 68, "b": 32, "moves": 32}
        assert sorted(returned) == list(range(1, 33))  # each commit saw every earlier one
        assert attempts > 32  # there was contention, and it was resolved by retrying

    @conformance_test()
    async def test_stm_gives_up_after_max_attempts_with_a_clear_error(self, store: Store) -> None:
        await store.put("hot", b"0")
        await store.put("other", b"x")
        calls = 0

        async def interfered(tx: StmTxn) -> None:
            nonlocal calls
            calls += 1
            value = await tx.get("hot")
            await store.put("hot", b"changed %d" % calls)  # another writer, every time
            tx.put("other", (value or b"") + b"!")

        with pytest.raises(TxnConflictError, match=r"after 3 attempts.*'hot'") as info:
            await store.stm(interfered, max_attempts=3)
        assert (info.value.attempts, info.value.keys, calls) == (3, ("hot",), 3)
        assert (await store.get("other")).value == b"x"  # type: ignore[union-attr]

    @conformance_test()
    async def test_stm_reads_see_its_own_writes_and_commit_atomically(self, store: Store) -> None:
        await store.put("x", b"1")
        await store.put("gone", b"g")

        async def body(tx: StmTxn) -> tuple[bytes | None, ...]:
            seen = (await tx.get("x"), await tx.get("missing"))
            revision = await tx.rev("x")
            tx.put("x", b"2")
            tx.put("y", b"3")
            tx.delete("gone")
            tx.put("z", b"first")
            tx.delete("z")  # the last write staged for a key wins
            assert await tx.rev("x") == revision  # the revision read, not the staged write
            return (*seen, await tx.get("x"), await tx.get("gone"), await tx.get("z"))

        before = await store.current_revision()
        assert await store.stm(body) == (b"1", None, b"2", None, None)
        after = await store.range("")
        assert {kv.key: kv.value for kv in after} == {"x": b"2", "y": b"3"}
        assert {kv.mod_revision for kv in after} == {before + 1}

        async def nothing(tx: StmTxn) -> str:
            return "no reads, no writes: nothing to commit"

        assert await store.stm(nothing) == "no reads, no writes: nothing to commit"
        assert await store.current_revision() == before + 1

    @conformance_test()
    async def test_stm_propagates_errors_and_applies_nothing(self, store: Store) -> None:
        async def fails(tx: StmTxn) -> None:
            tx.put("k", b"v")
            raise RuntimeError("computed badly")

        with pytest.raises(RuntimeError, match="computed badly"):
            await store.stm(fails)
        assert await store.get("k") is None
        with pytest.raises(ValueError, match="max_attempts"):
            await store.stm(fails, max_attempts=0)
        with pytest.raises(TypeError, match="keys"):
            await store.stm(fails, keys="k")
