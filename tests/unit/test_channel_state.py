"""The record of a channel frontier in a checkpoint (`spaceState.channels`): strict, within the
checkpoint's one cap, and absent from the bytes of a record that carries none, so a record
sealed before frontiers travelled verifies as it was signed."""

from __future__ import annotations

from typing import Any

import pytest

from protocol.checkpoint import ChannelState, InboxReader, SpaceRecord
from protocol.codec import decode_json, encode_json
from protocol.errors import DecodeError

SHA = "0" * 64


def _durable(name: str, stream: str, subject: str, *, last: int = 10) -> dict[str, Any]:
    return {
        "name": name,
        "stream": stream,
        "filterSubject": subject,
        "ackWaitMs": 60_000,
        "maxAckPending": 1,
        "creationLowerBound": 1,
        "ackFloor": 2,
        "delivered": 3,
        "firstSeq": 1,
        "lastSeq": last,
        "startSeq": 3,
    }


def _channel(messages: int = 1, file: str = "chan-plan.jsonl") -> dict[str, Any]:
    return {
        "channel": "plan",
        "durable": _durable("chathist_local-b-u-plan", "CHAN_main", "cotal.main.chan.plan"),
        "messages": messages,
        "messageBytes": 5,
        "posts": {"file": file, "bytes": 0, "sha256": SHA},
    }


def _space(**extra: Any) -> dict[str, Any]:
    return {
        "brokerId": "a" * 32,
        "durable": _durable("dm_local-b-u", "DM_main", "cotal.main.inst.local.b.>"),
        "custody": {"holder": "i" * 26, "generation": 0, "revision": 1},
        "messages": 0,
        "messageBytes": 0,
        "inbox": {"file": "inbox.jsonl", "bytes": 0, "sha256": SHA},
        **extra,
    }


def _decode(doc: dict[str, Any]) -> SpaceRecord:
    return decode_json(encode_json(doc), SpaceRecord, what="spaceState", cap=1 << 20)


def test_a_record_without_frontiers_encodes_as_before() -> None:
    record = _decode(_space())
    assert record.channels == []
    assert b"channels" not in encode_json(record)
    assert encode_json(record) == encode_json(_space())


def test_a_frontier_is_named_by_its_file_and_fits_its_window() -> None:
    record = _decode(_space(channels=[_channel()]))
    assert [c.channel for c in record.channels] == ["plan"]
    assert b'"channels"' in encode_json(record)
    with pytest.raises(DecodeError, match="must be 'chan-plan.jsonl', not 'inbox.jsonl'"):
        _decode(_space(channels=[_channel(file="inbox.jsonl")]))
    with pytest.raises(DecodeError, match="9 carried posts of #plan cannot fit"):
        _decode(_space(channels=[_channel(messages=9)]))
    with pytest.raises(DecodeError, match="name each channel once"):
        _decode(_space(channels=[_channel(), _channel()]))
    with pytest.raises(DecodeError, match="unknown field"):
        _decode(_space(channels=[{**_channel(), "extra": 1}]))


def test_the_inbox_and_the_frontiers_share_one_cap() -> None:
    inbox = _durable("dm_local-b-u", "DM_main", "cotal.main.inst.local.b.>", last=20_000)
    inbox["ackFloor"], inbox["delivered"], inbox["startSeq"] = 0, 0, 1
    wide = _durable("chathist_local-b-u-plan", "CHAN_main", "cotal.main.chan.plan", last=20_000)
    wide["ackFloor"], wide["delivered"], wide["startSeq"] = 0, 0, 1
    doc = _space(channels=[{**_channel(messages=4_000), "durable": wide}])
    doc.update(durable=inbox, messages=6_001)
    with pytest.raises(DecodeError, match="carry 10001 messages"):
        _decode(doc)


def test_a_posts_file_is_proven_against_the_channels_one_subject() -> None:
    state = decode_json(encode_json(_channel()), ChannelState, what="channel", cap=1 << 20)

    def line(subject: str) -> bytes:
        return (
            encode_json({"seq": 3, "subject": subject, "headers": {}, "payload": "aGVsbG8="})
            + b"\n"
        )

    reader = InboxReader(state, keep=True)
    reader.feed(line("cotal.main.chan.plan"))
    assert [m.data() for m in reader.finish()] == [b"hello"]
    for wrong in ("cotal.main.chan.planx", "cotal.main.chan.plan.more", "cotal.main.chan.review"):
        other = InboxReader(state, keep=False)
        with pytest.raises(ValueError, match=f"chan-plan.jsonl line 1: subject '{wrong}'"):
            other.feed(line(wrong))
