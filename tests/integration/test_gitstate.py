"""Preflight and capture against real git repositories.

The helpers at the top (a git runner, a repository with every kind of change, a tree digest)
are shared with test_restore.py and test_seal_reader.py.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

import pytest

from manager.checkpoint.gitstate import capture_repository, preflight_repository
from protocol.checkpoint import UNTRACKED_SELECTION, parse_refs_list, porcelain_by_path
from protocol.errors import Refusal

AUTH_TOKEN = b"SECRET-AUTH-TOKEN-5c1e0f9a"
DOTENV_TOKEN = b"SECRET-DOTENV-TOKEN-77b2d4"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # The operator's global git config must not leak into what these tests measure.
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    return home


def git(repo: Path, *args: str, stdin: bytes | None = None, check: bool = True) -> bytes:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ["HOME"],
        "GIT_CONFIG_NOSYSTEM": "1",
        "LC_ALL": "C",
        "GIT_AUTHOR_NAME": "Test",
        "GIT_AUTHOR_EMAIL": "test@example.invalid",
        "GIT_COMMITTER_NAME": "Test",
        "GIT_COMMITTER_EMAIL": "test@example.invalid",
    }
    proc = subprocess.run(["git", *args], cwd=repo, env=env, input=stdin, capture_output=True, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr.decode()}")
    return proc.stdout


def write(path: Path, data: bytes | str, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    if mode is not None:
        os.chmod(path, mode)


def init_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    return path


def make_rich_repo(path: Path) -> Path:
    """A repository in every state the capture must carry, plus secrets it must not."""
    repo = init_repo(path)
    write(repo / ".gitignore", ".env\n*.log\n.cotal/\n")
    write(repo / "README.md", "# project\nline two\n")
    write(repo / "tracked.txt", "alpha\nbeta\ngamma\n")
    write(repo / "bin.dat", bytes(range(256)) * 4)
    write(repo / "gone_staged.txt", "delete me in the index\n")
    write(repo / "gone_unstaged.txt", "delete me in the worktree\n")
    write(repo / "old_name.txt", "renamed content\n" * 20)
    write(repo / "script.sh", "#!/bin/sh\necho hi\n", 0o644)
    write(repo / "typechange.txt", "becomes a symlink\n")
    write(repo / "dir/nested.txt", "nested\n")
    os.symlink("README.md", repo / "link")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    git(repo, "tag", "v1")
    git(repo, "tag", "-a", "v1-annotated", "-m", "annotated")
    git(repo, "branch", "feature")
    # A stash: refs/stash is in the bundle but a clone of it drops the ref (peers.md 6).
    write(repo / "tracked.txt", "stashed change\n")
    git(repo, "stash", "push", "-q", "-m", "work in progress")
    write(repo / "README.md", "# project\nline two\nstaged line\n")
    git(repo, "add", "README.md")
    write(repo / "README.md", "# project\nline two\nstaged line\nunstaged line\n")
    write(repo / "tracked.txt", "alpha\nbeta changed\ngamma\n")
    write(repo / "bin.dat", bytes(reversed(range(256))) * 4)
    git(repo, "add", "bin.dat")
    write(repo / "bin.dat", b"\x00\xff" * 700)
    write(repo / "new.bin", b"\x00\x01\x02binary\xfe" * 50)
    git(repo, "add", "new.bin")
    write(repo / "new.bin", b"\x00\x01\x02changed\xfe" * 50)
    git(repo, "rm", "-q", "gone_staged.txt")
    (repo / "gone_unstaged.txt").unlink()
    git(repo, "mv", "old_name.txt", "new_name.txt")
    os.chmod(repo / "script.sh", 0o755)
    (repo / "typechange.txt").unlink()
    os.symlink("tracked.txt", repo / "typechange.txt")
    os.symlink("dir/nested.txt", repo / "staged_link")
    git(repo, "add", "staged_link")
    write(repo / "ita.txt", "intent to add\n")
    git(repo, "add", "-N", "ita.txt")
    write(repo / "ita_gone.txt", "intent to add, then deleted\n")
    git(repo, "add", "-N", "ita_gone.txt")
    (repo / "ita_gone.txt").unlink()
    write(repo / "untracked.txt", "untracked text\n")
    write(repo / "udir/deep/u.bin", b"\x00untracked\xff" * 30)
    write(repo / "uexec.sh", "#!/bin/sh\n", 0o755)
    write(repo / "name with spaces ü.txt", "unicode name\n")
    os.symlink("untracked.txt", repo / "ulink")
    os.symlink("nowhere/at/all", repo / "udangling")
    write(repo / ".env", b"API_KEY=" + DOTENV_TOKEN + b"\n")
    write(repo / "build.log", "ignored log\n")
    write(repo / ".cotal/auth/broker.creds", AUTH_TOKEN + b"\n")
    return repo


def tree_digest(root: Path, *, skip: tuple[str, ...] = (".git", ".cotal"), times: bool = False) -> dict[str, tuple[object, ...]]:
    """Every entry below `root` with its type, mode and content digest (or link target)."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in skip]
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if rel_dir == "." and name in skip:
                continue
            st = os.lstat(path)
            extra: tuple[object, ...] = (st.st_ino, st.st_mtime_ns) if times else ()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path), *extra)
            elif stat.S_ISDIR(st.st_mode):
                if times:
                    out[rel] = ("dir", stat.S_IMODE(st.st_mode), *extra)
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), hashlib.sha256(path.read_bytes()).hexdigest(), *extra)
    return out


def full_digest(root: Path) -> dict[str, tuple[object, ...]]:
    """Byte-for-byte including .git, inodes and mtimes: proves a path was not touched at all."""
    return tree_digest(root, skip=(), times=True) if root.exists() else {}


def seat_dir_for(tmp_path: Path, name: str = "default") -> Path:
    seat = tmp_path / "ckpt" / name
    seat.mkdir(parents=True, mode=0o700)
    return seat


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
async def test_preflight_refuses_an_unborn_head(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    write(repo / "a.txt", "a\n")
    with pytest.raises(Refusal) as err:
        await preflight_repository(repo)
    assert err.value.code == "unborn-head"
    assert "first commit" in err.value.cure


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
async def test_preflight_refuses_submodules_by_name(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    write(repo / "a.txt", "a\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "a")
    head = git(repo, "rev-parse", "HEAD").decode().strip()
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{head},vendor/lib")
    git(repo, "commit", "-q", "-m", "gitlink")
    with pytest.raises(Refusal) as err:
        await preflight_repository(repo)
    assert err.value.code == "submodule"
    assert "vendor/lib" in err.value.message and "open point 9" in err.value.message


@pytest.mark.anyio
async def test_preflight_refuses_tracked_control_dir_nested_repos_and_flags(tmp_path: Path) -> None:
    repo = make_rich_repo(tmp_path / "repo")
    git(repo, "add", "-f", ".cotal/auth/broker.creds")
    with pytest.raises(Refusal) as err:
        await preflight_repository(repo)
    assert err.value.code == "control-dir-tracked"
    assert AUTH_TOKEN.decode() not in err.value.text
    git(repo, "rm", "-q", "--cached", ".cotal/auth/broker.creds")

    git(repo, "update-index", "--skip-worktree", "tracked.txt")
    with pytest.raises(Refusal) as err:
        await preflight_repository(repo)
    assert err.value.code == "index-flags"
    git(repo, "update-index", "--no-skip-worktree", "tracked.txt")

    init_repo(repo / "inner")
    with pytest.raises(Refusal) as err:
        await preflight_repository(repo)
    assert err.value.code == "untracked-unsupported"
    assert "inner/" in err.value.message


@pytest.mark.anyio
async def test_preflight_refuses_a_shallow_clone(tmp_path: Path) -> None:
    src = make_rich_repo(tmp_path / "src")
    git(src, "commit", "-q", "-m", "second")
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{src}", "shallow")
    with pytest.raises(Refusal) as err:
        await preflight_repository(tmp_path / "shallow")
    assert err.value.code == "shallow"


# -- capture ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_capture_writes_private_files_and_a_consistent_record(tmp_path: Path) -> None:
    repo = make_rich_repo(tmp_path / "repo")
    seat = seat_dir_for(tmp_path)
    before = tree_digest(repo, skip=(), times=False)
    index_before = (repo / ".git" / "index").read_bytes()
    phases: list[tuple[str, int]] = []

    record = await capture_repository(repo, seat, progress=lambda phase, done: phases.append((phase, done)))

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
    assert set(refs) >= {"refs/heads/main", "refs/heads/feature", "refs/tags/v1", "refs/tags/v1-annotated"}

    names = sorted(os.listdir(seat))
    assert names == sorted(["repo.bundle", "index.diff", "worktree.diff", "untracked.tar", "refs.txt"])
    for ref in (record.bundle, record.index_diff, record.worktree_diff, record.untracked, record.refs):
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
    assert err.value.code == "exists"
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
