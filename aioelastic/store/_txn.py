"""Transactions (etcd's ``Txn``): compares on several keys, then one list of operations or
another, applied at one revision.

The records here are plain frozen dataclasses, shaped so that etcd's ``TxnRequest`` is a thin
mapping::

    from aioelastic.store import Compare, Get, Put

    result = await store.txn(
        compare=[Compare.value("job/state") == b"ready", Compare.version("job/lock") == 0],
        success=[Put("job/state", b"running"), Put("job/params", params)],
        failure=[Get("job/state")],
    )
    if not result:                     # which branch ran
        current = result[0].kv         # each operation's result, in order

:meth:`Compare.holds` is the reference meaning of a compare (etcd's ``applyCompare``), and
:func:`check_txn` the rules every backend enforces before anything is sent or applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal, get_args

from ..errors import TxnTooLargeError
from ._base import check_int, check_key, check_prefix, check_value
from ._types import KeyValue, RangeResult

__all__ = [
    "MAX_TXN_BYTES",
    "MAX_TXN_OPS",
    "Compare",
    "CompareOp",
    "CompareTarget",
    "Delete",
    "DeletePrefix",
    "DeleteResult",
    "Get",
    "GetResult",
    "OpResult",
    "Put",
    "PutResult",
    "Range",
    "Txn",
    "TxnOp",
    "TxnResult",
    "check_txn",
]

#: At most this many compares, and this many operations in each branch (etcd's default
#: ``--max-txn-ops``).
MAX_TXN_OPS = 128
#: At most this many bytes of keys (UTF-8) and values in one transaction, compares included.
#: Below etcd's default request limit (1.5 MiB) so that every backend refuses the same
#: transactions, with the same error.
MAX_TXN_BYTES = 1024 * 1024

CompareTarget = Literal["value", "version", "create_revision", "mod_revision", "lease"]
CompareOp = Literal["==", "!=", "<", ">"]
_TARGETS: tuple[str, ...] = get_args(CompareTarget)
_OPS: tuple[str, ...] = get_args(CompareOp)


@dataclass(frozen=True, slots=True)
class Compare:
    """A condition on one key: its ``target`` field compared (``op``) with ``operand``.

    ``target`` is ``"value"`` (``operand`` is bytes, compared bytewise), or ``"version"``,
    ``"create_revision"``, ``"mod_revision"`` or ``"lease"`` (``operand`` an int >= 0). An absent
    key has version, revisions and lease 0, and no value: every compare of its value is false
    (``!=`` too), as in etcd. Spelled most readably with the builders::

        Compare.mod_revision("lock") == 0      # the key is absent
        Compare.value("state") != b"done"
        Compare.version("n") > 3
    """

    key: str
    target: CompareTarget
    op: CompareOp
    operand: int | bytes

    def __post_init__(self) -> None:
        check_key(self.key, "compare key")
        if self.target not in _TARGETS:
            raise ValueError(f"compare target must be one of {_TARGETS}, got {self.target!r}")
        if self.op not in _OPS:
            raise ValueError(f"compare op must be one of {_OPS}, got {self.op!r}")
        if self.target == "value":
            if type(self.operand) is not bytes:
                object.__setattr__(self, "operand", check_value(self.operand, "compare operand"))
        else:
            check_int(self.operand, f"compare operand of {self.target}", minimum=0)

    def holds(self, kv: KeyValue | None) -> bool:
        """Whether the compare is true of ``kv`` (``None``: the key is absent)."""
        actual: int | bytes
        if kv is None:
            if self.target == "value":
                return False
            actual = 0
        else:
            actual = getattr(kv, self.target)
        operand = self.operand
        if self.op == "==":
            return actual == operand
        if self.op == "!=":
            return actual != operand
        if self.op == "<":
            return actual < operand  # type: ignore[operator]  # same types, checked above
        return actual > operand  # type: ignore[operator]

    @staticmethod
    def value(key: str) -> CompareField:
        """``Compare.value(key) == b"..."`` (also ``!=``, ``<``, ``>``)."""
        return CompareField(key, "value")

    @staticmethod
    def version(key: str) -> CompareField:
        """``Compare.version(key) == 0``: writes since the key was created (0: absent)."""
        return CompareField(key, "version")

    @staticmethod
    def create_revision(key: str) -> CompareField:
        """``Compare.create_revision(key) == r``: the revision that created the key."""
        return CompareField(key, "create_revision")

    @staticmethod
    def mod_revision(key: str) -> CompareField:
        """``Compare.mod_revision(key) == r``: the revision of its last write (0: absent)."""
        return CompareField(key, "mod_revision")

    @staticmethod
    def lease(key: str) -> CompareField:
        """``Compare.lease(key) == lease_id``: the lease it is attached to (0: none)."""
        return CompareField(key, "lease")


class CompareField:
    """One field of one key, waiting for an operator: ``==``, ``!=``, ``<`` or ``>`` makes the
    :class:`Compare`. Made by ``Compare.value(key)`` and its siblings."""

    __slots__ = ("key", "target")
    __hash__ = None  # type: ignore[assignment]  # == builds a Compare, so no hashing

    def __init__(self, key: str, target: CompareTarget) -> None:
        self.key = key
        self.target: CompareTarget = target

    def __repr__(self) -> str:
        return f"Compare.{self.target}({self.key!r})"

    def __eq__(self, operand: object) -> Compare:  # type: ignore[override]
        return Compare(self.key, self.target, "==", operand)  # type: ignore[arg-type]

    def __ne__(self, operand: object) -> Compare:  # type: ignore[override]
        return Compare(self.key, self.target, "!=", operand)  # type: ignore[arg-type]

    def __lt__(self, operand: int | bytes) -> Compare:
        return Compare(self.key, self.target, "<", operand)

    def __gt__(self, operand: int | bytes) -> Compare:
        return Compare(self.key, self.target, ">", operand)


# -- operations ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Put:
    """Write ``value`` at ``key`` (attached to ``lease`` if non-zero).

    Result: :class:`PutResult`."""

    key: str
    value: bytes
    lease: int = 0

    def __post_init__(self) -> None:
        check_key(self.key)
        if type(self.value) is not bytes:
            object.__setattr__(self, "value", check_value(self.value))
        check_int(self.lease, "lease", minimum=0)


@dataclass(frozen=True, slots=True)
class Get:
    """Read ``key``. Result: :class:`GetResult`."""

    key: str

    def __post_init__(self) -> None:
        check_key(self.key)


@dataclass(frozen=True, slots=True)
class Range:
    """Read every key under ``prefix`` (at most ``limit``). Result: a
    :class:`~aioelastic.store.RangeResult` whose ``revision`` is the transaction's."""

    prefix: str
    limit: int | None = None

    def __post_init__(self) -> None:
        check_prefix(self.prefix)
        if self.limit is not None:
            check_int(self.limit, "limit", minimum=1)


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete ``key``. Result: :class:`DeleteResult`."""

    key: str

    def __post_init__(self) -> None:
        check_key(self.key)


@dataclass(frozen=True, slots=True)
class DeletePrefix:
    """Delete every key under ``prefix``. Result: :class:`DeleteResult`."""

    prefix: str

    def __post_init__(self) -> None:
        check_prefix(self.prefix)


TxnOp = Put | Get | Range | Delete | DeletePrefix


# -- results ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PutResult:
    """A put's outcome: the key-value as written, and the one it replaced (``None``: new)."""

    kv: KeyValue
    prev_kv: KeyValue | None = None


@dataclass(frozen=True, slots=True)
class GetResult:
    """A get's outcome: the key-value, or ``None`` if absent (after earlier operations of the
    same transaction)."""

    kv: KeyValue | None


@dataclass(frozen=True, slots=True)
class DeleteResult:
    """A delete's outcome: how many keys it deleted."""

    deleted: int


OpResult = PutResult | GetResult | RangeResult | DeleteResult


@dataclass(frozen=True, slots=True)
class TxnResult:
    """What a transaction did.

    ``succeeded``: every compare held, so the success operations ran (else the failure ones).
    ``revision``: the store revision after the transaction (every write in it has this
    ``mod_revision``; unchanged if it wrote nothing). ``results``: one per operation of the
    branch that ran, in order (:class:`PutResult`, :class:`GetResult`,
    :class:`~aioelastic.store.RangeResult` or :class:`DeleteResult`). Truthy when it succeeded;
    ``result[i]`` is ``result.results[i]``.
    """

    succeeded: bool
    revision: int
    results: tuple[OpResult, ...] = ()

    def __bool__(self) -> bool:
        return self.succeeded

    def __len__(self) -> int:
        return len(self.results)

    def __iter__(self) -> Iterator[OpResult]:
        return iter(self.results)

    def __getitem__(self, index: int) -> OpResult:
        return self.results[index]


@dataclass(frozen=True, slots=True)
class Txn:
    """A checked transaction (see :func:`check_txn`): what a backend's ``_txn`` receives."""

    compare: tuple[Compare, ...] = ()
    success: tuple[TxnOp, ...] = ()
    failure: tuple[TxnOp, ...] = ()


# -- the rules ----------------------------------------------------------------------------------


def _as_tuple(items: Iterable[object], what: str) -> tuple[object, ...]:
    kind = type(items)
    if kind is tuple:
        return items  # type: ignore[return-value]
    if kind is list:  # (the common cases first: the ABC check costs more than the rest)
        return tuple(items)
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise TypeError(f"{what} must be a list, got {type(items).__name__}")
    return tuple(items)


def _key_size(key: str) -> int:
    return len(key) if key.isascii() else len(key.encode("utf-8", "surrogatepass"))


_OP_KINDS = (Put, Get, Range, Delete, DeletePrefix)


def _check_branch(ops: tuple[object, ...], branch: str) -> int:
    """Check one branch's operations (types; etcd's rule that a branch may not put one key
    twice, nor put a key it also deletes); return their size in bytes."""
    if not ops:
        return 0
    size = 0
    puts: list[str] = []
    deleted: list[str] = []
    prefixes: list[str] = []
    for op in ops:
        if isinstance(op, Put):
            key = op.key
            size += (len(key) if key.isascii() else _key_size(key)) + len(op.value)
            puts.append(key)
        elif isinstance(op, Get):
            size += _key_size(op.key)
        elif isinstance(op, (Range, DeletePrefix)):
            size += _key_size(op.prefix)
            if isinstance(op, DeletePrefix):
                prefixes.append(op.prefix)
        elif isinstance(op, Delete):
            size += _key_size(op.key)
            deleted.append(op.key)
        else:
            names = " | ".join(k.__name__ for k in _OP_KINDS)
            raise TypeError(f"{branch}[] must be {names}, got {type(op).__name__}")
    if deleted or prefixes:
        if puts:
            _check_writes(puts, deleted, prefixes, branch)
    elif len(puts) > 1 and len(set(puts)) != len(puts):
        _check_writes(puts, deleted, prefixes, branch)  # (finds the first key put twice)
    return size


def _check_writes(puts: list[str], deleted: list[str], prefixes: list[str], branch: str) -> None:
    """etcd's rule: no key put twice, none both put and deleted (the first offender raises)."""
    seen: set[str] = set()
    points = set(deleted)
    for key in puts:
        if key in seen:
            raise ValueError(f"txn {branch}: key {key!r} is put twice (one write per key)")
        if key in points or any(key.startswith(p) for p in prefixes):
            raise ValueError(f"txn {branch}: key {key!r} is both put and deleted")
        seen.add(key)


def check_txn(
    compare: Iterable[Compare], success: Iterable[TxnOp], failure: Iterable[TxnOp]
) -> Txn:
    """Validate a transaction once, for every backend: types, the size limits
    (:class:`~aioelastic.errors.TxnTooLargeError`) and the one-write-per-key rule
    (``ValueError``)."""
    compares = _as_tuple(compare, "compare")
    successes = _as_tuple(success, "success")
    failures = _as_tuple(failure, "failure")
    for name, items in (("compare", compares), ("success", successes), ("failure", failures)):
        if len(items) > MAX_TXN_OPS:
            raise TxnTooLargeError("ops", MAX_TXN_OPS, len(items), f"its {name} list")
    size = 0
    for c in compares:
        if not isinstance(c, Compare):
            raise TypeError(f"compare[] must be Compare, got {type(c).__name__}")
        key = c.key
        size += (len(key) if key.isascii() else _key_size(key)) + (
            len(c.operand) if isinstance(c.operand, bytes) else 0
        )
    size += _check_branch(successes, "success") + _check_branch(failures, "failure")
    if size > MAX_TXN_BYTES:
        raise TxnTooLargeError("bytes", MAX_TXN_BYTES, size, "its keys and values")
    return Txn(compares, successes, failures)  # type: ignore[arg-type]
