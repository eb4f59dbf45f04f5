"""The carried inbox's header caps (issue 21, item 4), and its reading a chunk at a time: gate 1
proves inbox.jsonl while it hashes it, so however the file is cut into chunks the verdict is the
one the whole file gets."""

from __future__ import annotations

from typing import Any

import pytest

from protocol.checkpoint import (
    INBOX_FILE_CAP,
    INBOX_LINE_CAP,
    MAX_CARRIED_HEADER_BYTES,
    MAX_MESSAGE_HEADER_BYTES,
    InboxOverCap,
    InboxReader,
    decode_inbox,
    encode_inbox,
    header_bytes,
)
from tests.unit.test_space_record import as_space, durable, inbox_bytes, message, space


def headers_of(size: int, seq: int) -> dict[str, str]:
    """Headers whose JSON in inbox.jsonl is exactly `size` bytes."""
    h = {"Nats-Msg-Id": f"m{seq}"}
    pads = [f"X-Pad-{i}" for i in range(-(-size // 4000))]
    h.update(dict.fromkeys(pads, ""))
    room = size - header_bytes(h)
    for i, key in enumerate(pads):
        h[key] = "v" * (room // len(pads) + (1 if i < room % len(pads) else 0))
    assert header_bytes(h) == size
    return h


def record_for(data: bytes, lines: list[dict[str, Any]], **over: Any) -> Any:
    last = max(m["seq"] for m in lines)
    return as_space(
        space(
            data,
            durable=durable(lastSeq=max(9, last)),
            messages=len(lines),
            messageBytes=2 * len(lines),
            **over,
        )
    )


def test_a_chunked_read_gives_exactly_what_the_whole_file_does() -> None:
    lines = [message(5), message(6, headers=headers_of(300, 6)), message(7)]
    data = inbox_bytes(*lines)
    record = record_for(data, lines)
    whole = decode_inbox(data, record)
    for cut in range(len(data) + 1):
        for size in (1, 7, 64):
            reader = InboxReader(record, keep=True)
            reader.feed(data[:cut])
            for at in range(cut, len(data), size):
                reader.feed(data[at : at + size])
            assert reader.finish() == whole, (cut, size)
    assert encode_inbox(whole) == data
    # Without keep, nothing is held: what a gate proves it does not keep.
    reader = InboxReader(record, keep=False)
    reader.feed(data)
    assert reader.finish() == [] and reader.messages == []


def test_a_message_at_the_header_cap_is_carried_and_one_byte_more_is_not() -> None:
    ok = [message(5, headers=headers_of(MAX_MESSAGE_HEADER_BYTES, 5))]
    data = inbox_bytes(*ok)
    assert [m.seq for m in decode_inbox(data, record_for(data, ok))] == [5]
    over = [message(5, headers=headers_of(MAX_MESSAGE_HEADER_BYTES + 1, 5))]
    data = inbox_bytes(*over)
    with pytest.raises(InboxOverCap) as exc:
        decode_inbox(data, record_for(data, over))
    assert str(exc.value) == (
        f"inbox.jsonl line 1: message 5 carries {MAX_MESSAGE_HEADER_BYTES + 1} bytes of "
        f"headers, more than the {MAX_MESSAGE_HEADER_BYTES} a message may"
    )
    assert isinstance(exc.value, ValueError)


def test_the_inbox_total_of_headers_is_capped_at_the_line_that_passes_it() -> None:
    n = MAX_CARRIED_HEADER_BYTES // MAX_MESSAGE_HEADER_BYTES
    lines = [message(5 + i, headers=headers_of(MAX_MESSAGE_HEADER_BYTES, 5 + i)) for i in range(n)]
    data = inbox_bytes(*lines)
    assert len(decode_inbox(data, record_for(data, lines))) == n
    # At the cap exactly; the next message's few bytes pass it.
    lines.append(message(5 + n))
    data = inbox_bytes(*lines)
    reader = InboxReader(record_for(data, lines), keep=False)
    with pytest.raises(InboxOverCap) as exc:
        reader.feed(data)
    assert f"inbox.jsonl line {n + 1}: the headers of messages up to {5 + n} are " in str(exc.value)
    assert f"more than the {MAX_CARRIED_HEADER_BYTES} an inbox may carry" in str(exc.value)


def test_a_line_without_its_end_is_held_only_up_to_the_line_cap() -> None:
    lines = [message(5)]
    record = record_for(inbox_bytes(*lines), lines)
    reader = InboxReader(record, keep=False)
    reader.feed(b"x" * INBOX_LINE_CAP)
    with pytest.raises(ValueError, match=f"line 1 is longer than {INBOX_LINE_CAP} bytes"):
        reader.feed(b"x")
    reader = InboxReader(record, keep=False)
    reader.feed(inbox_bytes(*lines)[:-1])
    with pytest.raises(ValueError, match="does not end with a newline"):
        reader.finish()


def test_more_than_the_file_cap_is_refused_before_a_line_of_it_is_decoded() -> None:
    lines = [message(5)]
    reader = InboxReader(record_for(inbox_bytes(*lines), lines), keep=False)
    with pytest.raises(InboxOverCap, match=f"more than {INBOX_FILE_CAP} bytes"):
        reader.feed(bytes(INBOX_FILE_CAP + 1))


def test_the_file_cap_holds_every_inbox_the_caps_admit() -> None:
    """INBOX_FILE_CAP is derived from the caps: the cut never writes an inbox it refuses. The
    worst line per message is measured here, a subject of 512 characters that each escape to 6
    bytes and headers at their cap, so the derivation can be checked, not trusted."""
    from protocol.checkpoint import (
        MAX_CARRIED_BYTES,
        MAX_CARRIED_MESSAGES,
        MAX_SUBJECT_CHARS,
        CarriedMessage,
    )

    prefix = "cotal.main.inst.local.s1."
    subject = prefix + "\x01" * (MAX_SUBJECT_CHARS - len(prefix))
    m = CarriedMessage(seq=2**64 - 1, subject=subject, headers={}, payload="")
    frame = len(encode_inbox([m])) - header_bytes({})
    worst = (
        MAX_CARRIED_MESSAGES * frame
        + MAX_CARRIED_HEADER_BYTES
        + 4 * -(-MAX_CARRIED_BYTES // 3)
        + 4 * MAX_CARRIED_MESSAGES
    )
    assert worst <= INBOX_FILE_CAP
