"""A shallow clone, a sparse checkout, submodules and a linked worktree travel as they are
(issue 42, items 1 to 4): captured and restored at another path, the repository's shape is the
same by a fingerprint that adds the shallow boundary, the sparse patterns, the skip-worktree bits
and the files present and absent to the status and the bytes; a tampered shape artifact is
refused at admission by name; a linked worktree comes back as a repository of its own, its main
checkout and the other worktrees never written to."""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from manager.checkpoint.admit import check_git_lfs_seat, check_repository
from manager.checkpoint.gitstate import (
    capture_repository,
    preflight_repository,
    submodule_gitfile,
)
from manager.checkpoint.reader import verify_seat_files
from manager.checkpoint.restore import restore_repository
from protocol.checkpoint import RepositoryRecord, selection_rule
from protocol.codec import decode_json, encode_json
from protocol.errors import DecodeError, Refusal
from tests.gitrepo import full_digest, git, init_repo, seat_dir_for, tree_digest, write
from tests.integration.test_repo_fidelity import seat_checkpoint

pytestmark = [pytest.mark.usefixtures("isolated_home"), pytest.mark.anyio]

STAMP = "20261129T140000Z"


def _maybe(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def fingerprint(repo: Path) -> dict[str, object]:
    """Everything a seat sees of its repository: status, bytes, refs, HEAD, the reachable
    history, the stash, the index with its flags, the shallow boundary and the sparse shape."""
    config = {
        key: git(repo, "config", "--local", "--get", key, check=False).strip()
        for key in ("core.sparseCheckout", "core.sparseCheckoutCone", "index.sparse")
    }
    return {
        "status": git(
            repo, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--", ":!.cotal"
        ),
        "tree": tree_digest(repo),
        "head": git(repo, "rev-parse", "HEAD"),
        "branch": git(repo, "symbolic-ref", "-q", "HEAD", check=False),
        "refs": git(repo, "for-each-ref", "--format=%(objectname) %(refname)"),
        "history": git(repo, "log", "--all", "--format=%H %P"),
        "stash": git(repo, "stash", "list"),
        "index": git(repo, "ls-files", "-s", "-t", "-v", "-z"),
        "is-shallow": git(repo, "rev-parse", "--is-shallow-repository").strip(),
        "shallow": _maybe(repo / ".git" / "shallow"),
        "sparse-patterns": _maybe(_git_path(repo, "info/sparse-checkout")),
        "sparse-config": config,
        "sparse-index": git(repo, "ls-files", "--sparse", "-s", "-t", "-z"),
        "worktree-config": _maybe(_git_path(repo, "config.worktree")),
        "lfs": lfs_objects(repo),
    }


_POINTER = re.compile(
    rb"version https://git-lfs\.github\.com/spec/v1\noid sha256:([0-9a-f]{64})\nsize ([0-9]+)\n"
)


def lfs_objects(repo: Path) -> list[tuple[str, str, str, bool]] | None:
    """Every Git LFS pointer of the HEAD tree, the index and the newest stash entry, as (where,
    path, oid, whether the repository's LFS storage holds bytes that hash to the oid); None for
    a repository whose .gitattributes names no LFS filter."""
    attributes = repo / ".gitattributes"
    if not attributes.exists() or b"filter=lfs" not in attributes.read_bytes():
        return None
    storage = repo / git(repo, "rev-parse", "--git-common-dir").decode().strip() / "lfs"
    listings = {
        "HEAD": git(repo, "ls-tree", "-r", "-z", "HEAD"),
        "index": git(repo, "ls-files", "-s", "-z"),
    }
    if git(repo, "rev-parse", "-q", "--verify", "refs/stash", check=False):
        listings["stash"] = git(repo, "ls-tree", "-r", "-z", "stash@{0}")
    found: list[tuple[str, str, str, bool]] = []
    for where, listing in listings.items():
        for entry in filter(None, listing.split(b"\0")):
            meta, _, path = entry.partition(b"\t")
            if not meta.startswith(b"100"):
                continue
            blob = meta.split()[1 if where == "index" else 2].decode()
            pointer = _POINTER.fullmatch(git(repo, "cat-file", "blob", blob))
            if pointer is None:
                continue
            oid = pointer.group(1).decode()
            stored = storage / "objects" / oid[:2] / oid[2:4] / oid
            present = stored.exists() and hashlib.sha256(stored.read_bytes()).hexdigest() == oid
            found.append((where, path.decode(), oid, present))
    return sorted(found)


def _git_path(repo: Path, rel: str) -> Path:
    """Where git keeps `rel` for this worktree: a linked worktree's own git dir holds its
    `config.worktree` and sparse patterns, the main worktree's `.git` the rest."""
    return repo / git(repo, "rev-parse", "--git-path", rel).decode().strip()


def small_history(path: Path, commits: int = 5) -> Path:
    repo = init_repo(path)
    for n in range(commits):
        write(repo / f"f{n}.txt", f"commit {n}\n")
        write(repo / "shared.txt", f"shared at {n}\n")
        write(repo / "src" / "mod.py", f"VERSION = {n}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"commit {n}")
    git(repo, "tag", "v-last")
    return repo


def shallow_clone(tmp_path: Path, depth: int) -> Path:
    """`git clone --depth N file://...` of a small repository, the source then deleted, with
    staged, unstaged and untracked work and a stash."""
    src = small_history(tmp_path / "origin")
    git(tmp_path, "clone", "-q", "--depth", str(depth), f"file://{src}", "work")
    shutil.rmtree(src)
    repo = tmp_path / "work"
    write(repo / "shared.txt", "stashed\n")
    git(repo, "stash", "push", "-q", "-m", "kept aside")
    write(repo / "src" / "mod.py", "VERSION = 'staged'\n")
    git(repo, "add", "src/mod.py")
    write(repo / "src" / "mod.py", "VERSION = 'unstaged'\n")
    write(repo / "f4.txt", "unstaged edit\n")
    write(repo / "notes" / "todo.txt", "untracked\n")
    return repo


def sparse_checkout(path: Path, mode: str) -> Path:
    """A repository of a few directories checked out sparse (`cone`, `cone-index` with a
    sparse index, or `no-cone` patterns), with staged, unstaged and untracked work inside the
    sparse set and an untracked file beside a directory left out."""
    repo = init_repo(path)
    for rel in (
        "top.txt",
        "src/app.py",
        "src/lib/util.py",
        "docs/guide.md",
        "docs/api/ref.md",
        "assets/logo.txt",
        "assets/big.bin",
    ):
        write(repo / rel, f"{rel} v1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    if mode == "cone":
        git(repo, "sparse-checkout", "set", "--cone", "src")
    elif mode == "cone-index":
        git(repo, "sparse-checkout", "set", "--cone", "--sparse-index", "src", "docs/api")
    else:
        git(repo, "sparse-checkout", "set", "--no-cone", "/*.txt", "/src/", "!/src/lib/", "*.md")
    write(repo / "src" / "app.py", "staged\n")
    git(repo, "add", "src/app.py")
    write(repo / "src" / "app.py", "staged, then unstaged\n")
    write(repo / "top.txt", "unstaged\n")
    write(repo / "src" / "new.py", "untracked inside\n")
    write(repo / "assets" / "notes.txt", "untracked beside the left-out files\n")
    return repo


LFS_TOKEN = "SECRET-LFS-TOKEN-4e7a1c"


def _lfs_bytes(seed: int, size: int) -> bytes:
    return hashlib.shake_256(b"lfs-%d" % seed).digest(size)


def lfs_checkout(path: Path) -> Path:
    """A repository that uses Git LFS (`git lfs install --local`, `*.bin` tracked) whose LFS
    server is unreachable (its URL, with a token in it, names a closed port): `assets/one.bin`
    changed by a second commit (its first version's object is in the storage, and the checkout
    no longer points at it), a stash that changes `assets/two.bin`, a new `three.bin` staged
    and `one.bin` changed again in the worktree, an untracked note."""
    repo = init_repo(path)
    git(repo, "lfs", "install", "--local")
    git(repo, "config", "lfs.url", f"https://lfs-user:{LFS_TOKEN}@127.0.0.1:9/unreachable/info/lfs")
    git(repo, "lfs", "track", "*.bin")
    # git-lfs writes .gitattributes 0640; git keeps only the executable bit, so a checkout
    # anywhere gives it 0644 (the tree digest compares modes).
    os.chmod(repo / ".gitattributes", 0o644)
    write(repo / "assets" / "one.bin", _lfs_bytes(1, 200_000))
    write(repo / "assets" / "two.bin", _lfs_bytes(2, 3_000))
    write(repo / "README.md", "# lfs\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    write(repo / "assets" / "one.bin", _lfs_bytes(11, 150_000))
    git(repo, "commit", "-q", "-am", "one.bin again")
    write(repo / "assets" / "two.bin", _lfs_bytes(21, 4_000))
    git(repo, "stash", "push", "-q", "-m", "two.bin aside")
    write(repo / "three.bin", _lfs_bytes(3, 70_000))
    git(repo, "add", "three.bin")
    write(repo / "assets" / "one.bin", _lfs_bytes(12, 160_000))
    write(repo / "notes.txt", "untracked\n")
    return repo


async def round_trip(tmp_path: Path, repo: Path) -> tuple[Path, RepositoryRecord, Path]:
    seat = seat_dir_for(tmp_path)
    await preflight_repository(repo)
    record = await capture_repository(repo, seat)
    check_repository("default", seat, record)
    target = tmp_path / "elsewhere" / "restored"
    await restore_repository(seat, record, target, stamp=STAMP)
    return seat, record, target


@pytest.mark.parametrize("depth", [1, 3])
async def test_a_shallow_clone_travels_shallow(tmp_path: Path, depth: int) -> None:
    repo = shallow_clone(tmp_path, depth)
    before = fingerprint(repo)
    assert before["is-shallow"] == b"true"
    assert len(git(repo, "log", "--format=%H").splitlines()) == depth
    seat, record, target = await round_trip(tmp_path, repo)

    assert record.shallow is not msgspec.UNSET
    assert (seat / record.shallow.file).read_bytes() == (repo / ".git" / "shallow").read_bytes()
    assert record.since is None and record.precopy is None
    assert fingerprint(target) == before
    # The restored clone is whole within its boundary and never reaches past it.
    git(target, "fsck", "--no-progress")
    assert len(git(target, "log", "--format=%H").splitlines()) == depth
    assert git(target, "stash", "show", "-p") == git(repo, "stash", "show", "-p")


async def test_a_record_without_these_shapes_encodes_as_before(tmp_path: Path) -> None:
    repo = small_history(tmp_path / "full")
    record = await capture_repository(repo, seat_dir_for(tmp_path))
    assert record.shallow is msgspec.UNSET and record.sparse is msgspec.UNSET
    assert record.worktree_config is msgspec.UNSET
    # A record without these shapes has the bytes it had before they travelled, so a record
    # sealed then still verifies as it was signed.
    for key in (b'"shallow"', b'"sparse"', b'"worktreeConfig"'):
        assert key not in encode_json(record)
    again = decode_json(encode_json(record), RepositoryRecord, what="record", cap=1 << 20)
    assert encode_json(again) == encode_json(record)


def forge(seat: Path, record: RepositoryRecord, name: str, data: bytes) -> RepositoryRecord:
    """`name` in the seat directory replaced by `data`, and the record re-pointed at its new
    digest: what a signer that seals any bytes could hand a destination."""
    path = seat / name
    os.chmod(path, 0o600)
    path.write_bytes(data)
    ref = {"file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    doc = msgspec.json.decode(encode_json(record))
    if name == doc.get("shallow", {}).get("file"):
        doc["shallow"] = ref
    elif name == doc.get("unwatched", {}).get("files", {}).get("file"):
        doc["unwatched"]["files"] = ref
    else:
        doc["sparse"]["skipWorktree"] = ref
    return decode_json(encode_json(doc), RepositoryRecord, what="record", cap=1 << 20)


async def test_a_tampered_shallow_boundary_is_refused_at_admission(tmp_path: Path) -> None:
    repo = shallow_clone(tmp_path, 1)
    seat = seat_dir_for(tmp_path)
    record = await capture_repository(repo, seat)
    assert record.shallow is not msgspec.UNSET
    name = record.shallow.file
    honest = (seat / name).read_bytes()

    # Bytes changed under the signed digest: integrity, naming the file.
    os.chmod(seat / name, 0o600)
    (seat / name).write_bytes((b"1" if honest[:1] == b"0" else b"0") + honest[1:])
    with pytest.raises(Refusal) as exc:
        verify_seat_files(seat, seat_checkpoint(record))
    assert exc.value.code == "integrity" and name in exc.value.message

    # Re-sealed: a boundary that names a commit the bundle does not carry, and one that is not
    # a boundary at all. Admission refuses both by name; the restore too, writing nothing.
    stranger = b"%s\n" % (b"1" * 40)
    for forged, said in (
        (honest + stranger, "names commits the bundle"),
        (b"not a commit\n", "is not a commit id"),
        (honest + honest, "twice"),
    ):
        bad = forge(seat, record, name, forged)
        with pytest.raises(Refusal) as exc:
            check_repository("default", seat, bad)
        assert exc.value.code == "shallow-mismatch" and said in exc.value.message
        assert name in exc.value.message
        target = tmp_path / "dest" / "work"
        with pytest.raises(Refusal) as exc:
            await restore_repository(seat, bad, target, stamp=STAMP)
        assert exc.value.code == "shallow-mismatch" and said in exc.value.message
        assert not target.exists()
        shutil.rmtree(target.with_name("work.incoming"))


@pytest.mark.parametrize("mode", ["cone", "cone-index", "no-cone"])
async def test_a_sparse_checkout_travels_sparse(tmp_path: Path, mode: str) -> None:
    repo = sparse_checkout(tmp_path / "work", mode)
    before = fingerprint(repo)
    assert isinstance(before["index"], bytes) and b"S " in before["index"]
    assert not (repo / "assets" / "logo.txt").exists()
    seat, record, target = await round_trip(tmp_path, repo)

    assert record.sparse is not msgspec.UNSET and record.worktree_config is not msgspec.UNSET
    assert record.sparse.patterns is not None
    after = fingerprint(target)
    assert after == before
    assert not (target / "assets" / "logo.txt").exists()
    assert (target / "assets" / "notes.txt").read_text() == "untracked beside the left-out files\n"
    # git goes on treating it as the same sparse checkout.
    assert git(target, "sparse-checkout", "list") == git(repo, "sparse-checkout", "list")


async def test_files_git_does_not_look_at_travel_with_their_bits(tmp_path: Path) -> None:
    """How an operator keeps a local edit of a tracked file out of git's sight: marked
    skip-worktree on a present file (outside any sparse checkout; inside one, git itself clears
    the bit of a file that is present), or assume-unchanged. No diff carries those bytes; the
    archive of them does, and each bit comes back. An assume-unchanged entry whose file is gone
    comes back without it."""
    repo = small_history(tmp_path / "work")
    tracked = git(repo, "ls-files").decode().split()
    local, hidden, gone, both = tracked[:4]
    git(repo, "update-index", "--skip-worktree", local)
    write(repo / local, "a local edit git does not see\n")
    git(repo, "update-index", "--assume-unchanged", hidden, gone)
    write(repo / hidden, "another local edit\n")
    (repo / gone).unlink()
    git(repo, "update-index", "--skip-worktree", both)
    git(repo, "update-index", "--assume-unchanged", both)
    write(repo / both, "both bits\n")
    assert git(repo, "status", "--porcelain") == b""
    before = fingerprint(repo)
    files = {rel: (repo / rel).read_bytes() for rel in (local, hidden, both)}

    seat, record, target = await round_trip(tmp_path, repo)

    assert record.unwatched is not msgspec.UNSET
    assert (record.unwatched.entries, record.unwatched.present) == (3, 3)
    assert record.sparse is not msgspec.UNSET and record.sparse.entries == 2
    assert fingerprint(target) == before
    assert {rel: (target / rel).read_bytes() for rel in files} == files
    assert not (target / gone).exists()
    # The bytes git does not see are in no diff: only the archive carries them.
    for name in (record.index_diff.file, record.worktree_diff.file):
        assert b"local edit" not in (seat / name).read_bytes()
    # The record names them and nothing else: a forged member is refused at the restore.
    assert record.unwatched.files is not None
    with tarfile.open(seat / record.unwatched.files.file) as tar:
        assert sorted(tar.getnames()) == sorted(files)
    forged = tmp_path / "forged.tar"
    with tarfile.open(forged, "w", format=tarfile.PAX_FORMAT) as tar:
        data = b"not an entry the record names\n"
        info = tarfile.TarInfo("elsewhere.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    bad = forge(seat, record, record.unwatched.files.file, forged.read_bytes())
    with pytest.raises(Refusal) as exc:
        await restore_repository(seat, bad, tmp_path / "forged-target", stamp=STAMP)
    assert exc.value.code == "unsafe-archive" and "elsewhere.txt" in exc.value.message


async def test_a_tampered_sparse_list_is_refused_at_admission(tmp_path: Path) -> None:
    repo = sparse_checkout(tmp_path / "work", "cone")
    seat = seat_dir_for(tmp_path)
    record = await capture_repository(repo, seat)
    assert record.sparse is not msgspec.UNSET and record.sparse.skip_worktree is not None
    name = record.sparse.skip_worktree.file
    honest = (seat / name).read_bytes()
    os.chmod(seat / name, 0o600)
    (seat / name).write_bytes(honest.replace(b"assets/", b"assetz/", 1))
    with pytest.raises(Refusal) as exc:
        verify_seat_files(seat, seat_checkpoint(record))
    assert exc.value.code == "integrity" and name in exc.value.message

    for forged, said, where in (
        (b"../escape\0", "'..' segment", "admission"),
        (honest + honest, "twice", "admission"),
        (honest[: honest.index(b"\0") + 1], "names 1 skip-worktree entries", "admission"),
        (honest + b"nowhere/at-all.txt\0", "", "restore"),
    ):
        bad = forge(seat, record, name, forged)
        if where == "restore":
            # Re-sealed with the count that matches: admission cannot tell, the restore can.
            doc = msgspec.json.decode(encode_json(bad))
            doc["sparse"]["entries"] += 1
            bad = decode_json(encode_json(doc), RepositoryRecord, what="record", cap=1 << 20)
        else:
            with pytest.raises(Refusal) as exc:
                check_repository("default", seat, bad)
            assert exc.value.code == "sparse-mismatch" and said in exc.value.message
            assert name in exc.value.message
        target = tmp_path / "dest" / "work"
        with pytest.raises(Refusal) as exc:
            await restore_repository(seat, bad, target, stamp=STAMP)
        assert exc.value.code == "sparse-mismatch", exc.value.text
        assert not target.exists()
        shutil.rmtree(target.with_name("work.incoming"))


def _committed(path: Path, files: dict[str, str]) -> Path:
    repo = init_repo(path)
    for rel, text in files.items():
        write(repo / rel, text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"first of {path.name}")
    return repo


def _add_submodule(repo: Path, origin: Path, where: str) -> None:
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(origin), where)
    git(repo, "commit", "-q", "-m", f"submodule {where}")


def with_submodules(path: Path, origins: Path) -> Path:
    """A superproject with a submodule (`libs/sub`) that has a submodule of its own
    (`deep/nest`), cloned from origins under `origins` that are then deleted. The submodule
    has a commit beyond the one the superproject pins, a stash, staged, unstaged and untracked
    work; the nested one unstaged and untracked work; the superproject its own."""
    nested = _committed(origins / "nested", {"n.txt": "nested v1\n"})
    inner = _committed(origins / "inner", {"a.txt": "inner v1\n", "b.txt": "b\n"})
    _add_submodule(inner, nested, "deep/nest")
    git(inner, "tag", "-a", "v1", "-m", "inner v1")
    repo = _committed(path, {"top.txt": "top v1\n"})
    _add_submodule(repo, inner, "libs/sub")
    git(
        repo,
        "-c",
        "protocol.file.allow=always",
        "submodule",
        "update",
        "-q",
        "--init",
        "--recursive",
    )
    shutil.rmtree(origins)
    sub = repo / "libs" / "sub"
    write(sub / "c.txt", "beyond the pinned commit\n")
    git(sub, "add", "c.txt")
    git(sub, "commit", "-q", "-m", "beyond the pin")
    write(sub / "b.txt", "stashed\n")
    git(sub, "stash", "push", "-q", "-m", "inner stash")
    write(sub / "a.txt", "staged\n")
    git(sub, "add", "a.txt")
    write(sub / "a.txt", "staged, then unstaged\n")
    write(sub / "notes" / "untracked.txt", "untracked in the submodule\n")
    write(sub / "deep" / "nest" / "n.txt", "nested, unstaged\n")
    write(sub / "deep" / "nest" / "nu.txt", "untracked in the nested submodule\n")
    write(repo / "top.txt", "top, unstaged\n")
    write(repo / "top-untracked.txt", "untracked in the superproject\n")
    return repo


SUBMODULES = ("libs/sub", "libs/sub/deep/nest")


@pytest.fixture(scope="module")
def submodule_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`with_submodules` made once for this module; each test works on its own copy (every
    `.git` file and `core.worktree` in it is relative, so a copy is the same repository)."""
    made = tmp_path_factory.mktemp("submodules")
    return with_submodules(made / "work", made / "origins")


def submodule_copy(template: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(template, tmp_path / "work", symlinks=True))


def submodule_fingerprint(repo: Path) -> dict[str, object]:
    """The superproject's fingerprint (whose tree digest holds every file of the submodules,
    their `.git` files included), `git submodule status --recursive`, and each submodule's
    own fingerprint."""
    return {
        "top": fingerprint(repo),
        "submodules": git(repo, "submodule", "status", "--recursive"),
        **{path: fingerprint(repo / path) for path in SUBMODULES},
    }


async def test_submodules_travel_with_their_checkouts(
    tmp_path: Path, submodule_template: Path
) -> None:
    repo = submodule_copy(submodule_template, tmp_path)
    before = submodule_fingerprint(repo)
    assert isinstance(before["submodules"], bytes)
    assert before["submodules"].startswith(b"+")  # the submodule is beyond its pin
    seat, record, target = await round_trip(tmp_path, repo)

    assert record.submodules is not msgspec.UNSET
    [sub] = record.submodules
    assert (sub.path, sub.name, sub.prefix) == ("libs/sub", "libs/sub", "sm1-")
    assert sub.repository is not None and sub.repository.submodules is not msgspec.UNSET
    assert [n.prefix for n in sub.repository.submodules] == ["sm1-sm1-"]
    after = submodule_fingerprint(target)
    assert after == before
    assert (
        target / "libs" / "sub" / ".git"
    ).read_bytes() == b"gitdir: ../../.git/modules/libs/sub\n"
    # The submodule's history is whole at the destination, its remote gone.
    git(target / "libs" / "sub", "fsck", "--no-progress")
    assert git(target / "libs" / "sub", "stash", "list") == git(
        repo / "libs" / "sub", "stash", "list"
    )
    assert not (submodule_template.parent / "origins").exists()


async def test_a_submodule_credential_never_travels(
    tmp_path: Path, submodule_template: Path
) -> None:
    """A submodule's config is carried as the seat's own is: a password in a remote URL and
    an http extra header are redacted and named, never written into the checkpoint."""
    repo = submodule_copy(submodule_template, tmp_path)
    sub = repo / "libs" / "sub"
    token = "SECRET-SUBMODULE-TOKEN-9d2c"
    git(sub, "remote", "set-url", "origin", f"https://bob:{token}@example.invalid/inner.git")
    git(sub, "config", "http.https://example.invalid/.extraheader", f"Authorization: {token}")
    seat = seat_dir_for(tmp_path)
    record = await capture_repository(repo, seat)
    assert record.submodules is not msgspec.UNSET
    [carried] = record.submodules
    assert carried.repository is not None
    assert "http.https://example.invalid/.extraheader" in carried.repository.config_redacted
    for path in seat.iterdir():
        assert token.encode() not in path.read_bytes(), path.name


async def test_a_submodule_in_a_shape_that_cannot_travel_is_refused(
    tmp_path: Path, submodule_template: Path
) -> None:
    repo = submodule_copy(submodule_template, tmp_path)
    sub = repo / "libs" / "sub"
    # A `.git` naming its git dir through a symlink: refused by name, before anything stops.
    gitfile = (sub / ".git").read_bytes()
    os.chmod(sub / ".git", 0o644)
    (tmp_path / "link").symlink_to(repo / ".git" / "modules" / "libs" / "sub")
    (sub / ".git").write_bytes(b"gitdir: " + os.fsencode(tmp_path / "link") + b"\n")
    with pytest.raises(Refusal) as exc:
        await preflight_repository(repo)
    assert exc.value.code == "submodule" and str(sub) in exc.value.message
    assert "does not name a git dir" in exc.value.message
    assert f"git submodule update --init {'libs/sub'}" in exc.value.cure
    (sub / ".git").write_bytes(gitfile)
    await preflight_repository(repo)
    # A config.worktree naming another checkout than the submodule's own: refused by name.
    git(sub, "config", "extensions.worktreeConfig", "true")
    # The same checkout, spelled otherwise than the path git writes back to it.
    git(sub, "config", "--worktree", "core.worktree", "../../../../libs/sub/.")
    with pytest.raises(Refusal) as exc:
        await preflight_repository(repo)
    assert exc.value.code == "gitdir-unsupported" and "core.worktree" in exc.value.message


async def test_a_submodules_hooks_travel(tmp_path: Path, submodule_template: Path) -> None:
    repo = submodule_copy(submodule_template, tmp_path)
    hooks = repo / ".git" / "modules" / "libs" / "sub" / "hooks"
    write(hooks / "pre-commit", "#!/bin/sh\necho the submodule's hook\n", 0o750)
    write(repo / ".git" / "hooks" / "pre-commit", "#!/bin/sh\necho the superproject's\n", 0o755)
    _, record, target = await round_trip(tmp_path, repo)
    assert record.submodules is not msgspec.UNSET
    [sub] = record.submodules
    assert sub.repository is not None
    assert [h.file.file for h in sub.repository.hooks] == ["sm1-hook-pre-commit"]
    assert [h.file.file for h in record.hooks] == ["hook-pre-commit"]
    landed = target / ".git" / "modules" / "libs" / "sub" / "hooks" / "pre-commit"
    assert landed.read_bytes() == (hooks / "pre-commit").read_bytes()
    assert stat.S_IMODE(landed.stat().st_mode) == 0o750
    top = (target / ".git" / "hooks" / "pre-commit").read_bytes()
    assert top == b"#!/bin/sh\necho the superproject's\n"


def _outside_git(digest: dict[str, tuple[object, ...]]) -> dict[str, tuple[object, ...]]:
    """A tree digest without anything under a `.git` (a file in one layout, a directory in
    the other)."""
    return {rel: v for rel, v in digest.items() if ".git" not in rel.split("/")}


def _worked(repo: Path, name: str) -> None:
    write(repo / f"{name}-beyond.txt", "beyond the pin\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "beyond the pin")
    write(repo / f"{name}-beyond.txt", "stashed\n")
    git(repo, "stash", "push", "-q", "-m", f"{name} stash")
    write(repo / "a.txt", "staged\n")
    git(repo, "add", "a.txt")
    write(repo / "a.txt", "staged, then unstaged\n")
    write(repo / "notes" / "untracked.txt", "untracked\n")


async def test_submodules_git_did_not_absorb_travel(tmp_path: Path) -> None:
    """A clone made in place and then added as a submodule keeps its `.git` directory (so does
    a nested clone `git add` made a gitlink of, without `.gitmodules`), and one whose `.git`
    file names its git dir by an absolute path (as git before 1.7.10 wrote it): each travels
    with its history, its work and its stash, and comes back as git lays a submodule out now,
    under `.git/modules/<name>`."""
    origins = tmp_path / "origins"
    for name in ("emb", "raw", "abs"):
        _committed(origins / name, {"a.txt": f"{name} v1\n"})
    repo = _committed(tmp_path / "super", {"top.txt": "top v1\n"})
    git(repo, "clone", "-q", str(origins / "emb"), "libs/emb")
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q",
        str(origins / "emb"), "libs/emb")  # fmt: skip
    git(repo, "clone", "-q", str(origins / "raw"), "libs/raw")
    git(repo, "add", "libs/raw")
    _add_submodule(repo, origins / "abs", "libs/abs")
    abs_gitdir = repo / ".git" / "modules" / "libs" / "abs"
    (repo / "libs" / "abs" / ".git").write_bytes(b"gitdir: " + os.fsencode(abs_gitdir) + b"\n")
    git(repo / "libs" / "abs", "config", "core.worktree", str(repo / "libs" / "abs"))
    shutil.rmtree(origins)
    assert (repo / "libs" / "emb" / ".git").is_dir() and (repo / "libs" / "raw" / ".git").is_dir()
    subs = ("libs/emb", "libs/raw", "libs/abs")
    for path in subs:
        _worked(repo / path, path.rpartition("/")[2])
    write(repo / "top.txt", "top, unstaged\n")
    before = {path: fingerprint(repo / path) for path in subs}
    top = fingerprint(repo)
    status = git(repo, "submodule", "status", "--", "libs/emb", "libs/abs")

    seat, record, target = await round_trip(tmp_path, repo)

    assert record.submodules is not msgspec.UNSET
    assert [(s.path, s.name) for s in record.submodules] == [
        ("libs/abs", "libs/abs"), ("libs/emb", "libs/emb"), ("libs/raw", "libs/raw")
    ]  # fmt: skip
    assert {path: fingerprint(target / path) for path in subs} == before
    after = fingerprint(target)
    assert {k: v for k, v in after.items() if k != "tree"} == {
        k: v for k, v in top.items() if k != "tree"
    }
    assert isinstance(after["tree"], dict) and isinstance(top["tree"], dict)
    assert _outside_git(after["tree"]) == _outside_git(top["tree"])
    assert git(target, "submodule", "status", "--", "libs/emb", "libs/abs") == status
    for path in subs:
        assert (target / path / ".git").read_bytes() == submodule_gitfile(
            target / path, target / ".git" / "modules" / path
        )
        git(target / path, "fsck", "--no-progress")


def test_the_submodule_record_is_strict() -> None:
    sha = "0" * 64

    def ref(name: str) -> dict[str, object]:
        return {"file": name, "bytes": 0, "sha256": sha}

    def repo(prefix: str, **extra: object) -> dict[str, object]:
        return {
            "base": "1" * 40,
            "untrackedSelection": selection_rule([]),
            "bundle": {**ref(prefix + "repo.bundle"), "bytes": 1},
            "indexDiff": ref(prefix + "index.diff"),
            "worktreeDiff": ref(prefix + "worktree.diff"),
            "untracked": ref(prefix + "untracked.tar"),
            "config": ref(prefix + "git-config"),
            **extra,
        }

    ok = {"path": "libs/sub", "commit": "2" * 40, "prefix": "sm1-", "name": "libs/sub"}

    def decode(*subs: dict[str, object]) -> RepositoryRecord:
        doc = repo("", submodules=list(subs))
        return decode_json(encode_json(doc), RepositoryRecord, what="record", cap=1 << 20)

    record = decode({**ok, "repository": repo("sm1-")})
    assert "sm1-repo.bundle" in [f.file for f in record.files()]
    assert decode({**ok, "name": None}).files()[-1].file == "git-config"
    gone = decode({**ok, "name": None, "absent": True})
    assert gone.submodules is not msgspec.UNSET and gone.submodules[0].absent is True
    for bad, said in (
        ({**ok, "path": "../up", "repository": repo("sm1-")}, "'..' segment"),
        ({**ok, "path": ".git/x", "repository": repo("sm1-")}, "inside .git/"),
        ({**ok, "prefix": "sm2-", "repository": repo("sm2-")}, "must carry the prefix 'sm1-'"),
        ({**ok, "repository": repo("sm2-")}, "files must carry the prefix"),
        ({**ok, "repository": {**repo("sm1-"), "config": ref("git-config")}}, "stored as"),
        ({**ok, "repository": {**repo("sm1-"), "config": None}}, "carries its config"),
        ({**ok, "name": "../../x", "repository": repo("sm1-")}, "'..' segment"),
        ({**ok, "repository": None}, "name and its repository together"),
        ({**ok, "extra": 1}, "unknown field"),
        ({**ok, "repository": repo("sm1-"), "absent": True}, "absent is true, of a submodule"),
        ({**ok, "name": None, "absent": False}, "absent is true, of a submodule"),
        (
            {
                **ok,
                "repository": {
                    **repo("sm1-"),
                    "unwatched": {"files": ref("unwatched.tar"), "present": 1},
                },
            },
            "'unwatched.tar' must be stored as 'sm1-unwatched.tar'",
        ),
    ):
        with pytest.raises(DecodeError) as exc:
            decode(bad)
        assert exc.value.code == "malformed" and said in exc.value.message, exc.value.message
    with pytest.raises(DecodeError) as exc:
        decode()
    assert "submodules lists 1 to" in exc.value.message


def linked_worktree(path: Path, seat: str = "seat") -> tuple[Path, Path, Path]:
    """A main checkout (`path/main`) with two linked worktrees: `seat` (locked) on branch
    `side`, a commit beyond main, a stash entry made there, staged, unstaged and untracked work
    and a `config.worktree` of its own; `other` on branch `other` with uncommitted work. The main
    checkout holds different uncommitted work and a `config.worktree` of its own."""
    main = small_history(path / "main")
    git(main, "config", "extensions.worktreeConfig", "true")
    git(main, "config", "--worktree", "user.name", "the operator")
    tree, other = path / seat, path / "other"
    git(main, "worktree", "add", "-q", "-b", "side", str(tree))
    git(main, "worktree", "add", "-q", "-b", "other", str(other))
    git(tree, "config", "--worktree", "user.name", "the seat")
    # A locked registration changes nothing the capture reads.
    git(main, "worktree", "lock", "--reason", "on a removable disk", str(tree))
    _work_in(tree)
    write(other / "f1.txt", "the other worktree's edit\n")
    write(other / "other-untracked.txt", "never carried\n")
    write(main / "f0.txt", "the operator's edit\n")
    write(main / "main-untracked.txt", "never carried\n")
    return main, tree, other


def untouched(main: Path, other: Path, seat_id: str) -> dict[str, object]:
    """Every byte, inode and mtime of the main checkout (its `.git` but for the seat's own
    `worktrees/<id>`, where its HEAD and index live) and of the other worktree."""
    own = f".git/worktrees/{seat_id}"
    kept = {
        rel: entry
        for rel, entry in full_digest(main).items()
        if rel != own and not rel.startswith(own + "/")
    }
    return {"main": kept, "other": full_digest(other)}


async def test_a_linked_worktree_travels_as_a_repository_of_its_own(tmp_path: Path) -> None:
    main, seat_tree, other = linked_worktree(tmp_path / "src")
    before = fingerprint(seat_tree)
    assert before["branch"] == b"refs/heads/side\n"
    assert before["worktree-config"] == b"[user]\n\tname = the seat\n"
    sources = untouched(main, other, "seat")
    seat, record, target = await round_trip(tmp_path, seat_tree)

    assert untouched(main, other, "seat") == sources
    assert fingerprint(target) == before
    assert (target / ".git").is_dir() and not (target / ".git" / "worktrees").exists()
    assert git(target, "worktree", "list", "--porcelain").count(b"worktree ") == 1
    assert git(target, "stash", "show", "-p") == git(seat_tree, "stash", "show", "-p")
    # The bundle names this worktree's refs and HEAD, never another worktree's HEAD.
    assert record.bundle is not None
    heads = git(target, "bundle", "list-heads", str(seat / record.bundle.file))
    assert b"worktree" not in heads and b" HEAD\n" in heads
    # Nothing of the other checkouts' uncommitted work travels.
    for path in seat.iterdir():
        data = path.read_bytes()
        for never in (b"the operator's edit", b"the other worktree's edit", b"never carried"):
            assert never not in data, path.name
    assert not (target / "main-untracked.txt").exists()

    # The main checkout, with its linked worktrees attached, travels as well, without them.
    main_before = fingerprint(main)
    _, _, main_target = await round_trip(tmp_path / "main-seat", main)
    assert fingerprint(main_target) == main_before
    # The main checkout is the seat now (git may refresh its own index); the other worktree
    # is still never written to.
    assert full_digest(other) == sources["other"]


def _work_in(tree: Path) -> None:
    """A commit, a stash entry, staged, unstaged and untracked work in `tree`."""
    write(tree / "wt.txt", "committed in the worktree\n")
    git(tree, "add", "wt.txt")
    git(tree, "commit", "-q", "-m", "worktree work")
    write(tree / "wt.txt", "stashed\n")
    git(tree, "stash", "push", "-q", "-m", "the worktree's stash")
    write(tree / "src" / "mod.py", "VERSION = 'staged'\n")
    git(tree, "add", "src/mod.py")
    write(tree / "src" / "mod.py", "VERSION = 'unstaged'\n")
    write(tree / "notes.txt", "untracked\n")


def _bare_common(tmp_path: Path, tree: Path | None = None) -> Path:
    origin = small_history(tmp_path / "origin")
    git(tmp_path, "clone", "-q", "--bare", str(origin), "bare.git")
    tree = tree or tmp_path / "bare-wt"
    git(tmp_path / "bare.git", "worktree", "add", "-q", "-b", "wt", str(tree))
    return tree


def bare_worktree_with_unwatched(tmp_path: Path, tree: Path) -> Path:
    """A linked worktree (at `tree`) of a bare repository (under `tmp_path`) with work, a stash,
    a local edit kept out of git's sight by skip-worktree and another by assume-unchanged."""
    _bare_common(tmp_path, tree)
    _work_in(tree)
    tracked = git(tree, "ls-files").decode().split()
    git(tree, "update-index", "--skip-worktree", tracked[0])
    write(tree / tracked[0], "a local edit, skip-worktree\n")
    git(tree, "update-index", "--assume-unchanged", tracked[1])
    write(tree / tracked[1], "a local edit, assume-unchanged\n")
    return tree


def unborn_repo(path: Path) -> Path:
    """`git init` and work, no commit: staged, unstaged, intent-to-add and untracked."""
    repo = init_repo(path)
    write(repo / "src" / "app.py", "print('staged')\n")
    git(repo, "add", "src/app.py")
    write(repo / "src" / "app.py", "print('staged, then edited')\n")
    write(repo / "later.txt", "intent to add\n")
    git(repo, "add", "-N", "later.txt")
    write(repo / "notes.txt", "untracked\n")
    return repo


def _separate_common(tmp_path: Path) -> Path:
    main = tmp_path / "main"
    git(tmp_path, "init", "-q", "-b", "main", "--separate-git-dir", "sep.git", str(main))
    write(main / "src" / "mod.py", "VERSION = 'one'\n")
    git(main, "add", "-A")
    git(main, "commit", "-q", "-m", "one")
    tree = tmp_path / "sep-wt"
    git(main, "worktree", "add", "-q", "-b", "wt", str(tree))
    return tree


def _submodule_common(tmp_path: Path) -> Path:
    superproject = with_submodules(tmp_path / "super", tmp_path / "origins")
    module = superproject / "libs" / "sub"
    tree = tmp_path / "module-wt"
    git(module, "worktree", "add", "-q", "-b", "wt", str(tree))
    write(tree / "src" / "mod.py", "VERSION = 'one'\n")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "a module file")
    return tree


@pytest.mark.parametrize(
    ("make", "dropped"),
    [
        (_bare_common, "core.bare"),
        (_separate_common, None),
        (_submodule_common, "core.worktree"),
    ],
    ids=["bare", "separate-git-dir", "submodule-git-dir"],
)
async def test_a_linked_worktree_of_any_repository_travels_as_one_of_its_own(
    tmp_path: Path, make: Callable[[Path], Path], dropped: str | None
) -> None:
    """A linked worktree of a bare repository (how several agent orchestrators lay theirs
    out), of a `--separate-git-dir` or of a submodule's git dir: the settings that describe
    the source's layout stay behind, everything else of the config travels."""
    tree = make(tmp_path)
    _work_in(tree)
    before = fingerprint(tree)
    common = Path(os.fsdecode(git(tree, "rev-parse", "--git-common-dir").strip()))
    common = common if common.is_absolute() else tree / common
    source_config = (common / "config").read_bytes()
    if dropped is not None:
        assert git(common, "config", "--file", "config", "--get", dropped) != b""
    seat, record, target = await round_trip(tmp_path, tree)

    assert fingerprint(target) == before
    assert (target / ".git").is_dir() and not (target / ".git" / "worktrees").exists()
    assert git(target, "rev-parse", "--is-bare-repository") == b"false\n"
    assert git(target, "config", "--get", "core.worktree", check=False) == b""
    assert git(target, "stash", "show", "-p") == git(tree, "stash", "show", "-p")
    assert (common / "config").read_bytes() == source_config


async def test_a_main_worktree_whose_config_names_it_as_core_worktree_travels(
    tmp_path: Path,
) -> None:
    repo = small_history(tmp_path / "repo")
    git(repo, "config", "core.worktree", str(repo))
    _work_in(repo)
    before = fingerprint(repo)
    _, _, target = await round_trip(tmp_path, repo)
    assert fingerprint(target) == before
    assert git(target, "config", "--get", "core.worktree", check=False) == b""


async def test_lfs_objects_travel_without_the_lfs_server(tmp_path: Path) -> None:
    """Every object the checkout and the stash point at travels, proven by its oid, and the
    destination checks out the real bytes with its LFS server unreachable; the object of a
    version the checkout no longer points at stays behind, and the token in lfs.url never
    travels."""
    repo = lfs_checkout(tmp_path / "work")
    before = fingerprint(repo)
    assert isinstance(before["lfs"], list) and all(present for *_, present in before["lfs"])
    seat, record, target = await round_trip(tmp_path, repo)

    assert record.lfs is not msgspec.UNSET
    carried = (seat / record.lfs.objects.file).read_bytes().split()[::2]
    expected = {
        hashlib.sha256(_lfs_bytes(n, size)).hexdigest().encode()
        for n, size in ((11, 150_000), (2, 3_000), (21, 4_000), (3, 70_000), (12, 160_000))
    }
    assert set(carried) == expected and record.lfs.count == 5
    assert fingerprint(target) == before
    # Real bytes, not pointers, in the restored tree; the staged and stashed versions come back.
    assert (target / "assets" / "one.bin").read_bytes() == _lfs_bytes(12, 160_000)
    assert (target / "three.bin").read_bytes() == _lfs_bytes(3, 70_000)
    assert git(target, "lfs", "fsck", "--objects") == git(repo, "lfs", "fsck", "--objects")
    git(target, "stash", "pop", "-q")
    assert (target / "assets" / "two.bin").read_bytes() == _lfs_bytes(21, 4_000)
    first = hashlib.sha256(_lfs_bytes(1, 200_000)).hexdigest()
    assert not (target / ".git" / "lfs" / "objects" / first[:2] / first[2:4] / first).exists()
    for path in seat.iterdir():
        assert LFS_TOKEN.encode() not in path.read_bytes(), path.name


async def test_a_missing_lfs_object_is_refused_at_the_preflight(tmp_path: Path) -> None:
    """The stashed version of two.bin is nowhere but in the LFS storage (a file the worktree
    holds would be stored again by git-lfs's clean filter as soon as git looks at it): its
    object gone, the preflight refuses by name before anything stops, and writes nothing."""
    repo = lfs_checkout(tmp_path / "work")
    oid = hashlib.sha256(_lfs_bytes(21, 4_000)).hexdigest()
    stored = repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
    stored.unlink()
    before = tree_digest(repo, skip=())
    with pytest.raises(Refusal) as exc:
        await preflight_repository(repo)
    assert exc.value.code == "lfs-object-missing"
    assert f"assets/two.bin ({oid[:12]})" in exc.value.message and str(repo) in exc.value.message
    assert "git lfs fetch --all" in exc.value.cure.replace(f"-C {repo} ", "")
    assert tree_digest(repo, skip=()) == before
    # An object of the wrong size is as good as missing.
    write(stored, _lfs_bytes(21, 3_999))
    with pytest.raises(Refusal) as exc:
        await preflight_repository(repo)
    assert exc.value.code == "lfs-object-missing"
    write(stored, _lfs_bytes(21, 4_000))
    await preflight_repository(repo)


async def test_a_tampered_lfs_object_is_refused_at_the_restore(tmp_path: Path) -> None:
    """A signer that seals any bytes can hand over a pack whose digest holds: each object is
    still proven by its oid as it is written, and the target is never touched."""
    repo = lfs_checkout(tmp_path / "work")
    seat = seat_dir_for(tmp_path)
    record = await capture_repository(repo, seat)
    assert record.lfs is not msgspec.UNSET
    name = record.lfs.pack.file
    data = bytearray((seat / name).read_bytes())
    data[-1] ^= 0xFF
    os.chmod(seat / name, 0o600)
    (seat / name).write_bytes(bytes(data))
    doc = msgspec.json.decode(encode_json(record))
    doc["lfs"]["pack"]["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
    bad = decode_json(encode_json(doc), RepositoryRecord, what="record", cap=1 << 20)
    check_repository("default", seat, bad)
    target = tmp_path / "dest" / "work"
    with pytest.raises(Refusal) as exc:
        await restore_repository(seat, bad, target, stamp=STAMP)
    assert exc.value.code == "integrity" and "does not hash to its oid" in exc.value.message
    assert not target.exists()


async def test_a_host_without_git_lfs_refuses_by_name(
    tmp_path: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint that carries LFS objects is refused `git-lfs-missing` at admission's
    identity gate (before anything is claimed) and by the restore, its target untouched, where
    git-lfs is not on PATH, or where git has no LFS filter: the source's `git lfs install` was
    global, which does not travel, and this host has none."""
    repo = lfs_checkout(tmp_path / "work")
    seat = seat_dir_for(tmp_path)
    record = await capture_repository(repo, seat)
    check_git_lfs_seat("default", seat, record)
    target = tmp_path / "dest" / "work"
    path = os.environ["PATH"]
    no_lfs = tmp_path / "bin-without-git-lfs"
    no_lfs.mkdir()
    git_program = shutil.which("git")
    assert git_program is not None
    (no_lfs / "git").symlink_to(git_program)
    monkeypatch.setenv("PATH", str(no_lfs))
    with pytest.raises(Refusal) as exc:
        check_git_lfs_seat("default", seat, record)
    assert exc.value.code == "git-lfs-missing" and "seat default" in exc.value.message
    assert "git-lfs is not on this host's PATH" in exc.value.message
    assert "apt-get install git-lfs" in exc.value.cure and "git lfs install" in exc.value.cure
    with pytest.raises(Refusal) as exc:
        await restore_repository(seat, record, target, stamp=STAMP)
    assert exc.value.code == "git-lfs-missing" and not target.exists()
    monkeypatch.setenv("PATH", path)

    # The filter installed globally at the source: the carried config sets none.
    git(repo, "config", "--local", "--remove-section", "filter.lfs")
    git(repo, "lfs", "install", "--skip-repo")
    global_seat = seat_dir_for(tmp_path, "global")
    record = await capture_repository(repo, global_seat)
    check_git_lfs_seat("default", global_seat, record)
    (isolated_home / ".gitconfig").unlink()
    with pytest.raises(Refusal) as exc:
        check_git_lfs_seat("default", global_seat, record)
    assert exc.value.code == "git-lfs-missing" and "global" in exc.value.message
    # The first refusal kept its staging beside the target as evidence: another target here.
    target = tmp_path / "dest-global" / "work"
    with pytest.raises(Refusal) as exc:
        await restore_repository(global_seat, record, target, stamp=STAMP)
    assert exc.value.code == "git-lfs-missing" and not target.exists()


def sparse_worktree_with_submodule(path: Path, origins: Path, seat: str = "seat") -> Path:
    """The shapes combined: a superproject (`path/main`) with a submodule (`libs/sub`, cloned
    from an origin under `origins` that is then deleted), and the seat's linked worktree of it
    (`path/<seat>`, branch `seat`) with the submodule checked out there (git keeps its git dir
    under the worktree's own, `worktrees/<id>/modules/libs/sub`) and a sparse cone of its own
    (`libs`, `src`: `docs/` left out). The submodule has staged, unstaged and untracked work;
    the worktree an unstaged change inside its cone and an untracked file."""
    inner = _committed(origins / "inner", {"a.txt": "inner v1\n", "b.txt": "b\n"})
    main = _committed(
        path / "main",
        {"top.txt": "top\n", "src/app.py": "app v1\n", "docs/guide.md": "guide\n"},
    )
    _add_submodule(main, inner, "libs/sub")
    tree = path / seat
    git(main, "worktree", "add", "-q", "-b", "seat", str(tree))
    git(tree, "-c", "protocol.file.allow=always", "submodule", "update", "-q", "--init")
    git(tree, "sparse-checkout", "set", "--cone", "libs", "src")
    shutil.rmtree(origins)
    sub = tree / "libs" / "sub"
    write(sub / "a.txt", "staged in the worktree's submodule\n")
    git(sub, "add", "a.txt")
    write(sub / "b.txt", "unstaged in the worktree's submodule\n")
    write(sub / "notes.txt", "untracked in the worktree's submodule\n")
    write(tree / "src" / "app.py", "app, unstaged\n")
    write(tree / "src" / "new.py", "untracked in the cone\n")
    return tree


def combined_fingerprint(repo: Path) -> dict[str, object]:
    """The worktree's fingerprint and its submodule's, `git submodule status --recursive`, and
    where the submodule's git dir is: restored as a repository of its own, its `.git` file names
    `.git/modules/libs/sub` of the restored repository rather than the source's
    `worktrees/<id>/modules/libs/sub`, so that file's bytes are left out of the tree."""
    top = fingerprint(repo)
    tree = top["tree"]
    assert isinstance(tree, dict) and tree.pop("libs/sub/.git")[0] == "file"
    sub = fingerprint(repo / "libs" / "sub")
    own = git(repo, "rev-parse", "--absolute-git-dir").decode().strip()
    where = git(repo / "libs" / "sub", "rev-parse", "--absolute-git-dir").decode().strip()
    return {
        "top": top,
        "sub": sub,
        "submodules": git(repo, "submodule", "status", "--recursive"),
        "sub-gitdir-under-own": where == f"{own}/modules/libs/sub",
        # The submodule's work tree is its checkout here, whatever its core.worktree says.
        "sub-toplevel": os.path.relpath(
            git(repo / "libs" / "sub", "rev-parse", "--show-toplevel").decode().strip(), repo
        ),
    }


async def test_a_sparse_linked_worktree_with_a_submodule_travels(tmp_path: Path) -> None:
    tree = sparse_worktree_with_submodule(tmp_path / "src", tmp_path / "origins")
    before = combined_fingerprint(tree)
    assert before["sub-gitdir-under-own"] is True
    assert not (tree / "docs" / "guide.md").exists()
    seat, record, target = await round_trip(tmp_path, tree)

    assert record.sparse is not msgspec.UNSET and record.submodules is not msgspec.UNSET
    assert combined_fingerprint(target) == before
    dotgit = target / "libs" / "sub" / ".git"
    assert dotgit.read_bytes() == b"gitdir: ../../.git/modules/libs/sub\n"
    assert git(target / "libs" / "sub", "config", "core.worktree") == b"../../../../libs/sub\n"
    git(target / "libs" / "sub", "fsck", "--no-progress")


@pytest.mark.parametrize("orphan", [False, True], ids=["fresh-init", "orphan-branch"])
async def test_an_unborn_branch_travels(tmp_path: Path, orphan: bool) -> None:
    """A repository with no commit yet on HEAD's branch (`git init` and work, or `git
    checkout --orphan` in a repository with history): its staged, unstaged, intent-to-add and
    untracked work, the branch HEAD names, and the repository's other refs."""
    if orphan:
        repo = small_history(tmp_path / "work")
        git(repo, "checkout", "-q", "--orphan", "fresh")
        git(repo, "rm", "-q", "-r", "--cached", ".")
        write(repo / "src" / "app.py", "print('staged')\n")
        git(repo, "add", "src/app.py")
        write(repo / "src" / "app.py", "print('staged, then edited')\n")
        write(repo / "later.txt", "intent to add\n")
        git(repo, "add", "-N", "later.txt")
        write(repo / "notes.txt", "untracked\n")
    else:
        repo = unborn_repo(tmp_path / "work")
    before = fingerprint_unborn(repo)

    seat, record, target = await round_trip(tmp_path, repo)

    assert record.base is None
    assert record.head == ("refs/heads/fresh" if orphan else "refs/heads/main")
    assert (record.bundle is None) == (not orphan) and (record.refs is None) == (not orphan)
    assert fingerprint_unborn(target) == before
    assert git(target, "rev-parse", "--verify", "-q", "HEAD", check=False) == b""
    # The first commit there is the seat's to make.
    git(target, "commit", "-q", "-m", "first")
    assert git(target, "show", "HEAD:src/app.py") == b"print('staged')\n"


def fingerprint_unborn(repo: Path) -> dict[str, object]:
    """`fingerprint` without what needs a HEAD commit."""
    return {
        "status": git(
            repo, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--", ":!.cotal"
        ),
        "tree": tree_digest(repo),
        "branch": git(repo, "symbolic-ref", "-q", "HEAD", check=False),
        "refs": git(repo, "for-each-ref", "--format=%(objectname) %(refname)"),
        "history": git(repo, "log", "--all", "--format=%H %P", check=False),
        "index": git(repo, "ls-files", "-s", "-t", "-v", "-z"),
        "cached": git(repo, "diff", "--cached", "--binary"),
    }


def _sparse_submodule_work(sub: Path) -> None:
    """A cone of the submodule's own (`git sparse-checkout` moves its core.worktree into its
    config.worktree), an assume-unchanged local edit and a skip-worktree one."""
    write(sub / "docs" / "guide.md", "the submodule's guide\n")
    write(sub / "keep" / "k.txt", "kept in the cone\n")
    git(sub, "add", "-A")
    git(sub, "commit", "-q", "-m", "two directories")
    git(sub, "sparse-checkout", "set", "--cone", "keep")
    assert not (sub / "docs").exists()
    git(sub, "update-index", "--assume-unchanged", "a.txt")
    write(sub / "a.txt", "a local edit git does not see\n")


@pytest.mark.parametrize("layout", ["main", "linked-worktree"])
async def test_a_submodules_sparse_checkout_and_bits_travel(tmp_path: Path, layout: str) -> None:
    """A submodule's own sparse checkout, config.worktree (with the core.worktree `git
    sparse-checkout` moved there, set again for the layout restored) and assume-unchanged
    edit, stored under its prefix: in a main checkout, and in a linked worktree restored as a
    repository of its own (where that core.worktree's path changes)."""
    if layout == "main":
        repo = with_submodules(tmp_path / "super", tmp_path / "origins")
        sub = repo / "libs" / "sub"
        print_of = submodule_fingerprint
    else:
        repo = sparse_worktree_with_submodule(tmp_path / "src", tmp_path / "origins")
        sub = repo / "libs" / "sub"
        print_of = combined_fingerprint
    _sparse_submodule_work(sub)

    def without_layout(tree: Path) -> dict[str, object]:
        # The one setting of the submodule's that names where its checkout is from its git dir,
        # checked below for the layout restored.
        found = print_of(tree)
        own = found["sub" if layout != "main" else "libs/sub"]
        assert isinstance(own, dict) and isinstance(own["worktree-config"], bytes)
        lines = own["worktree-config"].split(b"\n")
        own["worktree-config"] = b"\n".join(x for x in lines if not x.startswith(b"\tworktree"))
        return found

    before = without_layout(repo)
    seat, record, target = await round_trip(tmp_path, repo)

    assert record.submodules is not msgspec.UNSET
    carried = record.submodules[0].repository
    assert carried is not None and carried.sparse is not msgspec.UNSET
    assert carried.worktree_config is not msgspec.UNSET
    assert carried.worktree_config.file == "sm1-git-config-worktree"
    assert carried.unwatched is not msgspec.UNSET and carried.unwatched.entries == 1
    assert without_layout(target) == before
    moved = target / "libs" / "sub"
    assert (moved / "a.txt").read_bytes() == b"a local edit git does not see\n"
    assert not (moved / "docs").exists()
    gitdir = target / ".git" / "modules" / "libs" / "sub"
    worktree_setting = git(gitdir, "config", "--file", "config.worktree", "core.worktree")
    assert worktree_setting.strip().decode() == os.path.relpath(moved, gitdir)
    assert git(gitdir, "config", "--file", "config", "core.worktree", check=False) == b""
