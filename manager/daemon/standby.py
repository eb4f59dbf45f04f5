"""A standby takes lost seats over on its own (`[failover] standby = true`, issue 39 item 4).

Once a second (`POLL_S`) the standby reads its space's roster at the broker. A seat held by
another manager whose lease is gone is a candidate from the moment this standby first saw the
lease gone; once its holder's self-fence is waited out (`takeover.fence_wait_s`, counted from
that moment) the standby takes it over exactly as `cotal takeover` does (`Takeover.take_one`).

Several standbys see the same loss. The custody claim's compare-and-set lets exactly one win;
which one is meant to is the one with the most free seats: each standby waits, beyond the fence
wait, `STAGGER_S` times its rank among the live managers ordered by free capacity (then by
instance id), so the emptiest goes first and the others find the seat taken (`custody-lost` or
`standing-stale`, the loser having claimed nothing) or, if it failed, try in their turn.

A candidate the standby cannot take (no standing checkpoint, a signer it does not trust, a
clock it does not trust) is said once in the log and left to the operator.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Final, Protocol

import anyio
import structlog
from nats.js import JetStreamContext

from manager.broker import fleet
from manager.daemon.seat import Seat
from manager.daemon.takeover import Takeover
from manager.registry import FileConfig
from manager.workspace.identity import InstanceIdentity
from protocol import names
from protocol.errors import Refusal
from protocol.fleet import FleetRow
from protocol.refusals import Code

log = structlog.get_logger("cotal.standby")

POLL_S: Final = 1.0
STAGGER_S: Final = 2.0
# Refusals that say another manager has the seat now, or that it is not lost after all: the
# candidate is dropped, and found again if it is lost again.
SETTLED: Final = frozenset(
    {
        Code.CUSTODY_LOST,
        Code.STANDING_STALE,
        Code.GENERATION_BEHIND,
        Code.HOLDER_ALIVE,
        Code.NO_SUCH_SEAT,
    }
)
# How long a candidate that failed for another reason waits before the next try.
RETRY_S: Final = 10.0


class StandbyOwner(Protocol):
    """What a standby asks of the Manager: its configuration, who it is and how full, its
    broker, and the takeover it runs."""

    @property
    def config(self) -> FileConfig: ...

    @property
    def identity(self) -> InstanceIdentity: ...

    @property
    def space(self) -> str: ...

    @property
    def js(self) -> JetStreamContext: ...

    @property
    def seats(self) -> Mapping[str, Seat]: ...

    @property
    def takeover(self) -> Takeover: ...


class Standby:
    def __init__(self, mgr: StandbyOwner) -> None:
        self.mgr = mgr
        # uid -> when this standby first saw the seat's holder without a lease (monotonic).
        self._gone_since: dict[str, float] = {}
        # uid -> not before this monotonic time (a try failed), or never (None: said once).
        self._hold: dict[str, float | None] = {}

    @property
    def enabled(self) -> bool:
        return self.mgr.config.failover.standby

    async def watch(self) -> None:
        if not self.enabled:
            return
        log.info("standby.watching", instance=self.mgr.identity.instance_id)
        while True:
            try:
                await self._round()
            except Exception as exc:
                # The broker unreadable now, or a takeover that failed in a way nobody named:
                # never the manager's end; the next round asks again.
                text = exc.text if isinstance(exc, Refusal) else repr(exc)
                log.warning("standby.round_failed", error=text)
            await anyio.sleep(POLL_S)

    async def _round(self) -> None:
        mgr = self.mgr
        snap = await fleet.snapshot(mgr.js, mgr.space)
        rows = fleet.join(snap)
        now = time.monotonic()
        lost = {r.lifecycle_uid: r for r in rows if self._lost(r)}
        for uid in set(self._gone_since) - set(lost):
            del self._gone_since[uid]
        for uid in lost:
            self._gone_since.setdefault(uid, now)
        if not lost:
            return
        delay = self._rank(fleet.load(snap, rows)) * STAGGER_S
        for uid, row in sorted(lost.items(), key=lambda item: item[1].name):
            hold = self._hold.get(uid, 0.0)
            if hold is None or now < hold or now < self._gone_since[uid] + delay:
                continue
            await self._try(row, self._gone_since[uid] + delay)

    def _lost(self, row: FleetRow) -> bool:
        return (
            row.instance is not None
            and row.generation is not None
            and row.instance != self.mgr.identity.instance_id
            and not row.manager_live
        )

    def _rank(self, load: dict[str, int]) -> int:
        """This manager's place among the live managers, the one with the most free seats
        first (ties by instance id): 0 goes first."""
        me = self.mgr.identity.instance_id
        load.setdefault(me, len(self.mgr.seats))
        order = sorted(load, key=lambda inst: (load[inst] - names.MAX_SEATS, inst))
        return order.index(me)

    async def _try(self, row: FleetRow, seen_gone_at: float) -> None:
        uid = row.lifecycle_uid
        log.info("standby.taking_over", seat=row.name, uid=uid, holder=row.instance)
        try:
            await self.mgr.takeover.take_one(row.name, row.instance, seen_gone_at=seen_gone_at)
        except Refusal as exc:
            if exc.code in SETTLED:
                log.info("standby.settled", seat=row.name, uid=uid, code=exc.code)
                self._gone_since.pop(uid, None)
                return
            if exc.code in (Code.NO_STANDING_CHECKPOINT, Code.UNTRUSTED_SIGNER):
                log.warning("standby.cannot_take", seat=row.name, uid=uid, error=exc.text)
                self._hold[uid] = None
                return
            log.warning("standby.try_failed", seat=row.name, uid=uid, error=exc.text)
            self._hold[uid] = time.monotonic() + RETRY_S
            return
        except (OSError, ValueError, TimeoutError) as exc:
            log.warning("standby.try_failed", seat=row.name, uid=uid, error=repr(exc))
            self._hold[uid] = time.monotonic() + RETRY_S
            return
        self._gone_since.pop(uid, None)
        self._hold.pop(uid, None)
