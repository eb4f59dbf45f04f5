"""Custody at the broker: create at spawn, read at the cut, compare-and-set at the resume."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import structlog
from nats.js import JetStreamContext
from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from manager.broker import grants
from manager.broker.footprint import ensure_kv
from manager.broker.retry import riding_elections
from protocol import names
from protocol.checkpoint import SeatCheckpoint
from protocol.codec import encode_json
from protocol.custody import (
    CustodyRecord,
    HandOffRecord,
    custody_key,
    decode_custody,
    decode_handoff,
    encode_custody,
    encode_handoff,
    handoff_key,
)
from protocol.errors import DecodeError, Refusal
from protocol.instant import now_iso
from protocol.inventory import Inventory
from protocol.refusals import Code

log = structlog.get_logger("cotal.custody")

CALL_S = 5.0


@dataclass(frozen=True)
class Held:
    record: CustodyRecord
    revision: int


R = TypeVar("R")


async def _read_record(
    kv: KeyValue, key: str, what: str, decode: Callable[[bytes], R]
) -> tuple[R, int] | None:
    """A record of this bucket and its revision, or None; an unreadable one is a refusal, never
    something to overwrite."""
    try:
        entry = await riding_elections(f"{what} {key}", lambda: kv.get(key))
    except (KeyNotFoundError, KeyDeletedError):
        return None
    try:
        record = decode(entry.value or b"")
    except DecodeError as exc:
        raise Refusal(
            Code.CUSTODY_MALFORMED,
            f"{what} record {key} is malformed: {exc.message}",
            "inspect the cotal_custody bucket; cotal never overwrites a record it cannot read",
        ) from None
    assert entry.revision is not None
    return record, entry.revision


async def read(kv: KeyValue, seat: str, uid: str) -> Held | None:
    found = await _read_record(
        kv, custody_key(names.SEAT_OWNER, seat, uid), "custody", decode_custody
    )
    return None if found is None else Held(*found)


async def release(kv: KeyValue, seat: str, uid: str, holder: str) -> bool:
    """Delete a seat's custody record only while `holder` holds it, by compare-and-set on the
    revision read: a seat that moved belongs to its new holder, whose record a late teardown
    here must not erase. False when the record is gone or someone else's."""
    held = await read(kv, seat, uid)
    if held is None or held.record.holder != holder:
        return False
    try:
        await kv.delete(custody_key(names.SEAT_OWNER, seat, uid), last=held.revision)
    except KeyWrongLastSequenceError:
        return False
    return True


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
        seat=seat, lifecycle_uid=uid, generation=0, holder=holder, claimed_at=now_iso()
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
            Code.CUSTODY_TAKEN,
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
        claimed_at=now_iso(),
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
            Code.CUSTODY_LOST,
            f"custody of {seat} (uid {uid}) moved since the checkpoint (expected revision "
            f"{expected_revision}); it is held by {who}",
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


async def custody_kv(js: JetStreamContext, space: str, *, replicas: int = 1) -> KeyValue:
    return await ensure_kv(js, names.custody_bucket(space), ttl=None, replicas=replicas)


async def revisions(js: JetStreamContext, inventory: Inventory) -> dict[str, int]:
    """Each planned seat's custody revision, for a capture that must record it; a seat whose
    custody no longer matches the plan refuses, because another root may hold it now."""
    return {name: held.revision for name, held in (await held_for(js, inventory)).items()}


async def held_for(js: JetStreamContext, inventory: Inventory) -> dict[str, Held]:
    """Each planned seat's custody record and revision, as `revisions` checks them."""
    kv = await custody_kv(js, inventory.space)
    out: dict[str, Held] = {}
    for agent in inventory.agents:
        held = await read(kv, agent.name, agent.identity.lifecycle_uid)
        if held is None or held.record.generation != agent.generation:
            raise Refusal(
                Code.CUSTODY_LOST,
                f"seat {agent.name}: custody at the broker no longer matches the plan",
                "another root may hold this seat now; do not capture it here",
            )
        out[agent.name] = held
    return out


def _generation_behind(name: str, generation: int, held: Held, where: str) -> Refusal:
    return Refusal(
        Code.GENERATION_BEHIND,
        f"seat {name}: this checkpoint is at writer generation {generation}, but {where} is at "
        f"generation {held.record.generation}, held by instance {held.record.holder}",
        "this record is stale: the seat was resumed elsewhere; do not launch it here",
    )


async def claim_attempt(
    js: JetStreamContext,
    space: str,
    attempt_id: str,
    records: Mapping[str, SeatCheckpoint],
    *,
    holder: str,
    root: Path,
) -> list[dict[str, Any]]:
    """A destination's whole claim: the attempt key first (one destination wins the whole
    attempt), then each seat's key by compare-and-set against the revision its checkpoint
    recorded, at the successor generation. Returns `{name, generation, revision}` per seat."""
    kv = await custody_kv(js, space)
    for name, record in records.items():
        current = await read(kv, name, record.lifecycle_uid)
        if (
            current is not None
            and current.record.generation > record.generation
            and not (current.record.holder == holder and current.record.attempt_id == attempt_id)
        ):
            raise _generation_behind(name, record.generation, current, "custody")
    await _claim_attempt_key(kv, attempt_id, holder=holder, root=root)
    claims: list[dict[str, Any]] = []
    for name, record in records.items():
        assert record.custody_revision is not None
        held = await claim(
            kv,
            name,
            record.lifecycle_uid,
            expected_revision=record.custody_revision,
            generation=record.generation + 1,
            holder=holder,
            attempt_id=attempt_id,
        )
        claims.append(
            {"name": name, "generation": held.record.generation, "revision": held.revision}
        )
    await _granted(js, space, holder, claims)
    return claims


async def _granted(
    js: JetStreamContext, space: str, holder: str, claims: list[dict[str, Any]]
) -> None:
    """A claimant goes on (its inboxes carried in, its seats started) once the broker grants it
    the seats it won, if the broker serves grants."""
    seats = {c["name"]: int(c["generation"]) for c in claims}
    await grants.wait_granted(js, space, holder, seats)


async def _claim_attempt_key(kv: KeyValue, attempt_id: str, *, holder: str, root: Path) -> None:
    """One destination wins a whole attempt: `attempt.<id>` by exclusive create."""
    claim_key = f"attempt.{attempt_id}"
    mine = encode_json({"holder": holder, "root": str(root)})
    if await create_exclusive(kv, claim_key, mine) is None:

        async def get() -> KeyValue.Entry:
            return await kv.get(claim_key)

        entry = await riding_elections(f"claim {claim_key}", get)
        if entry.value != mine:
            winner = json.loads(entry.value or b"{}")
            raise Refusal(
                Code.CUSTODY_LOST,
                f"attempt {attempt_id} was already claimed by instance {winner.get('holder')} "
                f"at {winner.get('root')}",
                "another destination is resuming these seats; this one must not start them",
            )


async def claim_across(
    js: JetStreamContext,
    space: str,
    attempt_id: str,
    records: Mapping[str, SeatCheckpoint],
    *,
    holder: str,
    root: Path,
    replicas: int = 1,
) -> list[dict[str, Any]]:
    """The claim in a broker the source did not use: the chain of custody continues here at
    generation N+1.

    The recorded revision means nothing in this bucket, so each seat's key is created by
    exclusive create (expected revision 0); a record this broker already holds at a lower
    generation (a chain that left here and came back) is moved by compare-and-set at the
    revision read, and one at N+1 or beyond held by anyone else refuses. Two destinations that
    share this broker still cannot both win; two that do not share it cannot see each other.
    """
    kv = await custody_kv(js, space, replicas=replicas)
    current: dict[str, Held | None] = {}
    for name, record in records.items():
        held = await read(kv, name, record.lifecycle_uid)
        current[name] = held
        if held is None or _mine(held, holder, attempt_id, record.generation + 1):
            continue
        if held.record.generation > record.generation:
            raise _generation_behind(name, record.generation, held, "this broker's custody")
    await _claim_attempt_key(kv, attempt_id, holder=holder, root=root)
    claims: list[dict[str, Any]] = []
    for name, record in records.items():
        generation = record.generation + 1
        held = current[name]
        if held is not None and _mine(held, holder, attempt_id, generation):
            won = held
        elif held is not None:
            won = await claim(
                kv,
                name,
                record.lifecycle_uid,
                expected_revision=held.revision,
                generation=generation,
                holder=holder,
                attempt_id=attempt_id,
            )
        else:
            won = await _create_claim(
                kv, name, record.lifecycle_uid, generation, holder, attempt_id
            )
        claims.append({"name": name, "generation": won.record.generation, "revision": won.revision})
    await _granted(js, space, holder, claims)
    return claims


def _mine(held: Held, holder: str, attempt_id: str, generation: int) -> bool:
    r = held.record
    return r.holder == holder and r.attempt_id == attempt_id and r.generation == generation


async def _create_claim(
    kv: KeyValue, seat: str, uid: str, generation: int, holder: str, attempt_id: str
) -> Held:
    key = custody_key(names.SEAT_OWNER, seat, uid)
    record = CustodyRecord(
        seat=seat,
        lifecycle_uid=uid,
        generation=generation,
        holder=holder,
        claimed_at=now_iso(),
        attempt_id=attempt_id,
    )
    rev = await create_exclusive(kv, key, encode_custody(record))
    if rev is None:
        current = await read(kv, seat, uid)
        if current is not None and _mine(current, holder, attempt_id, generation):
            return current
        who = (
            f"instance {current.record.holder} at generation {current.record.generation}"
            if current
            else "nobody"
        )
        raise Refusal(
            Code.CUSTODY_LOST,
            f"custody of {seat} (uid {uid}) was created in this broker by another claimant "
            f"meanwhile; it is held by {who}",
            "another destination already resumed this seat here; do not start it",
        )
    log.info(
        "custody.claimed_across",
        seat=seat,
        uid=uid,
        generation=generation,
        revision=rev,
        attempt=attempt_id,
    )
    return Held(record, rev)


# -- hand-off: a packed checkpoint carried away from its source root ----------------------------


async def read_handoff(kv: KeyValue, attempt_id: str) -> tuple[HandOffRecord, int] | None:
    return await _read_record(kv, handoff_key(attempt_id), "hand-off", decode_handoff)


async def record_handoff(kv: KeyValue, record: HandOffRecord) -> HandOffRecord:
    """Publish that `record.attempt_id` was packed to be carried away. A standing hand-off of the
    same attempt (a second pack) is kept as first recorded; one that was taken back is replaced,
    by compare-and-set, since packing again carries the seats away again."""
    key = handoff_key(record.attempt_id)
    for _ in range(5):
        if await create_exclusive(kv, key, encode_handoff(record)) is not None:
            log.info("custody.handed_off", attempt=record.attempt_id, sha256=record.sha256)
            return record
        found = await read_handoff(kv, record.attempt_id)
        if found is None:
            continue
        current, revision = found
        if current.taken_back_at is None:
            return current
        try:
            await riding_elections(
                f"hand-off {key}",
                functools.partial(kv.update, key, encode_handoff(record), last=revision),
            )
        except KeyWrongLastSequenceError:
            continue
        log.info("custody.handed_off", attempt=record.attempt_id, sha256=record.sha256)
        return record
    raise Refusal(
        Code.CUSTODY_CONTENDED,
        f"hand-off record {key} kept changing while it was written",
        "make sure one operator packs or takes back this attempt at a time, then retry",
    )


async def take_back(kv: KeyValue, attempt_id: str, *, at: str) -> HandOffRecord | None:
    """Mark a hand-off taken back (the record stays, as the evidence of what the operator did).
    None when there is nothing standing to take back."""
    key = handoff_key(attempt_id)
    for _ in range(5):
        found = await read_handoff(kv, attempt_id)
        if found is None or found[0].taken_back_at is not None:
            return None
        current, revision = found
        updated = msgspec.structs.replace(current, taken_back_at=at)
        try:
            await riding_elections(
                f"take back {key}",
                functools.partial(kv.update, key, encode_handoff(updated), last=revision),
            )
        except KeyWrongLastSequenceError:
            continue
        log.info("custody.taken_back", attempt=attempt_id)
        return updated
    raise Refusal(
        Code.CUSTODY_CONTENDED,
        f"hand-off record {key} kept changing while it was taken back",
        "make sure one operator packs or takes back this attempt at a time, then retry",
    )
