"""The repository half of the resume (record 6 step 7) and session-file placement.

Everything is built in `<target>.incoming`, beside the target so the final renames stay on one
filesystem, and the target is touched only by the promotion, which runs after every step has
succeeded and the staged tree already shows the recorded status. A failure before promotion
leaves the target as it was and the staging directory as the evidence of what failed; nothing
here ever deletes a staging directory, because it is the only record of that failure.

A target that is a mount point stages inside itself instead (`<target>/.cotal-incoming-<stamp>`),
since a rename cannot cross out of a mount, and promotes by swapping entries within it.

The sequence, in order: verify every digest before any write; check the bundle carries exactly
the recorded refs; init and unbundle (an incremental seat's predecessors first, oldest first),
or move in the packs admission unbundled the same chain into; write back a shallow clone's
boundary and prove it names commits the bundle carried; verify the base; detach at the base; put
back the carried config, info/exclude and hooks; recreate the recorded refs (unbundling sets
none) and rebuild the stash reflog entry by entry; apply the index diff with --index; put back
intent-to-add entries whose file was gone at the cut; apply the worktree diff; mark the
remaining intent-to-add entries; extract the untracked archive under strict member rules; prove
no ignored file lies outside the recorded selection; reattach HEAD to its branch; put back a
sparse checkout's config.worktree and patterns, mark exactly the recorded entries skip-worktree
and take their files out of the tree (a sparse index is rebuilt from the patterns); set the
index's gitlinks as recorded and rebuild each checked-out submodule (its git dir under
`.git/modules/<name>`, its `.git` file, its carried config, then the same steps as above on its
own record, its own submodules within it); compare `git status`; promote; compare again in
place.

See docs/operations.md ("What a checkpoint carries").
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import re
import shutil
import stat
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio.to_thread
import msgspec

from connectors.privatefs import (
    DIR_MODE,
    UnsafeDirectory,
    fsync_dir,
    open_parent_below,
    read_stable,
    walk_below,
)
from manager.checkpoint import chain, lfs
from manager.checkpoint.admit import Scratch
from manager.checkpoint.confine import CURE_FORGED, lexical, parts_problem
from manager.checkpoint.gitstate import (
    EXCLUDE_CONTROL,
    EXCLUDE_STAGING,
    STATUS_ARGS,
    bundle_heads,
    heads_differing,
    read_refs,
    read_stash,
    run_git,
    settle_stat_data,
    submodule_gitfile,
)
from manager.checkpoint.landing import check_tree, mount_points
from manager.checkpoint.reader import verify_file
from protocol.checkpoint import (
    CONTROL_DIR,
    INCOMING_PREFIX,
    SUPERSEDED_PREFIX,
    FileRef,
    RepositoryRecord,
    SubmoduleRecord,
    check_repository_lists,
    parse_intent_to_add,
    parse_lfs_list,
    parse_refs_list,
    parse_shallow_list,
    parse_skip_worktree,
    porcelain_by_path,
)
from protocol.errors import Refusal
from protocol.names import STAMP
from protocol.refusals import Code

STAMP_RE = STAMP.regex
CHUNK = 1024 * 1024
_RESTORE_REFLOG = "cotal: restored from checkpoint"
_PACK_RE = re.compile(r"pack-[0-9a-f]{40,64}\.(pack|idx|rev)")
_MEMBER_ERRNOS = frozenset(
    {errno.ENAMETOOLONG, errno.ENOENT, errno.EINVAL, errno.ELOOP, errno.ENOTDIR, errno.EILSEQ}
)


@dataclass(frozen=True)
class RestoreResult:
    target: Path
    # Where the previous contents of the target went, or None when there was nothing to move.
    superseded: Path | None
    head: str | None
    status: str


def _show_status(status: str, limit: int = 600) -> str:
    text = status.replace("\x00", "\\0")
    return repr(text if len(text) <= limit else text[:limit] + "…")


# -- safe paths beneath a directory fd ----------------------------------------------------------


def _open_dirs(root_fd: int, rel: str, *, create: bool) -> tuple[int, str]:
    """Open the parent of `rel` beneath `root_fd`, creating missing directories if asked.

    A symlink anywhere on the way (one planted by an earlier archive member or carried in the
    tracked tree) refuses instead of being written through.
    """
    try:
        return open_parent_below(root_fd, rel, create_mode=0o777 if create else None)
    except UnsafeDirectory as exc:
        raise Refusal(
            Code.UNSAFE_ARCHIVE,
            f"{rel} would be written through {exc.path.name!r}, "
            "which is a symlink or not a directory",
            "the checkpoint is not one cotal captured; cut a new one on the source host",
        ) from None


def _check_member(member: tarfile.TarInfo, symlinks: set[str]) -> str:
    name = member.name
    problem = None
    if not name or "\x00" in name or "\\" in name:
        problem = "has an empty or unprintable name"
    elif name.startswith("/"):
        problem = "is an absolute path"
    elif any(part in ("", ".", "..") for part in name.split("/")):
        problem = "has an empty, '.' or '..' segment"
    elif name.split("/")[0].casefold() in (".git", CONTROL_DIR):
        problem = "lands in .git/ or the control directory"
    elif member.islnk():
        problem = "is a hard link"
    elif member.issym() and (not member.linkname or "\x00" in member.linkname):
        problem = "is a symlink with an empty or unprintable target"
    elif not (member.isreg() or member.issym()):
        problem = "is not a regular file or symlink (directory, device, fifo or other)"
    else:
        parts = name.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in symlinks:
                link = "/".join(parts[:i])
                problem = f"would be written through the symlink {link} an earlier member made"
                break
    if problem:
        raise Refusal(
            Code.UNSAFE_ARCHIVE,
            f"untracked archive member {name!r} {problem}",
            "the checkpoint is not one cotal captured; cut a new one on the source host",
        )
    return name


def _extract_untracked(tar_path: Path, root: Path, only: frozenset[str] | None = None) -> int:
    """Extract the untracked archive (or the unwatched one, whose members must all be among
    `only`) into `root`, member by member, creating nothing it must replace; how many members
    it held."""
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    tar_fd = os.open(tar_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    symlinks: set[str] = set()
    count = 0
    try:
        with os.fdopen(tar_fd, "rb") as stream, tarfile.open(fileobj=stream, mode="r:") as tar:
            for member in tar:
                name = _check_member(member, symlinks)
                count += 1
                if only is not None and name not in only:
                    raise Refusal(
                        Code.UNSAFE_ARCHIVE,
                        f"archive member {name!r} of {tar_path.name} is not an entry the record "
                        "marks assume-unchanged or skip-worktree",
                        "the checkpoint is not one cotal captured; cut a new one on the source "
                        "host",
                    )
                parent, leaf = _open_dirs(root_fd, name, create=True)
                try:
                    if member.issym():
                        os.symlink(member.linkname, leaf, dir_fd=parent)
                        symlinks.add(name)
                        continue
                    mode = member.mode & 0o777
                    fd = os.open(
                        leaf,
                        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                        mode,
                        dir_fd=parent,
                    )
                    with os.fdopen(fd, "wb") as out:
                        src = tar.extractfile(member)
                        assert src is not None  # a regular member always has a data stream
                        while chunk := src.read(CHUNK):
                            out.write(chunk)
                        os.fchmod(out.fileno(), mode)
                except FileExistsError:
                    raise Refusal(
                        Code.UNSAFE_ARCHIVE,
                        f"untracked archive member {name!r} would replace a path the restore "
                        "already wrote",
                        "the checkpoint is not one cotal captured; cut a new one on the source "
                        "host",
                    ) from None
                finally:
                    os.close(parent)
    except OSError as exc:
        # A name too long for this filesystem, a link target it refuses: the member cannot be
        # placed as recorded, which is a property of the archive, not of this host's health.
        if exc.errno not in _MEMBER_ERRNOS:
            raise
        raise Refusal(
            Code.UNSAFE_ARCHIVE,
            f"untracked archive member {exc.filename or '?'!r} cannot be written ({exc.strerror})",
            "the checkpoint is not one cotal captured; cut a new one on the source host",
        ) from None
    except tarfile.TarError as exc:
        raise Refusal(
            Code.UNSAFE_ARCHIVE,
            f"untracked archive {tar_path} cannot be read ({exc})",
            "cut a new checkpoint",
        ) from None
    finally:
        os.close(root_fd)
    return count


def _create_placeholder(root: Path, rel: str) -> None:
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        parent, leaf = _open_dirs(root_fd, rel, create=True)
        try:
            os.close(
                os.open(
                    leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=parent
                )
            )
        finally:
            os.close(parent)
    finally:
        os.close(root_fd)


# -- the staged build ---------------------------------------------------------------------------


async def _mark_intent_to_add(repo: Path, paths: Sequence[str]) -> None:
    if not paths:
        return
    # Literal pathspecs: a path with glob characters must name itself, not a pattern; --force
    # because `git add -N -f` can mark an ignored path and the cut recorded what was there.
    await run_git(
        repo,
        "add",
        "--intent-to-add",
        "--force",
        "--pathspec-from-file=-",
        "--pathspec-file-nul",
        stdin="\0".join(paths).encode() + b"\0",
        env={"GIT_LITERAL_PATHSPECS": "1"},
        code=Code.RESTORE_FAILED,
        cure="the recorded intent-to-add entries do not fit the restored tree",
    )


def _carried_bytes(seat_dir: Path, ref: FileRef) -> bytes:
    """A carried file's bytes, re-proven against its digest as they are read."""
    try:
        data = read_stable(seat_dir / ref.file, cap=max(ref.bytes, 1), what="carried file").data
    except Refusal as exc:
        raise Refusal(Code.INTEGRITY, f"checkpoint integrity: {exc.message}", exc.cure) from None
    if len(data) != ref.bytes or hashlib.sha256(data).hexdigest() != ref.sha256:
        raise Refusal(
            Code.INTEGRITY,
            f"checkpoint integrity: {seat_dir / ref.file} changed after it was verified",
            "copy the checkpoint again from the source host",
        )
    return data


def _write_gitdir_file(gitdir: Path, rel: str, data: bytes, mode: int) -> None:
    """Write one carried file into the staged `.git`, which `init` made and nothing else has
    touched; a symlink on the way refuses rather than being written through."""
    root_fd = os.open(gitdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        parent, leaf = _open_dirs(root_fd, rel, create=True)
        try:
            fd = os.open(
                leaf,
                os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=parent,
            )
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                os.fchmod(out.fileno(), mode)
        finally:
            os.close(parent)
    finally:
        os.close(root_fd)


def _restore_gitdir(
    staging: Path, seat_dir: Path, record: RepositoryRecord, gitdir: Path | None = None
) -> None:
    gitdir = gitdir or staging / ".git"
    if record.config is not None:
        _write_gitdir_file(gitdir, "config", _carried_bytes(seat_dir, record.config), 0o644)
    if record.info_exclude is not None:
        data = _carried_bytes(seat_dir, record.info_exclude)
        _write_gitdir_file(gitdir, "info/exclude", data, 0o644)
    for hook in record.hooks:
        data = _carried_bytes(seat_dir, hook.file)
        _write_gitdir_file(gitdir, f"hooks/{hook.name}", data, hook.mode)


async def _rebuild_stash(staging: Path, record: RepositoryRecord) -> None:
    """Recreate the `refs/stash` reflog oldest to newest, so `git stash list` numbers it alike."""
    for entry in reversed(record.stash):
        await run_git(
            staging,
            "update-ref",
            "--create-reflog",
            "-m",
            entry.message,
            "refs/stash",
            entry.oid,
            code=Code.RESTORE_FAILED,
            cure="the bundle does not hold every recorded stash commit; copy the checkpoint "
            "again from the source host",
        )
    if await read_stash(staging) != record.stash:
        raise Refusal(
            Code.STASH_MISMATCH,
            "the rebuilt stash list differs from the one the checkpoint recorded",
            "copy the checkpoint again from the source host",
        )


async def _prove_selection(staging: Path, record: RepositoryRecord) -> None:
    """No ignored file is in the staged tree beyond the declared ones: the recorded selection
    rule is the one this tree reproduces."""
    base = ("ls-files", "--others", "--ignored", "--exclude-standard", "-z", "--")
    every = (await run_git(staging, *base, EXCLUDE_CONTROL, *EXCLUDE_STAGING)).stdout
    declared = b""
    if record.include:
        declared = (
            await run_git(
                staging,
                *base,
                *(f":(glob){pattern}" for pattern in record.include),
                EXCLUDE_CONTROL,
                *EXCLUDE_STAGING,
            )
        ).stdout
    extra = sorted(set(every.split(b"\0")) - set(declared.split(b"\0")) - {b""})
    if extra:
        shown = ", ".join(os.fsdecode(p) for p in extra[:5])
        raise Refusal(
            Code.SELECTION_MISMATCH,
            f"the staged tree holds ignored files outside the recorded selection rule "
            f"{record.untracked_selection!r} ({shown})",
            "the checkpoint and its rule disagree, or this host ignores paths the source did "
            "not (a global excludes file); align core.excludesFile or cut a new checkpoint",
        )


def _open_packs(gitdir: Path) -> int:
    """`gitdir/objects/pack`, each step opened without following a symlink."""
    top = os.open(gitdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return walk_below(top, ["objects", "pack"])
    finally:
        os.close(top)


def _adopt_packs(scratch: Scratch, staging: Path) -> bool:
    """Move the packs admission unbundled (`scratch`) into the staged repository, so the
    bundles are indexed once per resume, not twice. False, with nothing of the scratch left in
    the staging, when that cannot be done exactly: the scratch is gone or holds other than the
    packs admission saw, a name is not a pack file or is not a regular file, or it is on
    another filesystem than the staging (EXDEV); the caller then unbundles as without it.

    Safe to trust: the scratch is a 0700 directory in the destination's own control directory
    that this process made and filled minutes ago, so only this user (who could rewrite the
    checkpoint or the target just as well) can have touched it, and every check after this in
    `_build` (the base, the refs, the applies, the status) proves the objects regardless.
    """
    try:
        top = os.open(scratch.repo, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    src = dst = -1
    moved: list[str] = []
    try:
        objects = walk_below(top, ["objects"])
        try:
            loose = set(os.listdir(objects)) - {"pack", "info"}
            src = walk_below(objects, ["pack"])
        finally:
            os.close(objects)
        names = set(os.listdir(src))
        if loose or names != scratch.packs or not all(_PACK_RE.fullmatch(n) for n in names):
            return False
        dst = _open_packs(staging / ".git")
        # git counts a pack once its .idx is there, so each index moves after its pack.
        for name in sorted(names, key=lambda n: (n.endswith(".idx"), n)):
            if not stat.S_ISREG(os.stat(name, dir_fd=src, follow_symlinks=False).st_mode):
                raise FileNotFoundError(errno.ENOENT, "not a regular file", name)
            os.rename(name, name, src_dir_fd=src, dst_dir_fd=dst)
            moved.append(name)
        return True
    except (OSError, UnsafeDirectory):
        for name in moved:
            try:
                os.unlink(name, dir_fd=dst)
            except OSError:
                pass
        return False
    finally:
        for fd in (top, src, dst):
            if fd >= 0:
                os.close(fd)


async def _apply(staging: Path, diff: Path, size: int, *flags: str, cure: str) -> None:
    """`git apply` one carried diff. An empty one (its size is in the record, and every digest
    was verified before any write) applies as nothing, so git is not started for it: a clean
    repository carries two."""
    if size:
        await run_git(
            staging,
            "apply",
            *flags,
            "--binary",
            "--allow-empty",
            "--whitespace=nowarn",
            str(diff),
            code=Code.APPLY_FAILED,
            cure=cure,
        )


async def _stage_objects(
    staging: Path,
    seat_dir: Path,
    record: RepositoryRecord,
    links: Sequence[chain.Link],
    scratch: Scratch | None,
) -> None:
    # Not a clone: an incremental bundle needs its predecessors' objects first, so every
    # bundle of the chain is unbundled oldest first (git proves each one's prerequisites are
    # present) and the refs are set below from the record, after all the objects are in.
    # A pre-copied seed with its tree checked out is the staging itself: the history is in
    # and only what changed since the pre-copy is written and hashed below.
    seeded = await anyio.to_thread.run_sync(chain.take_seed, links, staging)
    if not seeded:
        await run_git(
            staging.parent,
            "init",
            "--quiet",
            "--template=",
            str(staging),
            code=Code.RESTORE_FAILED,
            cure="fix what git says about the staging directory",
        )
    if scratch is not None and await anyio.to_thread.run_sync(_adopt_packs, scratch, staging):
        # Admission already unbundled this very chain: its packs are the objects.
        bundles: list[Path | None] = []
    else:
        for link in links:
            if link.seed is not None and not seeded:
                await anyio.to_thread.run_sync(
                    chain.plant_seed, link.seed, staging / ".git" / "objects"
                )
        bundles = [link.bundle_path for link in links]
        bundles.append(seat_dir / record.bundle.file if record.bundle is not None else None)
    for bundle in bundles:
        if bundle is None:
            continue
        await run_git(
            staging,
            "bundle",
            "unbundle",
            str(bundle),
            code=Code.RESTORE_FAILED,
            cure="the bundle cannot be unbundled on its predecessors; copy the checkpoint "
            "again from the source host",
        )


async def _restore_shallow(
    staging: Path, seat_dir: Path, record: RepositoryRecord, gitdir: Path | None = None
) -> None:
    """A shallow clone's boundary back as `.git/shallow`, byte for byte, before anything walks
    the history: the bundle holds the boundary commits and none of their parents. Each commit
    it names must be one the bundle carried, and git must then call the repository shallow."""
    if record.shallow is msgspec.UNSET:
        return
    data = _carried_bytes(seat_dir, record.shallow)
    try:
        commits = parse_shallow_list(data)
    except ValueError as exc:
        raise Refusal(
            Code.SHALLOW_MISMATCH,
            f"the carried shallow boundary {seat_dir / record.shallow.file}: {exc}",
            "copy the checkpoint again from the source host, or cut the seat again",
        ) from None
    await anyio.to_thread.run_sync(
        _write_gitdir_file, gitdir or staging / ".git", "shallow", data, 0o644
    )
    found = await run_git(
        staging,
        "cat-file",
        "--batch-check=%(objecttype)",
        stdin="".join(c + "\n" for c in commits).encode(),
        code=Code.RESTORE_FAILED,
    )
    kinds = found.stdout.decode("ascii", "replace").splitlines()
    absent = [c for c, kind in zip(commits, kinds, strict=False) if kind != "commit"]
    if len(kinds) != len(commits) or absent:
        raise Refusal(
            Code.SHALLOW_MISMATCH,
            "the carried shallow boundary names commits the bundle does not carry "
            f"({', '.join(absent[:5])})",
            "the boundary and the bundle do not belong together; copy the checkpoint again "
            "from the source host",
        )
    probe = await run_git(staging, "rev-parse", "--is-shallow-repository", code=Code.RESTORE_FAILED)
    if probe.stdout.strip() != b"true":
        raise Refusal(
            Code.SHALLOW_MISMATCH,
            f"git does not read {(gitdir or staging / '.git') / 'shallow'} as a shallow boundary",
            "restore on a git that reads `.git/shallow` (any git since 1.5)",
        )


def _remove_skipped(root: Path, paths: Sequence[str]) -> None:
    """Take the files of skip-worktree entries out of the staged tree (the checkout of the base
    wrote every file), then each directory that only they filled. Nothing is followed through a
    symlink; a directory still holding anything (an untracked file) stays."""
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    emptied: set[str] = set()
    try:
        for rel in paths:
            parent, leaf = _open_dirs(root_fd, rel, create=False)
            try:
                os.unlink(leaf, dir_fd=parent)
            except FileNotFoundError:
                pass
            finally:
                os.close(parent)
            parts = rel.split("/")[:-1]
            emptied.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
        for rel in sorted(emptied, key=lambda d: d.count("/"), reverse=True):
            try:
                os.rmdir(rel, dir_fd=root_fd)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                    raise
    finally:
        os.close(root_fd)


async def _skip_worktree_entries(repo: Path) -> list[str]:
    listed = await run_git(repo, "ls-files", "-t", "-z", code=Code.RESTORE_FAILED)
    entries = listed.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]
    return [e[2:] for e in entries if e[:2] == "S "]


async def _restore_sparse(
    staging: Path, seat_dir: Path, record: RepositoryRecord, gitdir: Path | None = None
) -> list[str]:
    """A sparse checkout back as it was: `config.worktree` and `info/sparse-checkout` byte for
    byte, exactly the recorded entries marked skip-worktree, and their files absent. Written
    after the applies, which must see every file of the base, and before the status compare.
    Where the config asks for a sparse index, `git sparse-checkout reapply` rebuilds it from
    the patterns; the marked entries must still be exactly the recorded ones. `gitdir` is a
    submodule's (`modules/<name>`), the seat's repository's `.git` by default. Returns the
    skip-worktree entries, for the unwatched files' restore."""
    submodule = gitdir is not None
    gitdir = gitdir if gitdir is not None else staging / ".git"
    if record.worktree_config is not msgspec.UNSET:
        data = _carried_bytes(seat_dir, record.worktree_config)
        await anyio.to_thread.run_sync(_write_gitdir_file, gitdir, "config.worktree", data, 0o644)
        if submodule:
            # Before any git run reads it: its core.worktree is the source layout's path.
            await _place_worktree_setting(staging, gitdir, seat_dir, record)
    if record.sparse is msgspec.UNSET:
        return []
    sparse = record.sparse
    cure = "copy the checkpoint again from the source host, or cut the seat again"
    if sparse.patterns is not None:
        data = _carried_bytes(seat_dir, sparse.patterns)
        await anyio.to_thread.run_sync(
            _write_gitdir_file, gitdir, "info/sparse-checkout", data, 0o644
        )
    skipped: list[str] = []
    if sparse.skip_worktree is not None:
        raw, skipped = _carried_paths(
            seat_dir, sparse.skip_worktree, sparse.entries, "skip-worktree", Code.SPARSE_MISMATCH
        )
        await run_git(
            staging,
            "update-index",
            "--skip-worktree",
            "-z",
            "--stdin",
            stdin=raw,
            code=Code.SPARSE_MISMATCH,
            cure="the skip-worktree list names paths the restored index does not hold; " + cure,
        )
        await anyio.to_thread.run_sync(_remove_skipped, staging, skipped)
    # The repository's own settings, never this host's global config: the source's travelled.
    wants_sparse_index = await run_git(
        staging,
        "config",
        "--type=bool",
        "--get",
        "index.sparse",
        ok=(0, 1),
        env={"GIT_CONFIG_GLOBAL": os.devnull},
    )
    if wants_sparse_index.stdout.strip() == b"true":
        await run_git(
            staging,
            "sparse-checkout",
            "reapply",
            code=Code.SPARSE_MISMATCH,
            cure="the carried patterns and skip-worktree list do not agree; " + cure,
        )
    marked = await _skip_worktree_entries(staging)
    present = [p for p in skipped if os.path.lexists(staging / p)]
    if marked != skipped or present:
        differ = sorted(set(marked) ^ set(skipped)) or present
        raise Refusal(
            Code.SPARSE_MISMATCH,
            "the restored index does not mark exactly the recorded skip-worktree entries, "
            f"absent from the tree ({', '.join(differ[:5])})",
            "the patterns and the list do not belong together; " + cure,
        )
    return skipped


async def _place_worktree_setting(
    worktree: Path, gitdir: Path, seat_dir: Path, record: RepositoryRecord
) -> None:
    """A submodule's core.worktree where its source kept it. `git sparse-checkout` moves it
    from the config into `config.worktree`; the build set it in the config (git needs it from
    the first command on) and the sparse restore wrote `config.worktree` as it was, with the
    source layout's path. So where `config.worktree` carried it, it is set there for this
    layout and taken out of the config again unless the carried config had it too."""
    if record.worktree_config is msgspec.UNSET or record.config is None:
        return
    env = {"GIT_DIR": str(gitdir), "GIT_WORK_TREE": str(worktree)}

    async def has(path: Path) -> bool:
        found = await run_git(
            worktree, "config", "--file", str(path), "--get", "core.worktree", ok=(0, 1), env=env
        )
        return found.rc == 0

    if not await has(gitdir / "config.worktree"):
        return
    rel = os.path.relpath(worktree, gitdir)
    file = str(gitdir / "config.worktree")
    await run_git(worktree, "config", "--file", file, "core.worktree", rel, env=env)
    if not await has(seat_dir / record.config.file):
        await run_git(
            worktree,
            "config",
            "--file",
            str(gitdir / "config"),
            "--unset",
            "core.worktree",
            env=env,
        )


def _remove_empty_dir(root: Path, rel: str) -> None:
    """`rel` below `root` removed if it is an empty directory; gone already is as good."""
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        parent, leaf = _open_dirs(root_fd, rel, create=False)
    except FileNotFoundError:
        return
    finally:
        os.close(root_fd)
    try:
        os.rmdir(leaf, dir_fd=parent)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise Refusal(
            Code.RESTORE_MISMATCH,
            f"the submodule directory {rel} the cut found gone is not empty here ({exc.strerror})",
            "the checkpoint is inconsistent; cut a new one",
        ) from None
    finally:
        os.close(parent)


def _carried_paths(
    seat_dir: Path, ref: FileRef, entries: int, what: str, code: str
) -> tuple[bytes, list[str]]:
    """A carried list of index paths (skip-worktree, assume-unchanged): its bytes and its
    paths, refused by `code` when malformed or not of the length the record says."""
    cure = "copy the checkpoint again from the source host, or cut the seat again"
    raw = _carried_bytes(seat_dir, ref)
    try:
        paths = parse_skip_worktree(raw, what)
    except ValueError as exc:
        raise Refusal(code, f"the carried {what} list {seat_dir / ref.file}: {exc}", cure) from None
    if len(paths) != entries:
        raise Refusal(
            code, f"the carried {what} list names {len(paths)} entries, the record {entries}", cure
        )
    return raw, paths


async def _restore_unwatched(
    staging: Path, seat_dir: Path, record: RepositoryRecord, skipped: Sequence[str]
) -> None:
    """The entries git does not compare with their files, back as they were: each
    assume-unchanged entry's file replaced by the source's bytes, or removed where the source
    had none, then marked; each skip-worktree entry's file that was present written back (the
    sparse restore took every one out). After the sparse restore, whose checks see no file of
    a skip-worktree entry, and before the status compare, which these files do not change."""
    if record.unwatched is msgspec.UNSET:
        return
    unwatched = record.unwatched
    cure = "copy the checkpoint again from the source host, or cut the seat again"
    flagged: list[str] = []
    raw = b""
    if unwatched.assume_unchanged is not None:
        raw, flagged = _carried_paths(
            seat_dir,
            unwatched.assume_unchanged,
            unwatched.entries,
            "assume-unchanged",
            Code.BAD_RECORD,
        )
    await anyio.to_thread.run_sync(_remove_skipped, staging, flagged)
    if unwatched.files is not None:
        only = frozenset(flagged) | frozenset(skipped)
        held = await anyio.to_thread.run_sync(
            _extract_untracked, seat_dir / unwatched.files.file, staging, only
        )
        if held != unwatched.present:
            raise Refusal(
                Code.BAD_RECORD,
                f"the unwatched archive holds {held} files, the record {unwatched.present}",
                cure,
            )
    if flagged:
        await run_git(
            staging,
            "update-index",
            "--assume-unchanged",
            "-z",
            "--stdin",
            stdin=raw,
            code=Code.BAD_RECORD,
            cure="the assume-unchanged list names paths the restored index does not hold; " + cure,
        )


def _write_lfs_objects(
    gitdir: Path, storage: str, pack: Path, objects: Sequence[tuple[str, int]]
) -> None:
    """Each carried LFS object into the staged repository's LFS storage (`storage`, relative to
    `gitdir`), proven to hash to its oid and to be its size as it is written; the pack must hold
    exactly the objects its list names."""
    cure = "copy the checkpoint again from the source host, or cut the seat again"
    root_fd = os.open(gitdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        with open(pack, "rb") as stream:
            for oid, size in objects:
                rel = f"{storage}/objects/{oid[:2]}/{oid[2:4]}/{oid}"
                parent, leaf = _open_dirs(root_fd, rel, create=True)
                try:
                    fd = os.open(
                        leaf,
                        os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                        0o644,
                        dir_fd=parent,
                    )
                finally:
                    os.close(parent)
                digest = hashlib.sha256()
                left = size
                with os.fdopen(fd, "wb") as out:
                    while left:
                        chunk = stream.read(min(CHUNK, left))
                        if not chunk:
                            break
                        digest.update(chunk)
                        out.write(chunk)
                        left -= len(chunk)
                if left or digest.hexdigest() != oid:
                    raise Refusal(
                        Code.INTEGRITY,
                        f"checkpoint integrity: the Git LFS object {oid} in {pack} does not hash "
                        f"to its oid or is not its {size} bytes",
                        cure,
                    )
            if stream.read(1):
                raise Refusal(
                    Code.INTEGRITY,
                    f"checkpoint integrity: {pack} holds more bytes than its list names",
                    cure,
                )
    finally:
        os.close(root_fd)


async def _lfs_storage(seat_dir: Path, record: RepositoryRecord) -> str:
    """Where the restored repository's git-lfs will look for its objects, relative to its git
    dir: the carried config's `lfs.storage` (the capture refused one outside the git dir), or
    `lfs`."""
    if record.config is None:
        return "lfs"
    found = await run_git(
        seat_dir,
        "config",
        "--file",
        str(seat_dir / record.config.file),
        "--get",
        "lfs.storage",
        ok=(0, 1),
        env={"GIT_CEILING_DIRECTORIES": str(seat_dir.parent)},
        code=Code.RESTORE_FAILED,
    )
    storage = os.fsdecode(found.stdout.strip())
    if not storage:
        return "lfs"
    if os.path.isabs(storage) or ".." in Path(storage).parts:
        raise Refusal(
            Code.BAD_RECORD,
            f"the carried config sets lfs.storage = {storage!r}, outside the repository's git dir",
            "the checkpoint is not one cotal cut; cut the seat again on the source host",
        )
    return os.path.normpath(storage)


_GIT_LFS_CURE = (
    "install git-lfs on this host (Debian: `apt-get install git-lfs`) and run `git lfs "
    "install`, then restore again"
)


async def _restore_lfs(gitdir: Path, seat_dir: Path, record: RepositoryRecord) -> None:
    """The carried Git LFS objects into the staged repository's storage, before anything is
    checked out: the checkout's smudge filter then finds every object it needs here and never
    asks an LFS server."""
    if record.lfs is msgspec.UNSET:
        return
    # Admission refused this already (admit.check_git_lfs); said again here, by name, for a
    # host whose PATH changed since, rather than as the checkout's failure.
    if shutil.which("git-lfs") is None:
        raise Refusal(
            Code.GIT_LFS_MISSING,
            f"the checkpoint carries Git LFS objects for {gitdir}, and git-lfs is not on this "
            "host's PATH; the checkout runs it to put their bytes in the tree",
            _GIT_LFS_CURE,
        )
    try:
        objects = parse_lfs_list(_carried_bytes(seat_dir, record.lfs.objects))
    except ValueError as exc:
        raise Refusal(
            Code.BAD_RECORD,
            f"the carried LFS object list {seat_dir / record.lfs.objects.file}: {exc}",
            "copy the checkpoint again from the source host, or cut the seat again",
        ) from None
    if (
        len(objects) != record.lfs.count
        or sum(size for _, size in objects) != record.lfs.pack.bytes
    ):
        raise Refusal(
            Code.BAD_RECORD,
            f"the carried LFS object list {seat_dir / record.lfs.objects.file} does not name "
            f"the record's {record.lfs.count} objects of {record.lfs.pack.bytes} bytes",
            "copy the checkpoint again from the source host, or cut the seat again",
        )
    storage = await _lfs_storage(seat_dir, record)
    await anyio.to_thread.run_sync(
        _write_lfs_objects, gitdir, storage, seat_dir / record.lfs.pack.file, objects
    )


async def _require_lfs_filter(repo: Path, record: RepositoryRecord) -> None:
    """A repository that carried LFS objects needs git-lfs's filter wherever git reads it, or
    its status (and the seat's) would compare the smudged files with their pointers. The
    source's `git lfs install --local` travels in the config; a global one is this host's."""
    if record.lfs is msgspec.UNSET:
        return
    for key in ("filter.lfs.process", "filter.lfs.clean"):
        found = await run_git(repo, "config", "--get", key, ok=(0, 1), code=Code.RESTORE_FAILED)
        if found.stdout.strip():
            return
    raise Refusal(
        Code.GIT_LFS_MISSING,
        f"the checkpoint carries Git LFS objects for {repo}, but git on this host has no LFS "
        "filter for it (the source set it in its global config, which does not travel)",
        _GIT_LFS_CURE,
    )


async def _checkout_base(staging: Path, record: RepositoryRecord) -> None:
    if record.base is None:
        # An unborn branch: nothing to check out; the index diff stages every file against the
        # empty tree, and HEAD is set to the branch with the refs.
        return
    found = await run_git(
        staging, "rev-parse", "--verify", "-q", f"{record.base}^{{commit}}", ok=(0, 1, 128)
    )
    if found.rc != 0:
        raise Refusal(
            Code.BASE_ABSENT,
            f"the bundle does not contain the recorded base commit {record.base}, so the diffs do "
            "not apply to its history",
            "the bundle and the record do not belong together; copy the checkpoint again from the "
            "source host",
        )
    # With LFS objects carried, git-lfs's own filter smudges them into the tree, whatever this
    # host's global config says (manager/checkpoint/lfs.py).
    filters = lfs.FILTER_FLAGS if record.lfs is not msgspec.UNSET else ()
    # Never into a submodule (an operator's global `submodule.recurse`): each has its record.
    await run_git(
        staging,
        *filters,
        "-c",
        "submodule.recurse=false",
        "checkout",
        "--quiet",
        "--detach",
        record.base,
        code=Code.RESTORE_FAILED,
    )
    # The checkout wrote its files and its index in this second, so each entry is racily clean:
    # the index write of the `apply --index` below would hash every such file to decide whether
    # to smudge it, and the refresh after the applies would hash them all again (a 32 MiB blob:
    # about 0.1 s each time). Dated back and refreshed once here, the entries are older than
    # the index, and only what the applies write is hashed again.
    await anyio.to_thread.run_sync(settle_stat_data, staging)
    await run_git(
        staging, *filters, "update-index", "-q", "--refresh", ok=(0, 1), code=Code.RESTORE_FAILED
    )


async def _restore_refs(staging: Path, record: RepositoryRecord, refs: dict[str, str]) -> None:
    present = await read_refs(staging)
    # With the stash recorded entry by entry, refs/stash is rebuilt from it below instead.
    plain = {n: o for n, o in refs.items() if not (record.stash and n == "refs/stash")}
    commands = [f"update {name} {oid}\n" for name, oid in sorted(plain.items())]
    commands += [f"delete {name}\n" for name in sorted(set(present) - set(plain))]
    if commands:
        # --create-reflog so refs/stash gets the reflog `git stash list` reads its entries from.
        await run_git(
            staging,
            "update-ref",
            "--create-reflog",
            "-m",
            _RESTORE_REFLOG,
            "--stdin",
            stdin="".join(commands).encode(),
            code=Code.RESTORE_FAILED,
            cure="the bundle does not hold the objects the recorded refs name; "
            "copy the checkpoint again",
        )
    if record.stash:
        if refs.get("refs/stash") != record.stash[0].oid:
            raise Refusal(
                Code.REFS_MISMATCH,
                "the recorded refs/stash is not the newest recorded stash entry",
                "the checkpoint is inconsistent; cut a new one",
            )
        await _rebuild_stash(staging, record)
    if await read_refs(staging) != refs:
        raise Refusal(
            Code.REFS_MISMATCH,
            "the restored refs differ from the refs the checkpoint recorded",
            "copy the checkpoint again from the source host",
        )


async def _apply_changes(
    staging: Path, seat_dir: Path, record: RepositoryRecord, status: str, intent_to_add: list[str]
) -> None:
    await _apply(
        staging,
        seat_dir / record.index_diff.file,
        record.index_diff.bytes,
        "--index",
        cure="the index diff does not apply to the recorded base; "
        "the checkpoint is inconsistent, cut a new one",
    )
    # An intent-to-add entry whose file was gone at the cut shows in the worktree diff as the
    # deletion of an empty file; that deletion only applies to an entry that exists.
    status_of = porcelain_by_path(status)
    gone = [p for p in intent_to_add if status_of.get(p) == " D"]
    for path in gone:
        _create_placeholder(staging, path)
    await _mark_intent_to_add(staging, gone)
    await _apply(
        staging,
        seat_dir / record.worktree_diff.file,
        record.worktree_diff.bytes,
        cure="the worktree diff does not apply on top of the index diff; "
        "the checkpoint is inconsistent, cut a new one",
    )
    # The rest were created as new files by the worktree diff; mark them as the cut had them.
    await _mark_intent_to_add(staging, [p for p in intent_to_add if p not in gone])


async def _reattach_head(staging: Path, record: RepositoryRecord, refs: dict[str, str]) -> None:
    if record.head is not None:
        if refs.get(record.head) != record.base:
            raise Refusal(
                Code.REFS_MISMATCH,
                f"HEAD was on {record.head} at the cut, but that branch points at "
                f"{refs.get(record.head, 'nothing')}, not the base {record.base}",
                "the checkpoint is inconsistent; cut a new one",
            )
        await run_git(staging, "symbolic-ref", "HEAD", record.head, code=Code.RESTORE_FAILED)


async def _verify_staged_status(staging: Path, status: str) -> None:
    # Every file was just written, so the index's stat data are stale and each status below
    # (run without optional locks, so it never writes the index) would hash every file again:
    # 0.28 s a run on issue 13's repository against 8 ms refreshed. The staging repository is
    # this restore's own, and a refresh changes only stat data, never an entry. The files of
    # this second are dated back first, or the refreshed index would still be racy for them.
    await anyio.to_thread.run_sync(settle_stat_data, staging)
    await run_git(staging, "update-index", "-q", "--refresh", ok=(0, 1), code=Code.RESTORE_FAILED)
    staged = (await run_git(staging, *STATUS_ARGS)).stdout.decode("utf-8", "replace")
    if staged != status:
        raise Refusal(
            Code.RESTORE_MISMATCH,
            f"the staged tree's git status is {_show_status(staged)}, the checkpoint recorded "
            f"{_show_status(status)}",
            "the checkpoint does not reproduce its own tree; cut a new one",
        )


async def _build(
    staging: Path,
    seat_dir: Path,
    record: RepositoryRecord,
    refs: dict[str, str],
    status: str,
    intent_to_add: list[str],
    links: Sequence[chain.Link],
    scratch: Scratch | None = None,
) -> None:
    await _stage_objects(staging, seat_dir, record, links, scratch)
    await _restore_shallow(staging, seat_dir, record)
    await _restore_lfs(staging / ".git", seat_dir, record)
    await _checkout_base(staging, record)
    # The carried config, written next, replaces the one `init` made, so the remotes are the
    # source's; it and info/exclude go in before the applies and the status comparison, which
    # read them as the source did.
    await anyio.to_thread.run_sync(_restore_gitdir, staging, seat_dir, record)
    await _require_lfs_filter(staging, record)
    await _restore_refs(staging, record, refs)
    await _apply_changes(staging, seat_dir, record, status, intent_to_add)
    await anyio.to_thread.run_sync(_extract_untracked, seat_dir / record.untracked.file, staging)
    await _prove_selection(staging, record)
    await _reattach_head(staging, record, refs)
    skipped = await _restore_sparse(staging, seat_dir, record)
    await _restore_unwatched(staging, seat_dir, record, skipped)
    await _restore_submodules(staging, staging / ".git", seat_dir, record)
    await _verify_staged_status(staging, status)


# -- submodules ---------------------------------------------------------------------------------


async def _restore_submodules(
    worktree: Path, gitdir: Path, seat_dir: Path, record: RepositoryRecord
) -> None:
    """The index's gitlinks exactly as recorded, and each checked-out submodule rebuilt as a
    repository of its own: its git dir at `modules/<name>` under `gitdir`, its checkout at its
    path with the `.git` file git writes, its own submodules within it."""
    if record.submodules is msgspec.UNSET:
        return
    await _set_gitlinks(worktree, record.submodules)
    for sub in record.submodules:
        if sub.absent is True:
            # Gone at the cut: the checkout of the base left an empty directory there.
            await anyio.to_thread.run_sync(_remove_empty_dir, worktree, sub.path)
        if sub.repository is None or sub.name is None:
            continue
        sub_tree = await anyio.to_thread.run_sync(_make_dir_below, worktree, sub.path)
        sub_gitdir = await anyio.to_thread.run_sync(_make_dir_below, gitdir, f"modules/{sub.name}")
        await _build_submodule(sub_tree, sub_gitdir, seat_dir, sub.repository)


def _make_dir_below(root: Path, rel: str) -> Path:
    """`root/rel` as an empty directory, each missing step made and none a symlink."""
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        parent, leaf = _open_dirs(root_fd, rel, create=True)
        try:
            try:
                os.mkdir(leaf, 0o777, dir_fd=parent)
            except FileExistsError:
                pass
            fd = os.open(leaf, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
            try:
                inside = os.listdir(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise Refusal(
                Code.UNSAFE_ARCHIVE,
                f"{root / rel} cannot be made a plain directory for a submodule ({exc.strerror})",
                "the checkpoint is not one cotal captured; cut a new one on the source host",
            ) from None
        finally:
            os.close(parent)
    finally:
        os.close(root_fd)
    if inside:
        raise Refusal(
            Code.RESTORE_FAILED,
            f"the submodule directory {root / rel} already holds {', '.join(sorted(inside)[:5])}",
            "the checkpoint is inconsistent; cut a new one",
        )
    return root / rel


async def _set_gitlinks(worktree: Path, submodules: Sequence[SubmoduleRecord]) -> None:
    """Every gitlink of the index exactly as recorded: the superproject's diffs leave them
    out, so each is set here (and one the base has that the index did not, removed)."""
    want = {sub.path: sub.commit for sub in submodules}
    present = await _gitlinks(worktree)
    lines = [f"160000 {oid}\t{path}\0" for path, oid in want.items()]
    lines += [f"0 {'0' * len(oid)}\t{path}\0" for path, oid in present.items() if path not in want]
    await run_git(
        worktree,
        "update-index",
        "-z",
        "--index-info",
        stdin="".join(lines).encode(),
        code=Code.RESTORE_FAILED,
    )
    if await _gitlinks(worktree) != want:
        raise Refusal(
            Code.RESTORE_MISMATCH,
            f"the restored index of {worktree} does not pin the recorded submodule commits",
            "the checkpoint is inconsistent; cut a new one",
        )


async def _gitlinks(worktree: Path) -> dict[str, str]:
    out = await run_git(worktree, "ls-files", "-s", "-z", code=Code.RESTORE_FAILED)
    found: dict[str, str] = {}
    for entry in out.stdout.split(b"\0"):
        meta, _, path = entry.partition(b"\t")
        if meta.startswith(b"160000 "):
            found[path.decode("utf-8", "surrogateescape")] = meta.split(b" ")[1].decode()
    return found


async def _build_submodule(
    worktree: Path, gitdir: Path, seat_dir: Path, record: RepositoryRecord
) -> None:
    """One submodule from its record, as `_build` builds the seat's repository: its git dir
    made, its `.git` file and carried config written first (its core.worktree, core.bare
    false), then its bundle, its base, its refs, its changes, its untracked files, its own
    submodules, and its status compared."""
    status, intent_to_add = _read_lists(seat_dir, record)
    refs = _read_recorded_refs(seat_dir, record)
    await _verify_bundle_refs(seat_dir, record, refs)
    if record.bundle is None or record.config is None:
        raise Refusal(
            Code.BAD_RECORD,
            f"the submodule record for {worktree} carries no bundle or no config",
            "cut a new checkpoint",
        )
    await run_git(
        worktree, "init", "--quiet", "--bare", "--template=", str(gitdir), code=Code.RESTORE_FAILED
    )
    gitfile = submodule_gitfile(worktree, gitdir)
    await anyio.to_thread.run_sync(_write_gitdir_file, worktree, ".git", gitfile, 0o644)
    await anyio.to_thread.run_sync(_restore_gitdir, worktree, seat_dir, record, gitdir)
    # The carried core.worktree is the path from the source's git dir to the checkout; a
    # linked worktree's submodule had its git dir under `worktrees/<id>/modules`, so the path
    # is set again for the layout restored here (unchanged for a main worktree's).
    await run_git(
        worktree,
        "config",
        "--file",
        str(gitdir / "config"),
        "core.worktree",
        os.path.relpath(worktree, gitdir),
        # Named outright: git would otherwise find the repository through the `.git` file and
        # chdir to the carried core.worktree, which does not exist here.
        env={"GIT_DIR": str(gitdir), "GIT_WORK_TREE": str(worktree)},
        code=Code.RESTORE_FAILED,
    )
    await _require_lfs_filter(worktree, record)
    await run_git(
        worktree,
        "bundle",
        "unbundle",
        str(seat_dir / record.bundle.file),
        code=Code.RESTORE_FAILED,
        cure="the submodule's bundle cannot be unbundled; copy the checkpoint again",
    )
    await _restore_shallow(worktree, seat_dir, record, gitdir)
    await _restore_lfs(gitdir, seat_dir, record)
    await _checkout_base(worktree, record)
    await _restore_refs(worktree, record, refs)
    await _apply_changes(worktree, seat_dir, record, status, intent_to_add)
    await anyio.to_thread.run_sync(_extract_untracked, seat_dir / record.untracked.file, worktree)
    await _prove_selection(worktree, record)
    await _reattach_head(worktree, record, refs)
    skipped = await _restore_sparse(worktree, seat_dir, record, gitdir)
    await _restore_unwatched(worktree, seat_dir, record, skipped)
    await _restore_submodules(worktree, gitdir, seat_dir, record)
    await _verify_staged_status(worktree, status)


# -- promotion ----------------------------------------------------------------------------------


def _claim_aside(target: Path, stamp: str, *, inside: bool = False) -> Path:
    """Claim an aside directory by exclusive mkdir, so the name is ours alone: beside the target
    (`<target>.superseded.<stamp>[.<k>]`) or, for a mount point, inside it
    (`<target>/.cotal-superseded-<stamp>[.<k>]`)."""
    base = f"{SUPERSEDED_PREFIX}{stamp}" if inside else f"{target.name}.superseded.{stamp}"
    for k in range(100):
        name = base + (f".{k}" if k else "")
        aside = target / name if inside else target.with_name(name)
        try:
            os.mkdir(aside, DIR_MODE)
            return aside
        except FileExistsError:
            continue
    raise Refusal(
        Code.RESTORE_FAILED,
        f"no free name for moving {target} aside ({base}[.1-99] all exist)",
        "pass a new stamp or clear old superseded directories",
    )


def _swap(staging: Path, target: Path, aside: Path | None, movable: Sequence[str]) -> None:
    """Move `movable` from the target into `aside`, then every staged entry into the target, all
    renames within one filesystem; any failure puts every moved entry back where it was."""
    moved_out: list[str] = []
    moved_in: list[str] = []
    try:
        for name in movable:
            assert aside is not None
            os.rename(target / name, aside / name)
            moved_out.append(name)
        for name in sorted(os.listdir(staging)):
            os.rename(staging / name, target / name)
            moved_in.append(name)
        os.rmdir(staging)
    except OSError as exc:
        for name in reversed(moved_in):
            os.rename(target / name, staging / name)
        for name in reversed(moved_out):
            assert aside is not None
            os.rename(aside / name, target / name)
        leftover = f" and the empty {aside}" if aside is not None else ""
        raise Refusal(
            Code.RESTORE_FAILED,
            f"promoting {staging} into {target} failed ({exc.strerror}) and was rolled back; "
            f"{staging} is left as evidence",
            f"inspect {staging}, remove it{leftover} by hand, then restore again",
        ) from None


def _promote(staging: Path, target: Path, stamp: str, keep: Sequence[str]) -> Path | None:
    parent = target.parent
    if not os.path.lexists(target) or not os.listdir(target):
        # An empty directory (a fresh --map destination) holds nothing to move aside, and
        # rename(2) replaces it atomically.
        os.rename(staging, target)
        fsync_dir(parent)
        return None
    kept = [name for name in keep if os.path.lexists(target / name)]
    if kept and not set(os.listdir(target)) - set(kept):
        # Only the control directory is there (a fresh root): nothing to move aside.
        _swap(staging, target, None, [])
        fsync_dir(target)
        fsync_dir(parent)
        return None
    aside = _claim_aside(target, stamp)
    if not kept:
        # rename(2) replaces the empty directory just claimed, atomically.
        os.rename(target, aside)
        os.rename(staging, target)
        fsync_dir(parent)
        return aside
    # The single-root case: the target holds the destination's own control directory, which a
    # running daemon may be using and which holds this very checkpoint. It stays where it is
    # (same inode); everything else moves aside and the staged tree moves in around it.
    _swap(staging, target, aside, sorted(n for n in os.listdir(target) if n not in kept))
    fsync_dir(target)
    fsync_dir(aside)
    fsync_dir(parent)
    return aside


def _promote_in_place(staging: Path, target: Path, stamp: str, keep: Sequence[str]) -> Path | None:
    """Promotion for a target that is a mount point: a rename cannot cross out of it, so the
    staged tree (already inside it) swaps with the old entries, which go to an aside directory
    inside it too. Earlier staging and superseded directories are left where they are."""

    def stays(name: str) -> bool:
        return name in keep or name.startswith((INCOMING_PREFIX, SUPERSEDED_PREFIX))

    movable = sorted(n for n in os.listdir(target) if not stays(n))
    aside = _claim_aside(target, stamp, inside=True) if movable else None
    try:
        _swap(staging, target, aside, movable)
    except Refusal:
        if aside is not None:
            os.rmdir(aside)
        raise
    fsync_dir(target)
    if aside is not None:
        fsync_dir(aside)
    return aside


def _is_mount_point(target: Path) -> bool:
    """Whether `target` is a mount point, so a staging directory beside it is on another
    filesystem (or another mount of the same one, which rename(2) refuses just the same)."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return False
    if st.st_dev != os.stat(target.parent).st_dev or os.path.ismount(target):
        return True
    return os.path.realpath(target) in mount_points()


def _check_target(
    target: Path, stamp: str, keep_paths: Sequence[str], confine_to: Sequence[Path]
) -> None:
    # The admission gate proved the cwd confined; this repeats it where the tree is written,
    # so no caller can promote a checkpoint's tree into a hook directory or the control dir.
    problem = parts_problem(target.parts)
    if problem is None and CONTROL_DIR in target.parts:
        problem = "is inside a control directory"
    if (
        problem is None
        and confine_to
        and not any(target.is_relative_to(lexical(base)) for base in confine_to)
    ):
        problem = "is outside " + ", ".join(str(base) for base in confine_to)
    if problem is not None:
        raise Refusal(Code.CWD_OUTSIDE_ROOT, f"restore target {target} {problem}", CURE_FORGED)
    if not STAMP_RE.fullmatch(stamp):
        raise Refusal(
            Code.BAD_STAMP,
            f"stamp {stamp!r} is not a safe token",
            "pass a stamp such as 20261129T140000Z",
        )
    for name in keep_paths:
        if "/" in name or name in ("", ".", "..", ".git"):
            raise Refusal(
                Code.BAD_KEEP,
                f"keep path {name!r} is not a single top-level name",
                "pass names such as .cotal",
            )
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise Refusal(
            Code.BAD_TARGET,
            f"restore target {target} is a symlink or not a directory",
            "point the seat's cwd at a real directory, or move what is there aside",
        )


async def _verify_carried(
    seat_dir: Path, record: RepositoryRecord, links: Sequence[chain.Link]
) -> None:
    # Every digest is proven before the first write anywhere.
    for ref in record.files():
        await anyio.to_thread.run_sync(verify_file, seat_dir, ref)
    if record.incremental and not links:
        raise Refusal(
            Code.PREDECESSOR_MISSING,
            f"the bundle in {seat_dir} builds on "
            + (
                f"attempt {record.since.attempt_id}"
                if record.since is not None
                else "the history a move pre-copied"
            )
            + ", and no proven predecessor was given",
            "resume through `cotal up --restore`, which finds and proves the chain",
        )
    for link in links:
        if link.bundle is not None:
            await anyio.to_thread.run_sync(verify_file, link.seat_dir, link.bundle)


def _read_lists(seat_dir: Path, record: RepositoryRecord) -> tuple[str, list[str]]:
    status, intent_to_add = record.status, record.intent_to_add
    if record.status_file is not None and record.intent_to_add_file is not None:
        try:
            status = _carried_bytes(seat_dir, record.status_file).decode("utf-8")
            intent_to_add = parse_intent_to_add(_carried_bytes(seat_dir, record.intent_to_add_file))
            check_repository_lists(status, intent_to_add)
        except (UnicodeDecodeError, ValueError) as exc:
            raise Refusal(
                Code.BAD_RECORD,
                f"the status and intent-to-add files in {seat_dir} do not form a valid list: {exc}",
                "cut a new checkpoint",
            ) from None
    return status, intent_to_add


def _read_recorded_refs(seat_dir: Path, record: RepositoryRecord) -> dict[str, str]:
    refs: dict[str, str] = {}
    if record.refs is not None:
        try:
            refs = parse_refs_list((seat_dir / record.refs.file).read_bytes())
        except ValueError as exc:
            raise Refusal(
                Code.REFS_MISMATCH, f"{seat_dir / record.refs.file}: {exc}", "cut a new checkpoint"
            ) from None
    return refs


async def _verify_bundle_refs(
    seat_dir: Path, record: RepositoryRecord, refs: dict[str, str]
) -> None:
    heads: dict[str, str] = {}
    if record.bundle is not None:
        # The ceiling keeps git from discovering the destination's own repository above the
        # checkpoint: listing a bundle needs none, and that repository is not ours to read.
        listed = await run_git(
            seat_dir,
            "bundle",
            "list-heads",
            str(seat_dir / record.bundle.file),
            env={"GIT_CEILING_DIRECTORIES": str(seat_dir.parent)},
            code=Code.RESTORE_FAILED,
        )
        heads = bundle_heads(listed.stdout)
    # The restored refs are compared with the whole recorded list after the build.
    differ = heads_differing(heads, refs, incremental=record.incremental)
    if differ:
        raise Refusal(
            Code.REFS_MISMATCH,
            "the bundle's refs differ from the refs the checkpoint recorded "
            f"({', '.join(differ[:5])})",
            "the bundle and the record do not belong together; copy the checkpoint again from the "
            "source host",
        )


def _staging_path(target: Path, stamp: str, *, in_place: bool) -> Path:
    if in_place:
        return target / f"{INCOMING_PREFIX}{stamp}"
    return target.with_name(target.name + ".incoming")


def _claim_staging(target: Path, staging: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(staging)
    except FileExistsError:
        raise Refusal(
            Code.STAGING_EXISTS,
            f"refusing: {staging} already exists; it is the evidence of an earlier failed restore "
            "— inspect and remove it by hand",
            f"inspect {staging}, remove it by hand, then restore again",
        ) from None


async def _stage(
    staging: Path,
    seat_dir: Path,
    record: RepositoryRecord,
    refs: dict[str, str],
    status: str,
    intent_to_add: list[str],
    links: Sequence[chain.Link],
    scratch: Scratch | None,
    *,
    keep_paths: tuple[str, ...],
    unchanged: str,
) -> None:
    """Build the staged tree; any refusal names the untouched target and the staging left as
    evidence."""
    try:
        await _build(staging, seat_dir, record, refs, status, intent_to_add, links, scratch)
        clash = [name for name in keep_paths if os.path.lexists(staging / name)]
        if clash:
            raise Refusal(
                Code.RESTORE_FAILED,
                f"the restored tree holds {', '.join(clash)}, which the destination keeps in place",
                "the checkpoint carries a control directory it never should; cut a new one",
            )
    except Refusal as exc:
        raise Refusal(
            exc.code,
            f"{exc.message}; {unchanged} and {staging} is left as the evidence",
            f"{exc.cure}; inspect {staging} and remove it by hand before restoring again",
        ) from None
    except OSError as exc:
        raise Refusal(
            Code.RESTORE_FAILED,
            f"restoring into {staging} failed ({exc}); {unchanged} and {staging} is left as "
            "the evidence",
            f"inspect {staging} and remove it by hand before restoring again",
        ) from None


async def _verify_promoted(target: Path, status: str, aside: Path | None) -> str:
    final = (await run_git(target, *STATUS_ARGS)).stdout.decode("utf-8", "replace")
    if final != status:
        where = f"; the previous tree is at {aside}" if aside else ""
        raise Refusal(
            Code.RESTORE_MISMATCH,
            f"after promotion {target} reports git status {_show_status(final)}, the checkpoint "
            "recorded "
            f"{_show_status(status)}{where}",
            f"inspect {target} before starting the seat; something other than the checkpoint is "
            "in the tree",
        )
    return final


async def restore_repository(
    seat_dir: Path,
    record: RepositoryRecord,
    target: Path,
    *,
    stamp: str,
    keep_paths: tuple[str, ...] = (CONTROL_DIR,),
    confine_to: Sequence[Path] = (),
    dest_root: Path | None = None,
    maps: Mapping[Path, Path] | None = None,
    links: Sequence[chain.Link] = (),
    scratch: Scratch | None = None,
) -> RestoreResult:
    """Rebuild the captured repository at `target` through a staging directory beside it, or
    inside it when the target is a mount point (`<target>/.cotal-incoming-<stamp>`).

    `confine_to` is the destination root and any mapped directories: a target outside them
    refuses before anything is written. A target a `--map` places (`maps`, the operator's
    pairs, with `dest_root`) is checked again by the rule admission checked
    (`landing.check_tree`): one that became a place no map may land, or that now holds another
    tree, refuses before anything is written. `links` are an incremental record's predecessors
    as admission proved them (`Admission.chains`), oldest first; their bundles are re-proven
    here too. `scratch` is the repository admission unbundled this seat's chain into
    (`Admission.scratch`): its packs are moved into the staging instead of unbundling again,
    and when they cannot be the bundles are unbundled as without it.
    """
    seat_dir = Path(os.path.abspath(seat_dir))
    target = Path(os.path.abspath(target))
    _check_target(target, stamp, keep_paths, confine_to)
    if maps and dest_root is not None:
        await anyio.to_thread.run_sync(
            functools.partial(check_tree, target, maps, dest_root=dest_root, base=record.base)
        )
    in_place = _is_mount_point(target)
    staging = _staging_path(target, stamp, in_place=in_place)
    await _verify_carried(seat_dir, record, links)
    status, intent_to_add = _read_lists(seat_dir, record)
    refs = _read_recorded_refs(seat_dir, record)
    await _verify_bundle_refs(seat_dir, record, refs)

    _claim_staging(target, staging)
    unchanged = f"{target} is unchanged" + (f" apart from {staging}" if in_place else "")
    await _stage(
        staging,
        seat_dir,
        record,
        refs,
        status,
        intent_to_add,
        links,
        scratch,
        keep_paths=keep_paths,
        unchanged=unchanged,
    )
    promote = _promote_in_place if in_place else _promote
    aside = promote(staging, target, stamp, keep_paths)
    final = await _verify_promoted(target, status, aside)
    return RestoreResult(target=target, superseded=aside, head=record.head, status=final)
