"""A silent host fences itself (`[failover]`, issue 39 item 3).

The lease loop tells this module the monotonic time of each renewal the broker acknowledged
(the time the put was sent, so the broker's own TTL never starts before it). A watchdog in the
Manager's task group reads it: once `[failover] after_s` has passed on this manager's own
monotonic clock without one, the manager fences itself: it closes the delivery gate for its
failover-enabled seats, kills each with SIGKILL through the one stop-and-prove, and keeps them
`stopped` with the reason, refusing `start` and `restart` (`self-fenced`). A renewal gap seen
only afterwards (this manager was itself stopped longer than `after_s`) fences the same way.

The fence is lifted only once a renewal sent after it was acknowledged and each seat's custody
was read again at the broker: a seat still held by this instance at the same generation is
started again in its session; one whose custody moved stays stopped and says so, for this
manager must never run a seat whose custody it lost. A root without `[failover] enabled` never
fences: a stall there kills nothing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Final, Protocol

import anyio
import structlog
from nats.js.kv import KeyValue

from manager.broker import custody
from manager.daemon.delivery import DeliveryGate
from manager.daemon.events import Events
from manager.daemon.seat import Seat
from manager.registry import FailoverConfig
from manager.workspace.identity import InstanceIdentity
from protocol import names
from protocol.errors import Refusal
from protocol.events import EventDetail
from protocol.lifecycle import SeatState
from protocol.maintenance import Maintenance
from protocol.refusals import Code

log = structlog.get_logger("cotal.manager")

# The states of a seat whose process runs or is about to: the ones a self-fence kills. A seat
# already stopping, stopped, failed or evicted has no process this manager would let run.
FENCEABLE: Final[frozenset[SeatState]] = frozenset({"starting", "running", "exited", "restarting"})


class FenceOwner(Protocol):
    """What the self-fence asks of the Manager: its seats, its gate and events, the custody
    bucket to re-read, and its own moves (stop and prove, admitted work, start a stopped seat)."""

    @property
    def identity(self) -> InstanceIdentity: ...

    @property
    def seats(self) -> Mapping[str, Seat]: ...

    @property
    def delivery_gate(self) -> DeliveryGate: ...

    @property
    def events(self) -> Events: ...

    @property
    def maintenance(self) -> Maintenance: ...

    def custody_bucket(self) -> KeyValue: ...

    async def stop_and_prove(self, seat: Seat, *, graceful: bool) -> None: ...

    async def persist_off_loop(self, seat: Seat) -> None: ...

    async def start_stopped(self, seat: Seat) -> None: ...

    def lifecycle(
        self, what: str, seat: str | None = None
    ) -> AbstractAsyncContextManager[None]: ...


class SelfFence:
    def __init__(self, mgr: FenceOwner, config: FailoverConfig) -> None:
        self.mgr = mgr
        self.enabled = config.enabled
        self.after_s = config.after_s
        self.last_ack = time.monotonic()
        # The longest silence between two acknowledged renewals not yet acted on.
        self._gap: float | None = None
        self.fenced_at: float | None = None
        # When this manager last fenced itself: a silence that began before it was acted on.
        self._last_fence: float | None = None
        # The seats this manager killed and keeps from starting, by name.
        self.fenced: dict[str, Seat] = {}

    @property
    def renew_every_s(self) -> float:
        """How often the lease loop renews: four renewals inside `after_s` when failover is on,
        so one slow put never reads as a silence."""
        if not self.enabled:
            return names.MANAGER_LEASE_RENEW_S
        return min(names.MANAGER_LEASE_RENEW_S, self.after_s / 4)

    def renewed(self, sent_at: float) -> None:
        """The broker acknowledged the renewal sent at `sent_at` (monotonic)."""
        silent = sent_at - self.last_ack
        covered = self._last_fence is not None and self._last_fence >= self.last_ack
        if self.enabled and silent > self.after_s and not covered:
            self._gap = max(self._gap or 0.0, silent)
        self.last_ack = max(self.last_ack, sent_at)

    def refuse_start(self, name: str, verb: str) -> None:
        if name in self.fenced:
            raise Refusal(
                Code.SELF_FENCED,
                f"{verb} {name} refused: this manager fenced itself after {self.after_s:g} s "
                "without a lease renewal at the broker, and has not read the broker since",
                "make the broker reachable; the manager starts the seat again by itself once "
                "it has renewed its lease and re-read the seat's custody (see `cotal ps`)",
            )

    async def watch(self) -> None:
        """The watchdog: fence once `after_s` passed without an acknowledged renewal, lift once
        the broker acknowledged one sent after the fence."""
        if not self.enabled:
            return
        # The silence is counted from when the manager began serving, not from its setup's
        # first reads at the broker.
        self.last_ack = max(self.last_ack, time.monotonic())
        tick = min(0.25, self.after_s / 8)
        while True:
            await anyio.sleep(tick)
            if self.fenced_at is None:
                silent = max(time.monotonic() - self.last_ack, self._gap or 0.0)
                if silent > self.after_s:
                    await self.fence(silent)
            elif self.last_ack > self.fenced_at:
                try:
                    await self.lift()
                except Exception as exc:
                    # The broker is not back after all: read it again at the next renewal.
                    log.warning("failover.lift_deferred", error=repr(exc))
                    await anyio.sleep(1.0)

    # -- fence ----------------------------------------------------------------------------------

    async def fence(self, silent: float) -> None:
        mgr = self.mgr
        self.fenced_at = self._last_fence = time.monotonic()
        self._gap = None
        reason = f"self-fenced: no lease renewal for {silent:.0f} s"
        targets = [s for s in mgr.seats.values() if s.state in FENCEABLE]
        gated = frozenset(s.name for s in targets)
        mgr.delivery_gate.close(gated)
        for seat in targets:
            self.fenced[seat.name] = seat
            seat.reason = reason
        log.error(
            "failover.self_fenced",
            seats=sorted(gated),
            silent_s=round(silent, 1),
            after_s=self.after_s,
        )
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for seat in targets:
                    tg.start_soon(self._kill, seat, reason)

    async def _kill(self, seat: Seat, reason: str) -> None:
        try:
            await self.mgr.stop_and_prove(seat, graceful=False)
        except Refusal as exc:
            log.error("failover.kill_unproven", seat=seat.name, error=exc.text)
        seat.reason = reason
        await self.mgr.persist_off_loop(seat)
        self.mgr.events.emit("seat.self_fenced", seat.name, seat.uid, EventDetail(outcome=reason))
        log.error(
            "failover.seat_killed",
            seat=seat.name,
            uid=seat.uid,
            state=seat.state,
            last_exit=seat.last_exit,
            reason=reason,
        )

    # -- lift -----------------------------------------------------------------------------------

    async def lift(self) -> None:
        """The lease is renewed: re-read each fenced seat's custody at the broker, then lift the
        fence and start again the seats still held here at the same generation."""
        mgr = self.mgr
        keep: list[Seat] = []
        for name, seat in list(self.fenced.items()):
            if mgr.seats.get(name) is not seat or seat.state != "stopped":
                continue  # removed or evicted meanwhile: nothing of ours to start
            held = await custody.read(mgr.custody_bucket(), seat.name, seat.uid)
            me = mgr.identity.instance_id
            if (
                held is not None
                and held.record.holder == me
                and held.record.generation == seat.generation_at_broker
            ):
                keep.append(seat)
                continue
            who = (
                f"instance {held.record.holder} at generation {held.record.generation}"
                if held is not None
                else "nobody"
            )
            seat.reason = f"self-fenced, and its custody is now held by {who}: not run here"
            await mgr.persist_off_loop(seat)
            log.error("failover.custody_lost", seat=seat.name, uid=seat.uid, holder_now=who)
        # A cut that fenced some of these seats meanwhile keeps their gate closed: lifting this
        # fence must not reopen what the cut's fence closed.
        cut = mgr.maintenance.cut
        released = frozenset(
            n
            for n in self.fenced
            if cut.state == "idle" or (cut.scope != "whole" and n not in cut.seats)
        )
        self.fenced.clear()
        self.fenced_at = None
        mgr.delivery_gate.open(released)
        log.warning("failover.fence_lifted", restarting=[s.name for s in keep])
        async with anyio.create_task_group() as tg:
            for seat in keep:
                tg.start_soon(self._start_again, seat)

    async def _start_again(self, seat: Seat) -> None:
        mgr = self.mgr
        try:
            async with mgr.lifecycle("self-fence lift", seat=seat.name):
                if mgr.seats.get(seat.name) is not seat or seat.state != "stopped":
                    return
                await mgr.start_stopped(seat)
        except Refusal as exc:
            seat.reason = f"self-fenced; its start after the fence was refused: {exc.text}"[:1000]
            await mgr.persist_off_loop(seat)
            log.error("failover.restart_refused", seat=seat.name, error=exc.text)
            return
        mgr.events.emit("seat.fence_lifted", seat.name, seat.uid)
        log.warning("failover.seat_started_again", seat=seat.name, session=seat.session_id)
