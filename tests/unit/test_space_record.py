"""The space records a checkpoint carries: strict, bounded, and consistent with their seat."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import msgspec
import pytest

from protocol.checkpoint import (
    INBOX_FILE,
    MAX_CARRIED_HEADERS,
    MAX_CARRIED_MESSAGES,
    CarriedMessage,
    DurableRecord,
    SpaceRecord,
    checkpoint_files,
    decode_inbox,
    decode_seat_checkpoint,
    encode_inbox,
    first_undelivered,
)
from protocol.codec import encode_json
from protocol.errors import DecodeError

UID = "abcdefghijklmnopqrstuvwxyz012"
SEAT = "s1"
FILTER = f"cotal.main.inst.local.{SEAT}.>"
SUBJECT = f"cotal.main.inst.local.{SEAT}.local.operator"


def durable(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": f"dm_local-{SEAT}-{UID}",
        "stream": "DM_main",
        "filterSubject": FILTER,
        "ackWaitMs": 60_000,
        "maxAckPending": 1,
        "creationLowerBound": 3,
        "ackFloor": 4,
        "delivered": 5,
        "firstSeq": 1,
        "lastSeq": 9,
        "startSeq": 5,
    }
    base.update(over)
    return base


def message(seq: int, payload: bytes = b"hi", **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "seq": seq,
        "subject": SUBJECT,
        "headers": {"Nats-Msg-Id": f"m{seq}"},
        "payload": base64.b64encode(payload).decode(),
    }
    base.update(over)
    return base


def inbox_bytes(*messages: dict[str, Any]) -> bytes:
    return b"".join(encode_json(m) + b"\n" for m in messages)


def space(data: bytes, **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "brokerId": "0" * 32,
        "durable": durable(),
        "custody": {"holder": "a" * 26, "generation": 0, "revision": 7},
        "messages": 2,
        "messageBytes": 4,
        "inbox": {
            "file": INBOX_FILE,
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        },
    }
    base.update(over)
    return base


def as_space(doc: dict[str, Any]) -> SpaceRecord:
    return msgspec.convert(doc, SpaceRecord, strict=True)


def test_the_rule_is_the_records_conservative_start() -> None:
    assert first_undelivered(4, 3, 1) == 5
    assert first_undelivered(0, 3, 1) == 3
    assert first_undelivered(4, 3, 8) == 8
    record = msgspec.convert(durable(), DurableRecord, strict=True)
    assert record.start_seq == 5


@pytest.mark.parametrize(
    "over, needle",
    [
        ({"startSeq": 6}, "startSeq 6"),
        ({"ackFloor": 6}, "ackFloor 6"),
        ({"delivered": 10}, "lastSeq 9"),
        ({"firstSeq": 11, "startSeq": 11}, "firstSeq 11"),
        ({"creationLowerBound": 0}, "creationLowerBound"),
        ({"ackWaitMs": 0}, "ackWaitMs"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_bad_durable_records_refuse_by_name(over: dict[str, Any], needle: str) -> None:
    with pytest.raises((msgspec.ValidationError, ValueError)) as exc:
        msgspec.convert(durable(**over), DurableRecord, strict=True)
    assert needle in str(exc.value)


def test_the_inbox_round_trips_and_must_match_its_record() -> None:
    data = inbox_bytes(message(5), message(7))
    record = as_space(space(data))
    got = decode_inbox(data, record)
    assert [m.seq for m in got] == [5, 7] and [m.msg_id for m in got] == ["m5", "m7"]
    assert encode_inbox(got) == data


@pytest.mark.parametrize(
    "lines, needle",
    [
        ([message(5), message(5)], "sequence 5 is not after 5"),
        ([message(4), message(7)], "sequence 4 is not after 4"),
        ([message(5), message(10)], "within lastSeq 9"),
        ([message(5), message(7, subject="cotal.main.inst.local.other.local.x")], "not under"),
        ([message(5)], "holds 1 message(s)"),
        ([message(5), message(7, payload=b"much")], "of 6 bytes"),
        ([message(5), {**message(7), "extra": 1}], "extra"),
    ],
)
def test_an_inbox_that_disagrees_with_its_record_refuses(
    lines: list[dict[str, Any]], needle: str
) -> None:
    data = inbox_bytes(*lines)
    with pytest.raises(ValueError) as exc:
        decode_inbox(data, as_space(space(data)))
    assert needle in str(exc.value)


def test_messages_refuse_bad_subjects_headers_and_payloads() -> None:
    for bad in (
        message(5, subject="cotal.main.inst.local.s1.>"),
        message(5, subject="has space"),
        {**message(5), "payload": "not base64!"},
        message(5, headers={"X": "a\r\nInjected: 1"}),
        message(5, headers={f"H{i}": "v" for i in range(MAX_CARRIED_HEADERS + 1)}),
        message(0),
    ):
        with pytest.raises((msgspec.ValidationError, ValueError)):
            msgspec.convert(bad, CarriedMessage, strict=True)


def test_the_space_record_is_bounded_and_strict() -> None:
    data = inbox_bytes(message(5), message(7))
    for over in (
        {"messages": MAX_CARRIED_MESSAGES + 1},
        {"messageBytes": -1},
        {"brokerId": "not-hex"},
        {"inbox": {"file": "other.jsonl", "bytes": 1, "sha256": "0" * 64}},
        {"messages": 6},  # more than fit between startSeq 5 and lastSeq 9
        {"unknown": True},
    ):
        with pytest.raises((msgspec.ValidationError, ValueError)):
            as_space(space(data, **over))


def _seat(state: dict[str, Any], **over: Any) -> bytes:
    doc: dict[str, Any] = {
        "format": "cotal-seat-checkpoint/v1",
        "entry": {},
        "space": "main",
        "name": SEAT,
        "lifecycleUid": UID,
        "generation": 0,
        "capturedAt": "2026-12-01T10:00:00.000Z",
        "profile": "0" * 64,
        "repository": {
            "base": "0" * 40,
            "untrackedSelection": (
                "git ls-files --others --exclude-standard -z, excluding .cotal/"
            ),
            "status": "",
            "bundle": {"file": "repo.bundle", "bytes": 1, "sha256": "0" * 64},
            "indexDiff": {"file": "index.diff", "bytes": 0, "sha256": "0" * 64},
            "worktreeDiff": {"file": "worktree.diff", "bytes": 0, "sha256": "0" * 64},
            "untracked": {"file": "untracked.tar", "bytes": 0, "sha256": "0" * 64},
            "intentToAdd": [],
        },
        "session": {"continuity": "fresh"},
        "custodyRevision": 7,
        "spaceState": state,
    }
    doc.update(over)
    return encode_json(doc)


def test_the_seat_names_its_inbox_file_for_the_integrity_gate() -> None:
    data = inbox_bytes(message(5), message(7))
    record = decode_seat_checkpoint(_seat(space(data)))
    assert record.space_state is not None
    assert [r.file for r in checkpoint_files(record)][-1] == INBOX_FILE


@pytest.mark.parametrize(
    "state_over, seat_over, needle",
    [
        ({"durable": durable(name=f"dm_local-other-{UID}")}, {}, "durable.name"),
        ({"durable": durable(stream="DM_else")}, {}, "durable.stream"),
        (
            {"durable": durable(filterSubject="cotal.main.inst.local.other.>")},
            {},
            "durable.filterSubject",
        ),
        ({}, {"generation": 3}, "custody.generation"),
        ({}, {"custodyRevision": 8}, "custody.revision"),
    ],
)
def test_a_space_record_for_another_seat_refuses(
    state_over: dict[str, Any], seat_over: dict[str, Any], needle: str
) -> None:
    data = inbox_bytes(message(5), message(7))
    with pytest.raises(DecodeError) as exc:
        decode_seat_checkpoint(_seat(space(data, **state_over), **seat_over))
    assert needle in exc.value.message
