"""The silence watchdog of a session connection, rule by rule on a clock the test moves (the
real-socket behaviour, a silent server given up and a slow one kept, is in test_http_client.py):
silence counts only while the connection has watches, three intervals of it send one probe, and
the connection ends only if nothing at all arrives within one more interval."""

from __future__ import annotations

from helpers.clock import FakeClock

from aioelastic.store.http._client_watchdog import Watchdog

SILENCE = 3.0  # three progress intervals of 1 s


class _Conn:
    """What the watchdog reads of a connection, and what it does to one."""

    def __init__(self, clock: FakeClock, watches: int = 1) -> None:
        self.loop = clock
        self.lost = False
        self.watches: dict[int, object] = {i: object() for i in range(watches)}
        self.last_received = clock.now
        self.unwatched_at = clock.now
        self.aborted: list[str] = []
        self.probes: list[float] = []

    def abort(self, reason: str) -> None:
        self.aborted.append(reason)


def _watch(watches: int = 1) -> tuple[FakeClock, _Conn, Watchdog]:
    clock = FakeClock()
    conn = _Conn(clock, watches)
    dog = Watchdog(conn, SILENCE, lambda: conn.probes.append(clock.now))  # type: ignore[arg-type]
    return clock, conn, dog


def test_it_first_looks_after_one_silence_and_its_interval_is_a_third_of_it() -> None:
    clock, _, dog = _watch()
    assert clock.pending == [103.0]
    assert (dog.silence, dog.interval, dog.probed_at) == (3.0, 1.0, None)


def test_three_silent_intervals_send_one_probe_and_one_more_ends_the_connection() -> None:
    clock, conn, dog = _watch()
    clock.run_until(103.0)
    assert (conn.probes, dog.probed_at, clock.pending) == ([103.0], 103.0, [104.0])
    clock.run_until(103.999)
    assert conn.aborted == []
    clock.run_until(104.0)
    assert conn.probes == [103.0]  # one probe, not one per check
    assert conn.aborted == [
        "nothing received for 3s (3 progress intervals), nor an answer to a probe within 1s"
    ]
    assert clock.pending == []  # it gave up: nothing more to check


def test_a_look_before_the_probes_interval_is_up_waits_for_the_rest_of_it() -> None:
    clock, conn, dog = _watch()
    clock.run_until(103.0)
    clock.fire_next_at(103.5)  # woken early
    assert (conn.aborted, dog.probed_at, clock.pending) == ([], 103.0, [104.0])
    clock.run_until(104.0)
    assert len(conn.aborted) == 1


def test_anything_received_after_the_probe_keeps_the_connection() -> None:
    clock, conn, dog = _watch()
    clock.run_until(103.0)
    conn.last_received = 103.5  # the probe's answer, or any other message
    clock.run_until(104.0)
    assert (conn.aborted, dog.probed_at) == ([], None)
    assert clock.pending == [106.5]  # silence counts from what was received
    clock.run_until(106.5)
    assert conn.probes == [103.0, 106.5]


def test_a_message_received_as_the_probe_went_counts_as_its_answer() -> None:
    clock, conn, dog = _watch()
    clock.run_until(103.0)
    conn.last_received = 103.0
    clock.run_until(104.0)
    assert (conn.aborted, dog.probed_at) == ([], None)


def test_a_message_within_the_silence_moves_the_next_look_on() -> None:
    clock, conn, _ = _watch()
    conn.last_received = 101.0
    clock.run_until(103.0)
    assert (conn.probes, clock.pending) == ([], [104.0])
    clock.run_until(104.0)
    assert conn.probes == [104.0]


def test_silence_counts_only_while_there_are_watches() -> None:
    clock, conn, dog = _watch(watches=0)
    clock.run_until(103.0)
    assert (conn.probes, conn.unwatched_at, clock.pending) == ([], 103.0, [106.0])
    conn.watches[7] = object()  # from now on: silence counts from the last check that found none
    clock.run_until(105.9)
    assert conn.probes == []
    clock.run_until(106.0)
    assert (conn.probes, dog.probed_at) == ([106.0], 106.0)


def test_a_probe_outstanding_when_the_last_watch_goes_is_forgotten() -> None:
    clock, conn, dog = _watch()
    clock.run_until(103.0)
    conn.watches.clear()
    clock.run_until(104.0)
    assert (conn.aborted, dog.probed_at, conn.unwatched_at) == ([], None, 104.0)
    assert clock.pending == [107.0]


def test_a_look_due_in_a_moment_waits_at_least_ten_milliseconds() -> None:
    clock, conn, _ = _watch()
    conn.last_received = 100.001  # the next look is due 1 ms after this one
    clock.run_until(103.0)
    assert clock.pending == [103.01]


def test_a_lost_connection_is_not_looked_at_again() -> None:
    clock, conn, _ = _watch()
    conn.lost = True
    clock.run_until(110.0)
    assert (conn.probes, conn.aborted, clock.pending) == ([], [], [])


def test_cancel_stops_it() -> None:
    clock, conn, dog = _watch()
    clock.run_until(103.0)
    dog.cancel()
    assert clock.pending == []
    clock.run_until(110.0)
    assert conn.aborted == []
