"""A seat's record written off the event loop ends as the last one asked for, whatever order the
worker threads finish in, and a delete is never undone by a write asked for before it
(manager/daemon/seatfile.py), on real files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import anyio
import pytest

from manager import registry
from manager.daemon import seatfile
from manager.daemon.seat import Seat
from manager.workspace.layout import Layout
from protocol.lifecycle import SEAT_RECORD_CAP, decode_seat_record

pytestmark = pytest.mark.anyio


def _seat(root: Path) -> Seat:
    return Seat(
        name="alpha",
        agent="scribe",
        uid="a" * 31,
        cwd=root,
        connector=registry.load_connector("scribe"),
        continuity="exact",
        model=None,
        started_at="2026-12-04T00:00:00Z",
        pointer_path=root / "pointer.json",
    )


def _on_disk(layout: Layout, seat: Seat) -> int | None:
    path = seatfile.record_path(layout, seat.name, seat.uid)
    if not path.exists():
        return None
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    return decode_seat_record(path.read_bytes()[: SEAT_RECORD_CAP + 1], where=str(path)).restarts


def test_a_record_taken_earlier_never_lands_over_a_later_one(tmp_path: Path) -> None:
    layout, seat = Layout.at(tmp_path), _seat(tmp_path)
    seat.restarts = 1
    early = seatfile._take(seat)
    seat.restarts = 2
    late = seatfile._take(seat)
    seatfile._land(layout, seat, *late)
    seatfile._land(layout, seat, *early)
    assert _on_disk(layout, seat) == 2


def test_a_delete_is_not_undone_by_a_record_taken_before_it_but_a_later_save_lands(
    tmp_path: Path,
) -> None:
    layout, seat = Layout.at(tmp_path), _seat(tmp_path)
    seat.restarts = 3
    seatfile.save(layout, seat)
    assert _on_disk(layout, seat) == 3
    before = seatfile._take(seat)
    seatfile.delete(layout, seat)
    seatfile._land(layout, seat, *before)
    assert _on_disk(layout, seat) is None
    # A record asked for after the delete (the durable outlived its seat) is written.
    seat.restarts = 4
    seatfile.save(layout, seat)
    assert _on_disk(layout, seat) == 4


async def test_many_writes_off_the_loop_end_with_the_last_one(tmp_path: Path) -> None:
    layout, seat = Layout.at(tmp_path), _seat(tmp_path)

    async def write(n: int) -> None:
        seat.restarts = n
        await seatfile.save_off_loop(layout, seat)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for n in range(1, 41):
                # Each record is taken when its task starts: in this order, before any await.
                tg.start_soon(write, n)
    assert _on_disk(layout, seat) == 40
    assert seat.record_slot.landed == seat.record_slot.taken == 40
