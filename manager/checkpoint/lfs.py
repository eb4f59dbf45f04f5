"""Git LFS objects travel with the repository that uses them (issue 42, item 5).

A repository that uses LFS keeps each large file's bytes outside git: the tree holds a pointer
(`version https://git-lfs.github.com/spec/v1`, `oid sha256:<hex>`, `size <n>`) and the bytes
sit in the repository's LFS storage (`<common dir>/lfs/objects/<aa>/<bb>/<oid>`, or below
`lfs.storage`). The bundle carries the pointers; this module finds the objects they name and
carries them too, so the destination checks the tree out without asking any LFS server.

Which objects: every pointer in the HEAD tree, in the index, and in each stash entry's trees
(the stash commit, its index commit and its untracked commit), read from the LFS storage; and
each tracked file the working tree changed whose `filter` attribute is `lfs`, whose bytes are
the object git-lfs's clean filter makes of it, read from the file itself. A pointer whose object
is not in the storage (or not of the size it says) refuses `lfs-object-missing` at the
preflight, before any seat stops: `git lfs fetch --all` or `git lfs pull` fetches it while the
server is reachable. Nothing here runs git-lfs: the pointers are read with git alone.

Whether a repository uses LFS is decided without a git run, so a repository that does not pays
nothing: its storage directory exists, its own config sets a `filter.lfs` key, or its top-level
`.gitattributes` names `filter=lfs`.

The record (`protocol/checkpoint.py`, `LfsRecord`) names a list (`<oid> <size>` a line, in oid
order) and the objects' bytes concatenated in that order; both are covered by the seal's
digests like every artifact, and the destination proves each object hashes to its oid as it
writes it (manager/checkpoint/restore.py).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from connectors.privatefs import UnsafeFile, file_identity, open_regular
from manager.checkpoint.seal import ExclusiveFile
from protocol.checkpoint import (
    LFS_LIST_FILE,
    LFS_PACK_FILE,
    MAX_LFS_OBJECTS,
    FileRef,
    LfsRecord,
    StashEntry,
    format_lfs_list,
)
from protocol.errors import Refusal
from protocol.refusals import Code

# git-lfs reads a blob as a candidate pointer only below this size, and so does this module.
POINTER_CAP = 1024
_POINTER_RE = re.compile(
    rb"version https://git-lfs\.github\.com/spec/v1\n"
    rb"(?:ext-[0-9]-[a-z0-9]+ sha256:[0-9a-f]{64}\n)*"
    rb"oid sha256:([0-9a-f]{64})\nsize (0|[1-9][0-9]{0,15})\n"
)
# The filter git-lfs installs (`git lfs install`), given to the restore's checkout on the
# command line: the destination smudges the carried objects into the tree whatever its global
# config says, and never runs a filter program the checkpoint's config names there.
FILTER_FLAGS: tuple[str, ...] = (
    "-c",
    "filter.lfs.process=git-lfs filter-process",
    "-c",
    "filter.lfs.smudge=git-lfs smudge -- %f",
    "-c",
    "filter.lfs.clean=git-lfs clean -- %f",
    "-c",
    "filter.lfs.required=true",
)
_CHUNK = 1 << 20
_ATTRIBUTES_CAP = 1 << 20


def parse_pointer(data: bytes) -> tuple[str, int] | None:
    """The (oid, size) an LFS pointer names, or None when `data` is not a pointer."""
    if len(data) >= POINTER_CAP:
        return None
    found = _POINTER_RE.fullmatch(data)
    if found is None:
        return None
    return found.group(1).decode("ascii"), int(found.group(2))


def object_path(storage: Path, oid: str) -> Path:
    """Where git-lfs keeps an object below its storage directory."""
    return storage / "objects" / oid[:2] / oid[2:4] / oid


@dataclass(frozen=True)
class LfsObject:
    oid: str
    size: int
    # Where its bytes are read: the LFS storage, or a changed worktree file that is the object.
    source: Path
    # A path of the repository that names it, for a message.
    path: str


@dataclass(frozen=True)
class LfsFacts:
    storage: Path
    objects: tuple[LfsObject, ...]

    def key(self) -> tuple[tuple[str, int], ...]:
        return tuple((o.oid, o.size) for o in self.objects)


def uses_lfs(top: Path, common: Path, own_config: bytes | None) -> bool:
    """Whether the repository uses LFS, decided without a git run (see the module's text)."""
    if os.path.isdir(common / "lfs"):
        return True
    if own_config is not None and b"filter.lfs." in own_config:
        return True
    try:
        fd, _ = open_regular(top / ".gitattributes")
    except (OSError, UnsafeFile):
        return False
    with os.fdopen(fd, "rb") as stream:
        return b"filter=lfs" in stream.read(_ATTRIBUTES_CAP)


def storage_dir(common: Path, configured: str | None) -> Path:
    """The LFS storage: `lfs.storage` (relative to the common dir, as git-lfs reads it) or
    `<common>/lfs`."""
    if not configured:
        return common / "lfs"
    return Path(os.path.normpath(common / configured))


def check_own_storage(repo: Path, own_storage: str | None) -> None:
    """An `lfs.storage` in the repository's own config travels in its config, so it must name a
    directory inside the git dir: the destination writes the objects there, and a path outside
    it would name a directory of this host (or another repository's) at the destination."""
    if not own_storage:
        return
    parts = Path(own_storage).parts
    if os.path.isabs(own_storage) or ".." in parts:
        raise Refusal(
            Code.GITDIR_UNSUPPORTED,
            f"{repo} sets lfs.storage = {own_storage!r} in its own config, a directory outside "
            "its git dir; a checkpoint writes the LFS objects into the restored repository's "
            "own git dir",
            "move the objects into .git/lfs (`git config --unset lfs.storage`, then `git lfs "
            "fetch --all`), or set lfs.storage in your global config instead, then cut again",
        )


def stash_trees(stash: Sequence[StashEntry], parents: dict[str, list[str]]) -> list[str]:
    """Each stash entry's commit, its index commit and its untracked commit (when it has one)."""
    trees: list[str] = []
    for entry in stash:
        trees.append(entry.oid)
        trees.extend(parents.get(entry.oid, [])[1:3])
    return list(dict.fromkeys(trees))


def small_blobs_of_tree(listing: bytes) -> dict[str, str]:
    """`git ls-tree -r -l -z` as {blob: path} for the blobs small enough to be a pointer."""
    found: dict[str, str] = {}
    for entry in listing.split(b"\0"):
        if not entry:
            continue
        meta, _, path = entry.partition(b"\t")
        mode, kind, oid, size = meta.split()
        if kind == b"blob" and mode != b"120000" and size.isdigit() and int(size) < POINTER_CAP:
            found.setdefault(oid.decode("ascii"), path.decode("utf-8", "surrogateescape"))
    return found


def index_blobs(listing: bytes) -> dict[str, str]:
    """`git ls-files -s -z` as {blob: path} for the regular files of the index."""
    found: dict[str, str] = {}
    for entry in listing.split(b"\0"):
        if not entry:
            continue
        meta, _, path = entry.partition(b"\t")
        mode, oid, _stage = meta.split()
        if mode in (b"100644", b"100755"):
            found.setdefault(oid.decode("ascii"), path.decode("utf-8", "surrogateescape"))
    return found


def small_of_batch_check(out: bytes) -> list[str]:
    """`git cat-file --batch-check='%(objectname) %(objecttype) %(objectsize)'`: the small
    blobs."""
    small: list[str] = []
    for line in out.decode("ascii", "replace").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "blob" and int(parts[2]) < POINTER_CAP:
            small.append(parts[0])
    return small


def pointers_of_batch(out: bytes) -> dict[str, tuple[str, int]]:
    """`git cat-file --batch` output as {blob: (oid, size)} for the blobs that are pointers."""
    found: dict[str, tuple[str, int]] = {}
    at = 0
    while at < len(out):
        end = out.index(b"\n", at)
        header = out[at:end].split()
        if len(header) != 3:
            break
        blob, size = header[0].decode("ascii"), int(header[2])
        body = out[end + 1 : end + 1 + size]
        at = end + 1 + size + 1
        pointer = parse_pointer(body)
        if pointer is not None:
            found[blob] = pointer
    return found


def changed_in_worktree(status: str) -> list[str]:
    """The tracked paths whose worktree file differs from the index (`git status -z`'s second
    letter M or T)."""
    paths: list[str] = []
    for entry in status.split("\0"):
        if len(entry) > 3 and entry[2] == " " and entry[1] in "MT" and entry[0] != "?":
            paths.append(entry[3:])
    return paths


def lfs_paths_of_check_attr(out: bytes) -> list[str]:
    """`git check-attr -z filter` output: the paths whose filter is `lfs`."""
    fields = out.split(b"\0")
    return [
        fields[i].decode("utf-8", "surrogateescape")
        for i in range(0, len(fields) - 2, 3)
        if fields[i + 2] == b"lfs"
    ]


def worktree_object(top: Path, rel: str) -> LfsObject | tuple[str, int] | None:
    """The object a changed LFS-tracked worktree file is: a pointer left unsmudged names its
    object (oid, size), for the caller to find in the storage; anything else is its own bytes,
    hashed as git-lfs's clean filter would. None when it is not a regular file."""
    path = top / rel
    try:
        fd, st = open_regular(path)
    except (OSError, UnsafeFile):
        return None
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as stream:
        head = stream.read(POINTER_CAP)
        pointer = parse_pointer(head)
        if pointer is not None:
            return pointer
        digest.update(head)
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return LfsObject(oid=digest.hexdigest(), size=st.st_size, source=path, path=rel)


def stored_object(storage: Path, oid: str, size: int, rel: str) -> LfsObject | None:
    """The object in the storage, or None when it is absent or not the size its pointer says."""
    path = object_path(storage, oid)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        return None
    return LfsObject(oid=oid, size=size, source=path, path=rel)


def refuse_missing(repo: Path, storage: Path, missing: Sequence[tuple[str, str]]) -> Refusal:
    shown = ", ".join(f"{path} ({oid[:12]})" for path, oid in missing[:5])
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    return Refusal(
        Code.LFS_OBJECT_MISSING,
        f"{repo} uses Git LFS and {len(missing)} object(s) its checkout or stash points at are "
        f"not in its LFS storage {storage / 'objects'}, or not the size their pointer says: "
        f"{shown}{more}; a checkpoint carries LFS objects from that storage and never fetches "
        "them",
        f"run `git -C {repo} lfs fetch --all` (or `git -C {repo} lfs pull` for the checkout) "
        "while the LFS server is reachable, then cut again; nothing was stopped",
    )


def check_count(repo: Path, objects: Sequence[LfsObject]) -> None:
    if len(objects) > MAX_LFS_OBJECTS:
        raise Refusal(
            Code.LFS_OBJECT_MISSING,
            f"{repo} points at {len(objects)} Git LFS objects, over the {MAX_LFS_OBJECTS} a "
            "checkpoint carries",
            "commit fewer large files through LFS (or drop old stash entries), then cut again",
        )


def write_pack(
    seat_dir: Path, prefix: str, facts: LfsFacts, report: Callable[[int], None] | None = None
) -> LfsRecord:
    """The list and the objects' bytes into the seat directory, each object proven to hash to
    its oid as it is copied: one that changed since it was found refuses the capture."""
    listed = ExclusiveFile(seat_dir, prefix + LFS_LIST_FILE)
    pack = ExclusiveFile(seat_dir, prefix + LFS_PACK_FILE)
    try:
        listed.write(format_lfs_list(facts.key()))
        list_ref = listed.finish()
        for obj in facts.objects:
            _copy_object(obj, pack)
            if report is not None:
                report(pack.size)
        pack_ref: FileRef = pack.finish()
    except BaseException:
        listed.abort()
        pack.abort()
        raise
    return LfsRecord(objects=list_ref, pack=pack_ref, count=len(facts.objects))


def _copy_object(obj: LfsObject, out: ExclusiveFile) -> None:
    changed = Refusal(
        Code.CHANGED_DURING_CAPTURE,
        f"the Git LFS object {obj.oid} ({obj.path}, read from {obj.source}) changed while it "
        "was captured",
        "make sure nothing writes to the seat's repository, then cut again",
    )
    try:
        fd, before = open_regular(obj.source)
    except (OSError, UnsafeFile):
        raise changed from None
    digest = hashlib.sha256()
    copied = 0
    with os.fdopen(fd, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
            out.write(chunk)
            copied += len(chunk)
        after = os.fstat(stream.fileno())
    if (
        copied != obj.size
        or digest.hexdigest() != obj.oid
        or file_identity(before) != file_identity(after)
    ):
        raise changed
