"""The seat ops: status, ps, spawn, the operator's seat verbs and shutdown.

`stop-seat` stops and proves and keeps everything (durable, session, custody, record);
`start-seat` relaunches a `stopped` seat under its uid into its session; `restart-seat` is the
two in one; `remove-seat` stops if needed and deprovisions.
"""

from __future__ import annotations

import os
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Protocol

import anyio
import msgspec
import structlog
from nats.js.kv import KeyValue

from connectors.base import continuity_class, refuse_mesh_without_tool
from manager import registry
from manager.broker import channels, custody, footprint
from manager.broker.fence import WriterFence
from manager.daemon import seatfile, teardown
from manager.daemon.budget import Budgets
from manager.daemon.events import Events
from manager.daemon.handlers.mail import DeadLetterBook, dead_by_seat
from manager.daemon.handlers.table import Table
from manager.daemon.incarnation import Incarnations
from manager.daemon.metrics import Metrics
from manager.daemon.seat import Seat
from manager.daemon.selffence import SelfFence
from manager.registry import FileConfig
from manager.workspace import drainmark
from manager.workspace.layout import Layout
from protocol import control, names
from protocol.errors import Refusal
from protocol.events import EventDetail
from protocol.instant import format_instant, now_iso
from protocol.maintenance import Maintenance
from protocol.refusals import Code

log = structlog.get_logger("cotal.manager")


class SeatOpsOwner(teardown.TeardownOwner, DeadLetterBook, Protocol):
    """What the seat ops ask of the Manager beyond a teardown's: what `status` reports, the
    fence each op passes, the owner's moves (adopt, stop and prove, launch through its
    incarnations) and the daemon's own stop."""

    # Set by `shutdown` inside its admitted lifecycle work: nothing is admitted after it.
    stopping: bool

    @property
    def layout(self) -> Layout: ...

    @property
    def config(self) -> FileConfig: ...

    @property
    def maintenance(self) -> Maintenance: ...

    @property
    def state(self) -> str: ...

    @property
    def server_url(self) -> str: ...

    @property
    def started_at(self) -> str: ...

    @property
    def in_flight(self) -> int: ...

    @property
    def incarnations(self) -> Incarnations: ...

    @property
    def budgets(self) -> Budgets: ...

    @property
    def shutdown_requested(self) -> anyio.Event: ...

    @property
    def self_fence(self) -> SelfFence: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def events(self) -> Events: ...

    def custody_bucket(self) -> KeyValue: ...

    def seat(self, name: str) -> Seat: ...

    def lifecycle(
        self, what: str, seat: str | None = None
    ) -> AbstractAsyncContextManager[None]: ...

    def adopt(self, seat: Seat) -> None: ...

    async def stop_and_prove(self, seat: Seat, *, graceful: bool) -> None: ...

    async def stop_all_keep_footprint(self) -> None: ...


class SeatHandlers:
    def __init__(self, mgr: SeatOpsOwner) -> None:
        self.mgr = mgr

    def register(self, table: Table) -> None:
        table.add(control.STATUS, self.status)
        table.add(control.PS, self.ps)
        table.add(control.SPAWN, self.spawn)
        table.add(control.STOP_SEAT, self.stop_seat)
        table.add(control.START_SEAT, self.start_seat)
        table.add(control.RESTART_SEAT, self.restart_seat)
        table.add(control.REMOVE_SEAT, self.remove_seat)
        table.add(control.BUDGET_LIFT, self.budget_lift)
        table.add(control.SHUTDOWN, self.shutdown)

    # -- reads ----------------------------------------------------------------------------------

    async def status(self, _args: control.NoArgs) -> control.StatusReply:
        mgr, m = self.mgr, self.mgr.maintenance
        states: dict[str, int] = {}
        for seat in mgr.seats.values():
            states[seat.state] = states.get(seat.state, 0) + 1
        return control.StatusReply(
            pid=os.getpid(),
            space=mgr.space,
            root=str(mgr.layout.root),
            instance_id=mgr.identity.instance_id,
            state=mgr.state,
            seats=len(mgr.seats),
            seat_states=dict(sorted(states.items())),
            server=mgr.server_url,
            started_at=mgr.started_at,
            in_flight=mgr.in_flight,
            attempt_id=m.attempt_id,
            commit_started=m.commit_started,
            activated=m.activated,
            dead_letters=dead_by_seat(mgr),
            adopting=m.adoption.attempt_id,
            partial_cut=None
            if m.seat_cut.state == "idle" or m.seat_cut.attempt_id is None
            else control.PartialCutRow(
                attempt_id=m.seat_cut.attempt_id,
                state=m.seat_cut.state,
                seats=sorted(m.seat_cut.seats),
                commit_started=m.seat_cut.commit_started,
            ),
        )

    async def ps(self, _args: control.NoArgs) -> list[control.SeatRow]:
        mgr = self.mgr
        try:
            # Read afresh, so a price the operator changes shows without a restart; a
            # cotal.toml that no longer reads leaves the prices this manager started with.
            config = await anyio.to_thread.run_sync(registry.load_config, mgr.layout.root)
        except Refusal:
            config = mgr.config
        return [
            msgspec.structs.replace(
                s.row(mgr.identity.instance_id, config.prices, _at_budget(mgr.budgets, s)),
                dead_letters=mgr.dead_counts.get(s.uid, 0),
            )
            for s in sorted(mgr.seats.values(), key=lambda s: s.name)
        ]

    # -- spawn ----------------------------------------------------------------------------------

    async def spawn(self, args: control.SpawnArgs) -> control.SeatRow:
        mgr = self.mgr
        drain = drainmark.draining(mgr.layout)
        if drain is not None:
            raise Refusal(
                Code.DRAINING,
                f"{mgr.layout.root} is being drained (pid {drain.process.pid}, since "
                f"{drain.started_at}): its seats are moving to other managers",
                "spawn the seat on another manager, or stop the drain (`cotal drain --cancel`) "
                "first",
            )
        async with mgr.lifecycle("spawn"):
            seat = self._new_seat(args)
            mgr.adopt(seat)
            try:
                await self._provision_and_launch(seat, args)
            except BaseException:
                mgr.remove(seat)
                with anyio.CancelScope(shield=True):
                    await teardown.deprovision(mgr, seat)
                raise
            log.info(
                "seat.spawned",
                seat=seat.name,
                uid=seat.uid,
                agent=args.agent,
                session=seat.session_id,
                allow_send=list(seat.allow_send),
                subscribe=list(seat.subscribe),
                allow_post=list(seat.allow_post),
            )
            return seat.row(mgr.identity.instance_id)

    def _new_seat(self, args: control.SpawnArgs) -> Seat:
        mgr = self.mgr
        name = names.check_new_seat_name(args.name)
        if len(mgr.seats) >= names.MAX_SEATS:
            raise Refusal(
                Code.CAPACITY,
                f"this manager already runs {names.MAX_SEATS} seats",
                "remove a seat first (`cotal rm NAME`; a stopped seat still counts)",
            )
        connector = registry.load_connector(args.agent)
        cwd = Path(args.cwd).resolve() if args.cwd else mgr.layout.root
        if not cwd.is_dir():
            raise Refusal(
                Code.BAD_CWD,
                f"cwd {cwd} is not a directory",
                "pass --cwd with an existing directory",
            )
        allow_send = tuple(registry.seat_allow_send(mgr.config, name, args.allow_send))
        subscribe, allow_post = registry.seat_channels(
            mgr.config, name, args.subscribe, args.allow_post
        )
        refuse_mesh_without_tool(args.agent, connector.capabilities, allow_send, allow_post)
        uid = names.mint_lifecycle_uid()
        return Seat(
            name=name,
            agent=args.agent,
            uid=uid,
            cwd=cwd,
            connector=connector,
            continuity=continuity_class(connector.capabilities),
            model=args.model,
            started_at=now_iso(),
            pointer_path=mgr.layout.session_pointer(connector.name, name, uid),
            allow_send=allow_send,
            subscribe=tuple(subscribe),
            allow_post=tuple(allow_post),
        )

    async def _provision_and_launch(self, seat: Seat, args: control.SpawnArgs) -> None:
        mgr = self.mgr
        me = mgr.identity.instance_id
        await footprint.ensure_dm_durable(mgr.js, mgr.space, names.SEAT_OWNER, seat.name, seat.uid)
        # Made now, so posts made while the seat is stopped wait for its start (within the bound).
        for channel in seat.subscribe:
            await channels.ensure_chathist_durable(
                mgr.js, mgr.space, names.SEAT_OWNER, seat.name, seat.uid, channel
            )
        held = await custody.establish(mgr.custody_bucket(), seat.name, seat.uid, me)
        seat.custody_revision, seat.generation_at_broker = held.revision, held.record.generation
        # The launch's settings fix the seat's profile revision, so the record names it.
        incarnations = mgr.incarnations
        opts = incarnations.opts(seat, prompt=args.prompt, resume=args.resume)
        # On disk before the launch: a manager that dies from here on leaves a record its
        # successor re-adopts, not an orphaned durable and custody key.
        seatfile.save(mgr.layout, seat)
        seat.fence = WriterFence(mgr.js, mgr.space, seat.name, me, 0)
        await seat.fence.establish()
        await seat.fence.establish_posts()
        mgr.events.emit(
            "custody.claimed", seat.name, seat.uid, EventDetail(generation=held.record.generation)
        )
        await incarnations.start(seat, opts)

    # -- the seat verbs -------------------------------------------------------------------------

    async def stop_seat(self, args: control.StopSeatArgs) -> control.StopSeatReply:
        """Stop and prove, and keep: the durable, the session, the custody and the record stay,
        so `start-seat` can bring the seat back as it was."""
        async with self.mgr.lifecycle("stop-seat", seat=args.name):
            seat = self.mgr.seat(args.name)
            if seat.state in ("evicting", "evicted"):
                raise Refusal(
                    Code.EVICTED,
                    f"seat {seat.name} is {seat.state}: its custody moved to another holder",
                    "nothing to stop here; see `cotal ps`",
                )
            already = seat.state == "stopped"
            await self.mgr.stop_and_prove(seat, graceful=True)
            log.info("seat.stopped", seat=seat.name, uid=seat.uid, last_exit=seat.last_exit)
            return control.StopSeatReply(
                name=seat.name,
                lifecycle_uid=seat.uid,
                exit_code=seat.handle.returncode if seat.handle else None,
                last_exit=seat.last_exit,
                state=seat.state,
                already_stopped=already,
                kept=True,
            )

    async def start_seat(self, args: control.StartSeatArgs) -> control.StartedSeatRow:
        mgr = self.mgr
        async with mgr.lifecycle("start-seat", seat=args.name):
            seat = mgr.seat(args.name)
            already = seat.state == "running"
            if not already:
                mgr.self_fence.refuse_start(seat.name, "start")
                _require_startable(seat, "start")
                await mgr.incarnations.start_stopped(seat)
            row = seat.row(mgr.identity.instance_id)
            return control.StartedSeatRow(**msgspec.structs.asdict(row), already_running=already)

    async def restart_seat(self, args: control.RestartSeatArgs) -> control.SeatRow:
        mgr = self.mgr
        async with mgr.lifecycle("restart-seat", seat=args.name):
            seat = mgr.seat(args.name)
            mgr.self_fence.refuse_start(seat.name, "restart")
            if seat.state != "running":
                _require_startable(seat, "restart")
            await mgr.stop_and_prove(seat, graceful=True)
            await mgr.incarnations.start_stopped(seat)
            return seat.row(mgr.identity.instance_id)

    async def remove_seat(self, args: control.RemoveSeatArgs) -> control.RemoveSeatReply:
        """Stop if running, prove it, then deprovision exactly this seat's footprint: durable,
        presence, custody record, session pointer and persisted record."""
        mgr = self.mgr
        async with mgr.lifecycle("remove-seat", seat=args.name):
            seat = mgr.seat(args.name)
            await mgr.stop_and_prove(seat, graceful=True)
            dead = mgr.dead_counts.get(seat.uid, 0) if seat.footprint_owned else 0
            await teardown.free(mgr, seat)
            # Its series go with it, so a root's churn of seat names leaves none behind.
            mgr.metrics.forget_seat(seat.name)
            log.info("seat.removed", seat=seat.name, uid=seat.uid, footprint=seat.footprint_owned)
            return control.RemoveSeatReply(
                name=seat.name,
                lifecycle_uid=seat.uid,
                exit_code=seat.handle.returncode if seat.handle else None,
                last_exit=seat.last_exit,
                state=seat.state,
                footprint_deleted=seat.footprint_owned,
                dead_letters_deleted=dead,
            )

    async def budget_lift(self, args: control.BudgetLiftArgs) -> control.BudgetLiftReply:
        """Waive the limits the seat has reached, for the rest of their windows: its delivery
        resumes at once (docs/operations.md, "What each seat costs")."""
        seat = self.mgr.seat(args.name)
        lifted = self.mgr.budgets.lift(seat)
        for hit in lifted:
            log.info("budget.lifted", seat=seat.name, limit=hit.name, used=hit.used)
        return control.BudgetLiftReply(
            name=seat.name,
            lifted=[hit.name for hit in lifted],
            resets_at=[format_instant(hit.resets_at) for hit in lifted],
        )

    # -- shutdown -------------------------------------------------------------------------------

    async def shutdown(self, _args: control.NoArgs) -> control.ShutdownReply:
        mgr, m = self.mgr, self.mgr.maintenance
        if m.state == "preserving":
            raise Refusal(
                Code.FENCED,
                f"shutdown refused: preservation attempt {m.attempt_id} is in progress",
                "commit or abort it first (cotal down --preserve-state continues it)",
            )
        if m.state != "active":
            # Cleanup is suppressed outside `active`: the seats' durables are the cut's or the
            # resume's, so the daemon exits without deprovisioning anything.
            await mgr.stop_all_keep_footprint()
            mgr.shutdown_requested.set()
            return control.ShutdownReply(stopped=[], footprint_kept=True, state=m.state)
        stopped: list[control.TeardownRow] = []
        unproven: dict[str, Refusal] = {}
        order = list(mgr.seats)
        async with mgr.lifecycle("shutdown"):
            mgr.stopping = True
            try:
                async with anyio.create_task_group() as tg:
                    for seat in list(mgr.seats.values()):
                        tg.start_soon(self._teardown_one, seat, stopped, unproven)
            finally:
                mgr.shutdown_requested.set()
        if unproven:
            # Every other seat was still stopped; the operator is told each survivor by name.
            named = [unproven[n] for n in order if n in unproven]
            raise Refusal(
                Code.STOP_UNPROVEN,
                "; ".join(r.message for r in named),
                "; ".join(r.cure for r in named if r.cure),
            )
        return control.ShutdownReply(stopped=stopped)

    async def _teardown_one(
        self, seat: Seat, out: list[control.TeardownRow], unproven: dict[str, Refusal]
    ) -> None:
        mgr = self.mgr
        try:
            await mgr.stop_and_prove(seat, graceful=True)
        except Refusal as exc:
            unproven[seat.name] = exc
            return
        # `free`, with the deprovision's outcome kept: an operator told "durable deleted" while
        # the broker refused the delete would believe a footprint gone that is still there.
        mgr.remove(seat)
        durable_error = await teardown.deprovision(mgr, seat) if seat.footprint_owned else None
        if durable_error is not None:
            # The durable outlives this manager, so its record must too: the next manager takes
            # the seat back stopped, and its `cotal down` deletes what this one could not.
            try:
                seatfile.save(mgr.layout, seat)
            except (OSError, Refusal) as exc:
                log.error("seat.record_write_failed", seat=seat.name, error=str(exc))
        out.append(
            control.TeardownRow(
                name=seat.name,
                lifecycle_uid=seat.uid,
                exit_code=seat.handle.returncode if seat.handle else None,
                durable_deleted=seat.footprint_owned and durable_error is None,
                durable_error=durable_error,
                footprint_owned=seat.footprint_owned,
            )
        )


def _require_startable(seat: Seat, verb: str) -> None:
    if seat.state == "stopped":
        return
    cure = {
        "failed": f"`cotal stop {seat.name}` then `cotal start {seat.name}` to try again, or "
        f"`cotal rm {seat.name}`",
        "exited": "the manager is restarting it after a crash; see `cotal ps`",
        "restarting": "it is being started; see `cotal ps`",
        "starting": "it is being started; see `cotal ps`",
        "stopping": f"wait for its stop to be proven (`cotal ps`), then `cotal {verb}`",
        "unproven": "its stop is not proven yet: the manager reaps it as soon as it dies; "
        f"then `cotal {verb} {seat.name}`",
    }.get(seat.state, f"`cotal rm {seat.name}`; this seat is not started here again")
    why = f" ({seat.reason})" if seat.reason else ""
    raise Refusal(
        Code.NOT_STOPPED,
        f"{verb} refused: seat {seat.name} is {seat.state}{why}; only a stopped seat (or, for "
        "restart, a running one) is started",
        cure,
    )


def _at_budget(budgets: Budgets, seat: Seat) -> str | None:
    """What `ps` says of a seat at its budget: why it gets no delivery now."""
    hit = budgets.reached(seat) if seat.state == "running" else None
    return hit.text() if hit is not None else None
