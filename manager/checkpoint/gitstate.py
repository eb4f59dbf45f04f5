"""The repository half of the cut: preflight and capture (record 1.1, 6 step 5; peers.md 6).

A capture is five artifacts and a few facts. `repo.bundle` carries the history (`bundle --all`);
`index.diff` and `worktree.diff` carry the staging state as two diffs, base->index and
index->worktree, because one combined diff restores every change as unstaged; `untracked.tar`
carries the untracked files under the recorded selection rule; `refs.txt` lists every ref,
because a clone of the bundle drops refs/stash. The record adds the base commit, the branch HEAD
is on, the porcelain status the restore must reproduce, and the intent-to-add entries, which
neither diff carries as index entries.

States the procedure cannot reproduce are refused by name before anything is written: no
repository, an unborn HEAD, a shallow history, an unmerged index or an operation in progress,
submodules (record open point 9), index flags such as skip-worktree, a tracked or nested
`.cotal`, and untracked entries that are not files or symlinks. Preflight changes nothing.

git runs as argv lists with a minimal environment: no system config, hooks pointed at
/dev/null, no fsmonitor (both would run programs the seat may have configured), no optional
locks (so `git status` never rewrites the index), C locale. The operator's global config is
kept on purpose: its excludes file is part of what `--exclude-standard` means on this host, and
dropping it would sweep files the operator ignores (an `.env`) into the artifact.
"""

from __future__ import annotations

import os
import stat
import subprocess
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.to_thread

from connectors.privatefs import (
    UnsafeDirectory,
    UnsafeFile,
    file_identity,
    open_parent_below,
    open_regular,
)
from manager.checkpoint.seal import ExclusiveFile
from protocol.checkpoint import (
    BUNDLE_FILE,
    CONTROL_DIR,
    INDEX_DIFF_FILE,
    REFS_FILE,
    UNTRACKED_FILE,
    UNTRACKED_SELECTION,
    WORKTREE_DIFF_FILE,
    FileRef,
    RepositoryRecord,
    format_refs_list,
)
from protocol.codec import decode_json, encode_json
from protocol.errors import Refusal

Progress = Callable[[str, int], None]

GIT = "git"
# Every git run: hooks and fsmonitor are programs a seat can configure in .git/config; a cut
# must never execute them.
SAFE_CONFIG: tuple[str, ...] = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")
EXCLUDE_CONTROL = f":(exclude){CONTROL_DIR}"
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
)
STATUS_ARGS: tuple[str, ...] = (
    "status",
    "--porcelain=v1",
    "-z",
    "--untracked-files=all",
    "--no-renames",
    "--",
    EXCLUDE_CONTROL,
)
_ENV_PASS = ("PATH", "HOME", "XDG_CONFIG_HOME", "TMPDIR")
_STDERR_KEEP = 64 * 1024
_PROGRESS_STEP = 4 * 1024 * 1024

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
    code: str = "git-failed",
    cure: str = "read git's message; nothing was changed",
) -> GitResult:
    """Run one git command in `cwd`; an exit status outside `ok` is a Refusal with git's stderr."""
    try:
        proc = await anyio.run_process(
            [GIT, *SAFE_CONFIG, *args], cwd=cwd, env=git_env(env), input=stdin, check=False
        )
    except FileNotFoundError:
        raise Refusal(
            "git-missing",
            f"cannot run git in {cwd} (git is not on PATH or {cwd} is gone)",
            "install git",
        ) from None
    if proc.returncode not in ok:
        raise Refusal(
            code,
            f"`{_show(args)}` failed in {cwd} (exit {proc.returncode}): {_tail(proc.stderr)}",
            cure,
        )
    return GitResult(proc.returncode, proc.stdout, proc.stderr)


async def stream_git_to_file(
    cwd: Path,
    args: Sequence[str],
    directory: Path,
    name: str,
    *,
    progress: Progress | None = None,
    phase: str = "",
) -> FileRef:
    """Stream one git command's stdout into a new exclusive file, never holding it in memory."""
    out = ExclusiveFile(directory, name)
    try:
        stderr = bytearray()
        done = 0
        try:
            process = await anyio.open_process(
                [GIT, *SAFE_CONFIG, *args], cwd=cwd, env=git_env(), stdin=subprocess.DEVNULL
            )
        except FileNotFoundError:
            raise Refusal("git-missing", f"cannot run git in {cwd}", "install git") from None
        async with process:
            assert process.stdout is not None and process.stderr is not None
            err_stream = process.stderr

            async def drain_stderr() -> None:
                # Read stderr concurrently so a chatty git cannot block on a full pipe.
                async for chunk in err_stream:
                    if len(stderr) < _STDERR_KEEP:
                        stderr.extend(chunk[: _STDERR_KEEP - len(stderr)])

            async with anyio.create_task_group() as tg:
                tg.start_soon(drain_stderr)
                async for chunk in process.stdout:
                    await anyio.to_thread.run_sync(out.write, chunk)
                    done += len(chunk)
                    if progress is not None:
                        progress(phase, done)
            rc = await process.wait()
        if rc != 0:
            raise Refusal(
                "git-failed",
                f"`{_show(args)}` failed in {cwd} (exit {rc}): {_tail(bytes(stderr))}",
                "read git's message; the seat's repository was not changed",
            )
        return await anyio.to_thread.run_sync(out.finish)
    except BaseException:
        out.abort()
        raise


# -- preflight ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RepoFacts:
    top: Path
    base: str
    head: str | None
    status: str
    untracked: list[bytes]


def _in_control_dir(path: bytes) -> bool:
    ctl = CONTROL_DIR.encode()
    return path == ctl or path.startswith(ctl + b"/")


def _split_z(data: bytes) -> list[bytes]:
    return [item for item in data.split(b"\0") if item]


def _names(paths: Sequence[bytes], limit: int = 5) -> str:
    shown = ", ".join(os.fsdecode(p) for p in paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


async def _facts(cwd: Path) -> RepoFacts:
    cwd = Path(cwd)
    if not cwd.is_dir():
        raise Refusal(
            "not-a-repository",
            f"seat cwd {cwd} is not a directory",
            "run the seat in a directory that is a git repository",
        )
    real = cwd.resolve()
    probe = await run_git(cwd, "rev-parse", "--is-inside-work-tree", "--show-toplevel", ok=(0, 128))
    lines = probe.stdout.decode("utf-8", "replace").splitlines()
    if probe.rc != 0 or not lines or lines[0] != "true":
        raise Refusal(
            "not-a-repository",
            f"seat cwd {cwd} is not the working tree of a git repository, so its state cannot be "
            "captured",
            f"run `git init` in {cwd} and commit the seat's files, or move the seat into a git "
            "repository",
        )
    top = Path(lines[1]).resolve() if len(lines) > 1 else None
    if top != real:
        raise Refusal(
            "not-top-level",
            f"seat cwd {cwd} is inside the repository at {top} but is not its top level; the "
            "restore "
            "rebuilds the repository at the seat's cwd",
            f"run the seat at {top}, or run `git init` in {cwd} to give it a repository of its own",
        )

    state = await run_git(
        cwd, "rev-parse", *(arg for name, _, _ in _IN_PROGRESS for arg in ("--git-path", name))
    )
    for (_name, what, cure), rel in zip(
        _IN_PROGRESS, state.stdout.decode().splitlines(), strict=True
    ):
        if os.path.lexists(cwd / rel):
            raise Refusal(
                "operation-in-progress",
                f"{what} is in progress in {cwd} ({rel} exists); its state lives in files a "
                "checkpoint does not carry",
                cure + ", then cut again",
            )

    head_commit = await run_git(cwd, "rev-parse", "--verify", "-q", "HEAD^{commit}", ok=(0, 1))
    head_ref = await run_git(cwd, "symbolic-ref", "-q", "HEAD", ok=(0, 1))
    head = head_ref.stdout.decode().strip() if head_ref.rc == 0 else None
    if head_commit.rc != 0:
        raise Refusal(
            "unborn-head",
            f"{cwd} has no commit yet ({head or 'HEAD'} is unborn), so there is no history to "
            "bundle",
            "make a first commit (`git add -A && git commit`), then cut again",
        )
    base = head_commit.stdout.decode().strip()

    shallow = await run_git(cwd, "rev-parse", "--is-shallow-repository")
    if shallow.stdout.strip() == b"true":
        raise Refusal(
            "shallow",
            f"{cwd} is a shallow clone; its bundle would need history the destination does not "
            "have",
            "run `git fetch --unshallow`, then cut again",
        )

    index = await run_git(cwd, "ls-files", "-s", "-t", "-v", "-z")
    unmerged: list[bytes] = []
    gitlinks: list[bytes] = []
    flagged: list[bytes] = []
    control: list[bytes] = []
    for entry in _split_z(index.stdout):
        meta, _, path = entry.partition(b"\t")
        tag, mode, _oid, stage = meta.split(b" ")
        if stage != b"0":
            unmerged.append(path)
        if mode == b"160000":
            gitlinks.append(path)
        if tag != b"H" and stage == b"0":
            flagged.append(path)
        if _in_control_dir(path):
            control.append(path)
    unmerged = sorted(set(unmerged))
    if unmerged:
        raise Refusal(
            "unmerged",
            f"{cwd} has unmerged paths ({_names(unmerged)}); `git diff --cached` cannot express "
            "them",
            "resolve them (`git add` the result) or abort the merge, then cut again",
        )
    if gitlinks:
        raise Refusal(
            "submodule",
            f"{cwd} has submodules ({_names(gitlinks)}); a checkpoint restores a submodule as an "
            "empty "
            "directory (record open point 9)",
            "remove the submodules or run the seat in a repository without them",
        )
    if flagged:
        raise Refusal(
            "index-flags",
            f"{cwd} has index entries marked skip-worktree or assume-unchanged "
            f"({_names(flagged)}); "
            "those bits do not travel and the restored tree would differ",
            "clear them (`git sparse-checkout disable`, `git update-index --no-skip-worktree "
            "--no-assume-unchanged <path>`), then cut again",
        )
    if control:
        raise Refusal(
            "control-dir-tracked",
            f"{cwd} tracks files under {CONTROL_DIR}/ ({_names(control)}); the control directory "
            "holds "
            "credentials and must never enter a checkpoint",
            f"run `git rm -r --cached {CONTROL_DIR}` and add {CONTROL_DIR}/ to .gitignore",
        )

    listed = await run_git(
        cwd, "ls-files", "--others", "--exclude-standard", "-z", "--", EXCLUDE_CONTROL
    )
    untracked = [p for p in _split_z(listed.stdout) if not _in_control_dir(p)]
    nested = [p for p in untracked if p.endswith(b"/")]
    if nested:
        raise Refusal(
            "untracked-unsupported",
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
            "untracked-unsupported",
            f"{cwd} has untracked entries that are not regular files or symlinks ({_names(odd)})",
            "remove them (sockets, fifos and devices cannot be archived) or list them in "
            ".gitignore",
        )

    raw_status = (await run_git(cwd, *STATUS_ARGS)).stdout
    try:
        status = raw_status.decode("utf-8")
    except UnicodeDecodeError:
        bad = [e for e in raw_status.split(b"\0") if not _utf8(e)]
        raise Refusal(
            "non-utf8-path",
            f"{cwd} has changed or untracked paths whose names are not UTF-8 ({_names(bad)}); the "
            "record is JSON",
            "rename them to UTF-8 names, then cut again",
        ) from None
    return RepoFacts(top=real, base=base, head=head, status=status, untracked=untracked)


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


async def preflight_repository(cwd: Path) -> None:
    """Refuse, by name and with a cure, a repository state the checkpoint cannot reproduce.

    Read-only: it runs before the seat is stopped, so a refusal costs nothing.
    """
    await _facts(Path(cwd))


# -- capture ------------------------------------------------------------------------------------


async def read_refs(cwd: Path) -> dict[str, str]:
    """Every ref of the repository at `cwd` and the object it names, as `{refname: oid}`."""
    out = await run_git(cwd, "for-each-ref", "--format=%(objectname) %(refname)")
    refs: dict[str, str] = {}
    for line in out.stdout.decode("utf-8").splitlines():
        oid, _, name = line.partition(" ")
        refs[name] = oid
    return refs


async def _intent_to_add(cwd: Path) -> list[str]:
    """Paths `git add -N` put in the index.

    An intent-to-add entry is the one index entry whose base->index status depends on whether
    the diff shows it (as an empty added file) or hides it; a regular entry reads the same
    both ways. Both modes are named explicitly so the answer does not depend on a default.
    """

    async def name_status(mode: str) -> dict[str, str]:
        out = await run_git(
            cwd,
            "diff",
            "--cached",
            mode,
            "--name-status",
            "--no-renames",
            "-z",
            "--",
            EXCLUDE_CONTROL,
        )
        fields = out.stdout.decode("utf-8").split("\0")
        return {fields[i + 1]: fields[i] for i in range(0, len(fields) - 1, 2)}

    visible = await name_status("--ita-visible-in-index")
    hidden = await name_status("--ita-invisible-in-index")
    return sorted(p for p, s in visible.items() if hidden.get(p) != s)


def _write_untracked_tar(
    top: Path, paths: Sequence[bytes], out: ExclusiveFile, report: Callable[[int], None]
) -> None:
    """Archive the selected untracked files, each opened beneath `top` without following links.

    Owners are zeroed (a user name is not the destination's business), set-id bits dropped, and
    a file that changes while it is archived refuses the capture rather than sealing torn bytes.
    """

    class Sink:
        """The file object tarfile streams into; reports progress every few MiB, not per block."""

        def __init__(self) -> None:
            self.done = 0
            self.reported = 0

        def write(self, data: bytes) -> int:
            n = out.write(data)
            self.done += n
            if self.done - self.reported >= _PROGRESS_STEP:
                self.reported = self.done
                report(self.done)
            return n

    top_fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with tarfile.open(fileobj=Sink(), mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            for raw in paths:
                rel = os.fsdecode(raw)
                try:
                    parent, leaf = open_parent_below(top_fd, rel)
                except (OSError, UnsafeDirectory) as exc:
                    why = exc.reason if isinstance(exc, UnsafeDirectory) else exc.strerror
                    raise Refusal(
                        "changed-during-capture",
                        f"untracked file {rel} is no longer beneath a plain directory ({why})",
                        "make sure nothing writes to the seat's tree, then cut again",
                    ) from None
                try:
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
                        continue
                    if not stat.S_ISREG(st.st_mode):
                        raise Refusal(
                            "untracked-unsupported",
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
                            "changed-during-capture",
                            f"untracked file {rel} changed while it was archived",
                            "make sure nothing writes to the seat's tree, then cut again",
                        )
                except (OSError, UnsafeFile) as exc:
                    why = exc.detail if isinstance(exc, UnsafeFile) else exc.strerror
                    raise Refusal(
                        "changed-during-capture",
                        f"untracked file {rel} could not be archived ({why})",
                        "make sure nothing writes to the seat's tree, then cut again",
                    ) from None
                finally:
                    os.close(parent)
    finally:
        os.close(top_fd)


async def _capture_untracked(
    top: Path, paths: Sequence[bytes], seat_dir: Path, progress: Progress | None
) -> FileRef:
    out = ExclusiveFile(seat_dir, UNTRACKED_FILE)

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


def bundle_heads(list_heads_output: bytes) -> dict[str, str]:
    """`git bundle list-heads` output as {ref: oid}, without the symbolic HEAD line."""
    carried = {}
    for line in list_heads_output.decode("utf-8", "replace").splitlines():
        oid, _, name = line.partition(" ")
        if name != "HEAD":
            carried[name] = oid
    return carried


def refs_differing(a: dict[str, str], b: dict[str, str]) -> list[str]:
    return sorted(name for name in set(a) | set(b) if a.get(name) != b.get(name))


async def capture_repository(
    cwd: Path, seat_dir: Path, *, progress: Progress | None = None
) -> RepositoryRecord:
    """Capture the seat's repository into `seat_dir` and return the record that names it.

    Runs only after the seat is proven stopped (record 1.3 step 7). Preflight runs again first,
    and the refs and status are re-read at the end: a repository that moved during the capture
    is refused rather than sealed as a mixture of two instants.
    """
    cwd = Path(cwd)
    seat_dir = Path(seat_dir)
    facts = await _facts(cwd)
    refs = await read_refs(cwd)
    ita = await _intent_to_add(cwd)

    bundle = await stream_git_to_file(
        cwd,
        ["bundle", "create", "--quiet", "-", "--all"],
        seat_dir,
        BUNDLE_FILE,
        progress=progress,
        phase="bundle",
    )
    heads = await run_git(cwd, "bundle", "list-heads", str(seat_dir / BUNDLE_FILE))
    differ = refs_differing(bundle_heads(heads.stdout), refs)
    if differ:
        raise Refusal(
            "bundle-refs",
            f"the bundle of {cwd} does not carry exactly the repository's refs "
            f"({', '.join(differ[:5])})",
            "make sure nothing changes the repository during the cut, then cut again",
        )

    index_diff = await stream_git_to_file(
        cwd,
        ["diff", "--cached", *DIFF_FLAGS],
        seat_dir,
        INDEX_DIFF_FILE,
        progress=progress,
        phase="index-diff",
    )
    worktree_diff = await stream_git_to_file(
        cwd,
        ["diff", *DIFF_FLAGS],
        seat_dir,
        WORKTREE_DIFF_FILE,
        progress=progress,
        phase="worktree-diff",
    )
    untracked = await _capture_untracked(facts.top, facts.untracked, seat_dir, progress)
    refs_ref: FileRef | None = None
    if refs:
        out = ExclusiveFile(seat_dir, REFS_FILE)
        try:
            out.write(format_refs_list(refs))
            refs_ref = out.finish()
        except BaseException:
            out.abort()
            raise

    after = await _facts(cwd)
    if (after.base, after.head, after.status) != (
        facts.base,
        facts.head,
        facts.status,
    ) or await read_refs(cwd) != refs:
        raise Refusal(
            "changed-during-capture",
            f"the repository at {cwd} changed while it was being captured",
            "make sure the seat is stopped and nothing else writes to its tree, then cut again",
        )

    try:
        record = RepositoryRecord(
            base=facts.base,
            head=facts.head,
            untracked_selection=UNTRACKED_SELECTION,
            status=facts.status,
            bundle=bundle,
            index_diff=index_diff,
            worktree_diff=worktree_diff,
            untracked=untracked,
            intent_to_add=ita,
            refs=refs_ref,
        )
        # Round-trip through the strict decoder so the capture never returns a record the
        # reader would refuse (the constructor does not check field patterns).
        return decode_json(
            encode_json(record), RepositoryRecord, what="repository record", cap=1 << 30
        )
    except ValueError as exc:
        raise Refusal(
            "capture-inconsistent",
            f"the capture of {cwd} does not form a valid record: {exc}",
            "report this with the repository state; cut again after committing or stashing the "
            "odd state",
        ) from None
