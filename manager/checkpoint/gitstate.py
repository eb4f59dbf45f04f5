"""The repository half of the cut: preflight and capture (record 1.1, 6 step 5; peers.md 6).

A capture is five artifacts and a few facts. `repo.bundle` carries the history (every ref and
HEAD, `BUNDLE_REVS`); `index.diff` and `worktree.diff` carry the staging state as two diffs,
base->index and index->worktree, because one combined diff restores every change as unstaged;
`untracked.tar` carries the untracked files under the recorded selection rule; `refs.txt` lists
every ref, because a clone of the bundle drops refs/stash. The record adds the base commit, the
branch HEAD is on, the porcelain status the restore must reproduce, and the intent-to-add
entries, which neither diff carries as index entries. From `.git` the config (credentials
redacted), the hooks that are not samples and `info/exclude` travel; every stash entry travels by
its commit in the bundle and its reflog subject in the record. Declared ignored paths join the
untracked set.

States the procedure cannot reproduce are refused by name before anything is written: no
repository at the cwd's top level, an unmerged index or an operation in progress, a nested
repository, a submodule in a shape that cannot travel (files but no `.git`, a git dir reached
through a symlink), a tracked or nested `.cotal`, and untracked entries that are not
files or symlinks (docs/cli.md lists them all). Preflight changes nothing.

A branch with no commit yet travels with no base: its two diffs against the empty tree, the
repository's other refs in a bundle of them alone. Assume-unchanged entries and skip-worktree
entries whose files are present travel with their bits and the bytes no diff carries
(`unwatched.tar`).

Submodules travel with their checkouts, recursively: each gitlink of the index with the
commit it pins, and each checked-out submodule captured as a repository of its own (its full
bundle, its diffs, its untracked files, its refs and stash, its `.git/modules/<name>/config`
with any credential redacted), every artifact named with the submodule's prefix (`sm<n>-`).
The superproject's diffs leave the gitlinks out (`--ignore-submodules=all`): the index's
gitlinks travel as a list and the submodules' own checkouts as their records.

A shallow clone travels shallow: its boundary (`.git/shallow`) is carried byte for byte as
`git-shallow`, and its bundle is always a full one with no prerequisites. A sparse checkout
travels sparse: its patterns (`info/sparse-checkout`) and `config.worktree` (where `git
sparse-checkout` keeps its settings) byte for byte, and the skip-worktree entries by name
(docs/design.md decision 17 says why). A linked worktree (`git worktree add`) travels as a
repository of its own: its HEAD, index, `config.worktree` and sparse patterns from its own git
dir, the repository's shared refs, stash and config, never another worktree's HEAD, index or
files; its submodules (git keeps them under the worktree's own git dir, `worktrees/<id>/modules`)
travel as a main worktree's do and are restored under the restored repository's `.git/modules`;
whatever its common dir (a bare repository's, a submodule's, a separate git dir), the settings
that describe the source's layout (`core.bare`, `core.worktree`) staying behind.
Git LFS objects the checkout and the stash point at travel beside the bundle
(manager/checkpoint/lfs.py).

An inspection is few git runs, each answering what it can at once (docs/design.md decision 17):
one `rev-parse`, one `for-each-ref`, one `ls-files --stage` (and two cached diffs where an entry
names the empty blob), one `status`, one `config --list`.
The preflight at prepare leaves what it learned for the capture at commit, which reuses only
the parts whose input it proves unchanged (manager/checkpoint/inspect.py says why that is sound).

git runs as argv lists with a minimal environment: no system config, hooks pointed at
/dev/null, no fsmonitor (both would run programs the seat may have configured), no optional
locks (so `git status` never rewrites the index), C locale. The operator's global config is
kept on purpose: its excludes file is part of what `--exclude-standard` means on this host, and
dropping it would sweep files the operator ignores (an `.env`) into the artifact.

See docs/operations.md ("What a checkpoint carries").
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import stat
import subprocess
import tarfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.abc
import anyio.from_thread
import anyio.to_thread
import msgspec
import structlog

from connectors.privatefs import (
    UnsafeDirectory,
    UnsafeFile,
    file_identity,
    open_parent_below,
    open_regular,
    read_stable,
)
from manager import concurrency, registry
from manager.checkpoint import lfs
from manager.checkpoint.inspect import IndexStamp, InspectionCache, index_stamp
from manager.checkpoint.seal import ExclusiveFile, capture_file
from manager.childrun import run_collect
from protocol.checkpoint import (
    ASSUME_UNCHANGED_FILE,
    BUNDLE_FILE,
    CONTROL_DIR,
    FILE_NAME_RE,
    GIT_CONFIG_FILE,
    HOOK_FILE_PREFIX,
    INCOMING_PREFIX,
    INDEX_DIFF_FILE,
    INFO_EXCLUDE_FILE,
    INTENT_TO_ADD_FILE,
    LISTS_INLINE_CAP,
    MAX_SUBMODULE_DEPTH,
    MAX_SUBMODULES,
    REFS_FILE,
    SHALLOW_CAP,
    SHALLOW_FILE,
    SKIP_WORKTREE_FILE,
    SPARSE_PATTERNS_CAP,
    SPARSE_PATTERNS_FILE,
    STATUS_FILE,
    SUPERSEDED_PREFIX,
    UNTRACKED_FILE,
    UNWATCHED_FILE,
    WORKTREE_CONFIG_FILE,
    WORKTREE_DIFF_FILE,
    CarriedHook,
    FileRef,
    IncrementalLink,
    LfsRecord,
    PrecopyLink,
    RepositoryRecord,
    SparseRecord,
    StashEntry,
    SubmoduleRecord,
    UnwatchedRecord,
    check_relpath,
    format_refs_list,
    parse_porcelain_z,
    parse_shallow_list,
    selection_rule,
)
from protocol.codec import decode_json, encode_json
from protocol.errors import Refusal
from protocol.refusals import Code

Progress = Callable[[str, int], None]
log = structlog.get_logger("cotal.cut")

GIT = "git"
# Work done ahead of a fence (a move's pre-copy) runs at this niceness, so the seats that keep
# working on the same cores are served first; the work inside a fence never waits on it.
BACKGROUND = ("nice", "-n", "10")
# Every git run: hooks and fsmonitor are programs a seat can configure in .git/config; a cut
# must never execute them.
SAFE_CONFIG: tuple[str, ...] = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")
EXCLUDE_CONTROL = f":(exclude){CONTROL_DIR}"
# A mount-point restore stages and supersedes inside the root; neither is the seat's tree. No
# glob magic: the plain wildcard's `*` also crosses `/`, so everything beneath is excluded.
EXCLUDE_STAGING: tuple[str, ...] = (
    f":(exclude){INCOMING_PREFIX}*",
    f":(exclude){SUPERSEDED_PREFIX}*",
)
# Flags that make `git diff` a patch `git apply` reads back the same on any host, whatever the
# operator's diff.* config says (color, prefixes, external drivers, textconv, renames).
DIFF_FLAGS: tuple[str, ...] = (
    "--binary",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--no-renames",
    "--no-relative",
    "--src-prefix=a/",
    "--dst-prefix=b/",
    "--ita-invisible-in-index",
    # A gitlink's change is carried by the submodule's own record and the recorded gitlinks.
    "--ignore-submodules=all",
)
STATUS_ARGS: tuple[str, ...] = (
    "status",
    "--porcelain=v1",
    "-z",
    "--untracked-files=all",
    "--no-renames",
    "--",
    EXCLUDE_CONTROL,
    *EXCLUDE_STAGING,
)
_ENV_PASS = ("PATH", "HOME", "XDG_CONFIG_HOME", "TMPDIR")
_STDERR_KEEP = 64 * 1024
_PROGRESS_STEP = 4 * 1024 * 1024
_WRITE_BATCH = 1024 * 1024
# What git says (LC_ALL=C) when every ref is excluded by the bundle's prerequisites.
EMPTY_BUNDLE = "Refusing to create empty bundle"

# Operation state files under the git dir, with what each means and how to end it.
_IN_PROGRESS: tuple[tuple[str, str, str], ...] = (
    ("MERGE_HEAD", "a merge", "finish it (resolve, `git commit`) or `git merge --abort`"),
    ("rebase-merge", "a rebase", "finish it (`git rebase --continue`) or `git rebase --abort`"),
    (
        "rebase-apply",
        "a rebase or `git am`",
        "finish it or run `git rebase --abort` / `git am --abort`",
    ),
    ("CHERRY_PICK_HEAD", "a cherry-pick", "finish it or `git cherry-pick --abort`"),
    ("REVERT_HEAD", "a revert", "finish it or `git revert --abort`"),
    (
        "sequencer",
        "a cherry-pick or revert sequence",
        "finish it or `git cherry-pick --abort` / `git revert --abort`",
    ),
    ("BISECT_LOG", "a bisect", "end it with `git bisect reset`"),
)


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: os.environ[k] for k in _ENV_PASS if k in os.environ}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_TERMINAL_PROMPT="0",
        GIT_OPTIONAL_LOCKS="0",
        LC_ALL="C",
        GIT_PAGER="cat",
    )
    if extra:
        env.update(extra)
    return env


def _tail(data: bytes, limit: int = 1500) -> str:
    text = data.decode("utf-8", "replace").strip()
    return text if len(text) <= limit else "…" + text[-limit:]


def _show(args: Sequence[str]) -> str:
    return "git " + " ".join(args)


@dataclass(frozen=True)
class GitResult:
    rc: int
    stdout: bytes
    stderr: bytes


async def run_git(
    cwd: Path,
    *args: str,
    ok: Sequence[int] = (0,),
    env: Mapping[str, str] | None = None,
    stdin: bytes | None = None,
    code: str = Code.GIT_FAILED,
    cure: str = "read git's message; nothing was changed",
    background: bool = False,
) -> GitResult:
    """Run one git command in `cwd`; an exit status outside `ok` is a Refusal with git's stderr.
    `background` runs it (and the children it starts) at `BACKGROUND` niceness."""
    try:
        # Not `anyio.run_process`: at about 14 git processes per seat, its per-child machinery
        # was half of what a 50-seat cut cost the manager's core (manager/childrun.py).
        proc = await run_collect(
            [*(BACKGROUND if background else ()), GIT, *SAFE_CONFIG, *args],
            cwd=cwd,
            env=git_env(env),
            input=stdin,
        )
    except FileNotFoundError:
        raise Refusal(
            Code.GIT_MISSING,
            f"cannot run git in {cwd} (git is not on PATH or {cwd} is gone)",
            "install git",
        ) from None
    if proc.returncode not in ok:
        raise _git_refusal(code, args, cwd, proc.returncode, proc.stderr, cure)
    return GitResult(proc.returncode, proc.stdout, proc.stderr)


KILLED_CURE = (
    "git was killed from outside, not stopped by what it read (the kernel's log names the OOM "
    "killer if it was that); find what killed it"
)


def _git_refusal(
    code: str, args: Sequence[str], cwd: Path, rc: int, stderr: bytes, cure: str
) -> Refusal:
    """A git that exited `rc`: its own message where it wrote one; where a signal ended it,
    which signal, and a cure about the kill rather than about the repository."""
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return Refusal(
            code, f"`{_show(args)}` was killed by {name} in {cwd} before it finished", KILLED_CURE
        )
    return Refusal(code, f"`{_show(args)}` failed in {cwd} (exit {rc}): {_tail(stderr)}", cure)


# How long a git told to stop may take to remove its lock files before it is killed.
_TERM_GRACE_S = 5.0


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


async def _end_git_group(process: anyio.abc.Process) -> None:
    """End a git that is being abandoned, and every process it started.

    Killing git alone leaves its children running (the bundle's `git pack-objects` goes on
    until it next writes), and a git killed outright leaves its lock files behind (`git diff`
    may hold index.lock while it refreshes the index) in the seat's repository. So the whole
    group is asked to stop first, which git answers by removing its lock files, and killed
    only if it does not.
    """
    if process.returncode is not None:
        return
    with anyio.CancelScope(shield=True):
        _signal_group(process.pid, signal.SIGTERM)
        with anyio.move_on_after(_TERM_GRACE_S):
            await process.wait()
        _signal_group(process.pid, signal.SIGKILL)


async def _open_git_group(cwd: Path, args: Sequence[str], background: bool) -> anyio.abc.Process:
    try:
        # A group of its own: `git bundle` writes through a `git pack-objects` child, which
        # must end with it when the capture is cancelled (_end_git_group). Shielded, because
        # a cancel while the pipes connect would kill git alone and orphan that child.
        with anyio.CancelScope(shield=True):
            process = await anyio.open_process(
                [*(BACKGROUND if background else ()), GIT, *SAFE_CONFIG, *args],
                cwd=cwd,
                env=git_env(),
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
    except FileNotFoundError:
        raise Refusal(Code.GIT_MISSING, f"cannot run git in {cwd}", "install git") from None
    return process


async def _keep_stderr(stream: anyio.abc.ByteReceiveStream, stderr: bytearray) -> None:
    # Read stderr concurrently so a chatty git cannot block on a full pipe.
    async for chunk in stream:
        if len(stderr) < _STDERR_KEEP:
            stderr.extend(chunk[: _STDERR_KEEP - len(stderr)])


async def _write_stdout(
    stream: anyio.abc.ByteReceiveStream,
    out: ExclusiveFile,
    progress: Progress | None,
    phase: str,
) -> None:
    done = 0
    # A pipe hands over at most 64 KiB at a time, and a thread hop per piece
    # is the daemon's CPU on a cut bound by it (docs/design.md decision 19).
    batch = bytearray()
    async for chunk in stream:
        batch += chunk
        if len(batch) >= _WRITE_BATCH:
            done += await anyio.to_thread.run_sync(out.write, batch)
            batch = bytearray()
            if progress is not None:
                progress(phase, done)
    if batch:
        done += await anyio.to_thread.run_sync(out.write, batch)
        if progress is not None:
            progress(phase, done)


async def stream_git_to_file(
    cwd: Path,
    args: Sequence[str],
    directory: Path,
    name: str,
    *,
    progress: Progress | None = None,
    phase: str = "",
    background: bool = False,
) -> FileRef:
    """Stream one git command's stdout into a new exclusive file, never holding it in memory;
    `background` as for `run_git`."""
    out = await anyio.to_thread.run_sync(ExclusiveFile, directory, name)
    try:
        stderr = bytearray()
        process = await _open_git_group(cwd, args, background)
        async with process:
            assert process.stdout is not None and process.stderr is not None
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_keep_stderr, process.stderr, stderr)
                    await _write_stdout(process.stdout, out, progress, phase)
                rc = await process.wait()
            except BaseException:
                await _end_git_group(process)
                raise
        if rc != 0:
            raise _git_refusal(
                Code.GIT_FAILED,
                args,
                cwd,
                rc,
                bytes(stderr),
                "read git's message; the seat's repository was not changed",
            )
        return await anyio.to_thread.run_sync(out.finish)
    except BaseException:
        out.abort()
        raise


# -- preflight ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigListing:
    """`git config --file config --null --list` and the digest of the bytes it listed."""

    # None when the file moved while git listed it: such a listing is never reused.
    digest: bytes | None
    listing: bytes


@dataclass(frozen=True)
class GitDirFacts:
    """What travels from the git dir: the config, the hooks that are not samples, info/exclude."""

    config: Path | None
    hooks: list[tuple[str, Path]]
    info_exclude: Path | None
    listing: ConfigListing | None = None
    # `config.worktree` and `info/sparse-checkout`, byte for byte, when the repository has them.
    worktree_config: bytes | None = None
    sparse_patterns: bytes | None = None
    # The config keys (lower case) that describe where the source's work tree is rather than
    # what the repository is, left out of the carried config: the restore rebuilds a
    # repository of its own at the seat's cwd (`_layout_keys`).
    layout_keys: frozenset[bytes] = frozenset()


@dataclass(frozen=True)
class IndexScan:
    """What the index alone decides, with the stamp of the index it was read from."""

    stamp: IndexStamp | None
    # The entries `git add -N` made, sorted: neither diff carries one as an index entry.
    intent_to_add: list[str]
    # Every stage-0 entry marked skip-worktree, in index order.
    skip_worktree: tuple[bytes, ...] = ()
    # Every stage-0 entry marked assume-unchanged, in index order.
    assume_unchanged: tuple[bytes, ...] = ()
    # The digest of `git ls-files -s -t -v -z`: every entry's tag (its skip-worktree and
    # assume-unchanged bits), mode, object, stage and path, and the intent-to-add entries,
    # without the stat data: `git diff` rewrites the index to refresh that
    # (GIT_OPTIONAL_LOCKS=0 does not stop it), which changes the stamp but not what the index
    # says.
    entries: str = ""
    # Every stage-0 gitlink (a submodule's pinned commit) as (path, commit), in index order.
    gitlinks: tuple[tuple[bytes, str], ...] = ()
    # The parent directories of `skip_worktree` (b"" for the top level), for `_check_skipped`,
    # which every inspection runs, a reused scan's too: each check is one lstat a directory a
    # sparse checkout left out.
    skipped_dirs: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class Reusable:
    """The part of an inspection a later one may reuse once its input is proven unchanged."""

    index: IndexScan
    config: ConfigListing | None


@dataclass(frozen=True)
class RepoFacts:
    top: Path
    base: str | None
    head: str | None
    status: str
    untracked: list[bytes]
    # The files of the entries git does not compare that are present (`_unwatched_present`).
    unwatched: list[bytes]
    gitdir: GitDirFacts
    refs: dict[str, str]
    index: IndexScan
    stash: list[StashEntry]
    # `.git/shallow` byte for byte, or None for a repository with its whole history.
    shallow: bytes | None = None
    # The prefix of every artifact's name: empty for the seat's repository, `sm<n>-`... for a
    # submodule's; and the submodules of this repository's index.
    prefix: str = ""
    submodules: tuple[SubFacts, ...] = ()
    # The Git LFS objects the checkout and the stash point at, or None without any.
    lfs: lfs.LfsFacts | None = None

    def reusable(self) -> Reusable:
        return Reusable(index=self.index, config=self.gitdir.listing)

    def reusables(self) -> dict[Path, Reusable]:
        """This repository's reusable part and every checked-out submodule's, by top level."""
        found = {self.top: self.reusable()}
        for sub in self.submodules:
            if sub.facts is not None:
                found.update(sub.facts.reusables())
        return found


@dataclass(frozen=True)
class SubFacts:
    """One gitlink of a repository's index: where, what it pins, and the submodule checked out
    there (`name` and `facts` None when it is not checked out)."""

    path: str
    commit: str
    prefix: str
    worktree: Path
    name: str | None = None
    facts: RepoFacts | None = None
    # Its directory is gone from the worktree (`rm -rf` without `git rm`): the status shows the
    # gitlink deleted, and the restore leaves no directory there either.
    absent: bool = False


# The preflights at prepare, kept for the capture at commit (manager/checkpoint/inspect.py).
_INSPECTIONS: InspectionCache[Reusable] = InspectionCache()


# What every path `_in_control_dir` may accept begins with: one cheap test per index entry.
_CONTROL_STARTS = (CONTROL_DIR.encode(), INCOMING_PREFIX.encode(), SUPERSEDED_PREFIX.encode())


def _in_control_dir(path: bytes) -> bool:
    ctl = CONTROL_DIR.encode()
    if path == ctl or path.startswith(ctl + b"/"):
        return True
    return path.startswith((INCOMING_PREFIX.encode(), SUPERSEDED_PREFIX.encode()))


def check_includes(include: Sequence[str]) -> list[str]:
    """The declared ignored paths as the record will carry them: validated, first mention kept."""
    return registry.check_includes(include)


def _plain_file(path: Path, what: str, cure: str) -> Path | None:
    """`path` when it is a regular file, None when absent; anything else refuses by name."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise Refusal(
            Code.GITDIR_UNSUPPORTED,
            f"{what} {path} is a symlink or not a regular file; a checkpoint carries only "
            "regular files from .git",
            cure,
        )
    return path


_CONFIG_CAP = 1 << 20


def _config_digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _read_config_bytes(path: Path) -> tuple[bytes, tuple[int, int, int, int]] | None:
    """The digest of `path` and the stat data it was read under, or None past the cap.

    A digest, not the bytes: the cache lives as long as the daemon, and a config may hold a
    credential."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        data = os.pread(fd, _CONFIG_CAP + 1, 0)
    finally:
        os.close(fd)
    if len(data) > _CONFIG_CAP:
        return None
    return _config_digest(data), (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


async def _list_config(cwd: Path, config: Path, earlier: ConfigListing | None) -> ConfigListing:
    """The config's listing, reused when its bytes are those listed before.

    The bytes are read before and after git lists them: a listing is kept for reuse only when
    both reads agree, so its key is the content git actually read.
    """
    before = _read_config_bytes(config)
    if earlier is not None and before is not None and before[0] == earlier.digest:
        return earlier
    listing = await run_git(cwd, "config", "--file", str(config), "--null", "--list")
    after = _read_config_bytes(config)
    key = before[0] if before is not None and before == after else None
    return ConfigListing(digest=key, listing=listing.stdout)


async def _gitdir_facts(
    cwd: Path,
    common: Path,
    earlier: ConfigListing | None,
    own_worktree: bytes | None = None,
    git_dir: Path | None = None,
) -> GitDirFacts:
    """`own_worktree` is the one `core.worktree` a submodule's config may set: the path from
    its git dir (`modules/<name>`) back to its checkout, which git writes and the restore's
    layout reproduces. `git_dir` is a linked worktree's own (`<common>/worktrees/<id>`): its
    `config.worktree` and sparse patterns are read there, never the main worktree's; the
    config, hooks and info/exclude are the repository's, shared by every worktree."""
    config = _plain_file(
        common / "config", "git config", "replace it with a regular file, then cut again"
    )
    listing: ConfigListing | None = None
    layout: frozenset[bytes] = frozenset()
    if config is not None:
        listing = await _list_config(cwd, config, earlier)
        if own_worktree is None:
            layout = _layout_keys(listing, linked=git_dir is not None and git_dir != common)
        else:
            _check_core_worktree(config, listing, own_worktree)
    hooks: list[tuple[str, Path]] = []
    hooks_dir = common / "hooks"
    if os.path.isdir(hooks_dir) and not os.path.islink(hooks_dir):
        for name in sorted(os.listdir(hooks_dir)):
            if name.endswith(".sample"):
                continue
            cure = f"remove {hooks_dir / name} or replace it with a regular file, then cut again"
            # Named with the longest prefix a submodule's may have, so any repository's fits.
            if not FILE_NAME_RE.fullmatch(_LONGEST_PREFIX + HOOK_FILE_PREFIX + name):
                raise Refusal(
                    Code.GITDIR_UNSUPPORTED,
                    f"hook {hooks_dir / name} has a name a checkpoint file cannot take",
                    cure,
                )
            path = _plain_file(hooks_dir / name, "hook", cure)
            if path is not None:
                hooks.append((name, path))
    elif os.path.lexists(hooks_dir):
        raise Refusal(
            Code.GITDIR_UNSUPPORTED,
            f"{hooks_dir} is a symlink or not a directory",
            "replace it with a plain directory of hooks, then cut again",
        )
    exclude = _plain_file(
        common / "info" / "exclude",
        "info/exclude",
        "replace it with a regular file, then cut again",
    )
    own = common if git_dir is None else git_dir
    worktree_config = await anyio.to_thread.run_sync(_read_worktree_config, own, own_worktree)
    patterns = await anyio.to_thread.run_sync(_read_sparse_patterns, own)
    return GitDirFacts(
        config=config,
        hooks=hooks,
        info_exclude=exclude,
        listing=listing,
        worktree_config=worktree_config,
        sparse_patterns=patterns,
        layout_keys=layout,
    )


# `core.worktree` in the seat's own repository can only name the seat's cwd (the probe refused
# a cwd that is not the top level of the work tree git finds), and the restore puts the
# repository there anyway; a linked worktree's repository says `core.bare = true` when it is a
# bare one, which is true of the common dir and not of the repository of its own the worktree
# is restored as (docs/design.md decision 17).
_WORKTREE_KEY = b"core.worktree"
_BARE_KEY = b"core.bare"


def _layout_keys(listing: ConfigListing, *, linked: bool) -> frozenset[bytes]:
    """The layout keys `listing` sets that the carried config leaves out."""
    keys = {key.lower() for key, _ in _config_entries(listing.listing)}
    return frozenset(keys & ({_WORKTREE_KEY, _BARE_KEY} if linked else {_WORKTREE_KEY}))


def _check_core_worktree(config: Path, listing: ConfigListing, own_worktree: bytes | None) -> None:
    worktrees = [
        value for key, value in _config_entries(listing.listing) if key.lower() == b"core.worktree"
    ]
    if worktrees and (own_worktree is None or worktrees != [own_worktree]):
        raise Refusal(
            Code.GITDIR_UNSUPPORTED,
            f"{config} sets core.worktree, which names a path on this host; the restore "
            "rebuilds the worktree at the seat's cwd",
            "run `git config --unset core.worktree` and run the seat at its worktree, then "
            "cut again",
        )


def _read_worktree_config(git_dir: Path, own_worktree: bytes | None = None) -> bytes | None:
    """`config.worktree`, where `git sparse-checkout` writes `core.sparseCheckout`,
    `core.sparseCheckoutCone` and `index.sparse`: carried byte for byte, so never with a
    credential or a `core.worktree`, which it refuses by name instead; but for a submodule's
    own `core.worktree` (`own_worktree`), which `git sparse-checkout` moves there from its
    config and the restore sets again for the layout it makes."""
    cure = "move the setting into .git/config (`git config --worktree --unset KEY`), then cut again"
    path = _plain_file(git_dir / "config.worktree", "git config.worktree", cure)
    if path is None:
        return None
    data = read_stable(path, cap=_CONFIG_CAP, what="git config.worktree").data
    lowered = data.lower()
    if _URL_CREDENTIAL.search(data) or b"extraheader" in lowered:
        raise Refusal(
            Code.GITDIR_UNSUPPORTED,
            f"{path} holds a credential (a URL with a password or an http extraheader); a "
            "checkpoint carries config.worktree byte for byte and never a credential",
            cure,
        )
    values = re.findall(rb"(?m)^\s*worktree\s*=\s*(.*?)\s*$", lowered)
    if values and (own_worktree is None or values != [own_worktree.lower()]):
        raise Refusal(
            Code.GITDIR_UNSUPPORTED,
            f"{path} sets core.worktree, which names a path on this host; the restore rebuilds "
            "the worktree at the seat's cwd",
            "run `git config --worktree --unset core.worktree`, then cut again",
        )
    return data


def _read_sparse_patterns(git_dir: Path) -> bytes | None:
    """`info/sparse-checkout` byte for byte, cone or not, when the repository has one."""
    path = _plain_file(
        git_dir / "info" / "sparse-checkout",
        "info/sparse-checkout",
        "replace it with a regular file, then cut again",
    )
    if path is None:
        return None
    return read_stable(path, cap=SPARSE_PATTERNS_CAP, what="info/sparse-checkout").data


def _split_z(data: bytes) -> list[bytes]:
    return [item for item in data.split(b"\0") if item]


def _names(paths: Sequence[bytes], limit: int = 5) -> str:
    shown = ", ".join(os.fsdecode(p) for p in paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


# `git ls-files -s -t -v -z` prints each entry as its tag (`H` cached, `S` skip-worktree, `M`
# unmerged; lower case when also assume-unchanged), a space, its mode, object and stage, a
# tab, its path and a NUL. Everything before the path has one width in a repository (the
# object name's width is the hash's), so one slice takes a path out.
_TAG_CACHED = ord("H")
_TAG_SKIP_WORKTREE = ord("S")
_TAG_BOTH = ord("s")  # skip-worktree and assume-unchanged
_TAGS_SKIP_WORKTREE = (_TAG_SKIP_WORKTREE, _TAG_BOTH)
_TAGS_ASSUME_UNCHANGED = (ord("h"), _TAG_BOTH)
_GITLINK = b" 160000 "
_SHA1_WIDTH = len("H 100644 ") + 40 + len(" 0\t")
_SHA256_WIDTH = _SHA1_WIDTH + 24
# `git diff --cached --name-status -z`, each way of showing an intent-to-add entry: as the
# empty file it records (the default) or as no entry at all.
_ITA_DIFF = ("diff", "--cached", "--name-status", "-z", "--no-renames", "--ignore-submodules=all")


def _index_lines(cwd: Path, out: bytes) -> tuple[list[bytes], int]:
    """The output's entries and the width of what precedes each path, checked."""
    entries = out.split(b"\0")
    if entries.pop() != b"":
        raise _index_unreadable()
    if not entries:
        return entries, 0
    width = entries[0].find(b"\t") + 1
    # Every entry has the one width; a line that does not would be misread, so it refuses.
    if width not in (_SHA1_WIDTH, _SHA256_WIDTH) or any(
        e[width - 1] != 9 or e[1] != 32 for e in entries
    ):
        raise _index_unreadable()
    return entries, width


async def _intent_to_add(cwd: Path) -> list[str]:
    """The entries `git add -N` made: the paths the index's diff against HEAD shows differently
    when such entries are shown as empty files and when they are hidden. An ordinary entry
    shows the same either way; one made by `git add -N` always differs (added or modified
    against nothing or deleted), whatever HEAD holds at its path."""
    shown, hidden = await _side_by_side(
        partial(run_git, cwd, *_ITA_DIFF, "--ita-visible-in-index"),
        partial(run_git, cwd, *_ITA_DIFF, "--ita-invisible-in-index"),
    )

    def by_path(out: bytes) -> dict[bytes, bytes]:
        items = out.split(b"\0")
        return dict(zip(items[1::2], items[0::2], strict=False))

    seen, unseen = by_path(shown.stdout), by_path(hidden.stdout)
    differ = {p for p in seen.keys() | unseen.keys() if seen.get(p) != unseen.get(p)}
    return sorted(p.decode("utf-8", "surrogateescape") for p in differ)


def _index_unreadable() -> Refusal:
    return Refusal(
        Code.GIT_FAILED,
        "`git ls-files --stage` printed an entry this version cannot read",
        "report this with `git --version`; nothing was changed",
    )


async def _scan_index(cwd: Path, stamp: IndexStamp | None) -> IndexScan:
    """Refuse the index states a checkpoint cannot carry; name the skip-worktree entries and
    the gitlinks.

    Python touches each of a 100,000-entry index's lines a few times at most: the common
    questions are answered by counting tags and searching the whole output for a rare byte
    string; only a hit is parsed entry by entry. What the index says is digested from the
    output as printed, with the intent-to-add entries (`_intent_to_add`)."""
    out = (await run_git(cwd, "ls-files", "-s", "-t", "-v", "-z")).stdout
    entries, width = _index_lines(cwd, out)
    tags = bytes(e[0] for e in entries)
    plain = tags.count(_TAG_CACHED) + tags.count(_TAG_SKIP_WORKTREE) == len(entries)
    unmerged: list[bytes] = []
    flagged: list[bytes] = []
    if not plain:
        for e in entries:
            if e[width - 2] != ord("0"):
                unmerged.append(e[width:])
            elif e[0] in _TAGS_ASSUME_UNCHANGED:
                flagged.append(e[width:])
    gitlinks: list[tuple[bytes, str]] = []
    if _GITLINK in out:
        gitlinks = [
            (e[width:], e[9 : width - 3].decode("ascii"))
            for e in entries
            if e[1:9] == _GITLINK and e[width - 2] == ord("0")
        ]
    control: list[bytes] = []
    if b"\t" + _CONTROL_STARTS[0] in out:
        control = [e[width:] for e in entries if _in_control_dir(e[width:])]
    unmerged = sorted(set(unmerged))
    if unmerged:
        raise Refusal(
            Code.UNMERGED,
            f"{cwd} has unmerged paths ({_names(unmerged)}); `git diff --cached` cannot express "
            "them",
            "resolve them (`git add` the result) or abort the merge, then cut again",
        )
    bad = [p for p in flagged if not _utf8(p)]
    if bad:
        raise Refusal(
            Code.NON_UTF8_PATH,
            f"{cwd} has assume-unchanged entries whose names are not UTF-8 ({_names(bad)})",
            "rename them to UTF-8 names, then cut again",
        )
    if control:
        raise Refusal(
            Code.CONTROL_DIR_TRACKED,
            f"{cwd} tracks files under {CONTROL_DIR}/ ({_names(control)}); the control directory "
            "holds "
            "credentials and must never enter a checkpoint",
            f"run `git rm -r --cached {CONTROL_DIR}` and add {CONTROL_DIR}/ to .gitignore",
        )
    skipped = (
        [e[width:] for e in entries if e[0] in _TAGS_SKIP_WORKTREE]
        if _TAG_SKIP_WORKTREE in tags or _TAG_BOTH in tags
        else []
    )
    # `git add -N` records its entry as the empty blob, so an index without one has none.
    empty = hashlib.new("sha1" if width == _SHA1_WIDTH else "sha256", b"blob 0\0")
    ita = await _intent_to_add(cwd) if b" %s 0\t" % empty.hexdigest().encode() in out else []
    digest = hashlib.sha256(out)
    digest.update(b"".join(os.fsencode(p) + b"\0" for p in ita))
    return IndexScan(
        stamp=stamp,
        intent_to_add=ita,
        entries=digest.hexdigest(),
        skip_worktree=tuple(skipped),
        assume_unchanged=tuple(flagged),
        gitlinks=tuple(gitlinks),
        skipped_dirs=_parents(skipped),
    )


def _parents(paths: Sequence[bytes]) -> tuple[bytes, ...]:
    """The parent directories of `paths` (b"" for the top level), each once, sorted."""
    return tuple(sorted({path.rpartition(b"/")[0] for path in paths}))


def _present_skipped(top: bytes, index: IndexScan) -> list[bytes]:
    """The skip-worktree entries whose path exists in the worktree. A sparse checkout leaves
    whole directories out, so a directory found absent answers for every entry in it with one
    lstat: on a 100,000-file cone of 1,000 directories, about 1,000 lstats instead of 100,000;
    only the entries of a directory that is there are looked at one by one."""
    there = {
        parent
        for parent in index.skipped_dirs
        if not parent or os.path.lexists(top + b"/" + parent)
    }
    if not there:
        return []
    return [
        path
        for path in index.skip_worktree
        if path.rpartition(b"/")[0] in there and os.path.lexists(top + b"/" + path)
    ]


def _unwatched_present(cwd: Path, index: IndexScan) -> list[bytes]:
    """The files git does not compare with their entries that are in the worktree: each
    assume-unchanged entry's and each skip-worktree entry's found present (`git update-index
    --skip-worktree` on a present file, how a local edit of a tracked file is kept out of
    sight). No diff carries their bytes, so the capture archives them (`unwatched.tar`); each
    must be a regular file or a symlink, and a skip-worktree name the record cannot spell
    refuses."""
    skipped = index.skip_worktree
    bad = [] if _utf8(b"\0".join(skipped)) else [p for p in skipped if not _utf8(p)]
    if bad:
        raise Refusal(
            Code.NON_UTF8_PATH,
            f"{cwd} has skip-worktree entries whose names are not UTF-8 ({_names(bad)})",
            "rename them to UTF-8 names, then cut again",
        )
    top = os.fsencode(cwd)
    present = _present_skipped(top, index)
    present += [p for p in index.assume_unchanged if os.path.lexists(top + b"/" + p)]
    present = sorted(set(present))
    odd = [p for p in present if not _archivable(top + b"/" + p)]
    if odd:
        raise Refusal(
            Code.INDEX_FLAGS,
            f"{cwd} has assume-unchanged or skip-worktree entries whose worktree paths are not "
            f"regular files or symlinks ({_names(odd)})",
            "clear the bit (`git update-index --no-assume-unchanged --no-skip-worktree <path>`) "
            "or put the file back, then cut again",
        )
    return present


def _archivable(path: bytes) -> bool:
    mode = os.lstat(path).st_mode
    return stat.S_ISREG(mode) or stat.S_ISLNK(mode)


@dataclass(frozen=True)
class _Probe:
    top: Path
    common: Path
    # This worktree's own git dir: the common dir, or `<common>/worktrees/<id>` for a linked
    # worktree, where its HEAD, index, `config.worktree` and sparse patterns live.
    git_dir: Path
    index: Path
    # HEAD's commit, None on an unborn branch (`git init`, or `git checkout --orphan`, with
    # no commit yet): `head` then names that branch.
    base: str | None
    head: str | None
    refs: dict[str, str]
    shallow: bool = False


_PROBE_FIXED = 6  # is-inside-work-tree, toplevel, common dir, shallow, index path, git dir
# One `git rev-parse` for where the repository is and whether it can be captured (`_probe`).
PROBE_ARGS: tuple[str, ...] = (
    "rev-parse",
    "--is-inside-work-tree",
    "--show-toplevel",
    "--git-common-dir",
    "--is-shallow-repository",
    "--git-path",
    "index",
    "--absolute-git-dir",
    *(arg for name, _, _ in _IN_PROGRESS for arg in ("--git-path", name)),
    "--verify",
    "-q",
    "HEAD^{commit}",
)
# The bundle's refs: every ref `REFS_ARGS` lists in this worktree (the repository's shared refs
# and this worktree's own `refs/worktree/`...), and HEAD (`_capture_bundle`).
BUNDLE_REVS: tuple[str, ...] = ("--glob=refs/*", "HEAD")
# On an unborn branch HEAD names nothing, so the bundle carries the refs alone.
BUNDLE_REFS_ONLY: tuple[str, ...] = ("--glob=refs/*",)
# `%(HEAD)` is one character, `*` or a space, so it leads the line (`_read_refs_and_head`).
REFS_ARGS: tuple[str, ...] = ("for-each-ref", "--format=%(HEAD)%(objectname) %(refname)")


def _check_top_level(cwd: Path, real: Path, probe: GitResult, lines: list[str]) -> None:
    """Refuse a cwd that is not the top level of a repository's working tree."""
    if probe.rc == 128 or not lines or lines[0] != "true":
        raise Refusal(
            Code.NOT_A_REPOSITORY,
            f"seat cwd {cwd} is not the working tree of a git repository, so its state cannot be "
            "captured",
            f"run `git init` in {cwd} and commit the seat's files, or move the seat into a git "
            "repository",
        )
    expected = _PROBE_FIXED + len(_IN_PROGRESS) + (1 if probe.rc == 0 else 0)
    if len(lines) != expected:
        raise Refusal(
            Code.GIT_FAILED,
            f"`git rev-parse` in {cwd} printed {len(lines)} lines where {expected} were asked "
            "for (a path with a newline in its name?)",
            "run the seat in a directory whose path has no newline, then cut again",
        )
    top = Path(lines[1]).resolve()
    if top != real:
        raise Refusal(
            Code.NOT_TOP_LEVEL,
            f"seat cwd {cwd} is inside the repository at {top} but is not its top level; the "
            "restore "
            "rebuilds the repository at the seat's cwd",
            f"run the seat at {top}, or run `git init` in {cwd} to give it a repository of its own",
        )


def _worktree_shape(cwd: Path, lines: list[str]) -> tuple[Path, Path]:
    """The repository's common dir and this worktree's own git dir.

    A linked worktree (`git worktree add`: its git dir `<common>/worktrees/<id>` is not the
    common dir) travels as a repository of its own: its branch, HEAD, index, changes and the
    repository's refs and stash, never another worktree's HEAD, index or files (docs/design.md
    decision 17), whatever its common dir is: an ordinary `.git`, a bare repository, a
    submodule's git dir or a `--separate-git-dir`. The settings that describe that layout
    (`core.bare`, `core.worktree`) stay behind (`_layout_keys`). A main worktree with linked
    worktrees attached travels the same way, without them.
    """
    return (cwd / lines[2]).resolve(), Path(lines[5]).resolve()


def _refuse_operation_in_progress(cwd: Path, lines: list[str]) -> None:
    markers = lines[_PROBE_FIXED : _PROBE_FIXED + len(_IN_PROGRESS)]
    for (_name, what, cure), rel in zip(_IN_PROGRESS, markers, strict=True):
        if os.path.lexists(cwd / rel):
            raise Refusal(
                Code.OPERATION_IN_PROGRESS,
                f"{what} is in progress in {cwd} ({rel} exists); its state lives in files a "
                "checkpoint does not carry",
                cure + ", then cut again",
            )


async def _unborn_branch(cwd: Path) -> str:
    """The branch HEAD names when it has no commit yet. A HEAD that names no commit and no
    branch (a detached HEAD whose object is gone) refuses by name."""
    head_ref = await run_git(cwd, "symbolic-ref", "-q", "HEAD", ok=(0, 1))
    branch = head_ref.stdout.decode("utf-8", "surrogateescape").strip()
    if head_ref.rc != 0 or not branch.startswith("refs/heads/"):
        raise Refusal(
            Code.GIT_FAILED,
            f"HEAD of {cwd} names neither a commit nor a branch",
            f"check out a branch or a commit (`git -C {cwd} checkout <branch>`), then cut again",
        )
    return branch


async def _probe(cwd: Path) -> _Probe:
    """Where the repository is, whether it can be captured at all, and what its refs say.

    One `git rev-parse` answers the top level, the git dirs, shallowness, the operation
    markers and the HEAD commit; one `git for-each-ref` every ref and the branch HEAD is on.
    """
    if not cwd.is_dir():
        raise Refusal(
            Code.NOT_A_REPOSITORY,
            f"seat cwd {cwd} is not a directory",
            "run the seat in a directory that is a git repository",
        )
    real = cwd.resolve()
    probe = await run_git(cwd, *PROBE_ARGS, ok=(0, 1, 128))
    lines = probe.stdout.decode("utf-8", "surrogateescape").splitlines()
    _check_top_level(cwd, real, probe, lines)
    common, git_dir = _worktree_shape(cwd, lines)
    _refuse_operation_in_progress(cwd, lines)
    refs, head = await _read_refs_and_head(cwd)
    if probe.rc != 0:
        # An unborn branch travels: no commit, its index and files as the two diffs against
        # the empty tree carry them, and the refs the repository already has (docs/design.md
        # decision 17).
        head = await _unborn_branch(cwd)
    return _Probe(
        top=real,
        common=common,
        git_dir=git_dir,
        index=cwd / lines[4],
        base=lines[-1] if probe.rc == 0 else None,
        head=head,
        refs=refs,
        shallow=lines[3] == "true",
    )


def _read_shallow(cwd: Path, common: Path) -> bytes:
    """`.git/shallow` of a shallow clone, proven to be the list git writes: a regular file of
    commit ids, each once. Anything else refuses by name before the seat stops."""
    path = common / "shallow"
    cure = (
        "make the repository's boundary a plain `.git/shallow` again (`git fetch --depth N` "
        "rewrites it), or deepen it fully (`git fetch --unshallow`), then cut again"
    )
    if _plain_file(path, "the shallow boundary", cure) is None:
        raise Refusal(
            Code.GITDIR_UNSUPPORTED,
            f"{cwd} is shallow but {path} does not exist (a graft or GIT_SHALLOW_FILE elsewhere); "
            "a checkpoint carries the boundary only as .git/shallow",
            cure,
        )
    data = read_stable(path, cap=SHALLOW_CAP, what="the shallow boundary").data
    try:
        parse_shallow_list(data)
    except ValueError as exc:
        raise Refusal(Code.GITDIR_UNSUPPORTED, f"{path}: {exc}", cure) from None
    return data


async def _read_refs_and_head(cwd: Path) -> tuple[dict[str, str], str | None]:
    """Every ref as `{refname: oid}`, and the ref HEAD is on (None when detached).

    `%(HEAD)` marks the ref HEAD resolves to, as `git symbolic-ref HEAD` names it.
    """
    out = await run_git(cwd, *REFS_ARGS)
    refs: dict[str, str] = {}
    head: str | None = None
    for line in out.stdout.decode("utf-8").splitlines():
        oid, _, name = line[1:].partition(" ")
        refs[name] = oid
        if line[:1] == "*":
            head = name
    return refs, head


async def _facts(
    cwd: Path,
    include: Sequence[str] = (),
    earlier: Reusable | None = None,
    *,
    stash: bool = True,
    prefix: str = "",
    own_worktree: bytes | None = None,
    earlier_subs: Mapping[Path, Reusable] | None = None,
    probed: tuple[_Probe, list[StashEntry]] | None = None,
) -> RepoFacts:
    """Inspect the repository at `cwd`, refusing what a checkpoint cannot reproduce.

    `earlier` is a previous inspection of the same repository: its index scan is reused when
    the index stamp is unchanged and its config listing when the config bytes are (see
    manager/checkpoint/inspect.py for why nothing else is). The stash reflog is read only for
    a capture (`stash`): it refuses nothing, and a capture reads it again anyway.
    `earlier_subs` are the submodules' earlier inspections by top level (without it, a
    submodule's is taken from the preflight's cache). `probed` is this inspection's probe and
    stash reflog when the caller has read them already (`_probe_for_capture`).
    """
    cwd = Path(cwd)
    probe = probed[0] if probed is not None else await _probe(cwd)
    # The status lists every untracked file (`--untracked-files=all`) with the same pathspec the
    # untracked archive uses, so one git run answers both. Both read only, so they run at once
    # (the index scan's parse beside the status's git): the refusal raised is still the scan's
    # first, as in the order written here.
    index, status_run = await _side_by_side(
        partial(_index_scan, cwd, probe.index, earlier), partial(run_git, cwd, *STATUS_ARGS)
    )
    raw_status = status_run.stdout
    untracked = await _untracked_paths(cwd, raw_status, include)
    _check_untracked(cwd, untracked)
    unwatched = _unwatched_present(cwd, index)
    status = _decode_status(cwd, raw_status)
    gitdir = await _gitdir_facts(
        cwd, probe.common, earlier.config if earlier else None, own_worktree, probe.git_dir
    )
    if probed is not None:
        entries = probed[1]
    else:
        entries = await _read_stash_reflog(cwd) if stash and "refs/stash" in probe.refs else []
    shallow = (
        await anyio.to_thread.run_sync(_read_shallow, cwd, probe.common) if probe.shallow else None
    )
    submodules = await _submodule_facts(
        probe, index.gitlinks, prefix, stash=stash, earlier_subs=earlier_subs
    )
    lfs_facts = await _lfs_facts(cwd, probe, gitdir, status, entries if stash else None)
    return RepoFacts(
        top=probe.top,
        base=probe.base,
        head=probe.head,
        status=status,
        untracked=untracked,
        unwatched=unwatched,
        gitdir=gitdir,
        refs=probe.refs,
        index=index,
        stash=entries,
        shallow=shallow,
        prefix=prefix,
        submodules=submodules,
        lfs=lfs_facts,
    )


async def _lfs_facts(
    cwd: Path,
    probe: _Probe,
    gitdir: GitDirFacts,
    status: str,
    stash: list[StashEntry] | None,
) -> lfs.LfsFacts | None:
    """The Git LFS objects the repository's checkout and stash point at, each found in its LFS
    storage (or, for a changed worktree file, in the file), refusing by name a pointer whose
    object is not there (manager/checkpoint/lfs.py). None, after no git run, for a repository
    that does not use LFS, and for one whose checkout and stash point at no object."""
    own = gitdir.listing.listing if gitdir.listing is not None else None
    if not lfs.uses_lfs(probe.top, probe.common, own):
        return None
    own_storage = [
        v for k, v in _config_entries(own or b"") if k.lower() == b"lfs.storage" and v is not None
    ]
    lfs.check_own_storage(cwd, os.fsdecode(own_storage[-1]) if own_storage else None)
    # The storage git-lfs reads, which a global config may set as well.
    configured = await run_git(cwd, "config", "--get", "lfs.storage", ok=(0, 1))
    storage = lfs.storage_dir(probe.common, os.fsdecode(configured.stdout.strip()) or None)
    if stash is None:
        stash = await _read_stash_reflog(cwd) if "refs/stash" in probe.refs else []
    pointers = await _lfs_pointers(cwd, stash)
    objects: dict[str, lfs.LfsObject] = {}
    missing: list[tuple[str, str]] = []

    def look_up(rel: str, oid: str, size: int) -> None:
        if oid in objects:
            return
        found = lfs.stored_object(storage, oid, size, rel)
        if found is None:
            missing.append((rel, oid))
        else:
            objects[oid] = found

    for rel, oid, size in pointers:
        look_up(rel, oid, size)
    changed = lfs.changed_in_worktree(status)
    if changed:
        attrs = await run_git(
            cwd, "check-attr", "-z", "--stdin", "filter", stdin="\0".join(changed).encode() + b"\0"
        )
        for rel in lfs.lfs_paths_of_check_attr(attrs.stdout):
            found = await anyio.to_thread.run_sync(lfs.worktree_object, probe.top, rel)
            if isinstance(found, lfs.LfsObject):
                objects.setdefault(found.oid, found)
            elif found is not None:
                look_up(rel, *found)
    if missing:
        raise lfs.refuse_missing(cwd, storage, missing)
    if not objects:
        return None
    ordered = tuple(objects[oid] for oid in sorted(objects))
    lfs.check_count(cwd, ordered)
    return lfs.LfsFacts(storage=storage, objects=ordered)


async def _lfs_pointers(cwd: Path, stash: list[StashEntry]) -> list[tuple[str, str, int]]:
    """Every LFS pointer of the HEAD tree, the index and the stash's trees, as (a path that
    holds it, oid, size): the trees' small blobs and the index's blobs that are none of
    theirs, read in one `cat-file --batch`."""
    trees = ["HEAD"]
    if stash:
        walked = await run_git(
            cwd, "rev-list", "--no-walk", "--parents", *dict.fromkeys(e.oid for e in stash)
        )
        parents = {
            line.split()[0]: line.split()[1:] for line in walked.stdout.decode("ascii").splitlines()
        }
        trees += lfs.stash_trees(stash, parents)
    blobs: dict[str, str] = {}
    for tree in trees:
        listed = await run_git(cwd, "ls-tree", "-r", "-l", "-z", tree)
        for blob, path in lfs.small_blobs_of_tree(listed.stdout).items():
            blobs.setdefault(blob, path)
    index = lfs.index_blobs((await run_git(cwd, "ls-files", "-s", "-z")).stdout)
    unknown = [blob for blob in index if blob not in blobs]
    if unknown:
        checked = await run_git(
            cwd,
            "cat-file",
            "--batch-check=%(objectname) %(objecttype) %(objectsize)",
            stdin="".join(blob + "\n" for blob in unknown).encode(),
        )
        for blob in lfs.small_of_batch_check(checked.stdout):
            blobs.setdefault(blob, index[blob])
    if not blobs:
        return []
    read = await run_git(
        cwd, "cat-file", "--batch", stdin="".join(blob + "\n" for blob in blobs).encode()
    )
    return [(blobs[blob], *found) for blob, found in lfs.pointers_of_batch(read.stdout).items()]


async def _submodule_facts(
    probe: _Probe,
    gitlinks: Sequence[tuple[bytes, str]],
    prefix: str,
    *,
    stash: bool,
    earlier_subs: Mapping[Path, Reusable] | None,
) -> tuple[SubFacts, ...]:
    """Each gitlink of the index, and the submodule checked out there inspected as a
    repository of its own (recursively), refusing by name a shape that cannot travel. The
    submodules are inspected a few at once (each is a handful of short git runs, which one
    core alone leaves waiting on the next start); the first refusal in index order is the
    one raised, as a loop would."""
    if not gitlinks:
        return ()
    if len(gitlinks) > MAX_SUBMODULES:
        raise _submodule_refusal(
            probe.top,
            f"has {len(gitlinks)} submodules, over the {MAX_SUBMODULES} a checkpoint carries",
            "fold some of them into the repository as ordinary files",
        )
    if prefix.count("-") >= MAX_SUBMODULE_DEPTH:
        raise _submodule_refusal(
            probe.top,
            f"is a submodule nested {MAX_SUBMODULE_DEPTH} deep and has submodules of its own "
            f"({_names([p for p, _ in gitlinks])}); a checkpoint carries submodules "
            f"{MAX_SUBMODULE_DEPTH} deep at most",
            "fold the deepest submodules into their parents as ordinary files",
        )
    numbered = list(enumerate(gitlinks, 1))

    async def one(item: tuple[int, tuple[bytes, str]]) -> SubFacts:
        n, (raw, commit) = item
        return await _one_submodule(
            probe, raw, commit, f"{prefix}sm{n}-", stash=stash, earlier_subs=earlier_subs
        )

    outcomes = await concurrency.ordered_map(one, numbered, _submodule_limiter())
    return tuple(outcome.unwrap() for outcome in outcomes)


def _submodule_limiter() -> anyio.CapacityLimiter:
    # One per repository level, never shared down the nesting: a parent holding a token while
    # its own submodules wait for one could otherwise take them all.
    return anyio.CapacityLimiter(min(_SUBMODULE_JOBS, concurrency.jobs()))


def _submodule_refusal(where: Path, what: str, cure: str) -> Refusal:
    return Refusal(Code.SUBMODULE, f"{where} {what}", cure + ", then cut again")


async def _one_submodule(
    probe: _Probe,
    raw: bytes,
    commit: str,
    prefix: str,
    *,
    stash: bool,
    earlier_subs: Mapping[Path, Reusable] | None,
) -> SubFacts:
    if not _utf8(raw):
        raise Refusal(
            Code.NON_UTF8_PATH,
            f"{probe.top} has a submodule whose path is not UTF-8 ({_names([raw])})",
            "rename it to a UTF-8 path (`git mv`), then cut again",
        )
    path = raw.decode("utf-8")
    worktree = probe.top / path
    layout = await anyio.to_thread.run_sync(_submodule_layout, probe, path, worktree)
    if layout is None or layout is _ABSENT:
        return SubFacts(
            path=path, commit=commit, prefix=prefix, worktree=worktree, absent=layout is _ABSENT
        )
    name, gitdir = layout
    earlier = earlier_subs.get(worktree) if earlier_subs is not None else None
    facts = await _facts(
        worktree,
        earlier=earlier if earlier_subs is not None else _INSPECTIONS.take(worktree),
        stash=stash,
        prefix=prefix,
        # An embedded git dir is an ordinary repository's: no core.worktree of its own.
        own_worktree=None if gitdir is None else os.fsencode(os.path.relpath(worktree, gitdir)),
        earlier_subs=earlier_subs,
    )
    return SubFacts(
        path=path, commit=commit, prefix=prefix, worktree=worktree, name=name, facts=facts
    )


_GITFILE_CAP = 4096
# The longest artifact prefix a nested submodule's repository may carry (`sm999-` four deep).
_LONGEST_PREFIX = "sm999-" * MAX_SUBMODULE_DEPTH
# How many of one repository's submodules are inspected or captured at once (bounded again by
# COTAL_JOBS): each is a string of short git runs, so two cores keep about four busy.
_SUBMODULE_JOBS = 4


# `_submodule_layout`'s answer for a gitlink whose directory is gone.
_ABSENT = ("", None)


def _submodule_layout(probe: _Probe, path: str, worktree: Path) -> tuple[str, Path | None] | None:
    """The module name of the submodule checked out at `worktree` and its git dir (None for a
    `.git` directory of its own), or None when it is not checked out (an empty directory).

    Its `.git` is either the file git writes, naming `modules/<name>` under its parent's git
    dir by the relative path git writes, or a directory: a repository cloned in place and then
    added (`git submodule add` of a path that already holds one keeps it there, and so does
    `git add` of a nested clone). The latter travels as any submodule does and is restored as
    git lays one out itself, under the parent's `.git/modules/<name>`, its name the one
    `.gitmodules` gives its path (the path itself where none does, as `git submodule add`
    names one). Anything else refuses by name."""
    cure = (
        f"check it out as git does (`git submodule update --init {path}`), or remove it "
        f"(`git rm {path}`)"
    )
    try:
        kind = os.lstat(worktree).st_mode
    except FileNotFoundError:
        return _ABSENT
    if not stat.S_ISDIR(kind):
        raise _submodule_refusal(worktree, "is a submodule that is not a directory", cure)
    dotgit = worktree / ".git"
    if not os.path.lexists(dotgit):
        if os.listdir(worktree):
            raise _submodule_refusal(worktree, "is a submodule with files but no .git", cure)
        return None
    dotgit_mode = os.lstat(dotgit).st_mode
    if stat.S_ISDIR(dotgit_mode):
        return _embedded_name(probe, path, worktree, cure), None
    if not stat.S_ISREG(dotgit_mode):
        raise _submodule_refusal(
            worktree, "is a submodule whose .git is neither a file nor a directory", cure
        )
    data = read_stable(dotgit, cap=_GITFILE_CAP, what="a submodule's .git").data
    modules = os.fspath(probe.git_dir / "modules")
    named = data.startswith(b"gitdir: ") and data.endswith(b"\n") and data.count(b"\n") == 1
    rel = data[len(b"gitdir: ") : -1].decode("utf-8", "replace")
    target = os.path.normpath(os.path.join(worktree, rel))
    if not named or os.path.realpath(target) != target or not os.path.isdir(target):
        raise _submodule_refusal(
            worktree,
            f"is a submodule whose .git ({data[:200]!r}) does not name a git dir (a directory "
            "reached through no symlink)",
            cure,
        )
    if target.startswith(modules + "/") and data == submodule_gitfile(worktree, target):
        name = target[len(modules) + 1 :]
        _check_module_name(worktree, name, cure)
        # A linked worktree's submodules live under its own git dir (`worktrees/<id>/modules`),
        # a main worktree's under the common dir: `git_dir` is the one either way.
        return name, probe.git_dir / "modules" / name
    # Not as git writes it now: an absolute path (as git before 1.7.10 wrote) or a git dir
    # outside `modules/` (a clone made with `--separate-git-dir`, then added). Carried as an
    # ordinary repository's git dir, restored as git lays a submodule out now.
    if target.startswith(modules + "/"):
        name = target[len(modules) + 1 :]
        _check_module_name(worktree, name, cure)
        return name, None
    return _embedded_name(probe, path, worktree, cure), None


def _check_module_name(worktree: Path, name: str, cure: str) -> None:
    try:
        check_relpath("submodule name", name)
    except ValueError as exc:
        raise _submodule_refusal(
            worktree, f"has a module name git would not write: {exc}", cure
        ) from None


_GITMODULES_CAP = 1 << 20


def _embedded_name(probe: _Probe, path: str, worktree: Path, cure: str) -> str:
    """The module name `.gitmodules` gives `path`, else `path` itself."""
    gitmodules = probe.top / ".gitmodules"
    name = path
    if os.path.lexists(gitmodules):
        if not stat.S_ISREG(os.lstat(gitmodules).st_mode):
            raise _submodule_refusal(worktree, "has a .gitmodules that is not a regular file", cure)
        listing = subprocess.run(
            [GIT, *SAFE_CONFIG, "config", "--file", str(gitmodules), "--null", "--list"],
            cwd=probe.top,
            env=git_env(),
            capture_output=True,
            check=False,
        )
        for key, value in _config_entries(listing.stdout):
            section, _, rest = key.partition(b".")
            module, _, field = rest.rpartition(b".")
            if section == b"submodule" and field == b"path" and value == path.encode():
                name = module.decode("utf-8", "surrogateescape")
                break
    _check_module_name(worktree, name, cure)
    if os.path.lexists(probe.git_dir / "modules" / name):
        raise _submodule_refusal(
            worktree,
            f"has a .git directory of its own while {probe.git_dir / 'modules' / name} exists "
            "too; the restore would need that name twice",
            f"remove the stale {probe.git_dir / 'modules' / name}, or `git submodule "
            f"absorbgitdirs {path}` after it, then cut again",
        )
    return name


def submodule_gitfile(worktree: Path | str, gitdir: Path | str) -> bytes:
    """The `.git` file git writes in a submodule's checkout: the relative path to its git dir."""
    return b"gitdir: " + os.fsencode(os.path.relpath(gitdir, worktree)) + b"\n"


async def _index_scan(cwd: Path, index_path: Path, earlier: Reusable | None) -> IndexScan:
    """The earlier inspection's index scan when the index is proven unchanged, else a new one."""
    stamp = index_stamp(index_path)
    if (
        earlier is not None
        and stamp is not None
        and stamp.reusable
        and earlier.index.stamp == stamp
    ):
        return earlier.index
    return await _scan_index(cwd, stamp)


async def _untracked_paths(cwd: Path, raw_status: bytes, include: Sequence[str]) -> list[bytes]:
    """The untracked paths the status lists, then the declared ignored ones (`include`)."""
    untracked = [
        entry[3:]
        for entry in _split_z(raw_status)
        if entry.startswith(b"?? ") and not _in_control_dir(entry[3:])
    ]
    if include:
        # Glob magic so `*` stays within one directory level, as the operator wrote it.
        declared = await run_git(
            cwd,
            "ls-files",
            "--others",
            "--ignored",
            "--exclude-standard",
            "-z",
            "--",
            *(f":(glob){pattern}" for pattern in include),
            EXCLUDE_CONTROL,
            *EXCLUDE_STAGING,
        )
        seen = set(untracked)
        untracked += [
            p for p in _split_z(declared.stdout) if p not in seen and not _in_control_dir(p)
        ]
    return untracked


def _check_untracked(cwd: Path, untracked: list[bytes]) -> None:
    """Refuse untracked entries the archive cannot carry: nested repositories, and anything
    that is not a regular file or a symlink."""
    nested = [p for p in untracked if p.endswith(b"/")]
    if nested:
        raise Refusal(
            Code.UNTRACKED_UNSUPPORTED,
            f"{cwd} holds nested repositories ({_names(nested)}); their history cannot travel in "
            "the untracked archive",
            "commit their contents into this repository, move them out, or list them in .gitignore",
        )
    odd: list[bytes] = []
    for path in untracked:
        try:
            kind = os.lstat(cwd / os.fsdecode(path)).st_mode
        except FileNotFoundError:
            odd.append(path)
            continue
        if not (stat.S_ISREG(kind) or stat.S_ISLNK(kind)):
            odd.append(path)
    if odd:
        raise Refusal(
            Code.UNTRACKED_UNSUPPORTED,
            f"{cwd} has untracked entries that are not regular files or symlinks ({_names(odd)})",
            "remove them (sockets, fifos and devices cannot be archived) or list them in "
            ".gitignore",
        )


def _decode_status(cwd: Path, raw_status: bytes) -> str:
    try:
        return raw_status.decode("utf-8")
    except UnicodeDecodeError:
        bad = [e for e in raw_status.split(b"\0") if not _utf8(e)]
        raise Refusal(
            Code.NON_UTF8_PATH,
            f"{cwd} has changed or untracked paths whose names are not UTF-8 ({_names(bad)}); the "
            "record is JSON",
            "rename them to UTF-8 names, then cut again",
        ) from None


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


async def preflight_repository(cwd: Path, *, include: Sequence[str] = ()) -> None:
    """Refuse, by name and with a cure, a repository state the checkpoint cannot reproduce.

    Read-only: it runs before the seat is stopped, so a refusal costs nothing. What it learned
    is kept for the capture of the same repository, which reuses only what it proves unchanged
    (manager/checkpoint/inspect.py).
    """
    cwd = Path(cwd)
    facts = await _facts(
        cwd, check_includes(include), _INSPECTIONS.take(cwd.resolve()), stash=False
    )
    for top, reusable in facts.reusables().items():
        _INSPECTIONS.remember(top, reusable)


# -- capture ------------------------------------------------------------------------------------


async def read_refs(cwd: Path) -> dict[str, str]:
    """Every ref of the repository at `cwd` and the object it names, as `{refname: oid}`."""
    refs, _head = await _read_refs_and_head(cwd)
    return refs


async def _read_stash_reflog(cwd: Path) -> list[StashEntry]:
    out = await run_git(
        cwd, "reflog", "show", "--no-abbrev", "--no-decorate", "--format=%H%x00%gs", "refs/stash"
    )
    entries: list[StashEntry] = []
    for line in out.stdout.decode("utf-8", "replace").splitlines():
        oid, _, message = line.partition("\0")
        entries.append(StashEntry(oid=oid, message=message))
    return entries


async def read_stash(cwd: Path) -> list[StashEntry]:
    """Every `refs/stash` reflog entry, newest first, as `git stash list` numbers them."""
    probe = await run_git(cwd, "rev-parse", "-q", "--verify", "refs/stash", ok=(0, 1))
    if probe.rc != 0:
        return []
    return await _read_stash_reflog(cwd)


class _TarSink:
    """The file object tarfile streams into; reports progress every few MiB, not per block."""

    def __init__(self, out: ExclusiveFile, report: Callable[[int], None]) -> None:
        self._out = out
        self._report = report
        self.done = 0
        self.reported = 0

    def write(self, data: bytes) -> int:
        n = self._out.write(data)
        self.done += n
        if self.done - self.reported >= _PROGRESS_STEP:
            self.reported = self.done
            self._report(self.done)
        return n


def _open_member_parent(top_fd: int, rel: str) -> tuple[int, str]:
    try:
        return open_parent_below(top_fd, rel)
    except (OSError, UnsafeDirectory) as exc:
        why = exc.reason if isinstance(exc, UnsafeDirectory) else exc.strerror
        raise Refusal(
            Code.CHANGED_DURING_CAPTURE,
            f"untracked file {rel} is no longer beneath a plain directory ({why})",
            "make sure nothing writes to the seat's tree, then cut again",
        ) from None


def _archive_member(tar: tarfile.TarFile, parent: int, leaf: str, rel: str) -> None:
    """Add one untracked file or symlink, opened beneath `parent` without following links."""
    st = os.stat(leaf, dir_fd=parent, follow_symlinks=False)
    info = tarfile.TarInfo(rel)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = int(st.st_mtime)
    if stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(leaf, dir_fd=parent)
        info.mode = 0o777
        tar.addfile(info)
        return
    if not stat.S_ISREG(st.st_mode):
        raise Refusal(
            Code.UNTRACKED_UNSUPPORTED,
            f"untracked entry {rel} is not a regular file or symlink",
            "remove it or list it in .gitignore",
        )
    fd, before = open_regular(Path(leaf), dir_fd=parent)
    with os.fdopen(fd, "rb") as stream:
        info.size = before.st_size
        info.mode = stat.S_IMODE(before.st_mode) & 0o777
        tar.addfile(info, stream)
        after = os.fstat(fd)
    if file_identity(before) != file_identity(after) or before.st_ino != st.st_ino:
        raise Refusal(
            Code.CHANGED_DURING_CAPTURE,
            f"untracked file {rel} changed while it was archived",
            "make sure nothing writes to the seat's tree, then cut again",
        )


def _write_untracked_tar(
    top: Path, paths: Sequence[bytes], out: ExclusiveFile, report: Callable[[int], None]
) -> None:
    """Archive the selected untracked files, each opened beneath `top` without following links.

    Owners are zeroed (a user name is not the destination's business), set-id bits dropped, and
    a file that changes while it is archived refuses the capture rather than sealing torn bytes.
    """
    top_fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        sink = _TarSink(out, report)
        with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            for raw in paths:
                rel = os.fsdecode(raw)
                parent, leaf = _open_member_parent(top_fd, rel)
                try:
                    _archive_member(tar, parent, leaf, rel)
                except (OSError, UnsafeFile) as exc:
                    why = exc.detail if isinstance(exc, UnsafeFile) else exc.strerror
                    raise Refusal(
                        Code.CHANGED_DURING_CAPTURE,
                        f"untracked file {rel} could not be archived ({why})",
                        "make sure nothing writes to the seat's tree, then cut again",
                    ) from None
                finally:
                    os.close(parent)
    finally:
        os.close(top_fd)


async def _capture_untracked(
    top: Path,
    paths: Sequence[bytes],
    seat_dir: Path,
    progress: Progress | None,
    prefix: str = "",
    *,
    name: str = UNTRACKED_FILE,
) -> FileRef:
    """`paths` (untracked files, or the unwatched ones) archived as `prefix + name`."""
    out = await anyio.to_thread.run_sync(ExclusiveFile, seat_dir, prefix + name)

    def report(done: int) -> None:
        if progress is not None:
            anyio.from_thread.run_sync(progress, "untracked", done)

    try:
        await anyio.to_thread.run_sync(_write_untracked_tar, top, paths, out, report)
        ref = await anyio.to_thread.run_sync(out.finish)
        if progress is not None:
            progress("untracked", ref.bytes)
        return ref
    except BaseException:
        out.abort()
        raise


# A URL whose userinfo carries a password (`scheme://user:secret@host`): group 2 is kept.
_URL_CREDENTIAL = re.compile(rb"([A-Za-z][A-Za-z0-9+.-]*://)([^/@:\s\"]*):([^/@\s\"]*)@")


def _strip_password(text: bytes) -> bytes:
    return _URL_CREDENTIAL.sub(
        lambda m: m.group(1) + (m.group(2) + b"@" if m.group(2) else b""), text
    )


def _config_entries(listing: bytes) -> list[tuple[bytes, bytes | None]]:
    """`git config --null --list` as (key, value) pairs; a bare key (boolean true) has None."""
    entries: list[tuple[bytes, bytes | None]] = []
    for item in listing.split(b"\0")[:-1]:
        key, nl, value = item.partition(b"\n")
        entries.append((key, value if nl else None))
    return entries


def _quote(text: bytes) -> bytes:
    escaped = text.replace(b"\\", b"\\\\").replace(b'"', b'\\"')
    return b'"' + escaped.replace(b"\n", b"\\n").replace(b"\t", b"\\t") + b'"'


def _render_config(entries: Sequence[tuple[bytes, bytes | None]]) -> bytes:
    lines: list[bytes] = []
    current: bytes | None = None
    for key, value in entries:
        first, last = key.index(b"."), key.rindex(b".")
        section, name = key[:first], key[last + 1 :]
        header = b"[" + section + (b" " + _quote(key[first + 1 : last]) if first != last else b"")
        header += b"]"
        if header != current:
            lines.append(header)
            current = header
        lines.append(b"\t" + name + (b"" if value is None else b" = " + _quote(value)))
    return b"\n".join(lines) + b"\n" if lines else b""


def _redact_config(
    raw: bytes, entries: list[tuple[bytes, bytes | None]]
) -> tuple[list[tuple[bytes, bytes | None]], list[str]]:
    """The entries with every credential removed, and the keys that held one."""
    kept: list[tuple[bytes, bytes | None]] = []
    redacted: list[str] = []
    for key, value in entries:
        name = key.decode("utf-8", "replace")
        section, _, rest = key.partition(b".")
        if section == b"http" and rest.rpartition(b".")[2] == b"extraheader":
            # An extra header is how a token is handed to git over http; never carried.
            redacted.append(name)
            continue
        new_key = _strip_password(key)
        new_value = None if value is None else _strip_password(value)
        if (new_key, new_value) != (key, value):
            redacted.append(_strip_password(key).decode("utf-8", "replace"))
        kept.append((new_key, new_value))
    if not redacted and _URL_CREDENTIAL.search(raw):
        # Only a comment held one; rewriting from the entries drops every comment.
        redacted.append("#comment")
    return kept, redacted


async def _capture_config(
    cwd: Path,
    config: Path,
    seat_dir: Path,
    listed: ConfigListing | None,
    prefix: str = "",
    layout_keys: frozenset[bytes] = frozenset(),
) -> tuple[FileRef, list[str]]:
    raw = read_stable(config, cap=_CONFIG_CAP, what="git config").data
    if listed is not None and listed.digest == _config_digest(raw):
        # The inspection listed exactly these bytes; `--file` follows no includes, so the
        # listing is a function of them alone.
        listing = listed.listing
    else:
        listing = (await run_git(cwd, "config", "--file", str(config), "--null", "--list")).stdout
    entries = _config_entries(listing)
    placed = [(key, value) for key, value in entries if key.lower() not in layout_keys]
    kept, redacted = _redact_config(raw, placed)
    rewritten = bool(redacted) or len(placed) != len(entries)
    data = raw if not rewritten else _render_config(kept)
    ref = await _write_small_off_loop(seat_dir, prefix + GIT_CONFIG_FILE, data)
    if rewritten:
        reread = await run_git(
            cwd, "config", "--file", str(seat_dir / (prefix + GIT_CONFIG_FILE)), "--null", "--list"
        )
        if _config_entries(reread.stdout) != kept or _URL_CREDENTIAL.search(data):
            raise Refusal(
                Code.CONFIG_REDACTION,
                f"the redacted copy of {config} does not read back as the source's settings",
                "remove the credentials from the repository's remote URLs by hand "
                "(`git remote set-url`), then cut again",
            )
    if redacted:
        log.warning(
            "cut.config_redacted",
            repo=str(cwd),
            keys=redacted,
            reason="a credential in .git/config never enters a checkpoint; re-enter it on the "
            "destination",
        )
    return ref, redacted


async def _capture_gitdir(
    cwd: Path, facts: GitDirFacts, seat_dir: Path, prefix: str = ""
) -> tuple[FileRef | None, list[str], list[CarriedHook], FileRef | None]:
    config: FileRef | None = None
    redacted: list[str] = []
    if facts.config is not None:
        config, redacted = await _capture_config(
            cwd, facts.config, seat_dir, facts.listing, prefix, facts.layout_keys
        )
    hooks: list[CarriedHook] = []
    for name, path in facts.hooks:
        mode = stat.S_IMODE(os.lstat(path).st_mode) & 0o777
        ref = await anyio.to_thread.run_sync(
            capture_file, path, seat_dir, prefix + HOOK_FILE_PREFIX + name
        )
        if stat.S_IMODE(os.lstat(path).st_mode) & 0o777 != mode:
            raise Refusal(
                Code.CHANGED_DURING_CAPTURE,
                f"hook {path} changed mode while it was captured",
                "make sure nothing writes to the seat's repository, then cut again",
            )
        hooks.append(CarriedHook(name=name, mode=mode, file=ref))
    exclude: FileRef | None = None
    if facts.info_exclude is not None:
        exclude = await anyio.to_thread.run_sync(
            capture_file, facts.info_exclude, seat_dir, prefix + INFO_EXCLUDE_FILE
        )
    return config, redacted, hooks, exclude


def _write_small(seat_dir: Path, name: str, data: bytes) -> FileRef:
    out = ExclusiveFile(seat_dir, name)
    try:
        out.write(data)
        return out.finish()
    except BaseException:
        out.abort()
        raise


async def _write_small_off_loop(seat_dir: Path, name: str, data: bytes) -> FileRef:
    # Creating a file and fsyncing it can wait on the file system's journal for as long as
    # another thread's fsync takes; every seat's capture shares this event loop, so none of
    # them may block it (docs/design.md decision 24).
    return await anyio.to_thread.run_sync(_write_small, seat_dir, name, data)


def bundle_heads(list_heads_output: bytes) -> dict[str, str]:
    """`git bundle list-heads` output as {ref: oid}, without the symbolic HEAD line."""
    carried = {}
    for line in list_heads_output.decode("utf-8", "replace").splitlines():
        oid, _, name = line.partition(" ")
        if name != "HEAD":
            carried[name] = oid
    return carried


_BUNDLE_SIGNATURES = (b"# v2 git bundle\n", b"# v3 git bundle\n")
_BUNDLE_HEADER_CAP = 64 << 20


def _read_bundle_header(path: Path, *, prerequisites: bool = False) -> bytes | None:
    """The ref lines of the bundle at `path` in `git bundle list-heads` form, or None when the
    header is not one this reader knows (then git reads it). With `prerequisites`, its
    prerequisite lines instead (`-<oid> [subject]`, the leading `-` kept)."""
    with open(path, "rb") as stream:
        if stream.readline() not in _BUNDLE_SIGNATURES:
            return None
        lines: list[bytes] = []
        read = 0
        while True:
            line = stream.readline()
            read += len(line)
            if not line.endswith(b"\n") or read > _BUNDLE_HEADER_CAP:
                return None
            if line == b"\n":
                return b"".join(lines)
            # `@` lines are v3 capabilities, `-` lines prerequisites; neither is a ref.
            if prerequisites:
                if line.startswith(b"-"):
                    lines.append(line)
            elif not line.startswith((b"@", b"-")):
                lines.append(line)


def bundle_prerequisites(path: Path) -> list[str] | None:
    """The commits the bundle at `path` names as prerequisites (what a repository must hold
    before it can be unbundled), or None when its header is not one this reader knows."""
    header = _read_bundle_header(path, prerequisites=True)
    if header is None:
        return None
    return [
        line[1:].split(b" ", 1)[0].strip().decode("ascii", "replace")
        for line in header.splitlines()
    ]


async def _bundle_header_refs(cwd: Path, bundle: Path) -> dict[str, str]:
    """The refs the bundle carries, read from its header as `git bundle list-heads` prints
    them; the header is plain text, so no git process is needed to read it."""
    header = await anyio.to_thread.run_sync(_read_bundle_header, bundle)
    if header is None:
        header = (await run_git(cwd, "bundle", "list-heads", str(bundle))).stdout
    return bundle_heads(header)


def refs_differing(a: dict[str, str], b: dict[str, str]) -> list[str]:
    return sorted(name for name in set(a) | set(b) if a.get(name) != b.get(name))


def heads_differing(heads: dict[str, str], refs: dict[str, str], *, incremental: bool) -> list[str]:
    """The refs a bundle's heads get wrong. A full bundle names every ref; an incremental one
    leaves out those whose tips its predecessors carried, so only the refs it names count."""
    expected = {n: o for n, o in refs.items() if n in heads} if incremental else refs
    return refs_differing(heads, expected)


async def _capture_bundle(
    cwd: Path,
    seat_dir: Path,
    stash_revs: Sequence[str],
    prerequisites: Sequence[str],
    progress: Progress | None,
    prefix: str = "",
    revs: Sequence[str] = BUNDLE_REVS,
) -> FileRef | None:
    """`repo.bundle`, or None when an incremental capture has nothing new to carry."""
    try:
        return await stream_git_to_file(
            cwd,
            [
                "bundle",
                "create",
                "--quiet",
                "-",
                # Every ref this worktree sees and its HEAD: what `--all` names, without the
                # other worktrees' HEADs (`main-worktree/HEAD`, `worktrees/<id>/HEAD`) that
                # `--all` adds where a repository has linked worktrees.
                *revs,
                *stash_revs,
                *(f"^{oid}" for oid in prerequisites),
            ],
            seat_dir,
            prefix + BUNDLE_FILE,
            progress=progress,
            phase="bundle",
        )
    except Refusal as exc:
        # git writes no bundle without a ref in its header; with prerequisites that means every
        # ref's tip is one the predecessor already carried (proven against the refs below).
        if prerequisites and exc.code == Code.GIT_FAILED and EMPTY_BUNDLE in exc.message:
            return None
        raise


class _AfterBundle:
    """The progress of the parts that run beside the bundle, held until the bundle is done.

    The coordinator reads a seat's steps one after another (a step change is a new line), so
    the parts beside the bundle report as the sequential capture did: the bundle live, then
    each later step's last count, in the order the steps ran; a part still running once the
    bundle is done reports live from then on.
    """

    def __init__(self, progress: Progress | None) -> None:
        self._progress = progress
        self._held: dict[str, int] = {}
        self._live = False

    def report(self, phase: str, done: int) -> None:
        if self._live:
            if self._progress is not None:
                self._progress(phase, done)
        else:
            self._held[phase] = done

    def release(self) -> None:
        self._live = True
        held, self._held = self._held, {}
        if self._progress is not None:
            for phase, done in held.items():
                self._progress(phase, done)


_A = TypeVar("_A")
_B = TypeVar("_B")


async def _side_by_side(
    first: Callable[[], Awaitable[_A]], second: Callable[[], Awaitable[_B]]
) -> tuple[_A, _B]:
    """Run both at once; the first failure cancels the other, and the error raised is the one
    the sequential order (`first`, then `second`) would have raised when both failed.

    Each error is raised as itself, never wrapped in a group, so a caller sees the very
    Refusal the sequential capture gave. A cancellation from outside is not an error here: it
    passes through as it came.
    """
    results: list[object] = [None, None]
    errors: list[Exception | None] = [None, None]

    async with anyio.create_task_group() as tg:

        async def run(slot: int, part: Callable[[], Awaitable[object]]) -> None:
            try:
                results[slot] = await part()
            except Exception as exc:
                errors[slot] = exc
                tg.cancel_scope.cancel()

        tg.start_soon(run, 0, first)
        tg.start_soon(run, 1, second)
    for error in errors:
        if error is not None:
            raise error
    return results[0], results[1]  # type: ignore[return-value]


async def _check_bundle_refs(
    cwd: Path,
    seat_dir: Path,
    bundle: FileRef | None,
    refs: dict[str, str],
    prerequisites: Sequence[str],
) -> None:
    heads: dict[str, str] = {}
    if bundle is not None:
        heads = await _bundle_header_refs(cwd, seat_dir / bundle.file)
    # An incremental bundle leaves out refs whose tips the predecessor carried: the heads must
    # agree with the refs they name, and every ref left out must be covered by a prerequisite.
    differ = heads_differing(heads, refs, incremental=bool(prerequisites))
    left_out = sorted(set(refs) - set(heads))
    if not differ and prerequisites and left_out:
        uncovered = await run_git(
            cwd,
            "rev-list",
            "--stdin",
            stdin="".join(
                [f"{refs[n]}\n" for n in left_out] + [f"^{oid}\n" for oid in prerequisites]
            ).encode(),
        )
        if uncovered.stdout.strip():
            differ = left_out
    if differ:
        raise Refusal(
            Code.BUNDLE_REFS,
            f"the bundle of {cwd} does not carry exactly the repository's refs "
            f"({', '.join(differ[:5])})",
            "make sure nothing changes the repository during the cut, then cut again",
        )


@dataclass(frozen=True)
class _TreeArtifacts:
    """Everything the capture writes besides the bundle."""

    index_diff: FileRef
    worktree_diff: FileRef
    untracked: FileRef
    refs: FileRef | None
    config: FileRef | None
    redacted: list[str]
    hooks: list[CarriedHook]
    exclude: FileRef | None
    status_file: FileRef | None
    ita_file: FileRef | None
    status_inline: str
    ita_inline: list[str]
    shallow: FileRef | None = None
    sparse: SparseRecord | None = None
    worktree_config: FileRef | None = None
    lfs: LfsRecord | None = None
    unwatched: UnwatchedRecord | None = None


def names_tracked_change(status: str) -> bool:
    """Whether a `git status --porcelain -z` names a tracked path. The index diff (HEAD to
    index) and the worktree diff (index to worktree) are what the status's two letters report
    per path, computed by the same machinery; untracked (`??`) and ignored (`!!`) entries are in
    neither, so a status of those alone means both diffs are empty."""
    return any(xy not in ("??", "!!") for xy, _ in parse_porcelain_z(status))


async def _capture_tree(
    cwd: Path, seat_dir: Path, facts: RepoFacts, progress: Progress | None
) -> _TreeArtifacts:
    """The diffs, the untracked archive, the refs list, the git dir files and the lists."""
    prefix = facts.prefix
    index_diff, worktree_diff = await _capture_diffs(cwd, seat_dir, facts, progress)
    untracked = await _capture_untracked(facts.top, facts.untracked, seat_dir, progress, prefix)
    refs_ref: FileRef | None = None
    if facts.refs:
        refs_ref = await _write_small_off_loop(
            seat_dir, prefix + REFS_FILE, format_refs_list(facts.refs)
        )
    config, redacted, hooks, exclude = await _capture_gitdir(cwd, facts.gitdir, seat_dir, prefix)
    status_file, ita_file, status_inline, ita_inline = await _capture_lists(seat_dir, facts)
    shallow: FileRef | None = None
    if facts.shallow is not None:
        shallow = await _write_small_off_loop(seat_dir, prefix + SHALLOW_FILE, facts.shallow)
    sparse = await _capture_sparse(seat_dir, facts)
    unwatched = await _capture_unwatched(seat_dir, facts)
    worktree_config: FileRef | None = None
    if facts.gitdir.worktree_config is not None:
        worktree_config = await _write_small_off_loop(
            seat_dir, prefix + WORKTREE_CONFIG_FILE, facts.gitdir.worktree_config
        )
    lfs_record: LfsRecord | None = None
    if facts.lfs is not None:
        # Each object is copied from the storage (a changed worktree file: from the file) and
        # proven by its oid as it is copied.
        lfs_record = await anyio.to_thread.run_sync(lfs.write_pack, seat_dir, prefix, facts.lfs)
    return _TreeArtifacts(
        index_diff=index_diff,
        worktree_diff=worktree_diff,
        untracked=untracked,
        refs=refs_ref,
        config=config,
        redacted=redacted,
        hooks=hooks,
        exclude=exclude,
        status_file=status_file,
        ita_file=ita_file,
        status_inline=status_inline,
        ita_inline=ita_inline,
        shallow=shallow,
        sparse=sparse,
        worktree_config=worktree_config,
        lfs=lfs_record,
        unwatched=unwatched,
    )


async def _capture_diffs(
    cwd: Path, seat_dir: Path, facts: RepoFacts, progress: Progress | None
) -> tuple[FileRef, FileRef]:
    """The index diff (base to index) and the worktree diff (index to worktree)."""
    prefix = facts.prefix
    if not names_tracked_change(facts.status):
        # Both diffs are empty, and two git runs per seat would write nothing: a seat at rest
        # usually has committed its work. The after-capture check reads the status again.
        return (
            await _write_small_off_loop(seat_dir, prefix + INDEX_DIFF_FILE, b""),
            await _write_small_off_loop(seat_dir, prefix + WORKTREE_DIFF_FILE, b""),
        )
    index_diff = await stream_git_to_file(
        cwd,
        ["diff", "--cached", *DIFF_FLAGS],
        seat_dir,
        prefix + INDEX_DIFF_FILE,
        progress=progress,
        phase="index-diff",
    )
    worktree_diff = await stream_git_to_file(
        cwd,
        ["diff", *DIFF_FLAGS],
        seat_dir,
        prefix + WORKTREE_DIFF_FILE,
        progress=progress,
        phase="worktree-diff",
    )
    return index_diff, worktree_diff


async def _capture_lists(
    seat_dir: Path, facts: RepoFacts
) -> tuple[FileRef | None, FileRef | None, str, list[str]]:
    """The status and intent-to-add lists inline, or in files of their own when large."""
    ita = facts.index.intent_to_add
    ita_bytes = b"".join(p.encode() + b"\0" for p in ita)
    if len(facts.status.encode()) + len(ita_bytes) <= LISTS_INLINE_CAP:
        return None, None, facts.status, ita
    status_file = await _write_small_off_loop(
        seat_dir, facts.prefix + STATUS_FILE, facts.status.encode()
    )
    ita_file = await _write_small_off_loop(seat_dir, facts.prefix + INTENT_TO_ADD_FILE, ita_bytes)
    return status_file, ita_file, "", []


async def _capture_sparse(seat_dir: Path, facts: RepoFacts) -> SparseRecord | None:
    """The skip-worktree list and the sparse patterns, or None when the repository has
    neither."""
    skipped = facts.index.skip_worktree
    patterns = facts.gitdir.sparse_patterns
    if not skipped and patterns is None:
        return None
    listed = await _write_path_list(seat_dir, facts.prefix + SKIP_WORKTREE_FILE, skipped)
    carried: FileRef | None = None
    if patterns is not None:
        carried = await _write_small_off_loop(
            seat_dir, facts.prefix + SPARSE_PATTERNS_FILE, patterns
        )
    return SparseRecord(skip_worktree=listed, entries=len(skipped), patterns=carried)


async def _write_path_list(seat_dir: Path, name: str, paths: Sequence[bytes]) -> FileRef | None:
    """`paths` NUL-ended in `name`, or None (no file) when there are none."""
    if not paths:
        return None
    return await _write_small_off_loop(seat_dir, name, b"".join(p + b"\0" for p in paths))


async def _capture_unwatched(seat_dir: Path, facts: RepoFacts) -> UnwatchedRecord | None:
    """The assume-unchanged list and the bytes of every file git does not compare with its
    entry, or None when the repository has neither."""
    flagged = facts.index.assume_unchanged
    if not flagged and not facts.unwatched:
        return None
    listed = await _write_path_list(seat_dir, facts.prefix + ASSUME_UNCHANGED_FILE, flagged)
    files: FileRef | None = None
    if facts.unwatched:
        files = await _capture_untracked(
            facts.top, facts.unwatched, seat_dir, None, facts.prefix, name=UNWATCHED_FILE
        )
    return UnwatchedRecord(
        assume_unchanged=listed,
        entries=len(flagged),
        files=files,
        present=len(facts.unwatched),
    )


def settle_stat_data(top: Path) -> None:
    """Date every file of the tree written in the current second back to the second before.

    Git (as built here, without nanosecond checks) judges by whole seconds, and an index entry
    whose file time is not older than the index file itself is "racily clean": git cannot
    trust its stat data, so every
    reader hashes that file again, and a reader that does not write the index (every status of
    the restore's comparisons, of a later cut's inspections, of the seat's own git run with
    optional locks off) does so every time, until an index lands in a later second. A restore
    writes its whole tree and then its index within the same second more often than not: on
    issue 13's repository that cost the resume up to 0.5 s and the next cut about as much
    again. A file dated back differs from its index entry, so the refresh that follows hashes
    it once, proves its content, and records stat data that are then older than the index.
    Only this restore's staging tree is touched; no symlink is followed.
    """
    second = 1_000_000_000
    this_second = time.time_ns() // second
    back = (this_second - 1) * second
    pending = [(os.fspath(top), True)]
    while pending:
        directory, at_top = pending.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if not (at_top and entry.name == ".git"):
                        pending.append((entry.path, False))
                    continue
                st = entry.stat(follow_symlinks=False)
                if st.st_mtime_ns // second >= this_second:
                    os.utime(entry.path, ns=(st.st_atime_ns, back), follow_symlinks=False)


async def capture_repository(
    cwd: Path,
    seat_dir: Path,
    *,
    progress: Progress | None = None,
    include: Sequence[str] = (),
    prerequisites: Sequence[str] = (),
    since: IncrementalLink | None = None,
    precopy: PrecopyLink | None = None,
) -> RepositoryRecord:
    """Capture the seat's repository into `seat_dir` and return the record that names it.

    `include` is the operator's declared ignored paths (the root's `[carry] include` plus any
    `--include` at the cut): relative paths or simple globs whose ignored files travel too.

    `prerequisites` (with `since` or `precopy`, the link recorded for them) makes the bundle
    incremental: commits a destination already holds from the predecessor attempt or the
    pre-copied history are left out, and so are refs whose tips are among them; with nothing
    new there is no bundle at all.

    Runs only after the seat is proven stopped (record 1.3 step 7). Preflight runs again first,
    reusing what the preflight at prepare learned only where it proves the input unchanged
    (manager/checkpoint/inspect.py), and the refs, status, stash and index are re-read at the
    end: a repository that moved during the capture is refused rather than sealed as a mixture
    of two instants.
    """
    cwd = Path(cwd)
    seat_dir = Path(seat_dir)
    declared = check_includes(include)
    probe = await _probe(cwd)
    stash = await _read_stash_reflog(cwd) if "refs/stash" in probe.refs else []
    _check_stash_head(cwd, probe.refs, stash)
    if probe.shallow or probe.base is None:
        # An unborn branch's record builds on nothing (docs/design.md decision 17).
        # A shallow history travels whole: the boundary commits' parents exist nowhere, so a
        # chain of bundles could only be unbundled with the boundary already in place at each
        # step; a shallow history is small by construction (docs/design.md decision 17).
        prerequisites = ()
    earlier = _INSPECTIONS.take(cwd.resolve())

    def inspect() -> Awaitable[RepoFacts]:
        return _facts(cwd, declared, earlier, probed=(probe, stash))

    known = _Known(probe.refs, stash, probe.shallow, unborn=probe.base is None)
    facts, bundle, tree = await _capture_artifacts(
        cwd, seat_dir, known, inspect, prerequisites, progress
    )
    submodules = await _capture_submodules(seat_dir, facts)
    after = await _facts(cwd, declared, facts.reusable(), earlier_subs=facts.reusables())
    _verify_unmoved(cwd, facts, after)
    return _repository_record(
        cwd,
        facts,
        bundle,
        tree,
        declared=declared,
        since=since if prerequisites else None,
        precopy=precopy if prerequisites else None,
        submodules=submodules,
    )


async def _capture_submodules(seat_dir: Path, facts: RepoFacts) -> list[SubmoduleRecord] | None:
    """Each gitlink of the index, and each checked-out submodule captured as a repository of
    its own, its files named with its prefix, its own submodules within it (None: there are
    none). The after-capture check of the seat's repository re-inspects them all."""
    if not facts.submodules:
        return None

    async def one(sub: SubFacts) -> SubmoduleRecord:
        repository: RepositoryRecord | None = None
        if sub.facts is not None:
            known = _Known(
                sub.facts.refs, sub.facts.stash, sub.facts.shallow is not None, sub.facts.prefix
            )
            _, bundle, tree = await _capture_artifacts(
                sub.worktree, seat_dir, known, partial(_given, sub.facts), (), None
            )
            nested = await _capture_submodules(seat_dir, sub.facts)
            repository = _repository_record(
                sub.worktree,
                sub.facts,
                bundle,
                tree,
                declared=[],
                since=None,
                precopy=None,
                submodules=nested,
            )
        return SubmoduleRecord(
            path=sub.path,
            commit=sub.commit,
            prefix=sub.prefix,
            name=sub.name,
            repository=repository,
            absent=True if sub.absent else msgspec.UNSET,
        )

    # A few at once, as they were inspected; every artifact has a name of its own (its prefix).
    outcomes = await concurrency.ordered_map(one, facts.submodules, _submodule_limiter())
    return [outcome.unwrap() for outcome in outcomes]


def _check_stash_head(cwd: Path, refs: dict[str, str], stash: list[StashEntry]) -> None:
    if stash and refs.get("refs/stash") != stash[0].oid:
        raise Refusal(
            Code.CHANGED_DURING_CAPTURE,
            f"refs/stash of {cwd} does not name the newest entry of its reflog",
            "make sure nothing changes the repository during the cut, then cut again",
        )


@dataclass(frozen=True)
class _Known:
    """What the bundle needs, known before the inspection ends: the refs it must carry, the
    stash entries it carries without a ref, whether the history is shallow, and the prefix of
    its artifacts' names."""

    refs: dict[str, str]
    stash: list[StashEntry]
    shallow: bool
    prefix: str = ""
    # HEAD is on a branch with no commit: the bundle names no HEAD, and with no ref at all
    # there is no bundle.
    unborn: bool = False


async def _given(facts: RepoFacts) -> RepoFacts:
    return facts


async def _capture_artifacts(
    cwd: Path,
    seat_dir: Path,
    known: _Known,
    inspect: Callable[[], Awaitable[RepoFacts]],
    prerequisites: Sequence[str],
    progress: Progress | None,
) -> tuple[RepoFacts, FileRef | None, _TreeArtifacts]:
    """The inspection, the bundle with its refs proven, and every other artifact of the tree.

    The bundle is the long pole and needs only what the probe read (`known`), so it runs
    beside the inspection and then beside the tree's other artifacts, which need the
    inspection's facts (docs/design.md decision 19). A refusal is still the one the sequential
    capture gave: the inspection's, then the bundle's, then the tree's. The after-capture
    facts wait for both parts: they are the proof that nothing moved while any artifact was
    being written.
    """
    # Older stash entries live only in the reflog; naming their commits puts them in the pack
    # without adding a ref to the bundle's header.
    stash_revs = list(dict.fromkeys(entry.oid for entry in known.stash))
    order = _AfterBundle(progress)
    inspected = anyio.Event()

    async def bundle_part() -> FileRef | None:
        try:
            bundle = (
                None
                if known.unborn and not known.refs
                else await _capture_bundle(
                    cwd,
                    seat_dir,
                    stash_revs,
                    prerequisites,
                    progress,
                    known.prefix,
                    revs=BUNDLE_REFS_ONLY if known.unborn else BUNDLE_REVS,
                )
            )
            await _check_bundle_refs(cwd, seat_dir, bundle, known.refs, prerequisites)
            if known.shallow and bundle is not None:
                await _check_shallow_bundle(cwd, seat_dir / bundle.file)
        except Exception:
            # An inspection refusal comes first, as in the sequential capture: its failure
            # cancels this wait, and `_side_by_side` raises it.
            await inspected.wait()
            raise
        order.release()
        return bundle

    async def tree_part() -> tuple[RepoFacts, _TreeArtifacts]:
        facts = await inspect()
        inspected.set()
        report = None if progress is None else order.report
        return facts, await _capture_tree(cwd, seat_dir, facts, report)

    # The bundle first: when both fail, its error is the one raised, as the sequential
    # capture's bundle came before the tree's artifacts; it raises only once the inspection
    # succeeded, so an inspection refusal still wins.
    bundle, (facts, tree) = await _side_by_side(bundle_part, tree_part)
    return facts, bundle, tree


async def _check_shallow_bundle(cwd: Path, bundle: Path) -> None:
    """A shallow clone's full bundle must name no prerequisite: git writes the boundary commits
    into the pack and records a complete history (git 2.39 does; the destination writes the
    boundary back). A git that names the boundary's parents, which no repository holds,
    would leave a bundle nothing can unbundle, so it is refused here, before the seal."""
    named = await anyio.to_thread.run_sync(bundle_prerequisites, bundle)
    if named is None:
        raise Refusal(
            Code.SHALLOW_MISMATCH,
            f"the bundle of the shallow clone {cwd} has a header this reader does not know",
            "report this with `git --version`; the seat's repository was not changed",
        )
    if named:
        raise Refusal(
            Code.SHALLOW_MISMATCH,
            f"git wrote the bundle of the shallow clone {cwd} with prerequisites "
            f"({', '.join(named[:5])}), commits beyond its boundary that no destination holds",
            "report this with `git --version`, or deepen the clone fully (`git fetch "
            "--unshallow`), then cut again",
        )


def _verify_unmoved(cwd: Path, facts: RepoFacts, after: RepoFacts) -> None:
    """Refuse a repository whose after-capture facts differ from those it was captured by."""
    moved = [
        what
        for what, same in (
            ("HEAD", (after.base, after.head) == (facts.base, facts.head)),
            ("status", after.status == facts.status),
            ("refs", after.refs == facts.refs),
            ("stash", after.stash == facts.stash),
            ("shallow boundary", after.shallow == facts.shallow),
            ("sparse patterns", after.gitdir.sparse_patterns == facts.gitdir.sparse_patterns),
            ("config.worktree", after.gitdir.worktree_config == facts.gitdir.worktree_config),
            # A flag or an intent-to-add entry can change without changing the status.
            ("index", after.index.entries == facts.index.entries),
            ("submodules", _submodule_shape(after) == _submodule_shape(facts)),
            ("LFS objects", _lfs_key(after) == _lfs_key(facts)),
            ("unwatched files", after.unwatched == facts.unwatched),
        )
        if not same
    ]
    if moved:
        raise Refusal(
            Code.CHANGED_DURING_CAPTURE,
            f"the repository at {cwd} changed while it was being captured "
            f"({', '.join(moved)} differ)",
            "make sure the seat is stopped and nothing else writes to its tree, then cut again",
        )
    for sub, later in zip(facts.submodules, after.submodules, strict=True):
        if sub.facts is not None and later.facts is not None:
            _verify_unmoved(sub.worktree, sub.facts, later.facts)


def _lfs_key(facts: RepoFacts) -> tuple[tuple[str, int], ...]:
    return facts.lfs.key() if facts.lfs is not None else ()


def _submodule_shape(facts: RepoFacts) -> list[tuple[str, str, str | None]]:
    return [(sub.path, sub.commit, sub.name) for sub in facts.submodules]


def _repository_record(
    cwd: Path,
    facts: RepoFacts,
    bundle: FileRef | None,
    tree: _TreeArtifacts,
    *,
    declared: list[str],
    since: IncrementalLink | None,
    precopy: PrecopyLink | None,
    submodules: list[SubmoduleRecord] | None = None,
) -> RepositoryRecord:
    try:
        record = RepositoryRecord(
            base=facts.base,
            head=facts.head,
            untracked_selection=selection_rule(declared),
            status=tree.status_inline,
            bundle=bundle,
            index_diff=tree.index_diff,
            worktree_diff=tree.worktree_diff,
            untracked=tree.untracked,
            intent_to_add=tree.ita_inline,
            refs=tree.refs,
            status_file=tree.status_file,
            intent_to_add_file=tree.ita_file,
            config=tree.config,
            config_redacted=tree.redacted,
            hooks=tree.hooks,
            info_exclude=tree.exclude,
            stash=facts.stash,
            include=declared,
            since=since,
            precopy=precopy,
            shallow=msgspec.UNSET if tree.shallow is None else tree.shallow,
            sparse=msgspec.UNSET if tree.sparse is None else tree.sparse,
            unwatched=msgspec.UNSET if tree.unwatched is None else tree.unwatched,
            worktree_config=(
                msgspec.UNSET if tree.worktree_config is None else tree.worktree_config
            ),
            submodules=msgspec.UNSET if submodules is None else submodules,
            lfs=msgspec.UNSET if tree.lfs is None else tree.lfs,
        )
        # Round-trip through the strict decoder so the capture never returns a record the
        # reader would refuse (the constructor does not check field patterns).
        return decode_json(
            encode_json(record), RepositoryRecord, what="repository record", cap=1 << 30
        )
    except ValueError as exc:
        raise Refusal(
            Code.CAPTURE_INCONSISTENT,
            f"the capture of {cwd} does not form a valid record: {exc}",
            "report this with the repository state; cut again after committing or stashing the "
            "odd state",
        ) from None
