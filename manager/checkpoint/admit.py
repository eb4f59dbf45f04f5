"""Admission (record 2.2): integrity, then identity, then recency, all-or-nothing over an attempt.

A checkpoint directory came over the network, so every gate treats it as hostile. Integrity
admits only a signer this destination trusts (its own manager instance key, the operator's
trust store, or a key pinned for the run) and then proves the artifacts agree with each other:
the bundle carries exactly the recorded refs and the recorded base commit. Identity proves the
checkpoint is for this space and root and confines every path it would write: the seat's tree
under the root or where a `--map` may land (`landing.py`), each session file at the seat's own
pointer or under a store the seat declared, never in .git, never in the control directory,
never through a symlink. Integrity also proves each carried inbox is one the import can
republish as it stands (`check_inboxes`): a message the broker would refuse, act on, or drop as
a duplicate is refused here by name, not after custody moved. All of it runs before the journal
or custody move, so a refusal leaves everything as it was.

Cheapest and most conclusive first. Integrity and identity have no override; recency has one
(`--accept-stale-checkpoint`), because a stale checkpoint is sometimes the only checkpoint, and
the consent is returned so the caller can print and journal it. A capturedAt that cannot be read,
or one later than this host's clock beyond a small skew, refuses with no override: a freshness
gate that fails open is not a gate.

See docs/cli.md (the resume: its refusal table, gate by gate).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from connectors.base import (
    ContinuityClass,
    MeasuredVersions,
    Relocation,
    SessionMove,
    harness_check,
    measured_versions,
    relocate_session,
)
from connectors.doctorkit import HarnessCheck, Pins
from connectors.privatefs import (
    DIR_MODE,
    UnsafeFile,
    ensure_private_dir,
    make_private_dirs,
    stream_stable,
)
from manager import concurrency, registry
from manager.checkpoint import chain
from manager.checkpoint.clock import ClockReading
from manager.checkpoint.confine import (
    SessionTarget,
    confine_cwd,
    probe_session_target,
    seat_paths,
    session_target,
)
from manager.checkpoint.gitstate import (
    GIT,
    SAFE_CONFIG,
    bundle_heads,
    bundle_prerequisites,
    git_env,
    heads_differing,
)
from manager.checkpoint.landing import Landing, check_store, check_tree
from manager.checkpoint.reader import read_manifest, verify_integrity
from manager.checkpoint.relocate import check_maps, map_store, relocate_inventory, relocation
from manager.procs import process_start_time
from manager.workspace.private import read_stable
from protocol import names
from protocol.checkpoint import (
    LFS_LIST_CAP,
    SHALLOW_CAP,
    SKIP_WORKTREE_CAP,
    AttemptManifest,
    CarriedMessage,
    ChannelState,
    FileRef,
    InboxReader,
    RepositoryRecord,
    SeatCheckpoint,
    SessionFile,
    SessionRecord,
    SpaceRecord,
    parse_lfs_list,
    parse_refs_list,
    parse_shallow_list,
    parse_skip_worktree,
)
from protocol.errors import Refusal
from protocol.instant import parse_instant
from protocol.inventory import INVENTORY_CAP, Agent, Inventory, parse_resume_args
from protocol.maintenance import Consent
from protocol.move import harness_version_key
from protocol.refusals import Code

CLOCK_SKEW_MS = 60_000
GIT_TIMEOUT_S = 600.0
# Under the destination root's control directory: where `integrity(keep_in=...)` leaves each
# seat's unbundled objects for the restore (docs/design.md, decision 20).
SCRATCH_DIR = "scratch"
_SCRATCH_RE = re.compile(r"admit-([0-9]+)-([0-9]+)-[0-9a-f]{12}")
# The one broker-interpreted header the import means to replay: the id that makes a rerun's
# republish a duplicate instead of a second copy (manager/broker/space.py, `import_inbox`).
MSG_ID_HEADER = "Nats-Msg-Id"
# NATS reserves this prefix for headers the server acts on at publish (rollup, per-message TTL,
# expected sequences, schedules, counters, batches, tracing), and new servers add more: the
# import replays every carried header, so any other one would be acted on again here.
_BROKER_HEADER_PREFIX = "nats-"
# An RFC 7230 token. A name with a colon or a space in it is read by the server as another name
# with the rest in its value, so the header that arrives is not the one that was checked.
_HEADER_NAME_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_INBOX_CURE = (
    "cotal's cut never carries such a message, so this checkpoint was altered or written by "
    "another tool: copy the attempt again from the source host, or cut the seat again there "
    "(if the source seat's inbox really holds such a message, resume it in place, let it work "
    "the message off, then cut again); nothing was claimed"
)


@dataclass(frozen=True)
class Scratch:
    """One seat's bare repository as admission left it: every object of its bundle chain, in
    exactly the pack files named, which the restore may adopt instead of unbundling again."""

    repo: Path
    packs: frozenset[str]


@dataclass(frozen=True)
class ConfinedSeat:
    """Where one admitted seat may write on this host, proven by the identity gate: its tree at
    `cwd`, and each session file (pointer first) at its target."""

    cwd: Path
    sessions: tuple[tuple[SessionFile, SessionTarget], ...]
    # Set when the seat's harness cannot continue its session at the relocated path: the class
    # the resume can honestly promise instead, and why.
    continuity: ContinuityClass | None = None
    why: str = ""
    reloc: Relocation | None = None


@dataclass
class Admission:
    attempt_dir: Path
    manifest: AttemptManifest
    inventory: Inventory
    resume_bytes: bytes
    records: dict[str, SeatCheckpoint]
    consents: list[Consent] = field(default_factory=list)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    confined: dict[str, ConfinedSeat] = field(default_factory=dict)
    # Where trees may be rebuilt: the destination root and every --map destination.
    confine_to: tuple[Path, ...] = ()
    # The operator's --map pairs, which the restore's write checks again (`landing`), and what
    # each mapped seat's tree found there (`absent`, `empty` or `same-repository`).
    maps: dict[Path, Path] = field(default_factory=dict)
    landings: dict[str, Landing] = field(default_factory=dict)
    # Each seat's proven predecessors, oldest first (empty for a full bundle).
    chains: dict[str, list[chain.Link]] = field(default_factory=dict)
    # Kept by `integrity(keep_in=...)` for the restore; `discard_scratch` removes them.
    scratch_dir: Path | None = None
    scratch: dict[str, Scratch] = field(default_factory=dict)
    # Each seat's carried messages as `check_inboxes` read, hashed and proven them (kept with
    # `keep_in`), by file (`inbox.jsonl`, each `chan-<channel>.jsonl`): what the import
    # republishes.
    inboxes: dict[str, dict[str, list[CarriedMessage]]] = field(default_factory=dict)

    def agent(self, name: str) -> Agent:
        return next(a for a in self.inventory.agents if a.name == name)


def _refuse(gate: str, code: str, message: str, cure: str) -> Refusal:
    return Refusal(code, f"admission refused at the {gate} gate: {message}", cure)


def integrity(
    attempt_dir: Path,
    *,
    trusted_keys: Collection[str],
    search: Sequence[Path] = (),
    keep_in: Path | None = None,
) -> Admission:
    """Gate 1: every named file present, regular, not a symlink, of its size and digest, stable
    while read; the signatures verify under a trusted key; the resume document is the one the
    manifest names; each bundle carries exactly the recorded refs and the recorded base.

    `trusted_keys` is required and an empty collection trusts nobody (see
    `manager.workspace.trust.trusted_keys_for`): a valid signature by an unknown key proves only
    that someone sealed the bytes.

    An incremental seat's predecessors are found beside `attempt_dir` or under `search`, each
    proven under the same trusted keys (`manager.checkpoint.chain.resolve`), and its bundle is
    checked on top of theirs.

    With `keep_in` (a directory under the destination root's control directory), each seat's
    scratch repository is kept there for the restore (`Admission.scratch`, see `open_scratch`)
    instead of being thrown away; a refusal removes it. Without, nothing outlives the call.
    """
    # None would mean "any signer" to the reader below; here it means nothing is trusted.
    keys = frozenset(trusted_keys) if trusted_keys is not None else frozenset()
    records = verify_integrity(attempt_dir, trusted_keys=keys)
    manifest = read_manifest(attempt_dir, trusted_keys=keys)
    doc = _read_resume_document(attempt_dir, manifest)
    inventory = parse_resume_args(manifest.attempt_id, doc, space=manifest.space)
    by_name = {r.name: r for r in records}
    _match_seats(attempt_dir, inventory, by_name)
    # Before the bundles: reading a few lines is cheaper than unbundling, and as conclusive.
    # A restore (`keep_in`) imports the messages read here (`Admission.inboxes`).
    inboxes = check_inboxes(attempt_dir, manifest, by_name, keep=keep_in is not None)
    dirs = {seat.name: seat.dir for seat in manifest.seats}
    chains = _resolve_chains(attempt_dir, manifest, by_name, keys, search)
    if keep_in is None:
        _check_repositories(attempt_dir, dirs, by_name, chains, None)
        return Admission(attempt_dir, manifest, inventory, doc, by_name, chains=chains)
    scratch_dir = _open_admission_scratch(keep_in)
    try:
        kept = _check_repositories(attempt_dir, dirs, by_name, chains, scratch_dir)
    except BaseException:
        shutil.rmtree(scratch_dir, ignore_errors=True)
        raise
    return Admission(
        attempt_dir,
        manifest,
        inventory,
        doc,
        by_name,
        chains=chains,
        scratch_dir=scratch_dir,
        scratch=kept,
        inboxes=inboxes,
    )


def _read_resume_document(attempt_dir: Path, manifest: AttemptManifest) -> bytes:
    doc = read_stable(
        attempt_dir / manifest.resume.file, cap=INVENTORY_CAP, what="resume document"
    ).data
    if hashlib.sha256(doc).hexdigest() != manifest.resume.sha256:
        raise _refuse(
            "integrity",
            Code.INTEGRITY,
            f"{attempt_dir / manifest.resume.file} changed after it was verified",
            "copy the checkpoint again and retry",
        )
    return doc


def _match_seats(
    attempt_dir: Path, inventory: Inventory, by_name: dict[str, SeatCheckpoint]
) -> None:
    """Refuse unless every retained seat has a checkpoint and each checkpoint agrees with the
    resume document's entry for its seat."""
    missing = [a.name for a in inventory.agents if a.name not in by_name]
    if missing:
        raise _refuse(
            "integrity",
            Code.RETAINED_UNADMITTED,
            f"retained seat(s) {', '.join(missing)} have no checkpoint in {attempt_dir}",
            "every seat of the cut must be admitted; copy the whole attempt directory",
        )
    for name, record in by_name.items():
        agent = next((a for a in inventory.agents if a.name == name), None)
        carried = record.session.continuity in ("exact", "fork")
        if (
            agent is None
            or agent.identity.lifecycle_uid != record.lifecycle_uid
            or (not carried and agent.launch.session_id is not None)
        ):
            raise _refuse(
                "integrity",
                Code.INTEGRITY,
                f"seat {name}: its checkpoint and the resume document disagree",
                "copy the checkpoint again from the source host",
            )


def _resolve_chains(
    attempt_dir: Path,
    manifest: AttemptManifest,
    by_name: dict[str, SeatCheckpoint],
    keys: frozenset[str],
    search: Sequence[Path],
) -> dict[str, list[chain.Link]]:
    """Each seat's proven predecessors, oldest first (`chain.resolve`)."""
    chains: dict[str, list[chain.Link]] = {}
    for name, record in by_name.items():
        try:
            chains[name] = chain.resolve(
                attempt_dir,
                name,
                record.repository,
                space=manifest.space,
                trusted_keys=keys,
                search=search,
            )
        except Refusal as exc:
            raise _refuse("integrity", exc.code, exc.message, exc.cure) from None
    return chains


def _open_admission_scratch(keep_in: Path) -> Path:
    try:
        return open_scratch(keep_in)
    except OSError as exc:
        raise Refusal(
            Code.SCRATCH_UNAVAILABLE,
            f"cannot make admission's scratch directory in {keep_in}: "
            f"{exc.strerror or exc} ({exc.filename or keep_in})",
            "make the root's .cotal a directory this user owns and can write, then retry",
        ) from None


class _Carried(msgspec.Struct, frozen=True, gc=False):
    """Where a carried message id was first seen, to name both messages of a duplicate. One
    is kept for every message of an attempt, and holds nothing that could make a cycle: the
    collector need not walk them (tens of thousands of tracked objects cost a full collection
    in the middle of a restore)."""

    seat: str
    file: str
    line: int
    seq: int


def check_inboxes(
    attempt_dir: Path,
    manifest: AttemptManifest,
    records: Mapping[str, SeatCheckpoint],
    *,
    keep: bool = False,
) -> dict[str, dict[str, list[CarriedMessage]]]:
    """Every carried message, in seat and line order, is one the import republishes as it
    stands: each subject token non-empty under the seat's own filter (`inbox-subject`), no
    header the broker acts on but the message id, and every header name one it reads as that
    name (`inbox-header`), and no message id twice in the attempt (`inbox-duplicate-id`).

    Ids are compared across seats too: every seat's inbox is republished into the one DM stream
    of the space within its duplicate window, so the broker would keep the first and drop the
    other there as well. Gate 1 already proved each file against its record; it is read once
    more here, hashed and proven against its record again as it is read, so what is judged is
    exactly the sealed bytes. A channel's posts are judged alike, their ids against the other
    posts only, as they go into the channel stream. With `keep`, each seat's messages as read
    here are returned by file, for the import to republish exactly those bytes without reading
    the file a third time; without, no more than a line of a file is held.
    """
    dirs = {seat.name: seat.dir for seat in manifest.seats}
    seen: dict[str, _Carried] = {}
    # The channels' posts go into the space's one channel stream: their ids are judged apart
    # from the inboxes', and across seats for the same reason.
    posted: dict[str, _Carried] = {}
    kept: dict[str, dict[str, list[CarriedMessage]]] = {}
    for name, record in records.items():
        state = record.space_state
        if state is None:
            continue
        seat_dir = attempt_dir / dirs[name]
        mail = names.dm_filter(manifest.space, names.SEAT_OWNER, name)
        kept[name] = {
            state.inbox.file: _check_carried(
                seat_dir / state.inbox.file, state.inbox, name, mail, seen, state, keep
            )
        }
        for c in state.channels:
            subject = names.chan_subject(manifest.space, c.channel)
            kept[name][c.posts.file] = _check_carried(
                seat_dir / c.posts.file, c.posts, name, subject, posted, c, keep
            )
    return kept if keep else {}


class _InboxJudge(InboxReader):
    """One seat's inbox.jsonl fed a chunk at a time: hashed whole, each line proven against the
    record (`InboxReader`) and judged as it completes until the first refusal."""

    def __init__(
        self,
        path: Path,
        name: str,
        filter: str,
        seen: dict[str, _Carried],
        state: SpaceRecord | ChannelState,
        keep: bool,
    ) -> None:
        super().__init__(state, keep=keep)
        self.path, self.name, self.filter, self.seen = path, name, filter, seen
        self.digest = hashlib.sha256()
        # Raised only once the whole file hashed to its record: bytes that changed since
        # gate 1 are `integrity`, whatever their lines say.
        self.problem: Refusal | None = None

    def take(self, chunk: bytes) -> None:
        self.digest.update(chunk)
        if self.problem is not None:
            return
        try:
            self.feed(chunk)
        except ValueError as exc:
            # Gate 1 proved these lines against the same record: they changed since. A line
            # judged before them in this chunk keeps its own refusal.
            self.problem = self.problem or _inbox_changed(self.path, str(exc))

    def proven(self, line: int, m: CarriedMessage) -> None:
        if self.problem is None:
            self.problem = _judge_message(
                self.name, self.path.name, self.filter, line, m, self.seen
            )
        if self.problem is None:
            super().proven(line, m)

    def judged(self) -> list[CarriedMessage]:
        if self.problem is None:
            try:
                return self.finish()
            except ValueError as exc:
                self.problem = _inbox_changed(self.path, str(exc))
        raise self.problem


def _check_carried(
    path: Path,
    ref: FileRef,
    name: str,
    filter: str,
    seen: dict[str, _Carried],
    state: SpaceRecord | ChannelState,
    keep: bool,
) -> list[CarriedMessage]:
    judge = _InboxJudge(path, name, filter, seen, state, keep)
    try:
        stream_stable(path, judge.take, expect_size=ref.bytes)
    except UnsafeFile as exc:
        raise _inbox_changed(path, exc.detail) from None
    if judge.digest.hexdigest() != ref.sha256:
        raise _inbox_changed(path, f"now hashes to {judge.digest.hexdigest()}")
    return judge.judged()


def _addressed(subject: str, filter: str) -> bool:
    """Under an inbox's `...>` filter, or exactly a channel's literal subject."""
    if filter.endswith(">"):
        return subject.startswith(filter.removesuffix(">"))
    return subject == filter


def _judge_message(
    name: str, file: str, filter: str, line: int, m: CarriedMessage, seen: dict[str, _Carried]
) -> Refusal | None:
    where = f"seat {name}: {file} line {line} (message {m.seq})"
    if not _addressed(m.subject, filter) or "" in m.subject.split("."):
        # An empty token is no subject the broker routes to its stream: the publish is never
        # answered, and the import would only time out, after the claim.
        return _refuse(
            "integrity",
            Code.INBOX_SUBJECT,
            f"{where} is addressed to {m.subject!r}, which has an empty token or does not "
            f"match {filter}, so the import cannot republish it",
            _INBOX_CURE,
        )
    for key in m.headers:
        if not _HEADER_NAME_RE.fullmatch(key):
            return _refuse(
                "integrity",
                Code.INBOX_HEADER,
                f"{where} carries a header named {key[:64]!r}, which the broker would read as "
                "another header",
                _INBOX_CURE,
            )
        if key.lower().startswith(_BROKER_HEADER_PREFIX) and key != MSG_ID_HEADER:
            return _refuse(
                "integrity",
                Code.INBOX_HEADER,
                f"{where} carries the {key} header, which the broker acts on at publish "
                "instead of storing it, so the import would not republish it as it was",
                _INBOX_CURE,
            )
    msg_id = m.headers.get(MSG_ID_HEADER)
    if msg_id is None:
        # Without an id the broker stores every publish: nothing is lost, nothing to compare.
        return None
    # The server reads a header's value without its surrounding blanks.
    key_id = msg_id.strip(" \t")
    if not key_id:
        return _refuse(
            "integrity",
            Code.INBOX_HEADER,
            f"{where} carries an empty {MSG_ID_HEADER}",
            _INBOX_CURE,
        )
    first = seen.get(key_id)
    if first is not None:
        other = "" if first.seat == name else f"seat {first.seat}'s "
        return _refuse(
            "integrity",
            Code.INBOX_DUPLICATE_ID,
            f"{where} carries message id {key_id!r}, as does {other}{first.file} line "
            f"{first.line} (message {first.seq}): republished together, the broker keeps the "
            "first and drops the other as a duplicate",
            _INBOX_CURE,
        )
    seen[key_id] = _Carried(name, file, line, m.seq)
    return None


def _inbox_changed(path: Path, detail: str) -> Refusal:
    return _refuse(
        "integrity",
        Code.INTEGRITY,
        f"{path} changed after it was verified ({detail})",
        "retry once nothing writes to the checkpoint, or copy it again; nothing was changed",
    )


def open_scratch(parent: Path) -> Path:
    """A new private directory under `parent` (made 0700, refused when it is a symlink or not
    ours) for this process's scratch repositories, after removing every one a process that is
    gone left behind.

    A name is `admit-<pid>-<start time>-<random>`: a leftover is never reused (the random part
    is new each time), and it is removed only once the process that made it is gone, so a
    concurrent admission on the same root keeps its own. What a crash left is not trusted
    for anything; it is only deleted.
    """
    for _ in range(3):
        make_private_dirs(parent)
        ensure_private_dir(parent)
        for entry in os.listdir(parent):
            match = _SCRATCH_RE.fullmatch(entry)
            if match is None:
                continue
            pid, started = int(match.group(1)), int(match.group(2))
            if process_start_time(pid) != started:
                shutil.rmtree(parent / entry, ignore_errors=True)
        made = (
            parent / f"admit-{os.getpid()}-{process_start_time(os.getpid())}-{secrets.token_hex(6)}"
        )
        try:
            os.mkdir(made, DIR_MODE)
            return made
        except FileNotFoundError:
            # Another run removed `parent` as it emptied it: make it again.
            continue
    raise FileNotFoundError(errno.ENOENT, "the scratch directory keeps disappearing", str(parent))


def discard_scratch(adm: Admission) -> None:
    """Remove what `integrity(keep_in=...)` kept: after the restore, or on a refusal or a run
    that restores nothing. Idempotent."""
    if adm.scratch_dir is not None:
        shutil.rmtree(adm.scratch_dir, ignore_errors=True)
    adm.scratch = {}


def _check_repositories(
    attempt_dir: Path,
    dirs: Mapping[str, str],
    records: Mapping[str, SeatCheckpoint],
    chains: Mapping[str, Sequence[chain.Link]],
    keep_in: Path | None,
) -> dict[str, Scratch]:
    """`check_repository` for every seat, a few at once: each is a handful of git processes
    unbundling into its own scratch repository, so fifty seats one after another would leave
    the cores idle. The refusal raised is the first in seat order, as a loop would raise it.
    With `keep_in`, seat i's repository is kept at `keep_in/seat-<i>.git` (an index, so no
    name from the checkpoint becomes a path)."""
    names = list(records)
    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=min(concurrency.jobs(), len(names))) as pool:
        checks = [
            pool.submit(
                check_repository,
                name,
                attempt_dir / dirs[name],
                records[name].repository,
                chains[name],
                keep=keep_in / f"seat-{i}.git" if keep_in is not None else None,
            )
            for i, name in enumerate(names)
        ]
        failures = [check.exception() for check in checks]
    for failure in failures:
        if failure is not None:
            raise failure
    return {
        name: kept for name, check in zip(names, checks, strict=True) if (kept := check.result())
    }


def _git(cwd: Path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(
            [GIT, *SAFE_CONFIG, *args],
            cwd=cwd,
            env=git_env({"GIT_CEILING_DIRECTORIES": str(cwd.parent)}),
            input=stdin,
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        raise Refusal(
            Code.GIT_MISSING, "cannot run git to read the checkpoint's bundle", "install git"
        ) from None
    except subprocess.TimeoutExpired:
        raise Refusal(
            Code.BUNDLE_INVALID,
            f"`git {' '.join(args[:2])}` over the checkpoint's bundle ran past "
            f"{GIT_TIMEOUT_S:.0f} s",
            "copy the checkpoint again; a bundle cotal cut reads in seconds",
        ) from None


def check_repository(
    name: str,
    seat_dir: Path,
    record: RepositoryRecord,
    links: Sequence[chain.Link] = (),
    *,
    keep: Path | None = None,
) -> Scratch | None:
    """The repository half's artifacts agree with the record and with each other.

    Each file's digest is already proven, but a signer can seal any bytes: a bundle swapped for
    another repository's, re-signed, passes every digest. So the bundle's heads must be exactly
    `refs.txt`, the branch HEAD was on must point at the base, and the base and every recorded
    ref must be objects the bundle really carries (unbundled into a throwaway repository).
    Refused here, the restore never claims custody for a tree it cannot build.

    An incremental record's bundle is unbundled on top of its proven predecessors (`links`,
    oldest first): its heads must agree with the refs they name, and the base, every ref and
    every prerequisite must then be objects the chain carries.

    With `keep` (a path that must not exist yet, in a private directory), the scratch
    repository is made there and kept, and what it holds is returned for the restore; on a
    refusal it may be left half made, for the caller to remove with its directory.
    """
    bundle = seat_dir / record.bundle.file if record.bundle is not None else None
    if record.incremental and len(links) == 0:
        raise _refuse(
            "integrity",
            Code.PREDECESSOR_MISSING,
            f"seat {name}: its bundle builds on "
            + (
                f"attempt {record.since.attempt_id}"
                if record.since is not None
                else "the history a move pre-copied"
            )
            + ", which was not proven",
            "copy that attempt directory beside this one and retry",
        )
    refs = _admitted_refs(name, seat_dir, record)
    if keep is not None:
        _prove_objects(name, seat_dir, record, links, refs, bundle, keep)
        return Scratch(keep, frozenset(os.listdir(keep / "objects" / "pack")))
    with tempfile.TemporaryDirectory(prefix="cotal-admit-") as tmp:
        _prove_objects(name, seat_dir, record, links, refs, bundle, Path(tmp) / "bundle.git")
    return None


def _admitted_refs(name: str, seat_dir: Path, record: RepositoryRecord) -> dict[str, str]:
    """The recorded refs list, which must put the branch HEAD was on at the base."""
    refs: dict[str, str] = {}
    if record.refs is not None:
        try:
            refs = parse_refs_list((seat_dir / record.refs.file).read_bytes())
        except ValueError as exc:
            raise _refuse(
                "integrity",
                Code.REFS_MISMATCH,
                f"seat {name}: {seat_dir / record.refs.file} is not a refs list ({exc})",
                "the checkpoint is not one cotal cut; cut the seat again on the source host",
            ) from None
    if record.head is not None and refs.get(record.head) != record.base:
        raise _refuse(
            "integrity",
            Code.REFS_MISMATCH,
            f"seat {name}: HEAD was on {record.head} at the cut, but the recorded refs put that "
            f"branch at {refs.get(record.head, 'nothing')}, not the base {record.base}",
            "the record and its refs do not belong together; cut the seat again",
        )
    return refs


def _prove_objects(
    name: str,
    seat_dir: Path,
    record: RepositoryRecord,
    links: Sequence[chain.Link],
    refs: dict[str, str],
    bundle: Path | None,
    scratch: Path,
) -> None:
    """The bundle's heads are the recorded refs, and unbundled (on its predecessors) into a
    new bare repository at `scratch`, it holds the base, every ref and every prerequisite."""
    # A TemporaryDirectory, or the private directory `open_scratch` made for this run.
    tmp = scratch.parent
    _check_bundle_heads(name, tmp, record, refs, bundle)
    _unbundle_chain(name, seat_dir, links, bundle, scratch)
    _check_objects_present(name, seat_dir, record, refs, bundle, scratch)
    _check_shallow(name, seat_dir, record, bundle, scratch)
    _check_sparse(name, seat_dir, record)
    _check_lfs(name, seat_dir, record)


def _lfs_repositories(record: RepositoryRecord) -> list[RepositoryRecord]:
    """The repository and its submodules (recursively) that carry Git LFS objects."""
    found: list[RepositoryRecord] = []
    pending = [record]
    while pending:
        repo = pending.pop()
        if repo.submodules is not msgspec.UNSET:
            pending += [s.repository for s in repo.submodules if s.repository is not None]
        if repo.lfs is not msgspec.UNSET:
            found.append(repo)
    return found


def _check_lfs(name: str, seat_dir: Path, record: RepositoryRecord) -> None:
    """Each carried LFS object list (the repository's and its submodules') is the list the
    capture writes, naming as many objects as the record says and exactly the bytes of its
    pack; each object is proven by its oid as the restore writes it."""
    for repo in _lfs_repositories(record):
        if repo.lfs is msgspec.UNSET:  # never: only the repositories that carry LFS are listed
            continue
        where = seat_dir / repo.lfs.objects.file
        cure = "copy the checkpoint again from the source host, or cut the seat again"
        try:
            objects = parse_lfs_list(read_stable(where, cap=LFS_LIST_CAP, what="LFS list").data)
        except (ValueError, Refusal) as exc:
            detail = exc.message if isinstance(exc, Refusal) else str(exc)
            raise _refuse(
                "integrity", Code.BAD_RECORD, f"seat {name}: {where}: {detail}", cure
            ) from None
        total = sum(size for _, size in objects)
        if len(objects) != repo.lfs.count or total != repo.lfs.pack.bytes:
            raise _refuse(
                "integrity",
                Code.BAD_RECORD,
                f"seat {name}: {where} names {len(objects)} LFS objects of {total} bytes, the "
                f"record {repo.lfs.count} objects and a pack of {repo.lfs.pack.bytes} bytes",
                cure,
            )


_LFS_FILTER_KEYS = r"^filter\.lfs\.(process|clean)$"
_GIT_LFS_CURE = (
    "install git-lfs here (Debian: `apt-get install git-lfs`) and run `git lfs install`, or "
    "resume it on a host that has it; nothing was claimed"
)


def check_git_lfs(adm: Admission) -> None:
    """With identity's, before anything is claimed: `check_git_lfs_seat` for every seat."""
    dirs = {seat.name: seat.dir for seat in adm.manifest.seats}
    for name, record in adm.records.items():
        check_git_lfs_seat(name, adm.attempt_dir / dirs[name], record.repository)


def check_git_lfs_seat(name: str, seat_dir: Path, record: RepositoryRecord) -> None:
    """A seat whose repository (or a submodule) carries Git LFS objects needs git-lfs on this
    host's PATH, which the restore's checkout runs to smudge them into the tree, and git's LFS
    filter where the restored repository reads its config: in the carried config (the source's
    `git lfs install --local`) or in this host's global config (a global `git lfs install` at
    the source does not travel). Refused by name, `git-lfs-missing`, rather than as a checkout
    that fails after the claim. A seat without LFS costs nothing here; one with it, a `git
    config` read or two."""
    repositories = _lfs_repositories(record)
    if not repositories:
        return
    if shutil.which("git-lfs") is None:
        raise _refuse(
            "identity",
            Code.GIT_LFS_MISSING,
            f"seat {name}: its checkpoint carries Git LFS objects and git-lfs is not on this "
            "host's PATH; the restore's checkout runs it to put their bytes in the tree",
            _GIT_LFS_CURE,
        )
    global_filter: bool | None = None
    for repo in repositories:
        if repo.config is not None and _sets_lfs_filter(
            seat_dir, "--file", str(seat_dir / repo.config.file)
        ):
            continue
        if global_filter is None:
            global_filter = _sets_lfs_filter(seat_dir, "--global")
        if not global_filter:
            raise _refuse(
                "identity",
                Code.GIT_LFS_MISSING,
                f"seat {name}: its checkpoint carries Git LFS objects, and git has no LFS "
                "filter for the restored repository: its carried config sets none (the "
                "source's `git lfs install` was global, which does not travel) and this "
                "host's global config sets none either",
                _GIT_LFS_CURE,
            )


def _sets_lfs_filter(cwd: Path, *where: str) -> bool:
    found = _git(cwd, "config", *where, "--get-regexp", _LFS_FILTER_KEYS)
    return found.returncode == 0 and bool(found.stdout.strip())


def _check_sparse(name: str, seat_dir: Path, record: RepositoryRecord) -> None:
    """A sparse record's skip-worktree list is the list the capture writes (safe relative
    paths, each once) and names as many entries as the record says."""
    if record.sparse is msgspec.UNSET or record.sparse.skip_worktree is None:
        return
    where = seat_dir / record.sparse.skip_worktree.file
    cure = "copy the checkpoint again from the source host, or cut the seat again"
    try:
        paths = parse_skip_worktree(
            read_stable(where, cap=SKIP_WORKTREE_CAP, what="skip-worktree list").data
        )
    except (ValueError, Refusal) as exc:
        detail = exc.message if isinstance(exc, Refusal) else str(exc)
        raise _refuse(
            "integrity", Code.SPARSE_MISMATCH, f"seat {name}: {where}: {detail}", cure
        ) from None
    if len(paths) != record.sparse.entries:
        raise _refuse(
            "integrity",
            Code.SPARSE_MISMATCH,
            f"seat {name}: {where} names {len(paths)} skip-worktree entries, the record "
            f"{record.sparse.entries}",
            cure,
        )


def _check_shallow(
    name: str, seat_dir: Path, record: RepositoryRecord, bundle: Path | None, scratch: Path
) -> None:
    """A shallow record's boundary is the list git writes, every commit it names is a commit
    its bundle carried, and the bundle names no prerequisite (its history ends at the
    boundary, not at commits the destination would need)."""
    if record.shallow is msgspec.UNSET:
        return
    where = seat_dir / record.shallow.file
    cure = "copy the checkpoint again from the source host, or cut the seat again"
    try:
        commits = parse_shallow_list(read_stable(where, cap=SHALLOW_CAP, what="shallow").data)
    except (ValueError, Refusal) as exc:
        detail = exc.message if isinstance(exc, Refusal) else str(exc)
        raise _refuse(
            "integrity", Code.SHALLOW_MISMATCH, f"seat {name}: {where}: {detail}", cure
        ) from None
    named = bundle_prerequisites(bundle) if bundle is not None else None
    if named:
        raise _refuse(
            "integrity",
            Code.SHALLOW_MISMATCH,
            f"seat {name}: the bundle {bundle} of a shallow clone names prerequisites "
            f"({', '.join(named[:5])}), history beyond the carried boundary",
            cure,
        )
    found = _git(
        scratch,
        "cat-file",
        "--batch-check=%(objecttype)",
        stdin="".join(c + "\n" for c in commits).encode(),
    )
    kinds = found.stdout.decode("ascii", "replace").splitlines()
    if found.returncode != 0 or len(kinds) != len(commits):
        raise _bundle_invalid(name, bundle or seat_dir, found)
    absent = [c for c, kind in zip(commits, kinds, strict=True) if kind != "commit"]
    if absent:
        raise _refuse(
            "integrity",
            Code.SHALLOW_MISMATCH,
            f"seat {name}: the carried shallow boundary {where} names commits the bundle "
            f"{bundle} does not carry ({', '.join(absent[:5])})",
            cure,
        )


def _check_bundle_heads(
    name: str, tmp: Path, record: RepositoryRecord, refs: dict[str, str], bundle: Path | None
) -> None:
    heads: dict[str, str] = {}
    if bundle is not None:
        listed = _git(tmp, "bundle", "list-heads", os.fspath(bundle))
        if listed.returncode != 0:
            raise _bundle_invalid(name, bundle, listed)
        heads = bundle_heads(listed.stdout)
    differ = heads_differing(heads, refs, incremental=record.incremental)
    if differ:
        raise _refuse(
            "integrity",
            Code.REFS_MISMATCH,
            f"seat {name}: the bundle {bundle} carries other refs than the checkpoint "
            f"recorded ({', '.join(differ[:5])})",
            "the bundle and the record do not belong together; copy the checkpoint again "
            "from the source host, or cut the seat again",
        )


def _unbundle_chain(
    name: str,
    seat_dir: Path,
    links: Sequence[chain.Link],
    bundle: Path | None,
    scratch: Path,
) -> None:
    """A new bare repository at `scratch` holding the predecessors' objects, then the bundle's."""
    made = _git(scratch.parent, "init", "--quiet", "--bare", "--template=", os.fspath(scratch))
    if made.returncode != 0:
        raise _bundle_invalid(name, bundle or seat_dir, made)
    for link in links:
        if link.seed is not None:
            try:
                chain.plant_seed(link.seed, scratch / "objects")
            except OSError as exc:
                raise _refuse(
                    "integrity",
                    Code.INTEGRITY,
                    f"seat {name}: the pre-copied history in {link.seed} cannot be used: {exc}",
                    "rerun `cotal move` at the source: it ships the history again",
                ) from None
    for path in [*(link.bundle_path for link in links), bundle]:
        if path is None:
            continue
        unpacked = _git(scratch, "bundle", "unbundle", os.fspath(path))
        if unpacked.returncode != 0:
            raise _bundle_invalid(name, path, unpacked)


def _check_objects_present(
    name: str,
    seat_dir: Path,
    record: RepositoryRecord,
    refs: dict[str, str],
    bundle: Path | None,
    scratch: Path,
) -> None:
    """The base, every recorded ref and every prerequisite are objects in `scratch`."""
    prerequisites = record.prerequisites
    # An unborn branch's record has no base commit to look for.
    base = [f"{record.base}^{{commit}}"] if record.base is not None else []
    wanted = [*base, *sorted(set(refs.values()) | set(prerequisites))]
    found = _git(
        scratch, "cat-file", "--batch-check", stdin="".join(w + "\n" for w in wanted).encode()
    )
    lines = found.stdout.decode("utf-8", "replace").splitlines()
    if found.returncode != 0 or len(lines) != len(wanted):
        raise _bundle_invalid(name, bundle or seat_dir, found)
    if base and lines[0].endswith(" missing"):
        raise _refuse(
            "integrity",
            Code.BASE_MISSING,
            f"seat {name}: the bundle {bundle} does not carry the recorded base commit "
            f"{record.base}, so the recorded diffs do not apply to its history",
            "the bundle and the record do not belong together; copy the checkpoint again "
            "from the source host, or cut the seat again",
        )
    absent = [
        w
        for w, line in zip(wanted[len(base) :], lines[len(base) :], strict=True)
        if line.endswith(" missing")
    ]
    if absent:
        raise _refuse(
            "integrity",
            Code.REFS_MISMATCH,
            f"seat {name}: the bundle {bundle} lists refs whose objects it does not carry "
            f"({', '.join(absent[:5])})",
            "copy the checkpoint again from the source host, or cut the seat again",
        )


def _bundle_invalid(name: str, bundle: Path, proc: subprocess.CompletedProcess[bytes]) -> Refusal:
    said = proc.stderr.decode("utf-8", "replace").strip()[-600:]
    return _refuse(
        "integrity",
        Code.BUNDLE_INVALID,
        f"seat {name}: git cannot read the bundle {bundle} (exit {proc.returncode}: {said})",
        "copy the checkpoint again from the source host, or cut the seat again",
    )


def identity(
    adm: Admission,
    *,
    space: str,
    root: Path,
    live_uids: Collection[str],
    held_uids: Collection[str],
    settings_for: Mapping[str, Mapping[str, Any]],
    home: Path | None = None,
    maps: Mapping[Path, Path] | None = None,
) -> None:
    """Gate 2: same space, every path carried onto this root (the source root onto `root`, the
    rest through `maps`) and confined, a uid nobody runs, the recorded profile revision, and
    git-lfs with its filter here for a seat that carries Git LFS objects (`check_git_lfs`).
    The confined paths are kept in `adm.confined` for the restore to write through (and check
    again); on a pass `adm.inventory` becomes the relocated inventory, the one this root
    journals and hands to its manager."""
    if adm.manifest.space != space:
        raise _refuse(
            "identity",
            Code.WRONG_SPACE,
            f"the checkpoint belongs to space {adm.manifest.space!r}, not {space!r}",
            f"resume it with --space {adm.manifest.space}",
        )
    user_maps = dict(maps or {})
    try:
        check_maps(user_maps, dest_root=root)
    except Refusal as exc:
        raise _refuse("identity", exc.code, exc.message, exc.cure) from None
    relocations: dict[str, Relocation] = {}
    for name, record in adm.records.items():
        reloc = _seat_relocation(adm, name, record, root, user_maps)
        adm.confined[name] = confine(
            adm, name, root=root, home=home if home is not None else _home(), reloc=reloc
        )
        _check_landing(adm, name, user_maps, root=root)
        relocations[name] = reloc
        _check_uid_free(name, record.lifecycle_uid, live_uids, held_uids)
        _check_profile(adm, name, record, settings_for)
    check_git_lfs(adm)
    adm.confine_to = (root, *(new for new in user_maps.values()))
    adm.maps = user_maps
    adm.inventory = relocate_inventory(
        adm.inventory,
        {
            name: (reloc, adm.confined[name].continuity in (None, "exact"))
            for name, reloc in relocations.items()
        },
    )


def harness_refusal(
    seat: str,
    agent: str,
    recorded: str | None,
    check: HarnessCheck,
    measured: MeasuredVersions | None,
    *,
    where: str,
    ran: str,
    elsewhere: str,
    tail: str,
) -> Refusal | None:
    """Whether `where` may run seat `seat` of `agent`, whose harness ran version `recorded` at
    the source, with its harness as `check` found it there: the one decision a move's probe
    (`manager/daemon/movecheck.py`) and a restore's admission (`harnesses`) make, in the same
    words. `agent-unavailable` when the program is missing or does not run; `harness-version`
    when the recorded version or the installed one is not one `measured` (the versions the
    connector here was measured against) admits, or, for a connector that declares none, when
    the two differ. Nothing to compare when either side cannot tell its version."""
    broken = [m for m in check.missing if m.kind == "program"]
    if broken or not check.installed or not check.usable:
        said = "; ".join(f"{m.problem} ({m.cure})" for m in broken) or "it does not run"
        return Refusal(
            Code.AGENT_UNAVAILABLE,
            f"seat {seat}: {where} cannot run {agent}: {said}",
            f"install it there (`cotal tools install`; `cotal doctor` shows what is missing), "
            f"or {elsewhere}{tail}",
        )
    installed = check.version
    if recorded is None or installed is None:
        return None
    found = f"seat {seat}: {where} has {agent} {installed} ({check.path}), the seat {ran} "
    found += f"{recorded} at the source"
    if measured is None:
        if harness_version_key(recorded) == harness_version_key(installed):
            return None
        return Refusal(
            Code.HARNESS_VERSION,
            found,
            f"install {agent} {recorded} at the destination (`cotal tools install`, or "
            f"agents.{agent}.binary in its cotal.toml), or {elsewhere}{tail}",
        )
    if not measured.admits(recorded):
        return Refusal(
            Code.HARNESS_VERSION,
            f"{found}, and this build's {agent} connector resumes sessions of {agent} "
            f"{measured} only",
            f"install at the destination a cotal whose {agent} connector was measured against "
            f"{recorded}, then its harness (`cotal tools install`), or run the seat under "
            f"{agent} {measured} at the source and cut it again{tail}",
        )
    if not measured.admits(installed):
        return Refusal(
            Code.HARNESS_VERSION,
            f"{found}; this build's {agent} connector resumes sessions of {agent} {measured} only",
            f"install {agent} {recorded} at the destination (`cotal tools install`, or "
            f"agents.{agent}.binary in its cotal.toml), or {elsewhere}{tail}",
        )
    return None


def harnesses(
    adm: Admission,
    settings_for: Mapping[str, Mapping[str, Any]],
    *,
    checks: Mapping[str, HarnessCheck] | None = None,
) -> None:
    """The harness gate, with identity's: each seat whose checkpoint records its harness's
    version is admitted only when the version it ran and the one installed here (as its
    connector's check finds it, once per agent, or as `checks` gives it) are both versions this
    host's connector was measured against (`harness_refusal`, the probe's own decision). A
    checkpoint sealed before the version travelled is admitted as before. Blocking (a
    `--version` run of each harness): call it off the event loop."""
    pins = Pins.load()
    found: dict[str, HarnessCheck] = dict(checks or {})
    for name, record in adm.records.items():
        if record.harness_version is msgspec.UNSET:
            continue
        agent = adm.agent(name).launch.connector
        connector = registry.load_connector(agent)
        if agent not in found:
            try:
                found[agent] = harness_check(connector, settings_for.get(agent, {}), pins)
            except Refusal as exc:
                raise _refuse(
                    "identity",
                    exc.code,
                    f"this host's settings for {agent}: {exc.message}",
                    f"{exc.cure}; nothing was claimed",
                ) from None
        refusal = harness_refusal(
            name,
            agent,
            record.harness_version,
            found[agent],
            measured_versions(connector, pins),
            where="this host",
            ran="ran",
            elsewhere="resume it on a host that has it",
            tail="; nothing was claimed",
        )
        if refusal is not None:
            raise _refuse("identity", refusal.code, refusal.message, refusal.cure)


def _seat_relocation(
    adm: Admission, name: str, record: SeatCheckpoint, root: Path, user_maps: dict[Path, Path]
) -> Relocation:
    """How the seat's recorded paths carry onto this root (`relocation`)."""
    if record.workspace_root is None or record.custody_revision is None:
        raise _refuse(
            "identity",
            Code.OLD_CHECKPOINT,
            f"seat {name}: the checkpoint records no workspace root or custody revision",
            "cut the seat again with this version of cotal",
        )
    try:
        return relocation(
            Path(record.workspace_root),
            root,
            user_maps,
            old_cwd=Path(os.path.normpath(adm.agent(name).launch.cwd)),
        )
    except Refusal as exc:
        raise _refuse("identity", exc.code, f"seat {name}: {exc.message}", exc.cure) from None


def _check_uid_free(
    name: str, uid: str, live_uids: Collection[str], held_uids: Collection[str]
) -> None:
    """Refuse a seat whose uid this root's manager holds or the broker sees live."""
    if uid in held_uids:
        raise _refuse(
            "identity",
            Code.UID_HELD,
            f"seat {name} (uid {uid}) is already held by this root's manager",
            "this seat is live here; do not resume it twice",
        )
    if uid in live_uids:
        raise _refuse(
            "identity",
            Code.UID_LIVE,
            f"retained principal {name} (uid {uid}) is already live at the broker and this "
            "runtime "
            "cannot authoritatively adopt it",
            "stop the running incarnation first (presence expires 6 s after it stops), or "
            "pass --monitor "
            "so cotal can verify its predecessor is gone",
        )


def _check_profile(
    adm: Admission,
    name: str,
    record: SeatCheckpoint,
    settings_for: Mapping[str, Mapping[str, Any]],
) -> None:
    """Refuse a seat whose launch profile here is not the revision the checkpoint recorded."""
    agent = adm.agent(name)
    # The permission is the entry's own: this root's `[seats.NAME] allow_send` is not asked.
    expected = registry.profile_digest(
        agent.launch.connector,
        agent.launch.model,
        settings_for.get(agent.launch.connector, {}),
        agent.launch.allow_send,
        agent.launch.subscribe,
        agent.launch.allow_post,
    )
    if expected != record.profile:
        raise _refuse(
            "identity",
            Code.PROFILE_DRIFT,
            f"seat {name}: this host's launch profile for {agent.launch.connector} has "
            "revision "
            f"{expected}, the checkpoint recorded {record.profile}",
            "make cotal.toml here match the source's settings for that agent; a resumed "
            "session never runs under a different profile (its --allow-send is part of it, "
            "and only the checkpoint's own entry gives it: an entry altered since the cut "
            "cannot be admitted)",
        )


def _check_landing(adm: Admission, name: str, maps: Mapping[Path, Path], *, root: Path) -> None:
    """The seat's tree and each session file's directory, where a --map places them, checked
    by the rule the restore's write checks again (`landing`); nothing is written here."""
    confined = adm.confined[name]
    try:
        verdict = check_tree(
            confined.cwd, maps, dest_root=root, base=adm.records[name].repository.base
        )
        for directory in sorted({target.path.parent for _, target in confined.sessions}):
            check_store(directory, maps, dest_root=root)
    except Refusal as exc:
        raise _refuse("identity", exc.code, f"seat {name}: {exc.message}", exc.cure) from None
    if verdict is not None:
        adm.landings[name] = verdict


def _home() -> Path:
    return Path(os.path.expanduser("~"))


def confine(
    adm: Admission, name: str, *, root: Path, home: Path, reloc: Relocation | None = None
) -> ConfinedSeat:
    """Every place seat `name` would write on this host, each refused by name when it is not
    the seat's own: `cwd-unmapped`, `cwd-outside-root`, `unsafe-store`, `session-outside-store`,
    `unsafe-session-path` (a symlink already on the way counts, so nothing is written first).

    `reloc` carries the seat's recorded paths onto this root (by default the recorded root is
    this one). A relocated seat's connector then says where its store files land and what in
    them names the old path (`connectors.base.relocate_session`).
    """
    record = adm.records[name]
    launch = adm.agent(name).launch
    try:
        if reloc is None:
            reloc = relocation(
                Path(record.workspace_root or root),
                root,
                {},
                old_cwd=Path(os.path.normpath(launch.cwd)),
            )
        maps = dict(reloc.pairs)
        for store in launch.session_stores:
            map_store(name, store, reloc)
        cwd = confine_cwd(name, launch.cwd, root=root, maps=maps)
        paths = seat_paths(
            name,
            record.lifecycle_uid,
            launch.connector,
            launch.session_stores,
            root=root,
            maps=maps,
        )
        placed: list[tuple[SessionFile, SessionTarget]] = []
        session = record.session
        entries = [(session.pointer, True)] if session.pointer is not None else []
        entries += [(entry, False) for entry in session.store]
        for entry, is_pointer in entries:
            target = session_target(
                entry, paths, pointer=is_pointer, cwd=cwd, root=root, home=home, maps=maps
            )
            placed.append((entry, target))
        move = _connector_move(name, launch.connector, placed, paths.stores, reloc, session)
        placed = [(e, _moved(name, t, paths.stores, move)) for e, t in placed]
        for _, target in placed:
            probe_session_target(target)
    except Refusal as exc:
        raise _refuse("identity", exc.code, exc.message, exc.cure) from None
    return ConfinedSeat(
        cwd=cwd, sessions=tuple(placed), continuity=move.continuity, why=move.why, reloc=reloc
    )


def _store_of(path: Path, stores: Sequence[Path]) -> Path | None:
    return next((s for s in stores if path.is_relative_to(s) and path != s), None)


def _connector_move(
    name: str,
    agent: str,
    placed: Sequence[tuple[SessionFile, SessionTarget]],
    stores: Sequence[Path],
    reloc: Relocation,
    session: SessionRecord,
) -> SessionMove:
    if not reloc.moves:
        return SessionMove()
    files = []
    for _, target in placed:
        store = _store_of(target.path, stores)
        if store is not None:
            files.append(target.path.relative_to(store).as_posix())
    try:
        connector: object = registry.load_connector(agent)
    except Refusal:
        # The daemon refuses an unknown harness by name at adoption; a store no connector
        # claims travels unchanged.
        return SessionMove()
    move = relocate_session(connector, files, reloc, session.session_id)
    if move.continuity is not None and not move.why:
        raise Refusal(
            Code.RELOCATION_FAILED,
            f"seat {name}: the {agent} connector capped the class at {move.continuity} without "
            "saying why",
            "report this; a class change must be explained",
        )
    return move


def _moved(
    name: str, target: SessionTarget, stores: Sequence[Path], move: SessionMove
) -> SessionTarget:
    store = _store_of(target.path, stores)
    if store is None:
        return target
    step = move.files.get(target.path.relative_to(store).as_posix())
    if step is None:
        return target
    dest = Path(os.path.normpath(store / step.relpath))
    if (
        step.relpath.startswith("/")
        or ".." in step.relpath.split("/")
        or _store_of(dest, [store]) is None
    ):
        raise Refusal(
            Code.RELOCATION_FAILED,
            f"seat {name}: its connector would move {target.path} to {dest}, outside its store "
            f"{store}",
            "report this; a relocated session file stays in its own store",
        )
    return SessionTarget(target.base, dest.relative_to(target.base).as_posix(), step.head)


def recency(
    adm: Admission,
    *,
    now: datetime,
    clock: ClockReading,
    accept_stale: bool,
    skew_ms: int = CLOCK_SKEW_MS,
) -> list[Consent]:
    """Gate 3: capturedAt against this host's clock and the recorded horizon, once the kernel
    says this clock is kept in step; an untrusted clock refuses before any age is judged."""
    if not clock.synchronized:
        raise _refuse(
            "recency",
            Code.CLOCK_UNSYNCHRONIZED,
            f"this host's clock is not synchronized ({clock.detail}), so no checkpoint's age can "
            "be judged against it",
            "synchronize the clock (start chrony, ntpd or systemd-timesyncd and wait until "
            "`timedatectl` or `chronyc tracking` reports it synchronized), then retry; on a host "
            "that cannot run a time daemon (a container whose clock its host keeps), declare it "
            'in cotal.toml: [recency] clock = "trusted" with clock_reason (journaled and '
            "printed with every admission it decides); no per-run override exists",
        )
    consents: list[Consent] = []
    for name, record in adm.records.items():
        consent = _judge_age(name, record, now=now, accept_stale=accept_stale, skew_ms=skew_ms)
        if consent is not None:
            consents.append(consent)
    adm.consents = consents
    return consents


def _judge_age(
    name: str, record: SeatCheckpoint, *, now: datetime, accept_stale: bool, skew_ms: int
) -> Consent | None:
    """Refuse a seat captured in the future or, without `accept_stale`, beyond its horizon;
    the consent that admits a stale one."""
    try:
        captured = parse_instant(record.captured_at)
    except ValueError:
        raise _refuse(
            "recency",
            Code.UNREADABLE_TIME,
            f"seat {name}: capturedAt {record.captured_at!r} is unreadable",
            "no override exists: cut the seat again",
        ) from None
    age_ms = int((now - captured).total_seconds() * 1000)
    if age_ms < -skew_ms:
        raise _refuse(
            "recency",
            Code.FUTURE_CHECKPOINT,
            f"seat {name}: capturedAt {record.captured_at} is {-age_ms} ms later than this "
            "host's clock "
            f"({now.isoformat()}), beyond the {skew_ms} ms skew allowed",
            "fix this host's clock (or the source's) and retry, or widen `[recency] skew_s` "
            "in this root's cotal.toml if the two clocks are known to differ; no override "
            "exists",
        )
    if age_ms <= record.recency_horizon_ms:
        return None
    if not accept_stale:
        raise _refuse(
            "recency",
            Code.STALE_CHECKPOINT,
            f"seat {name}: capturedAt {record.captured_at} is {age_ms} ms old at this "
            "host's clock "
            f"({now.isoformat()}), beyond its horizon of {record.recency_horizon_ms} ms",
            "pass --accept-stale-checkpoint to resume it anyway (the consent is journaled)",
        )
    return Consent(
        seat=name,
        captured_at=record.captured_at,
        age_ms=age_ms,
        horizon_ms=record.recency_horizon_ms,
    )
