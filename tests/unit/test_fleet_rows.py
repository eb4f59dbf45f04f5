"""The fleet roster's join on synthetic broker values: one row per seat lifecycle, its state from
custody, presence and the holder's lease, and every undecodable value shown as such."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pytest

from manager.broker.fleet import FleetRow, Snapshot, join, takeover_hint
from protocol.codec import encode_json
from protocol.custody import (
    CustodyRecord,
    HandedOffSeat,
    HandOffRecord,
    decode_custody,
    encode_custody,
    encode_handoff,
)
from protocol.errors import DecodeError
from protocol.messages import ManagerLease, ManagerMark, Presence, encode

A = "a" * 26
B = "b" * 26
UID1 = "1" * 26
UID2 = "2" * 26
ATTEMPT = "20261129T140000Z-0a1b2c3d"
WHEN = "2026-11-29T14:00:00.000Z"


def custody(
    seat: str, uid: str, holder: str, generation: int = 0, attempt: str | None = None
) -> tuple[str, bytes]:
    record = CustodyRecord(
        seat=seat,
        lifecycle_uid=uid,
        generation=generation,
        holder=holder,
        claimed_at=WHEN,
        attempt_id=attempt,
    )
    return f"local.{seat}.{uid}", encode_custody(record)


def presence(seat: str, uid: str, instance: str) -> tuple[str, bytes]:
    entry = Presence(
        seat=seat, lifecycle_uid=uid, instance_id=instance, agent="scribe", pid=42, since=WHEN
    )
    return f"local.{seat}.{uid}", encode(entry)


def lease(instance: str, host: str) -> tuple[str, bytes]:
    return f"lease.{instance}", encode(
        ManagerLease(holder=instance, root="/r", pid=7, since=WHEN, host=host)
    )


def handoff(seat: str, uid: str, generation: int, taken_back: bool = False) -> tuple[str, bytes]:
    record = HandOffRecord(
        attempt_id=ATTEMPT,
        source_instance=A,
        source_root="/r",
        packed_at=WHEN,
        sha256="0" * 64,
        seats=[HandedOffSeat(name=seat, lifecycle_uid=uid, generation=generation)],
        taken_back_at=WHEN if taken_back else None,
    )
    return f"handoff.{ATTEMPT}", encode_handoff(record)


def mark(instance: str, state: Literal["up", "down"]) -> tuple[str, bytes]:
    return f"manager.{instance}", encode(ManagerMark(holder=instance, state=state, at=WHEN))


Entries = Sequence[tuple[str, bytes]]


def snap(
    custody: Entries = (),
    presence: Entries = (),
    leases: Entries = (),
    custody_at: Mapping[str, datetime] | None = None,
    presence_at: Mapping[str, datetime] | None = None,
) -> Snapshot:
    return Snapshot(
        custody=dict(custody),
        presence=dict(presence),
        leases=dict(leases),
        custody_at=custody_at or {},
        presence_at=presence_at or {},
    )


def row(name: str, uid: str, **fields: Any) -> FleetRow:
    base: dict[str, Any] = {
        "instance": A,
        "host": "host-a",
        "state": "running",
        "generation": 0,
        "attempt_id": None,
        "presence_instance": A,
        "manager_live": True,
        "errors": [],
    }
    return FleetRow(name=name, lifecycle_uid=uid, **{**base, **fields})


def test_two_managers_each_running_a_seat() -> None:
    rows = join(
        snap(
            custody=[custody("beta", UID2, B), custody("alpha", UID1, A)],
            presence=[presence("alpha", UID1, A), presence("beta", UID2, B)],
            leases=[lease(A, "host-a"), lease(B, "host-b")],
        )
    )
    assert rows == [
        row("alpha", UID1),
        row("beta", UID2, instance=B, host="host-b", presence_instance=B),
    ]


def test_no_presence_is_held_unless_cut_and_not_yet_resumed() -> None:
    # A seat its live holder stopped: held, on its host.
    assert join(snap(custody=[custody("s", UID1, A)], leases=[lease(A, "host-a")])) == [
        row("s", UID1, state="held", presence_instance=None)
    ]
    # Its manager stopped as asked (a whole cut, or `cotal down`: its mark says `down`): held,
    # nowhere to say where.
    assert join(snap(custody=[custody("s", UID1, A), mark(A, "down")])) == [
        row("s", UID1, state="held", host=None, presence_instance=None, manager_live=False)
    ]
    # Claimed by a destination whose manager has not started yet: in transit.
    assert join(snap(custody=[custody("s", UID1, B, 1, ATTEMPT)])) == [
        row(
            "s",
            UID1,
            instance=B,
            host=None,
            state="in transit",
            generation=1,
            attempt_id=ATTEMPT,
            presence_instance=None,
            manager_live=False,
        )
    ]
    # The same claim once its holder runs: the attempt stays in the record, the seat is held.
    assert join(snap(custody=[custody("s", UID1, B, 1, ATTEMPT)], leases=[lease(B, "h")])) == [
        row(
            "s",
            UID1,
            instance=B,
            host="h",
            state="held",
            generation=1,
            attempt_id=ATTEMPT,
            presence_instance=None,
        )
    ]
    # And running when its holder announces it.
    assert join(
        snap(
            custody=[custody("s", UID1, B, 1, ATTEMPT)],
            presence=[presence("s", UID1, B)],
            leases=[lease(B, "h")],
        )
    ) == [
        row("s", UID1, instance=B, host="h", generation=1, attempt_id=ATTEMPT, presence_instance=B)
    ]


T0 = datetime(2026, 11, 29, 14, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_holder_whose_lease_lapsed_without_saying_it_stopped_is_lost() -> None:
    key = f"local.s.{UID1}"

    def lost(since: str | None, **fields: Any) -> FleetRow:
        base: dict[str, Any] = {
            "state": "lost",
            "host": None,
            "presence_instance": None,
            "manager_live": False,
            "since": since,
            "takeover": takeover_hint("s", A, []),
        }
        return row("s", UID1, **{**base, **fields})

    # No lease, its last mark `up`: lost, last seen at the newest of what the broker still
    # holds of it: its mark (its start) and its custody writes, any seat's (another's spawn).
    assert join(
        snap(
            custody=[custody("s", UID1, A), custody("t", UID2, A), mark(A, "up")],
            custody_at={key: at(0), f"local.t.{UID2}": at(30), f"manager.{A}": at(10)},
        )
    ) == [
        lost("2026-11-29T14:00:30.000Z"),
        row(
            "t",
            UID2,
            state="lost",
            host=None,
            presence_instance=None,
            manager_live=False,
            since="2026-11-29T14:00:30.000Z",
            takeover=takeover_hint("t", A, []),
        ),
    ]
    # No mark at all (a manager that never said it stopped): lost, its time unknown here.
    assert join(snap(custody=[custody("s", UID1, A)])) == [lost(None)]
    # A lease, whatever its mark says: held, not lost.
    assert join(snap(custody=[custody("s", UID1, A), mark(A, "up")], leases=[lease(A, "h")])) == [
        row("s", UID1, host="h", state="held", presence_instance=None)
    ]
    # Another instance's presence beside a lost holder: the loss is what the row says.
    assert join(
        snap(
            custody=[custody("s", UID1, A), mark(A, "up")],
            presence=[presence("s", UID1, B)],
            leases=[lease(B, "host-b")],
            custody_at={key: at(0)},
            presence_at={key: at(50)},
        )
    ) == [lost("2026-11-29T14:00:00.000Z", presence_instance=B)]
    # Packed to be carried away, a seat whose source is gone is in transit, not lost.
    assert join(snap(custody=[custody("s", UID1, A), handoff("s", UID1, 0), mark(A, "up")])) == [
        row("s", UID1, state="in transit", host=None, presence_instance=None, manager_live=False)
    ]


def test_a_claim_is_in_transit_until_its_holder_started_since() -> None:
    key = f"local.s.{UID1}"
    claim = custody("s", UID1, B, 1, ATTEMPT)
    base: dict[str, Any] = {
        "instance": B,
        "host": None,
        "generation": 1,
        "attempt_id": ATTEMPT,
        "presence_instance": None,
        "manager_live": False,
    }
    # The root's manager stopped before the claim (a `down` mark older than it): in transit.
    assert join(
        snap(custody=[claim, mark(B, "down")], custody_at={key: at(10), f"manager.{B}": at(0)})
    ) == [row("s", UID1, state="in transit", **base)]
    # It started since and then stopped as asked: held.
    assert join(
        snap(custody=[claim, mark(B, "down")], custody_at={key: at(10), f"manager.{B}": at(20)})
    ) == [row("s", UID1, state="held", **base)]
    # It started (since the claim, or before it: a running manager claims a seat a move brings
    # it) and its lease lapsed: lost.
    for started in (5, 20):
        assert join(
            snap(
                custody=[claim, mark(B, "up")],
                custody_at={key: at(10), f"manager.{B}": at(started)},
            )
        ) == [
            row(
                "s",
                UID1,
                state="lost",
                since=f"2026-11-29T14:00:{max(started, 10):02d}.000Z",
                takeover=takeover_hint("s", B, []),
                **base,
            )
        ]


def test_a_standing_hand_off_at_the_seats_generation_is_in_transit() -> None:
    held = row("s", UID1, state="held", presence_instance=None)
    base = [custody("s", UID1, A), lease(A, "host-a")]
    assert join(snap(custody=[base[0], handoff("s", UID1, 0)], leases=[base[1]])) == [
        row("s", UID1, state="in transit", presence_instance=None)
    ]
    assert join(
        snap(custody=[base[0], handoff("s", UID1, 0, taken_back=True)], leases=[base[1]])
    ) == [held]
    # A hand-off of an older generation is history: the seat came back since.
    assert join(snap(custody=[base[0], handoff("s", UID1, 1)], leases=[base[1]])) == [held]
    # A hand-off that does not decode adds nothing and breaks nothing.
    assert join(snap(custody=[base[0], (f"handoff.{ATTEMPT}", b"{")], leases=[base[1]])) == [held]


def test_presence_not_by_the_holder_is_stale() -> None:
    rows = join(
        snap(
            custody=[custody("s", UID1, A, 1)],
            presence=[presence("s", UID1, B), presence("ghost", UID2, B)],
            leases=[lease(A, "host-a"), lease(B, "host-b")],
        )
    )
    assert rows == [
        row(
            "ghost",
            UID2,
            instance=B,
            host="host-b",
            state="stale-presence",
            generation=None,
            presence_instance=B,
        ),
        row("s", UID1, state="stale-presence", generation=1, presence_instance=B),
    ]


def test_an_undecodable_value_is_a_row_saying_so_and_the_rest_still_list() -> None:
    garbage = b'{"seat": "bad"'
    with pytest.raises(DecodeError) as caught:
        decode_custody(garbage)
    oversized = encode_json({"pad": "x" * 5000})
    wrong_key = custody("other", UID2, A)[1]
    rows = join(
        snap(
            custody=[
                custody("good", UID1, A),
                ("local.bad.zzzzzzzzzzzzzzzzzzzzzzzzzz", garbage),
                ("local.big.yyyyyyyyyyyyyyyyyyyyyyyyyy", oversized),
                ("local.moved.xxxxxxxxxxxxxxxxxxxxxxxxxx", wrong_key),
                (f"attempt.{ATTEMPT}", b'{"holder": "x"}'),
                ("broker.id", b"not json"),
            ],
            presence=[
                presence("good", UID1, A),
                ("local.pres.wwwwwwwwwwwwwwwwwwwwwwwwww", b"\xff"),
            ],
            leases=[lease(A, "host-a"), ("lease.elsewhere", b"[]")],
        )
    )
    unreadable = {
        "host": None,
        "state": "unreadable",
        "generation": None,
        "presence_instance": None,
        "instance": None,
        "manager_live": False,
    }
    assert [(r.name, r.state) for r in rows] == [
        ("bad", "unreadable"),
        ("big", "unreadable"),
        ("good", "running"),
        ("moved", "unreadable"),
        ("pres", "unreadable"),
    ]
    assert rows[0] == row("bad", "z" * 26, **unreadable, errors=[caught.value.message])
    assert rows[1] == row(
        "big",
        "y" * 26,
        **unreadable,
        errors=[f"custody record is malformed: {len(oversized)} bytes exceeds the 4096-byte cap"],
    )
    assert rows[2] == row("good", UID1)
    assert rows[3] == row(
        "moved",
        "x" * 26,
        **unreadable,
        errors=[
            "custody record under key local.moved.xxxxxxxxxxxxxxxxxxxxxxxxxx names seat other "
            f"uid {UID2}"
        ],
    )
    assert rows[4].state == "unreadable" and rows[4].instance is None
    assert len(rows[4].errors) == 1 and rows[4].errors[0].startswith(
        "presence entry is malformed: not valid JSON"
    )


def test_a_lease_that_does_not_decode_or_is_older_leaves_the_host_unknown() -> None:
    old = encode_json({"holder": A, "root": "/r", "pid": 7, "since": WHEN})
    assert join(
        snap(
            custody=[custody("s", UID1, A)],
            presence=[presence("s", UID1, A)],
            leases=[(f"lease.{A}", old)],
        )
    ) == [row("s", UID1, host=None)]
    rows = join(
        snap(
            custody=[custody("s", UID1, A)],
            presence=[presence("s", UID1, A)],
            leases=[(f"lease.{A}", encode_json({"holder": A, "pid": "seven"}))],
        )
    )
    assert len(rows) == 1 and rows[0].host is None and rows[0].state == "running"
    assert rows[0].manager_live is True
    assert len(rows[0].errors) == 1 and rows[0].errors[0].startswith("manager lease is malformed")
    # A lease under another instance's key is not that instance's.
    rows = join(
        snap(
            custody=[custody("s", UID1, A)],
            presence=[presence("s", UID1, A)],
            leases=[(f"lease.{A}", lease(B, "host-b")[1])],
        )
    )
    assert rows == [
        row("s", UID1, host=None, errors=[f"manager lease under key lease.{A} names holder {B}"])
    ]


def test_an_empty_broker_has_no_rows() -> None:
    assert join(Snapshot()) == []


def test_a_lost_row_names_the_standby_that_takes_it_over_first() -> None:
    """Of the live standbys the one with the fewest seats takes a lost seat first (ties by
    instance id), as `manager/daemon/standby.py` ranks itself; without one the row names the
    command."""
    c, d = "c" * 26, "d" * 26

    def standby_lease(instance: str) -> tuple[str, bytes]:
        return f"lease.{instance}", encode(
            ManagerLease(holder=instance, root="/r", pid=7, since=WHEN, host="h", standby=True)
        )

    lost_only = snap(custody=[custody("s", UID1, A), mark(A, "up")])
    [alone] = join(lost_only)
    assert alone.state == "lost"
    assert alone.takeover == takeover_hint("s", A, [])
    assert alone.takeover.startswith(f"no standby runs: `cotal takeover s --from {A}`")

    # d holds a seat, c none: c goes first; B is live but no standby.
    with_standbys = snap(
        custody=[custody("s", UID1, A), custody("t", UID2, d), mark(A, "up")],
        leases=[standby_lease(d), standby_lease(c), lease(B, "host-b")],
    )
    lost = [r for r in join(with_standbys) if r.state == "lost"]
    assert [r.name for r in lost] == ["s"]
    assert lost[0].takeover == takeover_hint("s", A, [c, d])
    assert lost[0].takeover.startswith(f"standby {c} takes it over")
    # A lease that is not a standby's encodes exactly as before the field existed.
    assert b"standby" not in lease(B, "host-b")[1]
