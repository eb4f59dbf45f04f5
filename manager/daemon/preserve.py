"""The cut, daemon side (record 1.3): fence, drain, plan, persist; then stop, prove, capture, seal.

`prepare` stops nothing: a plan that cannot resume fails there, when a failure costs nothing,
and the fence is lifted again. The fence also closes the delivery gate, so no seat starts a new
turn from then on (an abort opens it again). `commit` is the point of no return: cleanup is
suppressed (no deprovision, no restart); each seat, in parallel, is given until the drain
timeout for the turn in flight to reach its boundary and be acknowledged, then hard-stopped, and
each exit is proven; only then is anything captured. A seat still mid-turn at the deadline is
cut anyway and named (`midTurn`): its message stays unacknowledged and comes back after the
resume. A seat that cannot be proven stopped fails the cut by name and nothing is captured for
it. The per-seat checks, stops and captures run a few seats at once (`manager/concurrency.py`),
with each seat's outcome kept on its own and every record in seat order.

See docs/architecture.md ("How a cut flows through the house") and docs/cli.md (the cut).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import msgspec
import structlog

from connectors.base import Driver
from connectors.driverkit import INITIAL_PROMPT_ID, LAUNCH_PROMPT_LOST
from manager import concurrency, failpoint, registry
from manager.broker import custody, frontier, space
from manager.broker.retry import phase
from manager.checkpoint import cut
from manager.checkpoint.gitstate import preflight_repository
from manager.checkpoint.ignored import survey_ignored
from manager.checkpoint.references import reference_errors
from manager.daemon.metrics import CutScope
from manager.daemon.progress import ProgressLog
from manager.daemon.seat import Seat, SeatOwner, profiled_settings, read_pointer
from manager.registry import FileConfig
from manager.workspace.generation import current_generation
from manager.workspace.journal import read_resume_document, write_resume_document
from protocol import control, names
from protocol.checkpoint import PrecopyLink
from protocol.codec import encode_json
from protocol.errors import Refusal
from protocol.events import EventDetail
from protocol.instant import now_iso
from protocol.inventory import (
    Agent,
    Identity,
    Inventory,
    Launch,
    encode_inventory,
    parse_resume_args,
    reference_rule_errors,
)
from protocol.maintenance import Attempt, ResumeDescriptor
from protocol.refusals import Code

log = structlog.get_logger("cotal.preserve")


class Preservation:
    def __init__(self, owner: SeatOwner) -> None:
        self.mgr = owner
        self.progress = ProgressLog()
        self.plan: Inventory | None = None
        self.descriptor: ResumeDescriptor | None = None
        self.result: control.CommitReply | None = None
        self.custody_revisions: dict[str, int] = {}
        self.custody_held: dict[str, custody.Held] = {}
        # Each planned seat's ignored files no declared path carries, surveyed at the prepare.
        self.ignored: dict[str, control.IgnoredSurvey] = {}
        self._commit_in_flight: anyio.Event | None = None
        self._joined: control.CommitReply | None = None
        # An abort after a failed commit is starting the stopped seats again.
        self._abandoning = False

    # -- prepare --------------------------------------------------------------------------------

    async def prepare(self, args: control.PrepareArgs) -> control.PrepareReply:
        """Fence, drain and plan the cut of the named seats, or of every seat when none is named
        (after which the daemon exits). A repeat of the attempt joins it. Stops nothing: a plan
        that cannot resume fails here, and the fence is lifted again."""
        attempt = names.check_attempt_id(args.attempt_id)
        mgr, m = self.mgr, self.mgr.maintenance
        if m.cut.holds(attempt) and self.plan is not None and self.plan.attempt_id == attempt:
            return self._plan_result(attempt)
        if mgr.stopping:
            raise Refusal(
                Code.FENCED,
                "prepare-preservation refused: the manager is stopping",
                "wait for it to exit",
            )
        # The fence lands before any await, so accepted work has already counted itself, and
        # no bridge can start a turn after it.
        m.apply("prepare", attempt, seats=frozenset(args.seats))
        held = m.cut
        self.mgr.delivery_gate.close(self._fenced(held))
        self.progress.begin(attempt)
        self.progress.add("fenced", detail=", ".join(sorted(held.seats)) or None)
        failpoint.reached("preserve.after-fence", mgr.layout.root)
        try:
            await self._drain(held)
            self.progress.add("drained")
            failpoint.reached("preserve.after-drain", mgr.layout.root)
            inventory, descriptor = await self._plan(attempt, only=held.seats)
        except BaseException as exc:
            # Nothing was stopped, so the fence is lifted again and the seats carry on.
            self._lift(attempt)
            log.info("cut.prepare_failed", attempt=attempt, seats=sorted(held.seats))
            self.progress.add("failed", detail=exc.text if isinstance(exc, Refusal) else repr(exc))
            self.progress.done = True
            raise
        self.plan, self.descriptor, self.result = inventory, descriptor, None
        self.progress.add("planned", detail=f"{len(inventory.agents)} seat(s)")
        log.info("cut.prepared", attempt=attempt, seats=len(inventory.agents), scope=held.scope)
        return self._plan_result(attempt)

    @staticmethod
    def _fenced(held: Attempt) -> frozenset[str] | None:
        """Whom the cut's fence closes the delivery gate for: every seat, or the cut seats."""
        return None if held.scope == "whole" else held.seats

    async def _drain(self, held: Attempt) -> None:
        # Every seat's cut waits for all admitted work (a spawn names no seat yet); a cut of some
        # seats only for the work on them, while the other seats carry on.
        if held.scope == "whole":
            await self.mgr.drain()
        else:
            await self.mgr.drain_seats(held.seats)

    def _lift(self, attempt: str, *, draining: bool = False) -> None:
        """Abandon the cut before its commit: the fence is lifted and its seats carry on."""
        fenced = self._fenced(self.mgr.maintenance.cut)
        self.mgr.maintenance.apply("abort", attempt, draining=draining)
        self.mgr.delivery_gate.open(fenced)
        self.plan = self.descriptor = None

    async def _plan(
        self, attempt: str, *, only: frozenset[str] = frozenset()
    ) -> tuple[Inventory, ResumeDescriptor]:
        """Build and check the inventory and persist the resume document; stops nothing."""
        inventory = self._checked_inventory(
            attempt,
            only,
            "preservation incomplete",
            "fix what each seat names, then cut again; nothing was stopped",
        )
        # A cut that cannot resume must fail here, before any child stops.
        parse_resume_args(attempt, encode_inventory(inventory), space=self.mgr.space)
        jobs = concurrency.limiter()
        # The root's declared ignored paths travel in every capture, so the preflight checks
        # them too (a nested repository or a fifo among them would refuse only at the capture);
        # an operator's `--include` reaches the manager only with the commit.
        include = registry.carry_includes(registry.load_config(self.mgr.layout.root))
        await self._preflight(inventory, jobs, include)
        self.ignored = await _survey(inventory.agents, jobs, include)
        await self._read_custody(inventory, jobs)
        exportable = await concurrency.ordered_map(
            lambda agent: frontier.check_seat_exportable(
                self.mgr.js,
                self.mgr.space,
                agent.name,
                agent.identity.lifecycle_uid,
                agent.launch.subscribe,
            ),
            inventory.agents,
            jobs,
        )
        for outcome in exportable:
            outcome.unwrap()
        descriptor = write_resume_document(self.mgr.layout, inventory)
        read_resume_document(self.mgr.layout, descriptor, attempt_id=attempt)
        failpoint.reached("preserve.after-persist", self.mgr.layout.root)
        return inventory, descriptor

    @staticmethod
    async def _preflight(
        inventory: Inventory, jobs: anyio.CapacityLimiter, include: list[str]
    ) -> None:
        # Each check runs for every seat, a few at once; the refusal is the first failing seat
        # in seat order, the one a loop would have stopped at.
        checked = await concurrency.ordered_map(
            lambda agent: preflight_repository(Path(agent.launch.cwd), include=include),
            inventory.agents,
            jobs,
        )
        for agent, outcome in zip(inventory.agents, checked, strict=True):
            if isinstance(outcome.error, Refusal):
                exc = outcome.error
                raise Refusal(
                    exc.code,
                    f"seat {agent.name}: {exc.message}",
                    exc.cure + "; nothing was stopped",
                ) from None
            outcome.unwrap()

    async def _read_custody(self, inventory: Inventory, jobs: anyio.CapacityLimiter) -> None:
        """The revision each seat's custody stands at: what a destination must CAS against."""
        mgr = self.mgr
        bucket = mgr.custody_bucket()
        reads = await concurrency.ordered_map(
            lambda agent: custody.read(bucket, agent.name, agent.identity.lifecycle_uid),
            inventory.agents,
            jobs,
        )
        for agent, outcome in zip(inventory.agents, reads, strict=True):
            held = outcome.unwrap()
            if held is None or held.record.holder != mgr.identity.instance_id:
                raise Refusal(
                    Code.CUSTODY_LOST,
                    f"seat {agent.name}: this manager does not hold its custody at the broker "
                    f"({'no record' if held is None else 'held by ' + held.record.holder})",
                    "a seat this manager does not hold cannot be cut from here; nothing was "
                    "stopped",
                )
            # Keyed by the uid: a name reused after `cotal rm` is a new identity whose custody
            # starts again, and must not inherit the generations of the seat it replaced.
            local = current_generation(
                mgr.layout, mgr.space, agent.name, agent.identity.lifecycle_uid
            )
            if held.record.generation != agent.generation or local > agent.generation:
                raise Refusal(
                    Code.CUSTODY_STALE,
                    f"seat {agent.name}: writer generation disagrees (broker "
                    f"{held.record.generation}, seat {agent.generation}, local {local})",
                    "this root's record of the seat is stale; nothing was stopped",
                )
            self.custody_revisions[agent.name] = held.revision
            self.custody_held[agent.name] = held

    def _plan_result(self, attempt: str) -> control.PrepareReply:
        assert self.plan is not None and self.descriptor is not None
        return control.PrepareReply(
            attempt_id=attempt,
            state="prepared",
            inventory=msgspec.Raw(encode_json(self.plan)),
            resume=msgspec.Raw(encode_json(self.descriptor)),
            failures=[],
        )

    def inventory_of(self, attempt: str, only: frozenset[str]) -> Inventory:
        """The resume inventory of these seats as a cut would plan it, checked by the same
        rules; for a capture that is not a cut (a standing checkpoint), which stops nothing."""
        return self._checked_inventory(
            attempt,
            only,
            "capture refused",
            "fix what each seat names; the next turn's end captures it again",
        )

    def _checked_inventory(
        self, attempt: str, only: frozenset[str], refused: str, cure: str
    ) -> Inventory:
        inventory = self._build_inventory(attempt, only)
        failures = self._reference_failures(inventory)
        if failures:
            raise Refusal(Code.PRESERVATION_REFUSED, f"{refused}: " + "; ".join(failures), cure)
        return inventory

    def _build_inventory(self, attempt: str, only: frozenset[str] = frozenset()) -> Inventory:
        mgr = self.mgr
        # Read once for the plan: each entry records the profile its seat runs under, proven
        # against the file now (a cut of a seat whose profile was edited since refuses).
        config = registry.load_config(mgr.layout.root)
        agents = [
            self._entry(seat, config)
            for seat in sorted(mgr.seats.values(), key=lambda s: s.name)
            if not only or seat.name in only
        ]
        return Inventory(
            version="cotal-manager-resume/v2",
            space=mgr.space,
            attempt_id=attempt,
            instance_id=mgr.identity.instance_id,
            created_at=now_iso(),
            agents=agents,
        )

    def _entry(self, seat: Seat, config: FileConfig) -> Agent:
        mgr = self.mgr
        settings, model = profiled_settings(seat, config)
        stores: list[str] = []
        if seat.spec is not None:
            home = Path(os.path.expanduser("~"))
            for d in cut.store_dirs(
                seat.spec.session_store, root=mgr.layout.root, cwd=seat.cwd, home=home
            ):
                cut.anchor_of(d, root=mgr.layout.root, cwd=seat.cwd, home=home)
                stores.append(str(d))
        session_id = seat.session_id
        if seat.recovery_armed:
            # The live pointer is consulted only while recovery is armed: it proves the latest
            # in-process session; otherwise the recorded launch value stands.
            session_id = read_pointer(seat.pointer_path).session_id
        if not self._session_carried(seat, stores):
            # A class is a promise about bytes the checkpoint must contain: without a pointer
            # and a store there is no session to reopen, so the plan says so now.
            session_id = None
        return Agent(
            name=seat.name,
            space=mgr.space,
            identity=Identity(mode="open", lifecycle_uid=seat.uid, owner=names.SEAT_OWNER),
            launch=Launch(
                connector=seat.agent,
                cwd=str(seat.cwd),
                unresolved_launch_option_keys=[],
                profile_sha256=registry.profile_digest(
                    seat.agent, model, settings, seat.allow_send, seat.subscribe, seat.allow_post
                ),
                session_stores=stores,
                model=model,
                session_id=session_id,
                allow_send=list(seat.allow_send),
                subscribe=list(seat.subscribe),
                allow_post=list(seat.allow_post),
            ),
            dependencies=[],
            generation=seat.generation_at_broker,
            started_at=seat.started_at,
        )

    @staticmethod
    def _session_carried(seat: Seat, stores: list[str]) -> bool:
        if seat.continuity not in ("exact", "fork") or not seat.pointer_path.exists():
            return False
        scratch = cut.store_scratch_of(seat.agent)
        return any(cut.has_files(Path(d), scratch=scratch) for d in stores)

    def _reference_failures(self, inventory: Inventory) -> list[str]:
        failures: list[str] = []
        for agent in inventory.agents:
            failures += [f"{agent.name}: {e}" for e in reference_rule_errors(agent)]
            failures += [f"{agent.name}: {e}" for e in reference_errors(agent)]
            if not Path(agent.launch.cwd).is_dir():
                failures.append(f"{agent.name}: cwd {agent.launch.cwd} is not a directory")
        return failures

    # -- commit ---------------------------------------------------------------------------------

    async def commit(self, args: control.CommitPreservationArgs) -> control.CommitReply:
        attempt = names.check_attempt_id(args.attempt_id)
        m, mgr = self.mgr.maintenance, self.mgr
        in_flight = self._commit_in_flight
        if in_flight is not None and m.cut.holds(attempt):
            # A rerun whose coordinator found the commit still running (its first coordinator
            # died): two commits would stop, capture and move aside each other's directory, so
            # the second waits for the first and answers with its outcome.
            await in_flight.wait()
            if self._joined is not None:
                return self._joined
        held = m.cut
        if held.holds(attempt) and held.state == "preserved" and self.result is not None:
            return self.result
        if (
            self.plan is None
            or self.plan.attempt_id != attempt
            or not held.holds(attempt)
            or held.state != "preserving"
        ):
            raise Refusal(
                Code.NOT_PREPARED,
                f"preservation attempt {attempt} is not the prepared attempt (state {held.shown})",
                "run prepare-preservation for this attempt first "
                "(cotal down --preserve-state does)",
            )
        assert self.plan is not None
        if self._abandoning:
            raise Refusal(
                Code.ABORT_UNDER_WAY,
                f"cut {attempt} is being aborted: its stopped seats are being started again",
                "let `cotal down --preserve-state --abort` finish, then cut again",
            )
        home = Path(os.path.expanduser("~"))
        extra = [Path(os.path.normpath(p)) for p in args.session_stores]
        for agent in self.plan.agents:
            for d in extra:
                if not d.is_absolute() or not d.is_dir():
                    raise Refusal(
                        Code.BAD_STORE,
                        f"--session-store {d} is not an existing absolute directory",
                        "pass the directory the harness keeps its sessions in",
                    )
                cut.anchor_of(d, root=mgr.layout.root, cwd=Path(agent.launch.cwd), home=home)
        # Read before the point of no return: a COTAL_JOBS that does not parse refuses here.
        jobs = concurrency.limiter()
        m.apply("commit", attempt)
        done = self._commit_in_flight = anyio.Event()
        self._joined = None
        try:
            self._joined = await self._commit(attempt, args, extra, jobs)
            return self._joined
        finally:
            self._commit_in_flight = None
            done.set()

    async def _commit(
        self,
        attempt: str,
        args: control.CommitPreservationArgs,
        extra: list[Path],
        jobs: anyio.CapacityLimiter,
    ) -> control.CommitReply:
        m, mgr = self.mgr.maintenance, self.mgr
        assert self.plan is not None
        planned = {agent.name for agent in self.plan.agents}
        seats = {n: s for n, s in mgr.seats.items() if n in planned}
        self.progress.begin(attempt)
        if args.include:
            # The operator's `--include` carries more than the prepare's survey knew: surveyed
            # again, the seats still running, so what is listed is what stays behind.
            config = registry.load_config(mgr.layout.root)
            include = registry.carry_includes(config, args.include)
            self.ignored = await _survey(self.plan.agents, jobs, include)
        self.progress.add("stopping", detail=f"{len(seats)} seat(s)")
        t0 = time.monotonic()
        # The cut's own window and each seat's downtime, on the clock the metrics read.
        began = anyio.current_time()
        scope: CutScope = "seats" if m.cut.scope == "seats" else "whole"
        run = _Run()
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                # Every seat's drain wait and stop run at once, so a long turn never holds back
                # another seat's stop. The stops take no job: each is a kill and the kernel's
                # teardown of the seat, then its share of one pass over /proc that answers every
                # stop waiting at the time (manager/daemon/survivors.py).
                for one in seats.values():
                    tg.start_soon(self._drain_and_stop_one, one, args.drain_timeout_s, run)
        t_stop = time.monotonic()
        log.info(
            "cut.stopped",
            attempt=attempt,
            proven=len(seats) - len(run.failures),
            failed=sorted(run.failures),
            mid_turn=sorted(run.mid_turn),
        )
        attempt_path = cut.prepare_attempt_dir(mgr.layout, attempt)
        capturing = self._capturable(seats, run)
        summaries = await self._capture_all(attempt_path, capturing, args, extra, jobs, run)
        t_capture = time.monotonic()
        sealed = not run.failures and self._seal(attempt, attempt_path, summaries, run)
        for name, error in sorted(run.failures.items()):
            self.progress.add("failed", seat=name, detail=error)
        if run.failures:
            mgr.metrics.cut_failed(scope)
            for seat in seats.values():
                mgr.events.emit("cut.failed", seat.name, seat.uid, EventDetail(attempt_id=attempt))
            return self._failed(attempt, attempt_path, run)
        m.apply("stopped", attempt)
        mgr.metrics.cut_sealed(
            scope, anyio.current_time() - began, {seat.uid: began for seat in seats.values()}
        )
        for seat in seats.values():
            mgr.events.emit("cut.sealed", seat.name, seat.uid, EventDetail(attempt_id=attempt))
        if m.state == "active":
            # Sealed: the checkpoint carries them from here, and the mesh runs on without them.
            # Their names open again, so a seat adopted under one later (taken back, or moved
            # back) is not born fenced.
            for seat in seats.values():
                mgr.remove(seat)
            mgr.delivery_gate.open(frozenset(seats))
        self.result = control.CommitReply(
            attempt_id=attempt,
            state=m.cut.shown,
            partial=True if m.cut.scope == "seats" else msgspec.UNSET,
            checkpoint_dir=str(attempt_path),
            sealed=sealed,
            seats=[
                _cut_seat(s, run.mid_turn.get(s.name), self.ignored.get(s.name)) for s in summaries
            ],
            failures=[],
            mid_turn=run.mid_turn_rows(),
            timings_ms={
                "stop": int((t_stop - t0) * 1000),
                "capture": int((t_capture - t_stop) * 1000),
                "total": int((time.monotonic() - t0) * 1000),
            },
        )
        self.progress.done = True
        log.info("cut.committed", attempt=attempt, sealed=sealed, failures=0)
        return self.result

    def _capturable(self, seats: dict[str, Seat], run: _Run) -> list[tuple[Agent, Seat]]:
        """The planned seats proven stopped, in plan order; every other planned seat fails."""
        assert self.plan is not None
        capturing = [
            (agent, seats[agent.name])
            for agent in self.plan.agents
            if agent.name not in run.failures and agent.name in seats
        ]
        for agent in self.plan.agents:
            if agent.name in run.failures or agent.name not in seats:
                run.failures.setdefault(agent.name, "seat left the table before the cut")
                run.codes.setdefault(agent.name, "stop-unproven")
        return capturing

    async def _capture_all(
        self,
        attempt_path: Path,
        capturing: list[tuple[Agent, Seat]],
        args: control.CommitPreservationArgs,
        extra: list[Path],
        jobs: anyio.CapacityLimiter,
        run: _Run,
    ) -> list[cut.SeatSummary]:
        if not capturing:
            return []
        try:
            # Read once for every seat, before the captures run side by side.
            with phase("inbox export"):
                broker_id = await space.broker_identity(self.mgr.custody_bucket())
        except (Refusal, OSError, ValueError) as exc:
            # Every seat's export needs it, so each seat fails by name, as a loop would.
            for agent, _ in capturing:
                run.fail(
                    agent.name,
                    exc if isinstance(exc, Refusal) else _capture_refusal(agent.name, exc),
                )
            return []
        in_order = _InOrder([agent.name for agent, _ in capturing], self.progress)

        async def capture(item: tuple[Agent, Seat]) -> cut.SeatSummary:
            try:
                summary = await self._capture_one(
                    item, attempt_path, broker_id, args, extra, in_order.reporter(item[0].name)
                )
            finally:
                in_order.finish(item[0].name)
            failpoint.reached("preserve.after-seat-sealed", self.mgr.layout.root)
            return summary

        captured = await concurrency.ordered_map(capture, capturing, jobs)
        summaries: list[cut.SeatSummary] = []
        for (agent, _), outcome in zip(capturing, captured, strict=True):
            failed = outcome.error
            if failed is None:
                assert outcome.value is not None
                summaries.append(outcome.value)
            elif isinstance(failed, Refusal):
                run.fail(agent.name, failed)
            elif isinstance(failed, (OSError, ValueError, ExceptionGroup)):
                run.fail(agent.name, _capture_refusal(agent.name, failed))
            else:
                raise failed
        return summaries

    async def _capture_one(
        self,
        item: tuple[Agent, Seat],
        attempt_path: Path,
        broker_id: str,
        args: control.CommitPreservationArgs,
        extra: list[Path],
        progress: cut.Progress,
    ) -> cut.SeatSummary:
        mgr = self.mgr
        agent, seat = item
        # Read only now: the seat is proven stopped, so its ack floor no longer moves.
        with phase(f"inbox export ({agent.name})"):
            carried = await frontier.export_seat_space(
                mgr.js, mgr.space, agent, self.custody_held[agent.name], broker_id
            )
        summary = await cut.capture_seat(
            mgr.layout,
            attempt_path,
            agent,
            pointer_path=seat.pointer_path,
            extra_stores=extra,
            declared=seat.continuity,
            supports_fresh_start=seat.connector.capabilities.supports_fresh_start,
            identity=mgr.identity,
            space=mgr.space,
            horizon_ms=mgr.config.recency.horizon_s * 1000,
            progress=progress,
            custody_revision=self.custody_revisions.get(agent.name),
            space_export=carried,
            include=args.include,
            since=args.since,
            precopy=_precopied(args.precopy.get(agent.name)),
        )
        return summary

    def _seal(
        self, attempt: str, attempt_path: Path, summaries: list[cut.SeatSummary], run: _Run
    ) -> bool:
        """Seal the attempt's manifest last; True once sealed, else the failure is in `run`."""
        mgr = self.mgr
        assert self.descriptor is not None
        failpoint.reached("preserve.before-manifest-seal", mgr.layout.root)
        try:
            resume_bytes = encode_inventory(
                read_resume_document(mgr.layout, self.descriptor, attempt_id=attempt)
            )
            cut.seal_attempt(
                attempt_path, attempt, mgr.space, summaries, resume_bytes, mgr.identity
            )
        except (Refusal, OSError) as exc:
            run.fail(
                "the manifest",
                exc if isinstance(exc, Refusal) else cut.storage_refusal(exc, "sealing"),
                quiet=True,
            )
            return False
        self.progress.add("sealed", detail=str(attempt_path))
        return True

    def _failed(self, attempt: str, attempt_path: Path, run: _Run) -> control.CommitReply:
        """A commit that could not seal stays `preserving` (its seats are stopped and proven, so
        abort stays illegal) with nothing cached: the next commit of this attempt stops nothing
        new and captures again into a fresh directory. What this try wrote is kept aside."""
        try:
            evidence = cut.keep_as_evidence(attempt_path, "failed")
        except OSError as exc:
            # The next try's prepare_attempt_dir moves it aside instead.
            log.error("cut.evidence_move_failed", attempt=attempt, error=str(exc))
            evidence = attempt_path
        self.result = None
        # Nothing runs any more: a rerun captures again, or an abort starts the seats again.
        self.mgr.maintenance.apply("failed", attempt)
        self.progress.done = True
        log.error("cut.commit_failed", attempt=attempt, failures=sorted(run.failures))
        return control.CommitReply(
            attempt_id=attempt,
            state=self.mgr.maintenance.state,
            checkpoint_dir=str(evidence),
            evidence=str(evidence),
            sealed=False,
            seats=[],
            failures=[
                control.SeatFailure(name=n, error=e, code=run.codes.get(n, "capture-failed"))
                for n, e in sorted(run.failures.items())
            ],
            mid_turn=run.mid_turn_rows(),
            timings_ms={},
        )

    async def _drain_and_stop_one(
        self,
        seat: Seat,
        drain_timeout_s: float,
        run: _Run,
    ) -> None:
        # The gate has been shut since the fence, so the turn seen here is the last one this
        # seat runs before the cut; waiting for it is what keeps a tool call from being killed
        # halfway when the operator allowed the time.
        bridge = seat.bridge
        turn = bridge.turn if bridge is not None and seat.state == "running" else None
        driver = seat.driver if seat.state == "running" else None
        if turn is None and driver is not None and driver.launch_prompt_running():
            # The launch's prompt goes from the driver, not through the gate or the inbox: cut
            # before its turn ends, it would be in neither the session nor the carried inbox.
            await self._wait_launch_prompt(seat, driver, drain_timeout_s, run)
        if bridge is not None and turn is not None:
            self.progress.add(
                "turn-wait", seat=seat.name, detail=f"waiting for message {turn.message_id}"
            )
            with anyio.move_on_after(drain_timeout_s):
                await bridge.wait_settled()
            left = bridge.turn
            if left is not None:
                run.mid_turn[seat.name] = left.message_id
                log.warning(
                    "cut.mid_turn", seat=seat.name, id=left.message_id, waited_s=drain_timeout_s
                )
                self.progress.add(
                    "turn-wait",
                    seat=seat.name,
                    detail=f"cut mid-turn after {drain_timeout_s:g}s: message "
                    f"{left.message_id} stays unacknowledged and is redelivered after the resume",
                )
            else:
                self.progress.add(
                    "turn-wait",
                    seat=seat.name,
                    detail=f"message {turn.message_id} reached its turn boundary",
                )
        await self._stop_one(seat, run.failures)

    async def _wait_launch_prompt(
        self, seat: Seat, driver: Driver, drain_timeout_s: float, run: _Run
    ) -> None:
        self.progress.add("turn-wait", seat=seat.name, detail="waiting for its launch prompt")
        with anyio.move_on_after(drain_timeout_s):
            await driver.launch_prompt_settled()
        if not driver.launch_prompt_running():
            self.progress.add(
                "turn-wait", seat=seat.name, detail="its launch prompt reached its turn boundary"
            )
            return
        run.mid_turn[seat.name] = INITIAL_PROMPT_ID
        log.warning("cut.mid_turn", seat=seat.name, id=INITIAL_PROMPT_ID, waited_s=drain_timeout_s)
        self.progress.add(
            "turn-wait",
            seat=seat.name,
            detail=f"cut mid-turn after {drain_timeout_s:g}s {LAUNCH_PROMPT_LOST}",
        )

    async def _stop_one(self, seat: Seat, failures: dict[str, str]) -> None:
        # The owner's one stop-and-prove; outside `active` it neither restarts the seat nor
        # deprovisions its durable, which is the cut's suppressed cleanup.
        try:
            await self.mgr.stop_and_prove(seat, graceful=False)
        except Refusal as exc:
            failures[seat.name] = exc.text
            self.progress.add("stopped", seat=seat.name, detail=exc.text)
            return
        self.mgr.hand_over(seat)
        await self.mgr.forget_presence(seat)
        self.progress.add("stopped", seat=seat.name)
        failpoint.reached("preserve.after-seat-stopped", self.mgr.layout.root)

    # -- abort ----------------------------------------------------------------------------------

    async def abort(
        self, args: control.AttemptArgs, start: Callable[[Seat], Awaitable[None]] | None = None
    ) -> control.AttemptState:
        """Abandon the cut: before its commit, by lifting the fence; after a commit that ended
        unsealed (`Attempt.abandonable`), by first starting every seat it stopped again, under
        its uid in its own session and tree (`start`: the owner's start of a stopped seat),
        then lifting the fence. The evidence the failed commit kept is left where it is. A
        repeat after a partial try starts only the seats still stopped."""
        attempt = names.check_attempt_id(args.attempt_id)
        mgr, m = self.mgr, self.mgr.maintenance
        held = m.cut
        if m.state == "active" and not (held.holds(attempt) and held.state == "preserving"):
            # No cut of this attempt is fencing anything here (none, or one already sealed).
            return control.AttemptState(attempt_id=attempt, state="active")
        if held.holds(attempt) and held.state == "preserved":
            raise Refusal(
                Code.COMMIT_BEGUN,
                # The coordinator's own words when it sees the seal first (manager/coord/cut.py):
                # which side sees it depends on when the abort arrives.
                f"cut {attempt} is sealed: its seats were stopped and captured, so it can no "
                "longer be aborted",
                "finish it (`cotal down --preserve-state`); its seats resume from the checkpoint "
                "(`cotal up --restore`)",
            )
        if self._abandoning:
            raise Refusal(
                Code.ABORT_UNDER_WAY,
                f"cut {attempt} is being aborted already: its stopped seats are being started "
                "again",
                "let that abort finish; `cotal status` shows the manager active once it has",
            )
        running = self._commit_in_flight is not None
        if held.holds(attempt) and held.commit_started and (running or not held.abandonable):
            raise Refusal(
                Code.COMMIT_BEGUN,
                f"cut {attempt} is stopping and capturing its seats now and cannot be aborted "
                "while it runs",
                "wait for the commit to end: rerun `cotal down --preserve-state` to finish the "
                "cut, or, if the commit fails, `cotal down --preserve-state --abort` then",
            )
        if any(mgr.seats[n].state == "stopping" for n in held.seats if n in mgr.seats):
            raise Refusal(
                Code.COMMIT_BEGUN,
                f"cut {attempt} is stopping its seats and cannot be aborted",
                "rerun `cotal down --preserve-state` to finish it",
            )
        restarted: list[str] = []
        if held.holds(attempt) and held.abandonable:
            if start is None:
                raise Refusal(
                    Code.COMMIT_BEGUN,
                    f"cut {attempt} stopped its seats, and this abort cannot start them again",
                    "rerun `cotal down --preserve-state --abort` through the manager",
                )
            restarted = await self._start_again(attempt, start)
        # Work the whole mesh's fence admitted before it would race the plan being abandoned.
        self._lift(attempt, draining=held.scope == "whole" and mgr.in_flight > 0)
        log.info("cut.aborted", attempt=attempt, scope=held.scope, restarted=restarted)
        return control.AttemptState(attempt_id=attempt, state=m.state)

    async def _start_again(
        self, attempt: str, start: Callable[[Seat], Awaitable[None]]
    ) -> list[str]:
        """Start every seat of the failed commit's plan that it stopped, a few at once; the
        names of those started. Refuses, fenced still, when one cannot be started: a seat whose
        stop is not proven, or whose start failed (it is left stopped, proven)."""
        mgr = self.mgr
        assert self.plan is not None and self.plan.attempt_id == attempt
        seats = [mgr.seats[a.name] for a in self.plan.agents if a.name in mgr.seats]
        stuck = [f"{s.name} ({s.state})" for s in seats if s.state not in ("stopped", "running")]
        if stuck:
            raise Refusal(
                Code.COMMIT_BEGUN,
                f"cut {attempt} failed, and seat(s) {', '.join(stuck)} are not proven stopped, so "
                "they cannot be started again and the cut cannot be aborted yet",
                "let the stop be proven (the seat's reap; `cotal ps` shows it stopped), then "
                "rerun `cotal down --preserve-state --abort`; or rerun `cotal down "
                "--preserve-state` to capture again",
            )
        stopped = [s for s in seats if s.state == "stopped"]
        self._abandoning = True
        try:
            started = await concurrency.ordered_map(start, stopped, concurrency.limiter())
        finally:
            self._abandoning = False
        for seat, outcome in zip(stopped, started, strict=True):
            if isinstance(outcome.error, Refusal):
                exc = outcome.error
                raise Refusal(
                    exc.code,
                    f"cut {attempt} cannot be aborted: seat {seat.name} did not start again: "
                    f"{exc.message}",
                    f"{exc.cure}; the cut stays fenced with its seats stopped: rerun `cotal "
                    "down --preserve-state --abort` (it starts the seats still stopped), or "
                    "`cotal down --preserve-state` to capture again",
                ) from None
            outcome.unwrap()
            failpoint.reached("preserve.abort.after-seat-started", mgr.layout.root)
        return [s.name for s in stopped]


@dataclass
class _Run:
    """What one commit found, by seat: why it failed (with its code) and the message it was
    cut in the middle of."""

    failures: dict[str, str] = field(default_factory=dict)
    codes: dict[str, str] = field(default_factory=dict)
    mid_turn: dict[str, str] = field(default_factory=dict)

    def fail(self, name: str, refusal: Refusal, *, quiet: bool = False) -> None:
        self.failures[name], self.codes[name] = refusal.text, refusal.code
        if not quiet:
            log.error("cut.capture_failed", seat=name, error=refusal.text)

    def mid_turn_rows(self) -> list[control.MidTurn]:
        return [control.MidTurn(name=n, message_id=i) for n, i in sorted(self.mid_turn.items())]


def _precopied(base: control.PrecopyBase | None) -> PrecopyLink | None:
    if base is None:
        return None
    return PrecopyLink(
        bundle_sha256=base.bundle_sha256,
        bundle_bytes=base.bundle_bytes,
        prerequisites=list(dict.fromkeys(base.tips)),
    )


async def _survey(
    agents: Sequence[Agent], jobs: anyio.CapacityLimiter, include: list[str]
) -> dict[str, control.IgnoredSurvey]:
    """What each seat's cut leaves behind, for the cut's output. A survey that fails (git
    gone, the tree unreadable) is left out: it informs the operator and never decides."""
    surveyed = await concurrency.ordered_map(
        lambda agent: survey_ignored(Path(agent.launch.cwd), include), agents, jobs
    )
    found: dict[str, control.IgnoredSurvey] = {}
    for agent, outcome in zip(agents, surveyed, strict=True):
        if outcome.error is None and outcome.value is not None:
            found[agent.name] = outcome.value
        elif isinstance(outcome.error, (Refusal, OSError)):
            log.info("cut.ignored_unsurveyed", seat=agent.name, error=str(outcome.error))
        else:
            outcome.unwrap()
    return found


def _cut_seat(
    summary: cut.SeatSummary, mid_turn: str | None, ignored: control.IgnoredSurvey | None
) -> control.CutSeat:
    return control.CutSeat(
        name=summary.name,
        since=summary.since,
        bundle_bytes=summary.bundle_bytes,
        continuity=summary.continuity,
        session_id=summary.session_id,
        lifecycle_uid=summary.lifecycle_uid,
        bytes=summary.bytes,
        timings_ms=summary.timings_ms,
        mid_turn=mid_turn,
        ignored=msgspec.UNSET if ignored is None else ignored,
    )


class _InOrder:
    """Capture progress in seat order while the captures run side by side: the earliest seat
    not yet finished reports live, every later seat's reports wait until it is its turn, so
    the coordinator reads one seat's steps after another's, as it did from a loop."""

    def __init__(self, seats: list[str], progress: ProgressLog) -> None:
        self._order = seats
        self._head = 0
        self._finished: set[str] = set()
        self._held: dict[str, list[tuple[str, int]]] = {name: [] for name in seats}
        self._live = {name: progress.capture_reporter(name) for name in seats}

    def reporter(self, seat: str) -> cut.Progress:
        def report(step: str, done: int) -> None:
            if self._order[self._head] == seat:
                self._live[seat](step, done)
            else:
                self._held[seat].append((step, done))

        return report

    def finish(self, seat: str) -> None:
        self._finished.add(seat)
        while self._head < len(self._order) and self._order[self._head] in self._finished:
            self._head += 1
            if self._head < len(self._order):
                name = self._order[self._head]
                for step, done in self._held.pop(name, []):
                    self._live[name](step, done)


def _capture_refusal(seat: str, exc: Exception) -> Refusal:
    """What escaped a seat's capture, as a refusal naming the seat and the cure."""
    while isinstance(exc, ExceptionGroup):
        # A capture streams through a task group: the cause is its first leaf.
        exc = exc.exceptions[0]
    if isinstance(exc, Refusal):
        return Refusal(exc.code, f"seat {seat}: {exc.message}", exc.cure)
    if isinstance(exc, OSError):
        refusal = cut.storage_refusal(exc, "writing the checkpoint of")
        return Refusal(refusal.code, f"seat {seat}: {refusal.message}", refusal.cure)
    if "requires sessionId" in str(exc):
        return Refusal(
            Code.SESSION_UNPLANNED,
            f"seat {seat}: the capture found a session (pointer and store files) that the plan "
            f"made at prepare does not record, so no session can be promised for it: {exc}",
            "rerun `cotal down --preserve-state` without the --session-store the plan did not "
            "name (the seat then resumes fresh), or abort before commit next time and declare "
            "the store in the agent's settings",
        )
    return Refusal(
        Code.CAPTURE_FAILED,
        f"seat {seat}: the capture produced a record that does not hold: {exc}",
        "fix what the message names, then rerun `cotal down --preserve-state`",
    )
