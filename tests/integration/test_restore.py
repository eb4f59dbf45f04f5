"""Capture -> restore round trips and every restore refusal, against real git."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import tarfile
import time
from pathlib import Path

import msgspec
import pytest

from manager.checkpoint.confine import place_session_file, session_destination
from manager.checkpoint.gitstate import capture_repository, settle_stat_data
from manager.checkpoint.restore import restore_repository
from protocol.checkpoint import FileRef, RepositoryRecord, SessionFile
from protocol.errors import Refusal
from tests.gitrepo import (
    full_digest,
    git,
    init_repo,
    make_rich_repo,
    seat_dir_for,
    tree_digest,
    write,
)

pytestmark = pytest.mark.usefixtures("isolated_home")

STAMP = "20261129T140000Z"


def observe(repo: Path) -> dict[str, object]:
    """Everything a seat could notice about its repository, compared source against restore."""
    stash = git(repo, "rev-parse", "-q", "--verify", "refs/stash", check=False).strip()
    # Ignored files are outside the selection rule (record open point 8) and do not travel.
    ignored = {
        p.decode()
        for p in git(repo, "ls-files", "-o", "-i", "--exclude-standard", "-z").split(b"\0")
        if p
    }
    tree = {path: entry for path, entry in tree_digest(repo).items() if path not in ignored}
    return {
        "status": git(
            repo,
            "status",
            "--porcelain=v1",
            "-z",
            "--untracked-files=all",
            "--",
            ":(exclude).cotal",
        ),
        "status_renames": git(repo, "status", "--porcelain", "--", ":(exclude).cotal"),
        "cached": git(repo, "diff", "--cached", "--binary", "--full-index"),
        "worktree": git(repo, "diff", "--binary", "--full-index"),
        "index": git(repo, "ls-files", "-s", "-z"),
        "refs": git(repo, "for-each-ref", "--format=%(objectname) %(refname)"),
        "head": git(repo, "symbolic-ref", "-q", "HEAD", check=False),
        "head_commit": git(repo, "rev-parse", "HEAD"),
        "stash": stash,
        "stash_list": git(repo, "stash", "list", "--format=%H"),
        "tree": tree,
    }


async def capture(
    tmp_path: Path, repo: Path, name: str = "default"
) -> tuple[Path, RepositoryRecord]:
    seat = seat_dir_for(tmp_path, name)
    return seat, await capture_repository(repo, seat)


def replace_file(seat: Path, ref: FileRef, data: bytes) -> FileRef:
    """Swap a captured file for other bytes and return a FileRef that matches them.

    The restore re-verifies digests first; a hostile checkpoint has consistent digests, so the
    refusals under test must come from the restore's own rules, not from the digest check.
    """
    path = seat / ref.file
    os.chmod(path, 0o600)
    path.unlink()
    path.write_bytes(data)
    return FileRef(file=ref.file, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())


def make_tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return buf.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = 0o644
    return info


# -- round trips ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_round_trip_reproduces_every_kind_of_change(tmp_path: Path) -> None:
    repo = make_rich_repo(tmp_path / "src")
    seat, record = await capture(tmp_path, repo)
    target = tmp_path / "dest" / "work"

    result = await restore_repository(seat, record, target, stamp=STAMP)

    assert result.superseded is None and result.head == "refs/heads/main"
    want, got = observe(repo), observe(target)
    for key in want:
        assert got[key] == want[key], key
    assert want["stash"] and want["stash_list"]
    assert not (target / ".cotal").exists() and not (target / ".env").exists()
    assert not os.path.lexists(Path(f"{target}.incoming"))
    # The clone's remote pointed at the checkpoint; the seat never had one.
    assert b"origin" not in git(target, "remote")


def index_entries(repo: Path) -> dict[str, tuple[int, int]]:
    """Each index entry's recorded file time (whole seconds) and size, from `ls-files --debug`."""
    entries: dict[str, tuple[int, int]] = {}
    path, mtime = "", 0
    for line in git(repo, "ls-files", "--debug").decode().splitlines():
        if not line.startswith(" "):
            path = line
        elif line.strip().startswith("mtime:"):
            mtime = int(line.split()[1].split(":")[0])
        elif line.strip().startswith("size:"):
            entries[path] = (mtime, int(line.split()[1]))
    return entries


@pytest.mark.anyio
async def test_the_restored_index_is_not_racy(tmp_path: Path) -> None:
    # An entry whose file time is not older than the index is hashed again by every reader
    # that does not write the index (a cut's inspections, the seat's own status); the restore
    # writes its tree and its index within one second, so it dates that second's files back.
    repo = make_rich_repo(tmp_path / "src")
    seat, record = await capture(tmp_path, repo)
    target = tmp_path / "dest" / "work"

    await restore_repository(seat, record, target, stamp=STAMP)

    index_second = int(os.stat(target / ".git" / "index").st_mtime)
    # A file that differs from its entry is compared by content whatever its stat data say.
    differing = set(git(target, "diff-files", "--name-only", "-z").decode().split("\0"))
    entries = {p: e for p, e in index_entries(target).items() if p not in differing}
    assert len(entries) >= 5
    for path, (mtime, size) in entries.items():
        assert mtime < index_second, path
        st = os.lstat(target / path)
        if stat.S_ISREG(st.st_mode):
            # A racily clean entry is written with its size zeroed; none may be.
            assert size == st.st_size, path
            assert int(st.st_mtime) == mtime, path
    assert observe(target) == observe(repo)


def test_settling_dates_back_only_this_seconds_files_and_follows_no_link(tmp_path: Path) -> None:
    top = tmp_path / "tree"
    (top / ".git").mkdir(parents=True)
    (top / ".git" / "index").write_bytes(b"not ours to touch")
    (top / "sub" / "deeper").mkdir(parents=True)
    (top / "sub" / "deeper" / "new.txt").write_text("new\n")
    (top / "old.txt").write_text("old\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("elsewhere\n")
    os.symlink(outside, top / "link")
    os.symlink(tmp_path / "missing", top / "dangling")
    old_ns = 1_600_000_000 * 1_000_000_000
    os.utime(top / "old.txt", ns=(old_ns, old_ns))
    os.utime(outside, ns=(old_ns, old_ns))
    git_before = os.stat(top / ".git" / "index").st_mtime_ns

    before = time.time_ns() // 1_000_000_000
    settle_stat_data(top)
    after = time.time_ns() // 1_000_000_000

    for name in ("sub/deeper/new.txt", "link", "dangling"):
        mtime = os.lstat(top / name).st_mtime_ns
        assert mtime % 1_000_000_000 == 0, name
        assert before - 1 <= mtime // 1_000_000_000 <= after - 1, name
    assert os.lstat(top / "old.txt").st_mtime_ns == old_ns
    assert os.stat(outside).st_mtime_ns == old_ns
    assert os.stat(top / ".git" / "index").st_mtime_ns == git_before


@pytest.mark.anyio
async def test_round_trip_of_a_detached_head_and_extra_refs(tmp_path: Path) -> None:
    repo = make_rich_repo(tmp_path / "src")
    git(repo, "update-ref", "refs/notes/custom", "HEAD")
    git(repo, "update-ref", "refs/remotes/origin/main", "HEAD")
    git(repo, "checkout", "-q", "--detach")
    seat, record = await capture(tmp_path, repo)
    assert record.head is None
    target = tmp_path / "work"
    await restore_repository(seat, record, target, stamp=STAMP)
    want, got = observe(repo), observe(target)
    for key in want:
        assert got[key] == want[key], key


@pytest.mark.anyio
async def test_round_trip_of_file_and_directory_swaps(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "src")
    write(repo / "was_dir/inner.txt", "inner\n")
    write(repo / "was_file", "file\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "shapes")
    (repo / "was_dir/inner.txt").unlink()
    (repo / "was_dir").rmdir()
    write(repo / "was_dir", "now a file\n")
    (repo / "was_file").unlink()
    write(repo / "was_file/inside.txt", "now a directory\n")
    seat, record = await capture(tmp_path, repo)
    target = tmp_path / "work"
    await restore_repository(seat, record, target, stamp=STAMP)
    want, got = observe(repo), observe(target)
    for key in want:
        assert got[key] == want[key], key


@pytest.mark.anyio
async def test_single_root_keeps_the_control_dir_in_place(tmp_path: Path) -> None:
    repo = make_rich_repo(tmp_path / "src")
    seat_src, record = await capture(tmp_path, repo)
    # The destination root: an older tree, plus its own .cotal holding a live control file and
    # the checkpoint itself, as in the ordinary single-root case.
    target = init_repo(tmp_path / "root")
    write(target / "stale.txt", "from an earlier life\n")
    git(target, "add", "stale.txt")
    git(target, "commit", "-q", "-m", "stale")
    write(target / ".cotal" / "mesh.json", '{"pid": 1}\n')
    seat = target / ".cotal" / "maintenance" / "v1" / "checkpoints" / "a1" / "default"
    shutil.copytree(seat_src, seat)
    control_before = tree_digest(target / ".cotal", skip=(), times=True)
    control_inode = os.lstat(target / ".cotal").st_ino

    result = await restore_repository(seat, record, target, stamp=STAMP)

    assert os.lstat(target / ".cotal").st_ino == control_inode
    assert tree_digest(target / ".cotal", skip=(), times=True) == control_before
    assert result.superseded == tmp_path / f"root.superseded.{STAMP}"
    assert (result.superseded / "stale.txt").read_text() == "from an earlier life\n"
    assert (result.superseded / ".git").is_dir() and not (result.superseded / ".cotal").exists()
    want, got = observe(repo), observe(target)
    for key in want:
        assert got[key] == want[key], key
    assert not os.path.lexists(tmp_path / "root.incoming")


@pytest.mark.anyio
async def test_an_existing_target_without_control_dir_is_renamed_aside(tmp_path: Path) -> None:
    repo = make_rich_repo(tmp_path / "src")
    seat, record = await capture(tmp_path, repo)
    target = tmp_path / "work"
    write(target / "old.txt", "old\n")
    (tmp_path / f"work.superseded.{STAMP}").mkdir()  # an earlier move aside with the same stamp
    result = await restore_repository(seat, record, target, stamp=STAMP)
    assert result.superseded == tmp_path / f"work.superseded.{STAMP}.1"
    assert (result.superseded / "old.txt").read_text() == "old\n"
    assert observe(target)["tree"] == observe(repo)["tree"]


# -- refusals leave the target untouched ------------------------------------------------------


async def _refused(seat: Path, record: RepositoryRecord, target: Path, code: str) -> Refusal:
    before = full_digest(target)
    with pytest.raises(Refusal) as err:
        await restore_repository(seat, record, target, stamp=STAMP)
    assert err.value.code == code, err.value.text
    assert full_digest(target) == before
    return err.value


@pytest.fixture
async def captured(tmp_path: Path) -> tuple[Path, Path, RepositoryRecord, Path]:
    repo = make_rich_repo(tmp_path / "src")
    seat, record = await capture(tmp_path, repo)
    target = init_repo(tmp_path / "work")
    write(target / "keep.txt", "the destination's own tree\n")
    write(target / ".cotal" / "mesh.json", "{}\n")
    return repo, seat, record, target


@pytest.mark.anyio
async def test_leftover_staging_refuses_and_is_never_deleted(
    captured: tuple[Path, Path, RepositoryRecord, Path],
) -> None:
    _, seat, record, target = captured
    leftover = Path(f"{target}.incoming")
    write(leftover / "evidence.txt", "what failed last time\n")
    err = await _refused(seat, record, target, "staging-exists")
    assert (
        "evidence of an earlier failed restore" in err.message
        and "remove it by hand" in err.message
    )
    assert (leftover / "evidence.txt").read_text() == "what failed last time\n"


@pytest.mark.anyio
async def test_base_absent_from_bundle_refuses(
    captured: tuple[Path, Path, RepositoryRecord, Path], tmp_path: Path
) -> None:
    _, seat, record, target = captured
    other = init_repo(tmp_path / "other")
    write(other / "x", "x\n")
    git(other, "add", "x")
    git(other, "commit", "-q", "-m", "unrelated")
    foreign = git(other, "rev-parse", "HEAD").decode().strip()
    err = await _refused(
        seat, msgspec.structs.replace(record, base=foreign), target, "base-missing"
    )
    staging = Path(f"{target}.incoming")
    assert str(staging) in err.message and staging.is_dir()


@pytest.mark.anyio
async def test_a_diff_that_does_not_apply_refuses(
    captured: tuple[Path, Path, RepositoryRecord, Path],
) -> None:
    _, seat, record, target = captured
    bogus = (
        b"diff --git a/tracked.txt b/tracked.txt\n--- a/tracked.txt\n+++ b/tracked.txt\n"
        b"@@ -1,3 +1,3 @@\n not\n-in\n+the\n base\n"
    )
    ref = replace_file(seat, record.index_diff, bogus)
    err = await _refused(
        seat, msgspec.structs.replace(record, index_diff=ref), target, "apply-failed"
    )
    assert "left as the evidence" in err.message


@pytest.mark.anyio
async def test_a_status_the_tree_does_not_reproduce_refuses_before_promotion(
    captured: tuple[Path, Path, RepositoryRecord, Path],
) -> None:
    _, seat, record, target = captured
    forged = msgspec.structs.replace(record, status=record.status + "?? invented.txt\x00")
    err = await _refused(seat, forged, target, "restore-mismatch")
    assert "invented.txt" in err.message


@pytest.mark.anyio
async def test_a_tampered_file_refuses_before_any_write(
    captured: tuple[Path, Path, RepositoryRecord, Path],
) -> None:
    _, seat, record, target = captured
    path = seat / record.worktree_diff.file
    data = bytearray(path.read_bytes())
    data[10] ^= 0x01
    os.chmod(path, 0o600)
    path.write_bytes(bytes(data))
    await _refused(seat, record, target, "integrity")
    assert not os.path.lexists(Path(f"{target}.incoming"))


@pytest.mark.anyio
@pytest.mark.parametrize(
    "members",
    [
        pytest.param([(member("../escape.txt"), b"x")], id="dotdot"),
        pytest.param([(member("/etc/cotal-escape"), b"x")], id="absolute"),
        pytest.param(
            [
                (member("lnk", tarfile.SYMTYPE, "../outside"), None),
                (member("lnk/escape.txt"), b"x"),
            ],
            id="symlink-then-write",
        ),
        pytest.param([(member("hard", tarfile.LNKTYPE, "README.md"), None)], id="hardlink"),
        pytest.param([(member("dev", tarfile.CHRTYPE), None)], id="device"),
        pytest.param([(member("fifo", tarfile.FIFOTYPE), None)], id="fifo"),
        pytest.param([(member(".git/hooks/post-checkout"), b"#!/bin/sh\n")], id="into-git-dir"),
        pytest.param([(member("link/escape.txt"), b"x")], id="through-tracked-symlink"),
        pytest.param([(member("dup.txt"), b"a"), (member("dup.txt"), b"b")], id="duplicate"),
    ],
)
async def test_hostile_untracked_archives_refuse(
    captured: tuple[Path, Path, RepositoryRecord, Path],
    tmp_path: Path,
    members: list[tuple[tarfile.TarInfo, bytes | None]],
) -> None:
    _, seat, record, target = captured
    outside = tmp_path / "outside"
    outside.mkdir()
    ref = replace_file(seat, record.untracked, make_tar(members))
    await _refused(seat, msgspec.structs.replace(record, untracked=ref), target, "unsafe-archive")
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "escape.txt").exists() and not Path("/etc/cotal-escape").exists()


@pytest.mark.anyio
async def test_a_symlink_target_is_refused(tmp_path: Path) -> None:
    repo = make_rich_repo(tmp_path / "src")
    seat, record = await capture(tmp_path, repo)
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "work")
    with pytest.raises(Refusal) as err:
        await restore_repository(seat, record, tmp_path / "work", stamp=STAMP)
    assert err.value.code == "bad-target"
    assert list(real.iterdir()) == []


# -- session files ----------------------------------------------------------------------------


def test_place_session_file_creates_private_and_accepts_an_identical_copy(tmp_path: Path) -> None:
    src = tmp_path / "ckpt" / "session-store.0"
    write(src, b'{"turn": 1}\n')
    entry = SessionFile(
        anchor="workspace-root",
        relpath=".cotal/sessions/scribe/default.store/log.jsonl",
        file=FileRef(file=src.name, bytes=12, sha256=hashlib.sha256(b'{"turn": 1}\n').hexdigest()),
    )
    root = tmp_path / "root"
    root.mkdir()
    dest = session_destination(entry, cwd=root, workspace_root=root, home=tmp_path / "home")
    assert dest == root / ".cotal/sessions/scribe/default.store/log.jsonl"

    assert place_session_file(src, dest, expected_sha256=entry.file.sha256) == "placed"
    assert dest.read_bytes() == b'{"turn": 1}\n'
    assert stat.S_IMODE(os.lstat(dest).st_mode) == 0o600
    for parent in (root / ".cotal", root / ".cotal/sessions/scribe/default.store"):
        assert stat.S_IMODE(os.lstat(parent).st_mode) == 0o700
    assert place_session_file(src, dest) == "present"
    assert [p.name for p in dest.parent.iterdir()] == ["log.jsonl"]


def test_place_session_file_refuses_a_different_file_naming_both_digests(tmp_path: Path) -> None:
    src = tmp_path / "store.0"
    write(src, b"checkpoint transcript\n")
    dest = tmp_path / "dest" / "log.jsonl"
    write(dest, b"a different transcript\n")
    with pytest.raises(Refusal) as err:
        place_session_file(src, dest)
    assert err.value.code == "session-conflict"
    assert hashlib.sha256(b"checkpoint transcript\n").hexdigest() in err.value.message
    assert hashlib.sha256(b"a different transcript\n").hexdigest() in err.value.message
    assert dest.read_bytes() == b"a different transcript\n"

    os.unlink(dest)
    os.symlink(src, dest)
    with pytest.raises(Refusal) as err:
        place_session_file(src, dest)
    assert err.value.code == "unsafe-path"
    with pytest.raises(Refusal) as err:
        place_session_file(src, tmp_path / "other", expected_sha256="0" * 64)
    assert err.value.code == "integrity"
