"""Loading a ``serve --data-dir`` into an engine, and finding out what on disk is damaged.

:func:`load` only reads: it restores the engine to the last consistent state (the snapshot, then
the log's records while each follows the one before) and reports what it could not use, how many
records that affects, and a partial last record (a torn write). :class:`~._persist.DataDir`
decides what to do about it (refuse, or keep the damaged files aside and accept the loss).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..memory import Commit, MemoryEngine
from ._persist_codec import FORMAT, LEGACY_FORMAT, SNAPSHOT, WAL, decode_line, event_in
from ._persist_codec import snapshot_state as _snapshot_state

__all__ = ["Recovery", "load"]

_BAD_RECORD = (ValueError, KeyError, TypeError, IndexError, AttributeError)
_CRLF = "CRLF line ending (the line endings were converted)"


@dataclass
class Recovery:
    """What :func:`load` found. ``sequence``: the last record in the restored state."""

    sequence: int = 0
    records: int = 0  # records replayed from the log (after the snapshot)
    damage: list[str] = field(default_factory=list)
    affected: int = 0  # records the damage makes unusable
    count_known: bool = True  # False when nothing says how many records are gone
    torn_at: int | None = None  # byte offset of a partial last record in the log
    torn: bytes = b""
    legacy: bool = False  # written in format 1: rewrite it in the current format
    log_exists: bool = False
    high_revision: int = 0  # the highest revision and lease id anything on disk names, so
    high_lease: int = 0  # that none is handed out twice after a loss is accepted


@dataclass
class _Line:
    number: int  # 1-based
    offset: int
    record: dict[str, Any] | None
    problem: str = ""
    stripped: dict[str, Any] | None = None  # a damaged line's record once its CR is removed
    records: int = 1  # how many records a damaged line may have held


def load(path: Path, engine: MemoryEngine) -> Recovery:
    """Restore ``engine`` (fresh) from the data directory at ``path``; never writes."""
    found = Recovery()
    snapshot_seq, snapshot_revision = _load_snapshot(path, engine, found)
    found.sequence = snapshot_seq
    wal = path / WAL
    found.log_exists = wal.exists()
    if not found.log_exists:
        if snapshot_seq or (path / SNAPSHOT).exists():
            found.damage.append(
                f"{WAL} is missing: the records written after the snapshot (record "
                f"{snapshot_seq}, revision {snapshot_revision}) are gone"
            )
            found.count_known = False
        return found
    lines, header = _scan_log(wal, found)
    after = 0
    if header is not None:
        after = int(header["after"])
        found.high_revision = max(found.high_revision, int(header.get("revision", 0)))
        found.high_lease = max(found.high_lease, int(header.get("lease", 0)))
    elif lines or snapshot_seq == 0:
        found.legacy = True  # format 1 logs have no header
    elif not found.legacy:
        found.damage.append(f"{WAL} is empty: its header and every record after {snapshot_seq}")
        found.count_known = False
    if after > snapshot_seq:
        if not (path / SNAPSHOT).exists():
            found.damage.append(
                f"{SNAPSHOT} is missing: it held records 1-{after} (so says {WAL}'s header)"
            )
        elif found.damage:  # the snapshot is damaged
            found.damage[-1] += f": it held records 1-{after} (so says {WAL}'s header)"
            found.count_known = True
        else:
            found.damage.append(
                f"{SNAPSHOT} holds records up to {snapshot_seq} only, but {WAL} follows a "
                f"snapshot of records up to {after}"
            )
    _replay(lines, engine, found, broken=after > snapshot_seq, known_high=after)
    return found


# -- the snapshot


def _load_snapshot(path: Path, engine: MemoryEngine, found: Recovery) -> tuple[int, int]:
    """Restore the snapshot, if there is one and it is intact: its (sequence, revision)."""
    snapshot = path / SNAPSHOT
    if not snapshot.exists():
        return 0, 0
    raw = snapshot.read_bytes()
    if raw.startswith(b"{"):  # format 1: bare JSON, no checksum
        found.legacy = True
        try:
            document: dict[str, Any] | str = json.loads(raw)
        except (ValueError, RecursionError):
            document = "not valid JSON (cut short?)"
        expected = LEGACY_FORMAT
    else:
        document = decode_line(raw[:-1]) if raw.endswith(b"\n") else "cut short (no final newline)"
        expected = FORMAT
    try:
        if isinstance(document, str):
            raise ValueError(document)
        if document.get("format") != expected:
            raise ValueError(f"unknown format {document.get('format')!r}")
        state, sequence = _snapshot_state(document)
    except _BAD_RECORD as exc:
        found.damage.append(f"{SNAPSHOT} is damaged ({exc})")
        found.count_known = False  # the log header, if any, says how many records it held
        return 0, 0
    engine.restore(state)
    found.high_revision = max(found.high_revision, state.revision)
    found.high_lease = max(found.high_lease, state.last_lease_id)
    return sequence, state.revision


# -- the log


def _scan_log(wal: Path, found: Recovery) -> tuple[list[_Line], dict[str, Any] | None]:
    """Every complete line of the log, decoded; the header; a partial last line as torn."""
    data = wal.read_bytes()
    pieces = data.split(b"\n")
    tail = pieces.pop()  # what follows the last newline: a partial record, or nothing
    lines: list[_Line] = []
    offset = 0
    for number, piece in enumerate(pieces, 1):
        decoded = decode_line(piece)
        if isinstance(decoded, str):
            stripped = decode_line(piece[:-1]) if piece.endswith(b"\r") else None
            if isinstance(stripped, dict):
                lines.append(_Line(number, offset, None, _CRLF, stripped))
            else:
                lines.append(_Line(number, offset, None, decoded))
        else:
            lines.append(_Line(number, offset, decoded))
        offset += len(piece) + 1
    if tail:
        held = tail.count(b'"q":')
        if held > 1:  # not one record cut short: each of them is lost
            problem = f"{held} records without a newline"
            lines.append(_Line(len(pieces) + 1, offset, None, problem, records=held))
        elif b"\r" in tail:
            lines.append(_Line(len(pieces) + 1, offset, None, "a last line ending in CR, not LF"))
        else:
            found.torn_at, found.torn = offset, tail
    header = None
    first = lines[0] if lines else None
    document = None if first is None else first.record or first.stripped
    if first is not None and document is not None and "log" in document:
        lines.pop(0)
        if document.get("log") != FORMAT or not isinstance(document.get("after"), int):
            found.damage.append(f"{WAL} has an unknown header {document!r:.80}")
            found.count_known = False
        else:
            header = document
            if first.record is None:
                found.damage.append(f"{WAL}'s header line: {first.problem}")
    return lines, header


def _replay(
    lines: list[_Line], engine: MemoryEngine, found: Recovery, *, broken: bool, known_high: int
) -> None:
    """Apply the records that follow on from the snapshot; describe the rest."""
    expected = found.sequence + 1
    unread: list[_Line] = []  # damaged lines
    beyond: list[int] = []  # intact records not applied: after a gap, damage or out of order
    first_problem = "its snapshot is missing or damaged" if broken else ""
    for line in lines:
        record = line.record
        if record is None or not isinstance(record.get("q"), int):
            problem = line.problem or "not a record"
            unread.append(_Line(line.number, line.offset, None, problem, records=line.records))
            first_problem = first_problem or f"line {line.number}: {problem}"
            if line.stripped is not None:
                _note_high(line.stripped, found)
            broken = True
            continue
        seq = record["q"]
        _note_high(record, found)
        if not broken and seq <= found.sequence and not found.records:
            continue  # covered by the snapshot (a crash came before the log was restarted)
        if not broken and seq == expected:
            try:
                _apply(engine, record)
            except _BAD_RECORD as exc:
                problem = f"record {seq} cannot be replayed ({exc})"
                unread.append(_Line(line.number, line.offset, None, problem))
                first_problem = first_problem or f"line {line.number}: {problem}"
                broken = True
                continue
            found.sequence, found.records, expected = seq, found.records + 1, seq + 1
            continue
        if not broken:
            first_problem = f"line {line.number}: record {seq} where {expected} should follow"
        broken = True
        beyond.append(seq)
    _describe(found, unread, beyond, first_problem, known_high)


def _describe(
    found: Recovery, unread: list[_Line], beyond: list[int], first_problem: str, known_high: int
) -> None:
    end = found.sequence
    # each record a damaged line held moved the revision (and lease ids) by one at most
    lost = sum(line.records for line in unread)
    found.high_revision += lost
    found.high_lease += lost
    high = max([known_high, *beyond]) if beyond or known_high else end
    found.affected = max(high - end, len(beyond) + lost)
    if unread:
        crlf = sum(1 for line in unread if line.problem == _CRLF)
        if crlf == len(unread):
            shown = f"lines {_ranges([line.number for line in unread])}: {_CRLF}"
        else:
            shown = "; ".join(
                f"line {line.number} (byte {line.offset}): {line.problem}" for line in unread[:3]
            )
            shown += f"; and {len(unread) - 3} more" if len(unread) > 3 else ""
        found.damage.append(f"{WAL} has {_lines(len(unread))}: {shown}")
    if beyond:
        present = set(beyond)
        missing = sorted(set(range(max(end, known_high) + 1, max(beyond) + 1)) - present)
        parts = [f"{WAL} breaks off after record {end} ({first_problem})"]
        if missing:
            verb = "is" if len(missing) == 1 else "are"
            parts.append(f"{_noun(len(missing))} {_ranges(missing)} {verb} absent or unreadable")
        if beyond != sorted(present):
            parts.append("records are out of order or repeated")
        intact = f"{len(beyond)} intact {_noun(len(beyond))}"
        parts.append(f"{intact} after the break cannot be applied")
        found.damage.append(", ".join(parts))


def _lines(n: int) -> str:
    return "1 damaged line" if n == 1 else f"{n} damaged lines"


def _noun(n: int) -> str:
    return "record" if n == 1 else "records"


def _note_high(record: dict[str, Any], found: Recovery) -> None:
    if isinstance(record.get("c"), int):
        found.high_revision = max(found.high_revision, record["c"])
    for key in ("g", "x"):
        if isinstance(record.get(key), int):
            found.high_lease = max(found.high_lease, record[key])


def _apply(engine: MemoryEngine, record: dict[str, Any]) -> None:
    if "c" in record:
        events = tuple(event_in(row) for row in record["e"])
        engine.restore_commit(Commit(int(record["c"]), events))
        if "x" in record:  # the commit of a lease's end
            engine.restore_lease_end(int(record["x"]))
    elif "g" in record:
        engine.restore_lease(int(record["g"]), float(record["ttl"]))
    elif "x" in record:
        engine.restore_lease_end(int(record["x"]))
    elif "k" in record:
        engine.restore_compact(int(record["k"]))
    else:
        raise ValueError(f"unknown record {sorted(record)}")


def _ranges(numbers: list[int]) -> str:
    """``[1, 2, 3, 7]`` → ``"1-3, 7"`` (at most five ranges shown)."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and spans[-1][1] == n - 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans[:5])
    more = len(spans) - 5
    return text + (f" and {more} more {'range' if more == 1 else 'ranges'}" if more > 0 else "")
