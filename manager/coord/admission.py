"""Admission as a destination does it: gate 1 (beside the embedded broker's start on a new
root), the signer shown for it, each seat's carried messages, and gates 2 and 3 with the
roster read and the eviction evidence they need. `cotal checkpoint verify` runs the same gates
and changes nothing; `cotal up --restore` and a move's destination run them before they claim.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import msgspec
from msgspec import UNSET, UnsetType

from connectors.privatefs import ensure_private_dir, read_stable
from manager import registry
from manager.broker import embedded
from manager.broker.bounds import default_replicas
from manager.broker.connection import LazyConnection
from manager.broker.deadletter import dead_subject
from manager.broker.evict import AccountConnz, ConnectionList, MonitorEndpoint, evict_ghosts
from manager.broker.presence import live_uids
from manager.broker.retry import phase
from manager.checkpoint import admit, chain, clock, relocate
from manager.coord import mesh
from manager.coord.records import ChainLink, EvictionProof, Relocated, Signer
from manager.coord.report import say as _say
from manager.coord.requests import RestoreRequest
from manager.procs import pid_identity
from manager.workspace import trust
from manager.workspace.layout import Layout
from protocol import control, names
from protocol.checkpoint import (
    INBOX_FILE_CAP,
    CarriedMessage,
    ChannelState,
    DeadLetterState,
    FileRef,
    SentEntry,
    SpaceRecord,
    decode_inbox,
)
from protocol.deadletter import decode_dead_letters
from protocol.errors import Refusal
from protocol.maintenance import (
    ClockNote,
    Consent,
)
from protocol.refusals import Code
from protocol.sentledger import SENT_LINE_CAP, decode_sent


@dataclass(frozen=True)
class BrokerRef:
    server: str
    creds: Path | None
    embedded: bool


def agent_settings(cfg: registry.FileConfig) -> dict[str, Mapping[str, Any]]:
    """This host's settings per known agent: the identity gate compares the recorded profile."""
    return {agent: registry.agent_settings(cfg, agent) for agent in registry.KNOWN}


def trusted_keys(layout: Layout, space: str, pins: Sequence[str]) -> list[str]:
    """Which signers a destination admits: this root's own instance key for the space, the
    operator's trust store (`cotal trust add`), and any `--trust-signer` pins for this run."""
    return trust.trusted_keys_for(layout, space, list(pins))


def signer(adm: admit.Admission, layout: Layout, space: str, pins: Sequence[str]) -> Signer:
    sealed_by = adm.manifest.signer
    assert sealed_by is not None
    return Signer(
        instance_id=sealed_by.instance_id,
        public_key=sealed_by.public_key,
        fingerprint=trust.fingerprint(sealed_by.public_key),
        pinned=sealed_by.public_key in pins,
        trusted_as=trust.why_trusted(layout, space, list(pins), sealed_by.public_key),
    )


def signer_line(sig: Signer) -> str:
    return (
        f"instance {sig.instance_id} key {sig.public_key} "
        f"({sig.fingerprint}; trusted: {sig.trusted_as})"
    )


@dataclass(frozen=True)
class Relocation:
    """Where an admitted seat runs here (`relocated`, when its tree moved), the class its
    harness can promise there when that is less than the recorded one (`continuity`, with
    why), and what a `--map`'s restore finds at the tree (`landing`)."""

    relocated: Relocated | UnsetType = UNSET
    continuity: str | None = None
    note: str | UnsetType = UNSET
    landing: str | UnsetType = UNSET


def relocation_of(adm: admit.Admission, name: str) -> Relocation:
    """A resume continued from its journal skips the identity gate (the first run passed it
    and journaled the relocated plan), so it has nothing to add."""
    confined = adm.confined.get(name)
    if confined is None:
        return Relocation()
    reloc = confined.reloc
    moved: Relocated | UnsetType = UNSET
    if reloc is not None and reloc.moves:
        moved = Relocated(cwd_before=str(reloc.old_cwd), cwd_after=str(reloc.new_cwd))
    landing = adm.landings.get(name)
    return Relocation(
        relocated=moved,
        continuity=confined.continuity,
        note=confined.why if confined.continuity is not None else UNSET,
        # Only its own repository is moved aside by a --map's restore.
        landing=landing if landing is not None else UNSET,
    )


LANDING_SHOWN = {
    "absent": "created by the restore",
    "empty": "an empty directory, filled by the restore",
    "same-repository": "the same repository, moved aside by the restore",
}


def chain_of(adm: admit.Admission, name: str) -> list[ChainLink]:
    """An incremental seat's proven predecessors, oldest first: where each was found and the
    bytes of its bundle. None for a seat whose bundle carries its whole history."""
    return [
        ChainLink(
            attempt_id=link.attempt_id,
            # A pre-copied bundle lies in a directory of bundles, not in a seat's directory.
            dir=str(
                link.seat_dir if link.attempt_id == chain.PRECOPY_LABEL else link.seat_dir.parent
            ),
            bundle_bytes=link.bundle.bytes if link.bundle is not None else 0,
        )
        for link in adm.chains.get(name, [])
    ]


async def admit_integrity(
    src: Path, trusted: list[str], search: tuple[Path, ...] = (), keep_in: Path | None = None
) -> admit.Admission:
    """Gate 1 reads and hashes every file of the attempt: off the event loop. An incremental
    seat's predecessors are looked for beside `src`, then under `search` (`chain.search_dirs`).
    `keep_in` keeps the unbundled repositories for the restore (`admit.integrity`)."""
    if src.exists() and not src.is_dir():
        raise Refusal(
            Code.NOT_A_CHECKPOINT,
            f"{src} is a file, not a checkpoint directory",
            "pass the attempt directory the cut printed (.cotal/maintenance/v1/checkpoints/"
            "<attempt>, or its copy), not a file inside it",
        )
    try:
        return await anyio.to_thread.run_sync(
            functools.partial(
                admit.integrity, src, trusted_keys=trusted, search=search, keep_in=keep_in
            )
        )
    except OSError as exc:
        # The gates name every problem they expect; what is left is the filesystem refusing.
        raise Refusal(
            Code.NOT_A_CHECKPOINT,
            f"{src} cannot be read as a checkpoint: {exc.strerror or exc} ({exc.filename or src})",
            "pass a readable checkpoint directory, copied whole",
        ) from None


def broker_for(req: RestoreRequest, layout: Layout) -> BrokerRef:
    """`--server`, or this root's embedded broker: its own store, or a new one, into which the
    checkpoint's inboxes are imported before the manager starts."""
    if req.server:
        return BrokerRef(req.server, Path(req.creds).resolve() if req.creds else None, False)
    return BrokerRef("", layout.broker_creds, True)


def replicas(req: RestoreRequest, broker: BrokerRef) -> int:
    if broker.embedded:
        return 1
    return int(req.replicas) if req.replicas else default_replicas(broker.server)


@dataclasses.dataclass(frozen=True)
class CarriedSpace:
    """One seat's carried messages, as admitted: its inbox, and each subscribed channel's posts
    above its frontier."""

    inbox: list[CarriedMessage]
    posts: dict[str, list[CarriedMessage]]
    # Its dead letters, which the import keeps as dead letters (`space.import_dead_letters`).
    dead: list[CarriedMessage] = dataclasses.field(default_factory=list)
    # Its sent ledger, which the import writes into this broker's (`sent.import_entries`).
    sent: list[SentEntry] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Admitted:
    """What gate 1 passed, with the signer shown for it and each seat's carried messages."""

    admission: admit.Admission
    signer: Signer
    inboxes: dict[str, CarriedSpace]


def _not_its_record(path: Path, name: str, exc: ValueError) -> Refusal:
    return Refusal(
        Code.INTEGRITY,
        f"checkpoint integrity: {path} does not match seat {name}'s record: {exc}",
        "copy the attempt directory again from the source host, or cut a new checkpoint; "
        "nothing was changed",
    )


def _read_proven(path: Path, ref: FileRef, *, cap: int) -> bytes:
    """A carried file's bytes, exactly as its record names them (size and digest), refused by
    name past `cap` before a byte is read."""
    if ref.bytes > cap:
        raise Refusal(
            Code.INTEGRITY,
            f"checkpoint integrity: {path} is named at {ref.bytes} bytes, more than the "
            f"{cap} it can be",
            "copy the attempt directory again from the source host, or cut a new checkpoint; "
            "nothing was changed",
        )
    data = read_stable(path, cap=ref.bytes, what="carried inbox").data
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != ref.bytes or digest != ref.sha256:
        raise Refusal(
            Code.INTEGRITY,
            f"checkpoint integrity: {path} changed after admission (now {len(data)} bytes "
            f"hashing to {digest})",
            "retry once nothing writes to the checkpoint; nothing was changed",
        )
    return data


def _read_carried(
    path: Path,
    ref: FileRef,
    part: SpaceRecord | ChannelState | DeadLetterState,
    name: str,
    *,
    dead_subject: str = "",
) -> list[CarriedMessage]:
    data = _read_proven(path, ref, cap=INBOX_FILE_CAP)
    try:
        if isinstance(part, DeadLetterState):
            return decode_dead_letters(data, part, dead_subject)
        return decode_inbox(data, part)
    except ValueError as exc:
        raise _not_its_record(path, name, exc) from None


def _read_dead(adm: admit.Admission, seat_dir: Path, name: str) -> list[CarriedMessage]:
    """A seat's carried dead letters, hashed as they are read and proven against their record,
    each on the seat's own dead-letter subject."""
    record = adm.records[name]
    state = record.space_state
    if state is None or state.dead_letters is None:
        return []
    subject = dead_subject(adm.manifest.space, names.SEAT_OWNER, name, record.lifecycle_uid)
    ref = state.dead_letters.file
    return _read_carried(seat_dir / ref.file, ref, state.dead_letters, name, dead_subject=subject)


def _read_sent(adm: admit.Admission, seat_dir: Path, name: str) -> list[SentEntry]:
    """A seat's carried sent ledger, hashed as it is read and proven against its record."""
    state = adm.records[name].space_state
    if state is None or state.sent is None:
        return []
    ref = state.sent.file
    path = seat_dir / ref.file
    data = _read_proven(path, ref, cap=state.sent.entries * (SENT_LINE_CAP + 1))
    try:
        return decode_sent(data, state.sent)
    except ValueError as exc:
        raise _not_its_record(path, name, exc) from None


def read_inboxes(adm: admit.Admission) -> dict[str, CarriedSpace]:
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
        seat_dir = adm.attempt_dir / dirs[name]
        if kept is not None:
            out[name] = CarriedSpace(
                inbox=kept[state.inbox.file],
                posts={c.channel: kept[c.posts.file] for c in state.channels},
                dead=_read_dead(adm, seat_dir, name),
                sent=_read_sent(adm, seat_dir, name),
            )
            continue
        out[name] = CarriedSpace(
            dead=_read_dead(adm, seat_dir, name),
            sent=_read_sent(adm, seat_dir, name),
            inbox=_read_carried(seat_dir / state.inbox.file, state.inbox, state, name),
            posts={
                c.channel: _read_carried(seat_dir / c.posts.file, c.posts, c, name)
                for c in state.channels
            },
        )
    return out


async def start_embedded(layout: Layout) -> embedded.BrokerInfo:
    for directory in (layout.control, layout.auth, layout.logs):
        ensure_private_dir(directory)
    try:
        return await mesh.start_root_broker(layout)
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
            return await mesh.start_root_broker(layout)
        except Refusal as exc:
            if exc.code != Code.BROKER_RUNNING or time.monotonic() > deadline:
                raise
        await anyio.sleep(0.1)


async def gate_one(
    req: RestoreRequest,
    layout: Layout,
    src: Path,
    *,
    kept: Callable[[admit.Admission], None],
) -> Admitted:
    """Gate 1, keeping the unbundled repositories for the restore (`kept` is told of them at
    once, so they are removed whatever follows), with the signer shown for it and each seat's
    carried messages read from what it admitted: their refusals are admission's too."""
    adm = await admit_integrity(
        src,
        trusted_keys(layout, req.space, req.trust_signer),
        chain.search_dirs(layout),
        keep_in=layout.control / admit.SCRATCH_DIR,
    )
    kept(adm)
    return Admitted(adm, signer(adm, layout, req.space, req.trust_signer), read_inboxes(adm))


async def admit_while_broker_starts(
    req: RestoreRequest,
    layout: Layout,
    src: Path,
    on_exit: contextlib.AsyncExitStack,
    broker: BrokerRef,
) -> tuple[Admitted, embedded.BrokerInfo | None, BrokerFootprint]:
    """Gate 1 (with the signer and the carried inboxes read from what it admitted), and on a
    root that has no broker store yet the embedded broker's start beside
    it: admission is mostly git unbundling in a child process, and the broker's start is a
    process of its own, so on a new host neither waits for the other. A refusal stops that
    broker and removes what its start made (`BrokerFootprint`), so the root is as it was; a
    root that already has a store must find it untouched after a refusal, so its broker starts
    only once admission passed. Admission's refusal is the one reported when both fail, as it
    would be one after the other."""
    footprint = BrokerFootprint.before(layout)
    overlap = broker.embedded and not footprint.had_store
    admitted: list[Admitted] = []
    started: list[embedded.BrokerInfo] = []
    failed: dict[str, Exception] = {}
    kept: list[admit.Admission] = []

    async def admission() -> None:
        # Shielded, as the broker's start is: each finishes, so what it made is known and can
        # be undone, whatever the other does.
        with anyio.CancelScope(shield=True):
            try:
                admitted.append(await gate_one(req, layout, src, kept=kept.append))
            except Exception as exc:
                failed["admission"] = exc

    async def start_broker() -> None:
        with anyio.CancelScope(shield=True):
            try:
                started.append(await start_embedded(layout))
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
class BrokerFootprint:
    """Which of the paths an embedded broker's start makes were already there, so that a
    refusal can take back exactly the rest: the store, the broker's credential and its log,
    and the directories that hold them."""

    layout: Layout
    existed: frozenset[Path]

    @classmethod
    def before(cls, layout: Layout) -> BrokerFootprint:
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
                rmdir_if_empty(path)
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()


@dataclass(frozen=True)
class AtBroker:
    """What gates 2 and 3 found: the eviction evidence, the consents taken, who vouched for the
    clock (when not the kernel), and this root's `cotal.toml` as the gates read it."""

    evidence: list[EvictionProof]
    consents: list[Consent]
    clock: ClockNote | None
    config: registry.FileConfig


async def admit_at_broker(
    req: RestoreRequest,
    layout: Layout,
    adm: admit.Admission,
    conn: LazyConnection,
    monitors: list[str],
    embedded_broker: bool,
) -> AtBroker:
    """Gates 2 (with the harness versions, `admit.harnesses`) and 3, with the roster read and
    any eviction evidence they need: the `--monitor` endpoints, and the embedded broker's own
    answer over this connection (it has no HTTP monitor for seats to read). `cotal.toml` is
    read once, here, and what the gates read is what the rest of the resume uses."""
    space = req.space
    config = registry.load_config(layout.root)
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
    evidence = msgspec.convert(eviction.evidence, list[EvictionProof])
    for proof in evidence:
        _say(
            f"EVICTION EVIDENCE: seat {proof.seat}: predecessor {proof.instance_id} has no "
            f"broker connection ({proof.connections_scanned} scanned across "
            f"{len(proof.servers)} server(s))"
        )
    admit.identity(
        adm,
        space=space,
        root=layout.root,
        live_uids=set(eviction.live),
        held_uids=set(),
        settings_for=agent_settings(config),
        home=Path(os.path.expanduser("~")),
        maps=relocate.parse_maps(list(req.map)),
    )
    # With identity's, before anything is claimed: the harness each seat ran at the cut and
    # the one installed here, against what this host's connector was measured with (the move
    # probe's own decision). A `--version` run of each agent's program: off the event loop.
    await anyio.to_thread.run_sync(admit.harnesses, adm, agent_settings(config))
    consents, note = recency_gate(adm, config.recency, accept_stale=req.accept_stale_checkpoint)
    return AtBroker(evidence, consents, note, config)


def recency_gate(
    adm: admit.Admission, recency: registry.RecencyConfig, *, accept_stale: bool
) -> tuple[list[Consent], ClockNote | None]:
    """Gate 3 against this host's clock and this root's `[recency]`: the consents it took,
    and who vouched for the clock when not the kernel."""
    reading, note = read_clock(recency)
    consents = admit.recency(
        adm,
        now=datetime.now(UTC),
        clock=reading,
        accept_stale=accept_stale,
        skew_ms=recency.skew_s * 1000,
    )
    return consents, note


def read_clock(recency: registry.RecencyConfig) -> tuple[clock.ClockReading, ClockNote | None]:
    """The recency gate's clock, and the note the admission journals and prints when something
    other than the kernel vouched for it: the operator's declaration or the test hook."""
    reading = clock.read_clock(registry.trusted_clock_reason(recency))
    if reading.source == "kernel":
        return reading, None
    if reading.source == clock.TEST_HOOK_ENV:
        _say(f"clock: {reading.detail} stands in for the kernel's reading (a test hook)")
    else:
        _say(f"clock: {reading.detail} ({reading.source})")
    return reading, ClockNote(source=reading.source, detail=reading.detail[:2048])


def refuse_taken(
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


async def release_broker(layout: Layout, embedded_info: embedded.BrokerInfo | None) -> None:
    """No refusal leaves the broker this run started behind (one broker per store), unless a
    manager already runs on it: from `mesh.start` on, the broker is that manager's, named in
    its mesh record, and stopping it would cut the fenced manager off its broker."""
    if embedded_info is None:
        return
    record = mesh.read_mesh(layout)
    if record is not None and record.manager and record.embedded_broker == embedded_info.identity:
        return
    await mesh.stop_started_broker(embedded_info.identity)


def rmdir_if_empty(path: Path) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass
