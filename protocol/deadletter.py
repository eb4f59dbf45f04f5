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

from protocol.errors import DecodeError

# How many times one message is handed to a seat before it moves to the seat's dead letters. The
# default equals the crash-restart budget (three in 120 s), so a message that kills its harness
# every time is set aside at its third delivery, before a fourth crash retires the seat.
DEFAULT_MAX_DELIVERIES = 3
MAX_DELIVERIES_LIMIT = 100

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


def prior_deliveries(headers: Mapping[str, str] | None) -> int:
    """The deliveries a message put back into an inbox had before; 0 for any other message, and
    for a header that is not a count (it only ever adds a warning, so a bad one warns less)."""
    raw = (headers or {}).get(PRIOR_DELIVERIES)
    if raw is None or not raw.isascii() or not raw.isdigit() or len(raw) > 7:
        return 0
    return min(int(raw), COUNT_MAX)
