"""Ordinary teardown of one seat: out of the table, then exactly its footprint at the broker
and on disk (durable, dead letters, presence, custody record, session pointer).

Only an `active` manager frees a seat; a cut or a resume keeps every footprint, so those paths
never come here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import structlog

from manager.broker import channels, custody, deadletter, footprint
from manager.daemon import watchers
from manager.daemon.seat import Seat
from protocol import names

if TYPE_CHECKING:
    from manager.daemon.core import Manager

log = structlog.get_logger("cotal.manager")


async def free(mgr: Manager, seat: Seat) -> None:
    mgr.remove(seat)
    if seat.footprint_owned:
        await deprovision(mgr, seat)


async def deprovision(mgr: Manager, seat: Seat) -> str | None:
    """Exactly this seat's durable, its dead letters, its presence and its pointer. Returns why
    the durable could not be deleted, or None once it is gone."""
    durable_error: str | None = None
    with anyio.CancelScope(shield=True):
        try:
            await deadletter.purge_seat(mgr.js, mgr.space, names.SEAT_OWNER, seat.name, seat.uid)
            mgr.dead_counts.pop(seat.uid, None)
        except Exception as exc:
            log.error("deadletter.purge_failed", seat=seat.name, error=str(exc))
        try:
            await footprint.delete_dm_durable(
                mgr.js, mgr.space, names.SEAT_OWNER, seat.name, seat.uid
            )
        except Exception as exc:
            durable_error = str(exc) or type(exc).__name__
            log.error("durable.delete_failed", seat=seat.name, error=str(exc))
        for channel in seat.subscribe:
            try:
                await channels.delete_chathist_durable(
                    mgr.js, mgr.space, names.SEAT_OWNER, seat.name, seat.uid, channel
                )
            except Exception as exc:
                log.error("durable.delete_failed", seat=seat.name, error=str(exc))
        await watchers.clear_presence(mgr, seat)
        await _release_custody(mgr, seat)
        try:
            seat.pointer_path.unlink()
        except FileNotFoundError:
            pass
    return durable_error


async def _release_custody(mgr: Manager, seat: Seat) -> None:
    if mgr.custody is None:
        return
    try:
        with anyio.fail_after(5.0):
            released = await custody.release(
                mgr.custody, seat.name, seat.uid, mgr.identity.instance_id
            )
        if not released:
            log.info("custody.left_to_holder", seat=seat.name, uid=seat.uid)
    except Exception as exc:
        log.error("custody.delete_failed", seat=seat.name, error=str(exc))
