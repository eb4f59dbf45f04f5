"""A seat's dead letters, as records: what rides on a dead letter, and on a message put back.

A dead letter is an inbox message the manager gave up delivering (its delivery cap reached, or
never decodable), kept at the broker beside the inbox. Its payload is the message's bytes exactly
as the inbox held them; what the manager knew when it moved the message rides in headers, so a
payload that is not even a DM is kept whole too. A message put back into the inbox
(`cotal inbox SEAT --redeliver ID`) carries how often it was delivered before, so the harness is
told it is a redelivery and how many came before it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import msgspec

from protocol.checkpoint import (
    INBOX_LINE_CAP,
    CarriedMessage,
    DeadLetterState,
)
from protocol.codec import decode_json
from protocol.errors import DecodeError

# How many times one message is handed to a seat before it moves to the seat's dead letters. The
# default equals the crash-restart budget (three in 120 s), so a message that kills its harness
# every time is set aside at its third delivery, before a fourth crash retires the seat.
DEFAULT_MAX_DELIVERIES = 3
MAX_DELIVERIES_LIMIT = 100

# A turn its model provider did not serve (`provider-unavailable`: down, unreachable, rate
# limited) is tried again after a backoff and never counts toward the cap: an outage is not
# poison. The policy is Temporal's: the first wait, each next one `coefficient` times the last,
# none above the maximum, each drawn at random from its last `jitter` fraction so a fleet of
# seats that met the same outage does not come back in step (`[delivery]` in cotal.toml).
DEFAULT_BACKOFF_INITIAL_S = 2.0
DEFAULT_BACKOFF_COEFFICIENT = 2.0
DEFAULT_BACKOFF_MAX_S = 60.0
DEFAULT_BACKOFF_JITTER = 0.2
BACKOFF_MIN_S = 0.05
BACKOFF_LIMIT_S = 3600.0
BACKOFF_COEFFICIENT_LIMIT = 10.0

# On a message put back into an inbox: the deliveries it had before.
PRIOR_DELIVERIES = "Cotal-Prior-Deliveries"
_SUBJECT = "Cotal-Dead-Subject"
_SOURCE_SEQ = "Cotal-Dead-Source-Seq"
_DELIVERIES = "Cotal-Dead-Deliveries"
_REASON = "Cotal-Dead-Reason"
_AT = "Cotal-Dead-At"

REASON_MAX = 512
SUBJECT_MAX = 1024
INSTANT_MAX = 64
# Far above any cap: a count beyond it is not one this code wrote.
COUNT_MAX = 1_000_000


class DeadLetterMeta(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """What the manager knew when it moved a message: the inbox subject it came on, its sequence
    in the DM stream, how many times it had been delivered (this one included), how its last
    delivery ended, and when."""

    subject: Annotated[str, msgspec.Meta(min_length=1, max_length=SUBJECT_MAX)]
    source_seq: Annotated[int, msgspec.Meta(ge=0)]
    deliveries: Annotated[int, msgspec.Meta(ge=1, le=COUNT_MAX)]
    reason: Annotated[str, msgspec.Meta(max_length=REASON_MAX)]
    dead_at: Annotated[str, msgspec.Meta(min_length=1, max_length=INSTANT_MAX)]


def one_line(text: str, cap: int = REASON_MAX) -> str:
    """`text` as one header value: control characters (CR and LF above all, which would end the
    header) become spaces, and it is cut at `cap` characters."""
    flat = "".join(" " if ord(c) < 0x20 or ord(c) == 0x7F else c for c in text).strip()
    return flat[:cap]


def headers_of(meta: DeadLetterMeta) -> dict[str, str]:
    return {
        _SUBJECT: meta.subject,
        _SOURCE_SEQ: str(meta.source_seq),
        _DELIVERIES: str(meta.deliveries),
        _REASON: one_line(meta.reason),
        _AT: meta.dead_at,
    }


def _count(headers: Mapping[str, str], key: str, *, low: int) -> int:
    raw = headers.get(key)
    if raw is None or not raw.isascii() or not raw.isdigit() or len(raw) > 7:
        raise DecodeError("dead letter", f"header {key} is missing or not a count")
    value = int(raw)
    if not low <= value <= COUNT_MAX:
        raise DecodeError("dead letter", f"header {key} is out of range")
    return value


def meta_of(headers: Mapping[str, str] | None) -> DeadLetterMeta:
    """The record a dead letter's headers carry; DecodeError when they are not ours."""
    if not headers:
        raise DecodeError("dead letter", "no headers")
    try:
        return msgspec.convert(
            {
                "subject": headers.get(_SUBJECT),
                "sourceSeq": _count(headers, _SOURCE_SEQ, low=0),
                "deliveries": _count(headers, _DELIVERIES, low=1),
                "reason": headers.get(_REASON, ""),
                "deadAt": headers.get(_AT),
            },
            DeadLetterMeta,
        )
    except msgspec.ValidationError as exc:
        raise DecodeError("dead letter", str(exc)) from None


def carried_headers(meta: DeadLetterMeta) -> dict[str, str]:
    """What a dead letter carries through a cut: its `Cotal-Dead-*` headers and nothing else (no
    message id: the destination's import is idempotent by the letter's own source sequence and
    instant, which a rerun finds already there)."""
    return headers_of(meta)


def decode_dead_letters(data: bytes, state: DeadLetterState, subject: str) -> list[CarriedMessage]:
    """`dead-letters.jsonl`, proven to be exactly what its record names: one `CarriedMessage`
    a line under `INBOX_LINE_CAP`, each on the seat's own dead-letter `subject`, strictly
    increasing ids, headers that are a dead letter's, and the count and payload bytes the
    record says. A ValueError names the first line that is not."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out: list[CarriedMessage] = []
    payload = 0
    for at, line in enumerate(lines, 1):
        try:
            letter = decode_json(
                line, CarriedMessage, what="carried dead letter", cap=INBOX_LINE_CAP
            )
            meta_of(letter.headers)
        except DecodeError as exc:
            raise ValueError(f"dead letter line {at}: {exc.message}") from None
        if letter.subject != subject:
            raise ValueError(f"dead letter line {at} is on {letter.subject!r}, not {subject!r}")
        if out and letter.seq <= out[-1].seq:
            raise ValueError(f"dead letter line {at}: id {letter.seq} is not after {out[-1].seq}")
        payload += letter.payload_bytes()
        out.append(letter)
    if len(out) != state.letters or payload != state.letter_bytes:
        raise ValueError(
            f"{len(out)} dead letters of {payload} bytes, where the record says "
            f"{state.letters} of {state.letter_bytes}"
        )
    return out


def prior_deliveries(headers: Mapping[str, str] | None) -> int:
    """The deliveries a message put back into an inbox had before; 0 for any other message, and
    for a header that is not a count (it only ever adds a warning, so a bad one warns less)."""
    raw = (headers or {}).get(PRIOR_DELIVERIES)
    if raw is None or not raw.isascii() or not raw.isdigit() or len(raw) > 7:
        return 0
    return min(int(raw), COUNT_MAX)
