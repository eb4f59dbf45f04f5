"""`cotal down --preserve-state`: the coordinator of the cut.

lock -> prepare -> journal `cut-intent` -> commit -> journal `cut-committed` -> stop the daemon and
the embedded broker -> prove quiescence -> journal `ready`. Re-running after a failure continues
from what the journal says: through the daemon when it still answers, or offline when it died,
once no process carrying any seat's lifecycle uid is alive. `ready` is never written unless every
seat was proven stopped and sealed.

The whole cut is one async run holding one control session; it asks the broker only when it must
capture offline, over one connection.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import msgspec

from manager import failpoint, registry
from manager.broker import embedded
from manager.checkpoint.reader import read_manifest
from manager.control.client import ControlSession
from manager.coord import mesh
from manager.coord.cutplan import CutOptions, OfflineCut, prove_no_seat_processes
from manager.coord.progress import ProgressView, follow_commit
from manager.coord.records import Aborted
from manager.coord.report import say as _say
from manager.coord.requests import CutRequest
from manager.procs import alive, prove_gone
from manager.workspace.journal import Journal
from manager.workspace.layout import Layout
from manager.workspace.lock import MaintenanceLock
from protocol import control, names
from protocol.codec import decode_json
from protocol.errors import Refusal
from protocol.maintenance import (
    CUT_COMMITTED,
    CUT_INTENT,
    READY,
    JournalRecord,
    ResumeDescriptor,
    rerun,
)
from protocol.refusals import Code

COMMIT_TIMEOUT_S = 600.0
PREPARE_TIMEOUT_S = 120.0
SHUTDOWN_TIMEOUT_S = 60.0
DAEMON_EXIT_TIMEOUT_S = 30.0

T = TypeVar("T")
# What a commit left: the manager's reply, or the offline finish's record in its place.
Committed = control.CommitReply | OfflineCut


@dataclass(frozen=True)
class AlreadySealed:
    """A rerun of a cut the journal holds sealed and ready: nothing to do."""

    record: JournalRecord

    def document(self) -> dict[str, Any]:
        return {
            "attemptId": self.record.attempt_id,
            "journal": self.record.state,
            "checkpointDir": self.record.checkpoint_dir,
            "alreadyComplete": True,
        }


@dataclass(frozen=True)
class Sealed:
    """A cut sealed and journaled `ready`, and its wall time."""

    result: Committed
    wall_ms: int

    def document(self) -> dict[str, Any]:
        """`--json`: the commit's own record, with the wall time and the journal state."""
        doc: dict[str, Any] = msgspec.to_builtins(self.result)
        return {**doc, "wallMs": self.wall_ms, "journal": READY}


async def _commit(session: ControlSession, attempt: str, opts: CutOptions) -> control.CommitReply:
    """`commit-preservation`, with the attempt's progress shown while it runs. A commit already
    running for this attempt (its coordinator died) is joined by the daemon, not repeated."""
    view = ProgressView(_say)
    commit = control.CommitPreservationArgs(
        attempt_id=attempt,
        session_stores=opts.stores,
        drain_timeout_s=opts.drain_timeout,
        include=opts.include,
        since=opts.since,
        precopy=dict(opts.precopy),
    )
    try:
        result = await follow_commit(
            session,
            attempt,
            view,
            lambda: session.request(
                control.COMMIT_PRESERVATION,
                commit,
                # The daemon may spend the whole drain on a turn before it stops anything.
                timeout=COMMIT_TIMEOUT_S + opts.drain_timeout,
            ),
        )
    except Refusal as exc:
        if exc.code in (Code.CONNECTION_LOST, Code.DAEMON_UNREACHABLE):
            raise _daemon_lost(attempt, exc.message) from None
        raise
    except (OSError, ExceptionGroup) as exc:
        # The socket broke under the commit or its progress poll: the daemon died mid-commit.
        raise _daemon_lost(attempt, " ".join(f"{type(exc).__name__}: {exc}".split())) from None
    return result


def _daemon_lost(attempt: str, why: str) -> Refusal:
    return Refusal(
        Code.DAEMON_LOST,
        f"the manager went away during the commit of cut {attempt} ({why})",
        "rerun `cotal down --preserve-state`: it finishes the cut offline once the manager and "
        "its seats are proven gone (kill the manager if it is still alive but silent)",
    )


async def _finish(
    layout: Layout,
    session: ControlSession,
    journal: Journal,
    attempt: str,
    result: Committed,
    descriptor: ResumeDescriptor,
    t0: float,
) -> Sealed:
    if result.failures or not result.sealed:
        raise _incomplete(attempt, result)
    failpoint.reached("cut.after-commit", layout.root)
    await anyio.to_thread.run_sync(read_manifest, Path(result.checkpoint_dir))
    journal.advance(attempt, CUT_COMMITTED, resume=descriptor, checkpoint_dir=result.checkpoint_dir)
    failpoint.reached("cut.after-cut-committed", layout.root)
    if isinstance(result, control.CommitReply) and result.partial is True:
        # The cut seats are proven stopped and sealed; the manager, the broker and every other
        # seat run on, so nothing else is stopped and the mesh record stays.
        inventory = journal.resume_document()
        await anyio.to_thread.run_sync(prove_no_seat_processes, inventory)
        journal.advance(attempt, READY, resume=descriptor, checkpoint_dir=result.checkpoint_dir)
        return Sealed(result, int((time.monotonic() - t0) * 1000))
    record = mesh.read_mesh(layout)
    if await session.status() is not None:
        _say("stopping the manager (footprint kept)")
        await session.request(control.SHUTDOWN, control.NoArgs(), timeout=SHUTDOWN_TIMEOUT_S)
        await session.forget()
    if record is not None and record.manager is not None:
        gone = await anyio.to_thread.run_sync(
            functools.partial(prove_gone, record.manager, timeout=DAEMON_EXIT_TIMEOUT_S)
        )
        if not gone:
            raise Refusal(
                Code.DAEMON_STUCK,
                f"manager pid {record.manager.pid} did not exit",
                f"kill -9 {record.manager.pid}, then rerun `cotal down --preserve-state`",
            )
    failpoint.reached("cut.after-manager-stopped", layout.root)
    if record is not None and record.embedded_broker is not None:
        _say("stopping the embedded broker")
        await anyio.to_thread.run_sync(embedded.stop_embedded, record.embedded_broker)
        failpoint.reached("cut.after-broker-stopped", layout.root)
    inventory = journal.resume_document()
    await anyio.to_thread.run_sync(prove_no_seat_processes, inventory)
    journal.advance(attempt, READY, resume=descriptor, checkpoint_dir=result.checkpoint_dir)
    layout.mesh.unlink(missing_ok=True)
    return Sealed(result, int((time.monotonic() - t0) * 1000))


def given(value: T | msgspec.UnsetType, default: T) -> T:
    return default if isinstance(value, msgspec.UnsetType) else value


def _incomplete(attempt: str, result: Committed) -> Refusal:
    """The refusal for a commit that did not seal. One cause shared by every failure is named by
    its own code (`capture-failed`, `stop-unproven`, ...); several are `cut-incomplete`."""
    failures = result.failures
    failed = "; ".join(f"{f.name}: {f.error}" for f in failures) or "it was not sealed"
    codes = {given(f.code, "") or "cut-incomplete" for f in failures}
    kept = result.evidence if isinstance(result, control.CommitReply) else msgspec.UNSET
    evidence = given(kept, "") or result.checkpoint_dir
    return Refusal(
        codes.pop() if len(codes) == 1 else Code.CUT_INCOMPLETE,
        f"cut {attempt} is incomplete: {failed}",
        "the seats are stopped and their durables kept; fix the cause and rerun "
        f"`cotal down --preserve-state` to capture again; evidence kept at {evidence}",
    )


async def _continue(
    layout: Layout,
    session: ControlSession,
    journal: Journal,
    record: JournalRecord,
    status: control.StatusReply | None,
    opts: CutOptions,
) -> Committed:
    """A rerun after a failure: through the daemon when it still holds the attempt, offline
    when it died."""
    attempt = record.attempt_id
    some = status.partial_cut if status is not None else None
    if some is not None and some.attempt_id == attempt:
        # A cut of some seats: the manager stayed active and still holds it.
        if some.state == "preserving" and not some.commit_started:
            await session.request(
                control.PREPARE_PRESERVATION,
                control.PrepareArgs(attempt_id=attempt),
                timeout=PREPARE_TIMEOUT_S,
            )
        return await _commit(session, attempt, opts)
    if status is not None and status.state in ("preserving", "preserved"):
        if status.state == "preserving":
            await session.request(
                control.PREPARE_PRESERVATION,
                control.PrepareArgs(attempt_id=attempt),
                timeout=PREPARE_TIMEOUT_S,
            )
        return await _commit(session, attempt, opts)
    if status is not None:
        raise Refusal(
            Code.CUT_INTERRUPTED,
            f"cut {attempt} was interrupted and the manager now runs {status.state} without it",
            "the plan is in .cotal/maintenance/v1/resume.json; stop this manager (`cotal down` "
            "would deprovision: kill it instead) and rerun `cotal down --preserve-state` to "
            "capture offline",
        )
    mesh_record = mesh.read_mesh(layout)
    if mesh_record is not None and mesh_record.manager is not None and alive(mesh_record.manager):
        raise Refusal(
            Code.DAEMON_UNRESPONSIVE,
            f"manager pid {mesh_record.manager.pid} is alive but does not answer",
            f"kill {mesh_record.manager.pid} (its seats die with it), then rerun",
        )
    # The offline capture is recovery after a manager died: its module, and the git, broker and
    # signing code it brings, load only on that path, not at every cut's start.
    from manager.coord import offline

    return await offline.finish(layout, journal, attempt, opts)


async def cut(req: CutRequest, root: Path) -> Sealed | AlreadySealed | Aborted:
    """The cut; `--abort`'s outcome; or `AlreadySealed` when the journal says this cut
    is already complete."""
    t0 = time.monotonic()
    layout = Layout.at(root)
    journal = Journal(layout)
    record = journal.load() if layout.journal.exists() else None
    action = rerun(record.state if record is not None else None, "cut")
    opts = _options(req)
    if req.abort:
        return await _abort(layout, journal, record)
    if opts.since is not None:
        # Proven before anything is fenced: a predecessor that is not sealed, trusted and
        # intact here refuses while every seat still runs. Imported here: the chain brings the
        # git capture code, which a cut through the manager never runs in this process.
        from manager.checkpoint import chain

        seats = await anyio.to_thread.run_sync(chain.check_predecessor, layout, opts.since)
        _say(f"incremental since attempt {opts.since} ({len(seats)} seat(s) recorded there)")
    if record is not None and action.finished:
        return await _already_sealed(layout, record, opts)
    if record is not None and action.kind == "refuse":
        raise action.refusal(attempt=record.attempt_id, state=record.state)
    continuing = record is not None and action.kind == "continue"
    attempt = record.attempt_id if record is not None and continuing else names.mint_attempt_id()
    if action.revive_broker:
        await mesh.revive_embedded_broker(layout, _say)
    async with mesh.control(layout) as session:
        status = await session.status()
        if status is not None and not continuing:
            # An embedded broker that died before any journal named this cut (or the one a dead
            # coordinator prepared) would stall the fence's custody reads: the manager keeps
            # reconnecting to the URL the mesh names, so starting it there again lets this run
            # go on. Only once a manager answers: a refusal of a root that is down starts nothing.
            await mesh.revive_embedded_broker(layout, _say)
        joined = _orphaned_attempt(status) if not continuing else None
        if joined is not None:
            # A coordinator died after the daemon prepared and before it journaled: the fence
            # belongs to that attempt, so this run finishes it rather than minting another.
            attempt = joined
        with MaintenanceLock(layout, attempt):
            failpoint.reached("cut.after-lock", layout.root)
            if record is not None and action.drops:
                journal.discard(record.attempt_id)
            if not continuing:
                result, descriptor = await _begin(
                    layout, session, journal, attempt, status, joined is not None, opts
                )
            else:
                assert record is not None and record.resume is not None
                descriptor = record.resume
                _say(f"continuing cut {attempt} from journal state {record.state}")
                result = await _continue(layout, session, journal, record, status, opts)
            return await _finish(layout, session, journal, attempt, result, descriptor, t0)


def _options(req: CutRequest) -> CutOptions:
    return CutOptions(
        stores=[str(Path(s).resolve()) for s in req.session_store],
        drain_timeout=req.drain_timeout,
        # Refused here, before anything is fenced, rather than after the seats were stopped.
        include=registry.carry_includes(registry.FileConfig(), list(req.include)),
        since=req.since,
        seats=tuple(dict.fromkeys(req.seat)),
        precopy=dict(req.precopy),
    )


async def _already_sealed(layout: Layout, record: JournalRecord, opts: CutOptions) -> AlreadySealed:
    """A rerun of a cut the journal holds sealed: nothing to do, unless a manager answers with
    seats that cut does not hold. A manager that answers after a sealed cut was started by a
    plain `cotal up`, or runs on beside a cut of some seats: "already sealed" would then leave
    its seats neither captured nor stopped."""
    status = await mesh.probe_status(layout)
    # "Already sealed" only for a rerun of that very cut of some seats: a whole cut (no --seat)
    # after it would report success while the seats it never cut run on uncaptured, and a cut
    # of other seats meets the sealed one waiting, as any new cut does.
    sealed_here = (
        status is not None
        and status.partial_cut is not None
        and status.partial_cut.attempt_id == record.attempt_id
        and bool(opts.seats)
        and sorted(opts.seats) == status.partial_cut.seats
    )
    if status is not None and status.seats and not sealed_here:
        raise sealed_cut_waiting(record.attempt_id, status.seats)
    # Nothing runs here now: the sealed cut answers only for seats it holds. Named seats it
    # does not hold were never captured by it, so "already sealed" would report a cut that
    # captured nothing of them.
    held = {a.name for a in Journal(layout).resume_document(record).agents}
    missing = sorted(set(opts.seats) - held)
    if missing:
        raise Refusal(
            Code.NO_SUCH_SEAT,
            f"cut {record.attempt_id} is sealed here with seat(s) {', '.join(sorted(held))}; "
            f"{', '.join(missing)} is not among them and no manager runs here to cut it",
            f"resume, pack or discard cut {record.attempt_id} first (`cotal checkpoint list`); "
            "nothing was fenced or stopped",
        )
    return AlreadySealed(record)


async def _begin(
    layout: Layout,
    session: ControlSession,
    journal: Journal,
    attempt: str,
    status: control.StatusReply | None,
    joined: bool,
    opts: CutOptions,
) -> tuple[Committed, ResumeDescriptor]:
    """Fence, drain and plan (`prepare-preservation`), journal `cut-intent`, then commit."""
    if status is None:
        raise Refusal(
            Code.NOT_UP,
            f"no manager answers in {layout.root}",
            "start it with `cotal up --detach`",
        )
    if joined:
        _say(f"joining cut {attempt}, prepared by a coordinator that did not finish")
    elif opts.seats:
        _say(
            f"cut {attempt}: fencing, draining and planning seat(s) {', '.join(opts.seats)}; "
            f"the other {status.seats - len(opts.seats)} run on"
        )
    else:
        _say(f"cut {attempt}: fencing, draining and planning {status.seats} seat(s)")
    plan = await session.request(
        control.PREPARE_PRESERVATION,
        control.PrepareArgs(attempt_id=attempt, seats=list(opts.seats)),
        timeout=PREPARE_TIMEOUT_S,
    )
    failpoint.reached("cut.after-prepare", layout.root)
    descriptor = decode_json(
        bytes(plan.resume), ResumeDescriptor, what="prepare result", cap=control.FRAME_CAP
    )
    journal.advance(attempt, CUT_INTENT, resume=descriptor)
    failpoint.reached("cut.after-cut-intent", layout.root)
    _say(
        "stopping the cut seat(s), proving each exit, capturing and sealing"
        if opts.seats
        else "stopping every seat, proving each exit, capturing and sealing"
    )
    return await _commit(session, attempt, opts), descriptor


def sealed_cut_waiting(attempt: str, seats: int) -> Refusal:
    """The refusal a cut meets while a sealed cut still waits in the root and a new mesh runs
    seats beside it; `cotal up` prints its message ahead of time."""
    return Refusal(
        Code.SEALED_CUT_WAITING,
        f"cut {attempt} is sealed and waiting in this root, and the manager now runs {seats} "
        "seat(s) it does not hold; a cut now would capture neither, so nothing was fenced or "
        "stopped",
        f"carry the sealed cut away first (`cotal checkpoint pack {attempt} -o FILE`, then "
        f"`cotal checkpoint discard {attempt}`) or discard it (`cotal checkpoint discard "
        f"{attempt}`: its seats will not be resumed here), then rerun `cotal down "
        "--preserve-state`",
    )


def _orphaned_attempt(status: control.StatusReply | None) -> str | None:
    """The attempt a daemon is fenced for when no journal names it."""
    if status is not None and status.partial_cut is not None:
        if status.partial_cut.state == "preserving":
            return status.partial_cut.attempt_id
    if status is None or status.state not in ("preserving", "preserved"):
        return None
    return status.attempt_id


_CURE_FINISH = "rerun `cotal down --preserve-state` to finish the cut"


async def _abort(layout: Layout, journal: Journal, record: JournalRecord | None) -> Aborted:
    """`--abort`: lift a fence a dead coordinator left, before its commit began, and drop its
    `cut-intent`; every seat keeps running. After a commit that failed to seal, the manager
    first starts the seats it stopped again, in their own sessions and trees, under their uids
    (the evidence directory stays). While a commit runs, or once it sealed, only finishing is
    safe: the manager's attempt machine decides and refuses `commit-begun`."""
    action = rerun(record.state if record is not None else None, "abort")
    if record is not None and action.kind == "refuse":
        raise action.refusal(attempt=record.attempt_id, state=record.state)
    # The one attempt an abort continues is a cut journaled before its commit: its intent.
    intent = record if action.kind == "continue" else None
    async with mesh.control(layout) as session:
        status = await session.status()
        fenced = _orphaned_attempt(status)
        if status is None:
            if intent is None:
                return Aborted(aborted=False, nothing=True)
            raise Refusal(
                Code.ABORT_UNSAFE,
                f"cut {intent.attempt_id} is journaled but no manager answers, so whether its "
                "commit began (seats stopped) cannot be told",
                _CURE_FINISH + " offline",
            )
        assert status is not None
        if fenced is not None and status.state == "preserved":
            raise Refusal(
                Code.COMMIT_BEGUN,
                f"cut {fenced} is sealed: its seats were stopped and captured, so it can no "
                "longer be aborted",
                _CURE_FINISH,
            )
        if intent is not None and fenced is not None and fenced != intent.attempt_id:
            raise Refusal(
                Code.ATTEMPT_MISMATCH,
                f"the journal names cut {intent.attempt_id} but the manager is fenced for {fenced}",
                "kill the manager (its seats die with it) and rerun `cotal down --preserve-state`",
            )
        attempt = fenced or (intent.attempt_id if intent is not None else None)
        if attempt is None:
            return Aborted(aborted=False, nothing=True, state=status.state)
        with MaintenanceLock(layout, attempt):
            failpoint.reached("cut.abort.after-lock", layout.root)
            if fenced is not None and _commit_began(status):
                _say(
                    f"cut {fenced}: its commit began; if it failed, the manager starts the seats "
                    "it stopped again before it lifts the fence"
                )
            if fenced is not None:
                await session.request(
                    control.ABORT_PRESERVATION,
                    control.AttemptArgs(attempt_id=fenced),
                    # Starting the stopped seats again takes each one's launch and readiness.
                    timeout=COMMIT_TIMEOUT_S if _commit_began(status) else PREPARE_TIMEOUT_S,
                )
            elif intent is not None:
                await _prove_untouched(session, journal, intent)
            failpoint.reached("cut.abort.after-fence-lifted", layout.root)
            if intent is not None and action.drops:
                journal.discard(intent.attempt_id)
        return Aborted(
            attempt_id=attempt,
            aborted=True,
            fence_lifted=fenced is not None,
            journal_discarded=intent is not None,
            state="active",
        )


def _commit_began(status: control.StatusReply) -> bool:
    some = status.partial_cut
    if some is not None and some.state == "preserving":
        return some.commit_started
    return status.commit_started


async def _prove_untouched(
    session: ControlSession, journal: Journal, intent: JournalRecord
) -> None:
    """A `cut-intent` whose manager is not fenced: discarding it is safe only if every seat of
    the plan still runs here under its uid, i.e. no commit ever stopped one."""
    rows = {r.name: r for r in await session.request(control.PS, control.NoArgs())}
    lost = [
        a.name
        for a in journal.resume_document(intent).agents
        if (row := rows.get(a.name)) is None
        or row.lifecycle_uid != a.identity.lifecycle_uid
        or row.state != "running"
    ]
    if lost:
        raise Refusal(
            Code.ABORT_UNSAFE,
            f"cut {intent.attempt_id} is journaled and seat(s) {', '.join(lost)} of its plan no "
            "longer run here, so its commit may have begun",
            _CURE_FINISH,
        )
