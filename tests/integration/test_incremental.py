"""Incremental captures against real git: a bundle that builds on a predecessor's commits, checked
and restored on top of that predecessor's bundle (manager/checkpoint/chain.py carries the link
between sealed attempts; tests/e2e/test_incremental.py drives it through the real cut)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
import pytest

from manager.checkpoint.admit import check_repository
from manager.checkpoint.chain import Link
from manager.checkpoint.gitstate import capture_repository
from manager.checkpoint.restore import restore_repository
from protocol.checkpoint import FileRef, IncrementalLink, RepositoryRecord, parse_refs_list
from protocol.codec import encode_json
from protocol.errors import Refusal
from tests.gitrepo import git, init_repo, stash_list, tree_digest, write

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

STAMP = "20261129T140000Z"


def big_repo(path: Path, seed: str = "") -> Path:
    """A history worth not carrying twice: a few commits of incompressible bytes. Two repos
    made within one second with one seed have the very same commits."""
    repo = init_repo(path)
    for i in range(3):
        noise = b"".join(hashlib.sha256(f"{seed}{i}-{k}".encode()).digest() for k in range(8192))
        write(repo / f"blob{i}.bin", noise)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"commit {i}")
    git(repo, "branch", "side", "HEAD~1")
    write(repo / "notes.txt", "untracked\n")
    return repo


def link_after(tmp_path: Path, name: str, record: RepositoryRecord) -> IncrementalLink:
    """The link a cut would record after `record`: every commit it carried is a prerequisite."""
    seat = tmp_path / name / "default"
    refs = parse_refs_list((seat / "refs.txt").read_bytes()) if record.refs else {}
    commits = list(dict.fromkeys([record.base, *refs.values(), *(s.oid for s in record.stash)]))
    return IncrementalLink(
        attempt_id=name,
        checkpoint_sha256="0" * 64,
        bundle_sha256=record.bundle.sha256 if record.bundle else None,
        prerequisites=commits,
    )


async def capture(
    tmp_path: Path, repo: Path, name: str, since: IncrementalLink | None = None
) -> RepositoryRecord:
    seat = tmp_path / name / "default"
    seat.mkdir(parents=True, mode=0o700)
    return await capture_repository(
        repo, seat, prerequisites=since.prerequisites if since else (), since=since
    )


def link(tmp_path: Path, name: str, record: RepositoryRecord) -> Link:
    return Link(attempt_id=name, seat_dir=tmp_path / name / "default", bundle=record.bundle)


def observe(repo: Path) -> dict[str, object]:
    return {
        "refs": git(repo, "for-each-ref", "--format=%(objectname) %(refname)"),
        "head": git(repo, "symbolic-ref", "-q", "HEAD", check=False),
        "status": git(repo, "status", "--porcelain=v1", "-z", "--untracked-files=all"),
        "stash": stash_list(repo),
        "tree": tree_digest(repo),
    }


async def test_a_chain_of_three_captures_restores_byte_identical(tmp_path: Path) -> None:
    repo = big_repo(tmp_path / "src")
    a = await capture(tmp_path, repo, "A")
    assert a.bundle is not None and a.since is None

    # B: a new commit, a changed file, a stash entry and an annotated tag on an old commit.
    write(repo / "blob1.bin", b"changed\n")
    git(repo, "commit", "-q", "-am", "change blob1")
    write(repo / "blob2.bin", b"stashed change\n")
    git(repo, "stash", "push", "-q", "-m", "wip")
    git(repo, "tag", "-a", "v0", "-m", "an old release", "HEAD~2")
    write(repo / "blob0.bin", b"unstaged at B\n")
    b = await capture(tmp_path, repo, "B", link_after(tmp_path, "A", a))
    assert b.bundle is not None and b.since is not None
    assert b.bundle.bytes < a.bundle.bytes // 20

    # C: only the worktree moved; the history is the one B carried, so there is no bundle.
    write(repo / "blob0.bin", b"unstaged at C\n")
    write(repo / "new-untracked.txt", "new\n")
    c = await capture(tmp_path, repo, "C", link_after(tmp_path, "B", b))
    assert c.bundle is None and c.since is not None
    assert not (tmp_path / "C" / "default" / "repo.bundle").exists()
    want = observe(repo)

    chain = [link(tmp_path, "A", a), link(tmp_path, "B", b)]
    check_repository("default", tmp_path / "C" / "default", c, chain)
    target = tmp_path / "dest" / "work"
    await restore_repository(tmp_path / "C" / "default", c, target, stamp=STAMP, links=chain)
    assert observe(target) == want
    assert b"wip" in stash_list(target)


async def test_an_unchanged_repository_carries_no_history_the_second_time(tmp_path: Path) -> None:
    repo = big_repo(tmp_path / "src")
    a = await capture(tmp_path, repo, "A")
    again = await capture(tmp_path, repo, "B", link_after(tmp_path, "A", a))
    assert a.bundle is not None and a.bundle.bytes > 200_000
    assert again.bundle is None
    carried = sum(ref.bytes for ref in again.files())
    # Exactly what the first capture wrote besides its bundle (the diffs, the untracked archive,
    # the refs list, the git config): no history at all.
    assert carried == sum(ref.bytes for ref in a.files()) - a.bundle.bytes
    assert carried < 16 * 1024 and carried * 20 < a.bundle.bytes


async def test_a_chain_without_its_predecessor_is_refused(tmp_path: Path) -> None:
    repo = big_repo(tmp_path / "src")
    a = await capture(tmp_path, repo, "A")
    write(repo / "blob1.bin", b"changed\n")
    git(repo, "commit", "-q", "-am", "change blob1")
    b = await capture(tmp_path, repo, "B", link_after(tmp_path, "A", a))
    seat = tmp_path / "B" / "default"
    with pytest.raises(Refusal) as exc:
        check_repository("default", seat, b, [])
    assert exc.value.code == "predecessor-missing" and "A" in exc.value.message
    target = tmp_path / "dest" / "work"
    with pytest.raises(Refusal) as exc:
        await restore_repository(seat, b, target, stamp=STAMP)
    assert exc.value.code == "predecessor-missing"
    assert not target.exists()
    # The wrong predecessor (one that does not hold the prerequisites) fails at unbundling.
    other = big_repo(tmp_path / "other", seed="stranger-")
    write(other / "blob0.bin", b"another history\n")
    git(other, "commit", "-q", "-am", "diverge")
    stranger = await capture(tmp_path, other, "X")
    with pytest.raises(Refusal) as exc:
        check_repository("default", seat, b, [link(tmp_path, "X", stranger)])
    assert exc.value.code == "bundle-invalid"


def test_the_record_link_is_optional_strict_and_the_only_reason_a_bundle_may_be_absent(
    tmp_path: Path,
) -> None:
    ref = FileRef(file="index.diff", bytes=0, sha256=hashlib.sha256(b"").hexdigest())
    base = {
        "base": "a" * 40,
        "untrackedSelection": "git ls-files --others --exclude-standard -z, excluding .cotal/",
        "bundle": None,
        "indexDiff": msgspec.to_builtins(ref),
        "worktreeDiff": {**msgspec.to_builtins(ref), "file": "worktree.diff"},
        "untracked": {**msgspec.to_builtins(ref), "file": "untracked.tar"},
    }
    link = {
        "attemptId": "20261201T140610Z-ddc0b929",
        "checkpointSha256": "1" * 64,
        "bundleSha256": None,
        "prerequisites": ["b" * 40],
    }

    def decode(doc: dict[str, object]) -> RepositoryRecord:
        return msgspec.json.decode(encode_json(doc), type=RepositoryRecord)

    with pytest.raises(msgspec.ValidationError, match="only from an incremental record"):
        decode(base)
    record = decode({**base, "since": link})
    assert record.bundle is None and [r.file for r in record.files()][0] == "index.diff"
    # A record from before incremental cuts (a bundle, no since) decodes as it always did.
    old = decode({**base, "bundle": {**msgspec.to_builtins(ref), "file": "repo.bundle"}})
    assert old.since is None
    for bad in (
        {**link, "prerequisites": ["b" * 40, "b" * 40]},
        {**link, "prerequisites": ["not-an-oid"]},
        {**link, "attemptId": "../elsewhere"},
        {**link, "extra": 1},
    ):
        with pytest.raises(msgspec.ValidationError):
            decode({**base, "since": bad})
