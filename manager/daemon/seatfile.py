"""The seat table on disk: one `SeatRecord` per seat under `.cotal/seats/`, so a manager that
died (even by SIGKILL) is succeeded by one that knows which seats were its own.

Each record is a private file (0600 in a 0700 directory) replaced atomically, so a reader sees
the old record or the new one, never half of either. Only the Manager writes here.

A record's two fsyncs wait on the file system's journal for milliseconds, and on the manager's
event loop they held back every other seat: at the ready of 50 resumed seats, a quarter of a
second. `save_off_loop` writes in a worker thread instead. The record is taken on the loop when
the write is asked for and numbered (`seat.RecordSlot`); a write lands only if no later record of
the seat has landed and no delete came after it was taken, so the file always ends as the last
one asked for, whatever order the threads finish in.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import anyio
import structlog

from manager.daemon.seat import Seat
from manager.workspace.layout import Layout
from manager.workspace.private import ensure_private_dir, read_stable, write_private_atomic
from protocol.errors import DecodeError, Refusal
from protocol.lifecycle import (
    SEAT_RECORD_CAP,
    SeatRecord,
    decode_seat_record,
    encode_seat_record,
)

log = structlog.get_logger("cotal.seatfile")


def seats_dir(layout: Layout) -> Path:
    return layout.seats


def record_path(layout: Layout, name: str, uid: str) -> Path:
    return layout.seat_record(name, uid)


def record_of(seat: Seat) -> SeatRecord:
    return SeatRecord(
        version=1,
        name=seat.name,
        agent=seat.agent,
        lifecycle_uid=seat.uid,
        cwd=str(seat.cwd),
        model=seat.model,
        continuity=seat.continuity,
        generation=seat.generation_at_broker,
        custody_revision=seat.custody_revision,
        pointer_path=str(seat.pointer_path),
        started_at=seat.started_at,
        session_id=seat.session_id,
        restarts=seat.restarts,
        state=seat.state,
        reason=seat.reason[:1024] if seat.reason else None,
        last_exit=seat.last_exit,
        allow_send=list(seat.allow_send),
        subscribe=list(seat.subscribe),
        allow_post=list(seat.allow_post),
        profile=seat.profile,
    )


def _take(seat: Seat) -> tuple[int, bytes]:
    slot = seat.record_slot
    slot.taken += 1
    return slot.taken, encode_seat_record(record_of(seat))


def _land(layout: Layout, seat: Seat, number: int, data: bytes) -> None:
    slot = seat.record_slot
    with slot.lock:
        if number <= slot.landed:
            return
        ensure_private_dir(seats_dir(layout))
        write_private_atomic(record_path(layout, seat.name, seat.uid), data)
        slot.landed = number


def save(layout: Layout, seat: Seat) -> None:
    _land(layout, seat, *_take(seat))


async def save_off_loop(layout: Layout, seat: Seat) -> None:
    """`save`, with the record taken now and written in a worker thread."""
    await anyio.to_thread.run_sync(_land, layout, seat, *_take(seat))


def delete(layout: Layout, seat: Seat) -> None:
    slot = seat.record_slot
    with slot.lock:
        # A record asked for before the delete never lands after it.
        slot.landed = slot.taken
        try:
            record_path(layout, seat.name, seat.uid).unlink()
        except FileNotFoundError:
            pass


@dataclass(frozen=True)
class Loaded:
    path: Path
    record: SeatRecord | None
    error: str | None = None


def load_all(layout: Layout) -> list[Loaded]:
    """Every record on disk; an unreadable one is returned with its error, never skipped
    silently, and never deleted (its footprint is still somebody's)."""
    directory = seats_dir(layout)
    if not directory.is_dir():
        return []
    out: list[Loaded] = []
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or not path.name.endswith(".json"):
            continue
        try:
            data = read_stable(
                path, cap=SEAT_RECORD_CAP, what="seat record", require_private=True
            ).data
            record = decode_seat_record(data, where=str(path))
        except (DecodeError, Refusal, OSError) as exc:
            out.append(Loaded(path, None, str(exc)))
            continue
        if path.name != f"{record.name}-{record.lifecycle_uid}.json":
            out.append(Loaded(path, None, "file name does not match the record it holds"))
            continue
        out.append(Loaded(path, record))
    return out
