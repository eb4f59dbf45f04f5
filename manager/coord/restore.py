"""`cotal up --restore DIR`, and a move's destination: the restore coordinator.

admit (integrity, identity, recency; all-or-nothing) -> journal `resume-intent` -> claim custody
(writer generation N+1, in this root and at the broker, before any tree is touched) -> restore
every repository and place the session files -> hand the seats to the manager (one started now,
fenced to this attempt, or the one already running this root, which adopts them beside its own)
-> `resume-preserved` -> journal `resume-active` -> `commit-resume` -> journal the token ->
`finalize-resume` -> journal `retired`. Then the continuity observations of record 6 step 9.

Whether it starts a manager or hands the seats to a running one is decided once, at gate 1
(`_Destination`); from there it is one path. The whole resume is one async run. It holds one
broker connection from the roster read through the custody claim (closed before the seats
launch: the manager is the broker's client from then on), and one manager port: the control
socket, or, when the daemon itself runs it for a move, that daemon's own handlers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypeVar

import anyio
import msgspec
from msgspec import UNSET
from nats.js import JetStreamContext

from manager import concurrency, failpoint, registry
from manager.broker import custody, embedded
from manager.broker.connection import LazyConnection
from manager.broker.retry import phase
from manager.checkpoint import admit, chain
from manager.control.client import ControlSession
from manager.coord import checkpoints, mesh
from manager.coord.admission import (
    Admitted,
    AtBroker,
    BrokerFootprint,
    BrokerRef,
    CarriedSpace,
    admit_at_broker,
    admit_integrity,
    admit_while_broker_starts,
    broker_for,
    gate_one,
    refuse_taken,
    release_broker,
    replicas,
    rmdir_if_empty,
    signer,
    signer_line,
    start_embedded,
    trusted_keys,
)
from manager.coord.handshake import Resumed, finalize, observations, resume_and_commit, seat_rows
from manager.coord.placement import beside, import_inboxes, restore_all, shares_source_broker
from manager.coord.port import ManagerPort
from manager.coord.records import Claim, InboxImported, RestoredTree, RestoreResult
from manager.coord.report import say as _say
from manager.coord.requests import RestoreRequest
from manager.coord.warm import WarmManager, warm_manager
from manager.workspace.generation import claim_successor, withdraw_claim
from manager.workspace.identity import load_or_create_identity
from manager.workspace.journal import Journal, write_resume_document
from manager.workspace.layout import Layout
from manager.workspace.lock import MaintenanceLock
from protocol import control
from protocol.errors import Refusal
from protocol.maintenance import (
    DEGRADED,
    RESUME_ADOPTED,
    RESUME_COMMITTED,
    RESUME_INTENT,
    RESUME_UNDER_WAY,
    RETIRED,
    ClockNote,
    Consent,
    Degraded,
    JournalRecord,
    ResumeDescriptor,
    rerun,
)
from protocol.refusals import Code

A = TypeVar("A")
B = TypeVar("B")

NO_FENCE_NOTE = (
    "cotal: note: this destination does not share the source's broker, so no fence can stop "
    "another destination from resuming the same checkpoint; resume it in one place only"
)


async def restore(
    req: RestoreRequest, root: Path, *, port: ManagerPort | None = None
) -> RestoreResult:
    """Resume `req.restore` (a sealed attempt directory, or a packed file unpacked first) into
    `root`. `port` is the manager already running there when the caller is that manager (a
    move's destination); without it the coordinator finds one on the control socket, or starts
    one fenced to the attempt."""
    async with checkpoints.packed_source(req.restore, root) as source:
        return await _restore(dataclasses.replace(req, restore=source), root, port)


@contextlib.asynccontextmanager
async def _manager(layout: Layout, port: ManagerPort | None) -> AsyncIterator[ManagerPort]:
    if port is not None:
        yield port
        return
    async with mesh.control(layout) as session:
        yield session


async def _restore(req: RestoreRequest, root: Path, port: ManagerPort | None) -> RestoreResult:
    t0 = time.monotonic()
    layout = Layout.at(root)
    src = Path(req.restore).resolve()
    # A bad COTAL_JOBS refuses before anything is admitted or claimed, not at the restore.
    concurrency.jobs()
    if _revives_broker(layout):
        await mesh.revive_embedded_broker(layout, _say)
    async with _manager(layout, port) as session, contextlib.AsyncExitStack() as on_exit:
        status = await session.status()
        if status is not None:
            # A rerun after this resume's coordinator died: the manager it started is still
            # fenced to the attempt (or already finalized it), so this run drives what is left.
            rejoined = await _rejoin(req, layout, src, session, status)
            if rejoined is not None:
                return msgspec.structs.replace(
                    rejoined, wall_ms=int((time.monotonic() - t0) * 1000)
                )
            admitted, dest = await _admit_into_running(req, layout, src, session, status, on_exit)
        else:
            admitted, dest = await _admit_into_new(req, layout, src, on_exit)
        out = await _admit_and_resume(req, layout, admitted, dest, session)
    return msgspec.structs.replace(out, wall_ms=int((time.monotonic() - t0) * 1000))


@dataclasses.dataclass
class _Destination:
    """Where the admitted seats go: to the manager already running this root (`running`, on
    the broker its mesh record names), or to one this run starts (on `broker`, an embedded one
    this run may have started itself, `started`, with what that start made, `footprint`). Only
    these two differ between `up --restore` into a new root and an adoption into a running
    mesh; everything else is one path."""

    broker: BrokerRef
    running: control.StatusReply | None = None
    started: embedded.BrokerInfo | None = None
    footprint: BrokerFootprint | None = None
    warm: WarmManager | None = None

    async def undo(self) -> None:
        """A refusal before the claim leaves the destination as it found it: a broker this run
        started is stopped, and what its start made is removed."""
        if self.started is None:
            return
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(embedded.stop_embedded, self.started.identity)
            if self.footprint is not None:
                await anyio.to_thread.run_sync(self.footprint.undo)


async def _admit_into_new(
    req: RestoreRequest, layout: Layout, src: Path, on_exit: contextlib.AsyncExitStack
) -> tuple[Admitted, _Destination]:
    """Gate 1 where no manager runs: the manager's interpreter warms up and, on a root with no
    broker store yet, the embedded broker starts, both beside admission."""
    # The manager's interpreter starts now and imports itself while this run admits, claims
    # and restores; it becomes the manager where one is started below.
    warm = on_exit.enter_context(warm_manager(layout.root))
    _say(f"admitting {src}")
    if not layout.control.exists():
        # Keeping the scratch made the control directory; a refusal leaves none behind.
        on_exit.callback(rmdir_if_empty, layout.control)
    on_exit.callback(rmdir_if_empty, layout.control / admit.SCRATCH_DIR)
    broker = broker_for(req, layout)
    admitted, started, footprint = await admit_while_broker_starts(
        req, layout, src, on_exit, broker
    )
    _say(f"sealed by {signer_line(admitted.signer)}")
    if broker.embedded and started is None:
        _say("starting the embedded broker from this root's store")
        started = await start_embedded(layout)
    if started is not None:
        broker = BrokerRef(started.url, layout.broker_creds, True)
    return admitted, _Destination(broker, None, started, footprint, warm)


async def _admit_into_running(
    req: RestoreRequest,
    layout: Layout,
    src: Path,
    session: ManagerPort,
    status: control.StatusReply,
    on_exit: contextlib.AsyncExitStack,
) -> tuple[Admitted, _Destination]:
    """Gate 1 at a root whose manager runs: it adopts the seats beside the ones it runs (it
    answers the resume ops as an adoption and stays active). A taken name or a uid it already
    runs refuses before anything is claimed."""
    if status.state != "active":
        raise Refusal(
            Code.ALREADY_UP,
            f"a manager (pid {status.pid}) serves {layout.root} in state {status.state}, which "
            "adopts nothing",
            "let its cut or resume finish (or stop it with `cotal down`), then retry",
        )
    if status.space != req.space:
        raise Refusal(
            Code.WRONG_SPACE,
            f"the manager here serves space {status.space!r}, not {req.space!r}",
            f"pass `--space {status.space}` if the checkpoint was cut there",
        )
    record = mesh.read_mesh(layout)
    if record is None:
        raise Refusal(
            Code.NOT_UP,
            f"a manager answers in {layout.root} but no mesh record names its broker",
            "stop it (`cotal down`) and start the mesh again with `cotal up`",
        )
    embedded_broker = record.embedded_broker is not None
    creds = (
        layout.broker_creds if embedded_broker else (Path(record.creds) if record.creds else None)
    )
    _say(f"admitting {src} into the mesh this root runs (manager pid {status.pid})")

    def discard_when_done(adm: admit.Admission) -> None:
        on_exit.callback(admit.discard_scratch, adm)

    admitted = await gate_one(req, layout, src, kept=discard_when_done)
    adm = admitted.admission
    _say(f"sealed by {signer_line(admitted.signer)}")
    journal = Journal(layout).load() if layout.journal.exists() else None
    continuing = (
        journal is not None
        and journal.attempt_id == adm.manifest.attempt_id
        and journal.state in RESUME_UNDER_WAY
    )
    refuse_taken(adm, await seat_rows(session), continuing=continuing)
    return admitted, _Destination(BrokerRef(record.server, creds, embedded_broker), status)


async def _admit_and_resume(
    req: RestoreRequest,
    layout: Layout,
    admitted: Admitted,
    dest: _Destination,
    session: ManagerPort,
) -> RestoreResult:
    """The one path from gate 1 to a resumed seat, whoever runs it: gates 2 and 3 at the
    broker, the hand-off check, then, under the maintenance lock, the journal, the custody
    claim, the trees and inboxes, the manager's three resume ops, and the observations."""
    adm = admitted.admission
    monitors = [m.strip() for m in (req.monitor or "").split(",") if m.strip()]
    name = "cotal-adopt" if dest.running is not None else "cotal-resume"
    async with LazyConnection(dest.broker.server, dest.broker.creds, name=name) as conn:
        try:
            found = await admit_at_broker(req, layout, adm, conn, monitors, dest.broker.embedded)
            await checkpoints.check_handed_off(req, layout, adm, conn)
        except BaseException:
            await conn.aclose()
            await dest.undo()
            raise
        for c in found.consents:
            _say(
                f"CONSENT: seat {c.seat} captured {c.captured_at} is {c.age_ms} ms old, beyond "
                f"its {c.horizon_ms} ms horizon; admitted by --accept-stale-checkpoint"
            )
        _say("admitted: integrity, identity and recency pass for every seat")
        failpoint.reached("resume.after-admission", layout.root)
        try:
            with MaintenanceLock(layout, adm.manifest.attempt_id):
                done = await _resume_locked(
                    req, layout, adm, session, conn, dest, found, admitted.inboxes
                )
        except BaseException:
            # The client goes first: a broker stopped under an open client sets it
            # reconnecting, and its close then races that reconnect.
            await conn.aclose()
            await release_broker(layout, dest.started)
            raise
    return RestoreResult(
        attempt_id=done.attempt,
        state=done.state,
        journal=RETIRED,
        continued=done.continued,
        claims=done.claims,
        restored=done.restored,
        consents=done.consents,
        seats=observations(adm, done.resumed, await seat_rows(session)),
        eviction_evidence=found.evidence,
        signer=admitted.signer,
        shared_broker=done.shared,
        inbox=done.inbox,
        adopted=True if dest.running is not None else UNSET,
        clock=done.clock if done.clock is not None else UNSET,
    )


def _revives_broker(layout: Layout) -> bool:
    """A resume under way needs the broker it ran on before anything else is asked of it."""
    if not layout.journal.exists():
        return False
    record = Journal(layout).load()
    return record is not None and rerun(record.state, "restore").revive_broker


async def _rejoin(
    req: RestoreRequest,
    layout: Layout,
    src: Path,
    session: ManagerPort,
    status: control.StatusReply,
) -> RestoreResult | None:
    """Finish a resume whose coordinator died after it started the manager, or None when the
    running manager is not this root's pending resume. Admission, custody and the restore of
    the trees are behind it (the manager is started only after them), so what is left is the
    manager's three resume ops, each of which answers a repeat with what it already did."""
    journal = Journal(layout)
    record = journal.load() if layout.journal.exists() else None
    finalized = _pending_resume(record, status)
    if record is None or finalized is None:
        return None
    attempt = record.attempt_id
    adm = await admit_integrity(
        src, trusted_keys(layout, req.space, req.trust_signer), chain.search_dirs(layout)
    )
    if adm.manifest.attempt_id != attempt:
        raise Refusal(
            Code.ATTEMPT_MISMATCH,
            f"this root's manager is resuming attempt {attempt}, not {adm.manifest.attempt_id} "
            f"from {src}",
            f"rerun `cotal up --restore` with the checkpoint of attempt {attempt} to finish it",
        )
    sig = signer(adm, layout, req.space, req.trust_signer)
    _say(
        f"continuing resume {attempt} from journal state {record.state} "
        f"(manager pid {status.pid} is {status.state})"
    )
    consents = list(record.consents)
    with MaintenanceLock(layout, attempt):
        resumed, final = await _drive_pending(session, journal, record, adm, finalized)
    return RestoreResult(
        attempt_id=attempt,
        state=final.state,
        journal=RETIRED,
        continued=True,
        claims=[],
        restored=[],
        consents=consents,
        seats=observations(adm, resumed, await seat_rows(session)),
        eviction_evidence=[],
        signer=sig,
        clock=record.clock if record.clock is not None else UNSET,
    )


async def _drive_pending(
    session: ManagerPort,
    journal: Journal,
    record: JournalRecord,
    adm: admit.Admission,
    finalized: bool,
) -> tuple[list[Resumed], control.AttemptState]:
    attempt, descriptor, consents = record.attempt_id, record.resume, list(record.consents)
    token = record.durable_commit_token
    if finalized:
        # Finalize ran; only its journal entry is missing. The manager answers a repeat.
        resumed = [
            Resumed(name, rec.session.continuity, "resumed by the run that was interrupted")
            for name, rec in adm.records.items()
        ]
    else:
        resumed, token = await resume_and_commit(
            session,
            journal,
            attempt,
            journal.resume_document(record),
            descriptor,
            consents,
            root=journal.layout.root,
            # A journal already past resume-intent keeps its state: the manager answered a
            # repeat of what was journaled.
            advance_active=record.state not in RESUME_ADOPTED,
        )
    assert token is not None
    final = await finalize(session, journal, attempt, descriptor, consents, token)
    return resumed, final


def _pending_resume(record: JournalRecord | None, status: control.StatusReply) -> bool | None:
    """Whether the running manager is this root's resume under way: None when it is not;
    otherwise whether its finalize already ran (only the journal's entry of it is missing)."""
    if record is None or record.state not in RESUME_UNDER_WAY:
        return None
    fenced = (
        status.state in ("resume-required", "resuming", "awaiting-finalize")
        and status.attempt_id == record.attempt_id
    )
    # An adoption's finalize has not run while its manager still names it.
    finalized = (
        status.state == "active"
        and record.state == RESUME_COMMITTED
        and status.adopting != record.attempt_id
    )
    if not (fenced or finalized):
        return None
    return finalized


async def _resume_locked(
    req: RestoreRequest,
    layout: Layout,
    adm: admit.Admission,
    session: ManagerPort,
    conn: LazyConnection,
    dest: _Destination,
    found: AtBroker,
    inboxes: dict[str, CarriedSpace],
) -> _Done:
    """Journal, custody, inboxes and trees, the hand-over to the manager, then its three resume
    ops, under the lock."""
    attempt = adm.manifest.attempt_id
    plan = _journal_intent(layout, adm, found.consents, found.clock)
    identity = load_or_create_identity(layout, req.space)
    claims, shared, js = await _claim_custody(
        req, layout, adm, conn, dest, plan, identity.instance_id
    )
    failpoint.reached("resume.after-custody-claim", layout.root)
    inbox: list[InboxImported] = []
    restored: list[RestoredTree] = []
    if not plan.relaunch:
        # `cotal.toml` as the gates read it, before anything was journaled or claimed.
        inbox, restored = await _put_in_place(
            req, layout, adm, js, dest, inboxes, shared, found.config
        )
    # The broker's last use by this coordinator: the manager is its client from here on, and
    # an embedded broker passes to the manager's mesh record as it runs.
    await conn.aclose()
    failpoint.reached("resume.after-trees-restored", layout.root)
    await _hand_over(req, layout, session, dest, attempt)
    resumed, token = await resume_and_commit(
        session,
        plan.journal,
        attempt,
        adm.inventory,
        plan.descriptor,
        plan.consents,
        root=layout.root,
        advance_active=not plan.relaunch,
    )
    final = await finalize(session, plan.journal, attempt, plan.descriptor, plan.consents, token)
    return _Done(
        attempt,
        final.state,
        plan.relaunch,
        claims,
        shared,
        inbox,
        restored,
        plan.consents,
        resumed,
        plan.clock,
    )


@dataclasses.dataclass(frozen=True)
class _Done:
    """What the locked part of a resume did, before the observations are read back."""

    attempt: str
    state: str
    continued: bool
    claims: list[Claim]
    shared: bool
    inbox: list[InboxImported]
    restored: list[RestoredTree]
    consents: list[Consent]
    resumed: list[Resumed]
    clock: ClockNote | None


async def _put_in_place(
    req: RestoreRequest,
    layout: Layout,
    adm: admit.Admission,
    js: JetStreamContext,
    dest: _Destination,
    inboxes: dict[str, CarriedSpace],
    shared: bool,
    config: registry.FileConfig,
) -> tuple[list[InboxImported], list[RestoredTree]]:
    """Each seat's inbox and frontiers, and each tree: both under custody and before the
    manager starts (its lifecycle proof needs each durable here, and each seat its tree). The
    import waits on the broker and the restore on git, and neither touches what the other
    does, so each runs beside the other."""
    return await beside(
        functools.partial(
            import_inboxes,
            req,
            adm,
            js,
            dest.broker,
            inboxes,
            shared=shared,
            horizon_s=config.recency.horizon_s,
            channels=config.channels,
        ),
        functools.partial(restore_all, layout, adm),
    )


@dataclasses.dataclass(frozen=True)
class _Plan:
    """The journal as this resume found and advanced it: the plan it resumes (`descriptor`),
    the consents that stand, and whether the trees and inboxes are already in place
    (`relaunch`: a rerun after the manager this resume started died)."""

    journal: Journal
    descriptor: ResumeDescriptor
    consents: list[Consent]
    relaunch: bool
    # Who vouched for this host's clock at the first admission, when not the kernel.
    clock: ClockNote | None


def _journal_intent(
    layout: Layout, adm: admit.Admission, consents: list[Consent], clock: ClockNote | None
) -> _Plan:
    """`resume-intent`, or the journal's own record of this attempt when a rerun continues it."""
    attempt = adm.manifest.attempt_id
    inventory = adm.inventory
    journal = Journal(layout)
    record = journal.load() if layout.journal.exists() else None
    action = rerun(record.state if record is not None else None, "restore")
    if record is not None and action.drops:
        journal.discard(record.attempt_id)
        record = None
    if record is not None and record.attempt_id != attempt:
        raise Refusal(
            Code.JOURNAL_BUSY,
            f"this root's maintenance journal is at {record.state} for attempt {record.attempt_id}",
            "finish or discard that attempt first",
        )
    if record is None:
        descriptor = write_resume_document(layout, inventory)
    else:
        # Same-root resume continues the cut's journal, or a rerun continues this resume:
        # either way the journal's plan must be the very document this checkpoint seals.
        if record.resume is None or journal.resume_document(record) != inventory:
            raise Refusal(
                Code.JOURNAL_MISMATCH,
                f"this root's journal for attempt {attempt} names a different resume document",
                "resume from the checkpoint this root cut, or discard the journal first",
            )
        descriptor = record.resume
        if action.kind == "refuse":
            raise action.refusal(attempt=attempt, state=record.state)
    if record is not None and record.kind == "resume" and record.consents:
        # A rerun of an admitted attempt: the operator's consent was journaled at its first
        # admission and stands; a fresh age reading must not contradict the record.
        consents = list(record.consents)
    if record is not None and record.kind == "resume":
        # Likewise who vouched for the clock then: the record is the evidence, not a re-read.
        clock = record.clock
    # Past `resume-active` the trees were restored, the inboxes imported and the manager ran
    # the seats, which may have worked since: a rerun after that manager died restarts a
    # manager fenced to the attempt over what is there now and never restores again.
    relaunch = record is not None and record.state in RESUME_ADOPTED
    if record is not None and relaunch:
        _say(
            f"continuing resume {attempt} from journal state {record.state}: its manager died; "
            "the trees and inboxes stay as the seats left them"
        )
    else:
        journal.advance(attempt, RESUME_INTENT, resume=descriptor, consents=consents, clock=clock)
    failpoint.reached("resume.after-resume-intent", layout.root)
    return _Plan(journal, descriptor, consents, relaunch, clock)


async def _claim_custody(
    req: RestoreRequest,
    layout: Layout,
    adm: admit.Admission,
    conn: LazyConnection,
    dest: _Destination,
    plan: _Plan,
    holder: str,
) -> tuple[list[Claim], bool, JetStreamContext]:
    """Writer generation N+1 for every seat, in this root and at the broker, before any tree
    is touched: the claims, and whether this broker is the one the seats were cut from. A claim
    lost gives back what this root claimed and journals `degraded` with why."""
    attempt = adm.manifest.attempt_id
    _say("claiming custody (writer generation N+1) in this root and at the broker")
    local: list[tuple[str, int]] = []
    try:
        for name, rec in adm.records.items():
            generation = claim_successor(
                layout, req.space, name, rec.lifecycle_uid, rec.generation, holder, attempt
            )
            local.append((name, generation))
        js = await conn.jetstream()
        with phase("broker identity"):
            shared = await shares_source_broker(js, adm)
        if shared:
            with phase("custody claim"):
                claims = await custody.claim_attempt(
                    js, adm.manifest.space, attempt, adm.records, holder=holder, root=layout.root
                )
        else:
            _say(NO_FENCE_NOTE)
            with phase("custody claim (continued in this broker)"):
                claims = await custody.claim_across(
                    js,
                    adm.manifest.space,
                    attempt,
                    adm.records,
                    holder=holder,
                    root=layout.root,
                    replicas=replicas(req, dest.broker),
                )
    except Refusal as exc:
        # Lost before any tree was touched: give back what this root claimed and say why.
        for name, generation in local:
            uid = adm.records[name].lifecycle_uid
            withdraw_claim(layout, req.space, name, uid, generation, holder, attempt)
        plan.journal.advance(
            attempt,
            DEGRADED,
            resume=plan.descriptor,
            consents=plan.consents,
            degraded=Degraded(
                reason=exc.message[:4000], recourse=(exc.cure or "see the message")[:4000]
            ),
        )
        raise
    return msgspec.convert(claims, list[Claim]), shared, js


async def _hand_over(
    req: RestoreRequest,
    layout: Layout,
    session: ManagerPort,
    dest: _Destination,
    attempt: str,
) -> None:
    """The seats go to the running manager, or to one started now, fenced to this attempt."""
    if dest.running is not None:
        _say("handing the seats to the running manager (its other seats carry on)")
        return
    _say("starting the manager fenced to this attempt")
    server, creds = None, None
    if dest.started is None:
        server = dest.broker.server
        creds = str(dest.broker.creds) if dest.broker.creds else None
    # Only a coordinator that found no manager starts one, and it asked on the socket.
    assert isinstance(session, ControlSession)
    await mesh.start(
        layout.root,
        session,
        space=req.space,
        server=server,
        creds=creds,
        report=_say,
        resume_attempt=attempt,
        broker=dest.started,
        warm=dest.warm,
    )
    failpoint.reached("resume.after-manager-started", layout.root)
