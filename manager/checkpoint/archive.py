"""The packed checkpoint's format, both ways: one POSIX ustar archive of a sealed attempt
directory, written by the source (`write_archive`), and unpacked by the destination into
`.cotal/maintenance/v1/incoming/<attempt>/` (`unpack`) after every header was checked
(`packfile`: regular files and directories only, plain relative names inside the attempt,
sizes the file itself holds, zero padding). A pack sealed to one root (`--to KEY`) is the same
archive encrypted in chunks (`sealed`): only the root holding that box key opens it, into an
unnamed file in its private staging, and the plaintext is then read as any unsealed pack. The
hand-off a pack records and what the CLI prints are `manager/coord/checkpoints.py`'s.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

from connectors.privatefs import ensure_private_dir, fsync_dir
from manager.checkpoint import packfile, sealed
from manager.workspace import boxkey
from manager.workspace.layout import Layout
from protocol.errors import Refusal
from protocol.refusals import Code

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

# A ustar size field is 11 octal digits; the destination reads ustar and nothing else.
_USTAR_SIZE_LIMIT = 8**11


# -- pack (the source) -----------------------------------------------------------------------


def _members(attempt_dir: Path) -> Iterator[tuple[Path, str]]:
    """Every entry of the attempt, sorted, as (path, archive name); anything but a regular file
    or a directory refuses, since the destination would refuse it anyway."""
    base = attempt_dir.name
    yield attempt_dir, base
    for dirpath, dirnames, files in os.walk(attempt_dir):
        dirnames.sort()
        for name in sorted(dirnames + files):
            path = Path(dirpath) / name
            st = os.lstat(path)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                raise Refusal(
                    Code.NOT_PACKABLE,
                    f"{path} is neither a regular file nor a directory",
                    "a sealed checkpoint holds only files and directories; cut again",
                )
            if st.st_size >= _USTAR_SIZE_LIMIT and stat.S_ISREG(st.st_mode):
                raise Refusal(
                    Code.NOT_PACKABLE,
                    f"{path} is {st.st_size} bytes, more than one ustar member holds "
                    f"({_USTAR_SIZE_LIMIT - 1})",
                    "copy the attempt directory to the destination instead and resume it with "
                    "`cotal up --restore DIR`",
                )
            yield path, f"{base}/{path.relative_to(attempt_dir).as_posix()}"


class _Hashing:
    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.h = hashlib.sha256()
        self.n = 0

    def tell(self) -> int:
        return self.n

    def write(self, data: bytes) -> int:
        self.h.update(data)
        self.n += len(data)
        return self.f.write(data)


def write_archive(
    attempt_dir: Path,
    tmp: Path,
    *,
    to: X25519PublicKey | None = None,
    chunk_bytes: int = sealed.CHUNK_BYTES,
) -> tuple[str, int]:
    """Write the attempt directory to `tmp` (created here, never there before) as one ustar
    archive, synced; the file's sha256 and size. Owner, group and times are zeroed and modes
    masked, so the archive depends only on the attempt's names and contents. With `to`, the
    archive is sealed to that box key as it is written: no plaintext byte reaches the disk."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        out = _Hashing(f)
        sealer = None if to is None else sealed.Sealer(out, to, chunk_bytes)
        sink = out if sealer is None else sealer
        # Owner, group and times are the source host's business, not the destination's.
        with tarfile.open(fileobj=sink, mode="w", format=tarfile.USTAR_FORMAT) as tar:  # type: ignore[call-overload]
            for path, name in _members(attempt_dir):
                info = tar.gettarinfo(str(path), arcname=name)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                info.mode &= 0o755
                if info.isreg():
                    with open(path, "rb") as src:
                        tar.addfile(info, src)
                else:
                    tar.addfile(info)
        if sealer is not None:
            sealer.finish()
        f.flush()
        os.fsync(f.fileno())
    return out.h.hexdigest(), out.n


# -- unpack (the destination) -------------------------------------------------------------------


def _staging_kind(path: Path) -> str | None:
    """What sits at `incoming/<attempt>` when it is not a directory this root unpacked."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            return f"a symlink (to {os.readlink(path)!r})"
        except OSError:
            return "a symlink"
    return "a regular file" if stat.S_ISREG(st.st_mode) else "a special file"


def unpack(src: Path, layout: Layout) -> Path:
    """Unpack into `incoming/<attempt>/`. The archive's every header is checked, and the place
    it goes, before a byte is written (`packfile`); a directory already there is this root's own
    unpacking of the same attempt from an earlier run, and is replaced whole.

    A sealed file is refused `sealed-to-other` at any root but its recipient before anything is
    written; at the recipient it is opened into an unnamed file in the staging directory and
    that plaintext is unpacked as above. A refusal on the way removes the staging directories
    this call created."""
    with packfile.open_pack(src) as pack:
        found = sealed.read_header(pack.fd, src)
        if found is None:
            return _unpack(pack, src, layout)
        key = sealed.recipient_box_key(found, layout)
        made = _make_staging(src, layout)
        try:
            with _opened(found, pack, key, layout.incoming) as plain:
                return _unpack(plain, src, layout)
        except BaseException:
            _take_back(made)
            raise


def _staging_dirs(layout: Layout) -> tuple[Path, ...]:
    return (layout.control, layout.maintenance.parent, layout.maintenance, layout.incoming)


def _make_staging(src: Path, layout: Layout) -> list[Path]:
    """Create the staging directories; those that were not there, to take back on a refusal."""
    made: list[Path] = []
    try:
        for path in _staging_dirs(layout):
            if not os.path.lexists(path):
                made.append(path)
            ensure_private_dir(path)
    except BaseException as exc:
        _take_back(made)
        if isinstance(exc, OSError):
            raise _unpack_failed(src, layout.incoming, exc) from None
        raise
    return made


def _take_back(made: list[Path]) -> None:
    for path in reversed(made):
        with contextlib.suppress(OSError):
            os.rmdir(path)


@contextlib.contextmanager
def _opened(
    found: sealed.Sealed, outer: packfile.Pack, key: boxkey.BoxKey, staging: Path
) -> Iterator[packfile.Pack]:
    """The sealed file's plaintext archive as a `Pack` over an unnamed 0600 file in `staging`,
    gone when it is closed (or when this process dies), whatever happens."""
    try:
        fd = _unnamed(staging)
    except OSError as exc:
        raise _unpack_failed(found.src, staging, exc) from None
    try:
        try:
            sealed.decrypt(found, outer.fd, key, fd)
        except OSError as exc:
            raise _unpack_failed(found.src, staging, exc) from None
        now = os.fstat(outer.fd)
        if (now.st_size, now.st_mtime_ns, now.st_ino) != (
            outer.stat.st_size,
            outer.stat.st_mtime_ns,
            outer.stat.st_ino,
        ):
            raise sealed.corrupt(found.src, "it changed while it was opened")
        yield packfile.Pack(found.src, fd)
    finally:
        os.close(fd)


def _unnamed(directory: Path) -> int:
    try:
        return os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
    # A file system without O_TMPFILE: a name that lives only until the unlink below.
    path = directory / f".opening-{secrets.token_hex(6)}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.unlink(path)
    return fd


def _unpack_failed(src: Path, base: Path, exc: OSError) -> Refusal:
    return Refusal(
        Code.UNPACK_FAILED,
        f"unpacking {src} into {base} failed: {exc.strerror or exc} ({exc.filename or base})",
        "free space or fix permissions under .cotal/maintenance, then retry; nothing outside "
        "the staging directory was written, and it was removed",
    )


def _unpack(pack: packfile.Pack, src: Path, layout: Layout) -> Path:
    plan = pack.plan()
    base = layout.incoming
    staged = base / plan.attempt
    kind = _staging_kind(staged)
    if kind is not None:
        raise Refusal(
            Code.STAGING_OCCUPIED,
            f"cannot unpack {src}: {staged} is {kind}, not a directory this root unpacked",
            f"cotal only ever puts a directory there: remove it (rm {staged}) and retry; "
            "nothing was written",
        )
    for path in _staging_dirs(layout):
        ensure_private_dir(path)
    work = base / f".unpacking-{secrets.token_hex(6)}"
    try:
        os.mkdir(work, 0o700)
        pack.write(plan, work)
        aside: Path | None = None
        if os.path.isdir(staged) and not os.path.islink(staged):
            aside = base / f".replaced-{secrets.token_hex(6)}"
            os.rename(staged, aside)
        os.rename(work / plan.attempt, staged)
        fsync_dir(base)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
    except OSError as exc:
        raise _unpack_failed(src, base, exc) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return staged
