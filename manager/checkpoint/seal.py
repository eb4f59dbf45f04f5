"""The checkpoint writer: exclusive files first, the record last, the manifest last of all.

Sealing is publication, not a write in place. Every captured file is created with O_EXCL and
fsync'd; the seat directory is fsync'd; only then is `checkpoint.json` made durable under a temp
name and linked into place. `link` refuses an existing name, so a sealed record is never
overwritten, and a crash at any point leaves either no record (the directory is not sealed and
no reader admits it) or a complete one naming bytes that are already on disk.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

import msgspec

from connectors.privatefs import (
    DIR_MODE,
    FILE_MODE,
    UnsafeFile,
    create_private_exclusive,
    ensure_private_dir,
    fsync_dir,
    read_stable,
    stream_stable,
)
from manager.workspace import ed25519
from protocol.checkpoint import (
    CHECKPOINT_CAP,
    CHECKPOINT_FILE,
    FILE_NAME_RE,
    MANIFEST_CAP,
    MANIFEST_FILE,
    RESERVED_FILES,
    AttemptManifest,
    FileRef,
    SeatCheckpoint,
    Signed,
    Signer,
    checkpoint_files,
    decode_manifest,
    decode_seat_checkpoint,
    signing_payload,
    with_signature,
)
from protocol.codec import encode_json
from protocol.errors import Refusal
from protocol.names import check_seat_name
from protocol.refusals import Code

Sign = Callable[[bytes], bytes]
CHUNK = 1024 * 1024


def _check_file_name(name: str) -> str:
    if not FILE_NAME_RE.fullmatch(name) or name in RESERVED_FILES:
        raise Refusal(
            Code.BAD_FILE_NAME,
            f"checkpoint file name {name!r} is not a plain basename or is reserved for the sealed "
            "record",
            "use a basename of letters, digits, '_', '.' and '-' other than checkpoint.json and "
            "manifest.json",
        )
    return name


def create_seat_dir(attempt_dir: Path, seat: str) -> Path:
    """Create `<attempt_dir>/<seat>` 0700, exclusively: a checkpoint directory is never reused."""
    check_seat_name(seat)
    attempt_dir = ensure_private_dir(Path(attempt_dir))
    if os.path.lexists(attempt_dir / MANIFEST_FILE):
        raise Refusal(
            Code.ALREADY_SEALED,
            f"attempt {attempt_dir} is already sealed (it has a {MANIFEST_FILE}); no seat can be "
            "added to it",
            "choose a new attemptId",
        )
    path = attempt_dir / seat
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        raise Refusal(
            Code.EXISTS,
            f"checkpoint directory {path} already exists; a sealed checkpoint is never overwritten",
            "choose a new attemptId",
        ) from None
    # mkdir honours the umask; the directory must be private whatever the umask says.
    os.chmod(path, DIR_MODE)
    fsync_dir(attempt_dir)
    return path


class ExclusiveFile:
    """A new 0600 file created with O_EXCL|O_NOFOLLOW; digest and size are of the bytes written.

    The digest is taken over what this process wrote, not re-read from disk, so the record
    names exactly the bytes the capture produced.
    """

    def __init__(self, directory: Path, name: str) -> None:
        self.path = Path(directory) / _check_file_name(name)
        try:
            self._fd: int | None = os.open(
                self.path,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                FILE_MODE,
            )
        except FileExistsError:
            raise Refusal(
                Code.EXISTS,
                f"checkpoint file {self.path} already exists; a captured file is never overwritten",
                "capture into a fresh checkpoint directory (a new attemptId)",
            ) from None
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._fd is None:
            raise ValueError(f"{self.path} is already closed")
        view = memoryview(data).cast("B")
        self._hash.update(view)
        total = len(view)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        self.size += total
        return total

    def finish(self) -> FileRef:
        """fsync, prove the file holds exactly what was written, close."""
        if self._fd is None:
            raise ValueError(f"{self.path} is already closed")
        fd, self._fd = self._fd, None
        try:
            os.fsync(fd)
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if st.st_size != self.size:
            raise Refusal(
                Code.INTEGRITY,
                f"checkpoint file {self.path} is {st.st_size} bytes after writing {self.size}",
                "something else wrote into the checkpoint directory; cut again under a new "
                "attemptId",
            )
        return FileRef(file=self.path.name, bytes=self.size, sha256=self._hash.hexdigest())

    def abort(self) -> None:
        """Close and remove a file that will not be sealed; it was ours alone (O_EXCL)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def write_file_exclusive(
    directory: Path, name: str, data: bytes | Iterable[bytes] | BinaryIO
) -> FileRef:
    """Write bytes, an iterable of chunks or a binary stream to a new exclusive file."""
    out = ExclusiveFile(directory, name)
    try:
        if isinstance(data, bytes | bytearray | memoryview):
            out.write(data)
        elif hasattr(data, "read"):
            stream: BinaryIO = data  # type: ignore[assignment]
            while chunk := stream.read(CHUNK):
                out.write(chunk)
        else:
            for chunk in data:
                out.write(chunk)
        return out.finish()
    except BaseException:
        out.abort()
        raise


def capture_file(src: Path, directory: Path, name: str) -> FileRef:
    """Copy an existing regular file into the checkpoint, never through a symlink.

    The source is read with `stream_stable`, so a file that moved in any way while it was
    copied (a rename, a rewrite, a chmod) is refused and the partial copy removed.
    """
    src = Path(src)
    out = ExclusiveFile(directory, name)
    try:
        stream_stable(src, out.write)
        return out.finish()
    except UnsafeFile as exc:
        out.abort()
        match exc.problem:
            case "symlink":
                raise Refusal(
                    Code.UNSAFE_PATH, f"capture source {src} is a symlink", "capture the real file"
                ) from None
            case "missing":
                raise Refusal(
                    Code.MISSING, f"capture source {src} does not exist", "check the session path"
                ) from None
            case "not-regular":
                raise Refusal(
                    Code.UNSAFE_PATH,
                    f"capture source {src} is not a regular file",
                    "capture a regular file",
                ) from None
            case "unstable":
                raise Refusal(
                    Code.UNSTABLE,
                    f"capture source {src} changed while it was being copied",
                    "capture only after the seat is proven stopped",
                ) from None
            case _:
                raise OSError(exc.errno, os.strerror(exc.errno), str(src)) from None
    except BaseException:
        out.abort()
        raise


def sign_record(record: Signed, sign: Sign, public_key_b64: str, instance_id: str) -> Signed:
    """Fill the signer, sign the normalized payload, and prove the signature verifies.

    The callable holds the private key so this module never sees it; the verification after
    signing catches a callable whose key is not the public key being recorded.
    """
    signer = Signer(public_key=public_key_b64, instance_id=instance_id)
    unsigned = msgspec.structs.replace(record, signer=signer, signature="")
    signature = sign(signing_payload(unsigned))
    if not ed25519.verifies(public_key_b64, signature, signing_payload(unsigned)):
        raise Refusal(
            Code.BAD_SIGNATURE,
            f"the signing callable's signature does not verify under public key {public_key_b64}",
            "pass the public key of the same Ed25519 key the callable signs with",
        ) from None
    return with_signature(unsigned, signer, signature)


def _record_bytes(record: SeatCheckpoint | AttemptManifest, cap: int, what: str) -> bytes:
    # Indented for a person verifying by hand; the signature is over the normalized form, so
    # layout does not matter to any reader.
    data = msgspec.json.format(encode_json(record), indent=2) + b"\n"
    if len(data) > cap:
        raise Refusal(
            Code.TOO_LARGE,
            f"{what} would be {len(data)} bytes, over the {cap}-byte cap (status and "
            "intent-to-add lists are inline)",
            "reduce the number of changed and untracked paths in the seat's tree before the cut",
        )
    return data


def _check_present(
    directory: Path, refs: Iterable[FileRef], allowed_extra: Iterable[str] = ()
) -> None:
    """Every named file present, regular, of its recorded size, and nothing else beside them."""
    expected = {ref.file: ref for ref in refs}
    for name, ref in expected.items():
        try:
            st = os.lstat(directory / name)
        except FileNotFoundError:
            raise Refusal(
                Code.SEAL_INCOMPLETE,
                f"cannot seal {directory}: {name} is missing",
                "capture every file before sealing",
            ) from None
        if not stat.S_ISREG(st.st_mode) or st.st_size != ref.bytes:
            raise Refusal(
                Code.SEAL_INCOMPLETE,
                f"cannot seal {directory}: {name} is not a regular file of {ref.bytes} bytes",
                "capture into a fresh directory and seal what was captured",
            )
    extra = sorted(set(os.listdir(directory)) - set(expected) - set(allowed_extra))
    if extra:
        raise Refusal(
            Code.SEAL_INCOMPLETE,
            f"cannot seal {directory}: it holds files the record does not name: {', '.join(extra)}",
            "capture into a fresh directory; a sealed directory holds exactly what its record "
            "names",
        )


def _refuse_if_sealed(directory: Path, name: str) -> None:
    if os.path.lexists(directory / name):
        raise Refusal(
            Code.ALREADY_SEALED,
            f"{directory / name} already exists; a sealed checkpoint is never overwritten",
            "choose a new attemptId",
        )


def _publish(directory: Path, name: str, data: bytes) -> FileRef:
    # The directory entries of the captured files must be durable before the record can be.
    fsync_dir(directory)
    if not create_private_exclusive(directory / name, data):
        raise Refusal(
            Code.ALREADY_SEALED,
            f"{directory / name} already exists; a sealed checkpoint is never overwritten",
            "choose a new attemptId",
        )
    return FileRef(file=name, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())


def seal_seat(
    seat_dir: Path, record: SeatCheckpoint, sign: Sign, public_key_b64: str, instance_id: str
) -> FileRef:
    """Sign the record and publish `checkpoint.json`, last, in the seat directory."""
    seat_dir = Path(seat_dir)
    if seat_dir.name != record.name:
        raise Refusal(
            Code.SEAL_INCOMPLETE,
            f"seat {record.name!r} must be sealed in a directory of its own name, not {seat_dir}",
            "create the directory with create_seat_dir(attempt_dir, seat)",
        )
    _refuse_if_sealed(seat_dir, CHECKPOINT_FILE)
    _check_present(seat_dir, checkpoint_files(record))
    signed = sign_record(record, sign, public_key_b64, instance_id)
    data = _record_bytes(signed, CHECKPOINT_CAP, f"seat checkpoint {seat_dir / CHECKPOINT_FILE}")
    decode_seat_checkpoint(data)  # what is sealed must be what the reader admits
    return _publish(seat_dir, CHECKPOINT_FILE, data)


def seal_manifest(
    attempt_dir: Path, manifest: AttemptManifest, sign: Sign, public_key_b64: str, instance_id: str
) -> FileRef:
    """Publish `manifest.json` after every seat is sealed; the attempt is complete from here on."""
    attempt_dir = Path(attempt_dir)
    _refuse_if_sealed(attempt_dir, MANIFEST_FILE)
    for seat in manifest.seats:
        seat_dir = attempt_dir / seat.dir
        try:
            data = read_stable(
                seat_dir / CHECKPOINT_FILE, cap=CHECKPOINT_CAP, what="seat checkpoint"
            ).data
        except Refusal as exc:
            raise Refusal(
                Code.SEAL_INCOMPLETE,
                f"cannot seal attempt {attempt_dir}: seat {seat.name}: {exc.message}",
                "seal every seat before the manifest",
            ) from None
        if (
            len(data) != seat.checkpoint.bytes
            or hashlib.sha256(data).hexdigest() != seat.checkpoint.sha256
        ):
            raise Refusal(
                Code.SEAL_INCOMPLETE,
                f"cannot seal attempt {attempt_dir}: seat {seat.name}'s {CHECKPOINT_FILE} is not "
                "the one the manifest names",
                "build the manifest from the FileRef seal_seat returned",
            )
    _check_present(
        attempt_dir, [manifest.resume], allowed_extra=[seat.dir for seat in manifest.seats]
    )
    signed = sign_record(manifest, sign, public_key_b64, instance_id)
    data = _record_bytes(signed, MANIFEST_CAP, f"manifest {attempt_dir / MANIFEST_FILE}")
    decode_manifest(data)
    return _publish(attempt_dir, MANIFEST_FILE, data)
