"""The seat lifecycle table driven directly, without a daemon: every legal transition, a sample
of illegal ones, and every state reachable from a fresh seat."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.errors import Refusal
from protocol.lifecycle import (
    DELIBERATE_STATES,
    SEAT_EVENTS,
    SEAT_STATES,
    SEAT_TRANSITIONS,
    SeatEvent,
    SeatLifecycle,
    SeatState,
)
from protocol.maintenance import IllegalTransition

LEGAL = [
    (state, event, target)
    for state, row in SEAT_TRANSITIONS.items()
    for event, target in row.items()
]
ILLEGAL = [
    (state, event)
    for state in SEAT_STATES
    for event in SEAT_EVENTS
    if event not in SEAT_TRANSITIONS[state]
]


def test_the_table_covers_exactly_the_declared_states() -> None:
    assert set(SEAT_TRANSITIONS) == set(SEAT_STATES)
    for row in SEAT_TRANSITIONS.values():
        assert set(row) <= set(SEAT_EVENTS)
        assert set(row.values()) <= set(SEAT_STATES)


@pytest.mark.parametrize(("state", "event", "target"), LEGAL)
def test_every_legal_transition(state: SeatState, event: SeatEvent, target: SeatState) -> None:
    machine = SeatLifecycle(state)
    assert machine.allows(event)
    assert machine.apply(event) == target
    assert machine.state == target


@pytest.mark.parametrize(
    ("state", "event"),
    [
        ("starting", "restart"),
        ("running", "ready"),
        ("running", "restart"),
        ("running", "proven"),
        ("exited", "ready"),
        ("stopping", "restart"),
        ("stopping", "exit"),
        ("stopped", "restart"),
        ("stopped", "exit"),
        ("stopped", "ready"),
        ("running", "start"),
        ("exited", "start"),
        ("stopping", "start"),
        ("unproven", "start"),
        ("failed", "start"),
        ("evicting", "start"),
        ("evicted", "start"),
        ("unproven", "restart"),
        ("evicting", "restart"),
        ("evicting", "evict"),
        ("evicted", "restart"),
        ("evicted", "evict"),
        ("retired", "restart"),
        ("retired", "stop"),
        ("failed", "restart"),
    ],
)
def test_illegal_transitions_name_the_state_and_the_event(
    state: SeatState, event: SeatEvent
) -> None:
    assert (state, event) in ILLEGAL
    machine = SeatLifecycle(state)
    assert not machine.allows(event)
    with pytest.raises(IllegalTransition) as info:
        machine.apply(event)
    assert isinstance(info.value, Refusal) and info.value.code == "illegal-transition"
    assert (info.value.machine, info.value.state, info.value.event) == ("seat", state, event)
    assert f'"{state}"' in info.value.message and f'"{event}"' in info.value.message
    # A refused event changes nothing.
    assert machine.state == state


def test_every_illegal_pair_raises() -> None:
    for state, event in ILLEGAL:
        with pytest.raises(IllegalTransition):
            SeatLifecycle(state).apply(event)


def test_every_state_is_reachable_from_a_fresh_seat() -> None:
    assert SeatLifecycle().state == "starting"
    seen: set[SeatState] = {"starting"}
    frontier: list[SeatState] = ["starting"]
    while frontier:
        for target in SEAT_TRANSITIONS[frontier.pop()].values():
            if target not in seen:
                seen.add(target)
                frontier.append(target)
    assert seen == set(SEAT_STATES)


def test_only_an_exit_nobody_asked_for_can_be_restarted() -> None:
    restartable = {s for s in SEAT_STATES if "restart" in SEAT_TRANSITIONS[s]}
    assert restartable == {"exited"}
    # No deliberate stop leads back to a live state by itself: the one way back is the
    # operator's `start` of a seat whose stop was proven.
    back = {
        (state, event)
        for state in DELIBERATE_STATES
        for event, target in SEAT_TRANSITIONS[state].items()
        if target in {"starting", "running", "restarting", "exited"}
    }
    assert back == {("stopped", "start")}
    assert SEAT_TRANSITIONS["stopped"]["start"] == "restarting"


def test_only_a_proven_stop_can_be_started() -> None:
    startable = {s for s in SEAT_STATES if "start" in SEAT_TRANSITIONS[s]}
    assert startable == {"stopped"}


def test_stop_start_restart_keep_one_seat() -> None:
    """`cotal stop`, `cotal start`, then `cotal restart` (stop-and-prove, then start), and a
    start whose launch fails going back to `stopped` through the ordinary stop."""
    seat = SeatLifecycle("running")
    for event, state in [
        ("stop", "stopping"),
        ("proven", "stopped"),
        ("start", "restarting"),
        ("ready", "running"),
        ("stop", "stopping"),
        ("proven", "stopped"),
        ("start", "restarting"),
        ("exit", "exited"),
        ("stop", "stopping"),
        ("proven", "stopped"),
    ]:
        assert seat.apply(event) == state  # type: ignore[arg-type]
    assert seat.deliberate


def test_a_failed_seat_is_started_only_after_a_proven_stop() -> None:
    seat = SeatLifecycle("failed")
    assert not seat.allows("start")
    assert seat.apply("stop") == "stopping" and seat.apply("proven") == "stopped"
    assert seat.apply("start") == "restarting"


def test_a_crash_and_restart_then_a_cut() -> None:
    seat = SeatLifecycle()
    for event, state in [
        ("ready", "running"),
        ("exit", "exited"),
        ("restart", "restarting"),
        ("ready", "running"),
        ("stop", "stopping"),
        ("proven", "stopped"),
        ("stop", "stopped"),
    ]:
        assert seat.apply(event) == state  # type: ignore[arg-type]
    assert seat.deliberate


def test_an_unproven_stop_is_proven_by_the_later_reap_or_a_retry() -> None:
    seat = SeatLifecycle("running")
    seat.apply("stop")
    assert seat.apply("unproven") == "unproven" and seat.deliberate
    assert seat.apply("reaped") == "stopped"
    retry = SeatLifecycle("unproven")
    assert retry.apply("stop") == "stopping" and retry.apply("proven") == "stopped"


def test_an_eviction_ends_evicted_whether_or_not_the_exit_was_proven() -> None:
    proofs: tuple[SeatEvent, ...] = ("proven", "unproven")
    for proof in proofs:
        seat = SeatLifecycle("running")
        seat.apply("evict")
        assert seat.apply("stop") == "evicting"
        assert seat.apply(proof) == "evicted"


def test_the_architecture_page_shows_this_table() -> None:
    """The page's seat table is a rendering of `SEAT_TRANSITIONS`, so it cannot drift from it."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    lines = page[page.index("| state \\ event | ready |") :].splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")][1:]
    assert header == list(SEAT_EVENTS)
    shown: dict[str, dict[str, str]] = {}
    for line in lines[2:]:
        if not line.startswith("| `"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        shown[cells[0].strip("`")] = {e: t for e, t in zip(header, cells[1:], strict=True) if t}
    assert shown == SEAT_TRANSITIONS
