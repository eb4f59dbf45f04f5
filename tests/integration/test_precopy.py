"""The pre-copy link against real git: a capture on top of the history `cotal move` shipped before
its fence carries only the increment, and a destination proves the shipped bundle by the digest
the record pins before it restores on top of it (manager/checkpoint/chain.py; the whole move is
tests/e2e/test_move_precopy.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import msgspec
import pytest

from manager.checkpoint import chain
from manager.checkpoint.admit import check_repository
from manager.checkpoint.gitstate import capture_repository
from manager.checkpoint.restore import restore_repository
from protocol.checkpoint import PrecopyLink, RepositoryRecord
from protocol.codec import encode_json
from protocol.errors import Refusal
from tests.gitrepo import git
from tests.integration.test_incremental import STAMP, big_repo, observe

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]


def ship(repo: Path, store: Path) -> PrecopyLink:
    """What `cotal move` does before the fence: the whole history as one bundle, by digest."""
    store.mkdir(mode=0o700, exist_ok=True)
    part = store / "shipping.part"
    git(repo, "bundle", "create", "--quiet", str(part), "--all")
    data = part.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    os.rename(part, store / chain.precopy_file(sha))
    tips = git(repo, "bundle", "list-heads", str(store / chain.precopy_file(sha)))
    commits = list(dict.fromkeys(line.split()[0] for line in tips.decode().splitlines() if line))
    return PrecopyLink(bundle_sha256=sha, bundle_bytes=len(data), prerequisites=commits)


async def capture_on(repo: Path, seat: Path, shipped: PrecopyLink) -> RepositoryRecord:
    seat.mkdir(parents=True, mode=0o700)
    link = await chain.precopy_link(repo, shipped)
    assert link is not None
    return await capture_repository(repo, seat, prerequisites=link.prerequisites, precopy=link)


async def test_the_cut_carries_only_the_increment_and_restores_on_the_shipped_history(
    tmp_path: Path,
) -> None:
    repo = big_repo(tmp_path / "src")
    store = tmp_path / "precopy"
    shipped = ship(repo, store)
    # The seat worked on after the pre-copy: a commit and a changed file.
    (repo / "blob1.bin").write_bytes(b"changed after the pre-copy\n")
    git(repo, "commit", "-q", "-am", "after the pre-copy")
    (repo / "blob0.bin").write_bytes(b"unstaged at the cut\n")
    want = observe(repo)

    attempt = tmp_path / "checkpoints" / "A"
    record = await capture_on(repo, attempt / "default", shipped)
    assert record.since is None and record.precopy is not None
    assert record.precopy.bundle_sha256 == shipped.bundle_sha256
    assert record.bundle is not None and record.bundle.bytes * 20 < shipped.bundle_bytes
    assert record.incremental and record.prerequisites == shipped.prerequisites

    links = chain.resolve(attempt, "default", record, space="s", trusted_keys=(), search=[store])
    assert [(link.attempt_id, link.seat_dir) for link in links] == [(chain.PRECOPY_LABEL, store)]
    check_repository("default", attempt / "default", record, links)
    target = tmp_path / "dest" / "work"
    await restore_repository(attempt / "default", record, target, stamp=STAMP, links=links)
    assert observe(target) == want


async def test_an_unchanged_history_needs_no_bundle_in_the_cut(tmp_path: Path) -> None:
    repo = big_repo(tmp_path / "src")
    shipped = ship(repo, tmp_path / "precopy")
    record = await capture_on(repo, tmp_path / "A" / "default", shipped)
    assert record.bundle is None and record.precopy is not None
    assert not (tmp_path / "A" / "default" / "repo.bundle").exists()


async def test_a_missing_or_altered_shipped_history_is_refused_by_name(tmp_path: Path) -> None:
    repo = big_repo(tmp_path / "src")
    store = tmp_path / "precopy"
    shipped = ship(repo, store)
    git(repo, "commit", "-q", "--allow-empty", "-m", "after")
    attempt = tmp_path / "checkpoints" / "A"
    record = await capture_on(repo, attempt / "default", shipped)
    bundle = store / chain.precopy_file(shipped.bundle_sha256)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(Refusal) as missing:
        chain.resolve(attempt, "default", record, space="s", trusted_keys=(), search=[elsewhere])
    assert missing.value.code == "predecessor-missing"
    assert f"bundle {chain.precopy_file(shipped.bundle_sha256)}" in missing.value.message
    assert "rerun the same `cotal move`" in missing.value.cure

    data = bytearray(bundle.read_bytes())
    data[-1] ^= 0xFF
    bundle.write_bytes(bytes(data))
    with pytest.raises(Refusal) as altered:
        chain.resolve(attempt, "default", record, space="s", trusted_keys=(), search=[store])
    assert altered.value.code == "integrity"

    # And a restore that is given no link for the record refuses before it writes anything.
    target = tmp_path / "dest" / "work"
    with pytest.raises(Refusal) as unlinked:
        await restore_repository(attempt / "default", record, target, stamp=STAMP)
    assert unlinked.value.code == "predecessor-missing"
    assert "the history a move pre-copied" in unlinked.value.message
    assert not target.exists()


async def test_a_record_names_one_base_only(tmp_path: Path) -> None:
    repo = big_repo(tmp_path / "src")
    shipped = ship(repo, tmp_path / "precopy")
    record = await capture_on(repo, tmp_path / "A" / "default", shipped)
    doc = msgspec.json.decode(encode_json(record))
    doc["since"] = {
        "attemptId": "20261129T140000Z-0123abcd",
        "checkpointSha256": "0" * 64,
        "bundleSha256": None,
        "prerequisites": [],
    }
    with pytest.raises(msgspec.ValidationError, match="not both"):
        msgspec.json.decode(msgspec.json.encode(doc), type=RepositoryRecord)


async def test_a_seed_stands_for_the_shipped_bundle_and_is_linked_not_unbundled(
    tmp_path: Path,
) -> None:
    """The destination's mover indexes the shipped bundle once, into `<sha>.seed`, and drops
    the bundle: admission links the seed's packs into its scratch repository, and the restore
    adopts them, so the history is not unbundled inside the move's window."""
    repo = big_repo(tmp_path / "src")
    store = tmp_path / "precopy"
    shipped = ship(repo, store)
    bundle = store / chain.precopy_file(shipped.bundle_sha256)
    seed = store / chain.precopy_seed(shipped.bundle_sha256)
    git(store, "init", "--quiet", "--bare", "--template=", str(seed))
    git(seed, "bundle", "unbundle", str(bundle))
    bundle.unlink()
    git(repo, "commit", "-q", "--allow-empty", "-m", "after the pre-copy")
    want = observe(repo)
    attempt = tmp_path / "checkpoints" / "A"
    record = await capture_on(repo, attempt / "default", shipped)

    links = chain.resolve(attempt, "default", record, space="s", trusted_keys=(), search=[store])
    assert [(link.seed, link.bundle) for link in links] == [(seed, None)]
    keep = tmp_path / "scratch"
    keep.mkdir(mode=0o700)
    scratch = check_repository("default", attempt / "default", record, links, keep=keep / "r")
    assert scratch is not None
    seed_packs = {p.name: p.stat().st_ino for p in (seed / "objects" / "pack").iterdir()}
    planted = {p.name: p.stat().st_ino for p in (keep / "r" / "objects" / "pack").iterdir()}
    # Hard links of the seed's own packs, beside the increment's one pack.
    assert set(seed_packs) < set(planted)
    assert all(planted[n] == ino for n, ino in seed_packs.items())
    target = tmp_path / "dest" / "work"
    await restore_repository(
        attempt / "default", record, target, stamp=STAMP, links=links, scratch=scratch
    )
    assert observe(target) == want

    # Without the scratch, the restore plants the seed itself.
    again = tmp_path / "dest" / "again"
    await restore_repository(attempt / "default", record, again, stamp=STAMP, links=links)
    assert observe(again) == want


async def test_a_grown_seed_becomes_the_staging_tree_and_its_bundle_serves_a_rerun(
    tmp_path: Path,
) -> None:
    """The mover's seed has its HEAD checked out: the restore takes it as its staging tree (the
    history and the unchanged files are there already), and the bundle kept beside it serves
    a restore that runs again once the seed is spent."""
    repo = big_repo(tmp_path / "src")
    store = tmp_path / "precopy"
    shipped = ship(repo, store)
    seed = store / chain.precopy_seed(shipped.bundle_sha256)
    bundle = store / chain.precopy_file(shipped.bundle_sha256)
    await chain.grow_seed(bundle, seed, cure="ship it again")
    assert (seed / ".git").is_dir() and (seed / "blob0.bin").is_file()
    (repo / "blob1.bin").write_bytes(b"changed after the pre-copy\n")
    git(repo, "commit", "-q", "-am", "after the pre-copy")
    (repo / "blob2.bin").write_bytes(b"unstaged at the cut\n")
    want = observe(repo)
    attempt = tmp_path / "checkpoints" / "A"
    record = await capture_on(repo, attempt / "default", shipped)

    links = chain.resolve(attempt, "default", record, space="s", trusted_keys=(), search=[store])
    keep = tmp_path / "scratch"
    keep.mkdir(mode=0o700)
    scratch = check_repository("default", attempt / "default", record, links, keep=keep / "r")
    target = tmp_path / "dest" / "work"
    await restore_repository(
        attempt / "default", record, target, stamp=STAMP, links=links, scratch=scratch
    )
    assert observe(target) == want
    # The seed is spent (it became the tree); the bundle stays for a run after a failure.
    assert not seed.exists() and bundle.is_file()
    again = chain.resolve(attempt, "default", record, space="s", trusted_keys=(), search=[store])
    assert [(link.seed, link.bundle is not None) for link in again] == [(None, True)]
    rerun = tmp_path / "dest" / "rerun"
    await restore_repository(attempt / "default", record, rerun, stamp=STAMP, links=again)
    assert observe(rerun) == want
