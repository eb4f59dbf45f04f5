"""The console's model (manager/console/model.py): the fleet roster, this root's seats and the
lifecycle events joined into the rows drawn and the "needs you" rail. Pure: records in, the
picture out, at a fixed instant."""

from __future__ import annotations

from datetime import UTC, datetime

from manager.console.model import Board, Need, age
from protocol.control import SeatRow
from protocol.events import Event, EventDetail
from protocol.fleet import FleetRow

NOW = datetime(2026, 12, 7, 8, 0, 0, tzinfo=UTC)
HERE = "hereinstance00000000000000000"
THERE = "thereinstance0000000000000000"


def fleet(
    name: str, uid: str, instance: str, host: str | None, state: str, **kw: object
) -> FleetRow:
    return FleetRow(
        name=name,
        lifecycle_uid=uid,
        instance=instance,
        host=host,
        state=state,  # type: ignore[arg-type]
        generation=0,
        attempt_id=None,
        presence_instance=instance,
        manager_live=state != "lost",
        **kw,  # type: ignore[arg-type]
    )


def local(name: str, uid: str, state: str = "running", **kw: object) -> SeatRow:
    return SeatRow(
        name=name,
        agent="scribe",
        state=state,
        pid=1,
        cwd="/w",
        lifecycle_uid=uid,
        instance_id=HERE,
        session_id="s",
        continuity="exact",
        restarts=0,
        started_at="2026-12-07T07:00:00.000Z",
        durable="d",
        **kw,  # type: ignore[arg-type]
    )


def event(kind: str, seat: str | None, uid: str | None, **detail: object) -> Event:
    return Event(
        at="2026-12-07T07:59:50.000Z",
        instance=THERE,
        host="host-b",
        seat=seat,
        uid=uid,
        type=kind,  # type: ignore[arg-type]
        detail=EventDetail(**detail),  # type: ignore[arg-type]
    )


def test_age_spells_as_ps_does() -> None:
    assert age("2026-12-07T07:59:51.000Z", NOW) == "9s"
    assert age("2026-12-07T07:55:48.000Z", NOW) == "4m12s"
    assert age("2026-12-07T05:55:00.000Z", NOW) == "2h05m"
    assert age("not an instant", NOW) == "?"
    assert age(None, NOW) == "?"


def test_a_seat_held_here_is_drawn_from_ps_and_one_elsewhere_from_the_roster() -> None:
    board = Board()
    board.roster(
        [
            fleet("alice", "ua", HERE, "host-a", "running"),
            fleet("bob", "ub", THERE, "host-b", "running"),
        ],
        [
            local(
                "alice",
                "ua",
                busy=True,
                turn_started_at="2026-12-07T07:59:48.000Z",
                dead_letters=0,
                tokens_in=120,
                tokens_out=8,
                cost_usd=0.0012,
            )
        ],
        "2026-12-07T08:00:00.000Z",
    )
    alice, bob = board.view(NOW).seats
    assert (alice.name, alice.host, alice.state, alice.turn, alice.here) == (
        "alice",
        "host-a",
        "running",
        "busy 12s",
        True,
    )
    assert (alice.dead, alice.tokens, alice.cost, alice.inbox) == ("0", "120/8", "$0.0012", "-")
    assert (bob.name, bob.host, bob.state, bob.turn, bob.here) == (
        "bob",
        "host-b",
        "running",
        "-",
        False,
    )
    assert (bob.dead, bob.tokens, bob.cost, bob.instance) == ("-", "-", "-", THERE)
    assert board.view(NOW).needs == ()


def test_a_local_seat_the_roster_does_not_list_yet_is_shown_with_this_hosts_label() -> None:
    board = Board()
    board.roster(
        [fleet("alice", "ua", HERE, "host-a", "running")],
        [local("alice", "ua"), local("carol", "uc", state="stopped")],
        "t",
    )
    names = [(s.name, s.host, s.state, s.turn) for s in board.view(NOW).seats]
    assert names == [("alice", "host-a", "running", "idle"), ("carol", "host-a", "stopped", "-")]


def test_events_give_another_hosts_seat_its_turn_dead_letters_tokens_and_budget() -> None:
    board = Board()
    board.roster([fleet("bob", "ub", THERE, "host-b", "running")], [], "t")
    board.apply(event("turn.started", "bob", "ub"))
    [bob] = board.view(NOW).seats
    assert bob.turn == "busy 10s"
    board.apply(event("turn.ended", "bob", "ub", duration_s=1.0, outcome="ok", tokens=300))
    board.apply(event("deadletter.added", "bob", "ub"))
    board.apply(event("deadletter.added", "bob", "ub"))
    board.apply(event("seat.budget_reached", "bob", "ub", limit="seat.tokens_per_day"))
    view = board.view(NOW)
    [bob] = view.seats
    assert (bob.turn, bob.dead, bob.tokens) == ("at budget", "+2", "+300")
    assert [(n.kind, n.seat) for n in view.needs] == [("dead letter", "bob"), ("at budget", "bob")]
    board.apply(event("seat.budget_resumed", "bob", "ub", limit="seat.tokens_per_day"))
    assert [n.kind for n in board.view(NOW).needs] == ["dead letter"]
    # Another lifecycle of the same name is another seat: nothing carries over.
    board.apply(event("seat.removed", "bob", "ub"))
    assert board.view(NOW).needs == ()


def test_the_rail_names_dead_letters_budgets_stuck_seats_lost_hosts_and_refusals() -> None:
    board = Board()
    board.roster(
        [
            fleet("alice", "ua", HERE, "host-a", "running"),
            fleet(
                "eps",
                "ue",
                THERE,
                None,
                "lost",
                since="2026-12-07T07:57:50.000Z",
                takeover="`cotal takeover eps --from " + THERE + "`",
            ),
            fleet("zed", "uz", THERE, None, "lost", since="2026-12-07T07:57:50.000Z"),
        ],
        [
            local("alice", "ua", dead_letters=2, budget="at budget: its tokens_per_day = 10"),
            local("carol", "uc", state="failed", reason="custody moved"),
        ],
        "t",
    )
    board.apply(event("refusal", "alice", "ua", op="start-seat", code="not-stopped"))
    board.refused("dora", "dora stays here: capacity: no room at the destination; free a seat")
    view = board.view(NOW)
    assert [s.state for s in view.seats] == ["running", "failed", "lost 2m10s", "lost 2m10s"]
    assert list(view.needs) == [
        Need(
            "dead letter",
            "alice",
            "alice: 2 dead letter(s): `cotal inbox alice` at its root reads, redelivers or "
            "drops them",
        ),
        Need("at budget", "alice", "alice: at budget: its tokens_per_day = 10"),
        Need("stuck", "carol", "carol: failed: custody moved"),
        Need(
            "lost host",
            None,
            f"{THERE} lost 2m10s ago (last seen 2026-12-07T07:57:50.000Z): eps, zed; "
            f"`cotal takeover eps --from {THERE}`",
        ),
        Need(
            "refused move",
            "dora",
            "dora stays here: capacity: no room at the destination; free a seat",
        ),
        Need(
            "refused",
            "alice",
            "alice: start-seat refused (not-stopped) at 2026-12-07T07:59:50.000Z",
        ),
    ]


def test_a_manager_that_does_not_answer_keeps_the_last_rows_and_says_so() -> None:
    board = Board()
    board.roster([], [local("alice", "ua")], "2026-12-07T07:59:00.000Z")
    board.events_down = None
    board.unreachable("daemon-unreachable: no manager answers")
    view = board.view(NOW)
    assert [s.name for s in view.seats] == ["alice"]
    assert view.status == (
        "manager: DOWN (daemon-unreachable: no manager answers), retrying; rows as last read"
        "  |  events: live  |  read 2026-12-07T07:59:00.000Z"
    )
    board.roster([], [local("alice", "ua", state="stopped")], "2026-12-07T08:00:00.000Z")
    assert board.view(NOW).status.startswith(f"manager: {HERE}  |")
