"""Preflight and capture against real git repositories (builders in tests/gitrepo.py)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import msgspec
import pytest

from manager.checkpoint.gitstate import capture_repository, preflight_repository
from manager.checkpoint.restore import restore_repository
from protocol.checkpoint import UNTRACKED_SELECTION, parse_refs_list, porcelain_by_path
from protocol.errors import Refusal
from tests.gitrepo import (
    AUTH_TOKEN,
    DOTENV_TOKEN,
    full_digest,
    git,
    init_repo,
    make_rich_repo,
    seat_dir_for,
    tree_digest,
    write,
)

pytestmark = pytest.mark.usefixtures("isolated_home")


# -- preflight --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_preflight_refuses_a_plain_directory(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(Refusal) as err:
        await preflight_repository(plain)
    assert err.value.code == "not-a-repository"
    assert "git init" in err.value.cure


@pytest.mark.anyio
async def test_preflight_refuses_a_subdirectory_of_a_repository(tmp_path: Path) -> None:
    repo = make_rich_repo(tmp_path / "repo")
    with pytest.raises(Refusal) as err:
        await preflight_repository(repo / "dir")
    assert err.value.code == "not-top-level"


@pytest.mark.anyio
async def test_preflight_passes_an_unborn_head_and_refuses_one_naming_nothing(
    tmp_path: Path,
) -> None:
    """An unborn branch travels (tests/integration/test_repo_shapes.py); a detached HEAD whose
    commit is gone names neither a commit nor a branch, and refuses by name."""
    repo = init_repo(tmp_path / "repo")
    write(repo / "a.txt", "a\n")
    await preflight_repository(repo)
    (repo / ".git" / "HEAD").write_text("1" * 40 + "\n")
    with pytest.raises(Refusal) as err:
        await preflight_repository(repo)
    assert err.value.code == "git-failed"
    assert "names neither a commit nor a branch" in err.value.message
    assert "checkout" in err.value.cure


def _conflict(repo: Path) -> None:
    write(repo / "c.txt", "base\n")
    git(repo, "add", "c.txt")
    git(repo, "commit", "-q", "-m", "base")
    git(repo, "checkout", "-q", "-b", "other")
    write(repo / "c.txt", "other\n")
    git(repo, "commit", "-q", "-am", "other")
    git(repo, "checkout", "-q", "main")
    write(repo / "c.txt", "main\n")
    git(repo, "commit", "-q", "-am", "main")


@pytest.mark.anyio
async def test_preflight_refuses_mid_merge_and_changes_nothing(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    _conflict(repo)
    git(repo, "merge", "other", check=False)
    assert (repo / ".git" / "MERGE_HEAD").exists()
    before = full_digest(repo)
    with pytest.raises(Refusal) as err:
        await preflight_repository(repo)
    assert err.value.code == "operation-in-progress"
    assert "merge --abort" in err.value.cure
    assert full_digest(repo) == before


@pytest.mark.anyio
async def test_preflight_refuses_an_unmerged_index_without_merge_state(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    write(repo / "c.txt", "base\n")
    git(repo, "add", "c.txt")
    git(repo, "commit", "-q", "-m", "base")
    write(repo / "c.txt", "stashed\n")
    git(repo, "stash", "-q")
    write(repo / "c.txt", "committed\n")
    git(repo, "commit", "-q", "-am", "next")
    git(repo, "stash", "pop", check=False)  # conflicts: unmerged entries, no MERGE_HEAD
    with pytest.raises(Refusal) as err:
        await preflight_repository(repo)
    assert err.value.code == "unmerged"
    assert "c.txt" in err.value.message


@pytest.mark.anyio
@pytest.mark.parametrize(
    "marker", ["rebase-merge", "rebase-apply", "CHERRY_PICK_HEAD", "REVERT_HEAD", "BISECT_LOG"]
)
async def test_preflight_refuses_each_operation_in_progress(tmp_path: Path, marker: str) -> None:
    repo = make_rich_repo(tmp_path / "repo")
    path = repo / ".git" / marker
    if marker.startswith("rebase"):
        path.mkdir()
    else:
        path.write_text("x\n")
    with pytest.raises(Refusal) as err:
        await preflight_repository(repo)
    assert err.value.code == "operation-in-progress"
    assert marker in err.value.message


@pytest.mark.anyio
async def test_a_gitlink_whose_directory_is_gone_travels_gone(tmp_path: Path) -> None:
    """A gitlink made by hand (no checkout, no `.gitmodules`) whose directory is not there: its
    status says deleted, and the restore leaves it so; files where it should be, with no
    `.git`, refuse by name."""
    repo = init_repo(tmp_path / "repo")
    write(repo / "a.txt", "a\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "a")
    head = git(repo, "rev-parse", "HEAD").decode().strip()
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{head},vendor/lib")
    git(repo, "commit", "-q", "-m", "gitlink")
    status = git(repo, "status", "--porcelain=v1", "-z")
    assert status == b" D vendor/lib\0"
    seat = seat_dir_for(tmp_path)
    record = await capture_repository(repo, seat)
    assert record.submodules is not msgspec.UNSET
    [sub] = record.submodules
    assert (sub.path, sub.absent, sub.name) == ("vendor/lib", True, None)
    target = tmp_path / "restored"
    await restore_repository(seat, record, target, stamp="20261207T000000Z")
    assert git(target, "status", "--porcelain=v1", "-z") == status
    assert not (target / "vendor" / "lib").exists()

    write(repo / "vendor" / "lib" / "x.txt", "a file, no .git\n")
    with pytest.raises(Refusal) as err:
        await preflight_repository(repo)
    assert err.value.code == "submodule"
    assert "vendor/lib" in err.value.message and "files but no .git" in err.value.message
    assert "git submodule update --init vendor/lib" in err.value.cure


@pytest.mark.anyio
async def test_preflight_refuses_tracked_control_dir_nested_repos_and_flags(tmp_path: Path) -> None:
    repo = make_rich_repo(tmp_path / "repo")
    git(repo, "add", "-f", ".cotal/auth/broker.creds")
    with pytest.raises(Refusal) as err:
        await preflight_repository(repo)
    assert err.value.code == "control-dir-tracked"
    assert AUTH_TOKEN.decode() not in err.value.text
    git(repo, "rm", "-q", "--cached", ".cotal/auth/broker.creds")

    # An entry git does not compare whose path is not a file it could archive.
    git(repo, "update-index", "--skip-worktree", "tracked.txt")
    os.unlink(repo / "tracked.txt")
    os.mkfifo(repo / "tracked.txt")
    with pytest.raises(Refusal) as err:
        await preflight_repository(repo)
    assert err.value.code == "index-flags" and "tracked.txt" in err.value.message
    os.unlink(repo / "tracked.txt")
    git(repo, "update-index", "--no-skip-worktree", "tracked.txt")
    git(repo, "checkout", "--", "tracked.txt")

    init_repo(repo / "inner")
    with pytest.raises(Refusal) as err:
        await preflight_repository(repo)
    assert err.value.code == "untracked-unsupported"
    assert "inner/" in err.value.message


@pytest.mark.anyio
async def test_preflight_passes_a_shallow_clone_and_refuses_a_boundary_it_cannot_carry(
    tmp_path: Path,
) -> None:
    """A shallow clone travels (tests/integration/test_repo_shapes.py); only a boundary that is
    not the plain `.git/shallow` git writes is refused, by name, before the seat stops."""
    src = make_rich_repo(tmp_path / "src")
    git(src, "commit", "-q", "-m", "second")
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{src}", "shallow")
    repo = tmp_path / "shallow"
    await preflight_repository(repo)
    boundary = repo / ".git" / "shallow"
    honest = boundary.read_bytes()
    boundary.write_bytes(honest + honest)
    with pytest.raises(Refusal) as err:
        await preflight_repository(repo)
    assert err.value.code == "gitdir-unsupported"
    assert str(boundary) in err.value.message and "twice" in err.value.message
    boundary.unlink()
    os.symlink(tmp_path / "elsewhere", boundary)
    (tmp_path / "elsewhere").write_bytes(honest)
    with pytest.raises(Refusal) as err:
        await preflight_repository(repo)
    assert err.value.code == "gitdir-unsupported" and "symlink" in err.value.message


# -- capture ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_capture_writes_private_files_and_a_consistent_record(tmp_path: Path) -> None:
    repo = make_rich_repo(tmp_path / "repo")
    seat = seat_dir_for(tmp_path)
    before = tree_digest(repo, skip=(), times=False)
    index_before = (repo / ".git" / "index").read_bytes()
    phases: list[tuple[str, int]] = []

    record = await capture_repository(
        repo, seat, progress=lambda phase, done: phases.append((phase, done))
    )

    assert record.base == git(repo, "rev-parse", "HEAD").decode().strip()
    assert record.head == "refs/heads/main"
    assert record.untracked_selection == UNTRACKED_SELECTION
    assert record.intent_to_add == ["ita.txt", "ita_gone.txt"]
    status = porcelain_by_path(record.status)
    assert status["ita.txt"] == " A" and status["ita_gone.txt"] == " D"
    assert status["README.md"] == "MM" and status["untracked.txt"] == "??"
    assert not any(path.startswith(".cotal") for path in status)
    assert record.refs is not None
    refs = parse_refs_list((seat / record.refs.file).read_bytes())
    assert refs["refs/stash"] == git(repo, "rev-parse", "refs/stash").decode().strip()
    assert set(refs) >= {
        "refs/heads/main",
        "refs/heads/feature",
        "refs/tags/v1",
        "refs/tags/v1-annotated",
    }

    names = sorted(os.listdir(seat))
    # git init writes a config and an info/exclude; its hooks are samples and stay behind.
    assert names == sorted(
        [
            "repo.bundle",
            "index.diff",
            "worktree.diff",
            "untracked.tar",
            "refs.txt",
            "git-config",
            "git-info-exclude",
        ]
    )
    assert sorted(ref.file for ref in record.files()) == names
    for ref in record.files():
        path = seat / ref.file
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        assert path.stat().st_size == ref.bytes
        assert hashlib.sha256(path.read_bytes()).hexdigest() == ref.sha256
    assert {p for p, _ in phases} >= {"bundle", "index-diff", "worktree-diff", "untracked"}

    # Capture is read-only for the seat's repository: not even the index is refreshed.
    assert (repo / ".git" / "index").read_bytes() == index_before
    assert tree_digest(repo, skip=(), times=False) == before


@pytest.mark.anyio
async def test_capture_never_carries_control_dir_or_ignored_secrets(tmp_path: Path) -> None:
    repo = make_rich_repo(tmp_path / "repo")
    seat = seat_dir_for(tmp_path)
    record = await capture_repository(repo, seat)
    import tarfile

    with tarfile.open(seat / record.untracked.file) as tar:
        members = tar.getnames()
    assert "untracked.txt" in members and "udangling" in members
    assert not any(m.startswith(".cotal") or m in (".env", "build.log") for m in members)
    for path in seat.iterdir():
        data = path.read_bytes()
        assert AUTH_TOKEN not in data, path
        assert DOTENV_TOKEN not in data, path
    assert AUTH_TOKEN.decode() not in record.status and DOTENV_TOKEN.decode() not in record.status


@pytest.mark.anyio
async def test_capture_refuses_an_existing_artifact_and_never_overwrites(tmp_path: Path) -> None:
    repo = make_rich_repo(tmp_path / "repo")
    seat = seat_dir_for(tmp_path)
    (seat / "repo.bundle").write_bytes(b"earlier capture")
    with pytest.raises(Refusal) as err:
        await capture_repository(repo, seat)
    assert err.value.code == "checkpoint-exists"
    assert (seat / "repo.bundle").read_bytes() == b"earlier capture"


@pytest.mark.anyio
async def test_capture_of_a_clean_detached_repository(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    write(repo / "a.txt", "a\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "a")
    git(repo, "checkout", "-q", "--detach")
    seat = seat_dir_for(tmp_path)
    record = await capture_repository(repo, seat)
    assert record.head is None
    assert record.status == ""
    assert record.index_diff.bytes == 0 and record.worktree_diff.bytes == 0
    assert record.intent_to_add == []


@pytest.mark.anyio
async def test_an_intent_to_add_entry_over_an_empty_committed_file_is_not_dropped(
    tmp_path: Path,
) -> None:
    repo = init_repo(tmp_path / "repo")
    write(repo / "empty.txt", "")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "empty")
    # The entry `git add -N` leaves names the empty blob, as HEAD does: only the entry's flag
    # tells it from a staged empty file, so a diff-based reading would lose it and the restore
    # would bring back a different status. The record cannot express `DA`, so the cut refuses.
    git(repo, "rm", "-q", "--cached", "empty.txt")
    git(repo, "add", "-N", "empty.txt")
    with pytest.raises(Refusal) as err:
        await capture_repository(repo, seat_dir_for(tmp_path))
    assert err.value.code == "capture-inconsistent"
    assert "empty.txt" in err.value.message
