"""Ordinary teardown of one seat: out of the table, then exactly its footprint at the broker
and on disk (durable, dead letters, presence, custody record, session pointer).

Only an `active` manager frees a seat; a cut or a resume keeps every footprint, so those paths
never come here.
"""

from __future__ import annotations

from typing import Protocol

import anyio
import nats.errors
import structlog
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from manager.broker import channels, custody, deadletter, footprint
from manager.daemon import watchers
from manager.daemon.events import Events
from manager.daemon.seat import Seat
from manager.workspace.identity import InstanceIdentity
from protocol import names

log = structlog.get_logger("cotal.manager")


class TeardownOwner(watchers.PresenceOwner, Protocol):
    """What a teardown needs: the broker it deletes at, the dead-letter counts it keeps, and
    the owner's removal of the seat from the table."""

    @property
    def space(self) -> str: ...

    @property
    def nc(self) -> Client: ...

    @property
    def js(self) -> JetStreamContext: ...

    @property
    def identity(self) -> InstanceIdentity: ...

    @property
    def custody(self) -> KeyValue | None: ...

    @property
    def dead_counts(self) -> dict[str, int]: ...

    @property
    def events(self) -> Events: ...

    def remove(self, seat: Seat) -> None: ...


async def free(mgr: TeardownOwner, seat: Seat) -> None:
    mgr.remove(seat)
    if seat.footprint_owned:
        await deprovision(mgr, seat)


# How long a deprovision waits for a connection the client lost to come back (a cluster's
# client moves to another node well within it) before it leaves the broker's part undone.
RECONNECT_GRACE_S = 2.0
JS_INFO = "$JS.API.INFO"


async def _connected(mgr: TeardownOwner) -> bool:
    """Whether the broker answers the manager within the grace: a JetStream API request (one
    the manager may always make) answered, even by "no responders", proves a live broker; a
    client that lost its connection answers once it has another. Without an answer, every
    broker call would ride the whole election budget for nothing: no election brings back a
    broker that is gone (an embedded one killed, a host down)."""
    try:
        with anyio.fail_after(RECONNECT_GRACE_S + 1.0):
            await mgr.nc.request(JS_INFO, b"", timeout=RECONNECT_GRACE_S)
    except nats.errors.NoRespondersError:
        return True
    except (nats.errors.Error, TimeoutError):
        return False
    return True


async def deprovision(mgr: TeardownOwner, seat: Seat) -> str | None:
    """Exactly this seat's durable, its dead letters, its presence and its pointer. Returns why
    the durable could not be deleted, or None once it is gone."""
    durable_error: str | None = None
    with anyio.CancelScope(shield=True):
        if not await _connected(mgr):
            # The record is kept (the caller says so): the next manager takes the seat back and
            # deletes what is left once the broker is back.
            log.error("durable.delete_skipped", seat=seat.name, reason="broker not answering")
            return (
                f"the broker did not answer the manager within {RECONNECT_GRACE_S:g}s, "
                "so nothing at the broker was deleted"
            )
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


async def _release_custody(mgr: TeardownOwner, seat: Seat) -> None:
    if mgr.custody is None:
        return
    try:
        with anyio.fail_after(5.0):
            released = await custody.release(
                mgr.custody, seat.name, seat.uid, mgr.identity.instance_id
            )
        if released:
            mgr.events.emit("custody.released", seat.name, seat.uid)
        else:
            log.info("custody.left_to_holder", seat=seat.name, uid=seat.uid)
    except Exception as exc:
        log.error("custody.delete_failed", seat=seat.name, error=str(exc))
