"""The fleet roster: every seat of a space at its broker, whichever manager holds it.

Read-only. Several managers (each its own instance id, perhaps each on its own host) can share
one broker or cluster; what each of them writes there is enough to say where every seat is:
its custody record (who holds it, at which generation, claimed by which attempt), its presence
entry (which manager says it runs it now), that manager's lease (alive, and on which host) and
its mark beside the custody records (whether it last said it started or it stopped as asked:
a holder with no lease that never said it stopped is `lost`); and while `cotal move` carries a
seat, the packed attempt in the move bucket, whose description names the seats, their
generation and the destination. This module reads the three buckets and the move bucket's
object list as they are and joins them into one row per seat lifecycle; it never creates a
bucket and never writes a key. `instance_gone` waits, read-only too, for one manager's lease to
go; `lost` tells a send whether its recipient's host is gone.

What it reads are claims, not proof: presence and leases lag reality by up to their TTLs. A
value that does not decode is a row (or a note on a row) saying so, never a crash of the
listing, since one bad key must not hide the rest of the fleet.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import anyio
import msgspec
import nats.errors
from nats.js import JetStreamContext
from nats.js.errors import (
    BucketNotFoundError,
    KeyDeletedError,
    KeyNotFoundError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from manager.broker.presence import PRESENCE_CAP
from manager.broker.reader import bucket_entries
from manager.broker.retry import riding_elections
from protocol import names
from protocol.codec import decode_json
from protocol.custody import (
    CustodyRecord,
    HandOffRecord,
    custody_key,
    decode_custody,
    decode_handoff,
)
from protocol.errors import DecodeError
from protocol.fleet import (
    HELD,
    IN_TRANSIT,
    LOST,
    RUNNING,
    STALE_PRESENCE,
    UNREADABLE,
    FleetRow,
    State,
)
from protocol.instant import format_instant
from protocol.messages import MARK_CAP, ManagerLease, ManagerMark, Presence
from protocol.move import CarriedMeta, decode_carried

LEASE_CAP = 4096


@dataclass(frozen=True)
class Snapshot:
    """The raw values of the three buckets, key -> bytes, and the description of each object in
    the move bucket, name -> text (objects without one left out), as read at one pass; and when
    the broker stored each custody and presence value (by its clock: a key missing from these
    has no known time)."""

    custody: Mapping[str, bytes] = field(default_factory=dict)
    presence: Mapping[str, bytes] = field(default_factory=dict)
    leases: Mapping[str, bytes] = field(default_factory=dict)
    moves: Mapping[str, str] = field(default_factory=dict)
    custody_at: Mapping[str, datetime] = field(default_factory=dict)
    presence_at: Mapping[str, datetime] = field(default_factory=dict)


# -- reading ------------------------------------------------------------------------------------


async def _existing_kv(js: JetStreamContext, bucket: str) -> KeyValue | None:
    """The bucket if it exists: a roster must not create the footprint of a space nobody ran."""
    try:
        return await riding_elections(f"bucket {bucket}", functools.partial(js.key_value, bucket))
    except BucketNotFoundError:
        return None


async def _values(js: JetStreamContext, bucket: str) -> dict[str, bytes]:
    values, _ = await _stamped(js, bucket)
    return values


async def _stamped(
    js: JetStreamContext, bucket: str, keys: str = ">"
) -> tuple[dict[str, bytes], dict[str, datetime]]:
    """Each key's value, and when the broker stored it."""
    if await _existing_kv(js, bucket) is None:
        return {}, {}
    entries = await bucket_entries(js, bucket, keys)
    values = {key: entries[key].value for key in sorted(entries)}
    stored = {key: e.created for key, e in entries.items() if e.created is not None}
    return values, stored


async def _carried(js: JetStreamContext, space: str) -> dict[str, str]:
    """Each live object of the move bucket that describes itself; no bucket, nothing carried."""
    bucket = names.move_bucket(space)
    try:
        store = await riding_elections(
            f"move bucket {bucket}", functools.partial(js.object_store, bucket)
        )
    except BucketNotFoundError:
        return {}
    try:
        infos = await riding_elections(
            f"{bucket} objects", functools.partial(store.list, ignore_deletes=True)
        )
    except NotFoundError:
        # The store's word for an empty bucket.
        return {}
    return {
        info.name: info.description
        for info in infos
        if not info.deleted and info.description is not None
    }


async def snapshot(js: JetStreamContext, space: str) -> Snapshot:
    # The move bucket first: a carried object read before the custody and presence it is
    # judged against can only meet newer ones, which say running once the destination runs the
    # seat. Then custody: a seat that moves while this reads shows its newer presence beside
    # its older custody (stale-presence for a moment), never no row at all.
    moves = await _carried(js, space)
    custody, custody_at = await _stamped(js, names.custody_bucket(space))
    presence, presence_at = await _stamped(js, names.presence_bucket(space))
    leases = await _values(js, names.manager_bucket(space))
    return Snapshot(
        custody=custody,
        presence=presence,
        leases=leases,
        moves=moves,
        custody_at=custody_at,
        presence_at=presence_at,
    )


async def roster(js: JetStreamContext, space: str) -> list[FleetRow]:
    return join(await snapshot(js, space))


# -- one manager's end ---------------------------------------------------------------------------

# How often the bucket itself is asked once a renew of the lease is overdue.
GONE_CHECK_S: Final = 1.0


async def _lease_held(kv: KeyValue, key: str) -> bool:
    try:
        await riding_elections(f"lease {key}", functools.partial(kv.get, key))
    except (KeyNotFoundError, KeyDeletedError):
        return False
    return True


async def instance_gone(js: JetStreamContext, space: str, instance_id: str) -> None:
    """Return once the manager lease of `instance_id` (the one `ps --fleet` reads) is gone:
    deleted, purged, or expired by the bucket's TTL; at once if there is none.

    A watch of that one key sees each renew and each delete as it lands, but not an expiry
    (the bucket's TTL ages values out without a marker: the server writes one only for a bucket
    made to ask for it, and ours are not), so once a renew is overdue the bucket is asked,
    every `GONE_CHECK_S`, until the key is gone or a renew comes. While the manager lives this
    costs the watch alone; a watch an election leaves silent only makes the asking start, and
    each ask rides the election as every read here does (`broker-unavailable` past the
    patience). Cancel it to stop waiting."""
    kv = await _existing_kv(js, names.manager_bucket(space))
    if kv is None:
        return
    key = names.lease_key(instance_id)
    # A renew is overdue past its interval plus one check of slack.
    window = names.MANAGER_LEASE_RENEW_S + GONE_CHECK_S
    # Any: nats-py leaves the watcher's methods untyped.
    watcher: Any = await riding_elections(f"watch {key}", functools.partial(kv.watch, key))
    try:
        # The age of the value the watch starts with is unknown: ask at once.
        last_renew = -math.inf
        initial = True
        while True:
            wait = last_renew + window - anyio.current_time()
            if wait <= 0:
                if not await _lease_held(kv, key):
                    return
                wait = GONE_CHECK_S
            try:
                entry = await watcher.updates(timeout=wait)
            except nats.errors.TimeoutError:
                continue
            if entry is None:
                initial = False
                continue
            if entry.operation in ("DEL", "PURGE"):
                return
            if not initial:
                last_renew = anyio.current_time()
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
            try:
                await watcher.stop()
            except Exception:  # a closed connection took the subscription with it
                pass


# -- one seat's host ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Lost:
    """A seat every lifecycle of which is `lost`; `since` as its rows say (None: unknown)."""

    since: str | None


async def _holders(
    js: JetStreamContext, space: str, kv: KeyValue, seat: str, uids: Collection[str] | None
) -> set[str]:
    """Who holds each lifecycle of `seat`: of the uids given, one direct read each; without
    them, the seat's keys read at once. A record missing or unreadable names nobody (the
    roster's row says why)."""
    raw: list[bytes] = []
    if uids is None:
        values, _ = await _stamped(js, names.custody_bucket(space), f"{names.SEAT_OWNER}.{seat}.*")
        raw.extend(values.values())
    else:
        for uid in uids:
            key = custody_key(names.SEAT_OWNER, seat, uid)
            try:
                entry = await riding_elections(f"custody {key}", functools.partial(kv.get, key))
            except (KeyNotFoundError, KeyDeletedError):
                continue
            raw.append(entry.value or b"")
    holders: set[str] = set()
    for value in raw:
        try:
            holders.add(decode_custody(value).holder)
        except DecodeError:
            continue
    return holders


async def lost(
    js: JetStreamContext, space: str, seat: str, uids: Collection[str] | None = None
) -> Lost | None:
    """Whether a send to `seat` queues for a host that is gone: every lifecycle of it the broker
    holds is `lost` as `ps --fleet` says, and since when. None when any is not, or nobody holds
    it. Cheap while a holder lives (its custody records and a lease read each); only a seat
    whose holders all have no lease costs the roster's read, whose join then decides."""
    custody_kv = await _existing_kv(js, names.custody_bucket(space))
    if custody_kv is None:
        return None
    holders = await _holders(js, space, custody_kv, seat, uids)
    if not holders:
        return None
    leases_kv = await _existing_kv(js, names.manager_bucket(space))
    if leases_kv is not None:
        for holder in sorted(holders):
            if await _lease_held(leases_kv, names.lease_key(holder)):
                return None
    rows = [row for row in await roster(js, space) if row.name == seat]
    if not rows or any(row.state != LOST for row in rows):
        return None
    # One spelling of an instant (protocol.instant): the newest sorts last.
    known = [row.since for row in rows if row.since is not None]
    return Lost(max(known) if known else None)


# -- the join (pure) ----------------------------------------------------------------------------


@dataclass
class _Seat:
    name: str
    uid: str
    custody: CustodyRecord | None = None
    presence: Presence | None = None
    # The key exists but its value does not decode.
    custody_unreadable: bool = False
    presence_unreadable: bool = False
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Lease:
    host: str | None
    error: str | None = None
    standby: bool = False


@dataclass(frozen=True)
class _Mark:
    """A manager's last up/down mark, and when the broker stored it: the broker's clock, the
    one every other time compared here is read on (the manager's own `at` is its host's)."""

    state: str
    at: datetime | None


def _seat_key(key: str) -> tuple[str, str] | None:
    parts = key.split(".")
    if len(parts) != 3 or parts[0] != names.SEAT_OWNER:
        return None
    return parts[1], parts[2]


def _decode_presence(data: bytes) -> Presence:
    return decode_json(data, Presence, what="presence entry", cap=PRESENCE_CAP)


def _decode_lease(data: bytes) -> ManagerLease:
    return decode_json(data, ManagerLease, what="manager lease", cap=LEASE_CAP)


def _mismatch(what: str, key: str, seat: str, uid: str) -> str:
    return f"{what} under key {key} names seat {seat} uid {uid}"


def _seats(snap: Snapshot) -> dict[tuple[str, str], _Seat]:
    seats: dict[tuple[str, str], _Seat] = {}

    def at(name: str, uid: str) -> _Seat:
        return seats.setdefault((name, uid), _Seat(name, uid))

    for key, value in snap.custody.items():
        where = _seat_key(key)
        if where is None:
            continue
        seat = at(*where)
        try:
            record = decode_custody(value)
        except DecodeError as exc:
            seat.custody_unreadable = True
            seat.errors.append(exc.message)
            continue
        if (record.seat, record.lifecycle_uid) != where:
            seat.custody_unreadable = True
            seat.errors.append(_mismatch("custody record", key, record.seat, record.lifecycle_uid))
            continue
        seat.custody = record
    for key, value in snap.presence.items():
        where = _seat_key(key)
        if where is None:
            continue
        seat = at(*where)
        try:
            entry = _decode_presence(value)
        except DecodeError as exc:
            seat.presence_unreadable = True
            seat.errors.append(exc.message)
            continue
        if (entry.seat, entry.lifecycle_uid) != where:
            seat.presence_unreadable = True
            seat.errors.append(_mismatch("presence entry", key, entry.seat, entry.lifecycle_uid))
            continue
        seat.presence = entry
    return seats


def _leases(snap: Snapshot) -> dict[str, _Lease]:
    leases: dict[str, _Lease] = {}
    prefix = names.lease_key("")
    for key, value in snap.leases.items():
        if not key.startswith(prefix):
            continue
        instance = key[len(prefix) :]
        try:
            lease = _decode_lease(value)
        except DecodeError as exc:
            leases[instance] = _Lease(None, exc.message)
            continue
        if lease.holder != instance:
            leases[instance] = _Lease(
                None, f"manager lease under key {key} names holder {lease.holder}"
            )
            continue
        # An older cotal's lease carries no host: known alive, place unknown.
        leases[instance] = _Lease(lease.host or None, standby=lease.standby is True)
    return leases


def _standby_order(leases: dict[str, _Lease], rows: list[FleetRow]) -> list[str]:
    """The live standbys, the one that takes a lost seat first (the most free seats, then the
    lowest instance id, as `manager/daemon/standby.py` ranks itself) first."""
    held = _held(rows)
    return sorted(
        (i for i, lease in leases.items() if lease.standby and lease.error is None),
        key=lambda i: (held[i], i),
    )


def _held(rows: list[FleetRow]) -> Counter[str]:
    """How many seat lifecycles each instance holds custody of."""
    return Counter(row.instance for row in rows if row.instance is not None)


def takeover_hint(row_name: str, instance: str | None, standbys: list[str]) -> str:
    """What a `lost` row says will take the seat over: the first live standby, or the command."""
    if standbys:
        return (
            f"standby {standbys[0]} takes it over once its holder's self-fence is waited out "
            "(if the seat's root runs with [failover] enabled)"
        )
    return (
        f"no standby runs: `cotal takeover {row_name} --from {instance}` on any manager of the "
        "space takes it over from its standing checkpoint ([failover] enabled at its root), or "
        "resume it from a cut with `cotal up --restore DIR`"
    )


def _marks(snap: Snapshot) -> dict[str, _Mark]:
    """Each manager's last mark, by instance. One that does not decode is left out: it can only
    turn a `held` row into `lost`, which is what a holder that never said it stopped is."""
    marks: dict[str, _Mark] = {}
    prefix = names.manager_mark_key("")
    for key, value in snap.custody.items():
        if not key.startswith(prefix):
            continue
        try:
            mark = decode_json(value, ManagerMark, what="manager mark", cap=MARK_CAP)
        except DecodeError:
            continue
        if mark.holder == key[len(prefix) :]:
            marks[mark.holder] = _Mark(mark.state, snap.custody_at.get(key))
    return marks


def _last_seen(
    snap: Snapshot, seats: Collection[_Seat], marks: Mapping[str, _Mark]
) -> dict[str, datetime]:
    """Each instance's last sign of life the broker still holds, by its clock: the newest of its
    `up` mark (its manager's start), the custody records it holds (its claims, its spawns) and
    the presence entries it wrote. Its lease would say better, but a lease ages out by the
    bucket's TTL with no trace left, so for a `lost` holder this is a lower bound: it lived at
    least until then, and stopped renewing at most a lease TTL before the roster was read."""
    seen: dict[str, datetime] = {}

    def saw(instance: str, when: datetime | None) -> None:
        if when is not None and (instance not in seen or seen[instance] < when):
            seen[instance] = when

    for instance, mark in marks.items():
        if mark.state == "up":
            saw(instance, mark.at)
    for seat in seats:
        if seat.custody is not None:
            key = custody_key(names.SEAT_OWNER, seat.name, seat.uid)
            saw(seat.custody.holder, snap.custody_at.get(key))
        if seat.presence is not None:
            key = names.presence_key(names.SEAT_OWNER, seat.name, seat.uid)
            saw(seat.presence.instance_id, snap.presence_at.get(key))
    return seen


def _handed_off(snap: Snapshot) -> set[tuple[str, str, int]]:
    """(seat, uid, generation) of every seat a standing hand-off carries away. One that does
    not decode is left out: it only ever adds `in transit` to a seat that is not running."""
    out: set[tuple[str, str, int]] = set()
    for key, value in snap.custody.items():
        if not key.startswith("handoff."):
            continue
        try:
            record: HandOffRecord = decode_handoff(value)
        except DecodeError:
            continue
        if record.taken_back_at is None:
            out.update((s.name, s.lifecycle_uid, s.generation) for s in record.seats)
    return out


@dataclass(frozen=True)
class _Carried:
    meta: CarriedMeta
    generation: int


def _carrying(snap: Snapshot) -> dict[tuple[str, str], _Carried]:
    """(seat, uid) -> the move object carrying it, the one at the highest generation if several
    do (an older move's copy the broker would not drop). A description that does not decode is
    left out: it only ever adds `in transit` to a seat that is not running."""
    out: dict[tuple[str, str], _Carried] = {}
    for text in snap.moves.values():
        try:
            meta = decode_carried(text)
        except DecodeError:
            continue
        for s in meta.seats:
            known = out.get((s.name, s.lifecycle_uid))
            if known is None or known.generation < s.generation:
                out[(s.name, s.lifecycle_uid)] = _Carried(meta, s.generation)
    return out


def _in_move(seat: _Seat, carried: _Carried | None) -> bool:
    """A move carries the seat until its destination runs it: cut at the generation the object
    names (nobody claimed it since), or claimed once by the destination, which does not run it
    yet. A seat taken back at the source, or running at the destination, is not in transit
    whatever copy the bucket still holds."""
    custody = seat.custody
    if carried is None or custody is None:
        return False
    if custody.generation == carried.generation:
        return True
    meta = carried.meta
    claimed = (
        custody.generation == carried.generation + 1
        and custody.holder != meta.source
        and (meta.to is None or custody.holder == meta.to)
    )
    runs_there = seat.presence is not None and seat.presence.instance_id == custody.holder
    return claimed and not runs_there


def _unleased(custody: CustodyRecord, mark: _Mark | None, claimed_at: datetime | None) -> State:
    """A seat whose holder has no lease. Its mark tells a manager that stopped as asked (`down`:
    `held`) from one that never said it stopped (`up`, or no mark: `lost`). A claim is still
    `in transit` while its claimant's manager has not started since: no mark, or a `down` one
    older than the claim (a root whose manager stopped before its `up --restore` claimed). An
    `up` mark is `lost` whatever its age: a running manager claims for itself (the
    destination of a `cotal move`), and one that dies after is gone, not in transit."""
    if mark is not None and mark.state == "up":
        return LOST
    if custody.attempt_id is not None:
        started_since = (
            mark is not None
            and mark.at is not None
            and claimed_at is not None
            and mark.at > claimed_at
        )
        if not started_since:
            return IN_TRANSIT
    return HELD if mark is not None else LOST


def _state(
    seat: _Seat,
    holder_live: bool,
    handed_off: bool,
    moving: bool = False,
    mark: _Mark | None = None,
    claimed_at: datetime | None = None,
) -> State:
    if seat.custody_unreadable or seat.presence_unreadable:
        return UNREADABLE
    if moving:
        return IN_TRANSIT
    custody, presence = seat.custody, seat.presence
    if presence is not None:
        if custody is not None and presence.instance_id == custody.holder:
            return RUNNING
        # Another instance's presence beside a holder that is gone: the holder's loss is what
        # the operator must see, not a presence that ages out in seconds.
        if (
            custody is not None
            and not holder_live
            and not handed_off
            and _unleased(custody, mark, claimed_at) == LOST
        ):
            return LOST
        return STALE_PRESENCE
    assert custody is not None
    # Cut and packed to be carried away. A claim's attempt id stays in the record after the
    # resume, so a seat its live holder merely stopped is held, not in transit.
    if handed_off:
        return IN_TRANSIT
    if holder_live:
        return HELD
    return _unleased(custody, mark, claimed_at)


def load(snap: Snapshot, rows: list[FleetRow] | None = None) -> dict[str, int]:
    """Each manager with a live, readable lease, and how many seat lifecycles it holds;
    `rows` is `join(snap)` when the caller has it already."""
    held = _held(rows if rows is not None else join(snap))
    return {i: held[i] for i, lease in _leases(snap).items() if lease.error is None}


def join(snap: Snapshot) -> list[FleetRow]:
    """One row per (seat, lifecycle uid) that has a custody record or a presence entry, sorted
    by name then uid."""
    leases = _leases(snap)
    handed_off = _handed_off(snap)
    carrying = _carrying(snap)
    marks = _marks(snap)
    seats = _seats(snap)
    last_seen = _last_seen(snap, seats.values(), marks)
    rows: list[FleetRow] = []
    for (name, uid), seat in sorted(seats.items()):
        custody = seat.custody
        carried = carrying.get((name, uid))
        moving = _in_move(seat, carried)
        instance = (
            custody.holder
            if custody is not None
            else seat.presence.instance_id
            if seat.presence is not None
            else None
        )
        lease = leases.get(instance) if instance is not None else None
        errors = list(seat.errors)
        if lease is not None and lease.error is not None:
            errors.append(lease.error)
        state = _state(
            seat,
            holder_live=lease is not None,
            handed_off=custody is not None and (name, uid, custody.generation) in handed_off,
            moving=moving,
            mark=marks.get(instance) if instance is not None else None,
            claimed_at=snap.custody_at.get(custody_key(names.SEAT_OWNER, name, uid)),
        )
        seen = last_seen.get(instance) if instance is not None and state == LOST else None
        rows.append(
            FleetRow(
                name=name,
                lifecycle_uid=uid,
                instance=instance,
                host=lease.host if lease is not None else None,
                state=state,
                generation=custody.generation if custody is not None else None,
                attempt_id=custody.attempt_id if custody is not None else None,
                presence_instance=(
                    seat.presence.instance_id if seat.presence is not None else None
                ),
                manager_live=lease is not None,
                errors=errors,
                # Only a row that says in transit says where to.
                to=carried.meta.to
                if carried is not None and moving and state == IN_TRANSIT
                else None,
                since=format_instant(seen) if seen is not None else None,
            )
        )
    if any(row.state == LOST for row in rows):
        order = _standby_order(leases, rows)
        rows = [
            msgspec.structs.replace(row, takeover=takeover_hint(row.name, row.instance, order))
            if row.state == LOST
            else row
            for row in rows
        ]
    return rows
