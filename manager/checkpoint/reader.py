"""The checkpoint reader and gate 1, integrity (record 2.2; docs/cli.md `checkpoint verify`).

A record is read without following symlinks, under its size cap, and re-stat'd after reading;
it is then parsed strictly and its Ed25519 signature verified. Integrity then proves every file
the record names is present, regular, of its recorded size and digest, and did not change while
it was hashed, and that nothing else sits beside it. Every file-level failure is one stable code,
`integrity`, with the file, what differed, and the cure; nothing downstream runs after one.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Collection
from pathlib import Path

from connectors.privatefs import UnsafeFile, read_stable, stream_stable
from manager.workspace import ed25519
from manager.workspace.trust import fingerprint
from protocol.checkpoint import (
    CHECKPOINT_CAP,
    CHECKPOINT_FILE,
    INBOX_FILE_CAP,
    MANIFEST_CAP,
    MANIFEST_FILE,
    MAX_CARRIED_BYTES,
    MAX_CARRIED_HEADER_BYTES,
    MAX_CARRIED_MESSAGES,
    MAX_MESSAGE_HEADER_BYTES,
    AttemptManifest,
    ChannelState,
    FileRef,
    InboxOverCap,
    InboxReader,
    ManifestSeat,
    SeatCheckpoint,
    SpaceRecord,
    checkpoint_files,
    decode_manifest,
    decode_seat_checkpoint,
    signing_payload,
)
from protocol.errors import DecodeError, Refusal
from protocol.refusals import Code

_CURE_DAMAGED = (
    "the checkpoint was altered or damaged after it was sealed; copy the attempt directory again "
    "from the source host, or cut a new checkpoint"
)


def _integrity(path: Path, detail: str, cure: str = _CURE_DAMAGED) -> Refusal:
    return Refusal(Code.INTEGRITY, f"checkpoint integrity: {path} {detail}", cure)


def verify_file(directory: Path, ref: FileRef, inbox: InboxReader | None = None) -> None:
    """Gate 1 for one file: present, regular, not a symlink, recorded size and sha256, stable.
    With `inbox`, the file is also proven line by line as it is hashed (the carried inbox), so
    neither a verify nor a restore holds more than a line of it to refuse it."""
    path = Path(directory) / ref.file
    digest = hashlib.sha256()
    read = 0
    # Raised only once the digest holds: a damaged file is `integrity`, whatever its lines say.
    problem: ValueError | None = None

    def consume(chunk: bytes) -> None:
        nonlocal read, problem
        digest.update(chunk)
        read += len(chunk)
        if inbox is not None and problem is None:
            try:
                inbox.feed(chunk)
            except ValueError as exc:
                problem = exc

    try:
        stream_stable(path, consume, expect_size=ref.bytes)
    except UnsafeFile as exc:
        match exc.problem:
            case "missing":
                raise _integrity(path, f"is missing from {directory}") from None
            case "symlink":
                raise _integrity(path, "is a symlink; the record names a regular file") from None
            case "size":
                raise _integrity(path, f"{exc.detail}, the record says {ref.bytes}") from None
            case "unstable":
                raise _integrity(
                    path, exc.detail, "retry once nothing writes to the checkpoint"
                ) from None
            case _:
                raise _integrity(path, exc.detail) from None
    if read != ref.bytes:
        raise _integrity(path, f"ended after {read} of {ref.bytes} bytes")
    if digest.hexdigest() != ref.sha256:
        raise _integrity(path, f"hashes to {digest.hexdigest()}, the record says {ref.sha256}")
    if inbox is not None:
        try:
            if problem is not None:
                raise problem
            inbox.finish()
        except InboxOverCap as exc:
            raise _inbox_too_large(path, str(exc)) from None
        except ValueError as exc:
            raise _integrity(path, f"does not match its seat's record: {exc}") from None


def _inbox_too_large(path: Path, what: str) -> Refusal:
    return Refusal(
        Code.INBOX_TOO_LARGE,
        f"carried inbox {path}: {what}",
        "a checkpoint carries at most "
        f"{MAX_CARRIED_MESSAGES} messages, {MAX_CARRIED_BYTES} payload bytes and "
        f"{MAX_CARRIED_HEADER_BYTES} bytes of headers ({MAX_MESSAGE_HEADER_BYTES} a message); "
        "on the source, resume the seat in place, let it work its inbox down, and cut again; "
        "nothing was changed",
    )


def _read_record(path: Path, cap: int, what: str) -> bytes:
    try:
        return read_stable(path, cap=cap, what=what).data
    except Refusal as exc:
        # Missing, symlinked, oversized or moving record files are integrity failures too.
        raise Refusal(
            Code.INTEGRITY, f"checkpoint integrity: {exc.message}", exc.cure or _CURE_DAMAGED
        ) from None


def verify_signature(
    record: SeatCheckpoint | AttemptManifest,
    *,
    what: str,
    trusted_keys: Collection[str] | None = None,
) -> None:
    """The signature must verify under the recorded key, and that key must be trusted if a set
    is given.

    A recorded key alone proves the record is unaltered since a signer sealed it, not who that
    signer was. `trusted_keys=None` checks the signature without judging the signer, which is
    for tools that inspect or re-seal a checkpoint; admission (`admit.integrity`) always passes
    a set, and an empty one trusts nobody.
    """
    if record.signer is None or not record.signature:
        raise Refusal(
            Code.BAD_SIGNATURE,
            f"{what} is not signed",
            "cut a new checkpoint; an unsigned record is never admitted",
        )
    if not ed25519.verifies_b64(
        record.signer.public_key, record.signature, signing_payload(record)
    ):
        raise Refusal(
            Code.BAD_SIGNATURE,
            f"{what} signature does not verify under its recorded public key "
            f"{record.signer.public_key}",
            "the record was altered after sealing; copy it again from the source host or cut a "
            "new checkpoint",
        ) from None
    if trusted_keys is not None and record.signer.public_key not in trusted_keys:
        raise untrusted_signer(what, record.signer.public_key, record.signer.instance_id)


def untrusted_signer(what: str, key: str, instance_id: str) -> Refusal:
    """The refusal for a valid signature by a key this destination does not trust.

    It prints what the operator needs to decide: the key, its fingerprint, and the command that
    trusts it. Trusting it on the strength of this message alone would trust whoever forged the
    checkpoint, so the cure says to compare the fingerprint with the source first.
    """
    return Refusal(
        Code.UNTRUSTED_SIGNER,
        f"{what} was sealed by manager instance {instance_id} with key {key} "
        f"(fingerprint {fingerprint(key)}), which this destination does not trust",
        "verify the key out of band first: on the source host `cotal status` prints its manager "
        "instance key and fingerprint; only when they match, run "
        f"`cotal trust add {key} --name {instance_id}` (or pass --trust-signer {key} for this "
        "run) and retry",
    )


def _parse_seat(data: bytes, path: Path, trusted_keys: Collection[str] | None) -> SeatCheckpoint:
    try:
        record = decode_seat_checkpoint(data)
    except DecodeError as exc:
        raise Refusal(
            exc.code,
            f"seat checkpoint {path} is malformed: {exc.message}",
            "copy the checkpoint again from the source host, or cut the seat again",
        ) from None
    verify_signature(record, what=f"seat checkpoint {path}", trusted_keys=trusted_keys)
    return record


def read_seat_checkpoint(
    seat_dir: Path, *, trusted_keys: Collection[str] | None = None
) -> SeatCheckpoint:
    """Read, parse and verify one seat's `checkpoint.json` (it does not hash the files it names)."""
    path = Path(seat_dir) / CHECKPOINT_FILE
    return _parse_seat(_read_record(path, CHECKPOINT_CAP, "seat checkpoint"), path, trusted_keys)


def read_manifest(
    attempt_dir: Path, *, trusted_keys: Collection[str] | None = None
) -> AttemptManifest:
    path = Path(attempt_dir) / MANIFEST_FILE
    manifest = decode_manifest(_read_record(path, MANIFEST_CAP, "checkpoint manifest"))
    verify_signature(manifest, what=f"checkpoint manifest {path}", trusted_keys=trusted_keys)
    return manifest


def _check_exact_entries(directory: Path, expected: set[str]) -> None:
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        raise _integrity(directory, "is missing") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise _integrity(directory, "is not a plain directory (a symlink or a file is there)")
    extra = sorted(set(os.listdir(directory)) - expected)
    if extra:
        names = ", ".join(extra)
        raise _integrity(
            directory,
            f"holds entries its record does not name: {names}",
            "a sealed checkpoint holds exactly the files its record names; move the extra entries "
            "out "
            "(a leftover .*.tmp is a write interrupted after sealing) and retry",
        )


def verify_seat_files(seat_dir: Path, record: SeatCheckpoint) -> None:
    """Gate 1 over one seat directory: every named file, and nothing else; the carried inbox
    proven against its record and under the caps while it is hashed."""
    refs = checkpoint_files(record)
    _check_exact_entries(Path(seat_dir), {CHECKPOINT_FILE, *(ref.file for ref in refs)})
    space = record.space_state
    # Each carried file is proven against the part of the record that names it as it is hashed.
    carried: dict[str, SpaceRecord | ChannelState] = {}
    if space is not None:
        carried[space.inbox.file] = space
        carried.update((c.posts.file, c) for c in space.channels)
    for part in carried.values():
        ref = part.inbox if isinstance(part, SpaceRecord) else part.posts
        if ref.bytes > INBOX_FILE_CAP:
            raise _inbox_too_large(
                Path(seat_dir) / ref.file,
                f"its record names {ref.bytes} bytes, more than the {INBOX_FILE_CAP} a "
                "checkpoint's carried messages can be",
            )
    for ref in refs:
        found = carried.get(ref.file)
        verify_file(Path(seat_dir), ref, None if found is None else InboxReader(found, keep=False))


def verify_integrity(
    attempt_dir: Path, *, trusted_keys: Collection[str] | None = None
) -> list[SeatCheckpoint]:
    """Gate 1 over a whole attempt: the manifest, the resume document, every seat and every file.

    Returns the seat records in manifest order; a single failure anywhere refuses the attempt.
    """
    attempt_dir = Path(attempt_dir)
    manifest = read_manifest(attempt_dir, trusted_keys=trusted_keys)
    _check_exact_entries(
        attempt_dir, {MANIFEST_FILE, manifest.resume.file, *(seat.dir for seat in manifest.seats)}
    )
    verify_file(attempt_dir, manifest.resume)
    records: list[SeatCheckpoint] = []
    for seat in manifest.seats:
        seat_dir = attempt_dir / seat.dir
        path = seat_dir / CHECKPOINT_FILE
        record, _ = _read_named_seat(attempt_dir, seat, manifest, trusted_keys)
        assert (
            record.signer is not None and manifest.signer is not None
        )  # verify_signature proved both
        if record.signer.public_key != manifest.signer.public_key:
            raise Refusal(
                Code.BAD_SIGNATURE,
                f"seat checkpoint {path} was sealed by key {record.signer.public_key}, "
                f"the manifest by {manifest.signer.public_key}",
                "one attempt is sealed by one manager; do not mix seat directories from different "
                "cuts",
            )
        verify_seat_files(seat_dir, record)
        records.append(record)
    return records


def read_sealed_seat(
    attempt_dir: Path, seat: str, *, trusted_keys: Collection[str] | None
) -> tuple[AttemptManifest, SeatCheckpoint, str] | None:
    """One seat of a sealed attempt without hashing its files: the signed manifest, the seat's
    signed record proven to be the one the manifest names, and that record's sha256. None when
    the attempt holds no such seat. Used for an incremental cut's predecessor, whose files the
    caller proves one by one as it needs them.
    """
    attempt_dir = Path(attempt_dir)
    manifest = read_manifest(attempt_dir, trusted_keys=trusted_keys)
    entry = next((s for s in manifest.seats if s.name == seat), None)
    if entry is None:
        return None
    record, digest = _read_named_seat(attempt_dir, entry, manifest, trusted_keys)
    return manifest, record, digest


def _read_named_seat(
    attempt_dir: Path,
    entry: ManifestSeat,
    manifest: AttemptManifest,
    trusted_keys: Collection[str] | None,
) -> tuple[SeatCheckpoint, str]:
    """The seat record the manifest's `entry` names, proven to be those very bytes, signed, and
    for that seat in the manifest's space; with its sha256."""
    path = attempt_dir / entry.dir / CHECKPOINT_FILE
    data = _read_record(path, CHECKPOINT_CAP, "seat checkpoint")
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != entry.checkpoint.bytes or digest != entry.checkpoint.sha256:
        raise _integrity(
            path,
            f"is {len(data)} bytes hashing to {digest}, the manifest says "
            f"{entry.checkpoint.bytes} bytes hashing to {entry.checkpoint.sha256}",
        )
    record = _parse_seat(data, path, trusted_keys)
    if record.name != entry.name or record.space != manifest.space:
        raise _integrity(
            path,
            f"is for seat {record.name!r} in space {record.space!r}, the manifest says "
            f"{entry.name!r} in {manifest.space!r}",
        )
    return record, digest
