"""A carried message's payload is decoded once where it is proven: its byte count is read off
its strict base64, the record's byte total holds as before, and non-canonical base64 is still
refused; a gate that judges each message further does it in the reader's own pass (`proven`),
and what it keeps is exactly what `decode_inbox` reads."""

from __future__ import annotations

import base64
from typing import Any

import msgspec
import pytest

from protocol.checkpoint import CarriedMessage, InboxReader, decode_inbox
from tests.unit.test_space_record import SUBJECT, as_space, durable, inbox_bytes, message, space


@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 5, 6, 7, 255, 256, 257, 4096])
def test_the_payload_size_is_its_decoded_length(size: int) -> None:
    raw = bytes(range(256)) * (size // 256 + 1)
    m = CarriedMessage(
        seq=1, subject=SUBJECT, headers={}, payload=base64.b64encode(raw[:size]).decode()
    )
    assert m.payload_bytes() == len(m.data()) == size
    assert m.data() == raw[:size]


@pytest.mark.parametrize(
    "payload", ["aGk", "aGk==", "a Gk=", "aGk=\n", "=aGk", "aGk=aGk=", "aGé=", "aG!k"]
)
def test_base64_that_is_not_strict_and_padded_is_refused(payload: str) -> None:
    with pytest.raises(msgspec.ValidationError, match="payload is not valid base64"):
        msgspec.convert(
            {"seq": 1, "subject": SUBJECT, "headers": {}, "payload": payload},
            CarriedMessage,
            strict=True,
        )


@pytest.mark.parametrize(
    "over",
    [
        {"subject": SUBJECT + "\x00"},
        {"subject": SUBJECT.replace("operator", "*")},
        {"subject": SUBJECT + " x"},
        {"headers": {"X": "a\nb"}},
        {"headers": {"X\r": "a"}},
        {"headers": {"X": "a\x00"}},
        {"headers": {"": "a"}},
    ],
)
def test_a_subject_or_header_that_breaks_its_line_is_refused(over: dict[str, Any]) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({**message(5), **over}, CarriedMessage, strict=True)


def test_the_record_byte_total_is_counted_without_decoding_twice() -> None:
    lines = [message(5, payload=b""), message(6, payload=b"a"), message(7, payload=b"abcd")]
    data = inbox_bytes(*lines)
    record = as_space(space(data, durable=durable(lastSeq=9), messages=3, messageBytes=5))
    assert [m.data() for m in decode_inbox(data, record)] == [b"", b"a", b"abcd"]
    off_by_one = as_space(space(data, durable=durable(lastSeq=9), messages=3, messageBytes=6))
    with pytest.raises(ValueError, match="holds 3 message\\(s\\) of 5 bytes"):
        decode_inbox(data, off_by_one)


class _Judging(InboxReader):
    """A gate's own judgment of each message, made in the reader's pass."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.judged: list[tuple[int, int]] = []

    def proven(self, line: int, m: CarriedMessage) -> None:
        self.judged.append((line, m.seq))
        super().proven(line, m)


@pytest.mark.parametrize("keep", [True, False])
def test_a_judging_gate_sees_each_proven_line_once_in_order(keep: bool) -> None:
    lines = [message(5), message(7), message(8)]
    data = inbox_bytes(*lines)
    record = as_space(space(data, durable=durable(lastSeq=9), messages=3, messageBytes=6))
    reader = _Judging(record, keep=keep)
    for at in range(0, len(data), 7):
        reader.feed(data[at : at + 7])
    kept = reader.finish()
    assert reader.judged == [(1, 5), (2, 7), (3, 8)]
    assert kept == (decode_inbox(data, record) if keep else [])
