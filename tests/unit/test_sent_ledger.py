"""`sent.jsonl`, the sent ledger a checkpoint carries (issue 38, item 3): strict both ways. Every
line is one known record, ids strictly increasing, exactly as many as the record names; a
record names no other file; a space record with no ledger encodes as it did before ledgers."""

from __future__ import annotations

import msgspec
import pytest

from protocol.checkpoint import SENT_FILE, FileRef, SentEntry, SentState
from protocol.sentledger import decode_sent, encode_sent

A = "0" * 31 + "a"
B = "0" * 31 + "b"
DIGEST = "0" * 64


def state(entries: int) -> SentState:
    return SentState(entries=entries, file=FileRef(SENT_FILE, 1, DIGEST))


def test_a_ledger_round_trips_in_id_order() -> None:
    entries = [SentEntry(id=B, kind="post", seq=9), SentEntry(id=A, kind="send", seq=4)]
    data = encode_sent(entries)
    assert data == (
        b'{"id":"' + A.encode() + b'","kind":"send","seq":4}\n'
        b'{"id":"' + B.encode() + b'","kind":"post","seq":9}\n'
    )
    assert decode_sent(data, state(2)) == sorted(entries, key=lambda e: e.id)


@pytest.mark.parametrize(
    ("data", "entries", "names"),
    [
        (b'{"id":"' + B.encode() + b'","kind":"send","seq":1}\n'
         b'{"id":"' + A.encode() + b'","kind":"send","seq":2}\n', 2, "line 2: id"),
        (b'{"id":"' + A.encode() + b'","kind":"send","seq":1}\n'
         b'{"id":"' + A.encode() + b'","kind":"send","seq":1}\n', 2, "is not after"),
        (b'{"id":"' + A.encode() + b'","kind":"send","seq":1,"extra":1}\n', 1,
         "sent ledger line 1"),
        (b'{"id":"XYZ","kind":"send","seq":1}\n', 1, "sent ledger line 1"),
        (b'{"id":"' + A.encode() + b'","kind":"reply","seq":1}\n', 1, "sent ledger line 1"),
        (b'{"id":"' + A.encode() + b'","kind":"send","seq":0}\n', 1, "sent ledger line 1"),
        (b'{"id":"' + A.encode() + b'","kind":"send","seq":1}\n', 2, "where the record says 2"),
        (b"x" * 1000, 1, "more than 1 ledger lines"),
    ],
)  # fmt: skip
def test_a_ledger_that_is_not_what_its_record_names_is_refused(
    data: bytes, entries: int, names: str
) -> None:
    with pytest.raises(ValueError, match=names):
        decode_sent(data, state(entries))


def test_the_record_names_only_its_own_file_and_a_bounded_count() -> None:
    with pytest.raises(ValueError, match="must be 'sent.jsonl'"):
        SentState(entries=1, file=FileRef("inbox.jsonl", 1, DIGEST))
    raw = msgspec.json.encode(state(1)).replace(b'"entries":1', b'"entries":0')
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(raw, type=SentState)
