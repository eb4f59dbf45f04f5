"""The fleet roster's join on synthetic broker values: one row per seat lifecycle, its state from
custody, presence and the holder's lease, and every undecodable value shown as such."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from manager.broker.fleet import FleetRow, Snapshot, join
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
from protocol.messages import ManagerLease, Presence, encode

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


Entries = Sequence[tuple[str, bytes]]


def snap(custody: Entries = (), presence: Entries = (), leases: Entries = ()) -> Snapshot:
    return Snapshot(custody=dict(custody), presence=dict(presence), leases=dict(leases))


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
    # Its manager gone (a whole cut, or `cotal down`): held, nowhere to say where.
    assert join(snap(custody=[custody("s", UID1, A)])) == [
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
