"""The capture runs the bundle beside the rest (docs/design.md decision 19).

What must hold however the two parts interleave: the artifacts and the record are those of the
sequential capture, progress reads as it did, a fault in either part surfaces as the very
refusal the sequential capture gave, and no git (nor anything git started) outlives a failed
capture. The repositories, the git runs and the child processes are real; where a test needs
a part held at a known point, a shim in place of git does it and then runs the real git.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import anyio
import pytest

from manager.checkpoint import gitstate
from manager.checkpoint.gitstate import capture_repository
from manager.checkpoint.restore import restore_repository
from protocol.checkpoint import BUNDLE_FILE, UNTRACKED_FILE, RepositoryRecord
from protocol.errors import Refusal
from tests.gitrepo import git, init_repo, make_rich_repo, seat_dir_for, write
from tests.helpers import wait_until

pytestmark = pytest.mark.usefixtures("isolated_home")

STAMP = "20261201T190000Z"


def shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on: str) -> None:
    """Put a shell script in place of git that runs `on` (with $5 the subcommand: SAFE_CONFIG's
    four arguments come first), then the real git."""
    real = shutil.which("git")
    assert real is not None
    path = tmp_path / "git-shim"
    path.write_text(f'#!/bin/sh\nREAL="{real}"\n{on}\nexec "$REAL" "$@"\n')
    path.chmod(0o755)
    monkeypatch.setattr(gitstate, "GIT", str(path))


def processes_in(directory: Path) -> list[int]:
    """Every live process whose working directory is `directory`, whoever its parent is now:
    a git child the capture abandoned would be re-parented, not gone."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            with open(f"/proc/{entry}/stat", "rb") as stat:
                state = stat.read().rpartition(b")")[2].split()[0]
        except OSError:
            continue
        if cwd == str(directory) and state != b"Z":
            found.append(int(entry))
    return found


def children() -> list[int]:
    pids = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as listing:
            pids += [int(pid) for pid in listing.read().split()]
    return pids


async def none_left_in(directory: Path) -> None:
    """Wait until no process works in `directory`: a process killed a moment ago may still be
    on its way out, but one that was never told to end would stay until the deadline."""
    try:
        await wait_until(lambda: not processes_in(directory), timeout=10, every=0.02)
    except TimeoutError:
        left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes() for pid in processes_in(directory)}
        raise AssertionError(f"processes still working in {directory}: {left}") from None
    assert not set(children()) & set(processes_in(directory))


def digests(seat: Path) -> dict[str, str]:
    return {
        name: hashlib.sha256((seat / name).read_bytes()).hexdigest() for name in os.listdir(seat)
    }


# -- the same capture -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_overlapped_capture_is_the_same_capture_and_restores(tmp_path: Path) -> None:
    repo = make_rich_repo(tmp_path / "src")
    steps: list[tuple[str, int]] = []

    seat = seat_dir_for(tmp_path, "one")
    record = await capture_repository(
        repo, seat, progress=lambda step, done: steps.append((step, done))
    )
    again = seat_dir_for(tmp_path, "two")
    second = await capture_repository(repo, again)

    # However the two parts interleaved, both captures wrote the same bytes under the same
    # names, and the seat directory holds exactly the files the record names.
    assert record == second
    assert digests(seat) == digests(again)
    assert sorted(os.listdir(seat)) == sorted(ref.file for ref in record.files())
    for ref in record.files():
        assert hashlib.sha256((seat / ref.file).read_bytes()).hexdigest() == ref.sha256
        assert (seat / ref.file).stat().st_size == ref.bytes
    assert record.bundle is not None and record.stash and record.intent_to_add

    # Progress reads as the sequential capture's did: the bundle, then each later step, each
    # ending on its file's size.
    order = list(dict.fromkeys(step for step, _ in steps))
    assert order == ["bundle", "index-diff", "worktree-diff", "untracked"]
    last = dict(steps)
    assert last["bundle"] == record.bundle.bytes
    assert last["index-diff"] == record.index_diff.bytes
    assert last["worktree-diff"] == record.worktree_diff.bytes
    assert last["untracked"] == record.untracked.bytes

    target = tmp_path / "dest" / "work"
    await restore_repository(seat, record, target, stamp=STAMP)
    for args in (
        ("status", "--porcelain=v1", "-z", "--untracked-files=all", "--", ":(exclude).cotal"),
        ("diff", "--cached", "--binary", "--full-index"),
        ("diff", "--binary", "--full-index"),
        ("ls-files", "-s", "-z"),
        ("for-each-ref", "--format=%(objectname) %(refname)"),
        ("stash", "list", "--format=%H %gs"),
    ):
        assert git(target, *args) == git(repo, *args), args


# -- faults -----------------------------------------------------------------------------------


def held_bundle(started: Path) -> str:
    """The shim's line that holds `git bundle`, with a child of its own as `git pack-objects`
    is, until it is ended; `started` appears once it holds."""
    return f'if [ "$5" = bundle ]; then sleep 600 & touch "{started}"; wait; exit 1; fi'


@pytest.mark.anyio
async def test_an_untracked_fault_beside_a_running_bundle_ends_the_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_rich_repo(tmp_path / "repo")
    started = tmp_path / "bundle-started"
    # The bundle holds, with a child of its own as `git pack-objects` is, until it is ended;
    # the worktree diff waits until it holds, then turns an untracked file into a fifo, which
    # the archive refuses.
    shim(
        tmp_path,
        monkeypatch,
        held_bundle(started) + "\n"
        f'if [ "$5" = diff ] && [ "$6" != --cached ]; then\n'
        f'  while [ ! -e "{started}" ]; do sleep 0.01; done\n'
        "  rm untracked.txt && mkfifo untracked.txt\n"
        "fi",
    )
    seat = seat_dir_for(tmp_path)

    with pytest.raises(Refusal) as err:
        await capture_repository(repo, seat)

    assert (err.value.code, err.value.message, err.value.cure) == (
        "untracked-unsupported",
        "untracked entry untracked.txt is not a regular file or symlink",
        "remove it or list it in .gitignore",
    )
    await none_left_in(repo)
    # The abandoned parts leave no partial file; what finished stays for the caller, which
    # keeps an unsealed attempt directory as evidence.
    assert sorted(os.listdir(seat)) == ["index.diff", "worktree.diff"]
    assert not (seat / BUNDLE_FILE).exists() and not (seat / UNTRACKED_FILE).exists()


def corrupt_history(path: Path) -> Path:
    """A repository whose current state reads fine but whose history lost an object: a blob
    of the first commit only, so status and the diffs never ask for it and the bundle does."""
    repo = init_repo(path)
    write(repo / "notes.txt", "the first version, gone from the store\n")
    git(repo, "add", "notes.txt")
    git(repo, "commit", "-q", "-m", "first")
    lost = git(repo, "rev-parse", "HEAD:notes.txt").decode().strip()
    write(repo / "notes.txt", "the second version\n")
    git(repo, "commit", "-q", "-am", "second")
    write(repo / "staged.txt", "staged\n")
    git(repo, "add", "staged.txt")
    write(repo / "notes.txt", "unstaged\n")
    write(repo / "untracked.txt", "untracked\n")
    (repo / ".git" / "objects" / lost[:2] / lost[2:]).unlink()
    return repo


@pytest.mark.anyio
async def test_a_bundle_fault_surfaces_as_before(tmp_path: Path) -> None:
    repo = corrupt_history(tmp_path / "repo")
    seat = seat_dir_for(tmp_path)

    with pytest.raises(Refusal) as err:
        await capture_repository(repo, seat)

    assert err.value.code == "git-failed"
    assert err.value.message.startswith(
        f"`git bundle create --quiet - --glob=refs/* HEAD` failed in {repo} (exit "
    )
    assert err.value.cure == "read git's message; the seat's repository was not changed"
    await none_left_in(repo)
    assert not (seat / BUNDLE_FILE).exists()


@pytest.mark.anyio
@pytest.mark.parametrize("subcommand", ["bundle", "status"])
async def test_a_git_killed_by_a_signal_is_named_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, subcommand: str
) -> None:
    # The streamed bundle and a collected git (`run_git`) say the same: which signal, and a
    # cure about the kill, not "read git's message" when git wrote none.
    repo = make_rich_repo(tmp_path / "repo")
    shim(tmp_path, monkeypatch, f'[ "$5" = {subcommand} ] && kill -KILL $$')
    seat = seat_dir_for(tmp_path)

    with pytest.raises(Refusal) as err:
        await capture_repository(repo, seat)

    assert err.value.code == "git-failed"
    assert err.value.message.startswith(f"`git {subcommand} ")
    assert err.value.message.endswith(f" was killed by SIGKILL in {repo} before it finished")
    assert err.value.cure == gitstate.KILLED_CURE
    await none_left_in(repo)
    assert not (seat / BUNDLE_FILE).exists()


@pytest.mark.anyio
async def test_when_both_parts_fail_the_bundles_refusal_wins() -> None:
    # Both fail only when the second's failure lands before the first's cancels it; the
    # first holds on shielded until the second has failed, so both do, every time.
    failed = anyio.Event()

    async def bundle_part() -> None:
        with anyio.CancelScope(shield=True):
            await failed.wait()
        raise Refusal("bundle-refs", "the bundle's fault", "its cure")

    async def tree_part() -> None:
        failed.set()
        raise Refusal("untracked-unsupported", "the archive's fault", "its cure")

    for _ in range(5):
        failed = anyio.Event()
        with pytest.raises(Refusal) as err:
            await gitstate._side_by_side(bundle_part, tree_part)
        assert (err.value.code, err.value.message) == ("bundle-refs", "the bundle's fault")


@pytest.mark.anyio
async def test_a_cancelled_capture_leaves_no_git_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cut's own deadline cancels the capture from outside: that is passed through as a
    # cancellation, not turned into a refusal, and the held bundle ends with its child.
    repo = make_rich_repo(tmp_path / "repo")
    started = tmp_path / "bundle-started"
    shim(
        tmp_path,
        monkeypatch,
        held_bundle(started),
    )
    seat = seat_dir_for(tmp_path)
    record: RepositoryRecord | None = None

    async with anyio.create_task_group() as tg:

        async def capture() -> None:
            nonlocal record
            record = await capture_repository(repo, seat)

        tg.start_soon(capture)
        await wait_until(started.exists, timeout=10, every=0.02)
        tg.cancel_scope.cancel()

    assert record is None
    await none_left_in(repo)
    assert not (seat / BUNDLE_FILE).exists()
