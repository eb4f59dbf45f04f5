"""The sealed checkpoint format: one `checkpoint.json` per seat and one `manifest.json` per attempt.

Pure records, strict decoders, the signing payload and the continuity cap; a directory is sealed
exactly when its record exists (docs/design.md, "The core modules, in detail").
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Final, Literal, TypeVar

import msgspec

from protocol.codec import decode_json, encode_json
from protocol.errors import DecodeError
from protocol.instant import parse_instant
from protocol.names import (
    FILE_NAME,
    REF_NAME,
    SEAT_NAME,
    SEAT_OWNER,
    AttemptIdField,
    FileNameField,
    HeadRefField,
    InstanceIdField,
    InstantField,
    LifecycleUidField,
    ObjectIdField,
    SeatNameField,
    Sha256Field,
    SpaceField,
    chan_stream,
    chan_subject,
    chathist_durable,
    dm_durable,
    dm_filter,
    dm_stream,
)
from protocol.names import OBJECT_ID as _OBJECT_ID

SEAT_CHECKPOINT_FORMAT: Final = "cotal-seat-checkpoint/v1"
MANIFEST_FORMAT: Final = "cotal-checkpoint-manifest/v1"

CHECKPOINT_FILE = "checkpoint.json"
MANIFEST_FILE = "manifest.json"
RESUME_FILE = "resume.json"
# Names the writer itself publishes; a captured file can never take one of them.
RESERVED_FILES = frozenset({CHECKPOINT_FILE, MANIFEST_FILE})

CHECKPOINT_CAP = 256 * 1024
MANIFEST_CAP = 1024 * 1024
DEFAULT_RECENCY_HORIZON_MS = 24 * 60 * 60 * 1000

# Repository artifacts inside a seat directory.
BUNDLE_FILE = "repo.bundle"
INDEX_DIFF_FILE = "index.diff"
WORKTREE_DIFF_FILE = "worktree.diff"
UNTRACKED_FILE = "untracked.tar"
REFS_FILE = "refs.txt"
STATUS_FILE = "status.z"
INTENT_TO_ADD_FILE = "intent-to-add.z"
GIT_CONFIG_FILE = "git-config"
INFO_EXCLUDE_FILE = "git-info-exclude"
HOOK_FILE_PREFIX = "hook-"
# A shallow clone's boundary (`.git/shallow`, one commit id a line), carried as it is.
SHALLOW_FILE = "git-shallow"
# 100,000 commits of the longer hash: a boundary that wide is not a shallow clone any more.
SHALLOW_CAP = 65 * 100_000
# A sparse checkout: its patterns (`.git/info/sparse-checkout`) as they are, and the index
# entries marked skip-worktree, each path NUL-ended in index order.
SPARSE_PATTERNS_FILE = "git-sparse-checkout"
SKIP_WORKTREE_FILE = "skip-worktree.z"
ASSUME_UNCHANGED_FILE = "assume-unchanged.z"
UNWATCHED_FILE = "unwatched.tar"
SPARSE_PATTERNS_CAP = 1 << 20
SKIP_WORKTREE_CAP = 64 << 20
MAX_SKIP_WORKTREE = 1_000_000
# `.git/config.worktree`, which `git sparse-checkout` writes its settings into (with
# `extensions.worktreeConfig` in the config): carried byte for byte, never with a credential.
WORKTREE_CONFIG_FILE = "git-config-worktree"
# Git LFS objects the checkout and the stash point at: their list (`<oid> <size>\n` a line, in
# oid order, each once) and their bytes, concatenated in the list's order. An object's oid is
# the sha256 of its bytes, so each is proven by its own name as it is written at the destination.
LFS_LIST_FILE = "lfs-objects.txt"
LFS_PACK_FILE = "lfs-objects.pack"
MAX_LFS_OBJECTS = 100_000
LFS_LIST_CAP = MAX_LFS_OBJECTS * 86
# A submodule's artifacts sit beside the superproject's under a prefix of their own: its
# parent's prefix and `sm<n>-`, n its place among its parent's gitlinks (nested up to four deep).
MAX_SUBMODULES = 100
MAX_SUBMODULE_DEPTH = 4
_ONE_PREFIX = r"sm[1-9][0-9]{0,2}-"
SUBMODULE_PREFIX_RE = re.compile(f"(?:{_ONE_PREFIX}){{1,{MAX_SUBMODULE_DEPTH}}}")
_FILE_PREFIX_RE = re.compile(f"((?:{_ONE_PREFIX}){{1,{MAX_SUBMODULE_DEPTH}}})index\\.diff")
# Above this many bytes the porcelain status and intent-to-add list leave checkpoint.json (whose
# cap is 256 KiB) for files of their own; below it they stay inline, as older records have them.
LISTS_INLINE_CAP = 64 * 1024
# The space artifact: every inbox message at or above the durable's first undelivered sequence.
INBOX_FILE = "inbox.jsonl"
# A subscribed channel's posts above the seat's ack floor in it, one file per channel.
CHANNEL_FILE_PREFIX = "chan-"
MAX_CARRIED_CHANNELS = 64
# A seat's dead letters, carried beside its inbox so a cut or a move never waits on the operator
# (protocol/deadletter.py). At most what the dead-letter stream keeps for one seat, bounded in
# bytes as the inbox is, apart from it: they are never delivered, so they do not share its cap.
DEAD_LETTER_FILE = "dead-letters.jsonl"
MAX_CARRIED_DEAD_LETTERS = 10_000
# The seat's sent ledger: the ids of what it sent and posted inside the recency horizon, so a
# turn that runs again at the destination has those sends dropped there as well
# (manager/broker/sent.py). Bounded as a busy seat's horizon of sends, apart from the inbox.
SENT_FILE = "sent.jsonl"
MAX_CARRIED_SENT = 100_000

# A checkpoint carries an inbox, not a mailbox archive: past these the cut refuses by name.
MAX_CARRIED_MESSAGES = 10_000
MAX_CARRIED_BYTES = 64 * 1024 * 1024
MAX_CARRIED_HEADERS = 32
MAX_SUBJECT_CHARS = 512
MAX_HEADER_CHARS = 4096
# Headers are counted as inbox.jsonl writes them (one message's headers as a JSON object). A
# message cotal sends has one or two of a few dozen bytes; the broker would take up to its
# max_payload of them, which 10,000 messages turn into gigabytes for a destination to hold.
MAX_MESSAGE_HEADER_BYTES = 8 * 1024
MAX_CARRIED_HEADER_BYTES = 16 * 1024 * 1024
# One line of inbox.jsonl: a payload the broker admits (1 MiB) in base64, plus its headers.
INBOX_LINE_CAP = 2 * 1024 * 1024
# A line besides its headers and payload: the keys, the sequence and the subject escaped (at
# most 6 bytes a character).
_LINE_FRAME_CAP = 96 + 6 * MAX_SUBJECT_CHARS
# The largest inbox.jsonl the caps above admit (about 132 MiB, the base64 payload most of it):
# a destination refuses a larger one before reading it, and holds no more than this of it.
INBOX_FILE_CAP = (
    4 * (MAX_CARRIED_BYTES // 3 + 1 + MAX_CARRIED_MESSAGES)
    + MAX_CARRIED_MESSAGES * _LINE_FRAME_CAP
    + MAX_CARRIED_HEADER_BYTES
)

CONTROL_DIR = ".cotal"
# A restore into a root that is a mount point stages inside the root itself (a rename cannot
# leave the mount), so these two name prefixes are reserved there and never captured.
INCOMING_PREFIX = ".cotal-incoming-"
SUPERSEDED_PREFIX = ".cotal-superseded-"

# The untracked selection rules this format knows. The record carries the text so that a
# destination can refuse a rule it cannot reproduce (record 1.1) instead of restoring a thinner
# tree; `.cotal/` is excluded because in the single-root case it holds the manager's secrets.
# The legacy text predates the reserved staging names and is still read.
LEGACY_UNTRACKED_SELECTION = "git ls-files --others --exclude-standard -z, excluding .cotal/"
UNTRACKED_SELECTION = (
    "git ls-files --others --exclude-standard -z, excluding .cotal/, "
    f"{INCOMING_PREFIX}*/ and {SUPERSEDED_PREFIX}*/"
)
DECLARED_IGNORED = "; plus declared ignored: "
_CARRY_GLOB_OK = re.compile(r"[^\x00-\x1f\x7f\\:,\[\]!{}]+")

ContinuityClass = Literal["exact", "fork", "fresh", "drain-only"]
# The seat's harness at the cut: its connector's name, and the version that connector's check
# reported (printable ASCII, no space at either end, at most 128 characters).
HARNESS_NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,63}$"
HARNESS_VERSION_PATTERN = r"^[\x21-\x7e](?:[\x20-\x7e]{0,126}[\x21-\x7e])?$"
HarnessName = Annotated[str, msgspec.Meta(pattern=HARNESS_NAME_PATTERN, max_length=64)]
HarnessVersion = Annotated[str, msgspec.Meta(pattern=HARNESS_VERSION_PATTERN, max_length=128)]
Anchor = Literal["cwd", "workspace-root", "home"]

FILE_NAME_RE = FILE_NAME.regex
FileName = FileNameField
Sha256Hex = Sha256Field
ObjectId = ObjectIdField
Instant = InstantField
NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(gt=0)]
SpaceName = SpaceField
SeatName = SeatNameField
LifecycleUid = LifecycleUidField
InstanceId = InstanceIdField
AttemptId = AttemptIdField
HeadRef = HeadRefField
_REFS_LINE = re.compile(rf"({_OBJECT_ID.body}) ({REF_NAME.body})")


def _check_instant(field: str, text: str) -> None:
    try:
        parse_instant(text)
    except ValueError:
        raise ValueError(f"{field} {text!r} is not a real calendar instant") from None


# -- paths --------------------------------------------------------------------------------------


def check_relpath(field: str, path: str) -> str:
    """A relative POSIX path that cannot climb out of the directory it is resolved against."""
    if not path or len(path) > 4096:
        raise ValueError(f"{field} must be a non-empty relative path of at most 4096 characters")
    if "\x00" in path or "\\" in path:
        raise ValueError(f"{field} {path!r} contains a NUL or a backslash")
    if path.startswith("/"):
        raise ValueError(f"{field} {path!r} is absolute; it must be relative to its anchor")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise ValueError(f"{field} {path!r} has an empty, '.' or '..' segment")
    return path


def _in_control_dir(path: str) -> bool:
    return path == CONTROL_DIR or path.startswith(CONTROL_DIR + "/")


def check_carry_pattern(pattern: str) -> str:
    """One declared ignored path to carry: a relative path or a simple `*`/`?` glob under the
    repository, never `..`, absolute, `.git/`, the control directory or a reserved staging name.
    """
    check_relpath("carry include", pattern)
    if not _CARRY_GLOB_OK.fullmatch(pattern):
        raise ValueError(
            f"carry include {pattern!r} may hold only path characters and the globs * and ?; "
            "no control characters, backslash, ':', ',', '!', braces or brackets"
        )
    first = pattern.split("/")[0].casefold()
    if first in (".git", CONTROL_DIR) or first.startswith((INCOMING_PREFIX, SUPERSEDED_PREFIX)):
        raise ValueError(
            f"carry include {pattern!r} points into .git/, {CONTROL_DIR}/ or a restore's "
            "staging directory, none of which a checkpoint carries"
        )
    return pattern


def selection_rule(include: list[str]) -> str:
    """The exact untracked selection text for a capture that also carries `include`."""
    if not include:
        return UNTRACKED_SELECTION
    return UNTRACKED_SELECTION + DECLARED_IGNORED + ", ".join(include)


def check_repository_lists(status: str, intent_to_add: list[str]) -> None:
    """The porcelain status parses, and every intent-to-add entry is a safe path it shows."""
    try:
        entries = porcelain_by_path(status)
    except ValueError as exc:
        raise ValueError(f"status: {exc}") from None
    for path in intent_to_add:
        check_relpath("intentToAdd entry", path)
        if _in_control_dir(path) or path == ".git" or path.startswith(".git/"):
            raise ValueError(f"intentToAdd entry {path!r} is inside .cotal/ or .git/")
        # An intent-to-add entry is invisible in the index diff and always differs from
        # the worktree, so status shows it as " A" (file present) or " D" (file gone).
        if entries.get(path) not in (" A", " D"):
            raise ValueError(f"intentToAdd entry {path!r} is not ' A' or ' D' in status")
    if len(set(intent_to_add)) != len(intent_to_add):
        raise ValueError("intentToAdd names a path twice")


def parse_intent_to_add(data: bytes) -> list[str]:
    """The out-of-line intent-to-add list: UTF-8 paths, each NUL-terminated."""
    if data and not data.endswith(b"\0"):
        raise ValueError("intent-to-add list is not NUL-terminated")
    try:
        return [p.decode("utf-8") for p in data.split(b"\0")[:-1]] if data else []
    except UnicodeDecodeError:
        raise ValueError("intent-to-add list is not UTF-8") from None


# -- porcelain status and refs list --------------------------------------------------------------


def parse_porcelain_z(status: str) -> list[tuple[str, str]]:
    """Split `git status --porcelain=v1 -z` text into (XY, path) pairs.

    A rename or copy entry carries its source as an extra NUL-terminated field; it is consumed
    and not returned, since restore only needs each path's own two status letters.
    """
    entries: list[tuple[str, str]] = []
    fields = status.split("\x00")
    if fields[-1] != "":
        raise ValueError("status must be NUL-terminated porcelain v1 -z text")
    fields.pop()
    i = 0
    while i < len(fields):
        item = fields[i]
        if len(item) < 4 or item[2] != " ":
            raise ValueError(f"status entry {item!r} is not 'XY path'")
        xy, path = item[:2], item[3:]
        entries.append((xy, path))
        i += 2 if xy[0] in "RC" else 1
    if i != len(fields):
        raise ValueError("status ends inside a rename entry")
    return entries


def porcelain_by_path(status: str) -> dict[str, str]:
    """Each path's two status letters (XY), keyed by path."""
    return {path: xy for xy, path in parse_porcelain_z(status)}


def format_refs_list(refs: Mapping[str, str]) -> bytes:
    """refs.txt: one `<oid> <refname>` line per ref, sorted by name, so it hashes stably."""
    return "".join(f"{refs[name]} {name}\n" for name in sorted(refs)).encode()


def parse_refs_list(data: bytes) -> dict[str, str]:
    """Inverse of `format_refs_list`; a malformed line is a ValueError naming it."""
    refs: dict[str, str] = {}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("refs list is not UTF-8") from None
    if text and not text.endswith("\n"):
        raise ValueError("refs list does not end with a newline")
    for line in text.splitlines():
        m = _REFS_LINE.fullmatch(line)
        if not m:
            raise ValueError(f"refs list line {line!r} is not '<oid> <refname>'")
        if m.group(2) in refs:
            raise ValueError(f"refs list names {m.group(2)} twice")
        refs[m.group(2)] = m.group(1)
    return refs


def parse_shallow_list(data: bytes) -> list[str]:
    """`.git/shallow` as git writes it: one commit id a line, each once, newline-ended, not
    empty (git deletes the file when the boundary is gone) and at most `SHALLOW_CAP` bytes. A
    malformed file is a ValueError naming what is wrong."""
    if not data:
        raise ValueError("the shallow list is empty; git removes .git/shallow instead")
    if len(data) > SHALLOW_CAP:
        raise ValueError(f"the shallow list holds {len(data)} bytes, over its {SHALLOW_CAP} cap")
    if not data.endswith(b"\n"):
        raise ValueError("the shallow list does not end with a newline")
    try:
        lines = data.decode("ascii").split("\n")[:-1]
    except UnicodeDecodeError:
        raise ValueError("the shallow list is not ASCII commit ids") from None
    seen: set[str] = set()
    for line in lines:
        if not _OBJECT_ID.regex.fullmatch(line):
            raise ValueError(f"shallow list line {line[:80]!r} is not a commit id")
        if line in seen:
            raise ValueError(f"the shallow list names {line} twice")
        seen.add(line)
    return lines


def stored_as(ref: FileRef, name: str) -> bool:
    """Whether `ref` is stored as `name`, after a submodule's prefix or none."""
    prefix = ref.file[: -len(name)] if ref.file.endswith(name) else None
    return prefix is not None and (prefix == "" or bool(SUBMODULE_PREFIX_RE.fullmatch(prefix)))


def parse_skip_worktree(data: bytes, what: str = "skip-worktree") -> list[str]:
    """The carried skip-worktree (or assume-unchanged: `what`) list: UTF-8 relative paths,
    each NUL-ended and named once, none in `.git/` or the control directory. A malformed list
    is a ValueError naming why."""
    if not data:
        raise ValueError(f"the {what} list is empty; an empty list is not carried")
    if len(data) > SKIP_WORKTREE_CAP:
        raise ValueError(
            f"the {what} list holds {len(data)} bytes, over its {SKIP_WORKTREE_CAP} cap"
        )
    if not data.endswith(b"\0"):
        raise ValueError(f"the {what} list is not NUL-terminated")
    try:
        paths = data.decode("utf-8").split("\0")[:-1]
    except UnicodeDecodeError:
        raise ValueError(f"the {what} list is not UTF-8") from None
    if len(paths) > MAX_SKIP_WORKTREE:
        raise ValueError(f"the {what} list names more than {MAX_SKIP_WORKTREE} paths")
    for path in paths:
        check_relpath(f"{what} entry", path)
        first = path.split("/")[0].casefold()
        if first in (".git", CONTROL_DIR):
            raise ValueError(f"{what} entry {path!r} is inside .git/ or {CONTROL_DIR}/")
    if len(set(paths)) != len(paths):
        raise ValueError(f"the {what} list names a path twice")
    return paths


_LFS_LINE_RE = re.compile(rb"([0-9a-f]{64}) (0|[1-9][0-9]{0,15})")


def parse_lfs_list(data: bytes) -> list[tuple[str, int]]:
    """`lfs-objects.txt` as the capture writes it: `<oid> <size>` a line, newline-ended, in oid
    order, each oid once; as (oid, size) pairs."""
    if not data:
        raise ValueError("the LFS object list is empty; an empty list is not carried")
    if len(data) > LFS_LIST_CAP:
        raise ValueError(
            f"the LFS object list holds {len(data)} bytes, over its {LFS_LIST_CAP} cap"
        )
    if not data.endswith(b"\n"):
        raise ValueError("the LFS object list does not end with a newline")
    objects: list[tuple[str, int]] = []
    for line in data[:-1].split(b"\n"):
        found = _LFS_LINE_RE.fullmatch(line)
        if found is None:
            raise ValueError(f"LFS object list line {line[:100]!r} is not `<sha256> <size>`")
        oid = found.group(1).decode("ascii")
        if objects and oid <= objects[-1][0]:
            raise ValueError(f"the LFS object list names {oid} out of order or twice")
        objects.append((oid, int(found.group(2))))
    if len(objects) > MAX_LFS_OBJECTS:
        raise ValueError(f"the LFS object list names more than {MAX_LFS_OBJECTS} objects")
    return objects


def format_lfs_list(objects: Iterable[tuple[str, int]]) -> bytes:
    return b"".join(b"%s %d\n" % (oid.encode("ascii"), size) for oid, size in objects)


# -- records ------------------------------------------------------------------------------------


class FileRef(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """A captured file: its basename inside the seat (or attempt) directory, size and digest."""

    file: FileName
    bytes: NonNegative
    sha256: Sha256Hex


class CarriedHook(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """One `.git/hooks/<name>` (never a `*.sample`), its permission bits and its bytes, stored
    as `hook-<name>` after its repository's prefix (a submodule's `sm<n>-`)."""

    name: FileName
    mode: Annotated[int, msgspec.Meta(ge=0, le=0o777)]
    file: FileRef

    def __post_init__(self) -> None:
        if self.name.endswith(".sample"):
            raise ValueError(f"hook {self.name!r} is a sample; samples are not carried")
        stored = HOOK_FILE_PREFIX + self.name
        if not stored_as(self.file, stored):
            raise ValueError(
                f"hook {self.name!r} must be stored as {stored!r} after its repository's "
                f"prefix, not {self.file.file!r}"
            )


class StashEntry(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """One `refs/stash` reflog entry: the stash commit and the subject `git stash list` shows."""

    oid: ObjectId
    message: str

    def __post_init__(self) -> None:
        if len(self.message) > 4096 or any(c in self.message for c in "\n\r\x00"):
            raise ValueError("stash message must be one line of at most 4096 characters")


# An incremental bundle names at most this many predecessor commits it leaves out; any subset is
# still correct (fewer exclusions only carry more), and the record stays under its cap.
MAX_PREREQUISITES = 2048
# How many predecessors a chain may walk before the reader refuses it as a loop or a runaway.
MAX_CHAIN = 64


class IncrementalLink(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """The predecessor an incremental bundle builds on (design decision "Incremental cuts").

    `attemptId` is the sealed attempt that held this seat before; `checkpointSha256` is the
    digest of that attempt's `<seat>/checkpoint.json`, which pins its bundle and its own link in
    turn, so the whole chain is fixed by this one record's signature; `bundleSha256` repeats the
    predecessor's bundle digest (None when it carried none) for a reader that names what
    differs. `prerequisites` are the predecessor's commits this bundle leaves out: the
    destination must already hold them, which is what restoring the chain oldest first proves.
    """

    attempt_id: AttemptId
    checkpoint_sha256: Sha256Hex
    bundle_sha256: Sha256Hex | None
    prerequisites: Annotated[list[ObjectId], msgspec.Meta(max_length=MAX_PREREQUISITES)]

    def __post_init__(self) -> None:
        if len(set(self.prerequisites)) != len(self.prerequisites):
            raise ValueError("since.prerequisites names a commit twice")


class PrecopyLink(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """The history `cotal move` shipped before its fence (design decision "Pre-copy").

    `bundleSha256` and `bundleBytes` name the pre-copied bundle (`git bundle create --all` of
    the seat's repository while it still ran), which travels outside the checkpoint: the
    destination holds it as `<bundleSha256>.bundle` in its pre-copy directory, or beside the
    attempt directory. The record's signature pins it by digest, so it is proven before it is
    used, like a predecessor's bundle. `prerequisites` are its commits this record's bundle
    leaves out.
    """

    bundle_sha256: Sha256Hex
    bundle_bytes: NonNegative
    prerequisites: Annotated[list[ObjectId], msgspec.Meta(max_length=MAX_PREREQUISITES)]

    def __post_init__(self) -> None:
        if len(set(self.prerequisites)) != len(self.prerequisites):
            raise ValueError("precopy.prerequisites names a commit twice")


class SparseRecord(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """A sparse checkout (or any index entries marked skip-worktree): `skipWorktree` lists every
    such entry (`skip-worktree.z`, `entries` paths), none of them present in the worktree at the
    cut, None when there were none; `patterns` is `.git/info/sparse-checkout` byte for byte
    (`git-sparse-checkout`), None when the repository had none. Cone or not, and a sparse index
    or not, are the config's (`core.sparseCheckout`, `core.sparseCheckoutCone`, `index.sparse`),
    which travels with the config and `worktreeConfig`."""

    skip_worktree: FileRef | None = None
    entries: Annotated[int, msgspec.Meta(ge=0, le=MAX_SKIP_WORKTREE)] = 0
    patterns: FileRef | None = None

    def __post_init__(self) -> None:
        if self.skip_worktree is None and self.patterns is None:
            raise ValueError("sparse carries skipWorktree, patterns or both, never neither")
        if (self.skip_worktree is None) != (self.entries == 0):
            raise ValueError("sparse.entries counts the skipWorktree list, and only it")
        if self.skip_worktree is None:
            pass
        elif not stored_as(self.skip_worktree, SKIP_WORKTREE_FILE):
            raise ValueError(
                f"sparse.skipWorktree must be stored as {SKIP_WORKTREE_FILE!r} after its "
                f"repository's prefix, not {self.skip_worktree.file!r}"
            )
        elif not 0 < self.skip_worktree.bytes <= SKIP_WORKTREE_CAP:
            raise ValueError(
                f"sparse.skipWorktree names {self.skip_worktree.bytes} bytes; the list is 1 to "
                f"{SKIP_WORKTREE_CAP} bytes"
            )
        if self.patterns is not None:
            if not stored_as(self.patterns, SPARSE_PATTERNS_FILE):
                raise ValueError(
                    f"sparse.patterns must be stored as {SPARSE_PATTERNS_FILE!r} after its "
                    f"repository's prefix, not {self.patterns.file!r}"
                )
            if self.patterns.bytes > SPARSE_PATTERNS_CAP:
                raise ValueError(
                    f"sparse.patterns names {self.patterns.bytes} bytes, over its "
                    f"{SPARSE_PATTERNS_CAP} cap"
                )


class LfsRecord(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """The Git LFS objects a repository's checkout (its HEAD tree, index and working tree) and
    its stash point at, read from its LFS storage: `objects` is their list (`lfs-objects.txt`,
    `count` lines of `<oid> <size>`), `pack` their bytes in the list's order
    (`lfs-objects.pack`), both named with the repository's prefix. The destination writes each
    into its own LFS storage, proving its bytes hash to its oid, before anything is checked out,
    so no LFS server is ever asked."""

    objects: FileRef
    pack: FileRef
    count: Annotated[int, msgspec.Meta(ge=1, le=MAX_LFS_OBJECTS)]

    def check_named(self, prefix: str) -> None:
        for ref, name in ((self.objects, LFS_LIST_FILE), (self.pack, LFS_PACK_FILE)):
            if ref.file != prefix + name:
                raise ValueError(f"lfs files must be stored as {prefix + name!r}, not {ref.file!r}")
        if not 0 < self.objects.bytes <= LFS_LIST_CAP:
            raise ValueError(
                f"lfs.objects names {self.objects.bytes} bytes; the list is 1 to {LFS_LIST_CAP}"
            )


class UnwatchedRecord(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """The index entries whose files git does not compare with the index, so no diff carries
    their worktree bytes: `assumeUnchanged` lists every entry marked assume-unchanged
    (`assume-unchanged.z`, `entries` paths), None when there were none; `files` is an archive
    (`unwatched.tar`, `present` members) of the worktree bytes of each such entry, and of each
    skip-worktree entry (`SparseRecord`), whose file was present at the cut, None when none
    was. An assume-unchanged entry the archive does not hold had no file at the cut. How an
    operator keeps a local edit of a tracked file out of git's sight travels as it was."""

    assume_unchanged: FileRef | None = None
    entries: Annotated[int, msgspec.Meta(ge=0, le=MAX_SKIP_WORKTREE)] = 0
    files: FileRef | None = None
    present: Annotated[int, msgspec.Meta(ge=0, le=MAX_SKIP_WORKTREE)] = 0

    def __post_init__(self) -> None:
        if self.assume_unchanged is None and self.files is None:
            raise ValueError("unwatched carries assumeUnchanged, files or both, never neither")
        if (self.assume_unchanged is None) != (self.entries == 0):
            raise ValueError("unwatched.entries counts the assumeUnchanged list, and only it")
        if (self.files is None) != (self.present == 0):
            raise ValueError("unwatched.present counts the files archive's members, and only it")
        for ref, name in (
            (self.assume_unchanged, ASSUME_UNCHANGED_FILE),
            (self.files, UNWATCHED_FILE),
        ):
            if ref is not None and not stored_as(ref, name):
                raise ValueError(
                    f"unwatched stores {name!r} after its repository's prefix, not {ref.file!r}"
                )
        if (
            self.assume_unchanged is not None
            and not 0 < self.assume_unchanged.bytes <= SKIP_WORKTREE_CAP
        ):
            raise ValueError(
                f"unwatched.assumeUnchanged names {self.assume_unchanged.bytes} bytes; the list "
                f"is 1 to {SKIP_WORKTREE_CAP} bytes"
            )


class RepositoryRecord(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """The seat's repository at the cut: history, the two diffs, untracked bytes, index extras.

    `base` is HEAD's commit; `head` is the branch HEAD pointed at (None when detached), so the
    restore can reattach HEAD instead of leaving the seat on a detached checkout. `base` is None
    on an unborn branch (no commit yet): `head` names it, the index diff stages every file
    against the empty tree, and the bundle carries the repository's other refs (none: no
    bundle). `status` is
    `git status --porcelain=v1 -z --untracked-files=all --no-renames` under the selection rule,
    re-read by the restore in the promoted tree. `intentToAdd` lists the `git add -N` entries the
    two diffs cannot carry (peers.md 6); their bytes travel in the worktree diff. When the two
    lists are large they live in `statusFile` and `intentToAddFile` instead, and the inline
    fields are empty. `refs` lists every ref at the cut, because cloning a bundle recreates only
    branches and tags and drops refs/stash; it is None only when the repository had no refs.

    From `.git` exactly three things travel: `config` (with any credential in it redacted and the
    redacted keys named in `configRedacted`), `hooks` and `infoExclude`. `stash` is every
    `refs/stash` reflog entry, newest first; the bundle carries each of their commits. `include`
    is the operator's declared ignored paths, also spelled out in `untrackedSelection`.

    `since` is set on an incremental capture: the bundle then carries only what is new since
    the predecessor attempt it names, and refs whose tips the predecessor already carried are
    in `refs` but not in the bundle's header. `bundle` is None only there, when nothing at all
    was new (git refuses to write an empty bundle).

    `shallow` is a shallow clone's boundary, `.git/shallow` byte for byte (`git-shallow`): the
    bundle of a shallow history holds the boundary commits but not their parents, so the
    restore writes it back before anything reads the history. A shallow record's bundle is
    always a full one (docs/design.md decision 17). `sparse` is a sparse checkout's patterns
    and skip-worktree entries (`SparseRecord`), and `worktreeConfig` is `.git/config.worktree`
    (`git-config-worktree`), where `git sparse-checkout` keeps its settings. Each of the three is
    `UNSET`, and so absent from the encoding, where the repository has no such thing, so a
    record sealed before these shapes travelled encodes, and so verifies, exactly as it was
    signed. `submodules` is every gitlink of the index, in index order, each a
    `SubmoduleRecord` whose checked-out submodule is a `RepositoryRecord` of its own, its files
    named with its prefix (`sm<n>-`) and listed by `files()`; `UNSET` without any. `lfs` is the
    Git LFS objects the checkout and the stash point at (`LfsRecord`), `UNSET` for a repository
    that uses no LFS. `unwatched` is the entries git does not compare with their files and the
    bytes of those files (`UnwatchedRecord`), `UNSET` without any.
    """

    base: ObjectId | None
    untracked_selection: str
    bundle: FileRef | None
    index_diff: FileRef
    worktree_diff: FileRef
    untracked: FileRef
    status: str = ""
    intent_to_add: list[str] = []
    head: HeadRef | None = None
    refs: FileRef | None = None
    status_file: FileRef | None = None
    intent_to_add_file: FileRef | None = None
    config: FileRef | None = None
    config_redacted: list[str] = []
    hooks: list[CarriedHook] = []
    info_exclude: FileRef | None = None
    stash: list[StashEntry] = []
    include: list[str] = []
    since: IncrementalLink | None = None
    precopy: PrecopyLink | None = None
    shallow: FileRef | msgspec.UnsetType = msgspec.UNSET
    sparse: SparseRecord | msgspec.UnsetType = msgspec.UNSET
    worktree_config: FileRef | msgspec.UnsetType = msgspec.UNSET
    submodules: list[SubmoduleRecord] | msgspec.UnsetType = msgspec.UNSET
    lfs: LfsRecord | msgspec.UnsetType = msgspec.UNSET
    unwatched: UnwatchedRecord | msgspec.UnsetType = msgspec.UNSET

    def __post_init__(self) -> None:
        for ref, name in self._prefixed_refs():
            if ref.file != self.file_prefix + name:
                raise ValueError(f"{ref.file!r} must be stored as {self.file_prefix + name!r}")
        if self.submodules is not msgspec.UNSET:
            self._check_submodules(self.submodules)
        if self.lfs is not msgspec.UNSET:
            self.lfs.check_named(self.file_prefix)
        if self.since is not None and self.precopy is not None:
            raise ValueError("a record builds on a predecessor (since) or a pre-copy, not both")
        if self.shallow is not msgspec.UNSET:
            if self.shallow.file != self.file_prefix + SHALLOW_FILE:
                raise ValueError(
                    f"shallow must be stored as {self.file_prefix + SHALLOW_FILE!r}, not "
                    f"{self.shallow.file!r}"
                )
            if not 0 < self.shallow.bytes <= SHALLOW_CAP:
                raise ValueError(
                    f"shallow names {self.shallow.bytes} bytes; a shallow list is 1 to "
                    f"{SHALLOW_CAP} bytes"
                )
            if self.incremental:
                raise ValueError("a shallow record carries a full bundle, never since or precopy")
        if self.worktree_config is not msgspec.UNSET:
            if not stored_as(self.worktree_config, WORKTREE_CONFIG_FILE):
                raise ValueError(
                    f"worktreeConfig must be stored as {WORKTREE_CONFIG_FILE!r} after its "
                    f"repository's prefix, not {self.worktree_config.file!r}"
                )
            if self.worktree_config.bytes > 1 << 20:
                raise ValueError("worktreeConfig names more than 1 MiB; a config is smaller")
        if self.base is None:
            if self.head is None:
                raise ValueError("a record without a base is of an unborn branch, which head names")
            if self.incremental or self.shallow is not msgspec.UNSET:
                raise ValueError("an unborn branch's record builds on nothing and is not shallow")
            if self.bundle is None and self.refs is not None:
                raise ValueError("an unborn branch's record carries its refs in a bundle")
        elif self.bundle is None and not self.incremental:
            raise ValueError(
                "bundle may be absent only from an incremental record (since or precopy) or "
                "from an unborn branch's without refs"
            )
        for pattern in self.include:
            check_carry_pattern(pattern)
        if len(set(self.include)) != len(self.include):
            raise ValueError("include names a pattern twice")
        legacy = not self.include and self.untracked_selection == LEGACY_UNTRACKED_SELECTION
        if not legacy and self.untracked_selection != selection_rule(self.include):
            raise ValueError(
                f"untrackedSelection {self.untracked_selection!r} is not the rule this reader "
                f"reproduces ({selection_rule(self.include)!r})"
            )
        if (self.status_file is None) != (self.intent_to_add_file is None):
            raise ValueError("statusFile and intentToAddFile come together or not at all")
        if self.status_file is not None:
            if self.status or self.intent_to_add:
                raise ValueError("status and intentToAdd are empty when their files carry them")
        else:
            check_repository_lists(self.status, self.intent_to_add)
        names = [hook.name for hook in self.hooks]
        if len(set(names)) != len(names):
            raise ValueError("hooks names a hook twice")
        for hook in self.hooks:
            if hook.file.file != self.file_prefix + HOOK_FILE_PREFIX + hook.name:
                raise ValueError(
                    f"hook {hook.name!r} of this repository must be stored as "
                    f"{self.file_prefix + HOOK_FILE_PREFIX + hook.name!r}"
                )
        for key in self.config_redacted:
            if not key or len(key) > 1024 or any(ord(c) < 32 for c in key):
                raise ValueError("configRedacted entries must be printable config key names")
        if self.config_redacted and self.config is None:
            raise ValueError("configRedacted names keys of a config the record does not carry")

    def _prefixed_refs(self) -> list[tuple[FileRef, str]]:
        """The artifacts of a fixed name a sparse checkout or unwatched entries add, each with
        that name: stored after this repository's prefix (a submodule's `sm<n>-`)."""
        found: list[tuple[FileRef | None, str]] = []
        if self.sparse is not msgspec.UNSET:
            found += [
                (self.sparse.skip_worktree, SKIP_WORKTREE_FILE),
                (self.sparse.patterns, SPARSE_PATTERNS_FILE),
            ]
        if self.worktree_config is not msgspec.UNSET:
            found.append((self.worktree_config, WORKTREE_CONFIG_FILE))
        if self.unwatched is not msgspec.UNSET:
            found += [
                (self.unwatched.assume_unchanged, ASSUME_UNCHANGED_FILE),
                (self.unwatched.files, UNWATCHED_FILE),
            ]
        return [(ref, name) for ref, name in found if ref is not None]

    @property
    def file_prefix(self) -> str:
        """The prefix every artifact of this repository carries: empty for the seat's own
        repository, `sm<n>-` (nested: its parent's and its own) for a submodule's."""
        found = _FILE_PREFIX_RE.fullmatch(self.index_diff.file)
        return found.group(1) if found else ""

    def _check_submodules(self, submodules: list[SubmoduleRecord]) -> None:
        if not submodules or len(submodules) > MAX_SUBMODULES:
            raise ValueError(f"submodules lists 1 to {MAX_SUBMODULES} gitlinks, or is absent")
        paths = [sub.path for sub in submodules]
        if len(set(paths)) != len(paths):
            raise ValueError("submodules names a path twice")
        names = [sub.name for sub in submodules if sub.name is not None]
        if len(set(names)) != len(names):
            raise ValueError("submodules names a module twice")
        for n, sub in enumerate(submodules, 1):
            want = f"{self.file_prefix}sm{n}-"
            if sub.prefix != want:
                raise ValueError(f"submodule {sub.path!r} must carry the prefix {want!r}")

    def check_files_named(self, prefix: str) -> None:
        """Every artifact of a fixed name is stored as `prefix` and that name."""
        fixed = (
            (self.bundle, BUNDLE_FILE),
            (self.index_diff, INDEX_DIFF_FILE),
            (self.worktree_diff, WORKTREE_DIFF_FILE),
            (self.untracked, UNTRACKED_FILE),
            (self.refs, REFS_FILE),
            (self.status_file, STATUS_FILE),
            (self.intent_to_add_file, INTENT_TO_ADD_FILE),
            (self.config, GIT_CONFIG_FILE),
            (self.info_exclude, INFO_EXCLUDE_FILE),
        )
        for ref, name in fixed:
            if ref is not None and ref.file != prefix + name:
                raise ValueError(f"{ref.file!r} must be stored as {prefix + name!r}")

    @property
    def incremental(self) -> bool:
        """The bundle leaves out commits the destination must already hold."""
        return self.since is not None or self.precopy is not None

    @property
    def prerequisites(self) -> list[str]:
        base = self.since or self.precopy
        return list(base.prerequisites) if base is not None else []

    def files(self) -> list[FileRef]:
        """Every file this record names, in a stable order."""
        files = [self.bundle] if self.bundle is not None else []
        files += [self.index_diff, self.worktree_diff, self.untracked]
        optional = (
            self.refs,
            self.status_file,
            self.intent_to_add_file,
            self.config,
            self.info_exclude,
        )
        files.extend(ref for ref in optional if ref is not None)
        files.extend(hook.file for hook in self.hooks)
        if self.shallow is not msgspec.UNSET:
            files.append(self.shallow)
        if self.sparse is not msgspec.UNSET:
            files.extend(
                ref for ref in (self.sparse.skip_worktree, self.sparse.patterns) if ref is not None
            )
        if self.worktree_config is not msgspec.UNSET:
            files.append(self.worktree_config)
        if self.lfs is not msgspec.UNSET:
            files += [self.lfs.objects, self.lfs.pack]
        if self.unwatched is not msgspec.UNSET:
            files.extend(
                ref
                for ref in (self.unwatched.assume_unchanged, self.unwatched.files)
                if ref is not None
            )
        if self.submodules is not msgspec.UNSET:
            for sub in self.submodules:
                if sub.repository is not None:
                    files.extend(sub.repository.files())
        return files


class SubmoduleRecord(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """One gitlink of a repository's index and the submodule checked out there.

    `path` is where the gitlink lies in its parent repository and `commit` the commit the
    parent's index pins there. `name` is the module's name (its git dir is `modules/<name>`
    under its parent's git dir) and `repository` the submodule's own capture: its full bundle,
    its diffs, its untracked files, its config (credentials redacted as the seat's own are),
    and its own submodules, every file named with `prefix`. Both are None for a submodule that
    was not checked out (an empty directory): only its gitlink travels.
    """

    path: str
    commit: ObjectId
    prefix: str
    name: str | None = None
    repository: RepositoryRecord | None = None
    # True for a gitlink whose directory was gone from the worktree (its status ` D`); `UNSET`
    # otherwise, so a record of before encodes as it was signed.
    absent: bool | msgspec.UnsetType = msgspec.UNSET

    def __post_init__(self) -> None:
        check_relpath("submodule path", self.path)
        parts = [part.casefold() for part in self.path.split("/")]
        if parts[0] == CONTROL_DIR or ".git" in parts:
            raise ValueError(f"submodule path {self.path!r} is inside .git/ or {CONTROL_DIR}/")
        if not SUBMODULE_PREFIX_RE.fullmatch(self.prefix):
            raise ValueError(f"submodule prefix {self.prefix!r} is not sm<n>- up to four deep")
        if (self.name is None) != (self.repository is None):
            raise ValueError("a submodule carries its name and its repository together, or neither")
        if self.absent is not msgspec.UNSET and (not self.absent or self.name is not None):
            raise ValueError("absent is true, of a submodule with no checkout, or not there")
        if self.name is None or self.repository is None:
            return
        check_relpath("submodule name", self.name)
        if len(self.name) > 1024:
            raise ValueError("a submodule name is at most 1024 characters")
        repo = self.repository
        if repo.file_prefix != self.prefix:
            raise ValueError(f"submodule {self.path!r} files must carry the prefix {self.prefix!r}")
        repo.check_files_named(self.prefix)
        if repo.config is None:
            raise ValueError("a submodule carries its config (its core.worktree, its remotes)")
        if repo.bundle is None or repo.incremental or repo.include:
            raise ValueError("a submodule carries a full bundle and no declared ignored paths")


class SessionFile(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """A session file and where it goes back: an anchor plus a relative path, never absolute."""

    anchor: Anchor
    relpath: str
    file: FileRef

    def __post_init__(self) -> None:
        check_relpath("relpath", self.relpath)


class SessionRecord(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    continuity: ContinuityClass
    session_id: str | None = None
    pointer: SessionFile | None = None
    store: list[SessionFile] = []

    def __post_init__(self) -> None:
        if self.session_id is not None and (
            not self.session_id.strip() or len(self.session_id) > 4096
        ):
            raise ValueError("sessionId must be non-blank and at most 4096 characters")
        # A class is a promise about bytes the artifact contains (record, Status): a
        # continuation or fork needs the pointer, at least one store file and the id to reopen.
        if self.continuity in ("exact", "fork"):
            if self.pointer is None or not self.store or self.session_id is None:
                raise ValueError(
                    f"continuity {self.continuity!r} requires sessionId, pointer and at least one "
                    "store file"
                )


class Signer(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """Who sealed: the manager instance and its raw Ed25519 public key, base64."""

    public_key: str
    instance_id: InstanceId

    def __post_init__(self) -> None:
        if len(_b64("publicKey", self.public_key)) != 32:
            raise ValueError("publicKey must be 32 bytes of raw Ed25519 key, base64")


def _b64(field: str, text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{field} is not valid base64") from None


def _check_signature_shape(signature: str) -> None:
    # "" is the unsigned form the signing payload is computed over; the reader refuses it.
    if signature and len(_b64("signature", signature)) != 64:
        raise ValueError("signature must be 64 bytes of Ed25519 signature, base64")


# -- the space half: a seat's inbox durable and its unacknowledged messages ---------------------

BrokerId = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{32}$")]
Sequence = Annotated[int, msgspec.Meta(ge=1)]
Subject = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_SUBJECT_CHARS)]


def first_undelivered(ack_floor: int, creation_lower_bound: int, first_seq: int) -> int:
    """Record 1.3's conservative rule: the rebuilt durable starts at or below where the old one
    stood, so an acknowledgement taken out of order above the floor is delivered again."""
    return max(ack_floor + 1, creation_lower_bound, first_seq)


class DurableRecord(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """One of the seat's durables at the cut (its `dm_` inbox, or its `chathist_` frontier in a
    channel): its configuration and contiguous ack floor, and the stream's bounds, so a
    destination can rebuild it at `startSeq` in any broker."""

    name: str
    stream: str
    filter_subject: Subject
    ack_wait_ms: Positive
    max_ack_pending: Positive
    creation_lower_bound: Sequence
    ack_floor: NonNegative
    delivered: NonNegative
    first_seq: NonNegative
    last_seq: NonNegative
    start_seq: Sequence

    def __post_init__(self) -> None:
        if not self.ack_floor <= self.delivered <= self.last_seq:
            raise ValueError(
                f"durable {self.name}: ackFloor {self.ack_floor} <= delivered {self.delivered} <= "
                f"lastSeq {self.last_seq} does not hold"
            )
        for field, value in (
            ("firstSeq", self.first_seq),
            ("creationLowerBound", self.creation_lower_bound),
        ):
            if value > self.last_seq + 1:
                raise ValueError(
                    f"durable {self.name}: {field} {value} is beyond lastSeq {self.last_seq} + 1"
                )
        rule = first_undelivered(self.ack_floor, self.creation_lower_bound, self.first_seq)
        if self.start_seq != rule:
            raise ValueError(
                f"durable {self.name}: startSeq {self.start_seq} is not max(ackFloor+1, "
                f"creationLowerBound, firstSeq) = {rule}"
            )


class CustodyAtCut(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """The seat's custody record as the cut read it at the broker."""

    holder: InstanceId
    generation: NonNegative
    revision: Positive


def channel_file(channel: str) -> str:
    return f"{CHANNEL_FILE_PREFIX}{channel}.jsonl"


def _check_window(what: str, messages: int, durable: DurableRecord) -> None:
    if messages > durable.last_seq - durable.start_seq + 1:
        raise ValueError(
            f"{messages} carried {what} cannot fit between startSeq {durable.start_seq} and "
            f"lastSeq {durable.last_seq}"
        )


class ChannelState(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """A subscribed seat's frontier in one channel at the cut: its `chathist_` durable and the
    posts above its ack floor (in `posts`, one `CarriedMessage` per line, each addressed to the
    channel's subject under a message id of this seat's own), so a destination on another
    broker rebuilds the frontier where it stood instead of at its own activation moment."""

    channel: Annotated[str, msgspec.Meta(pattern=SEAT_NAME.pattern)]
    durable: DurableRecord
    messages: Annotated[int, msgspec.Meta(ge=0, le=MAX_CARRIED_MESSAGES)]
    message_bytes: Annotated[int, msgspec.Meta(ge=0, le=MAX_CARRIED_BYTES)]
    posts: FileRef

    def __post_init__(self) -> None:
        if self.posts.file != channel_file(self.channel):
            raise ValueError(
                f"the posts of #{self.channel} must be {channel_file(self.channel)!r}, not "
                f"{self.posts.file!r}"
            )
        _check_window(f"posts of #{self.channel}", self.messages, self.durable)


class DeadLetterState(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """A seat's dead letters at the cut: how many, their payload bytes, and the file holding
    them (`dead-letters.jsonl`, one `CarriedMessage` per line: its id at the source as `seq`,
    the seat's dead-letter subject, its `Cotal-Dead-*` headers and the message's own bytes).
    A destination puts them back into its own dead-letter stream, still dead letters."""

    letters: Annotated[int, msgspec.Meta(ge=1, le=MAX_CARRIED_DEAD_LETTERS)]
    letter_bytes: Annotated[int, msgspec.Meta(ge=0, le=MAX_CARRIED_BYTES)]
    file: FileRef

    def __post_init__(self) -> None:
        if self.file.file != DEAD_LETTER_FILE:
            raise ValueError(f"dead letters must be {DEAD_LETTER_FILE!r}, not {self.file.file!r}")


MessageId = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{32}$")]


class SentEntry(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True, gc=False):
    """One send or post of a seat as its sent ledger remembers it: the id derived from the turn
    (`protocol.meshcall.send_message_id`, `post_message_id`), which it was, and the sequence the
    broker that stored it gave it. The same record is the ledger's value and a `sent.jsonl`
    line."""

    id: MessageId
    kind: Literal["send", "post"]
    seq: Sequence


class SentState(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """A seat's sent ledger at the cut: how many ids, and the file holding them (`sent.jsonl`,
    one `SentEntry` per line, ids in increasing order)."""

    entries: Annotated[int, msgspec.Meta(ge=1, le=MAX_CARRIED_SENT)]
    file: FileRef

    def __post_init__(self) -> None:
        if self.file.file != SENT_FILE:
            raise ValueError(f"the sent ledger must be {SENT_FILE!r}, not {self.file.file!r}")


class SpaceRecord(
    msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True, omit_defaults=True
):
    """What of the space travels with a seat: its inbox durable, the messages it has not
    acknowledged (in `inbox`, one `CarriedMessage` per line), its custody, and the identity of
    the broker it was cut from, so a destination can tell whether it shares that broker."""

    broker_id: BrokerId
    durable: DurableRecord
    custody: CustodyAtCut
    messages: Annotated[int, msgspec.Meta(ge=0, le=MAX_CARRIED_MESSAGES)]
    message_bytes: Annotated[int, msgspec.Meta(ge=0, le=MAX_CARRIED_BYTES)]
    inbox: FileRef
    # Omitted when empty (`omit_defaults`), so a record sealed before channels travelled
    # encodes, and so verifies, exactly as it was signed.
    channels: Annotated[list[ChannelState], msgspec.Meta(max_length=MAX_CARRIED_CHANNELS)] = (
        msgspec.field(default_factory=list)
    )
    # Omitted when the seat held none, for the same reason.
    dead_letters: DeadLetterState | None = None
    # Omitted when the seat sent nothing inside the horizon, for the same reason.
    sent: SentState | None = None

    def __post_init__(self) -> None:
        if self.inbox.file != INBOX_FILE:
            raise ValueError(f"inbox must be {INBOX_FILE!r}, not {self.inbox.file!r}")
        _check_window("messages", self.messages, self.durable)
        seen = [c.channel for c in self.channels]
        if len(set(seen)) != len(seen):
            raise ValueError("channels must name each channel once")
        # One bound for the whole space half: the channels' posts count with the inbox.
        posts = sum(c.messages for c in self.channels)
        posted = sum(c.message_bytes for c in self.channels)
        if self.messages + posts > MAX_CARRIED_MESSAGES or (
            self.message_bytes + posted > MAX_CARRIED_BYTES
        ):
            raise ValueError(
                f"the inbox and channels carry {self.messages + posts} messages of "
                f"{self.message_bytes + posted} bytes, more than a checkpoint carries "
                f"({MAX_CARRIED_MESSAGES} messages, {MAX_CARRIED_BYTES} bytes)"
            )


# What makes a subject not one literal subject, and a header value break out of its line.
_NOT_LITERAL = re.compile("[ \t\r\n\x00*>]")
_HEADER_BREAK = re.compile("[\r\n\x00]")


class CarriedMessage(
    msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True, gc=False
):
    """One inbox message as the source stream held it: its original sequence, subject, headers
    (with `Nats-Msg-Id`, so a republish into a broker that still holds it is a duplicate) and
    payload, base64."""

    seq: Sequence
    subject: Subject
    headers: dict[str, str]
    payload: str

    def __post_init__(self) -> None:
        if _NOT_LITERAL.search(self.subject):
            raise ValueError(f"subject {self.subject!r} is not a literal subject")
        if len(self.headers) > MAX_CARRIED_HEADERS:
            raise ValueError(f"message {self.seq} carries more than {MAX_CARRIED_HEADERS} headers")
        for key, value in self.headers.items():
            if (
                not key
                or len(key) + len(value) > MAX_HEADER_CHARS
                or _HEADER_BREAK.search(key)
                or _HEADER_BREAK.search(value)
            ):
                raise ValueError(f"message {self.seq} header {key[:64]!r} is malformed")
        self.data()

    def data(self) -> bytes:
        try:
            return binascii.a2b_base64(self.payload, strict_mode=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"message {self.seq} payload is not valid base64") from None

    def payload_bytes(self) -> int:
        """len(self.data()) without decoding it again: the payload was proven strict, padded
        base64 when the message was made, so its length says exactly how many bytes it holds."""
        text = self.payload
        return len(text) // 4 * 3 - (2 if text.endswith("==") else 1 if text.endswith("=") else 0)

    @property
    def msg_id(self) -> str | None:
        return self.headers.get("Nats-Msg-Id")


class SpaceExport(msgspec.Struct, frozen=True):
    """A seat's inbox and custody as the broker held them after its stop was proven: what the
    broker side reads and the capture writes down (as `SpaceRecord` plus `inbox.jsonl`)."""

    broker_id: BrokerId
    durable: DurableRecord
    custody: CustodyAtCut
    messages: list[CarriedMessage]
    channels: list[ChannelExport] = msgspec.field(default_factory=list)
    # The seat's dead letters (`DeadLetterState`), oldest first.
    dead_letters: list[CarriedMessage] = msgspec.field(default_factory=list)
    # The seat's sent ledger (`SentState`), ids in increasing order.
    sent: list[SentEntry] = msgspec.field(default_factory=list)


class ChannelExport(msgspec.Struct, frozen=True):
    """One subscribed channel's frontier as the broker held it at the cut (`ChannelState` plus
    its posts file, once written)."""

    channel: str
    durable: DurableRecord
    messages: list[CarriedMessage]


def encode_inbox(messages: list[CarriedMessage]) -> bytes:
    """inbox.jsonl: one normalized record per line, in stream order."""
    return b"".join(encode_json(m) + b"\n" for m in messages)


def header_bytes(headers: dict[str, str]) -> int:
    """A message's headers as inbox.jsonl carries them, in bytes."""
    return len(encode_json(headers))


class InboxOverCap(ValueError):
    """An inbox beyond what a checkpoint carries, rather than one that disagrees with its
    record."""


class InboxReader:
    """inbox.jsonl read a chunk at a time, so that a gate can prove it while hashing it and
    hold one line at most (`keep=False`). Each line is proven as it completes: decoded under
    `INBOX_LINE_CAP`, a sequence after the last and within the durable's window, a subject under
    the seat's filter, headers within `MAX_MESSAGE_HEADER_BYTES` and, with those before,
    within `MAX_CARRIED_HEADER_BYTES`; never more messages or payload bytes than the record
    names, nor more bytes than `INBOX_FILE_CAP`. A ValueError names the first line that is not;
    `InboxOverCap`, one of them, a cap passed."""

    def __init__(self, record: SpaceRecord | ChannelState, *, keep: bool) -> None:
        self.record = record
        self.keep = keep
        self.messages: list[CarriedMessage] = []
        self._file = record.posts.file if isinstance(record, ChannelState) else INBOX_FILE
        # A channel's frontier filters one literal subject; an inbox, everything under its own.
        self._literal = not record.durable.filter_subject.endswith(">")
        self._prefix = record.durable.filter_subject.removesuffix(">")
        self._pending = bytearray()
        self._read = 0
        self._lines = 0
        self._last = record.durable.start_seq - 1
        self._payload = 0
        self._headers = 0

    def feed(self, chunk: bytes) -> None:
        self._read += len(chunk)
        if self._read > INBOX_FILE_CAP:
            raise InboxOverCap(
                f"{self._file} is more than {INBOX_FILE_CAP} bytes, the most a checkpoint's "
                "inbox can be"
            )
        start = 0
        while (nl := chunk.find(b"\n", start)) >= 0:
            if self._pending:
                line = bytes(self._pending) + chunk[start:nl]
                self._pending.clear()
            else:
                line = chunk[start:nl]
            self._line(line)
            start = nl + 1
        if len(self._pending) + len(chunk) - start > INBOX_LINE_CAP:
            raise ValueError(
                f"{self._file} line {self._lines + 1} is longer than {INBOX_LINE_CAP} bytes"
            )
        self._pending += chunk[start:]

    def _line(self, line: bytes) -> None:
        self._lines += 1
        n, record = self._lines, self.record
        try:
            m = decode_json(line, CarriedMessage, what=f"{self._file} line {n}", cap=INBOX_LINE_CAP)
        except DecodeError as exc:
            raise ValueError(exc.message) from None
        if m.seq <= self._last or m.seq > record.durable.last_seq:
            raise ValueError(
                f"{self._file} line {n}: sequence {m.seq} is not after {self._last} and within "
                f"lastSeq {record.durable.last_seq}"
            )
        if self._literal:
            under = m.subject == self._prefix
        else:
            under = m.subject.startswith(self._prefix) and m.subject != self._prefix
        if not under:
            raise ValueError(
                f"{self._file} line {n}: subject {m.subject!r} is not under "
                f"{record.durable.filter_subject}"
            )
        carried = header_bytes(m.headers)
        if carried > MAX_MESSAGE_HEADER_BYTES:
            raise InboxOverCap(
                f"{self._file} line {n}: message {m.seq} carries {carried} bytes of headers, "
                f"more than the {MAX_MESSAGE_HEADER_BYTES} a message may"
            )
        self._headers += carried
        if self._headers > MAX_CARRIED_HEADER_BYTES:
            raise InboxOverCap(
                f"{self._file} line {n}: the headers of messages up to {m.seq} are "
                f"{self._headers} bytes, more than the {MAX_CARRIED_HEADER_BYTES} an inbox may "
                "carry"
            )
        self._last = m.seq
        self._payload += m.payload_bytes()
        if n > record.messages or self._payload > record.message_bytes:
            raise ValueError(
                f"{self._file} holds {n} message(s) of {self._payload} bytes by line {n}, more "
                f"than the record's {record.messages} of {record.message_bytes}"
            )
        self.proven(n, m)

    def proven(self, line: int, m: CarriedMessage) -> None:
        """Line `line` is proven against the record: kept with `keep`. A gate that judges each
        message further does it here, in the same read."""
        if self.keep:
            self.messages.append(m)

    def finish(self) -> list[CarriedMessage]:
        if self._pending:
            raise ValueError(f"{self._file} does not end with a newline")
        record = self.record
        if self._lines != record.messages or self._payload != record.message_bytes:
            raise ValueError(
                f"{self._file} holds {self._lines} message(s) of {self._payload} bytes, the "
                f"record says {record.messages} of {record.message_bytes}"
            )
        return self.messages


def decode_inbox(data: bytes, record: SpaceRecord | ChannelState) -> list[CarriedMessage]:
    """The carried messages, proven to be exactly what the record describes (`InboxReader`):
    the count and payload bytes it names, strictly increasing sequences inside the durable's
    window, every subject under the seat's filter, the header caps. A ValueError names the
    first line that is not."""
    reader = InboxReader(record, keep=True)
    reader.feed(data)
    return reader.finish()


class SeatCheckpoint(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """One seat at the cut (record 1.1). `entry` is the resume-inventory entry, unchanged."""

    format: Literal["cotal-seat-checkpoint/v1"]
    entry: dict[str, Any]
    space: SpaceName
    name: SeatName
    lifecycle_uid: LifecycleUid
    generation: NonNegative
    captured_at: Instant
    profile: Sha256Hex
    repository: RepositoryRecord
    session: SessionRecord
    recency_horizon_ms: Positive = DEFAULT_RECENCY_HORIZON_MS
    # The source's workspace root: paths in `entry` are absolute, so a destination whose root
    # differs would restore into the wrong place and must refuse by name.
    workspace_root: str | None = None
    # The custody record's revision at the cut: a destination claims the successor generation
    # by compare-and-set against exactly this revision.
    custody_revision: Positive | None = None
    # The seat's inbox and custody as they stood at the cut (None: a checkpoint from before the
    # space travelled, which resumes only against the broker it was cut from).
    space_state: SpaceRecord | None = None
    signer: Signer | None = None
    signature: str = ""
    # The seat's harness (its connector) and the version that connector's check reported at the
    # cut, which a destination compares with the versions its connector was measured against.
    # `UNSET`, and so absent from the encoding, in a record sealed before they travelled (which
    # encodes, and so verifies, exactly as it was signed), and the version where the check
    # could not tell it.
    harness: HarnessName | msgspec.UnsetType = msgspec.UNSET
    harness_version: HarnessVersion | msgspec.UnsetType = msgspec.UNSET
    # How the seat stood when captured: absent (a cut's proven stop, every record sealed before
    # standing checkpoints existed) or `turn-boundary`, a failover seat captured alive and idle
    # between two turns, its harness still running (docs/design.md, "Standing checkpoints").
    # It travels beside the continuity class, which says what the session bytes allow; this
    # says what the capture proved, and a reader must never take one for a proven stop.
    standing: Literal["turn-boundary"] | msgspec.UnsetType = msgspec.UNSET

    def __post_init__(self) -> None:
        _check_instant("capturedAt", self.captured_at)
        self._check_harness()
        if self.space_state is not None:
            self._check_space_state(self.space_state)
        if self.workspace_root is not None and not (
            self.workspace_root.startswith("/") and "\x00" not in self.workspace_root
        ):
            raise ValueError("workspaceRoot must be an absolute path")
        _check_signature_shape(self.signature)
        names = [ref.file for ref in checkpoint_files(self)]
        for name in names:
            if name in RESERVED_FILES:
                raise ValueError(
                    f"captured file {name!r} takes a name reserved for the sealed record"
                )
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(
                f"captured file names must be distinct; {', '.join(dupes)} appear twice"
            )

    def _check_harness(self) -> None:
        if self.harness is msgspec.UNSET:
            if self.harness_version is not msgspec.UNSET:
                raise ValueError("harnessVersion names the version of no harness")
            return
        launch = self.entry.get("launch")
        connector = launch.get("connector") if isinstance(launch, dict) else None
        if connector != self.harness:
            raise ValueError(
                f"harness {self.harness!r} is not the connector {connector!r} the entry launches"
            )

    def _check_space_state(self, state: SpaceRecord) -> None:
        # The record must describe this seat's own inbox and custody, or a destination could be
        # made to rebuild another seat's durable under this seat's name.
        want = {
            "name": dm_durable(SEAT_OWNER, self.name, self.lifecycle_uid),
            "stream": dm_stream(self.space),
            "filterSubject": dm_filter(self.space, SEAT_OWNER, self.name),
        }
        got = {
            "name": state.durable.name,
            "stream": state.durable.stream,
            "filterSubject": state.durable.filter_subject,
        }
        for field, value in want.items():
            if got[field] != value:
                raise ValueError(f"spaceState.durable.{field} {got[field]!r} is not {value!r}")
        launch = self.entry.get("launch")
        subscribed = launch.get("subscribe", []) if isinstance(launch, dict) else []
        for c in state.channels:
            # A frontier is carried only for a channel the sealed entry subscribes, so a
            # record cannot have a destination feed the seat a channel it never read.
            if c.channel not in subscribed:
                raise ValueError(
                    f"spaceState.channels carries #{c.channel}, which the seat does not subscribe"
                )
            mine = (
                chathist_durable(SEAT_OWNER, self.name, self.lifecycle_uid, c.channel),
                chan_stream(self.space),
                chan_subject(self.space, c.channel),
            )
            theirs = (c.durable.name, c.durable.stream, c.durable.filter_subject)
            if theirs != mine:
                raise ValueError(
                    f"spaceState.channels #{c.channel}: durable {theirs} is not this seat's {mine}"
                )
        if state.custody.generation != self.generation:
            raise ValueError(
                f"spaceState.custody.generation {state.custody.generation} is not the seat's "
                f"generation {self.generation}"
            )
        if self.custody_revision is not None and state.custody.revision != self.custody_revision:
            raise ValueError(
                f"spaceState.custody.revision {state.custody.revision} is not custodyRevision "
                f"{self.custody_revision}"
            )


class ManifestSeat(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    name: SeatName
    dir: FileName
    checkpoint: FileRef

    def __post_init__(self) -> None:
        if self.dir != self.name:
            raise ValueError(
                f"seat {self.name!r} must live in a directory of its own name, not {self.dir!r}"
            )
        if self.checkpoint.file != CHECKPOINT_FILE:
            raise ValueError(f"seat {self.name!r} checkpoint must be {CHECKPOINT_FILE!r}")


class AttemptManifest(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """Every seat sealed by one preservation attempt, and the resume document that goes with
    them."""

    format: Literal["cotal-checkpoint-manifest/v1"]
    attempt_id: AttemptId
    space: SpaceName
    created_at: Instant
    seats: list[ManifestSeat]
    resume: FileRef
    signer: Signer | None = None
    signature: str = ""

    def __post_init__(self) -> None:
        _check_instant("createdAt", self.created_at)
        _check_signature_shape(self.signature)
        dirs = [seat.dir for seat in self.seats]
        if len(set(dirs)) != len(dirs):
            raise ValueError("seats must name each seat once")
        if self.resume.file in RESERVED_FILES or self.resume.file in dirs:
            raise ValueError(
                f"resume file {self.resume.file!r} collides with the manifest or a seat directory"
            )


def checkpoint_files(record: SeatCheckpoint) -> list[FileRef]:
    """Every file a seat checkpoint names besides itself, in a stable order."""
    files = record.repository.files()
    if record.session.pointer is not None:
        files.append(record.session.pointer.file)
    files.extend(sf.file for sf in record.session.store)
    if record.space_state is not None:
        files.append(record.space_state.inbox)
        files.extend(c.posts for c in record.space_state.channels)
        if record.space_state.dead_letters is not None:
            files.append(record.space_state.dead_letters.file)
        if record.space_state.sent is not None:
            files.append(record.space_state.sent.file)
    return files


# -- signing, decoding, continuity --------------------------------------------------------------

Signed = TypeVar("Signed", SeatCheckpoint, AttemptManifest)


def signing_payload(record: SeatCheckpoint | AttemptManifest) -> bytes:
    """The bytes a signature covers: the normalized JSON of the record with `signature` empty.

    Normalized (sorted keys, no whitespace) so the signer and every reader derive the same
    bytes from the same record whatever the file on disk looks like. The `format` field is
    inside the payload, so a manifest signature can never verify as a seat checkpoint's.
    """
    return encode_json(msgspec.structs.replace(record, signature=""))


def with_signature(record: Signed, signer: Signer, signature: bytes) -> Signed:
    return msgspec.structs.replace(
        record, signer=signer, signature=base64.b64encode(signature).decode()
    )


def decode_seat_checkpoint(data: bytes) -> SeatCheckpoint:
    return decode_json(
        data, SeatCheckpoint, what=f"seat checkpoint {CHECKPOINT_FILE}", cap=CHECKPOINT_CAP
    )


def decode_manifest(data: bytes) -> AttemptManifest:
    return decode_json(data, AttemptManifest, what=f"checkpoint {MANIFEST_FILE}", cap=MANIFEST_CAP)


def continuity_capped(
    declared: ContinuityClass, has_pointer: bool, store_count: int, supports_fresh_start: bool
) -> ContinuityClass:
    """The class a checkpoint may record: the declared one, capped by the bytes it carries.

    exact and fork reopen a transcript, so they need the pointer that names the session and at
    least one store file holding it; without both the promise falls to a fresh start where the
    connector declares one, and to drain-only otherwise.
    """
    if declared in ("exact", "fork") and not (has_pointer and store_count >= 1):
        return "fresh" if supports_fresh_start else "drain-only"
    return declared
