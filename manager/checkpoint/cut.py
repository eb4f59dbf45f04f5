"""Capture and seal one seat after its death is proven, and the attempt's manifest after all.

The same code serves the daemon (inside `commit-preservation`, right after the stop is proven)
and the coordinator's offline recovery (after a daemon died mid-capture, once no process
carrying the seat's uid is alive). Its inputs are the seat's inventory entry and paths, never
the Manager, so what is captured depends only on what the plan recorded.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import msgspec
import structlog

from connectors.base import ContinuityClass, StoreDecl, harness_check, store_scratch
from connectors.doctorkit import Pins
from connectors.privatefs import DIR_MODE, ensure_private_dir
from manager import registry
from manager.checkpoint import chain
from manager.checkpoint.gitstate import capture_repository
from manager.checkpoint.seal import (
    capture_file,
    create_seat_dir,
    seal_manifest,
    seal_seat,
    write_file_exclusive,
)
from manager.concurrency import ordered_map
from manager.workspace.identity import InstanceIdentity
from manager.workspace.layout import CONTROL_DIR, Layout
from protocol.checkpoint import (
    DEAD_LETTER_FILE,
    HARNESS_NAME_PATTERN,
    HARNESS_VERSION_PATTERN,
    INBOX_FILE,
    MANIFEST_FORMAT,
    RESUME_FILE,
    SEAT_CHECKPOINT_FORMAT,
    SENT_FILE,
    AttemptManifest,
    ChannelState,
    DeadLetterState,
    FileRef,
    IncrementalLink,
    ManifestSeat,
    PrecopyLink,
    RepositoryRecord,
    SeatCheckpoint,
    SentState,
    SessionFile,
    SessionRecord,
    SpaceExport,
    SpaceRecord,
    channel_file,
    continuity_capped,
    decode_inbox,
    encode_inbox,
)
from protocol.deadletter import decode_dead_letters
from protocol.errors import Refusal
from protocol.instant import file_stamp, format_instant
from protocol.inventory import Agent
from protocol.move import harness_version_key
from protocol.refusals import Code
from protocol.sentledger import decode_sent, encode_sent

log = structlog.get_logger("cotal.cut")

Anchor = str
Progress = Callable[[str, int], None]

# Inside `.cotal/`, only session material may ever be captured; auth, the broker store and the
# maintenance tree hold secrets or the cut's own state.
CAPTURABLE_CONTROL = ("sessions",)


def attempt_dir(layout: Layout, attempt_id: str) -> Path:
    return layout.checkpoints / attempt_id


def anchor_of(path: Path, *, root: Path, cwd: Path, home: Path) -> tuple[Anchor, str]:
    """Express an absolute session path portably, or refuse one no destination could place."""
    path = Path(os.path.normpath(path))
    for anchor, base in (("workspace-root", root), ("cwd", cwd), ("home", home)):
        try:
            rel = path.relative_to(base)
        except ValueError:
            continue
        if str(rel) == ".":
            continue
        parts = rel.parts
        if (
            anchor in ("workspace-root", "cwd")
            and parts[0] == CONTROL_DIR
            and (len(parts) < 2 or parts[1] not in CAPTURABLE_CONTROL)
        ):
            raise Refusal(
                Code.UNSAFE_STORE,
                f"session store {path} lies in the control directory outside .cotal/sessions; it "
                "would carry secrets",
                "name the harness's own session directory, never .cotal itself",
            )
        return anchor, str(rel)
    raise Refusal(
        Code.UNANCHORED_STORE,
        f"session store {path} is outside the workspace root, the seat's cwd and the home "
        "directory",
        "move the store under the workspace root, or name one a destination can resolve",
    )


def store_dirs(decls: tuple[StoreDecl, ...], *, root: Path, cwd: Path, home: Path) -> list[Path]:
    bases = {"workspace-root": root, "cwd": cwd, "home": home}
    return [Path(os.path.normpath(bases[d.anchor] / d.relpath)) for d in decls]


def store_scratch_of(connector: str) -> frozenset[str]:
    """The scratch entries the seat's connector declares in its session stores
    (`connectors.base.store_scratch`). A connector this build does not know declares none, so
    its store is walked whole and a symlink anywhere in it still refuses."""
    try:
        return store_scratch(registry.load_connector(connector))
    except Refusal:
        return frozenset()


def _regular_files(directory: Path, scratch: Collection[str] = ()) -> list[Path]:
    """Every regular file under a store, in a stable order; a symlink anywhere refuses.

    `scratch` names top-level entries of the store that are passed over unread, whatever they
    are: a harness's scratch is never carried, and a link it keeps there is never followed."""
    found: list[Path] = []
    if not directory.exists():
        return found
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=False):
        if scratch and dirpath == str(directory):
            # Pruned in place before the walk descends: os.walk reads `dirnames` back.
            dirnames[:] = [n for n in dirnames if n not in scratch]
            filenames = [n for n in filenames if n not in scratch]
        dirnames.sort()
        for name in dirnames + sorted(filenames):
            p = Path(dirpath) / name
            mode = os.lstat(p).st_mode
            if stat.S_ISLNK(mode):
                raise Refusal(
                    Code.UNSAFE_STORE,
                    f"session store entry {p} is a symlink",
                    "replace it with the real file; a checkpoint never follows links",
                )
            if name in filenames:
                if not stat.S_ISREG(mode):
                    raise Refusal(
                        Code.UNSAFE_STORE,
                        f"session store entry {p} is not a regular file",
                        "move it aside",
                    )
                found.append(p)
    return found


def has_files(directory: Path, *, scratch: Collection[str] = ()) -> bool:
    """Whether the store holds a file the cut would carry; `scratch` as `_regular_files`."""
    return bool(_regular_files(directory, scratch))


def _write_dead_letters(seat_dir: Path, export: SpaceExport) -> DeadLetterState | None:
    """The seat's dead letters beside its inbox (`dead-letters.jsonl`), when it holds any."""
    if not export.dead_letters:
        return None
    lines = encode_inbox(export.dead_letters)
    return DeadLetterState(
        letters=len(export.dead_letters),
        letter_bytes=sum(m.payload_bytes() for m in export.dead_letters),
        file=write_file_exclusive(seat_dir, DEAD_LETTER_FILE, lines),
    )


def _write_sent(seat_dir: Path, export: SpaceExport) -> SentState | None:
    """The seat's sent ledger (`sent.jsonl`), when it sent anything inside the horizon."""
    if not export.sent:
        return None
    return SentState(
        entries=len(export.sent),
        file=write_file_exclusive(seat_dir, SENT_FILE, encode_sent(export.sent)),
    )


def _write_space(seat_dir: Path, name: str, export: SpaceExport) -> SpaceRecord:
    data = encode_inbox(export.messages)
    inbox = write_file_exclusive(seat_dir, INBOX_FILE, data)
    written: list[tuple[bytes, ChannelState]] = []
    try:
        for c in export.channels:
            lines = encode_inbox(c.messages)
            state = ChannelState(
                channel=c.channel,
                durable=c.durable,
                messages=len(c.messages),
                message_bytes=sum(m.payload_bytes() for m in c.messages),
                posts=write_file_exclusive(seat_dir, channel_file(c.channel), lines),
            )
            written.append((lines, state))
        record = SpaceRecord(
            broker_id=export.broker_id,
            durable=export.durable,
            custody=export.custody,
            messages=len(export.messages),
            message_bytes=sum(m.payload_bytes() for m in export.messages),
            inbox=inbox,
            channels=[state for _, state in written],
            dead_letters=_write_dead_letters(seat_dir, export),
            sent=_write_sent(seat_dir, export),
        )
        # What is sealed must be what a destination admits: the record through the seal's own
        # decode, the carried lines here.
        decode_inbox(data, record)
        for lines, state in written:
            decode_inbox(lines, state)
        if record.dead_letters is not None:
            decode_dead_letters(
                encode_inbox(export.dead_letters),
                record.dead_letters,
                export.dead_letters[0].subject,
            )
        if record.sent is not None:
            decode_sent(encode_sent(export.sent), record.sent)
    except ValueError as exc:
        raise Refusal(
            Code.INBOX_UNEXPORTABLE,
            f"seat {name}: its inbox does not make an admissible checkpoint: {exc}",
            "cut again; if it repeats, report it with the seat's durable info",
        ) from None
    return record


# Each agent's harness version, asked once per attempt however many of its seats the cut takes
# (their captures run side by side, each in a worker thread of its own).
_versions: dict[tuple[str, str], str | None] = {}
_versions_lock = threading.Lock()
_asking: dict[tuple[str, str], threading.Lock] = {}


def _fit_version(text: str | None) -> str | None:
    """The version as the record holds it: the check's text, or the version number it names
    when the text does not fit the record's pattern; None when neither does."""
    if not text:
        return None
    for candidate in (text.strip(), harness_version_key(text)):
        if re.fullmatch(HARNESS_VERSION_PATTERN, candidate) and len(candidate) <= 128:
            return candidate
    return None


def harness_version_at_cut(root: Path, attempt: Path, connector: str) -> str | None:
    """The version of `connector`'s harness as its check reports it now (`harness_check`: a
    built-in harness's own version, else its `doctor`'s, with this root's settings), or None
    when it cannot tell. Blocking (a `--version` run): called in a worker thread."""
    key = (str(attempt), connector)
    with _versions_lock:
        if key in _versions:
            return _versions[key]
        if len(_versions) > 256:
            _versions.clear()
            _asking.clear()
        asking = _asking.setdefault(key, threading.Lock())
    with asking:
        with _versions_lock:
            if key in _versions:
                return _versions[key]
        try:
            settings = registry.agent_settings(registry.load_config(root), connector)
            check = harness_check(registry.load_connector(connector), settings, Pins.load())
            found = _fit_version(check.version)
        except Exception as exc:
            # The version is a fact the record may leave out, never a reason to fail the cut.
            log.warning("cut.harness_version_unknown", connector=connector, error=str(exc))
            found = None
        with _versions_lock:
            _versions[key] = found
        return found


@dataclass
class SeatSummary:
    name: str
    continuity: ContinuityClass
    session_id: str | None
    lifecycle_uid: str
    bytes: int = 0
    timings_ms: dict[str, int] = field(default_factory=dict)
    checkpoint: FileRef | None = None
    # The predecessor attempt an incremental bundle builds on, and the bundle's own size.
    since: str | None = None
    bundle_bytes: int = 0


def _refs_bytes(repo: RepositoryRecord) -> int:
    return sum(r.bytes for r in repo.files())


def _capture_session(
    layout: Layout,
    agent: Agent,
    seat_dir: Path,
    pointer_path: Path,
    extra_stores: list[Path],
    space_export: SpaceExport | None,
) -> tuple[SessionFile | None, list[SessionFile], SpaceRecord | None]:
    """The seat's session pointer, its session store files and its inbox, into `seat_dir`."""
    cwd = Path(agent.launch.cwd)
    home = Path(os.path.expanduser("~"))
    pointer: SessionFile | None = None
    if pointer_path.exists():
        anchor, rel = anchor_of(pointer_path, root=layout.root, cwd=cwd, home=home)
        ref = capture_file(pointer_path, seat_dir, "session-pointer.json")
        pointer = SessionFile(anchor=anchor, relpath=rel, file=ref)  # type: ignore[arg-type]
    store: list[SessionFile] = []
    # The connector's scratch is its own stores' alone: a store the operator added with
    # `--session-store` is carried whole.
    scratch = store_scratch_of(agent.launch.connector)
    dirs = [(Path(p), scratch) for p in agent.launch.session_stores]
    dirs += [(p, frozenset()) for p in extra_stores]
    seen: set[Path] = set()
    for directory, skipped in dirs:
        if directory in seen:
            continue
        seen.add(directory)
        for path in _regular_files(directory, skipped):
            anchor, rel = anchor_of(path, root=layout.root, cwd=cwd, home=home)
            ref = capture_file(
                path, seat_dir, f"store-{len(store):04d}{''.join(path.suffixes[-1:])}"
            )
            store.append(SessionFile(anchor=anchor, relpath=rel, file=ref))  # type: ignore[arg-type]
    space_state = None
    if space_export is not None:
        space_state = _write_space(seat_dir, agent.name, space_export)
    return pointer, store, space_state


async def _predecessors(
    layout: Layout,
    agent: Agent,
    cwd: Path,
    *,
    space: str,
    since: str | None,
    precopy: PrecopyLink | None,
    since_dir: Path | None = None,
) -> tuple[IncrementalLink | None, PrecopyLink | None]:
    """What the bundle builds on: the sealed attempt `since` names (found at `since_dir` when
    given), else the pre-copied history this repository still holds, else nothing (a full
    bundle)."""
    link = None
    if since is not None:
        link = await chain.link_for(layout, since, agent.name, cwd, space=space, path=since_dir)
    shipped = await chain.precopy_link(cwd, precopy) if precopy is not None else None
    return link, shipped


async def _capture_history(
    layout: Layout,
    cwd: Path,
    seat_dir: Path,
    link: IncrementalLink | None,
    shipped: PrecopyLink | None,
    *,
    progress: Progress | None,
    include: Sequence[str],
) -> RepositoryRecord:
    return await capture_repository(
        cwd,
        seat_dir,
        progress=progress,
        include=registry.carry_includes(registry.load_config(layout.root), include),
        prerequisites=(
            link.prerequisites
            if link is not None
            else shipped.prerequisites
            if shipped is not None
            else ()
        ),
        since=link,
        precopy=shipped if link is None else None,
    )


def _session_record(
    agent: Agent,
    continuity: ContinuityClass,
    pointer: SessionFile | None,
    store: list[SessionFile],
) -> SessionRecord:
    return SessionRecord(
        continuity=continuity,
        session_id=agent.launch.session_id if continuity in ("exact", "fork") else None,
        pointer=pointer,
        store=store,
    )


def _seat_record(
    layout: Layout,
    agent: Agent,
    space: str,
    repository: RepositoryRecord,
    session: SessionRecord,
    space_state: SpaceRecord | None,
    horizon_ms: int,
    custody_revision: int | None,
    harness_version: str | None,
    standing: bool = False,
) -> SeatCheckpoint:
    connector = agent.launch.connector
    named = re.fullmatch(HARNESS_NAME_PATTERN, connector) is not None
    return SeatCheckpoint(
        format=SEAT_CHECKPOINT_FORMAT,
        entry=msgspec.to_builtins(agent),
        space=space,
        name=agent.name,
        lifecycle_uid=agent.identity.lifecycle_uid,
        generation=agent.generation,
        captured_at=format_instant(datetime.now(UTC)),
        profile=agent.launch.profile_sha256,
        repository=repository,
        session=session,
        recency_horizon_ms=horizon_ms,
        workspace_root=str(layout.root),
        custody_revision=custody_revision,
        space_state=space_state,
        harness=connector if named else msgspec.UNSET,
        harness_version=(
            harness_version if named and harness_version is not None else msgspec.UNSET
        ),
        standing="turn-boundary" if standing else msgspec.UNSET,
    )


def _seat_summary(
    agent: Agent, record: SeatCheckpoint, ref: FileRef, times: tuple[float, float, float, float]
) -> SeatSummary:
    """What the cut reports of a sealed seat; `times` are when the capture began and when its
    repository, its session and its seal were done."""
    repository, session, space_state = record.repository, record.session, record.space_state
    t0, t_repo, t_session, t_seal = times
    timings_ms = {
        "repository": int((t_repo - t0) * 1000),
        "session": int((t_session - t_repo) * 1000),
        "seal": int((t_seal - t_session) * 1000),
    }
    return SeatSummary(
        name=agent.name,
        continuity=session.continuity,
        session_id=session.session_id,
        lifecycle_uid=agent.identity.lifecycle_uid,
        bytes=_refs_bytes(repository)
        + sum(s.file.bytes for s in session.store)
        + (session.pointer.file.bytes if session.pointer else 0)
        + (space_state.inbox.bytes if space_state else 0)
        + (sum(c.posts.bytes for c in space_state.channels) if space_state else 0),
        timings_ms=timings_ms,
        checkpoint=ref,
        since=(
            repository.since.attempt_id
            if repository.since is not None
            else chain.PRECOPY_LABEL
            if repository.precopy is not None
            else None
        ),
        bundle_bytes=repository.bundle.bytes if repository.bundle is not None else 0,
    )


async def _history_and_version(
    layout: Layout,
    attempt: Path,
    agent: Agent,
    seat_dir: Path,
    link: IncrementalLink | None,
    shipped: PrecopyLink | None,
    *,
    progress: Progress | None,
    include: Sequence[str],
) -> tuple[RepositoryRecord, str | None]:
    """The repository's capture and, beside it, the harness's version (a `--version` run of
    its program, once per agent of the attempt; none for built-in scribe), so the seat's
    downtime grows only by what that run takes beyond the capture. The capture's failure is
    raised as it is; the version's never fails (unknown is None)."""
    cwd = Path(agent.launch.cwd)
    steps: list[Callable[[], Awaitable[Any]]] = [
        lambda: _capture_history(
            layout, cwd, seat_dir, link, shipped, progress=progress, include=include
        ),
        lambda: anyio.to_thread.run_sync(
            harness_version_at_cut, layout.root, attempt, agent.launch.connector
        ),
    ]
    captured, asked = await ordered_map(lambda step: step(), steps, anyio.CapacityLimiter(2))
    return captured.unwrap(), asked.unwrap()


async def capture_seat(
    layout: Layout,
    attempt: Path,
    agent: Agent,
    *,
    pointer_path: Path,
    extra_stores: list[Path],
    declared: ContinuityClass,
    supports_fresh_start: bool,
    identity: InstanceIdentity,
    space: str,
    horizon_ms: int,
    progress: Progress | None = None,
    custody_revision: int | None = None,
    include: Sequence[str] = (),
    space_export: SpaceExport | None = None,
    since: str | None = None,
    precopy: PrecopyLink | None = None,
    standing: bool = False,
    since_dir: Path | None = None,
) -> SeatSummary:
    """Repository, pointer, store files and the inbox into a fresh 0700 seat directory, then
    the record.

    `include` is the cut's `--include` paths, carried with the root's `[carry] include`.
    `since` names a sealed attempt of this root: the bundle then carries only what is new
    since that attempt's record of the seat (a seat it does not hold gets a full bundle).
    `precopy` is the history `cotal move` shipped before the fence: the bundle then carries
    only what is new on top of it (none of its commits here: a full bundle).
    `standing` records a live seat captured at a turn boundary (the record's `standing` field),
    not a proven stop.
    """
    t0 = time.monotonic()
    cwd = Path(agent.launch.cwd)
    link, shipped = await _predecessors(
        layout, agent, cwd, space=space, since=since, precopy=precopy, since_dir=since_dir
    )
    # Every file below is created, written and fsynced in a worker thread: a create or an fsync
    # can wait on the file system's journal for as long as another seat's fsync takes, and
    # every seat's capture shares the manager's event loop (docs/design.md decision 24).
    seat_dir = await anyio.to_thread.run_sync(create_seat_dir, attempt, agent.name)
    repository, version = await _history_and_version(
        layout, attempt, agent, seat_dir, link, shipped, progress=progress, include=include
    )
    t_repo = time.monotonic()
    pointer, store, space_state = await anyio.to_thread.run_sync(
        _capture_session, layout, agent, seat_dir, pointer_path, extra_stores, space_export
    )
    t_session = time.monotonic()
    continuity = continuity_capped(declared, pointer is not None, len(store), supports_fresh_start)
    session = _session_record(agent, continuity, pointer, store)
    record = _seat_record(
        layout,
        agent,
        space,
        repository,
        session,
        space_state,
        horizon_ms,
        custody_revision,
        version,
        standing,
    )
    ref = await anyio.to_thread.run_sync(
        seal_seat, seat_dir, record, identity.sign, identity.public_key_b64, identity.instance_id
    )
    summary = _seat_summary(agent, record, ref, (t0, t_repo, t_session, time.monotonic()))
    log.info(
        "cut.sealed", seat=agent.name, continuity=continuity, bytes=summary.bytes, dir=str(seat_dir)
    )
    return summary


def seal_attempt(
    attempt: Path,
    attempt_id: str,
    space: str,
    seats: list[SeatSummary],
    resume_document: bytes,
    identity: InstanceIdentity,
) -> FileRef:
    """The manifest lists every sealed seat and carries the resume document: one directory is
    all a destination needs. Sealed last of all, so its presence means the attempt is whole."""
    resume = write_file_exclusive(attempt, RESUME_FILE, resume_document)
    manifest = AttemptManifest(
        format=MANIFEST_FORMAT,
        attempt_id=attempt_id,
        space=space,
        created_at=format_instant(datetime.now(UTC)),
        seats=[
            ManifestSeat(name=s.name, dir=s.name, checkpoint=s.checkpoint)
            for s in seats
            if s.checkpoint
        ],
        resume=resume,
    )
    return seal_manifest(
        attempt, manifest, identity.sign, identity.public_key_b64, identity.instance_id
    )


def keep_as_evidence(path: Path, why: str) -> Path:
    """Move an unsealed attempt directory aside as `<attempt>.<why>-<stamp>`, so the attempt can
    be captured again into a fresh directory while what the failed try wrote stays readable.
    Returns the new path; a rename never needs free space, so this works on a full disk."""
    aside = path.with_name(f"{path.name}.{why}-{file_stamp()}")
    os.rename(path, aside)
    log.warning("cut.evidence_kept", attempt=path.name, evidence=str(aside))
    return aside


def prepare_attempt_dir(layout: Layout, attempt_id: str) -> Path:
    """A fresh, empty directory for the attempt. An unsealed one left by a try that failed or
    died is moved aside as evidence first; a sealed one is never touched."""
    path = attempt_dir(layout, attempt_id)
    try:
        ensure_private_dir(layout.maintenance)
        ensure_private_dir(layout.checkpoints)
        if path.is_dir() and not (path / "manifest.json").exists():
            keep_as_evidence(path, "partial")
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        raise Refusal(
            Code.CHECKPOINT_EXISTS,
            f"checkpoint directory {path} already exists; a sealed checkpoint is never overwritten",
            "choose a new attempt, or move the directory aside if it is the evidence of a failed "
            "cut",
        ) from None
    except OSError as exc:
        raise storage_refusal(exc, f"creating {path}") from None
    return path


def storage_refusal(exc: OSError, doing: str) -> Refusal:
    """A filesystem failure while capturing, named by its errno and what was being written."""
    code = errno.errorcode.get(exc.errno or 0, "EIO")
    where = f" {exc.filename}" if exc.filename else ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        cure = "free space on the filesystem holding .cotal/maintenance"
    elif exc.errno == errno.EROFS:
        cure = "make the checkpoint store writable"
    else:
        cure = "fix the cause the error names"
    return Refusal(
        Code.CAPTURE_FAILED,
        f"{(exc.strerror or str(exc)).lower()} ({code}) {doing}{where}",
        f"{cure}, then rerun `cotal down --preserve-state`",
    )
