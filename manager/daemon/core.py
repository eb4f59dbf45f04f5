"""The Manager: sole owner of the seat table, the maintenance state and the broker footprint.

Exit watchers report; only the Manager decides (gunicorn's arbiter). Every lifecycle operation
runs inside `lifecycle()`, which refuses new work unless the state is `active` and counts work
in flight, so a fence set before the first await of a cut sees every accepted operation and
can drain it.

The table is also on disk (`seatfile`): every spawn, relaunch and stop rewrites the seat's
record and every removal deletes it, so a manager started in `active` re-adopts the seats a
dead predecessor left behind (`readopt`), and keeps the ones the operator stopped stopped.

Beside it, each in a module of one job: a seat's incarnations (`incarnation`: launch, prove
ready, run, reap, recover, stop and prove), the broker watchers (`watchers`: lease, presence,
custody, eviction), a seat's teardown (`teardown`), and the control handlers (`handlers`,
registered from `protocol.control.OPS` and checked against it before the daemon serves).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import structlog
from anyio.abc import TaskGroup, TaskStatus
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from manager import registry
from manager.broker import channels, deadletter, footprint, sent
from manager.broker import events as broker_events
from manager.daemon import handlers, seatfile
from manager.daemon.budget import Budgets
from manager.daemon.delivery import DeliveryGate, Waiter
from manager.daemon.events import Events
from manager.daemon.incarnation import Incarnations
from manager.daemon.metrics import Metrics
from manager.daemon.mover import Mover
from manager.daemon.preserve import Preservation
from manager.daemon.readopt import Readoption
from manager.daemon.resume import Resumption
from manager.daemon.seat import Seat
from manager.daemon.selffence import SelfFence
from manager.daemon.standby import Standby
from manager.daemon.standing import StandingCheckpoints
from manager.daemon.survivors import SurvivorScan
from manager.daemon.takeover import Takeover
from manager.daemon.watchers import Watchers, clear_presence
from manager.workspace.identity import InstanceIdentity
from manager.workspace.layout import Layout
from manager.workspace.private import ensure_private_dir
from protocol import names
from protocol.errors import Refusal
from protocol.events import EventDetail, EventType
from protocol.instant import now_iso
from protocol.lifecycle import SeatState
from protocol.maintenance import Maintenance
from protocol.refusals import Code

log = structlog.get_logger("cotal.manager")

# The states a seat's move into is an event of its own (`cotal events`).
SEAT_EVENTS: dict[str, EventType] = {
    "running": "seat.started",
    "exited": "seat.exited",
    "restarting": "seat.restarted",
    "stopped": "seat.stopped",
    "failed": "seat.failed",
    "retired": "seat.retired",
    "evicted": "seat.evicted",
}


class Manager:
    def __init__(
        self,
        layout: Layout,
        space: str,
        nc: Client,
        identity: InstanceIdentity,
        server_url: str,
        *,
        resume_attempt_id: str | None = None,
        replicas: int = 1,
    ) -> None:
        self.layout = layout
        self.space = space
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.identity = identity
        self.server_url = server_url
        self.replicas = replicas
        self.config = registry.load_config(layout.root)
        self.seats: dict[str, Seat] = {}
        self.maintenance = Maintenance(resume_attempt_id=resume_attempt_id)
        self.stopping = False
        self.in_flight = 0
        self._busy: dict[str, int] = {}
        self._seat_idle = anyio.Event()
        self._drained = anyio.Event()
        self._drained.set()
        self.waiters: dict[str, Waiter] = {}
        # Dead letters per lifecycle uid: read from the broker at start, then kept by the bridges
        # and the dead-letter ops, so `ps` and `status` never wait on the broker for it.
        self.dead_counts: dict[str, int] = {}
        self.shutdown_requested = anyio.Event()
        # The task group every incarnation and watcher runs in, from `run` on.
        self.tg: TaskGroup | None = None
        self.presence: KeyValue | None = None
        self.custody: KeyValue | None = None
        self.sent: KeyValue | None = None
        self.started_at = now_iso()
        # This manager's Prometheus registry (`cotal metrics`, `[metrics] listen`).
        self.metrics = Metrics(self)
        # Its lifecycle events, published on the broker by a task of its group (`cotal events`).
        self.events = Events(self, identity.instance_id)
        self.delivery_gate = DeliveryGate()
        # `[budget]`: which seats are at their budget and get no delivery until it resets.
        self.budgets = Budgets(layout.root, lambda: self.seats.values())
        self.survivor_scan = SurvivorScan()
        self.incarnations = Incarnations(self)
        self.watchers = Watchers(self)
        self.mover = Mover(self)
        self.preservation = Preservation(self)
        # `[failover] enabled`: each seat captured at every turn's end, before its ack.
        self.standing = StandingCheckpoints(self)
        # `cotal takeover`: a lost host's seat, from its standing checkpoint.
        self.takeover = Takeover(self)
        # `[failover] standby`: this manager takes lost hosts' seats over on its own.
        self.standby = Standby(self)
        self.resumption = Resumption(self)
        self.readoption = Readoption(self)
        # `[failover]`: the watchdog that kills this root's seats when the lease goes silent.
        self.self_fence = SelfFence(self, self.config.failover)
        # Refused here, before anything is served, when an op in OPS has no handler.
        self.handle = handlers.serving(handlers.build(self), self._refused)

    # -- the narrow view the cut and the resume get (SeatOwner) -----------------------------------

    def custody_bucket(self) -> KeyValue:
        if self.custody is None:
            raise Refusal(Code.NOT_READY, "the manager has no custody bucket yet", "retry")
        return self.custody

    def sent_ledger(self) -> KeyValue:
        if self.sent is None:
            raise Refusal(Code.NOT_READY, "the manager has no sent ledger yet", "retry")
        return self.sent

    def presence_bucket(self) -> KeyValue:
        if self.presence is None:
            raise Refusal(Code.NOT_READY, "the manager has no presence bucket yet", "retry")
        return self.presence

    def adopt(self, seat: Seat) -> None:
        # Synchronous, so the slot is taken before the caller's first await and a concurrent
        # adoption of the same name is refused instead of racing.
        if seat.name in self.seats:
            raise Refusal(
                Code.DUPLICATE_NAME,
                f"a seat named {seat.name!r} already exists",
                f"pick another name or `cotal rm {seat.name}` first",
            )
        self.seats[seat.name] = seat
        seat.observer = self._seat_moved
        self.events.emit("seat.spawned", seat.name, seat.uid)

    def _seat_moved(self, seat: Seat, state: SeatState) -> None:
        event = SEAT_EVENTS.get(state)
        if event is not None:
            self.events.emit(event, seat.name, seat.uid)

    def _refused(self, op: str, args: object, exc: Refusal) -> None:
        # The seat an op named, when it is one of the table's (a name refused as unknown is
        # not repeated into the event).
        name = getattr(args, "name", None)
        seat = self.seats.get(name) if isinstance(name, str) else None
        self.events.emit(
            "refusal",
            seat.name if seat is not None else None,
            seat.uid if seat is not None else None,
            EventDetail(op=op, code=exc.code),
        )

    def remove(self, seat: Seat) -> None:
        if self.seats.get(seat.name) is seat:
            del self.seats[seat.name]
            seatfile.delete(self.layout, seat)
            self.events.emit("seat.removed", seat.name, seat.uid)

    def hand_over(self, seat: Seat) -> None:
        seatfile.delete(self.layout, seat)

    async def forget_presence(self, seat: Seat) -> None:
        await clear_presence(self, seat)

    def persist(self, seat: Seat) -> None:
        """Rewrite the seat's record; a failure costs only the re-adoption after a crash, so it
        is logged, not raised."""
        if self.seats.get(seat.name) is not seat:
            return
        try:
            seatfile.save(self.layout, seat)
        except (OSError, Refusal) as exc:
            log.error("seat.record_write_failed", seat=seat.name, error=str(exc))

    async def persist_off_loop(self, seat: Seat) -> None:
        """`persist`, written in a worker thread: on disk when it returns, without holding the
        other seats' work behind its fsyncs (manager/daemon/seatfile.py)."""
        if self.seats.get(seat.name) is not seat:
            return
        try:
            await seatfile.save_off_loop(self.layout, seat)
        except (OSError, Refusal) as exc:
            log.error("seat.record_write_failed", seat=seat.name, error=str(exc))

    def refuse(self, seat: Seat, reason: str, *, footprint_owned: bool) -> None:
        """Keep a seat this manager will not relaunch: listed, `failed`, with its reason."""
        if seat.lifecycle.allows("fail"):
            seat.apply("fail")
        seat.reason = reason
        seat.footprint_owned = seat.footprint_owned and footprint_owned
        log.error("seat.readopt_refused", seat=seat.name, uid=seat.uid, reason=reason)
        self.persist(seat)

    async def relaunch(
        self, seat: Seat, *, continue_session: str | None = None, resume: str | None = None
    ) -> None:
        """Restart an `exited` seat under its uid (`Incarnations.relaunch`)."""
        await self.incarnations.relaunch(seat, continue_session=continue_session, resume=resume)

    async def launch(
        self, seat: Seat, *, continue_session: str | None = None, resume: str | None = None
    ) -> None:
        await self.incarnations.launch(seat, continue_session=continue_session, resume=resume)

    async def start_stopped(self, seat: Seat) -> None:
        """Start a `stopped` seat again under its uid (`Incarnations.start_stopped`)."""
        await self.incarnations.start_stopped(seat)

    async def stop_and_prove(self, seat: Seat, *, graceful: bool, record: bool = True) -> None:
        """The one stop (`Incarnations.stop_and_prove`); raises `Refusal("stop-unproven")`."""
        await self.incarnations.stop_and_prove(seat, graceful=graceful, record=record)

    # -- lifecycle fence ------------------------------------------------------------------------

    @property
    def state(self) -> str:
        return "stopping" if self.stopping else self.maintenance.state

    @property
    def active(self) -> bool:
        return self.maintenance.state == "active" and not self.stopping

    @asynccontextmanager
    async def lifecycle(self, what: str, seat: str | None = None) -> AsyncIterator[None]:
        # Check and count in one synchronous step: a fence set before the cut's first await
        # then sees every operation that got in, and nothing new can. `seat`: the one seat the
        # work touches, counted on its own too, for a cut of some seats to drain.
        if self.stopping:
            raise Refusal(
                Code.FENCED, f"{what} refused: the manager is stopping", "wait for it to exit"
            )
        try:
            self.maintenance.check_lifecycle(seat=seat, work=what)
        except Refusal as exc:
            raise Refusal(exc.code, f"{what} refused: {exc.message}", exc.cure) from None
        self.in_flight += 1
        self._drained = anyio.Event() if self.in_flight == 1 else self._drained
        if seat is not None:
            self._busy[seat] = self._busy.get(seat, 0) + 1
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._drained.set()
            if seat is not None:
                self._busy[seat] -= 1
                if not self._busy[seat]:
                    del self._busy[seat]
                self._seat_idle.set()
                self._seat_idle = anyio.Event()

    async def drain(self) -> None:
        await self._drained.wait()

    async def drain_seats(self, seats: frozenset[str]) -> None:
        """Until no lifecycle work admitted on these seats is left; work on others goes on."""
        while any(name in self._busy for name in seats):
            await self._seat_idle.wait()

    # -- run ------------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        r = self.replicas
        # A turn run again has its sends dropped as duplicates only inside the stream's
        # duplicate window, which this root's recency horizon sets.
        await footprint.ensure_dm_stream(
            self.js, self.space, replicas=r, horizon_s=self.config.recency.horizon_s
        )
        await deadletter.ensure_dead_stream(self.js, self.space, replicas=r)
        await broker_events.ensure_events_stream(self.js, self.space, replicas=r)
        await channels.ensure_chan_stream(
            self.js,
            self.space,
            history=self.config.channels.history,
            max_age_s=self.config.channels.max_age_s,
            replicas=r,
            horizon_s=self.config.recency.horizon_s,
        )
        # What its seats sent inside the horizon, which outlives a broker restart (sent.py).
        self.sent = await sent.ensure_ledger(
            self.js, self.space, replicas=r, horizon_s=self.config.recency.horizon_s
        )
        self.dead_counts.update(await deadletter.counts(self.js, self.space))
        self.presence = await footprint.ensure_kv(
            self.js, names.presence_bucket(self.space), ttl=names.PRESENCE_TTL_S, replicas=r
        )
        leases = await footprint.ensure_kv(
            self.js, names.manager_bucket(self.space), ttl=names.MANAGER_LEASE_TTL_S, replicas=r
        )
        self.custody = await footprint.ensure_kv(
            self.js, names.custody_bucket(self.space), ttl=None, replicas=r
        )
        ensure_private_dir(self.layout.sessions)
        try:
            await self._serve(leases, task_status)
        finally:
            # The last events (the seats' stops) reach the broker before the connection goes.
            await self.events.flush()

    async def _serve(self, leases: KeyValue, task_status: TaskStatus[None]) -> None:
        async with anyio.create_task_group() as tg:
            self.tg = tg
            fence = self.self_fence
            tg.start_soon(self.watchers.lease_loop, leases, fence.renew_every_s, fence.renewed)
            tg.start_soon(fence.watch)
            tg.start_soon(self.watchers.custody_watch)
            tg.start_soon(self.mover.serve)
            tg.start_soon(self.metrics.watch_loop_lag)
            tg.start_soon(self.events.publish_loop)
            if self.maintenance.state == "active":
                tg.start_soon(self.standby.watch)
            if self.config.metrics.listen is not None:
                host, port = registry.parse_listen(self.config.metrics.listen)
                await tg.start(self.metrics.serve_http, host, port)
            if self.maintenance.state == "active":
                # Only a manager in ordinary service takes back its predecessor's seats; one
                # started for a resume adopts exactly what the checkpoint names.
                for seat, record in self.readoption.enter_all():
                    await tg.start(self.readoption.run, seat, record)
            task_status.started()
            await anyio.sleep_forever()

    def seat(self, name: str) -> Seat:
        seat = self.seats.get(name)
        if seat is None:
            raise Refusal(Code.NO_SUCH_SEAT, f"no seat named {name!r}", "see `cotal ps`")
        return seat

    async def stop_all_keep_footprint(self) -> None:
        """Daemon stop by signal: seats stop, durables stay (nothing here is a teardown)."""
        self.stopping = True
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for seat in list(self.seats.values()):
                    tg.start_soon(self._stop_quietly, seat)

    async def _stop_quietly(self, seat: Seat) -> None:
        try:
            # The records stay as they were: a manager stopped by a signal (a service manager's
            # restart) is succeeded by one that takes its seats back.
            await self.stop_and_prove(seat, graceful=True, record=False)
        except Refusal as exc:
            log.error("seat.stop_failed", seat=seat.name, error=exc.text)
