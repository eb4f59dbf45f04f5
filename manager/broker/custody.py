"""Custody at the broker: create at spawn, read at the cut, compare-and-set at the resume."""

from __future__ import annotations

import time
from dataclasses import dataclass

import structlog
from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from manager.broker.retry import riding_elections
from protocol import names
from protocol.custody import CustodyRecord, custody_key, decode_custody, encode_custody
from protocol.errors import DecodeError, Refusal

log = structlog.get_logger("cotal.custody")

CALL_S = 5.0


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(frozen=True)
class Held:
    record: CustodyRecord
    revision: int


async def read(kv: KeyValue, seat: str, uid: str) -> Held | None:
    key = custody_key(names.SEAT_OWNER, seat, uid)
    try:
        entry = await riding_elections(f"custody {key}", lambda: kv.get(key))
    except (KeyNotFoundError, KeyDeletedError):
        return None
    try:
        record = decode_custody(entry.value or b"")
    except DecodeError as exc:
        raise Refusal(
            "custody-malformed",
            f"custody record {key} is malformed: {exc.message}",
            "inspect the cotal_custody bucket; cotal never overwrites a record it cannot read",
        ) from None
    assert entry.revision is not None
    return Held(record, entry.revision)


async def create_exclusive(kv: KeyValue, key: str, value: bytes) -> int | None:
    """Publish `key` only if it has never existed; None when another creator won.

    This is an expected-revision-0 update, not nats-py's `create`: on a replicated bucket that
    helper re-reads the key after losing, and a replica that has not applied the winner's write
    yet makes the loss surface as "key not found" instead of a conflict.
    """
    try:
        return int(await riding_elections(f"create {key}", lambda: kv.update(key, value, last=0)))
    except KeyWrongLastSequenceError:
        return None


async def establish(kv: KeyValue, seat: str, uid: str, holder: str) -> Held:
    """A new lifecycle's first custody, generation 0, by create (the key must not exist)."""
    record = CustodyRecord(
        seat=seat, lifecycle_uid=uid, generation=0, holder=holder, claimed_at=_now()
    )
    rev = await create_exclusive(
        kv, custody_key(names.SEAT_OWNER, seat, uid), encode_custody(record)
    )
    if rev is None:
        # A retry after a lost answer finds its own record: that is a create that worked.
        current = await read(kv, seat, uid)
        if (
            current is not None
            and current.record.holder == holder
            and current.record.generation == 0
        ):
            return current
        raise Refusal(
            "custody-taken",
            f"custody for {seat} (uid {uid}) already exists at the broker",
            "a fresh lifecycle never reuses a uid; report this",
        )
    return Held(record, rev)


async def claim(
    kv: KeyValue,
    seat: str,
    uid: str,
    *,
    expected_revision: int,
    generation: int,
    holder: str,
    attempt_id: str,
) -> Held:
    """Move custody to `holder` at `generation` iff nobody changed it since `expected_revision`.

    A retry by the same holder and attempt finds its own record and is accepted as won.
    """
    key = custody_key(names.SEAT_OWNER, seat, uid)
    record = CustodyRecord(
        seat=seat,
        lifecycle_uid=uid,
        generation=generation,
        holder=holder,
        claimed_at=_now(),
        attempt_id=attempt_id,
    )
    try:
        rev = await riding_elections(
            f"claim {key}", lambda: kv.update(key, encode_custody(record), last=expected_revision)
        )
    except KeyWrongLastSequenceError:
        current = await read(kv, seat, uid)
        if (
            current is not None
            and current.record.holder == holder
            and current.record.attempt_id == attempt_id
            and current.record.generation == generation
        ):
            return current
        who = (
            f"instance {current.record.holder} at generation {current.record.generation}"
            if current
            else "nobody"
        )
        raise Refusal(
            "custody-lost",
            f"custody of {seat} (uid {uid}) moved since the checkpoint (expected revision {expected_revision}); "
            f"it is held by {who}",
            "another destination already resumed this seat; do not start it here",
        ) from None
    log.info(
        "custody.claimed",
        seat=seat,
        uid=uid,
        generation=generation,
        revision=rev,
        attempt=attempt_id,
    )
    return Held(record, rev)
