"""The Manager: sole owner of the seat table, the maintenance state and the broker footprint.

Exit watchers report; only the Manager decides (gunicorn's arbiter). Every lifecycle operation
runs inside `lifecycle()`, which refuses new work unless the state is `active` and counts work
in flight, so a fence set before the first await of a cut sees every accepted operation and
can drain it.

The table is also on disk (`seatfile`): every spawn, relaunch and stop rewrites the seat's
record and every removal deletes it, so a manager started in `active` re-adopts the seats a
dead predecessor left behind (`readopt`), and keeps the ones the operator stopped stopped.

An operator's seat verbs: `stop-seat` stops and proves and keeps everything (durable, session,
custody, record); `start-seat` relaunches a `stopped` seat under its uid into its session;
`restart-seat` is the two in one; `remove-seat` stops if needed and deprovisions.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import msgspec
import structlog
from anyio.abc import TaskGroup, TaskStatus
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from connectors.base import Driver, LaunchOpts, LaunchSpec, continuity_class
from manager import registry
from manager.broker import custody, deadletter, footprint
from manager.broker.dm import new_message_id, publish_dm
from manager.broker.fence import WriterFence
from manager.daemon import seatfile
from manager.daemon.delivery import DeliveryBridge, DeliveryGate, Waiter
from manager.daemon.incarnation import StartFailed, next_try
from manager.daemon.preserve import Preservation
from manager.daemon.process import LAST_KILL_WAIT_S, STOP_DEADLINE_S, SeatHandle
from manager.daemon.readopt import Readoption
from manager.daemon.resume import Resumption
from manager.daemon.seat import Seat, read_pointer, session_to_reopen
from manager.procs import processes_with_env
from manager.workspace.identity import InstanceIdentity
from manager.workspace.layout import Layout
from manager.workspace.private import ensure_private_dir
from protocol import control, names
from protocol.custody import decode_custody
from protocol.errors import DecodeError, Refusal
from protocol.instant import now_iso
from protocol.lifecycle import exit_text
from protocol.maintenance import Maintenance
from protocol.messages import DirectMessage, ManagerLease, Presence, decode_dm, encode
from protocol.session import SessionPointer

log = structlog.get_logger("cotal.manager")

READINESS_TIMEOUT_S = 30.0


def _exited_before_ready(seat: Seat, handle: SeatHandle) -> Refusal:
    """One refusal for a harness that exited during its start, whichever the manager saw
    first: the end of its output or its reaped status; `seat-start-failed`, naming the step,
    errno and path, when it was its launcher that could not set the seat up."""
    if handle.launch_fault is not None:
        return StartFailed(seat.name, handle.launch_fault, handle.returncode, handle.log_path)
    return Refusal(
        "seat-failed",
        f"seat {seat.name} exited before it was ready (code {exit_text(handle.returncode)})",
        f"read {handle.log_path}",
    )


HEAD_CHARS = 80


def _dead_row(letter: deadletter.DeadLetter) -> control.DeadLetterRow:
    meta = letter.meta
    try:
        dm: DirectMessage | None = decode_dm(letter.data)
    except DecodeError:
        dm = None
    text = dm.text if dm is not None else letter.data.decode("utf-8", "replace")
    return control.DeadLetterRow(
        id=letter.id,
        subject=meta.subject,
        deliveries=meta.deliveries,
        reason=meta.reason,
        dead_at=meta.dead_at,
        bytes=len(letter.data),
        head=text[:HEAD_CHARS],
        sender=dm.sender if dm is not None else None,
        message_id=dm.id if dm is not None else None,
        sent_at=dm.sent_at if dm is not None else None,
    )


def _dead_ids(seat: Seat, letter: deadletter.DeadLetter) -> dict[str, Any]:
    try:
        message_id: str | None = decode_dm(letter.data).id
    except DecodeError:
        message_id = None
    return {"name": seat.name, "lifecycleUid": seat.uid, "id": letter.id, "messageId": message_id}


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
        self._drained = anyio.Event()
        self._drained.set()
        self.waiters: dict[str, Waiter] = {}
        # Dead letters per lifecycle uid: read from the broker at start, then kept by the bridges
        # and the dead-letter ops, so `ps` and `status` never wait on the broker for it.
        self.dead_counts: dict[str, int] = {}
        self.shutdown_requested = anyio.Event()
        self._tg: TaskGroup | None = None
        self._presence: KeyValue | None = None
        self._leases: KeyValue | None = None
        self.custody: KeyValue | None = None
        self.started_at = now_iso()
        self.delivery_gate = DeliveryGate()
        self.preservation = Preservation(self)
        self.resumption = Resumption(self)
        self.readoption = Readoption(self)

    # -- the narrow view the cut and the resume get (SeatOwner) -----------------------------------

    def agent_settings(self, agent: str) -> Mapping[str, Any]:
        return registry.agent_settings(self.config, agent)

    def custody_bucket(self) -> KeyValue:
        if self.custody is None:
            raise Refusal("not-ready", "the manager has no custody bucket yet", "retry")
        return self.custody

    def presence_bucket(self) -> KeyValue:
        if self._presence is None:
            raise Refusal("not-ready", "the manager has no presence bucket yet", "retry")
        return self._presence

    def adopt(self, seat: Seat) -> None:
        # Synchronous, so the slot is taken before the caller's first await and a concurrent
        # adoption of the same name is refused instead of racing.
        if seat.name in self.seats:
            raise Refusal(
                "duplicate-name",
                f"a seat named {seat.name!r} already exists",
                f"pick another name or `cotal rm {seat.name}` first",
            )
        self.seats[seat.name] = seat

    def remove(self, seat: Seat) -> None:
        if self.seats.get(seat.name) is seat:
            del self.seats[seat.name]
            seatfile.delete(self.layout, seat)

    def hand_over(self, seat: Seat) -> None:
        seatfile.delete(self.layout, seat)

    def persist(self, seat: Seat) -> None:
        """Rewrite the seat's record; a failure costs only the re-adoption after a crash, so it
        is logged, not raised."""
        if self.seats.get(seat.name) is not seat:
            return
        try:
            seatfile.save(self.layout, seat)
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
                if exc.code != "broker-unavailable" or not self.active:
                    raise
                log.warning(
                    "seat.relaunch_deferred", seat=seat.name, error=exc.text, retry_in_s=delay
                )
                await anyio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            seat.restarts += 1
            self.persist(seat)
            return

    async def launch(
        self, seat: Seat, *, continue_session: str | None = None, resume: str | None = None
    ) -> None:
        if seat.fence is None:
            seat.fence = WriterFence(
                self.js, self.space, seat.name, self.identity.instance_id, seat.generation_at_broker
            )
            await seat.fence.establish()
        await self._launch(
            seat, self._launch_opts(seat, continue_session=continue_session, resume=resume)
        )

    # -- lifecycle fence ------------------------------------------------------------------------

    @property
    def state(self) -> str:
        return "stopping" if self.stopping else self.maintenance.state

    @property
    def active(self) -> bool:
        return self.maintenance.state == "active" and not self.stopping

    @asynccontextmanager
    async def lifecycle(self, what: str) -> AsyncIterator[None]:
        # Check and count in one synchronous step: a fence set before the cut's first await
        # then sees every operation that got in, and nothing new can.
        if self.stopping:
            raise Refusal(
                "fenced", f"{what} refused: the manager is stopping", "wait for it to exit"
            )
        try:
            self.maintenance.check_lifecycle()
        except Refusal as exc:
            raise Refusal(exc.code, f"{what} refused: {exc.message}", exc.cure) from None
        self.in_flight += 1
        self._drained = anyio.Event() if self.in_flight == 1 else self._drained
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._drained.set()

    async def drain(self) -> None:
        await self._drained.wait()

    # -- run ------------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        r = self.replicas
        await footprint.ensure_dm_stream(self.js, self.space, replicas=r)
        await deadletter.ensure_dead_stream(self.js, self.space, replicas=r)
        self.dead_counts.update(await deadletter.counts(self.js, self.space))
        self._presence = await footprint.ensure_kv(
            self.js, names.presence_bucket(self.space), ttl=names.PRESENCE_TTL_S, replicas=r
        )
        self._leases = await footprint.ensure_kv(
            self.js, names.manager_bucket(self.space), ttl=names.MANAGER_LEASE_TTL_S, replicas=r
        )
        self.custody = await footprint.ensure_kv(
            self.js, names.custody_bucket(self.space), ttl=None, replicas=r
        )
        ensure_private_dir(self.layout.sessions)
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._lease_loop)
            tg.start_soon(self._custody_watch)
            if self.maintenance.state == "active":
                # Only a manager in ordinary service takes back its predecessor's seats; one
                # started for a resume adopts exactly what the checkpoint names.
                for seat, record in self.readoption.enter_all():
                    await tg.start(self.readoption.run, seat, record)
            task_status.started()
            await anyio.sleep_forever()

    async def _lease_loop(self) -> None:
        assert self._leases is not None
        key = names.lease_key(self.identity.instance_id)
        value = encode(
            ManagerLease(
                holder=self.identity.instance_id,
                root=str(self.layout.root),
                pid=os.getpid(),
                since=self.started_at,
            )
        )
        while True:
            try:
                with anyio.fail_after(2.0):
                    await self._leases.put(key, value)
            except Exception as exc:
                log.warning("lease.renew_failed", error=str(exc))
            await anyio.sleep(names.MANAGER_LEASE_RENEW_S)

    # -- dispatch -------------------------------------------------------------------------------

    async def handle(self, op: str, args: Any) -> Any:
        handler = getattr(self, "op_" + op.replace("-", "_"), None)
        if handler is None:
            raise Refusal(
                "unsupported-op", f"op {op!r} is not implemented by this daemon", "upgrade cotal"
            )
        return await handler(args)

    async def op_status(self, _args: control.NoArgs) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "space": self.space,
            "root": str(self.layout.root),
            "instanceId": self.identity.instance_id,
            "state": self.state,
            "seats": len(self.seats),
            "seatStates": self._seat_states(),
            "server": self.server_url,
            "startedAt": self.started_at,
            "inFlight": self.in_flight,
            # A coordinator that died leaves its attempt here: a rerun joins it by this id, and
            # `--abort` may lift the fence only while the commit has not begun.
            "attemptId": self.maintenance.attempt_id,
            "commitStarted": self.maintenance.commit_started,
            "activated": self.maintenance.activated,
            "deadLetters": self._dead_by_seat(),
        }

    def _dead_by_seat(self) -> dict[str, int]:
        """Each seat's dead letters, for the seats that have any."""
        found = {s.name: self.dead_counts.get(s.uid, 0) for s in self.seats.values()}
        return {name: n for name, n in sorted(found.items()) if n}

    def _seat_states(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for seat in self.seats.values():
            counts[seat.state] = counts.get(seat.state, 0) + 1
        return dict(sorted(counts.items()))

    async def op_ps(self, _args: control.NoArgs) -> list[control.SeatRow]:
        return [
            msgspec.structs.replace(
                s.row(self.identity.instance_id), dead_letters=self.dead_counts.get(s.uid, 0)
            )
            for s in sorted(self.seats.values(), key=lambda s: s.name)
        ]

    # -- spawn ----------------------------------------------------------------------------------

    async def op_spawn(self, args: control.SpawnArgs) -> control.SeatRow:
        async with self.lifecycle("spawn"):
            name = names.check_new_seat_name(args.name)
            if len(self.seats) >= names.MAX_SEATS:
                raise Refusal(
                    "capacity",
                    f"this manager already runs {names.MAX_SEATS} seats",
                    "remove a seat first (`cotal rm NAME`; a stopped seat still counts)",
                )
            connector = registry.load_connector(args.agent)
            cwd = Path(args.cwd).resolve() if args.cwd else self.layout.root
            if not cwd.is_dir():
                raise Refusal(
                    "bad-cwd",
                    f"cwd {cwd} is not a directory",
                    "pass --cwd with an existing directory",
                )
            uid = names.mint_lifecycle_uid()
            seat = Seat(
                name=name,
                agent=args.agent,
                uid=uid,
                cwd=cwd,
                connector=connector,
                continuity=continuity_class(connector.capabilities),
                model=args.model,
                started_at=now_iso(),
                pointer_path=self.layout.session_pointer(connector.name, name, uid),
            )
            self.adopt(seat)
            try:
                await footprint.ensure_dm_durable(self.js, self.space, names.SEAT_OWNER, name, uid)
                held = await custody.establish(
                    self.custody_bucket(), name, uid, self.identity.instance_id
                )
                seat.custody_revision, seat.generation_at_broker = (
                    held.revision,
                    held.record.generation,
                )
                # On disk before the launch: a manager that dies from here on leaves a record
                # its successor re-adopts, not an orphaned durable and custody key.
                seatfile.save(self.layout, seat)
                seat.fence = WriterFence(self.js, self.space, name, self.identity.instance_id, 0)
                await seat.fence.establish()
                await self._launch(
                    seat, self._launch_opts(seat, prompt=args.prompt, resume=args.resume)
                )
            except BaseException:
                self.remove(seat)
                with anyio.CancelScope(shield=True):
                    await self._deprovision(seat)
                raise
            log.info("seat.spawned", seat=name, uid=uid, agent=args.agent, session=seat.session_id)
            return seat.row(self.identity.instance_id)

    def _launch_opts(
        self,
        seat: Seat,
        *,
        prompt: str | None = None,
        continue_session: str | None = None,
        resume: str | None = None,
    ) -> LaunchOpts:
        settings = dict(registry.agent_settings(self.config, seat.agent))
        return LaunchOpts(
            space=self.space,
            name=seat.name,
            lifecycle_uid=seat.uid,
            workspace_root=self.layout.root,
            cwd=seat.cwd,
            session_pointer_path=seat.pointer_path,
            prompt=prompt,
            model=seat.model or settings.get("model"),
            continue_session=continue_session,
            resume=resume,
            config=settings,
        )

    async def _launch(self, seat: Seat, opts: LaunchOpts) -> None:
        """Start the seat's process and prove it ready; raises with the process reaped. A start
        its launcher could not set up for a transient reason is tried again (`incarnation`)."""
        assert self._tg is not None
        await self._require_custody(seat)
        spec = seat.connector.build_launch(opts)
        ensure_private_dir(seat.pointer_path.parent)
        seat.spec = spec
        describe = getattr(seat.connector, "describe", None)
        # What a connector says about a launch for people (its permission mode, where its
        # credential comes from); it reads no secret, so it may be shown in `ps --wide`.
        seat.described = dict(describe(opts)) if callable(describe) else {}
        failures = 0
        while True:
            try:
                await self._tg.start(self._run_seat, seat, spec)
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
                if self.seats.get(seat.name) is not seat or not seat.lifecycle.allows("restart"):
                    # Stopped, removed or evicted meanwhile: that owns the seat now.
                    raise
            await self._require_custody(seat)
            seat.apply("restart")

    async def _require_custody(self, seat: Seat) -> None:
        """A seat is launched or relaunched only while this manager holds its custody."""
        held = await custody.read(self.custody_bucket(), seat.name, seat.uid)
        if (
            held is None
            or held.record.holder != self.identity.instance_id
            or held.record.generation != seat.generation_at_broker
        ):
            who = (
                f"instance {held.record.holder} at generation {held.record.generation}"
                if held
                else "nobody"
            )
            raise Refusal(
                "custody-not-held",
                f"refusing to launch {seat.name} (uid {seat.uid}): its custody is held by {who}, "
                f"this manager ({self.identity.instance_id}) is at generation "
                f"{seat.generation_at_broker}",
                "another host runs this seat now; do not start it here",
            )

    async def _run_seat(
        self, seat: Seat, spec: LaunchSpec, *, task_status: TaskStatus[None]
    ) -> None:
        done = anyio.Event()
        seat.run_done = done
        try:
            await self._run_incarnation(seat, spec, task_status=task_status)
        finally:
            done.set()

    async def _run_incarnation(
        self, seat: Seat, spec: LaunchSpec, *, task_status: TaskStatus[None]
    ) -> None:
        handle = SeatHandle(spec, self.layout.seat_log(seat.name, seat.uid))
        seat.handle = handle
        process = await handle.start()
        assert process.stdin is not None and process.stdout is not None
        driver = seat.connector.make_driver(process.stdin, process.stdout, spec)
        seat.driver = driver
        started = False
        failure: Refusal | None = None
        try:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._watch_exit, seat, handle, scope)
                    await tg.start(driver.run)
                    try:
                        with anyio.fail_after(READINESS_TIMEOUT_S):
                            await self._prove_ready(seat, spec, driver, handle)
                        # Lifecycle proof before presence: a uid whose durable is not at the
                        # broker never becomes visible.
                        await footprint.confirm_dm_durable(
                            self.js, self.space, names.SEAT_OWNER, seat.name, seat.uid
                        )
                    except TimeoutError:
                        failure = Refusal(
                            "seat-not-ready",
                            f"seat {seat.name} was not ready within {READINESS_TIMEOUT_S:.0f}s",
                            f"read {handle.log_path}",
                        )
                    except Refusal as exc:
                        failure = exc
                    if failure is None and not seat.lifecycle.allows("ready"):
                        failure = Refusal(
                            "seat-stopped",
                            f"seat {seat.name} was told to stop ({seat.state}) before it was ready",
                            "spawn it again if it is still wanted",
                        )
                    if failure is not None:
                        scope.cancel()
                        await anyio.sleep_forever()
                    assert seat.fence is not None
                    bridge = DeliveryBridge(
                        self.js,
                        self.space,
                        seat.name,
                        seat.uid,
                        driver,
                        handle,
                        self.waiters,
                        fence=seat.fence,
                        on_fenced=lambda: self._schedule_evict(
                            seat, holder_now=None, reason="a publish was refused by the broker"
                        ),
                        gate=self.delivery_gate,
                        max_deliveries=self.config.delivery.max_deliveries,
                        on_ambiguous=lambda detail: self.restart_after_turn(seat, handle, detail),
                        deliberate=lambda: seat.lifecycle.deliberate,
                        dead_counts=self.dead_counts,
                    )
                    seat.bridge = bridge
                    await tg.start(bridge.run)
                    tg.start_soon(self._presence_loop, seat, handle)
                    seat.apply("ready")
                    self.persist(seat)
                    started = True
                    task_status.started()
        except BaseExceptionGroup as group:
            log.error("seat.task_failed", seat=seat.name, error=repr(group.exceptions[0]))
            failure = failure or Refusal(
                "seat-failed",
                f"seat {seat.name} failed: {group.exceptions[0]!r}",
                f"read {handle.log_path}",
            )
        finally:
            with anyio.CancelScope(shield=True):
                await handle.reap()
                await self._clear_presence(seat)
                if seat.handle is handle:
                    seat.last_exit = exit_text(handle.returncode)
                    # An exit nobody asked for is `exit`; a stop that missed its deadline is
                    # proven by this reap. A stop in progress owns its own proof.
                    if seat.lifecycle.allows("exit"):
                        seat.apply("exit")
                    elif seat.state == "unproven":
                        seat.apply("reaped")
                        self.persist(seat)
        if not started:
            # The launcher's own report says more than whatever the readiness wait saw.
            launch = _exited_before_ready(seat, handle) if handle.launch_fault else None
            raise launch or failure or _exited_before_ready(seat, handle)
        if seat.handle is handle and self._tg is not None:
            self._tg.start_soon(self._on_exit, seat, handle)

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

    async def _prove_ready(
        self, seat: Seat, spec: LaunchSpec, driver: Driver, handle: SeatHandle
    ) -> None:
        while True:
            if handle.reaped:
                raise _exited_before_ready(seat, handle)
            try:
                reported = await driver.get_state()
            except Refusal as exc:
                if exc.code != "driver-stopped":
                    raise
                # The harness's output ended before it answered: it is exiting, and its
                # status may not be reaped yet. The refusal names how it ended and its log.
                with anyio.move_on_after(LAST_KILL_WAIT_S):
                    await handle.exited()
                    raise _exited_before_ready(seat, handle) from None
                raise Refusal(
                    "seat-failed",
                    f"seat {seat.name} closed its output during start and did not exit",
                    f"read {handle.log_path}",
                ) from None
            if reported:
                break
            await anyio.sleep(0.05)
        if spec.expected_session_id is not None and reported != spec.expected_session_id:
            raise Refusal(
                "session-mismatch",
                f"replacement reported session {reported}, expected {spec.expected_session_id}",
                "the harness did not reopen the recorded session; inspect its store",
            )
        if spec.session_pointer_path is not None:
            pointer = await self._await_pointer(spec.session_pointer_path, handle)
            if pointer.status != "running":
                raise Refusal(
                    "deliberate-quit",
                    "connector reported a deliberate quit before readiness completed",
                    "respawn the seat",
                )
            if pointer.session_id != reported:
                raise Refusal(
                    "session-mismatch",
                    f"pointer names session {pointer.session_id}, the harness reports {reported}",
                    "the harness and its pointer disagree; inspect the store",
                )
        seat.session_id = reported

    async def _await_pointer(self, path: Path, handle: SeatHandle) -> SessionPointer:
        while True:
            try:
                return read_pointer(path)
            except (FileNotFoundError, DecodeError):
                if handle.reaped:
                    raise
                await anyio.sleep(0.05)

    async def _presence_loop(self, seat: Seat, handle: SeatHandle) -> None:
        assert self._presence is not None
        key = names.presence_key(names.SEAT_OWNER, seat.name, seat.uid)
        value = encode(
            Presence(
                seat=seat.name,
                lifecycle_uid=seat.uid,
                instance_id=self.identity.instance_id,
                agent=seat.agent,
                pid=handle.pid or 0,
                since=now_iso(),
            )
        )
        while True:
            try:
                with anyio.fail_after(2.0):
                    await self._presence.put(key, value)
            except Exception as exc:
                log.warning("presence.put_failed", seat=seat.name, error=str(exc))
            await anyio.sleep(names.PRESENCE_HEARTBEAT_S)

    async def _clear_presence(self, seat: Seat) -> None:
        if self._presence is None:
            return
        try:
            with anyio.fail_after(2.0):
                await self._presence.delete(
                    names.presence_key(names.SEAT_OWNER, seat.name, seat.uid)
                )
        except Exception as exc:
            log.warning("presence.delete_failed", seat=seat.name, error=str(exc))

    # -- exits and crash recovery -----------------------------------------------------------------

    async def _on_exit(self, seat: Seat, handle: SeatHandle) -> None:
        code = handle.returncode
        if (
            seat.state != "exited"
            or seat.handle is not handle
            or not self.active
            or self.seats.get(seat.name) is not seat
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
            await self._free(seat)
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
            await self._free(seat)
            return
        await self._recover(seat, pointer.session_id)

    def restart_after_turn(self, seat: Seat, handle: SeatHandle, detail: str) -> bool:
        """A turn ended ambiguously while its harness may still be in a provider call: end this
        incarnation so the crash restart relaunches it into its own session (record 4.2: the
        restart ends the call before the message is redelivered). Granted only where a crash
        would be restarted and within the same budget; True when the harness is being ended."""
        if (
            not self.active
            or self._tg is None
            or self.seats.get(seat.name) is not seat
            or seat.handle is not handle
            or seat.state != "running"
        ):
            return False
        refused: str | None = None
        if seat.continuity != "exact" or not seat.recovery_armed:
            refused = f"a {seat.continuity} seat's session is not reopened by a restart"
        else:
            try:
                if read_pointer(seat.pointer_path).status != "running":
                    refused = "its harness quit the session"
            except (OSError, DecodeError) as exc:
                refused = f"its session pointer cannot be read ({exc})"
        now = time.monotonic()
        recent = [t for t in seat.crashes if now - t < names.SESSION_RESTART_WINDOW_S]
        if refused is None and len(recent) >= names.SESSION_RESTART_LIMIT:
            refused = (
                f"its restart budget is spent ({len(recent)} restarts within "
                f"{names.SESSION_RESTART_WINDOW_S:.0f}s)"
            )
        if refused is not None:
            log.warning("seat.turn_restart_refused", seat=seat.name, why=refused, turn=detail)
            return False
        log.warning("seat.turn_restart", seat=seat.name, pid=handle.pid, turn=detail)
        self._tg.start_soon(self._end_incarnation, seat, handle)
        return True

    async def _end_incarnation(self, seat: Seat, handle: SeatHandle) -> None:
        # Not a stop: the lifecycle sees an exit nobody asked for, and the crash restart (with
        # its budget, its pointer and its session proof) takes it from there.
        if not await handle.stop(graceful=True):
            log.error("seat.turn_restart_unproven", seat=seat.name, pid=handle.pid)

    async def _recover(self, seat: Seat, session_id: str) -> None:
        """Relaunch a crashed seat into its session. A broker that is briefly away (an
        election) defers the relaunch and never costs the seat its footprint; custody that
        moved evicts it; only a refusal about the seat itself frees it."""
        delay = 1.0
        while (
            self.active and self.seats.get(seat.name) is seat and seat.lifecycle.allows("restart")
        ):
            try:
                async with self.lifecycle("crash restart"):
                    seat.apply("restart")
                    await self._launch(seat, self._launch_opts(seat, continue_session=session_id))
                    seat.restarts += 1
                    self.persist(seat)
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
                if exc.code == "broker-unavailable":
                    log.warning(
                        "seat.recovery_deferred", seat=seat.name, error=exc.text, retry_in_s=delay
                    )
                    await anyio.sleep(delay)
                    delay = min(delay * 2, 30.0)
                    continue
                if exc.code == "custody-not-held":
                    await self.evict(seat, None, exc.message)
                    return
                log.error("seat.recovery_failed", seat=seat.name, error=exc.text)
                if self.active:
                    await self._free(seat)
                return
            except Exception as exc:
                # Not a refusal: keep the seat and its footprint, and say so; an operator can
                # stop it.
                if seat.lifecycle.allows("fail"):
                    seat.apply("fail")
                log.exception("seat.recovery_error", seat=seat.name, error=repr(exc))
                return

    def _schedule_evict(self, seat: Seat, *, holder_now: str | None, reason: str) -> None:
        if self._tg is not None and seat.lifecycle.allows("evict"):
            self._tg.start_soon(self.evict, seat, holder_now, reason)

    async def evict(self, seat: Seat, holder_now: str | None, reason: str) -> None:
        """Custody moved away: stop the seat at once, prove it, and never relaunch it here.

        Nothing is deprovisioned: the durable and the custody record are the new holder's.
        """
        if not seat.lifecycle.allows("evict"):
            return
        seat.apply("evict")
        with anyio.CancelScope(shield=True):
            try:
                await self.stop_and_prove(seat, graceful=False)
            except Refusal as exc:
                # Evicted all the same: the custody is another holder's. The process stays
                # with its run task, which reaps it when the kernel lets go.
                log.error("custody.evict_unproven", seat=seat.name, error=exc.text)
            finally:
                self.remove(seat)
        log.error(
            "custody.evicted",
            seat=seat.name,
            uid=seat.uid,
            holder_was=self.identity.instance_id,
            holder_now=holder_now,
            generation=seat.generation_at_broker,
            reason=reason,
            exit_code=seat.handle.returncode if seat.handle else None,
        )

    async def _custody_watch(self) -> None:
        """Watch every custody key; a seat of ours whose record moves to another holder or
        generation (or disappears) is evicted at once."""
        assert self.custody is not None
        while True:
            try:
                watcher = await self.custody.watch(f"{names.SEAT_OWNER}.>")
                async for entry in watcher:
                    if entry is None:
                        continue
                    self._on_custody_entry(entry)
            except anyio.get_cancelled_exc_class():
                raise
            except Exception as exc:
                log.warning("custody.watch_failed", error=str(exc))
                await anyio.sleep(1.0)

    def _on_custody_entry(self, entry: Any) -> None:
        parts = entry.key.split(".")
        if len(parts) != 3:
            return
        _owner, name, uid = parts
        seat = self.seats.get(name)
        if seat is None or seat.uid != uid or not seat.lifecycle.allows("evict"):
            return
        if seat.handle is None and seat.state in ("exited", "failed"):
            # Entered from its record and never run here: re-adoption reads the custody itself
            # and keeps the seat listed with the reason instead of making it vanish.
            return
        if entry.operation in ("DEL", "PURGE"):
            if not seat.lifecycle.deliberate:
                self._schedule_evict(seat, holder_now=None, reason="custody record deleted")
            return
        try:
            record = decode_custody(entry.value or b"")
        except DecodeError:
            self._schedule_evict(seat, holder_now=None, reason="custody record unreadable")
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
            record.holder != self.identity.instance_id
            or record.generation != seat.generation_at_broker
        ):
            self._schedule_evict(
                seat,
                holder_now=record.holder,
                reason=f"custody moved to generation {record.generation}",
            )

    async def _free(self, seat: Seat) -> None:
        self.remove(seat)
        if seat.footprint_owned:
            await self._deprovision(seat)

    async def _deprovision(self, seat: Seat) -> str | None:
        """Ordinary teardown: exactly this seat's durable, its dead letters, its presence and its
        pointer. Returns why the durable could not be deleted, or None once it is gone."""
        durable_error: str | None = None
        with anyio.CancelScope(shield=True):
            try:
                await deadletter.purge_seat(
                    self.js, self.space, names.SEAT_OWNER, seat.name, seat.uid
                )
                self.dead_counts.pop(seat.uid, None)
            except Exception as exc:
                log.error("deadletter.purge_failed", seat=seat.name, error=str(exc))
            try:
                await footprint.delete_dm_durable(
                    self.js, self.space, names.SEAT_OWNER, seat.name, seat.uid
                )
            except Exception as exc:
                durable_error = str(exc) or type(exc).__name__
                log.error("durable.delete_failed", seat=seat.name, error=str(exc))
            await self._clear_presence(seat)
            if self.custody is not None:
                try:
                    with anyio.fail_after(5.0):
                        released = await custody.release(
                            self.custody, seat.name, seat.uid, self.identity.instance_id
                        )
                    if not released:
                        log.info("custody.left_to_holder", seat=seat.name, uid=seat.uid)
                except Exception as exc:
                    log.error("custody.delete_failed", seat=seat.name, error=str(exc))
            try:
                seat.pointer_path.unlink()
            except FileNotFoundError:
                pass
        return durable_error

    # -- stop -----------------------------------------------------------------------------------

    async def op_stop_seat(self, args: control.StopSeatArgs) -> dict[str, Any]:
        """Stop and prove, and keep: the durable, the session, the custody and the record stay,
        so `start-seat` can bring the seat back as it was."""
        async with self.lifecycle("stop-seat"):
            seat = self._seat(args.name)
            if seat.state in ("evicting", "evicted"):
                raise Refusal(
                    "evicted",
                    f"seat {seat.name} is {seat.state}: its custody moved to another holder",
                    "nothing to stop here; see `cotal ps`",
                )
            already = seat.state == "stopped"
            await self.stop_and_prove(seat, graceful=True)
            log.info("seat.stopped", seat=seat.name, uid=seat.uid, last_exit=seat.last_exit)
            return self._stop_result(seat, alreadyStopped=already, kept=True)

    async def op_start_seat(self, args: control.StartSeatArgs) -> dict[str, Any]:
        async with self.lifecycle("start-seat"):
            seat = self._seat(args.name)
            already = seat.state == "running"
            if not already:
                self._require_startable(seat, "start")
                await self._start(seat)
            row: dict[str, Any] = msgspec.to_builtins(seat.row(self.identity.instance_id))
            return {**row, "alreadyRunning": already}

    async def op_restart_seat(self, args: control.RestartSeatArgs) -> control.SeatRow:
        async with self.lifecycle("restart-seat"):
            seat = self._seat(args.name)
            if seat.state != "running":
                self._require_startable(seat, "restart")
            await self.stop_and_prove(seat, graceful=True)
            await self._start(seat)
            return seat.row(self.identity.instance_id)

    async def op_remove_seat(self, args: control.RemoveSeatArgs) -> dict[str, Any]:
        """Stop if running, prove it, then deprovision exactly this seat's footprint: durable,
        presence, custody record, session pointer and persisted record."""
        async with self.lifecycle("remove-seat"):
            seat = self._seat(args.name)
            await self.stop_and_prove(seat, graceful=True)
            dead = self.dead_counts.get(seat.uid, 0) if seat.footprint_owned else 0
            await self._free(seat)
            log.info("seat.removed", seat=seat.name, uid=seat.uid, footprint=seat.footprint_owned)
            return {
                **self._stop_result(seat, footprintDeleted=seat.footprint_owned),
                "deadLettersDeleted": dead,
            }

    def _stop_result(self, seat: Seat, **extra: bool) -> dict[str, Any]:
        return {
            "name": seat.name,
            "lifecycleUid": seat.uid,
            "exitCode": seat.handle.returncode if seat.handle else None,
            "lastExit": seat.last_exit,
            "state": seat.state,
            **extra,
        }

    @staticmethod
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
            "not-stopped",
            f"{verb} refused: seat {seat.name} is {seat.state}{why}; only a stopped seat (or, for "
            "restart, a running one) is started",
            cure,
        )

    async def _start(self, seat: Seat) -> None:
        """Relaunch a `stopped` seat under its uid into its session, as a crash restart does:
        custody re-checked, the durable confirmed, the pointer's session continued (`exact`) or
        forked from (`fork`). A start that fails leaves the seat stopped again, proven."""
        failure: BaseException | None = None
        with anyio.CancelScope(shield=True):
            # The stop lock is held through the launch, so a stop arriving meanwhile stops the
            # new process instead of proving the old, already reaped one.
            async with seat.stop_lock:
                try:
                    if seat.run_done is not None:
                        # The last incarnation's own cleanup reads the lifecycle to tell a crash
                        # from a stop: it must have finished before the seat moves on.
                        with anyio.fail_after(READINESS_TIMEOUT_S):
                            await seat.run_done.wait()
                    await footprint.confirm_dm_durable(
                        self.js, self.space, names.SEAT_OWNER, seat.name, seat.uid
                    )
                    continue_session, fork_from = session_to_reopen(seat)
                    seat.apply("start")
                    seat.reason = None
                    await self.launch(seat, continue_session=continue_session, resume=fork_from)
                except BaseException as exc:
                    failure = exc
                else:
                    seat.restarts += 1
                    self.persist(seat)
            if failure is not None:
                # Straight back to `stopped` (from `restarting` or the failed launch's `exited`)
                # through the one stop-and-prove, never through a crash restart.
                if seat.state != "stopped":
                    await self.stop_and_prove(seat, graceful=False)
                raise failure
        log.info(
            "seat.started_again", seat=seat.name, session=seat.session_id, restarts=seat.restarts
        )

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
                    self.persist(seat)
                handle = seat.handle
                proven = handle is None or await handle.stop(graceful=graceful)
                pid = handle.pid if handle is not None else None
                if not proven:
                    seat.apply("unproven")
                    raise Refusal(
                        "stop-unproven",
                        f"seat {seat.name} (pid {pid}) was not reaped within "
                        f"{STOP_DEADLINE_S + LAST_KILL_WAIT_S:.0f}s of its stop",
                        f"kill -9 {pid} (it may be stuck in the kernel), then retry; the manager "
                        "reaps it as soon as it dies",
                    )
                # A pass over every process's environment: in a worker thread, so the stops of
                # other seats (a cut stops them side by side) go on meanwhile.
                survivors = await anyio.to_thread.run_sync(
                    processes_with_env, "COTAL_LIFECYCLE_UID", seat.uid
                )
                if survivors:
                    seat.apply("unproven")
                    raise Refusal(
                        "stop-unproven",
                        f"seat {seat.name} (pid {pid}) exited but processes of its lifecycle are "
                        f"still alive: {survivors}",
                        f"kill {' '.join(map(str, survivors))}, then retry",
                    )
                seat.apply("proven")
                if handle is not None:
                    seat.last_exit = exit_text(handle.returncode)
                if record:
                    self.persist(seat)

    def _seat(self, name: str) -> Seat:
        seat = self.seats.get(name)
        if seat is None:
            raise Refusal("no-such-seat", f"no seat named {name!r}", "see `cotal ps`")
        return seat

    # -- send -----------------------------------------------------------------------------------

    async def op_send(self, args: control.SendArgs) -> dict[str, Any]:
        seat = self._seat(args.name)
        if not args.text:
            raise Refusal(
                "empty-message", "refusing to send an empty message", "pass the text to send"
            )
        dm = DirectMessage(
            id=new_message_id(),
            sender=names.principal(names.SEAT_OWNER, names.OPERATOR_ACTOR),
            recipient=names.principal(names.SEAT_OWNER, seat.name),
            text=args.text,
            sent_at=now_iso(),
        )
        waiter = Waiter() if args.wait else None
        if waiter is not None:
            self.waiters[dm.id] = waiter
        try:
            seq = await publish_dm(self.js, self.space, dm)
            result: dict[str, Any] = {"id": dm.id, "seq": seq, "seat": seat.name}
            if waiter is None:
                return result
            try:
                with anyio.fail_after(args.timeout_s):
                    await waiter.done.wait()
            except TimeoutError:
                raise Refusal(
                    "no-reply",
                    f"no reply from {seat.name} within {args.timeout_s:.0f}s",
                    "the message stays queued in the seat's inbox; check `cotal ps` and the seat "
                    "log",
                ) from None
            assert waiter.outcome is not None
            result.update(reply=waiter.outcome.reply, attempts=waiter.attempts)
            return result
        finally:
            self.waiters.pop(dm.id, None)

    # -- dead letters ---------------------------------------------------------------------------

    async def op_dead_letters(self, args: control.DeadLettersArgs) -> control.DeadLetters:
        seat = self._seat(args.name)
        owner = names.SEAT_OWNER
        count = await deadletter.count_of(self.js, self.space, owner, seat.name, seat.uid)
        letters = await deadletter.listing(self.js, self.space, owner, seat.name, seat.uid)
        self.dead_counts[seat.uid] = count
        return control.DeadLetters(
            name=seat.name,
            lifecycle_uid=seat.uid,
            count=count,
            letters=[_dead_row(letter) for letter in letters],
            truncated=count > len(letters),
        )

    async def op_redeliver_dead_letter(self, args: control.DeadLetterArgs) -> dict[str, Any]:
        """Put one dead letter back into the seat's inbox, then remove it from the dead letters:
        a crash between the two leaves it in both, never in neither."""
        async with self.lifecycle("redeliver"):
            seat = self._seat(args.name)
            owner = names.SEAT_OWNER
            letter = await deadletter.fetch(
                self.js, self.space, owner, seat.name, seat.uid, args.id
            )
            seq = await deadletter.put_back(self.js, self.space, owner, seat.name, letter)
            await deadletter.remove(self.js, self.space, letter.id)
            self._count_removed(seat)
            log.info("deadletter.redelivered", seat=seat.name, id=letter.id, seq=seq)
            return {
                **_dead_ids(seat, letter),
                "seq": seq,
                # What the harness is told: its next delivery's number.
                "delivery": letter.meta.deliveries + 1,
            }

    async def op_drop_dead_letter(self, args: control.DeadLetterArgs) -> dict[str, Any]:
        async with self.lifecycle("drop"):
            seat = self._seat(args.name)
            letter = await deadletter.fetch(
                self.js, self.space, names.SEAT_OWNER, seat.name, seat.uid, args.id
            )
            await deadletter.remove(self.js, self.space, letter.id)
            self._count_removed(seat)
            log.info("deadletter.dropped", seat=seat.name, id=letter.id)
            return _dead_ids(seat, letter)

    def _count_removed(self, seat: Seat) -> None:
        self.dead_counts[seat.uid] = max(0, self.dead_counts.get(seat.uid, 0) - 1)

    async def _refuse_dead_letters(self) -> None:
        """A cut carries each seat's inbox, not its dead letters: refused while any seat holds
        one, before the fence, so nothing stops. The read is retried until no move to dead
        letters was under way across it, so none lands unseen between the read and the fence
        (the fence, which follows with no await, ends them)."""
        gate = self.delivery_gate
        while True:
            begun = await gate.quiet()
            found = await deadletter.counts(self.js, self.space)
            if not gate.burying and gate.burials_begun == begun:
                break
        self.dead_counts.clear()
        self.dead_counts.update(found)
        held = self._dead_by_seat()
        if held:
            listed = ", ".join(f"{name} {n}" for name, n in held.items())
            first = next(iter(held))
            raise Refusal(
                "dead-letters-waiting",
                f"preservation refused: seat(s) hold dead letters ({listed}); a cut carries "
                "each seat's inbox, not its dead letters",
                f"`cotal inbox {first}` lists them; put each back (`cotal inbox {first} "
                "--redeliver ID`) or drop it (`--drop ID`), for every seat named, then cut "
                "again; nothing was stopped",
            )

    # -- the cut --------------------------------------------------------------------------------

    async def op_progress(self, args: control.ProgressArgs) -> control.ProgressResult:
        return self.preservation.progress.read(args)

    async def op_prepare_preservation(self, args: control.AttemptArgs) -> dict[str, Any]:
        if self.maintenance.state == "active":
            # A cut carries running seats and resumes them running; a stopped seat would come
            # back started behind the operator's back, so the operator decides first. Checked
            # before the fence, so the refusal changes nothing.
            kept = sorted(s.name for s in self.seats.values() if s.state == "stopped")
            if kept:
                raise Refusal(
                    "seat-stopped",
                    f"preservation refused: seat(s) {', '.join(kept)} stopped; a cut carries "
                    "running seats only",
                    f"`cotal start {kept[0]}` or `cotal rm {kept[0]}` first (each stopped seat), "
                    "then cut again; nothing was stopped",
                )
            await self._refuse_dead_letters()
        return await self.preservation.prepare(args)

    async def op_commit_preservation(self, args: control.CommitPreservationArgs) -> dict[str, Any]:
        return await self.preservation.commit(args)

    async def op_abort_preservation(self, args: control.AttemptArgs) -> dict[str, Any]:
        return await self.preservation.abort(args)

    # -- the resume -----------------------------------------------------------------------------

    async def op_resume_preserved(self, args: control.ResumeArgs) -> dict[str, Any]:
        return await self.resumption.resume(args)

    async def op_commit_resume(self, args: control.AttemptArgs) -> dict[str, Any]:
        return await self.resumption.commit(args)

    async def op_finalize_resume(self, args: control.FinalizeArgs) -> dict[str, Any]:
        return await self.resumption.finalize(args)

    # -- shutdown -------------------------------------------------------------------------------

    async def op_shutdown(self, _args: control.NoArgs) -> dict[str, Any]:
        stopped: list[dict[str, Any]] = []
        if self.maintenance.state == "preserving":
            raise Refusal(
                "fenced",
                f"shutdown refused: preservation attempt {self.maintenance.attempt_id} is in "
                "progress",
                "commit or abort it first (cotal down --preserve-state continues it)",
            )
        if self.maintenance.state != "active":
            # Cleanup is suppressed outside `active`: the seats' durables are the cut's or the
            # resume's, so the daemon exits without deprovisioning anything.
            await self.stop_all_keep_footprint()
            self.shutdown_requested.set()
            return {"stopped": [], "footprintKept": True, "state": self.maintenance.state}
        unproven: dict[str, Refusal] = {}
        order = list(self.seats)
        async with self.lifecycle("shutdown"):
            self.stopping = True
            try:
                async with anyio.create_task_group() as tg:
                    for seat in list(self.seats.values()):
                        tg.start_soon(self._teardown_one, seat, stopped, unproven)
            finally:
                self.shutdown_requested.set()
        if unproven:
            # Every other seat was still stopped; the operator is told each survivor by name.
            named = [unproven[n] for n in order if n in unproven]
            raise Refusal(
                "stop-unproven",
                "; ".join(r.message for r in named),
                "; ".join(r.cure for r in named if r.cure),
            )
        return {"stopped": stopped}

    async def _teardown_one(
        self, seat: Seat, out: list[dict[str, Any]], unproven: dict[str, Refusal]
    ) -> None:
        try:
            await self.stop_and_prove(seat, graceful=True)
        except Refusal as exc:
            unproven[seat.name] = exc
            return
        # `_free`, with the deprovision's outcome kept: an operator told "durable deleted" while
        # the broker refused the delete would believe a footprint gone that is still there.
        self.remove(seat)
        durable_error = await self._deprovision(seat) if seat.footprint_owned else None
        if durable_error is not None:
            # The durable outlives this manager, so its record must too: the next manager takes
            # the seat back stopped, and its `cotal down` deletes what this one could not.
            try:
                seatfile.save(self.layout, seat)
            except (OSError, Refusal) as exc:
                log.error("seat.record_write_failed", seat=seat.name, error=str(exc))
        out.append(
            {
                "name": seat.name,
                "lifecycleUid": seat.uid,
                "exitCode": seat.handle.returncode if seat.handle else None,
                "durableDeleted": seat.footprint_owned and durable_error is None,
                "durableError": durable_error,
                "footprintOwned": seat.footprint_owned,
            }
        )

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
