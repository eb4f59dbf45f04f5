"""The Manager's watchers at the broker: its lease and its up/down mark, each seat's presence,
the custody watch and the eviction it demands.

Watchers report and stop; they never relaunch. A seat whose custody moves to another holder or
generation (or whose record disappears) is evicted at once: stopped, proven, dropped from the
table, nothing deprovisioned, since the durable and the custody record are the new holder's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

import anyio
import msgspec
import structlog
from anyio.abc import TaskGroup
from nats.js.kv import KeyValue

from manager.daemon.process import SeatHandle
from manager.daemon.seat import Seat
from manager.registry import FileConfig
from manager.workspace.identity import InstanceIdentity
from manager.workspace.layout import Layout
from protocol import names
from protocol.custody import decode_custody
from protocol.errors import DecodeError, Refusal
from protocol.instant import now_iso
from protocol.messages import ManagerLease, ManagerMark, Presence, encode

log = structlog.get_logger("cotal.manager")


class PresenceOwner(Protocol):
    """What a presence delete needs: the bucket, if the manager has made it yet."""

    @property
    def presence(self) -> KeyValue | None: ...


class WatchOwner(Protocol):
    """What the watchers may ask of the Manager: they read the table and its buckets, and an
    eviction is the owner's stop and removal, so the watchers never write the table."""

    @property
    def identity(self) -> InstanceIdentity: ...

    @property
    def layout(self) -> Layout: ...

    @property
    def started_at(self) -> str: ...

    @property
    def config(self) -> FileConfig: ...

    @property
    def seats(self) -> Mapping[str, Seat]: ...

    @property
    def tg(self) -> TaskGroup | None: ...

    def presence_bucket(self) -> KeyValue: ...

    def custody_bucket(self) -> KeyValue: ...

    async def stop_and_prove(self, seat: Seat, *, graceful: bool) -> None: ...

    def remove(self, seat: Seat) -> None: ...


async def clear_presence(mgr: PresenceOwner, seat: Seat) -> None:
    bucket = mgr.presence
    if bucket is None:
        return
    try:
        with anyio.fail_after(2.0):
            await bucket.delete(names.presence_key(names.SEAT_OWNER, seat.name, seat.uid))
    except Exception as exc:
        log.warning("presence.delete_failed", seat=seat.name, error=str(exc))


async def put_mark(
    custody: KeyValue | None, instance_id: str, state: Literal["up", "down"]
) -> None:
    """Say at the broker, beside the custody records, that this manager started or stops as
    asked: what tells `cotal ps --fleet` a holder whose lease lapsed (`lost`, its last mark
    `up`) from one that stopped on purpose (`held`), and a send that its mail waits for a host
    that is gone. Bounded and never raised: a mark the broker misses leaves the older one, so at
    worst a stopped manager's seats read `lost` (said in the log)."""
    if custody is None:
        return
    mark = ManagerMark(holder=instance_id, state=state, at=now_iso())
    try:
        with anyio.fail_after(2.0):
            await custody.put(names.manager_mark_key(instance_id), encode(mark))
    except Exception as exc:
        log.warning("manager.mark_failed", state=state, error=str(exc) or type(exc).__name__)


async def _keep_putting(
    bucket: KeyValue,
    key: str,
    value: bytes,
    every_s: float,
    event: str,
    keep: Callable[[], bool] = lambda: True,
    acked: Callable[[float], None] | None = None,
    **what: Any,
) -> None:
    """Put `value` under `key` every `every_s` while `keep()`; a put the broker misses is
    logged, not raised, since the next one renews it before the bucket's TTL ends it. `acked`
    is told the monotonic time each acknowledged put was sent."""
    while keep():
        sent_at = time.monotonic()
        try:
            with anyio.fail_after(2.0):
                await bucket.put(key, value)
        except Exception as exc:
            log.warning(event, error=str(exc), **what)
        else:
            if acked is not None:
                acked(sent_at)
        await anyio.sleep(every_s)


class Watchers:
    def __init__(self, mgr: WatchOwner) -> None:
        self.mgr = mgr

    async def lease_loop(
        self,
        leases: KeyValue,
        every_s: float = names.MANAGER_LEASE_RENEW_S,
        acked: Callable[[float], None] | None = None,
    ) -> None:
        """Renew this manager's lease every `every_s`; `acked` is told the monotonic time of
        each renewal the broker acknowledged (the self-fence's watchdog reads it)."""
        mgr = self.mgr
        value = encode(
            ManagerLease(
                holder=mgr.identity.instance_id,
                root=str(mgr.layout.root),
                pid=os.getpid(),
                since=mgr.started_at,
                host=os.environ.get("COTAL_HOST_LABEL") or os.uname().nodename,
                standby=True if mgr.config.failover.standby else msgspec.UNSET,
            )
        )
        key = names.lease_key(mgr.identity.instance_id)
        await _keep_putting(leases, key, value, every_s, "lease.renew_failed", acked=acked)

    async def presence_loop(self, seat: Seat, handle: SeatHandle) -> None:
        mgr = self.mgr
        value = encode(
            Presence(
                seat=seat.name,
                lifecycle_uid=seat.uid,
                instance_id=mgr.identity.instance_id,
                agent=seat.agent,
                pid=handle.pid or 0,
                since=now_iso(),
            )
        )
        key = names.presence_key(names.SEAT_OWNER, seat.name, seat.uid)
        await _keep_putting(
            mgr.presence_bucket(),
            key,
            value,
            names.PRESENCE_HEARTBEAT_S,
            "presence.put_failed",
            # A seat told to stop is no longer claimed live, even before its exit is reaped:
            # a destination of its cut must not find it present.
            keep=lambda: not seat.lifecycle.deliberate and seat.handle is handle,
            seat=seat.name,
        )

    # -- custody --------------------------------------------------------------------------------

    async def custody_watch(self) -> None:
        """Watch every custody key; a seat of ours whose record moves to another holder or
        generation (or disappears) is evicted at once."""
        bucket = self.mgr.custody_bucket()
        while True:
            try:
                watcher = await bucket.watch(f"{names.SEAT_OWNER}.>")
                async for entry in watcher:
                    if entry is None:
                        continue
                    self.on_custody_entry(entry)
            except anyio.get_cancelled_exc_class():
                raise
            except Exception as exc:
                log.warning("custody.watch_failed", error=str(exc))
                await anyio.sleep(1.0)

    def on_custody_entry(self, entry: Any) -> None:
        parts = entry.key.split(".")
        if len(parts) != 3:
            return
        _owner, name, uid = parts
        seat = self.mgr.seats.get(name)
        if seat is None or seat.uid != uid or not seat.lifecycle.allows("evict"):
            return
        if seat.handle is None and seat.state in ("exited", "failed"):
            # Entered from its record and never run here: re-adoption reads the custody itself
            # and keeps the seat listed with the reason instead of making it vanish.
            return
        if entry.operation in ("DEL", "PURGE"):
            if not seat.lifecycle.deliberate:
                self.schedule_evict(seat, holder_now=None, reason="custody record deleted")
            return
        try:
            record = decode_custody(entry.value or b"")
        except DecodeError:
            self.schedule_evict(seat, holder_now=None, reason="custody record unreadable")
            return
        # A node that rejoins may replay an older record: only a newer revision can move custody.
        if (
            seat.custody_revision is not None
            and entry.revision is not None
            and entry.revision <= seat.custody_revision
        ):
            return
        if record.generation < seat.generation_at_broker:
            return
        if (
            record.holder != self.mgr.identity.instance_id
            or record.generation != seat.generation_at_broker
        ):
            self.schedule_evict(
                seat,
                holder_now=record.holder,
                reason=f"custody moved to generation {record.generation}",
            )

    # -- eviction -------------------------------------------------------------------------------

    def schedule_evict(self, seat: Seat, *, holder_now: str | None, reason: str) -> None:
        if self.mgr.tg is not None and seat.lifecycle.allows("evict"):
            self.mgr.tg.start_soon(self.evict, seat, holder_now, reason)

    async def evict(self, seat: Seat, holder_now: str | None, reason: str) -> None:
        """Custody moved away: stop the seat at once, prove it, and never relaunch it here.

        Nothing is deprovisioned: the durable and the custody record are the new holder's.
        """
        mgr = self.mgr
        if not seat.lifecycle.allows("evict"):
            return
        seat.apply("evict")
        with anyio.CancelScope(shield=True):
            try:
                await mgr.stop_and_prove(seat, graceful=False)
            except Refusal as exc:
                # Evicted all the same: the custody is another holder's. The process stays
                # with its run task, which reaps it when the kernel lets go.
                log.error("custody.evict_unproven", seat=seat.name, error=exc.text)
            finally:
                mgr.remove(seat)
        log.error(
            "custody.evicted",
            seat=seat.name,
            uid=seat.uid,
            holder_was=mgr.identity.instance_id,
            holder_now=holder_now,
            generation=seat.generation_at_broker,
            reason=reason,
            exit_code=seat.handle.returncode if seat.handle else None,
        )
