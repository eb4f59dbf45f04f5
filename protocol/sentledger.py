"""`sent.jsonl`: a seat's sent ledger as a checkpoint carries it (manager/broker/sent.py).

One `SentEntry` a line, ids strictly increasing (so each once), exactly as many as the record
names. A ValueError names the first line that is not."""

from __future__ import annotations

from protocol.checkpoint import SentEntry, SentState
from protocol.codec import decode_json, encode_json
from protocol.errors import DecodeError

# One line: the id (32), the kind, a sequence and the keys, with room to spare.
SENT_LINE_CAP = 256


def encode_sent(entries: list[SentEntry]) -> bytes:
    return b"".join(encode_json(e) + b"\n" for e in sorted(entries, key=lambda e: e.id))


def decode_sent(data: bytes, state: SentState) -> list[SentEntry]:
    if len(data) > state.entries * (SENT_LINE_CAP + 1):
        raise ValueError(f"{len(data)} bytes is more than {state.entries} ledger lines can be")
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out: list[SentEntry] = []
    for at, line in enumerate(lines, 1):
        try:
            entry = decode_json(line, SentEntry, what="sent ledger line", cap=SENT_LINE_CAP)
        except DecodeError as exc:
            raise ValueError(f"sent ledger line {at}: {exc.message}") from None
        if out and entry.id <= out[-1].id:
            raise ValueError(f"sent ledger line {at}: id {entry.id} is not after {out[-1].id}")
        out.append(entry)
    if len(out) != state.entries:
        raise ValueError(f"{len(out)} ledger entries, where the record says {state.entries}")
    return out
