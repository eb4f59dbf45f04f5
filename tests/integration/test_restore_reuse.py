"""The restore builds on admission's unbundle (docs/design.md, decision 20): admission keeps the
scratch repository it proved each seat's bundle chain in, and the restore moves its packs into
the staging instead of indexing the same bundles again. Real git throughout; a pack that moved
keeps its inode, which is how these tests tell the reuse path from the fallback."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from manager.checkpoint import admit
from manager.checkpoint.admit import Scratch, check_repository, open_scratch
from manager.checkpoint.chain import Link
from manager.checkpoint.gitstate import capture_repository
from manager.checkpoint.restore import restore_repository
from manager.procs import process_start_time
from protocol.checkpoint import IncrementalLink, RepositoryRecord, parse_refs_list
from protocol.errors import Refusal
from tests.ckpt import Cut, broker_args, make_cut, move_source_away
from tests.conftest import Cli, SharedBroker
from tests.gitrepo import git, init_repo, make_rich_repo, stash_list, tree_digest, write

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

STAMP = "20261129T140000Z"


def observe(repo: Path) -> dict[str, object]:
    # Ignored files are outside the selection rule and do not travel.
    ignored = {
        p.decode()
        for p in git(repo, "ls-files", "-o", "-i", "--exclude-standard", "-z").split(b"\0")
        if p
    }
    return {
        "refs": git(repo, "for-each-ref", "--format=%(objectname) %(refname)"),
        "head": git(repo, "symbolic-ref", "-q", "HEAD", check=False),
        "status": git(repo, "status", "--porcelain=v1", "-z", "--untracked-files=all"),
        "index": git(repo, "ls-files", "-s", "-z"),
        "stash": stash_list(repo),
        "tree": {k: v for k, v in tree_digest(repo).items() if k not in ignored},
    }


def packs(gitdir: Path) -> dict[str, int]:
    """Each pack file's name and inode."""
    pack_dir = gitdir / "objects" / "pack"
    return {name: os.lstat(pack_dir / name).st_ino for name in sorted(os.listdir(pack_dir))}


async def capture(
    tmp_path: Path, repo: Path, name: str, since: IncrementalLink | None = None
) -> tuple[Path, RepositoryRecord]:
    seat = tmp_path / name / "default"
    seat.mkdir(parents=True, mode=0o700)
    record = await capture_repository(
        repo, seat, prerequisites=since.prerequisites if since else (), since=since
    )
    return seat, record


def link_after(seat: Path, name: str, record: RepositoryRecord) -> IncrementalLink:
    refs = parse_refs_list((seat / "refs.txt").read_bytes()) if record.refs else {}
    commits = list(dict.fromkeys([record.base, *refs.values(), *(s.oid for s in record.stash)]))
    return IncrementalLink(
        attempt_id=name,
        checkpoint_sha256="0" * 64,
        bundle_sha256=record.bundle.sha256 if record.bundle else None,
        prerequisites=commits,
    )


def private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True)
    return path


async def test_the_reuse_path_and_the_fallback_restore_the_same_tree(tmp_path: Path) -> None:
    repo = make_rich_repo(tmp_path / "src")
    seat, record = await capture(tmp_path, repo, "A")
    want = observe(repo)
    keep = private_dir(tmp_path / "scratch")

    kept = check_repository("default", seat, record, keep=keep / "seat-0.git")
    assert kept is not None and kept.repo == keep / "seat-0.git"
    before = packs(kept.repo)
    assert set(before) == kept.packs and any(n.endswith(".pack") for n in before)
    reused = tmp_path / "dest" / "reused"
    await restore_repository(seat, record, reused, stamp=STAMP, scratch=kept)
    # Moved, not indexed again: the very files admission wrote, and none left behind.
    assert packs(reused / ".git") == before
    assert packs(kept.repo) == {}
    assert observe(reused) == want

    # The scratch is gone (a crash, another filesystem): the bundle is unbundled as before.
    again = check_repository("default", seat, record, keep=keep / "seat-1.git")
    assert again is not None
    shutil.rmtree(again.repo)
    fallback = tmp_path / "dest" / "fallback"
    await restore_repository(seat, record, fallback, stamp=STAMP, scratch=again)
    assert set(packs(fallback / ".git")) == set(before)
    assert observe(fallback) == want
    assert tree_digest(fallback) == tree_digest(reused)

    # Without a scratch at all (`checkpoint verify`'s admission keeps none): the same tree.
    assert check_repository("default", seat, record) is None
    plain = tmp_path / "dest" / "plain"
    await restore_repository(seat, record, plain, stamp=STAMP)
    assert observe(plain) == want


async def test_a_scratch_that_is_not_as_admission_left_it_is_not_adopted(tmp_path: Path) -> None:
    repo = make_rich_repo(tmp_path / "src")
    seat, record = await capture(tmp_path, repo, "A")
    want = observe(repo)
    keep = private_dir(tmp_path / "scratch")

    # A pack file admission did not see: nothing of the scratch is taken.
    extra = check_repository("default", seat, record, keep=keep / "seat-0.git")
    assert extra is not None
    stray = extra.repo / "objects" / "pack" / f"pack-{'0' * 40}.pack"
    stray.write_bytes(b"not admission's\n")
    seen = packs(extra.repo)
    target = tmp_path / "dest" / "extra"
    await restore_repository(seat, record, target, stamp=STAMP, scratch=extra)
    assert packs(extra.repo) == seen
    assert observe(target) == want
    assert not (target / ".git" / "objects" / "pack" / stray.name).exists()

    # The pack directory swapped for a symlink: it is not followed, and what it names stays.
    linked = check_repository("default", seat, record, keep=keep / "seat-1.git")
    assert linked is not None
    elsewhere = linked.repo.parent / "elsewhere"
    os.rename(linked.repo / "objects" / "pack", elsewhere)
    os.symlink(elsewhere, linked.repo / "objects" / "pack")
    seen = {n: os.lstat(elsewhere / n).st_ino for n in os.listdir(elsewhere)}
    target = tmp_path / "dest" / "linked"
    await restore_repository(seat, record, target, stamp=STAMP, scratch=linked)
    assert {n: os.lstat(elsewhere / n).st_ino for n in os.listdir(elsewhere)} == seen
    assert observe(target) == want

    # A scratch whose packs are another seat's: the names differ, so it is not adopted.
    other_repo = init_repo(tmp_path / "other")
    write(other_repo / "x.txt", "another repository\n")
    git(other_repo, "add", "-A")
    git(other_repo, "commit", "-q", "-m", "other")
    other_seat, other_record = await capture(tmp_path, other_repo, "O")
    other = check_repository("default", other_seat, other_record, keep=keep / "seat-2.git")
    mine = check_repository("default", seat, record, keep=keep / "seat-3.git")
    assert other is not None and mine is not None
    mixed = Scratch(other.repo, mine.packs)
    target = tmp_path / "dest" / "mixed"
    await restore_repository(seat, record, target, stamp=STAMP, scratch=mixed)
    assert set(packs(other.repo)) == other.packs
    assert observe(target) == want


async def test_an_incremental_chain_restores_through_the_reuse_path(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "src")
    for i in range(3):
        noise = b"".join(hashlib.sha256(f"{i}-{k}".encode()).digest() for k in range(4096))
        write(repo / f"blob{i}.bin", noise)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"commit {i}")
    seat_a, a = await capture(tmp_path, repo, "A")
    write(repo / "blob1.bin", b"changed\n")
    git(repo, "commit", "-q", "-am", "change blob1")
    write(repo / "blob2.bin", b"stashed change\n")
    git(repo, "stash", "push", "-q", "-m", "wip")
    write(repo / "blob0.bin", b"unstaged at B\n")
    seat_b, b = await capture(tmp_path, repo, "B", link_after(seat_a, "A", a))
    assert b.since is not None and b.bundle is not None
    want = observe(repo)

    chain = [Link(attempt_id="A", seat_dir=seat_a, bundle=a.bundle)]
    keep = private_dir(tmp_path / "scratch")
    kept = check_repository("default", seat_b, b, chain, keep=keep / "seat-0.git")
    assert kept is not None
    before = packs(kept.repo)
    # One pack per bundle of the chain, each with its index.
    assert sum(n.endswith(".pack") for n in before) == 2
    assert sum(n.endswith(".idx") for n in before) == 2
    target = tmp_path / "dest" / "work"
    await restore_repository(seat_b, b, target, stamp=STAMP, links=chain, scratch=kept)
    assert packs(target / ".git") == before and packs(kept.repo) == {}
    assert observe(target) == want
    assert b"wip" in stash_list(target)


def test_a_leftover_scratch_of_a_process_that_is_gone_is_removed_never_reused(
    tmp_path: Path,
) -> None:
    parent = tmp_path / ".cotal" / admit.SCRATCH_DIR
    me, started = os.getpid(), process_start_time(os.getpid())
    assert started is not None
    # A run with this pid that is gone (another start time), and one still running (this one).
    gone = parent / f"admit-{me}-{started + 1}-{'a' * 12}"
    live = parent / f"admit-{me}-{started}-{'b' * 12}"
    other = parent / "not-a-scratch"
    for path in (gone / "seat-0.git" / "objects" / "pack", live, other):
        path.mkdir(parents=True)
    write(gone / "seat-0.git" / "objects" / "pack" / f"pack-{'1' * 40}.pack", "stale\n")

    made = open_scratch(parent)
    assert made.parent == parent and made not in (gone, live)
    assert sorted(os.listdir(parent)) == sorted([made.name, live.name, other.name])
    assert os.stat(parent).st_mode & 0o777 == 0o700
    assert os.stat(made).st_mode & 0o777 == 0o700
    assert os.listdir(made) == []
    # On a fresh root the control directory it makes is private too.
    fresh = open_scratch(tmp_path / "fresh" / ".cotal" / admit.SCRATCH_DIR)
    assert os.stat(fresh.parent.parent).st_mode & 0o777 == 0o700

    # A symlink in the scratch's place is refused, not followed.
    shutil.rmtree(parent)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", parent)
    with pytest.raises(Refusal, match="not a plain directory"):
        open_scratch(parent)
    assert os.listdir(tmp_path / "elsewhere") == []


@pytest.fixture
def cut(cli: Cli, shared_broker: SharedBroker, tmp_path: Path) -> Cut:
    return make_cut(cli, shared_broker, tmp_path / "ckpt")


async def test_the_resume_removes_a_planted_leftover_and_leaves_no_scratch(
    cli: Cli, cut: Cut
) -> None:
    """Through `cotal up --restore`: a refusal after admission leaves no scratch; a leftover a
    crashed run left is removed, not used; after the restore none remains."""
    move_source_away(cut)
    scratch = cli.root / ".cotal" / admit.SCRATCH_DIR

    proc = cli.run(
        "up",
        "--restore",
        str(cut.copy),
        "--json",
        "--space",
        "other",
        *broker_args(cut.broker),
        *cut.trust,
        check=False,
    )
    assert proc.returncode == 2 and "wrong-space" in proc.stderr, proc.stderr
    assert not scratch.exists()
    assert not (cli.root / ".cotal").exists()

    # What a run killed between admission and the restore leaves: a scratch whose pack is not
    # this checkpoint's. Were it used, the restore could not prove the recorded base.
    (cli.root / ".cotal").mkdir(mode=0o700)
    leftover = scratch / f"admit-999999999-1-{'c' * 12}" / "seat-0.git"
    pack_dir = leftover / "objects" / "pack"
    pack_dir.mkdir(parents=True, mode=0o700)
    (pack_dir / f"pack-{'2' * 40}.pack").write_bytes(b"from a run that died\n")
    (pack_dir / f"pack-{'2' * 40}.idx").write_bytes(b"from a run that died\n")
    try:
        proc = cli.run(
            "up", "--restore", str(cut.copy), "--json", *broker_args(cut.broker), *cut.trust
        )
        out = json.loads(proc.stdout)
        assert out["journal"] == "retired"
        assert not scratch.exists()
        assert (cli.root / "tracked.txt").read_text() == "alpha\nbeta changed\n"
        assert (cli.root / "notes-untracked.txt").read_text() == "untracked at the cut\n"
        assert git(cli.root, "fsck", "--no-dangling", "--no-progress") == b""
    finally:
        cli.run("down", check=False)
