"""`cotal up --restore DIR`: the destination's coordinator.

admit (integrity, identity, recency; all-or-nothing) -> journal `resume-intent` -> claim custody
(writer generation N+1, in this root and at the broker, before any tree is touched) -> restore
every repository and place the session files -> start the manager fenced to this attempt ->
`resume-preserved` -> journal `resume-active` -> `commit-resume` -> journal the token ->
`finalize-resume` -> journal `retired`. Then the continuity observations of record 6 step 9.

The whole resume is one async run. It holds one broker connection from the roster read through
the custody claim (closed before the manager starts: the manager is the broker's client from
then on), and one control session, connected when the manager it starts first answers.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import anyio
import msgspec
from nats.js import JetStreamContext

from connectors.privatefs import ensure_private_dir, read_stable
from manager import concurrency, eventloop, failpoint, registry
from manager.broker import custody, embedded, frontier
from manager.broker.connection import LazyConnection
from manager.broker.evict import AccountConnz, ConnectionList, MonitorEndpoint, evict_ghosts
from manager.broker.footprint import default_replicas
from manager.broker.presence import live_uids
from manager.broker.retry import phase
from manager.broker.space import Imported, import_inbox, read_broker_identity
from manager.checkpoint import admit, chain, clock, relocate
from manager.checkpoint.confine import place_session_file
from manager.checkpoint.restore import RestoreResult, restore_repository
from manager.cli import checkpoints, mesh
from manager.cli.verify import (
    BrokerRef,
    admit_integrity,
    agent_settings,
    relocation_of,
    signer,
    signer_line,
    trusted_keys,
)
from manager.cli.warm import WarmManager, warm_manager
from manager.control.client import ControlSession
from manager.procs import pid_identity
from manager.workspace.generation import claim_successor, withdraw_claim
from manager.workspace.identity import load_or_create_identity
from manager.workspace.journal import Journal, write_resume_document
from manager.workspace.layout import Layout
from manager.workspace.lock import MaintenanceLock
from protocol import control
from protocol.checkpoint import CarriedMessage, ChannelState, FileRef, SpaceRecord, decode_inbox
from protocol.errors import Refusal
from protocol.instant import file_stamp
from protocol.inventory import Inventory, encode_inventory
from protocol.maintenance import (
    DEGRADED,
    RESUME_ACTIVE,
    RESUME_ADOPTED,
    RESUME_COMMITTED,
    RESUME_INTENT,
    RESUME_UNDER_WAY,
    RETIRED,
    Consent,
    Degraded,
    ResumeDescriptor,
    rerun,
)
from protocol.refusals import Code

RESUME_TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True)
class _Resumed:
    """A seat as the manager's `resume-preserved` reported it (or as a rerun after finalize
    recalls it from the checkpoint): what the observations compare against `ps`."""

    name: str
    continuity: str
    observation: str


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


A = TypeVar("A")
B = TypeVar("B")

NO_FENCE_NOTE = (
    "cotal: note: this destination does not share the source's broker, so no fence can stop "
    "another destination from resuming the same checkpoint; resume it in one place only"
)


def _broker_for(args: argparse.Namespace, layout: Layout) -> BrokerRef:
    """`--server`, or this root's embedded broker: its own store, or a new one, into which the
    checkpoint's inboxes are imported before the manager starts."""
    if args.server:
        return BrokerRef(args.server, Path(args.creds).resolve() if args.creds else None, False)
    return BrokerRef("", layout.broker_creds, True)


def _replicas(args: argparse.Namespace, broker: BrokerRef) -> int:
    if broker.embedded:
        return 1
    return int(args.replicas) if args.replicas else default_replicas(broker.server)


@dataclasses.dataclass(frozen=True)
class CarriedSpace:
    """One seat's carried messages, as admitted: its inbox, and each subscribed channel's posts
    above its frontier."""

    inbox: list[CarriedMessage]
    posts: dict[str, list[CarriedMessage]]


def _read_carried(
    path: Path, ref: FileRef, part: SpaceRecord | ChannelState, name: str
) -> list[CarriedMessage]:
    data = read_stable(path, cap=ref.bytes, what="carried inbox").data
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != ref.bytes or digest != ref.sha256:
        raise Refusal(
            Code.INTEGRITY,
            f"checkpoint integrity: {path} changed after admission (now {len(data)} bytes "
            f"hashing to {digest})",
            "retry once nothing writes to the checkpoint; nothing was changed",
        )
    try:
        return decode_inbox(data, part)
    except ValueError as exc:
        raise Refusal(
            Code.INTEGRITY,
            f"checkpoint integrity: {path} does not match seat {name}'s record: {exc}",
            "copy the attempt directory again from the source host, or cut a new checkpoint; "
            "nothing was changed",
        ) from None


def _read_inboxes(adm: admit.Admission) -> dict[str, CarriedSpace]:
    """Each seat's carried messages: as admission's inbox check read them (hashed as they were
    read and proven against their record, so exactly the sealed bytes), or, for an admission
    that kept none, re-hashed as they are read here and proven to match their record."""
    dirs = {s.name: s.dir for s in adm.manifest.seats}
    out: dict[str, CarriedSpace] = {}
    for name, record in adm.records.items():
        state = record.space_state
        if state is None:
            continue
        kept = adm.inboxes.get(name)
        if kept is not None:
            out[name] = CarriedSpace(
                inbox=kept[state.inbox.file],
                posts={c.channel: kept[c.posts.file] for c in state.channels},
            )
            continue
        seat_dir = adm.attempt_dir / dirs[name]
        out[name] = CarriedSpace(
            inbox=_read_carried(seat_dir / state.inbox.file, state.inbox, state, name),
            posts={
                c.channel: _read_carried(seat_dir / c.posts.file, c.posts, c, name)
                for c in state.channels
            },
        )
    return out


async def _shares_source_broker(js: JetStreamContext, adm: admit.Admission) -> bool:
    """Whether this broker is the one the checkpoint was cut from (its custody chain)."""
    carried = {r.space_state.broker_id for r in adm.records.values() if r.space_state}
    if not carried:
        # A checkpoint from before the space travelled resumes only where it was cut.
        return True
    here = await read_broker_identity(js, adm.manifest.space)
    return carried == {here}


async def _start_embedded(layout: Layout) -> embedded.BrokerInfo:
    for directory in (layout.control, layout.auth, layout.logs):
        ensure_private_dir(directory)
    start = functools.partial(
        embedded.start_embedded,
        layout.nats_store,
        layout.broker_creds,
        log_path=layout.logs / "nats.log",
    )
    try:
        return await anyio.to_thread.run_sync(start)
    except Refusal as exc:
        if exc.code != Code.BROKER_RUNNING:
            raise
    # A resume coordinator that died before its manager started left this root's broker
    # running with no mesh record naming it. No manager answers here (the caller checked), so
    # nothing else uses it: it is stopped (flushing its store) and started for this run.
    for pid in embedded.store_owners(layout.nats_store):
        _say(f"stopping the embedded broker (pid {pid}) an interrupted resume left running")
        try:
            await anyio.to_thread.run_sync(embedded.stop_embedded, pid_identity(pid))
        except ProcessLookupError:
            continue
    # A multi-threaded broker reads as a zombie once its leader thread exits, a moment before
    # its last thread lets go of the store's lock.
    deadline = time.monotonic() + 10
    while True:
        try:
            return await anyio.to_thread.run_sync(start)
        except Refusal as exc:
            if exc.code != Code.BROKER_RUNNING or time.monotonic() > deadline:
                raise
        await anyio.sleep(0.1)


async def _admit_at_broker(
    args: argparse.Namespace,
    layout: Layout,
    adm: admit.Admission,
    conn: LazyConnection,
    monitors: list[str],
    embedded_broker: bool,
) -> tuple[list[dict[str, object]], list[Consent]]:
    """Gates 2 and 3, with the roster read and any eviction evidence they need: the `--monitor`
    endpoints, and the embedded broker's own answer over this connection (it has no HTTP
    monitor for seats to read)."""
    space = args.space
    js = await conn.jetstream()
    sources: list[ConnectionList] = [MonitorEndpoint(m) for m in monitors]
    if embedded_broker:
        sources.append(AccountConnz(await conn.client()))
    with phase("admission (presence)"):
        live = await live_uids(js, space)
    with phase("eviction evidence"):
        eviction = await evict_ghosts(
            js, space, {n: r.lifecycle_uid for n, r in adm.records.items()}, live, sources
        )
    for proof in eviction.evidence:
        servers = proof["servers"]
        assert isinstance(servers, list)
        _say(
            f"EVICTION EVIDENCE: seat {proof['seat']}: predecessor {proof['instanceId']} has no "
            f"broker connection ({proof['connectionsScanned']} scanned across {len(servers)} "
            "server(s))"
        )
    admit.identity(
        adm,
        space=space,
        root=layout.root,
        live_uids=set(eviction.live),
        held_uids=set(),
        settings_for=agent_settings(layout),
        home=Path(os.path.expanduser("~")),
        maps=relocate.parse_maps(args.map or []),
    )
    reading = clock.read_clock()
    if reading.source != "kernel":
        _say(f"clock: {reading.detail} stands in for the kernel's reading (a test hook)")
    consents = admit.recency(
        adm,
        now=datetime.now(UTC),
        clock=reading,
        accept_stale=args.accept_stale_checkpoint,
        skew_ms=registry.load_config(layout.root).recency.skew_s * 1000,
    )
    return eviction.evidence, consents


async def _restore(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    layout = Layout.at(root)
    src = Path(args.restore).resolve()
    # A bad COTAL_JOBS refuses before anything is admitted or claimed, not at the restore.
    concurrency.jobs()
    if _revives_broker(layout):
        await mesh.revive_embedded_broker(layout, _say)
    async with mesh.control(layout) as session, contextlib.AsyncExitStack() as on_exit:
        status = await session.status()
        if status is not None:
            # A rerun after this resume's coordinator died: the manager it started is still
            # fenced to the attempt (or already finalized it), so this run drives what is left.
            rejoined = await _rejoin(args, layout, src, session, status)
            if rejoined is None:
                out = await _adopt_into_mesh(args, layout, src, session, status, on_exit)
                out["wallMs"] = int((time.monotonic() - t0) * 1000)
                return out
            rows = await _seat_rows(session)
            adm = rejoined.pop("admission")
            rejoined["seats"] = _observations(adm, rejoined.pop("resumed"), rows)
            rejoined["wallMs"] = int((time.monotonic() - t0) * 1000)
            return rejoined
        # The manager's interpreter starts now and imports itself while this run admits,
        # claims and restores; it becomes the manager where one is started below.
        warm = on_exit.enter_context(warm_manager(layout.root))
        _say(f"admitting {src}")
        fresh_root = not layout.control.exists()
        if fresh_root:
            # Keeping the scratch made the control directory; a refusal leaves none behind.
            on_exit.callback(_rmdir_if_empty, layout.control)
        on_exit.callback(_rmdir_if_empty, layout.control / admit.SCRATCH_DIR)
        broker = _broker_for(args, layout)
        admitted, embedded_info, footprint = await _admit_while_broker_starts(
            args, layout, src, on_exit, broker
        )
        adm, sig, inboxes = admitted.admission, admitted.signer, admitted.inboxes
        _say(f"sealed by {signer_line(sig)}")
        if broker.embedded and embedded_info is None:
            _say("starting the embedded broker from this root's store")
            embedded_info = await _start_embedded(layout)
        if embedded_info is not None:
            broker = BrokerRef(embedded_info.url, layout.broker_creds, True)
        monitors = [m.strip() for m in (args.monitor or "").split(",") if m.strip()]
        async with LazyConnection(broker.server, broker.creds, name="cotal-resume") as conn:
            try:
                evidence, consents = await _admit_at_broker(
                    args, layout, adm, conn, monitors, embedded_info is not None
                )
                await checkpoints.check_handed_off(args, layout, adm, conn)
            except BaseException:
                await conn.aclose()
                if embedded_info is not None:
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(
                            embedded.stop_embedded, embedded_info.identity
                        )
                        # A refusal leaves the destination as it found it.
                        await anyio.to_thread.run_sync(footprint.undo)
                raise
            for c in consents:
                _say(
                    f"CONSENT: seat {c.seat} captured {c.captured_at} is {c.age_ms} ms old, beyond "
                    f"its {c.horizon_ms} ms horizon; admitted by --accept-stale-checkpoint"
                )
            _say("admitted: integrity, identity and recency pass for every seat")
            failpoint.reached("resume.after-admission", layout.root)
            try:
                with MaintenanceLock(layout, adm.manifest.attempt_id):
                    out = await _resume_locked(
                        args,
                        layout,
                        adm,
                        session,
                        conn,
                        broker,
                        embedded_info,
                        consents,
                        inboxes,
                        warm,
                    )
            except BaseException:
                await _release_broker(layout, embedded_info)
                raise
        out.update(evictionEvidence=evidence, signer=sig)
        rows = await _seat_rows(session)
    out["seats"] = _observations(adm, out.pop("resumed"), rows)
    out["wallMs"] = int((time.monotonic() - t0) * 1000)
    return out


async def _adopt_into_mesh(
    args: argparse.Namespace,
    layout: Layout,
    src: Path,
    session: ControlSession,
    status: control.StatusReply,
    on_exit: contextlib.AsyncExitStack,
) -> dict[str, Any]:
    """`up --restore` at a root whose manager runs: the same gates, claim, inbox import and
    restore, then the running manager adopts the seats beside the ones it runs (it answers the
    resume ops as an adoption and stays active). A taken name or a uid it already runs refuses
    before anything is claimed."""
    if status.state != "active":
        raise Refusal(
            Code.ALREADY_UP,
            f"a manager (pid {status.pid}) serves {layout.root} in state {status.state}, which "
            "adopts nothing",
            "let its cut or resume finish (or stop it with `cotal down`), then retry",
        )
    if status.space != args.space:
        raise Refusal(
            Code.WRONG_SPACE,
            f"the manager here serves space {status.space!r}, not {args.space!r}",
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
    broker = BrokerRef(record.server, creds, embedded_broker)
    _say(f"admitting {src} into the mesh this root runs (manager pid {status.pid})")
    adm = await admit_integrity(
        src,
        trusted_keys(args, layout),
        chain.search_dirs(layout),
        keep_in=layout.control / admit.SCRATCH_DIR,
    )
    on_exit.callback(admit.discard_scratch, adm)
    sig, inboxes = signer(adm, args, layout), _read_inboxes(adm)
    _say(f"sealed by {signer_line(sig)}")
    journal = Journal(layout).load() if layout.journal.exists() else None
    continuing = (
        journal is not None
        and journal.attempt_id == adm.manifest.attempt_id
        and journal.state in RESUME_UNDER_WAY
    )
    _refuse_taken(adm, await _seat_rows(session), continuing=continuing)
    monitors = [m.strip() for m in (args.monitor or "").split(",") if m.strip()]
    async with LazyConnection(broker.server, broker.creds, name="cotal-adopt") as conn:
        evidence, consents = await _admit_at_broker(
            args, layout, adm, conn, monitors, embedded_broker
        )
        await checkpoints.check_handed_off(args, layout, adm, conn)
        _say("admitted: integrity, identity and recency pass for every seat")
        failpoint.reached("resume.after-admission", layout.root)
        with MaintenanceLock(layout, adm.manifest.attempt_id):
            out = await _resume_locked(
                args, layout, adm, session, conn, broker, None, consents, inboxes, adopting=True
            )
    out.update(evictionEvidence=evidence, signer=sig, adopted=True)
    out["seats"] = _observations(adm, out.pop("resumed"), await _seat_rows(session))
    return out


def _refuse_taken(
    adm: admit.Admission, rows: dict[str, control.SeatRow], *, continuing: bool
) -> None:
    """The running mesh's names and uids against the checkpoint's, before any claim: a seat
    is never adopted over another, nor twice. A seat already here under its very uid passes
    only when the journal holds this attempt under way (a rerun continuing its adoption)."""
    by_uid = {row.lifecycle_uid: row.name for row in rows.values()}
    for name, rec in adm.records.items():
        row = rows.get(name)
        if row is not None and row.lifecycle_uid == rec.lifecycle_uid and not continuing:
            raise Refusal(
                Code.DUPLICATE_PRINCIPAL,
                f"seat {name} (uid {rec.lifecycle_uid}) already runs in this mesh: its "
                f"checkpoint {adm.manifest.attempt_id} was adopted here before",
                "a seat runs once; nothing was claimed",
            )
        if row is not None and row.lifecycle_uid != rec.lifecycle_uid:
            raise Refusal(
                Code.DUPLICATE_NAME,
                f"seat name {name!r} is taken in this mesh (uid {row.lifecycle_uid}); the "
                f"checkpoint's {name} is uid {rec.lifecycle_uid}",
                f"`cotal rm {name}` here first, or resume the checkpoint on another root; "
                "nothing was claimed",
            )
        other = by_uid.get(rec.lifecycle_uid)
        if other is not None and other != name:
            raise Refusal(
                Code.DUPLICATE_PRINCIPAL,
                f"lifecycle uid {rec.lifecycle_uid} of the checkpoint's seat {name} already runs "
                f"here as {other}",
                "a seat runs once; nothing was claimed",
            )


async def _admit_while_broker_starts(
    args: argparse.Namespace,
    layout: Layout,
    src: Path,
    on_exit: contextlib.AsyncExitStack,
    broker: BrokerRef,
) -> tuple[_Admitted, embedded.BrokerInfo | None, _BrokerFootprint]:
    """Gate 1 (with the signer and the carried inboxes read from what it admitted), and on a
    root that has no broker store yet the embedded broker's start beside
    it: admission is mostly git unbundling in a child process, and the broker's start is a
    process of its own, so on a new host neither waits for the other. A refusal stops that
    broker and removes what its start made (`_BrokerFootprint`), so the root is as it was; a
    root that already has a store must find it untouched after a refusal, so its broker starts
    only once admission passed. Admission's refusal is the one reported when both fail, as it
    would be one after the other."""
    footprint = _BrokerFootprint.before(layout)
    overlap = broker.embedded and not footprint.had_store
    admitted: list[_Admitted] = []
    started: list[embedded.BrokerInfo] = []
    failed: dict[str, Exception] = {}
    kept: list[admit.Admission] = []

    async def admission() -> None:
        # Shielded, as the broker's start is: each finishes, so what it made is known and can
        # be undone, whatever the other does.
        with anyio.CancelScope(shield=True):
            try:
                adm = await admit_integrity(
                    src,
                    trusted_keys(args, layout),
                    chain.search_dirs(layout),
                    keep_in=layout.control / admit.SCRATCH_DIR,
                )
                kept.append(adm)
                # Read here, so that their refusals, too, take back a broker started beside.
                admitted.append(_Admitted(adm, signer(adm, args, layout), _read_inboxes(adm)))
            except Exception as exc:
                failed["admission"] = exc

    async def start_broker() -> None:
        with anyio.CancelScope(shield=True):
            try:
                started.append(await _start_embedded(layout))
            except Exception as exc:
                failed["broker"] = exc

    try:
        async with anyio.create_task_group() as tg:
            if overlap:
                _say("starting the embedded broker from this root's store")
                tg.start_soon(start_broker)
            tg.start_soon(admission)
        failure = failed.get("admission") or failed.get("broker")
        if failure is not None:
            raise failure
    except BaseException:
        if started:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(embedded.stop_embedded, started[0].identity)
                await anyio.to_thread.run_sync(footprint.undo)
        raise
    finally:
        if kept:
            # Whatever happens next (a refusal, a rerun that restores nothing, the restore
            # done), what admission kept for the restore is removed when this run ends.
            on_exit.callback(admit.discard_scratch, kept[0])
    return admitted[0], started[0] if started else None, footprint


@dataclasses.dataclass(frozen=True)
class _Admitted:
    """What gate 1 passed, with the signer shown for it and each seat's carried messages."""

    admission: admit.Admission
    signer: dict[str, Any]
    inboxes: dict[str, CarriedSpace]


@dataclasses.dataclass(frozen=True)
class _BrokerFootprint:
    """Which of the paths an embedded broker's start makes were already there, so that a
    refusal can take back exactly the rest: the store, the broker's credential and its log,
    and the directories that hold them."""

    layout: Layout
    existed: frozenset[Path]

    @classmethod
    def before(cls, layout: Layout) -> _BrokerFootprint:
        paths = cls._paths(layout)
        return cls(layout, frozenset(p for p in paths if os.path.lexists(p)))

    @staticmethod
    def _paths(layout: Layout) -> tuple[Path, ...]:
        # Files first, then the directories holding them, innermost first.
        return (
            layout.broker_creds,
            layout.logs / "nats.log",
            layout.nats_store,
            layout.auth,
            layout.logs,
            layout.control,
        )

    @property
    def had_store(self) -> bool:
        return self.layout.nats_store in self.existed

    def undo(self) -> None:
        made = [p for p in self._paths(self.layout) if p not in self.existed]
        if self.layout.control in made:
            # Only what this run made is under a control directory it created.
            shutil.rmtree(self.layout.control, ignore_errors=True)
            return
        for path in made:
            if path == self.layout.nats_store:
                shutil.rmtree(path, ignore_errors=True)
            elif path in (self.layout.auth, self.layout.logs):
                _rmdir_if_empty(path)
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()


async def _release_broker(layout: Layout, embedded_info: embedded.BrokerInfo | None) -> None:
    """No refusal leaves the broker this run started behind (one broker per store), unless a
    manager already runs on it: from `mesh.start` on, the broker is that manager's, named in
    its mesh record, and stopping it would cut the fenced manager off its broker."""
    if embedded_info is None:
        return
    record = mesh.read_mesh(layout)
    if record is not None and record.manager and record.embedded_broker == embedded_info.identity:
        return
    await mesh.stop_started_broker(embedded_info.identity)


def _revives_broker(layout: Layout) -> bool:
    """A resume under way needs the broker it ran on before anything else is asked of it."""
    if not layout.journal.exists():
        return False
    record = Journal(layout).load()
    return record is not None and rerun(record.state, "restore").revive_broker


async def _rejoin(
    args: argparse.Namespace,
    layout: Layout,
    src: Path,
    session: ControlSession,
    status: control.StatusReply,
) -> dict[str, Any] | None:
    """Finish a resume whose coordinator died after it started the manager, or None when the
    running manager is not this root's pending resume. Admission, custody and the restore of
    the trees are behind it (the manager is started only after them), so what is left is the
    manager's three resume ops, each of which answers a repeat with what it already did."""
    journal = Journal(layout)
    record = journal.load() if layout.journal.exists() else None
    if record is None or record.state not in RESUME_UNDER_WAY:
        return None
    attempt = record.attempt_id
    fenced = (
        status.state in ("resume-required", "resuming", "awaiting-finalize")
        and status.attempt_id == attempt
    )
    # An adoption's finalize has not run while its manager still names it.
    finalized = (
        status.state == "active" and record.state == RESUME_COMMITTED and status.adopting != attempt
    )
    if not (fenced or finalized):
        return None
    adm = await admit_integrity(src, trusted_keys(args, layout), chain.search_dirs(layout))
    if adm.manifest.attempt_id != attempt:
        raise Refusal(
            Code.ATTEMPT_MISMATCH,
            f"this root's manager is resuming attempt {attempt}, not {adm.manifest.attempt_id} "
            f"from {src}",
            f"rerun `cotal up --restore` with the checkpoint of attempt {attempt} to finish it",
        )
    sig = signer(adm, args, layout)
    _say(
        f"continuing resume {attempt} from journal state {record.state} "
        f"(manager pid {status.pid} is {status.state})"
    )
    descriptor, consents = record.resume, list(record.consents)
    token = record.durable_commit_token
    with MaintenanceLock(layout, attempt):
        if finalized:
            # Finalize ran; only its journal entry is missing. The manager answers a repeat.
            resumed = [
                _Resumed(name, rec.session.continuity, "resumed by the run that was interrupted")
                for name, rec in adm.records.items()
            ]
        else:
            resumed, token = await _resume_and_commit(
                session,
                journal,
                attempt,
                journal.resume_document(record),
                descriptor,
                consents,
                root=layout.root,
                # A journal already past resume-intent keeps its state: the manager answered a
                # repeat of what was journaled.
                advance_active=record.state not in RESUME_ADOPTED,
            )
        assert token is not None
        final = await _finalize(session, journal, attempt, descriptor, consents, token)
    return {
        "attemptId": attempt,
        "state": final.state,
        "journal": RETIRED,
        "continued": True,
        "claims": [],
        "restored": [],
        "consents": [msgspec.to_builtins(c) for c in consents],
        "resumed": resumed,
        "admission": adm,
        "evictionEvidence": [],
        "signer": sig,
    }


async def _resume_locked(
    args: argparse.Namespace,
    layout: Layout,
    adm: admit.Admission,
    session: ControlSession,
    conn: LazyConnection,
    broker: BrokerRef,
    embedded_info: embedded.BrokerInfo | None,
    consents: list[Consent],
    inboxes: dict[str, CarriedSpace],
    warm: WarmManager | None = None,
    *,
    adopting: bool = False,
) -> dict[str, Any]:
    """Journal, custody, inboxes, restore, then the manager's three resume ops, under the
    lock. `adopting`: the manager already runs this root's mesh and adopts the seats."""
    space = args.space
    attempt = adm.manifest.attempt_id
    inventory = adm.inventory
    # Read before anything is journaled or claimed, as the recency gate read it.
    config = registry.load_config(layout.root)
    horizon_s = config.recency.horizon_s
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
    # Past `resume-active` the trees were restored, the inboxes imported and the manager ran
    # the seats, which may have worked since: a rerun after that manager died restarts a
    # manager fenced to the attempt over what is there now and never restores again.
    relaunch = record is not None and record.state in RESUME_ADOPTED
    if relaunch:
        assert record is not None
        _say(
            f"continuing resume {attempt} from journal state {record.state}: its manager died; "
            "the trees and inboxes stay as the seats left them"
        )
    else:
        journal.advance(attempt, RESUME_INTENT, resume=descriptor, consents=consents)
    failpoint.reached("resume.after-resume-intent", layout.root)
    identity = load_or_create_identity(layout, space)
    _say("claiming custody (writer generation N+1) in this root and at the broker")
    local: list[tuple[str, int]] = []
    try:
        for name, rec in adm.records.items():
            local.append(
                (
                    name,
                    claim_successor(
                        layout,
                        space,
                        name,
                        rec.lifecycle_uid,
                        rec.generation,
                        identity.instance_id,
                        attempt,
                    ),
                )
            )
        js = await conn.jetstream()
        with phase("broker identity"):
            shared = await _shares_source_broker(js, adm)
        if shared:
            with phase("custody claim"):
                claims = await custody.claim_attempt(
                    js,
                    adm.manifest.space,
                    attempt,
                    adm.records,
                    holder=identity.instance_id,
                    root=layout.root,
                )
        else:
            _say(NO_FENCE_NOTE)
            with phase("custody claim (continued in this broker)"):
                claims = await custody.claim_across(
                    js,
                    adm.manifest.space,
                    attempt,
                    adm.records,
                    holder=identity.instance_id,
                    root=layout.root,
                    replicas=_replicas(args, broker),
                )
    except Refusal as exc:
        # Lost before any tree was touched: give back what this root claimed and say why.
        for name, generation in local:
            withdraw_claim(
                layout,
                space,
                name,
                adm.records[name].lifecycle_uid,
                generation,
                identity.instance_id,
                attempt,
            )
        journal.advance(
            attempt,
            DEGRADED,
            resume=descriptor,
            consents=consents,
            degraded=Degraded(
                reason=exc.message[:4000], recourse=(exc.cure or "see the message")[:4000]
            ),
        )
        raise
    failpoint.reached("resume.after-custody-claim", layout.root)
    inbox: list[dict[str, Any]] = []
    restored: list[dict[str, Any]] = []
    if not relaunch:
        # Both under custody and before the manager starts (its lifecycle proof needs each
        # durable here, and each seat its tree). The import waits on the broker and the restore
        # on git, and neither touches what the other does, so each runs beside the other.
        inbox, restored = await _beside(
            functools.partial(
                _import_inboxes,
                args,
                adm,
                js,
                broker,
                inboxes,
                shared=shared,
                horizon_s=horizon_s,
                channels=config.channels,
            ),
            functools.partial(_restore_all, layout, adm),
        )
    # The broker's last use by this coordinator: the manager is its client from here on, and
    # an embedded broker passes to the manager's mesh record as it runs.
    await conn.aclose()
    failpoint.reached("resume.after-trees-restored", layout.root)
    if adopting:
        _say("handing the seats to the running manager (its other seats carry on)")
    else:
        _say("starting the manager fenced to this attempt")
        server, creds = None, None
        if embedded_info is None:
            server, creds = broker.server, str(broker.creds) if broker.creds else None
        await mesh.start(
            layout.root,
            session,
            space=space,
            server=server,
            creds=creds,
            report=_say,
            resume_attempt=attempt,
            broker=embedded_info,
            warm=warm,
        )
        failpoint.reached("resume.after-manager-started", layout.root)
    resumed, token = await _resume_and_commit(
        session,
        journal,
        attempt,
        inventory,
        descriptor,
        consents,
        root=layout.root,
        advance_active=not relaunch,
    )
    final = await _finalize(session, journal, attempt, descriptor, consents, token)
    return {
        "attemptId": attempt,
        "state": final.state,
        "journal": RETIRED,
        "continued": relaunch,
        "claims": claims,
        "sharedBroker": shared,
        "inbox": inbox,
        "restored": restored,
        "consents": [msgspec.to_builtins(c) for c in consents],
        "resumed": resumed,
    }


async def _beside(
    first: Callable[[], Awaitable[A]], second: Callable[[], Awaitable[B]]
) -> tuple[A, B]:
    """Both run to their end, whatever the other does: neither is left half done to be taken
    up again by a rerun. The first's failure is the one raised when both fail, as it would be
    one after the other."""
    results: dict[str, Any] = {}
    failed: dict[str, Exception] = {}

    async def run(key: str, step: Callable[[], Awaitable[Any]]) -> None:
        try:
            results[key] = await step()
        except Exception as exc:
            failed[key] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "first", first)
        tg.start_soon(run, "second", second)
    failure = failed.get("first") or failed.get("second")
    if failure is not None:
        raise failure
    return results["first"], results["second"]


async def _import_inboxes(
    args: argparse.Namespace,
    adm: admit.Admission,
    js: JetStreamContext,
    broker: BrokerRef,
    inboxes: dict[str, CarriedSpace],
    *,
    shared: bool,
    horizon_s: int,
    channels: registry.ChannelsConfig,
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name, record in adm.records.items():
        state = record.space_state
        if state is None:
            continue
        with phase(f"inbox import ({name})"):
            done = await import_inbox(
                js,
                adm.manifest.space,
                name,
                record.lifecycle_uid,
                state.durable,
                inboxes[name].inbox,
                attempt_id=adm.manifest.attempt_id,
                shared=shared,
                replicas=_replicas(args, broker),
                # A stream made here is the one this root's manager runs on: made with the
                # duplicate window that manager keeps, so a rerun's republish and a resumed
                # turn's sends are dropped inside the same horizon.
                horizon_s=horizon_s,
            )
        if done.kept:
            _say(f"{name}: inbox durable already at this broker; kept with its frontier")
        else:
            _say(
                f"{name}: inbox rebuilt at sequence {done.start_seq} with {done.republished} "
                f"carried message(s) ({done.duplicates} already here)"
            )
        frontiers = []
        for c in state.channels:
            with phase(f"channel import ({name} #{c.channel})"):
                got = await frontier.import_frontier(
                    js,
                    adm.manifest.space,
                    name,
                    record.lifecycle_uid,
                    c,
                    inboxes[name].posts[c.channel],
                    attempt_id=adm.manifest.attempt_id,
                    shared=shared,
                    history=channels.history,
                    max_age_s=channels.max_age_s,
                    replicas=_replicas(args, broker),
                    horizon_s=horizon_s,
                )
            if got.kept:
                _say(f"{name}: #{c.channel} frontier already at this broker; kept")
            else:
                _say(
                    f"{name}: #{c.channel} frontier rebuilt at sequence {got.start_seq} with "
                    f"{got.republished} unread post(s), on the seat's own subject"
                )
            frontiers.append({"channel": c.channel, **_imported_row(got)})
        out.append({"name": name, **_imported_row(done), "channels": frontiers})
    return out


def _imported_row(done: Imported) -> dict[str, Any]:
    return {
        "kept": done.kept,
        "startSeq": done.start_seq,
        "republished": done.republished,
        "duplicates": done.duplicates,
    }


async def _seat_rows(session: ControlSession) -> dict[str, control.SeatRow]:
    rows = await session.request(control.PS, control.NoArgs(), timeout=RESUME_TIMEOUT_S)
    return {row.name: row for row in rows}


def _observations(
    adm: admit.Admission, resumed: list[_Resumed], rows: dict[str, control.SeatRow]
) -> list[dict[str, Any]]:
    """Record 6 step 9: what each seat was before the cut against what the manager runs now."""
    observations = []
    for seat in resumed:
        rec = adm.records[seat.name]
        row = rows.get(seat.name)
        session_after = row.session_id if row is not None else None
        uid_after = row.lifecycle_uid if row is not None else None
        moved = relocation_of(adm, seat.name)
        observations.append(
            {
                **moved,
                "name": seat.name,
                "continuity": seat.continuity,
                "observation": moved.get("relocationNote") or seat.observation,
                "sessionBefore": rec.session.session_id,
                "sessionAfter": session_after,
                "uidBefore": rec.lifecycle_uid,
                "uidAfter": uid_after,
                "sameSession": rec.session.session_id is not None
                and rec.session.session_id == session_after,
                "sameUid": rec.lifecycle_uid == uid_after,
            }
        )
    return observations


async def _resume_and_commit(
    session: ControlSession,
    journal: Journal,
    attempt: str,
    inventory: Inventory,
    descriptor: ResumeDescriptor | None,
    consents: list[Consent],
    *,
    root: Path,
    advance_active: bool = True,
) -> tuple[list[_Resumed], str]:
    """`resume-preserved`, then `commit-resume`, each journaled as soon as it answers: a rerun
    after a death at any point continues from what the journal says."""
    resume = control.ResumeArgs(
        attempt_id=attempt, inventory=msgspec.Raw(encode_inventory(inventory))
    )
    result = await session.request(control.RESUME_PRESERVED, resume, timeout=RESUME_TIMEOUT_S)
    failpoint.reached("resume.after-resume-preserved", root)
    if advance_active:
        journal.advance(attempt, RESUME_ACTIVE, resume=descriptor, consents=consents)
    failpoint.reached("resume.after-resume-active", root)
    commit = await session.request(
        control.COMMIT_RESUME, control.AttemptArgs(attempt_id=attempt), timeout=RESUME_TIMEOUT_S
    )
    failpoint.reached("resume.after-commit-resume", root)
    token = commit.durable_commit_token
    journal.advance(
        attempt,
        RESUME_COMMITTED,
        resume=descriptor,
        consents=consents,
        durable_commit_token=token,
    )
    failpoint.reached("resume.after-resume-committed", root)
    return [_Resumed(s.name, s.continuity, s.observation) for s in result.seats], token


async def _finalize(
    session: ControlSession,
    journal: Journal,
    attempt: str,
    descriptor: ResumeDescriptor | None,
    consents: list[Consent],
    token: str,
) -> control.AttemptState:
    """Only `finalize-resume` with the journaled token releases the fence; then `retired`.

    A broker that died since the commit is started again first and after: the resume must not
    report a mesh as running whose broker is gone."""
    await mesh.revive_embedded_broker(journal.layout, _say)
    final = await session.request(
        control.FINALIZE_RESUME,
        control.FinalizeArgs(attempt_id=attempt, durable_commit_token=token),
        timeout=RESUME_TIMEOUT_S,
    )
    failpoint.reached("resume.after-finalize", journal.layout.root)
    journal.advance(
        attempt, RETIRED, resume=descriptor, consents=consents, durable_commit_token=token
    )
    await mesh.revive_embedded_broker(journal.layout, _say)
    return final


def run_restore(args: argparse.Namespace, root: Path) -> int:
    # A packed FILE resumes from its unpacked staging directory like any carried directory.
    with checkpoints.packed_source(args, root):
        out = eventloop.run(_restore, args, root)
    _print(args, out)
    return 0


async def _restore_all(layout: Layout, adm: admit.Admission) -> list[dict[str, Any]]:
    """Restore each distinct working tree once, then place every seat's session files.

    Seats that share a cwd were captured from the same stopped tree, so their records must
    agree; restoring it once per seat would only stack superseded copies beside it. Distinct
    trees are restored a few at once (`manager/concurrency.py`); what is printed and returned
    keeps seat order, and the refusal is the first failing tree in seat order.
    """
    stamp = file_stamp()
    dirs = {s.name: s.dir for s in adm.manifest.seats}
    first_of: dict[Path, str] = {}
    for name, record in adm.records.items():
        cwd = adm.confined[name].cwd
        first = first_of.setdefault(cwd, name)
        if first == name:
            continue
        other = adm.records[first].repository
        if (record.repository.base, record.repository.files()) != (
            other.base,
            other.files(),
        ) or (record.repository.status, record.repository.status_file) != (
            other.status,
            other.status_file,
        ):
            # Checked before any tree is touched: nothing is restored for a checkpoint
            # whose shared trees disagree.
            raise Refusal(
                Code.INCONSISTENT_CHECKPOINT,
                f"seats {first} and {name} share {cwd} but their checkpoints record "
                "different trees",
                "cut the seats again; a shared tree is captured once, stopped",
            )

    # A tree inside another (or around it) is restored in the same job, after the one before
    # it in seat order, as from a loop: restoring one replaces the other's directory.
    trees = list(first_of)
    groups: list[list[Path]] = []
    for cwd in trees:
        nested = [
            g for g in groups if any(cwd.is_relative_to(t) or t.is_relative_to(cwd) for t in g)
        ]
        merged = [t for t in trees if t == cwd or any(t in g for g in nested)]
        groups = [g for g in groups if g not in nested] + [merged]
    groups.sort(key=lambda g: trees.index(g[0]))

    async def restore(group: list[Path]) -> dict[Path, concurrency.Outcome[RestoreResult]]:
        done: dict[Path, concurrency.Outcome[RestoreResult]] = {}
        for cwd in group:
            try:
                done[cwd] = concurrency.Outcome(value=await _restore_tree(cwd))
            except Exception as exc:
                done[cwd] = concurrency.Outcome(error=exc)
                break
        return done

    async def _restore_tree(cwd: Path) -> RestoreResult:
        name = first_of[cwd]
        keep = (".cotal",) if cwd == layout.root else ()
        result = await restore_repository(
            adm.attempt_dir / dirs[name],
            adm.records[name].repository,
            cwd,
            stamp=stamp,
            keep_paths=keep,
            confine_to=adm.confine_to or (layout.root,),
            dest_root=layout.root,
            maps=adm.maps,
            links=adm.chains.get(name, ()),
            scratch=adm.scratch.get(name),
        )
        if keep and result.superseded is not None:
            _keep_host_config(layout.root, result.superseded)
        return result

    for cwd in trees:
        _say(f"restoring {first_of[cwd]} into {cwd}")
    outcomes = await concurrency.ordered_map(restore, groups, concurrency.limiter())
    # Each tree took its packs (or fell back); what is left, a shared tree's other seats'
    # copies included, is not needed past this point.
    admit.discard_scratch(adm)
    by_tree: dict[Path, concurrency.Outcome[RestoreResult]] = {}
    for outcome in outcomes:
        by_tree.update(outcome.unwrap())
    # The refusal is the first failing tree in seat order; a tree its group never reached
    # comes after one that failed.
    restored = {cwd: by_tree[cwd].unwrap() for cwd in trees}
    out = []
    for name in adm.records:
        # The identity gate confined every path this seat writes; restore exactly those.
        confined = adm.confined[name]
        cwd = confined.cwd
        if first_of[cwd] != name:
            _say(f"{name} shares {cwd} with {first_of[cwd]}: already restored")
        result = restored[cwd]
        placed = [
            place_session_file(
                adm.attempt_dir / dirs[name] / entry.file.file,
                target,
                expected_sha256=entry.file.sha256,
            )
            for entry, target in confined.sessions
        ]
        out.append(
            {
                "name": name,
                "cwd": str(cwd),
                "superseded": str(result.superseded) if result.superseded else None,
                "sessionFiles": len(placed),
            }
        )
    return out


def _rmdir_if_empty(path: Path) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def _keep_host_config(root: Path, aside: Path) -> None:
    """Put this host's cotal.toml back at the root after the root's tree was replaced.

    It holds this host's bindings (binary paths, endpoints, key sources), the ones admission
    just read; the seat's tree must not take them away. A tree that carries its own cotal.toml
    keeps it, and the operator is told whose bindings the manager now reads."""
    mine, restored = aside / registry.CONFIG_NAME, root / registry.CONFIG_NAME
    if not os.path.lexists(mine):
        return
    if os.path.lexists(restored):
        _say(
            f"note: the restored tree carries its own {restored}; this host's is kept at {mine}. "
            "Move it back if the manager should use this host's bindings"
        )
        return
    os.rename(mine, restored)


def _print(args: argparse.Namespace, out: dict[str, Any]) -> None:
    if args.json:
        sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
        return
    w = sys.stdout.write
    w(
        f"resumed attempt {out['attemptId']}: manager {out['state']}, "
        f"journal {out['journal']} ({out['wallMs']} ms)\n"
    )
    for s in out["seats"]:
        w(f"  {s['name']:<16} {s['continuity']:<10} {s['observation']}\n")
        w(
            f"    session  {s['sessionBefore']} -> {s['sessionAfter']}  "
            f"({'same' if s['sameSession'] else 'different'})\n"
        )
        w(
            f"    uid      {s['uidBefore']} -> {s['uidAfter']}  "
            f"({'same' if s['sameUid'] else 'DIFFERENT'})\n"
        )
    # What stood in a tree before the restore is moved, never deleted: say where, once per tree.
    for aside in sorted({r["superseded"] for r in out["restored"] if r["superseded"]}):
        w(f"  kept the tree that stood there before at {aside} (remove it once not needed)\n")
    w("next: cotal send NAME 'what was the phrase?' --wait\n")
