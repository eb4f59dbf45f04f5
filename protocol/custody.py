"""The custody record: which manager instance may act as a seat, at which writer generation.

One key per seat lifecycle in the `cotal_custody_<space>` bucket. It is only ever changed by
compare-and-set against the revision the changer last saw, so two claimants that start from the
same checkpoint cannot both win: the broker orders them, not a courtesy check in a client.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from protocol.codec import decode_json, encode_json
from protocol.names import AttemptIdField, InstanceIdField, LifecycleUidField, SeatNameField

CUSTODY_CAP = 4096


class CustodyRecord(
    msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True, omit_defaults=True
):
    seat: SeatNameField
    lifecycle_uid: LifecycleUidField
    generation: Annotated[int, msgspec.Meta(ge=0)]
    holder: InstanceIdField
    claimed_at: str
    attempt_id: str | None = None


def custody_key(owner: str, seat: str, uid: str) -> str:
    return f"{owner}.{seat}.{uid}"


def decode_custody(data: bytes) -> CustodyRecord:
    return decode_json(data, CustodyRecord, what="custody record", cap=CUSTODY_CAP)


def encode_custody(record: CustodyRecord) -> bytes:
    return encode_json(record)


HANDOFF_CAP = 64 * 1024


class HandedOffSeat(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    name: SeatNameField
    lifecycle_uid: LifecycleUidField
    generation: Annotated[int, msgspec.Meta(ge=0)]


class HandOffRecord(
    msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True, omit_defaults=True
):
    """A packed checkpoint carried away: the source root must not resume these seats from it.

    Kept beside the custody records (key `handoff.<attempt>`), not in them: a destination that
    shares this broker claims each seat by compare-and-set against the revision its checkpoint
    recorded, so the custody records themselves must stay exactly as the cut left them.
    """

    attempt_id: AttemptIdField
    source_instance: InstanceIdField
    source_root: str
    packed_at: str
    sha256: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
    seats: list[HandedOffSeat]
    taken_back_at: str | None = None


def handoff_key(attempt_id: str) -> str:
    return f"handoff.{attempt_id}"


def decode_handoff(data: bytes) -> HandOffRecord:
    return decode_json(data, HandOffRecord, what="hand-off record", cap=HANDOFF_CAP)


def encode_handoff(record: HandOffRecord) -> bytes:
    return encode_json(record)
