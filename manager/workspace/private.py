"""Private-file primitives: 0600 files in 0700 directories, written atomically, read safely.

A secret or a journal is published by rename only after its bytes and its directory entry are
durable, so a crash leaves either the old file or the new one, never a torn one. Reads refuse
symlinks and re-stat after reading, so a file swapped mid-read is reported, not trusted.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from protocol.errors import Refusal

DIR_MODE = 0o700
FILE_MODE = 0o600


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_private_dir(path: Path) -> Path:
    """Create `path` (and parents) 0700; refuse a symlink or a directory others can reach."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            pass
        st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise Refusal(
            "unsafe-path",
            f"{path} is not a plain directory (a symlink or another file is there)",
            "remove it so cotal can create a private 0700 directory",
        )
    if st.st_uid != os.geteuid():
        raise Refusal("unsafe-path", f"{path} is owned by uid {st.st_uid}, not by us", "fix its ownership")
    if stat.S_IMODE(st.st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE)
    return path


def write_private_atomic(path: Path, data: bytes) -> None:
    """Temp file (O_EXCL, 0600), write, fsync, rename over `path`, fsync the directory."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    try:
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def create_private_exclusive(path: Path, data: bytes) -> bool:
    """Publish `data` at `path` only if nothing is there; False when another creator won.

    The bytes are made durable under a temp name first and then linked into place, so a reader
    never sees a half-written record under the final name.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    try:
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        fsync_dir(path.parent)
        return True
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


@dataclass(frozen=True)
class StableRead:
    data: bytes
    st: os.stat_result


def _identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_stable(path: Path, *, cap: int, what: str, require_private: bool = False) -> StableRead:
    """Read a regular, non-symlink file under a size cap and prove it did not change meanwhile."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refusal("unsafe-path", f"{what} {path} is a symlink", "replace it with the real file") from None
        if exc.errno == errno.ENOENT:
            raise Refusal("missing", f"{what} {path} does not exist", "check the path") from None
        raise
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise Refusal("unsafe-path", f"{what} {path} is not a regular file", "replace it with the real file")
        if require_private and stat.S_IMODE(before.st_mode) & 0o077:
            raise Refusal(
                "not-private",
                f"{what} {path} is not private (mode {stat.S_IMODE(before.st_mode):04o}, expected 0600)",
                f"chmod 600 {path}",
            )
        if before.st_size > cap:
            raise Refusal("too-large", f"{what} {path} is {before.st_size} bytes, over the {cap}-byte cap", "check the file")
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, 1024 * 1024)
            if not chunk:
                break
            total += len(chunk)
            if total > cap:
                raise Refusal("too-large", f"{what} {path} grew past the {cap}-byte cap while being read", "retry once it is quiet")
            chunks.append(chunk)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    try:
        again = os.lstat(path)
    except FileNotFoundError:
        again = None
    if again is None or _identity(before) != _identity(after) or _identity(after) != _identity(again):
        raise Refusal("unstable", f"{what} {path} changed while it was being read", "retry once nothing writes to it")
    return StableRead(b"".join(chunks), after)
