"""Per-seat writer generation: which custody of one seat identity is current in this root.

Claims are exclusive creates keyed by lifecycle uid, so of concurrent claimants exactly one
wins (docs/design.md, "The core modules, in detail").
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import msgspec

from manager.workspace.layout import Layout
from manager.workspace.private import (
    create_private_exclusive,
    ensure_private_dir,
    fsync_dir,
    read_stable,
)
from protocol.codec import decode_json, encode_json
from protocol.errors import DecodeError, Refusal
from protocol.instant import now_iso
from protocol.inventory import AttemptId, InstanceId, LifecycleUid, SeatName
from protocol.names import GENERATION, check_attempt_id, check_lifecycle_uid, check_seat_name
from protocol.refusals import Code

RECORD_CAP = 4096
_NAME_RE = GENERATION.regex
# create_private_exclusive stages bytes under `.<name>.<hex>.tmp`; a crash can leave one behind.
_TEMP_RE = re.compile(rf"\.(?:{GENERATION.body})\.[0-9a-f]+\.tmp")


class GenerationRecord(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    seat: SeatName
    lifecycle_uid: LifecycleUid
    generation: int
    # The manager instance that claimed this custody.
    holder: InstanceId
    attempt_id: AttemptId
    claimed_at: str


_CURE_MALFORMED = (
    "a writer generation is never re-minted over a damaged record: restore the file, or, "
    "only if you are certain no other root holds this seat, move it aside by hand"
)


def _refuse_malformed(path: Path, detail: str) -> Refusal:
    return Refusal(
        Code.GENERATION_MALFORMED,
        f"writer generation record {path} is malformed: {detail}",
        _CURE_MALFORMED,
    )


def _read_record(
    path: Path, seat: str, generation: int, uid: str | None = None
) -> GenerationRecord:
    try:
        got = read_stable(
            path, cap=RECORD_CAP, what="writer generation record", require_private=True
        )
        record = decode_json(
            got.data, GenerationRecord, what=f"writer generation record {path}", cap=RECORD_CAP
        )
    except DecodeError as exc:
        raise Refusal(Code.GENERATION_MALFORMED, exc.message, _CURE_MALFORMED) from None
    except Refusal as exc:
        raise Refusal(Code.GENERATION_MALFORMED, exc.message, _CURE_MALFORMED) from None
    if record.generation != generation:
        raise _refuse_malformed(
            path, f"it records generation {record.generation} under the name {generation}"
        )
    if record.seat != seat:
        raise _refuse_malformed(path, f"it records seat {record.seat!r}, not {seat!r}")
    if uid is not None and record.lifecycle_uid != uid:
        raise _refuse_malformed(
            path, f"it records lifecycle {record.lifecycle_uid}, not the directory's {uid}"
        )
    return record


def _claims(directory: Path) -> list[int]:
    """Generation numbers present, refusing any entry that is not a claim or a staging temp."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found: list[int] = []
    for name in names:
        if _TEMP_RE.fullmatch(name):
            continue
        if not _NAME_RE.fullmatch(name):
            raise _refuse_malformed(directory / name, "the name is not a generation number")
        try:
            st = os.lstat(directory / name)
        except FileNotFoundError:  # withdrawn while we listed
            continue
        if not stat.S_ISREG(st.st_mode):
            raise _refuse_malformed(
                directory / name, "it is not a regular file (a symlink or a directory)"
            )
        found.append(int(name))
    return sorted(found)


def generation_dir(layout: Layout, space: str, seat: str, uid: str) -> Path:
    """Where the claims of one seat identity (name and lifecycle uid) live."""
    check_lifecycle_uid(uid)
    return layout.seat_generation_dir(space, seat).with_name(f"{seat}-{uid}")


def _legacy_record(layout: Layout, space: str, seat: str, uid: str) -> GenerationRecord | None:
    """The highest claim for `uid` in the name-keyed directory an older root wrote."""
    directory = layout.seat_generation_dir(space, seat)
    for n in reversed(_claims(directory)):
        try:
            record = _read_record(directory / str(n), seat, n)
        except Refusal:
            if not (directory / str(n)).exists():  # withdrawn while we listed
                continue
            raise
        if record.lifecycle_uid == uid:
            return record
    return None


def current_record(layout: Layout, space: str, seat: str, uid: str) -> GenerationRecord | None:
    directory = generation_dir(layout, space, seat, uid)
    claims = _claims(directory)
    record = _read_record(directory / str(claims[-1]), seat, claims[-1], uid) if claims else None
    legacy = _legacy_record(layout, space, seat, uid)
    if legacy is not None and (record is None or legacy.generation > record.generation):
        return legacy
    return record


def current_generation(layout: Layout, space: str, seat: str, uid: str) -> int:
    """The highest generation claimed for this seat identity in this root; 0 when none was."""
    record = current_record(layout, space, seat, uid)
    return record.generation if record is not None else 0


def _same_claim(record: GenerationRecord, uid: str, instance_id: str, attempt_id: str) -> bool:
    return (record.lifecycle_uid, record.holder, record.attempt_id) == (
        uid,
        instance_id,
        attempt_id,
    )


def _ensure_dirs(layout: Layout, space: str, seat: str, uid: str) -> Path:
    directory = generation_dir(layout, space, seat, uid)
    # ensure_private_dir hardens only the last component; every level must be 0700.
    for level in (
        layout.control,
        layout.auth,
        directory.parent.parent,
        directory.parent,
        directory,
    ):
        ensure_private_dir(level)
    return directory


def claim_successor(
    layout: Layout,
    space: str,
    seat: str,
    uid: str,
    expected_current: int,
    instance_id: str,
    attempt_id: str,
) -> int:
    """Claim generation `expected_current + 1` for `seat`, or refuse. Returns the claimed N.

    `expected_current` is the generation the checkpoint was cut at. A root already past it
    means another destination took custody after that cut: refuse, never adopt.
    """
    check_seat_name(seat)
    check_lifecycle_uid(uid)
    check_attempt_id(attempt_id)
    if expected_current < 0:
        raise Refusal(
            Code.BAD_GENERATION,
            f"generation {expected_current} is negative",
            "pass the checkpoint's generation",
        )
    target = expected_current + 1
    directory = _ensure_dirs(layout, space, seat, uid)
    current = current_record(layout, space, seat, uid)
    if current is not None and current.generation >= target:
        if current.generation == target and _same_claim(current, uid, instance_id, attempt_id):
            return target
        raise _refuse_taken(seat, target, current)
    record = GenerationRecord(
        seat=seat,
        lifecycle_uid=uid,
        generation=target,
        holder=instance_id,
        attempt_id=attempt_id,
        claimed_at=now_iso(),
    )
    # Round-trip before publishing: a record this root cannot read back must not become custody.
    data = encode_json(record)
    decode_json(data, GenerationRecord, what="new writer generation record", cap=RECORD_CAP)
    if create_private_exclusive(directory / str(target), data):
        return target
    winner = _read_record(directory / str(target), seat, target, uid)
    if _same_claim(winner, uid, instance_id, attempt_id):
        return target
    raise _refuse_taken(seat, target, winner)


def _refuse_taken(seat: str, target: int, holder: GenerationRecord) -> Refusal:
    return Refusal(
        Code.CUSTODY_LOST,
        f"seat {seat} cannot claim writer generation {target}: this root already records "
        f"generation {holder.generation}, claimed by instance {holder.holder} for attempt "
        f"{holder.attempt_id} (lifecycle {holder.lifecycle_uid}, at {holder.claimed_at})",
        "another resume holds this seat; resume from a checkpoint cut after that custody, or "
        "stop the other resume first; two writers for one seat are never allowed",
    )


def withdraw_claim(
    layout: Layout,
    space: str,
    seat: str,
    uid: str,
    generation: int,
    instance_id: str,
    attempt_id: str,
) -> bool:
    """Remove a claim this holder made in this attempt (an all-or-nothing batch that lost part-
    way backs out exactly what it wrote). Someone else's claim is never removed."""
    directory = generation_dir(layout, space, seat, uid)
    claims = _claims(directory)
    # Only the top claim can be ours to back out; one below it was superseded by someone else.
    if not claims or claims[-1] != generation:
        return False
    path = directory / str(generation)
    record = _read_record(path, seat, generation, uid)
    if (record.holder, record.attempt_id) != (instance_id, attempt_id):
        return False
    os.unlink(path)
    fsync_dir(directory)
    return True
