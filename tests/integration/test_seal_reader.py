"""Seal an attempt from a real capture, then prove the reader refuses every kind of damage."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from manager.checkpoint.confine import place_session_file, session_destination
from manager.checkpoint.gitstate import capture_repository
from manager.checkpoint.reader import read_manifest, read_seat_checkpoint, verify_integrity
from manager.checkpoint.restore import restore_repository
from manager.checkpoint.seal import (
    capture_file,
    create_seat_dir,
    seal_manifest,
    seal_seat,
    sign_record,
    write_file_exclusive,
)
from protocol.checkpoint import (
    MANIFEST_FORMAT,
    SEAT_CHECKPOINT_FORMAT,
    AttemptManifest,
    ManifestSeat,
    SeatCheckpoint,
    SessionFile,
    SessionRecord,
    continuity_capped,
)
from protocol.codec import encode_json
from protocol.errors import Refusal
from protocol.instant import format_instant
from tests.gitrepo import git, init_repo, make_rich_repo, tree_digest, write

pytestmark = pytest.mark.usefixtures("isolated_home")

INSTANCE = "m" * 26
UID = "0123456789abcdefghijklmnop"


def public_b64(key: Ed25519PrivateKey) -> str:
    return base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


@dataclass
class Attempt:
    dir: Path
    key: Ed25519PrivateKey
    pub: str
    source: Path
    session_src: Path


async def build_attempt(tmp_path: Path) -> Attempt:
    key = Ed25519PrivateKey.generate()
    pub = public_b64(key)
    source = make_rich_repo(tmp_path / "src")
    attempt = tmp_path / "srcroot" / ".cotal" / "maintenance" / "v1" / "checkpoints" / "att-1"

    seat = create_seat_dir(attempt, "default")
    repository = await capture_repository(source, seat)
    sessions = tmp_path / "srcroot" / ".cotal" / "sessions" / "scribe"
    write(
        sessions / f"default-{UID}.json", '{"version":1,"sessionId":"sess-1","status":"running"}\n'
    )
    write(
        sessions / f"default-{UID}.store" / "log.jsonl", '{"turn":1,"text":"juniper-ledger-41"}\n'
    )
    pointer = capture_file(sessions / f"default-{UID}.json", seat, "session-pointer.json")
    store = capture_file(sessions / f"default-{UID}.store" / "log.jsonl", seat, "session-store.0")
    continuity = continuity_capped("exact", True, 1, True)
    record = SeatCheckpoint(
        format=SEAT_CHECKPOINT_FORMAT,
        entry={
            "space": "main",
            "name": "default",
            "launch": {"connector": "scribe", "cwd": str(source)},
        },
        space="main",
        name="default",
        lifecycle_uid=UID,
        generation=3,
        captured_at=format_instant(datetime.now(UTC)),
        profile=hashlib.sha256(b"profile").hexdigest(),
        repository=repository,
        session=SessionRecord(
            continuity=continuity,
            session_id="sess-1",
            pointer=SessionFile(
                anchor="workspace-root",
                relpath=f".cotal/sessions/scribe/default-{UID}.json",
                file=pointer,
            ),
            store=[
                SessionFile(
                    anchor="workspace-root",
                    relpath=f".cotal/sessions/scribe/default-{UID}.store/log.jsonl",
                    file=store,
                )
            ],
        ),
    )
    checkpoint = seal_seat(seat, record, key.sign, pub, INSTANCE)

    small = init_repo(tmp_path / "small")
    write(small / "a.txt", "a\n")
    git(small, "add", "a.txt")
    git(small, "commit", "-q", "-m", "a")
    seat2 = create_seat_dir(attempt, "worker_2")
    record2 = msgspec.structs.replace(
        record,
        name="worker_2",
        entry={"name": "worker_2"},
        repository=await capture_repository(small, seat2),
        session=SessionRecord(continuity=continuity_capped("exact", False, 0, False)),
    )
    checkpoint2 = seal_seat(seat2, record2, key.sign, pub, INSTANCE)

    resume = write_file_exclusive(
        attempt, "resume.json", b'{"version":"cotal-manager-resume/v1"}\n'
    )
    manifest = AttemptManifest(
        format=MANIFEST_FORMAT,
        attempt_id="att-1",
        space="main",
        created_at=format_instant(datetime.now(UTC)),
        seats=[
            ManifestSeat(name="default", dir="default", checkpoint=checkpoint),
            ManifestSeat(name="worker_2", dir="worker_2", checkpoint=checkpoint2),
        ],
        resume=resume,
    )
    seal_manifest(attempt, manifest, key.sign, pub, INSTANCE)
    return Attempt(attempt, key, pub, source, sessions)


@pytest.fixture
async def attempt(tmp_path: Path) -> Attempt:
    return await build_attempt(tmp_path)


def expect_refusal(code: str, fn: Callable[[], object]) -> Refusal:
    with pytest.raises(Refusal) as err:
        fn()
    assert err.value.code == code, err.value.text
    return err.value


# -- the sealed attempt -----------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_sealed_attempt_verifies_and_is_private(attempt: Attempt) -> None:
    records = verify_integrity(attempt.dir, trusted_keys={attempt.pub})
    assert [r.name for r in records] == ["default", "worker_2"]
    assert (
        records[0].session.continuity == "exact" and records[1].session.continuity == "drain-only"
    )
    assert records[0].signer is not None and records[0].signer.instance_id == INSTANCE
    assert records[0].generation == 3 and records[0].entry["launch"]["connector"] == "scribe"
    assert read_manifest(attempt.dir).attempt_id == "att-1"
    for seat in ("default", "worker_2"):
        seat_dir = attempt.dir / seat
        assert stat.S_IMODE(os.lstat(seat_dir).st_mode) == 0o700
        for path in seat_dir.iterdir():
            assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600, path
    assert stat.S_IMODE(os.lstat(attempt.dir / "manifest.json").st_mode) == 0o600


@pytest.mark.anyio
async def test_a_verified_attempt_restores_on_another_root(
    attempt: Attempt, tmp_path: Path
) -> None:
    # A copy of the attempt is what arrives on the destination host.
    dest_root = tmp_path / "dest"
    arrived = dest_root / ".cotal" / "maintenance" / "v1" / "checkpoints" / "att-1"
    shutil.copytree(attempt.dir, arrived)
    [record, _] = verify_integrity(arrived, trusted_keys={attempt.pub})
    result = await restore_repository(
        arrived / "default", record.repository, dest_root, stamp="20261129T140000Z"
    )
    assert result.superseded is None  # the root held only its .cotal: nothing to move aside
    assert tree_digest(dest_root)["untracked.txt"] == tree_digest(attempt.source)["untracked.txt"]
    entries = [record.session.pointer, *record.session.store]
    for entry in entries:
        assert entry is not None
        dest = session_destination(
            entry, cwd=dest_root, workspace_root=dest_root, home=tmp_path / "home"
        )
        assert (
            place_session_file(
                arrived / "default" / entry.file.file, dest, expected_sha256=entry.file.sha256
            )
            == "placed"
        )
    assert (
        b"juniper-ledger-41"
        in (dest_root / f".cotal/sessions/scribe/default-{UID}.store/log.jsonl").read_bytes()
    )


# -- gate 1: integrity ------------------------------------------------------------------------


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _symlink(path: Path) -> None:
    # Same bytes, outside the attempt: only the link itself is wrong.
    elsewhere = path.parent.parent.parent / f"elsewhere-{path.name}"
    elsewhere.write_bytes(path.read_bytes())
    path.unlink()
    os.symlink(elsewhere, path)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("damage", "file", "detail"),
    [
        pytest.param(_flip, "default/repo.bundle", "hashes to", id="flipped-byte"),
        pytest.param(_truncate, "default/untracked.tar", "bytes, the record says", id="truncated"),
        pytest.param(_symlink, "default/session-store.0", "is a symlink", id="symlink"),
        pytest.param(Path.unlink, "default/index.diff", "is missing", id="missing"),
        pytest.param(_flip, "resume.json", "hashes to", id="resume-flipped"),
        pytest.param(_symlink, "worker_2/checkpoint.json", "symlink", id="record-symlink"),
        pytest.param(
            Path.unlink, "worker_2/checkpoint.json", "does not exist", id="record-missing"
        ),
    ],
)
async def test_damage_refuses_with_integrity(
    attempt: Attempt, damage: Callable[[Path], None], file: str, detail: str
) -> None:
    path = attempt.dir / file
    os.chmod(path, 0o600)
    damage(path)
    err = expect_refusal("integrity", lambda: verify_integrity(attempt.dir))
    assert str(path) in err.message and detail in err.message
    assert err.cure


@pytest.mark.anyio
@pytest.mark.parametrize("where", ["default", "."])
async def test_an_extra_file_refuses_by_name(attempt: Attempt, where: str) -> None:
    (attempt.dir / where / "extra.txt").write_bytes(b"not part of the checkpoint")
    err = expect_refusal("integrity", lambda: verify_integrity(attempt.dir))
    assert "extra.txt" in err.message


@pytest.mark.anyio
async def test_a_rewritten_record_fails_its_digest_and_its_signature(attempt: Attempt) -> None:
    path = attempt.dir / "default" / "checkpoint.json"
    record = read_seat_checkpoint(path.parent)
    forged = msgspec.structs.replace(record, generation=record.generation + 1)
    os.chmod(path, 0o600)
    path.write_bytes(encode_json(forged))
    # Through the manifest, the record's digest no longer matches.
    err = expect_refusal("integrity", lambda: verify_integrity(attempt.dir))
    assert "the manifest says" in err.message
    # Read on its own, the signature no longer verifies.
    expect_refusal("bad-signature", lambda: read_seat_checkpoint(path.parent))


@pytest.mark.anyio
async def test_a_forged_manifest_signature_refuses(attempt: Attempt) -> None:
    path = attempt.dir / "manifest.json"
    manifest = read_manifest(attempt.dir)
    os.chmod(path, 0o600)
    path.write_bytes(encode_json(msgspec.structs.replace(manifest, attempt_id="att-2")))
    expect_refusal("bad-signature", lambda: read_manifest(attempt.dir))
    expect_refusal("bad-signature", lambda: verify_integrity(attempt.dir))

    # An unsigned record is no better than a forged one.
    path.write_bytes(encode_json(msgspec.structs.replace(manifest, signature="")))
    expect_refusal("bad-signature", lambda: read_manifest(attempt.dir))


@pytest.mark.anyio
async def test_a_record_resigned_by_another_key_is_untrusted(attempt: Attempt) -> None:
    intruder = Ed25519PrivateKey.generate()
    path = attempt.dir / "manifest.json"
    manifest = read_manifest(attempt.dir)
    resigned = sign_record(manifest, intruder.sign, public_b64(intruder), INSTANCE)
    os.chmod(path, 0o600)
    path.write_bytes(encode_json(resigned))
    assert read_manifest(attempt.dir).attempt_id == "att-1"  # self-consistent...
    expect_refusal(
        "untrusted-signer", lambda: read_manifest(attempt.dir, trusted_keys={attempt.pub})
    )
    # ...but its seats were sealed by a different key than the manifest now claims.
    expect_refusal("bad-signature", lambda: verify_integrity(attempt.dir))


@pytest.mark.anyio
async def test_signing_with_a_key_that_does_not_match_the_recorded_one_refuses(
    attempt: Attempt,
) -> None:
    other = Ed25519PrivateKey.generate()
    manifest = read_manifest(attempt.dir)
    expect_refusal(
        "bad-signature", lambda: sign_record(manifest, other.sign, attempt.pub, INSTANCE)
    )


# -- the writer never overwrites and never leaves a look-alike seal ---------------------------


@pytest.mark.anyio
async def test_the_writer_never_reuses_a_directory_or_a_record(attempt: Attempt) -> None:
    err = expect_refusal("already-sealed", lambda: create_seat_dir(attempt.dir, "late"))
    assert "manifest.json" in err.message
    other = attempt.dir.parent / "att-2"
    create_seat_dir(other, "default")
    err = expect_refusal("checkpoint-exists", lambda: create_seat_dir(other, "default"))
    assert err.message == (
        f"checkpoint directory {other / 'default'} already exists; "
        "a sealed checkpoint is never overwritten"
    )
    assert err.cure == "choose a new attemptId"

    seat = attempt.dir / "default"
    record = read_seat_checkpoint(seat)
    expect_refusal(
        "already-sealed", lambda: seal_seat(seat, record, attempt.key.sign, attempt.pub, INSTANCE)
    )
    manifest = read_manifest(attempt.dir)
    expect_refusal(
        "already-sealed",
        lambda: seal_manifest(attempt.dir, manifest, attempt.key.sign, attempt.pub, INSTANCE),
    )


@pytest.mark.anyio
async def test_an_incomplete_directory_cannot_be_sealed_or_read(attempt: Attempt) -> None:
    record = read_seat_checkpoint(attempt.dir / "default")
    fresh = attempt.dir.parent / "att-3"
    seat = create_seat_dir(fresh, "default")
    # A crash after some files but before the record: nothing reads it as sealed.
    shutil.copy(attempt.dir / "default" / "repo.bundle", seat / "repo.bundle")
    expect_refusal("integrity", lambda: read_seat_checkpoint(seat))
    err = expect_refusal(
        "seal-incomplete", lambda: seal_seat(seat, record, attempt.key.sign, attempt.pub, INSTANCE)
    )
    assert "missing" in err.message
    assert not (seat / "checkpoint.json").exists()
    expect_refusal("integrity", lambda: verify_integrity(fresh))

    # A temp file left by a crash after sealing is an extra entry, never part of the seal.
    (attempt.dir / "default" / ".checkpoint.json.0a1b2c3d4e5f.tmp").write_bytes(b"{}")
    err = expect_refusal("integrity", lambda: verify_integrity(attempt.dir))
    assert ".tmp" in err.message and "interrupted" in err.cure


def test_write_file_exclusive_records_the_bytes_written(tmp_path: Path) -> None:
    ref = write_file_exclusive(tmp_path, "a.bin", [b"one", b"two"])
    assert (ref.file, ref.bytes, ref.sha256) == ("a.bin", 6, hashlib.sha256(b"onetwo").hexdigest())
    assert stat.S_IMODE(os.lstat(tmp_path / "a.bin").st_mode) == 0o600
    expect_refusal("checkpoint-exists", lambda: write_file_exclusive(tmp_path, "a.bin", b"again"))
    expect_refusal("bad-file-name", lambda: write_file_exclusive(tmp_path, "../x", b""))
    expect_refusal("bad-file-name", lambda: write_file_exclusive(tmp_path, "checkpoint.json", b""))
    os.symlink(tmp_path / "a.bin", tmp_path / "link")
    expect_refusal("unsafe-path", lambda: capture_file(tmp_path / "link", tmp_path, "copy.bin"))
