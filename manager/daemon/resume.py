"""The resume handshake, daemon side (record 2.1, 3.3 step 5-6, 5.4; docs/cli.md the resume).

A resume is always an adoption (`protocol/maintenance.py`, the attempt table): the checkpoint's
seats join this manager's table. A manager started for the resume (`restore`) is fenced to that
attempt, so only its `resume-preserved`, `commit-resume` and `finalize-resume` are admitted; a
manager already `active` (`adopt`) adopts them beside the seats it runs, which are never
touched, and stays `active` throughout. Either way the adoption is lifecycle work the fence
counts, so a cut's drain waits for it, and one path serves both.

`resume-preserved` runs the checks in the record's order, then adopts each seat under its
recorded lifecycle uid (its `dm_` durable must already be at the broker: that is the lifecycle
proof) and proves continuity per class. `commit-resume` is an idempotent validation barrier
returning a 64-hex token; only `finalize-resume` with that exact token releases the attempt (a
restore's cleanup suppression with it). A repeat after this manager restarted finds the seats
its re-adoption took back and adopts only what is missing.
"""

from __future__ import annotations

import hashlib
import hmac
from functools import partial
from pathlib import Path

import anyio
import msgspec
import structlog
from nats.js.errors import KeyDeletedError, KeyNotFoundError

from connectors.base import ContinuityClass, continuity_class
from manager import concurrency, failpoint, registry
from manager.broker import custody, footprint
from manager.broker.retry import riding_elections
from manager.checkpoint.references import reference_errors
from manager.daemon.seat import Seat, SeatOwner
from protocol import control, names
from protocol.errors import Refusal
from protocol.instant import now_iso
from protocol.inventory import (
    CURE_REFERENCE,
    Agent,
    Inventory,
    inventory_digest,
    parse_resume_args,
    reference_rule_errors,
)
from protocol.maintenance import RESUME_WORK
from protocol.refusals import Code

log = structlog.get_logger("cotal.resume")

# What each continuity class did with the recorded session, as the resume reports it.
OBSERVATIONS: dict[ContinuityClass, str] = {
    "exact": "reopened the recorded session",
    "fork": "forked: a new session carrying the recorded history",
    "fresh": "started fresh: the checkpoint carried no session to reopen",
    "drain-only": "started fresh: this harness cannot continue a session (drain-only)",
}


class Resumption:
    def __init__(self, owner: SeatOwner) -> None:
        self.mgr = owner
        self.inventory: Inventory | None = None
        self.result: control.ResumeReply | None = None
        self.token: str | None = None

    # -- resume-preserved -----------------------------------------------------------------------

    async def resume(self, args: control.ResumeArgs) -> control.ResumeReply:
        """Adopt the checkpoint's seats: into this running mesh, or into the empty one of a
        manager started for the attempt. A repeat is answered from the record."""
        mgr, m = self.mgr, self.mgr.maintenance
        attempt = names.check_attempt_id(args.attempt_id)
        if (
            m.resume.holds(attempt)
            and self.result is not None
            and self.result.attempt_id == attempt
        ):
            m.apply("resume", attempt)
            return self.result
        async with mgr.lifecycle(RESUME_WORK):
            inventory = parse_resume_args(attempt, bytes(args.inventory), space=mgr.space)
            # After this manager restarted, its re-adoption took back the seats it had adopted:
            # those stand as they are, and only the rest are adopted now.
            kept = {
                a.name: mgr.seats[a.name]
                for a in inventory.agents
                if a.name in mgr.seats and mgr.seats[a.name].uid == a.identity.lifecycle_uid
            }
            rest = msgspec.structs.replace(
                inventory, agents=[a for a in inventory.agents if a.name not in kept]
            )
            self._check_inventory(rest)
            jobs = concurrency.limiter()
            await self._roster_liveness(rest, jobs)
            m.apply("resume", attempt)
            try:
                adopted = await self._adopt_all(rest, attempt, jobs)
            except BaseException:
                m.apply("rollback", attempt)
                raise
            m.apply("activated", attempt)
        by_name = {o.name: o for o in adopted}
        observations = [by_name.get(a.name) or _kept_row(a, kept[a.name]) for a in inventory.agents]
        self.inventory, self.token = inventory, None
        self.result = control.ResumeReply(attempt_id=attempt, state="resumed", seats=observations)
        log.info(
            "resume.activated",
            attempt=attempt,
            scope=m.resume.scope,
            seats=len(adopted),
            kept=len(kept),
        )
        return self.result

    def _check_inventory(self, inventory: Inventory) -> None:
        mgr = self.mgr
        if len(mgr.seats) + len(inventory.agents) > names.MAX_SEATS:
            raise Refusal(
                Code.CAPACITY,
                f"resuming {len(inventory.agents)} seat(s) would exceed manager capacity "
                f"({names.MAX_SEATS})",
                "resume fewer seats per manager",
            )
        for agent in inventory.agents:
            # The cut proved these files; the destination proves them again before it launches,
            # since the record carries references, never the files (record 1.2).
            failures = reference_rule_errors(agent) + reference_errors(agent)
            if failures:
                raise Refusal(
                    Code.RETAINED_REFERENCE,
                    f"seat {agent.name}: " + "; ".join(failures),
                    CURE_REFERENCE,
                )
            if agent.name in mgr.seats:
                raise Refusal(
                    Code.DUPLICATE_NAME,
                    f"retained agent name {agent.name!r} is already managed here",
                    "a seat is resumed once; stop the other first",
                )
            uid = agent.identity.lifecycle_uid
            if any(s.uid == uid for s in mgr.seats.values()):
                raise Refusal(
                    Code.DUPLICATE_PRINCIPAL,
                    f"retained principal uid {uid} is already managed here",
                    "a seat is resumed once",
                )

    async def _adopt_all(
        self, inventory: Inventory, attempt: str, jobs: anyio.CapacityLimiter
    ) -> list[control.ResumedSeat]:
        mgr = self.mgr
        launched: list[Seat] = []

        async def adopt(agent: Agent) -> control.ResumedSeat:
            seat, observation = await self._adopt(agent, attempt)
            launched.append(seat)
            failpoint.reached("resume.daemon.after-seat-adopted", mgr.layout.root)
            return observation

        try:
            # A few seats are adopted at once; all or nothing still holds: any seat that fails
            # rolls back every seat adopted beside it, and the refusal is the first failing
            # seat in checkpoint order, as from a loop.
            adopted = await concurrency.ordered_map(adopt, inventory.agents, jobs)
            return [outcome.unwrap() for outcome in adopted]
        except BaseException:
            # Roll back: stop what this attempt started and keep every footprint; the attempt
            # can be retried.
            with anyio.CancelScope(shield=True):
                for seat in launched:
                    try:
                        await mgr.stop_and_prove(seat, graceful=False)
                    except Refusal as exc:
                        # Its process stays with the Manager until reaped; the rollback goes on.
                        log.error("resume.rollback_unproven", seat=seat.name, error=exc.text)
                    mgr.remove(seat)
            raise

    async def _roster_liveness(self, inventory: Inventory, jobs: anyio.CapacityLimiter) -> None:
        presence = self.mgr.presence_bucket()

        async def read(agent: Agent) -> None:
            key = names.presence_key(names.SEAT_OWNER, agent.name, agent.identity.lifecycle_uid)
            await riding_elections(f"presence of {agent.name}", partial(presence.get, key))

        reads = await concurrency.ordered_map(read, inventory.agents, jobs)
        for agent, outcome in zip(inventory.agents, reads, strict=True):
            try:
                outcome.unwrap()
            except Refusal:
                raise
            except (KeyNotFoundError, KeyDeletedError):
                continue
            except Exception as exc:
                raise Refusal(
                    Code.LIVENESS_UNKNOWN,
                    f"cannot read presence for {agent.name}: {exc}",
                    "the broker must answer before a seat is adopted; retry",
                ) from None
            raise Refusal(
                Code.PRINCIPAL_LIVE,
                f"retained principal {agent.name} (uid {agent.identity.lifecycle_uid}) is already "
                "live and this runtime cannot authoritatively adopt it",
                "stop the running incarnation first; presence expires 6 s after it stops",
            )

    async def _adopt(self, agent: Agent, attempt: str) -> tuple[Seat, control.ResumedSeat]:
        mgr = self.mgr
        seat = await self._seat_for(agent, attempt)
        recorded = agent.launch.session_id
        klass = seat.continuity
        mgr.adopt(seat)
        try:
            if klass == "exact":
                await mgr.launch(seat, continue_session=recorded)
            elif klass == "fork":
                await mgr.launch(seat, resume=recorded)
            else:
                await mgr.launch(seat)
        except BaseException:
            mgr.remove(seat)
            raise
        if klass == "exact" and seat.session_id != recorded:
            raise Refusal(
                Code.SESSION_MISMATCH,
                f"replacement reported session {seat.session_id}, expected {recorded}",
                "the harness did not reopen the recorded session",
            )
        log.info(
            "resume.adopted",
            seat=agent.name,
            uid=seat.uid,
            continuity=klass,
            before=recorded,
            after=seat.session_id,
        )
        return seat, control.ResumedSeat(
            name=agent.name,
            lifecycle_uid=seat.uid,
            continuity=klass,
            session_before=recorded,
            session_after=seat.session_id,
            observation=OBSERVATIONS[klass],
            pid=seat.handle.pid if seat.handle else None,
        )

    async def _seat_for(self, agent: Agent, attempt: str) -> Seat:
        """The seat the checkpoint names, under its recorded uid and custody, with its class."""
        mgr = self.mgr
        uid = agent.identity.lifecycle_uid
        # The lifecycle proof comes first: a wrong uid names a durable that does not exist.
        await footprint.confirm_dm_durable(mgr.js, mgr.space, names.SEAT_OWNER, agent.name, uid)
        held = await custody.read(mgr.custody_bucket(), agent.name, uid)
        if (
            held is None
            or held.record.holder != mgr.identity.instance_id
            or held.record.attempt_id != attempt
        ):
            raise Refusal(
                Code.CUSTODY_NOT_HELD,
                f"seat {agent.name}: this manager does not hold its custody for attempt {attempt}",
                "claim custody first (cotal up --restore does, before it starts the manager)",
            )
        connector = registry.load_connector(agent.launch.connector)
        declared = continuity_class(connector.capabilities)
        # The class is the declared one, capped by what the checkpoint carried: the coordinator
        # drops the session id of a seat whose checkpoint could not reopen it.
        klass = (
            declared
            if agent.launch.session_id and declared in ("exact", "fork")
            else ("fresh" if connector.capabilities.supports_fresh_start else "drain-only")
        )
        return Seat(
            name=agent.name,
            agent=agent.launch.connector,
            uid=uid,
            cwd=Path(agent.launch.cwd),
            connector=connector,
            continuity=klass,
            model=agent.launch.model,
            started_at=now_iso(),
            pointer_path=mgr.layout.session_pointer(connector.name, agent.name, uid),
            custody_revision=held.revision,
            generation_at_broker=held.record.generation,
            # The entry's, which its profile digest pins: never this root's `cotal.toml`.
            allow_send=tuple(agent.launch.allow_send),
            subscribe=tuple(agent.launch.subscribe),
            allow_post=tuple(agent.launch.allow_post),
            # The revision admission proved this root's settings reproduce.
            profile=agent.launch.profile_sha256,
        )

    # -- commit-resume / finalize-resume -----------------------------------------------------

    def _expected_token(self, attempt: str) -> str:
        assert self.inventory is not None
        digest = inventory_digest(self.inventory)
        material = f"cotal-resume-commit\0{attempt}\0{self.mgr.identity.instance_id}\0{digest}"
        return hashlib.sha256(material.encode()).hexdigest()

    async def commit(self, args: control.AttemptArgs) -> control.CommitResumeReply:
        mgr, m = self.mgr, self.mgr.maintenance
        attempt = names.check_attempt_id(args.attempt_id)
        if (
            not m.resume.holds(attempt)
            or self.inventory is None
            or self.inventory.attempt_id != attempt
        ):
            raise Refusal(
                Code.NOT_RESUMED,
                f"resume attempt {attempt} has no successful activation to commit",
                "retry resume-preserved until every retained seat is live",
            )
        # A validation barrier over the same facts resume checked, read again now.
        for agent in self.inventory.agents:
            seat = mgr.seats.get(agent.name)
            if seat is None or seat.uid != agent.identity.lifecycle_uid or seat.state != "running":
                raise Refusal(
                    Code.RESUME_INVALID,
                    f"seat {agent.name} is not running under its recorded uid",
                    "retry resume-preserved",
                )
            await footprint.confirm_dm_durable(
                mgr.js, mgr.space, names.SEAT_OWNER, agent.name, seat.uid
            )
        m.apply("commit-resume", attempt)
        self.token = self._expected_token(attempt)
        failpoint.reached("resume.daemon.after-commit-resume", mgr.layout.root)
        return control.CommitResumeReply(
            attempt_id=attempt, state="awaitingFinalize", durable_commit_token=self.token
        )

    async def finalize(self, args: control.FinalizeArgs) -> control.AttemptState:
        m = self.mgr.maintenance
        attempt = names.check_attempt_id(args.attempt_id)
        matches = self.token is not None and hmac.compare_digest(
            args.durable_commit_token, self.token
        )
        if matches and not (m.resume.holds(attempt) and m.resume.state == "committed"):
            # Finalized already: a coordinator that died after it asks again.
            return control.AttemptState(attempt_id=attempt, state="active")
        if not matches:
            raise Refusal(
                Code.BAD_TOKEN,
                f"finalize-resume for {attempt}: the durable commit token does not match",
                "pass the token commit-resume returned (the journal records it)",
            )
        scope = m.resume.scope
        m.apply("finalize", attempt)
        failpoint.reached("resume.daemon.after-finalize", self.mgr.layout.root)
        log.info("resume.finalized", attempt=attempt, scope=scope)
        return control.AttemptState(attempt_id=attempt, state="active")


def _kept_row(agent: Agent, seat: Seat) -> control.ResumedSeat:
    """A seat this manager already runs under the checkpoint's uid (taken back by its
    re-adoption after a restart mid-adoption), reported as it stands."""
    return control.ResumedSeat(
        name=agent.name,
        lifecycle_uid=seat.uid,
        continuity=seat.continuity,
        session_before=agent.launch.session_id,
        session_after=seat.session_id,
        observation="adopted by the run that was interrupted",
        pid=seat.handle.pid if seat.handle else None,
    )
