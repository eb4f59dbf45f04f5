"""A seat's incarnations: launch, prove ready, run, reap, recover after a crash, stop and prove.

Each launch starts one incarnation of a seat under its lifecycle uid, run by the Manager's task
group: `launch` returns once it is proven ready (on any failure its process is reaped first),
and its exit goes to `on_exit`, which chooses between a crash restart into the same session, a
retirement (a crash loop) and a free. `stop_and_prove` is the one stop. The lifecycle events
applied here are the incarnation's own (ready, exit, restart, stop, proven); the Manager keeps
the table itself (`adopt`, `remove`, `persist`).

A launcher that could not set the seat up (`startfault`) is tried again within the seat's
restart budget; `StartFailed`, `LaunchFault` and `decode_fault` are re-exported from there.
"""

from __future__ import annotations

import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Protocol

import anyio
import structlog
from anyio.abc import TaskGroup, TaskStatus
from nats.js.kv import KeyValue

from connectors.base import Driver, LaunchOpts, LaunchSpec, attach_mesh
from connectors.meshclient import MESH_DIR_ENV
from manager import registry
from manager.broker import custody, footprint
from manager.broker.fence import WriterFence
from manager.daemon import teardown, usage, watchers
from manager.daemon.budget import Budgets, SeatBudget
from manager.daemon.delivery import Backoff, DeliveryBridge, DeliveryGate, SeatGate, Waiter
from manager.daemon.events import Events
from manager.daemon.meshsend import MeshOwner, MeshSends
from manager.daemon.meshsocket import MeshSocket
from manager.daemon.metrics import Metrics
from manager.daemon.process import LAST_KILL_WAIT_S, STOP_DEADLINE_S, SeatHandle
from manager.daemon.seat import (
    Incarnation,
    Seat,
    profiled_settings,
    read_pointer,
    session_to_reopen,
)
from manager.daemon.standing import StandingCheckpoints
from manager.daemon.startfault import LaunchFault, StartFailed, decode_fault, next_try
from manager.daemon.survivors import SurvivorScan
from manager.daemon.watchers import Watchers
from manager.registry import FileConfig
from manager.workspace.layout import Layout
from manager.workspace.private import ensure_private_dir
from protocol import names
from protocol.errors import DecodeError, Refusal
from protocol.events import EventDetail
from protocol.lifecycle import exit_text
from protocol.refusals import Code
from protocol.session import SessionPointer

__all__ = ["Incarnations", "LaunchFault", "StartFailed", "decode_fault"]

log = structlog.get_logger("cotal.manager")


def exited_before_ready(seat: Seat, handle: SeatHandle) -> Refusal:
    """One refusal for a harness that exited during its start, whichever the manager saw
    first: the end of its output or its reaped status; `seat-start-failed`, naming the step,
    errno and path, when it was its launcher that could not set the seat up."""
    if handle.launch_fault is not None:
        return StartFailed(seat.name, handle.launch_fault, handle.returncode, handle.log_path)
    return Refusal(
        Code.SEAT_FAILED,
        f"seat {seat.name} exited before it was ready (code {exit_text(handle.returncode)})",
        f"read {handle.log_path}",
    )


class IncarnationOwner(teardown.TeardownOwner, MeshOwner, Protocol):
    """What a seat's incarnations ask of the Manager beyond a teardown's and the mesh's: the
    task group they run in, what a launch and a bridge are given, the fence each crash restart
    passes, and the owner's record of the seat. The table itself stays the owner's."""

    @property
    def tg(self) -> TaskGroup | None: ...

    @property
    def layout(self) -> Layout: ...

    @property
    def config(self) -> FileConfig: ...

    @property
    def waiters(self) -> dict[str, Waiter]: ...

    @property
    def delivery_gate(self) -> DeliveryGate: ...

    @property
    def survivor_scan(self) -> SurvivorScan: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def events(self) -> Events: ...

    @property
    def watchers(self) -> Watchers: ...

    @property
    def budgets(self) -> Budgets: ...

    @property
    def standing(self) -> StandingCheckpoints: ...

    @property
    def active(self) -> bool: ...

    def custody_bucket(self) -> KeyValue: ...

    def lifecycle(
        self, what: str, seat: str | None = None
    ) -> AbstractAsyncContextManager[None]: ...

    async def persist_off_loop(self, seat: Seat) -> None: ...

    def refuse(self, seat: Seat, reason: str, *, footprint_owned: bool) -> None: ...


class Incarnations:
    """The Manager's seats' processes, from launch to proven stop."""

    def __init__(self, mgr: IncarnationOwner) -> None:
        self.mgr = mgr
        self.mesh = MeshSends(mgr)

    def _group(self) -> TaskGroup:
        if self.mgr.tg is None:
            raise Refusal(Code.NOT_READY, "the manager is not running yet", "retry")
        return self.mgr.tg

    # -- launch ---------------------------------------------------------------------------------

    def opts(
        self,
        seat: Seat,
        *,
        prompt: str | None = None,
        continue_session: str | None = None,
        resume: str | None = None,
    ) -> LaunchOpts:
        mgr = self.mgr
        settings = self._profiled_settings(seat)
        return LaunchOpts(
            space=mgr.space,
            name=seat.name,
            lifecycle_uid=seat.uid,
            workspace_root=mgr.layout.root,
            cwd=seat.cwd,
            session_pointer_path=seat.pointer_path,
            prompt=prompt,
            model=seat.model or settings.get("model"),
            continue_session=continue_session,
            resume=resume,
            config=settings,
            mesh_dir=mgr.layout.seat_mesh_dir(seat.name, seat.uid),
        )

    def _profiled_settings(self, seat: Seat) -> dict[str, Any]:
        return profiled_settings(seat, registry.load_config(self.mgr.layout.root))[0]

    async def launch(
        self, seat: Seat, *, continue_session: str | None = None, resume: str | None = None
    ) -> None:
        """Fence the seat's writes (once per seat in this manager), start it and prove it ready."""
        mgr = self.mgr
        if seat.fence is None:
            seat.fence = WriterFence(
                mgr.js, mgr.space, seat.name, mgr.identity.instance_id, seat.generation_at_broker
            )
            await seat.fence.establish()
            await seat.fence.establish_posts()
            mgr.events.emit(
                "custody.claimed",
                seat.name,
                seat.uid,
                EventDetail(generation=seat.generation_at_broker),
            )
        await self.start(seat, self.opts(seat, continue_session=continue_session, resume=resume))

    async def start(self, seat: Seat, opts: LaunchOpts) -> None:
        """Start the seat's process and prove it ready; raises with the process reaped. A start
        its launcher could not set up for a transient reason is tried again (`startfault`)."""
        group = self._group()
        await self._require_custody(seat)
        spec = seat.connector.build_launch(opts)
        ensure_private_dir(seat.pointer_path.parent)
        describe = getattr(seat.connector, "describe", None)
        # What a connector says about a launch for people (its permission mode, where its
        # credential comes from); it reads no secret, so it may be shown in `ps --wide`.
        described = dict(describe(opts)) if callable(describe) else {}
        failures = 0
        while True:
            try:
                await group.start(self._run_seat, seat, spec, described)
                return
            except StartFailed as exc:
                # The harness never ran, so the same launch is tried again; each try is one of
                # the seat's restarts (`next_try` refuses a permanent errno or a spent budget).
                delay = next_try(exc, seat.crashes, failures, time.monotonic())
                failures += 1
                log.warning(
                    "seat.start_retry",
                    seat=seat.name,
                    step=exc.fault.step,
                    errno=exc.fault.errno,
                    path=exc.fault.path,
                    attempt=failures,
                    retry_in_s=delay,
                )
                await anyio.sleep(delay)
                if self.mgr.seats.get(seat.name) is not seat or not seat.lifecycle.allows(
                    "restart"
                ):
                    # Stopped, removed or evicted meanwhile: that owns the seat now.
                    raise
            await self._require_custody(seat)
            seat.apply("restart")

    async def _require_custody(self, seat: Seat) -> None:
        """A seat is launched or relaunched only while this manager holds its custody."""
        me = self.mgr.identity.instance_id
        held = await custody.read(self.mgr.custody_bucket(), seat.name, seat.uid)
        if (
            held is None
            or held.record.holder != me
            or held.record.generation != seat.generation_at_broker
        ):
            who = (
                f"instance {held.record.holder} at generation {held.record.generation}"
                if held
                else "nobody"
            )
            raise Refusal(
                Code.CUSTODY_NOT_HELD,
                f"refusing to launch {seat.name} (uid {seat.uid}): its custody is held by {who}, "
                f"this manager ({me}) is at generation {seat.generation_at_broker}",
                "another host runs this seat now; do not start it here",
            )

    # -- run ------------------------------------------------------------------------------------

    async def _run_seat(
        self,
        seat: Seat,
        spec: LaunchSpec,
        described: dict[str, str],
        *,
        task_status: TaskStatus[None],
    ) -> None:
        handle = SeatHandle(spec, self.mgr.layout.seat_log(seat.name, seat.uid))
        incarnation = seat.current = Incarnation(spec, handle, described)
        try:
            await self._run(seat, incarnation, task_status=task_status)
        finally:
            incarnation.run_done.set()

    async def _run(
        self, seat: Seat, incarnation: Incarnation, *, task_status: TaskStatus[None]
    ) -> None:
        spec, handle = incarnation.spec, incarnation.handle
        # The port is this incarnation's: what comes in on its stdio, or on its mesh socket from
        # a process of its own, is this seat's call.
        port = self.mesh.port(seat, incarnation)
        mesh_dir = spec.env.get(MESH_DIR_ENV)
        # Bound before the harness starts, so its tool finds the socket from its first call.
        mesh_socket = MeshSocket(seat.name, Path(mesh_dir), port) if mesh_dir else None
        try:
            process = await handle.start()
        except BaseException:
            if mesh_socket is not None:
                mesh_socket.close()
            raise
        assert process.stdin is not None and process.stdout is not None
        driver = seat.connector.make_driver(process.stdin, process.stdout, spec)
        incarnation.driver = driver
        attach_mesh(driver, port)
        started = False
        failure: Refusal | None = None
        try:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._watch_exit, seat, handle, scope)
                    if mesh_socket is not None:
                        await tg.start(mesh_socket.serve, lambda: handle.pid)
                    await tg.start(driver.run)
                    failure = await self._become_ready(seat, spec, driver, handle)
                    if failure is not None:
                        scope.cancel()
                        await anyio.sleep_forever()
                    await self._serve(seat, incarnation, driver, tg)
                    started = True
                    task_status.started()
        except BaseExceptionGroup as group:
            log.error("seat.task_failed", seat=seat.name, error=repr(group.exceptions[0]))
            failure = failure or Refusal(
                Code.SEAT_FAILED,
                f"seat {seat.name} failed: {group.exceptions[0]!r}",
                f"read {handle.log_path}",
            )
        finally:
            with anyio.CancelScope(shield=True):
                await self._reaped(seat, handle)
        if not started:
            # The launcher's own report says more than whatever the readiness wait saw.
            launch = exited_before_ready(seat, handle) if handle.launch_fault else None
            raise launch or failure or exited_before_ready(seat, handle)
        if seat.handle is handle and self.mgr.tg is not None:
            self.mgr.tg.start_soon(self.on_exit, seat, handle)

    async def _become_ready(
        self, seat: Seat, spec: LaunchSpec, driver: Driver, handle: SeatHandle
    ) -> Refusal | None:
        """Why the incarnation did not become ready, or None once it is."""
        mgr = self.mgr
        within = mgr.config.launch.ready_timeout_s
        try:
            with anyio.fail_after(within):
                await self._prove_ready(seat, spec, driver, handle)
            # Lifecycle proof before presence: a uid whose durable is not at the broker never
            # becomes visible.
            await footprint.confirm_dm_durable(
                mgr.js, mgr.space, names.SEAT_OWNER, seat.name, seat.uid
            )
        except TimeoutError:
            return Refusal(
                Code.SEAT_NOT_READY,
                f"seat {seat.name} was not ready within {within:g}s",
                f"read {handle.log_path}, or on a busy host raise `[launch] ready_timeout_s` in "
                f"{registry.CONFIG_NAME}",
            )
        except Refusal as exc:
            return exc
        if not seat.lifecycle.allows("ready"):
            return Refusal(
                Code.SEAT_STOPPED,
                f"seat {seat.name} was told to stop ({seat.state}) before it was ready",
                "spawn it again if it is still wanted",
            )
        return None

    async def _serve(
        self, seat: Seat, incarnation: Incarnation, driver: Driver, tg: TaskGroup
    ) -> None:
        """A ready incarnation: its inbox bridge and its presence, then `ready`."""
        mgr, handle = self.mgr, incarnation.handle
        assert seat.fence is not None
        if seat.usage is None:
            where = usage.ledger_path(
                incarnation.spec.session_store, root=mgr.layout.root, cwd=seat.cwd
            )
            seat.usage = await anyio.to_thread.run_sync(usage.UsageLedger.open, where)
        bridge = DeliveryBridge(
            mgr.js,
            mgr.space,
            seat.name,
            seat.uid,
            driver,
            handle,
            mgr.waiters,
            fence=seat.fence,
            on_fenced=lambda: mgr.watchers.schedule_evict(
                seat, holder_now=None, reason="a publish was refused by the broker"
            ),
            gate=SeatGate(mgr.delivery_gate, seat.name),
            max_deliveries=mgr.config.delivery.max_deliveries,
            backoff=Backoff.of(mgr.config.delivery),
            on_ambiguous=lambda detail: self.restart_after_turn(seat, handle, detail),
            deliberate=lambda: seat.lifecycle.deliberate,
            dead_counts=mgr.dead_counts,
            channels=seat.subscribe,
            metrics=mgr.metrics,
            events=mgr.events,
            usage=seat.usage,
            budget=SeatBudget(mgr.budgets, seat, mgr.events),
            before_ack=(lambda: mgr.standing.take(seat)) if mgr.standing.enabled else None,
        )
        incarnation.bridge = bridge
        await tg.start(bridge.run)
        tg.start_soon(mgr.watchers.presence_loop, seat, handle)
        seat.apply("ready")
        mgr.metrics.seat_running(seat.name, seat.uid)
        await mgr.persist_off_loop(seat)

    async def _reaped(self, seat: Seat, handle: SeatHandle) -> None:
        await handle.reap()
        await watchers.clear_presence(self.mgr, seat)
        if seat.handle is not handle:
            return
        seat.last_exit = exit_text(handle.returncode)
        # An exit nobody asked for is `exit`; a stop that missed its deadline is proven by this
        # reap. A stop in progress owns its own proof.
        if seat.lifecycle.allows("exit"):
            seat.apply("exit")
        elif seat.state == "unproven":
            # The reap proves the harness gone, not the rest of its lifecycle: a stop that found
            # survivors stays unproven, and startable never, until no process of it is left.
            survivors = await self.mgr.survivor_scan.survivors(seat.uid)
            if survivors:
                log.error("seat.survivors_after_reap", seat=seat.name, pids=survivors)
            elif seat.state == "unproven" and seat.handle is handle:
                seat.apply("reaped")
                await self.mgr.persist_off_loop(seat)

    async def _watch_exit(self, seat: Seat, handle: SeatHandle, scope: anyio.CancelScope) -> None:
        rc = await handle.wait_for_exit()
        log.info(
            "seat.exited",
            seat=seat.name,
            pid=handle.pid,
            code=rc,
            deliberate=seat.lifecycle.deliberate,
        )
        scope.cancel()

    # -- readiness ------------------------------------------------------------------------------

    async def _prove_ready(
        self, seat: Seat, spec: LaunchSpec, driver: Driver, handle: SeatHandle
    ) -> None:
        reported = await self._reported_session(seat, driver, handle)
        if spec.expected_session_id is not None and reported != spec.expected_session_id:
            raise Refusal(
                Code.SESSION_MISMATCH,
                f"replacement reported session {reported}, expected {spec.expected_session_id}",
                "the harness did not reopen the recorded session; inspect its store",
            )
        if spec.session_pointer_path is not None:
            pointer = await self._await_pointer(spec.session_pointer_path, handle)
            if pointer.status != "running":
                raise Refusal(
                    Code.DELIBERATE_QUIT,
                    "connector reported a deliberate quit before readiness completed",
                    "respawn the seat",
                )
            if pointer.session_id != reported:
                raise Refusal(
                    Code.SESSION_MISMATCH,
                    f"pointer names session {pointer.session_id}, the harness reports {reported}",
                    "the harness and its pointer disagree; inspect the store",
                )
        seat.session_id = reported

    async def _reported_session(self, seat: Seat, driver: Driver, handle: SeatHandle) -> str:
        while True:
            if handle.reaped:
                raise exited_before_ready(seat, handle)
            try:
                reported = await driver.get_state()
            except Refusal as exc:
                # Both ways a driver says its harness's output ended (`jsonl_driver`'s and
                # `driverkit`'s): not a refusal of its own, an exit to be named by its status.
                if exc.code not in (Code.DRIVER_STOPPED, Code.HARNESS_GONE):
                    raise
                # The harness's output ended before it answered: it is exiting, and its
                # status may not be reaped yet. The refusal names how it ended and its log.
                with anyio.move_on_after(LAST_KILL_WAIT_S):
                    await handle.exited()
                    raise exited_before_ready(seat, handle) from None
                raise Refusal(
                    Code.SEAT_FAILED,
                    f"seat {seat.name} closed its output during start and did not exit",
                    f"read {handle.log_path}",
                ) from None
            if reported:
                return reported
            await anyio.sleep(0.05)

    async def _await_pointer(self, path: Path, handle: SeatHandle) -> SessionPointer:
        while True:
            try:
                return read_pointer(path)
            except (FileNotFoundError, DecodeError):
                if handle.reaped:
                    raise
                await anyio.sleep(0.05)

    # -- exits and crash recovery ---------------------------------------------------------------

    async def on_exit(self, seat: Seat, handle: SeatHandle) -> None:
        mgr = self.mgr
        code = handle.returncode
        if (
            seat.state != "exited"
            or seat.handle is not handle
            or not mgr.active
            or mgr.seats.get(seat.name) is not seat
        ):
            # A deliberate stop, a cut or a later incarnation owns this exit; the watcher must
            # neither deprovision nor relaunch.
            return
        pointer: SessionPointer | None = None
        if seat.continuity == "exact" and seat.recovery_armed:
            try:
                pointer = read_pointer(seat.pointer_path)
            except (FileNotFoundError, DecodeError) as exc:
                log.warning("seat.pointer_unreadable", seat=seat.name, error=str(exc))
        if pointer is None or pointer.status != "running":
            log.info("seat.freed", seat=seat.name, reason="process-exit", code=code)
            await teardown.free(mgr, seat)
            return
        now = time.monotonic()
        seat.crashes = [t for t in seat.crashes if now - t < names.SESSION_RESTART_WINDOW_S]
        seat.crashes.append(now)
        if len(seat.crashes) > names.SESSION_RESTART_LIMIT:
            log.error(
                "seat.crash_loop",
                seat=seat.name,
                crashes=len(seat.crashes),
                window_s=names.SESSION_RESTART_WINDOW_S,
            )
            seat.apply("retire")
            await teardown.free(mgr, seat)
            return
        await self._recover(seat, pointer.session_id)

    def restart_after_turn(self, seat: Seat, handle: SeatHandle, detail: str) -> bool:
        """A turn ended ambiguously while its harness may still be in a provider call: end this
        incarnation so the crash restart relaunches it into its own session (record 4.2: the
        restart ends the call before the message is redelivered). Granted only where a crash
        would be restarted and within the same budget; True when the harness is being ended."""
        mgr = self.mgr
        if (
            not mgr.active
            or mgr.tg is None
            or mgr.seats.get(seat.name) is not seat
            or seat.handle is not handle
            or seat.state != "running"
        ):
            return False
        refused = _turn_restart_refused(seat)
        if refused is not None:
            log.warning("seat.turn_restart_refused", seat=seat.name, why=refused, turn=detail)
            return False
        log.warning("seat.turn_restart", seat=seat.name, pid=handle.pid, turn=detail)
        mgr.tg.start_soon(self._end, seat, handle)
        return True

    async def _end(self, seat: Seat, handle: SeatHandle) -> None:
        # Not a stop: the lifecycle sees an exit nobody asked for, and the crash restart (with
        # its budget, its pointer and its session proof) takes it from there.
        if not await handle.stop(graceful=True):
            log.error("seat.turn_restart_unproven", seat=seat.name, pid=handle.pid)

    async def _recover(self, seat: Seat, session_id: str) -> None:
        """Relaunch a crashed seat into its session. A broker that is briefly away (an
        election) defers the relaunch and never costs the seat its footprint; custody that
        moved evicts it; only a refusal about the seat itself frees it."""
        mgr = self.mgr
        delay = 1.0
        while mgr.active and mgr.seats.get(seat.name) is seat and seat.lifecycle.allows("restart"):
            try:
                async with mgr.lifecycle("crash restart", seat=seat.name):
                    seat.apply("restart")
                    await self.start(seat, self.opts(seat, continue_session=session_id))
                    seat.restarts += 1
                    await mgr.persist_off_loop(seat)
                    log.info(
                        "seat.restarted",
                        seat=seat.name,
                        session=seat.session_id,
                        restarts=seat.restarts,
                    )
                return
            except Refusal as exc:
                if seat.lifecycle.allows("exit"):
                    seat.apply("exit")
                if exc.code != Code.BROKER_UNAVAILABLE:
                    await self._recovery_refused(seat, exc)
                    return
                log.warning(
                    "seat.recovery_deferred", seat=seat.name, error=exc.text, retry_in_s=delay
                )
                await anyio.sleep(delay)
                delay = min(delay * 2, 30.0)
            except Exception as exc:
                # Not a refusal: keep the seat and its footprint, and say so; an operator can
                # stop it.
                if seat.lifecycle.allows("fail"):
                    seat.apply("fail")
                log.exception("seat.recovery_error", seat=seat.name, error=repr(exc))
                return

    async def _recovery_refused(self, seat: Seat, exc: Refusal) -> None:
        if exc.code == Code.CUSTODY_NOT_HELD:
            await self.mgr.watchers.evict(seat, None, exc.message)
            return
        if exc.code == Code.PROFILE_DRIFT:
            # The operator's edit, not the seat's fault: kept `failed` with its footprint and
            # the reason, to start again once the profile is back (or to remove).
            self.mgr.refuse(seat, exc.text, footprint_owned=True)
            return
        log.error("seat.recovery_failed", seat=seat.name, error=exc.text)
        if self.mgr.active:
            await teardown.free(self.mgr, seat)

    async def relaunch(
        self, seat: Seat, *, continue_session: str | None = None, resume: str | None = None
    ) -> None:
        """Restart an `exited` seat under its uid. A broker briefly away (an election) defers
        the relaunch; any other refusal leaves the seat `exited` and is raised."""
        delay = 1.0
        while True:
            seat.apply("restart")
            try:
                await self.launch(seat, continue_session=continue_session, resume=resume)
            except Refusal as exc:
                if seat.lifecycle.allows("exit"):
                    seat.apply("exit")
                if exc.code != Code.BROKER_UNAVAILABLE or not self.mgr.active:
                    raise
                log.warning(
                    "seat.relaunch_deferred", seat=seat.name, error=exc.text, retry_in_s=delay
                )
                await anyio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            seat.restarts += 1
            await self.mgr.persist_off_loop(seat)
            return

    async def start_stopped(self, seat: Seat) -> None:
        """Relaunch a `stopped` seat under its uid into its session, as a crash restart does:
        custody re-checked, the durable confirmed, the pointer's session continued (`exact`) or
        forked from (`fork`). A start that fails leaves the seat stopped again, proven."""
        failure: BaseException | None = None
        with anyio.CancelScope(shield=True):
            # The stop lock is held through the launch, so a stop arriving meanwhile stops the
            # new process instead of proving the old, already reaped one.
            async with seat.stop_lock:
                try:
                    await self._start_stopped(seat)
                except BaseException as exc:
                    failure = exc
                else:
                    seat.restarts += 1
                    await self.mgr.persist_off_loop(seat)
            if failure is not None:
                # Straight back to `stopped` (from `restarting` or the failed launch's `exited`)
                # through the one stop-and-prove, never through a crash restart.
                if seat.state != "stopped":
                    await self.stop_and_prove(seat, graceful=False)
                raise failure
        log.info(
            "seat.started_again", seat=seat.name, session=seat.session_id, restarts=seat.restarts
        )

    async def _start_stopped(self, seat: Seat) -> None:
        mgr = self.mgr
        if seat.current is not None:
            # The last incarnation's own cleanup reads the lifecycle to tell a crash from a
            # stop: it must have finished before the seat moves on.
            with anyio.fail_after(mgr.config.launch.ready_timeout_s):
                await seat.current.run_done.wait()
        await footprint.confirm_dm_durable(mgr.js, mgr.space, names.SEAT_OWNER, seat.name, seat.uid)
        continue_session, fork_from = session_to_reopen(seat)
        seat.apply("start")
        seat.reason = None
        await self.launch(seat, continue_session=continue_session, resume=fork_from)

    # -- stop -----------------------------------------------------------------------------------

    async def stop_and_prove(self, seat: Seat, *, graceful: bool, record: bool = True) -> None:
        """The one stop: signal the group, wait for the reaped exit under a deadline, and prove
        no process of the lifecycle survives. Raises `Refusal("stop-unproven")` otherwise.

        Shielded, so a cancelled caller cannot leave a seat half stopped; bounded, because the
        handle's own deadlines end the wait. A second stopper of the same seat waits for the
        first and then finds it stopped."""
        with anyio.CancelScope(shield=True):
            async with seat.stop_lock:
                if seat.apply("stop") in ("stopped", "evicted"):
                    return
                if record:
                    # A successor must not relaunch a seat whose stop had begun.
                    await self.mgr.persist_off_loop(seat)
                await self._prove_stopped(seat, graceful=graceful)
                seat.apply("proven")
                if seat.handle is not None:
                    seat.last_exit = exit_text(seat.handle.returncode)
                if record:
                    await self.mgr.persist_off_loop(seat)

    async def _prove_stopped(self, seat: Seat, *, graceful: bool) -> None:
        handle = seat.handle
        proven = handle is None or await handle.stop(graceful=graceful)
        pid = handle.pid if handle is not None else None
        if not proven:
            seat.apply("unproven")
            raise Refusal(
                Code.STOP_UNPROVEN,
                f"seat {seat.name} (pid {pid}) was not reaped within "
                f"{STOP_DEADLINE_S + LAST_KILL_WAIT_S:.0f}s of its stop",
                f"kill -9 {pid} (it may be stuck in the kernel), then retry; the manager "
                "reaps it as soon as it dies",
            )
        # A pass over every process's environment, shared with the stops of other seats that
        # ask at the same time (a cut stops them side by side): manager/daemon/survivors.py.
        survivors = await self.mgr.survivor_scan.survivors(seat.uid)
        if survivors:
            seat.apply("unproven")
            raise Refusal(
                Code.STOP_UNPROVEN,
                f"seat {seat.name} (pid {pid}) exited but processes of its lifecycle are "
                f"still alive: {survivors}",
                f"kill {' '.join(map(str, survivors))}, then retry",
            )


def _turn_restart_refused(seat: Seat) -> str | None:
    """Why an ambiguous turn may not end this incarnation for a restart, or None."""
    if seat.continuity != "exact" or not seat.recovery_armed:
        return f"a {seat.continuity} seat's session is not reopened by a restart"
    try:
        if read_pointer(seat.pointer_path).status != "running":
            return "its harness quit the session"
    except (OSError, DecodeError) as exc:
        return f"its session pointer cannot be read ({exc})"
    now = time.monotonic()
    recent = [t for t in seat.crashes if now - t < names.SESSION_RESTART_WINDOW_S]
    if len(recent) >= names.SESSION_RESTART_LIMIT:
        return (
            f"its restart budget is spent ({len(recent)} restarts within "
            f"{names.SESSION_RESTART_WINDOW_S:.0f}s)"
        )
    return None
