"""Private-file primitives: 0600 files in 0700 directories, written atomically, read safely.

A secret, a journal or a session pointer is published by rename only after its bytes and its
directory entry are durable, so a crash leaves either the old file or the new one, never a torn
one. Reads refuse symlinks and re-stat after reading, so a file swapped mid-read is reported,
not trusted.

They live here, not in `manager/`, because connectors write private files too (pointers, seat
config, seeded sessions) and may not import the manager; `manager.workspace.private` re-exports
them. Three directory rules serve three kinds of caller:

* `ensure_private_dir`: one private directory (the manager's `.cotal/...`); ancestors it has to
  create get the umask's mode, because they may be the operator's own (a `--store-dir`).
* `ensure_seat_dir`: a directory a connector owns for a seat; every directory it creates,
  ancestors included, is 0700, and a refusal names the connector.
* `ensure_private_dirs_below`: directories below a root that must not be left through a symlink
  anywhere on the way (jcode's private home).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from protocol.errors import Refusal
from protocol.refusals import Code
from protocol.session import encode_pointer

DIR_MODE = 0o700
FILE_MODE = 0o600


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- directories ----------------------------------------------------------------------------------


def _plain_dir(st: os.stat_result) -> bool:
    return stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode)


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
    if not _plain_dir(st):
        raise Refusal(
            Code.UNSAFE_PATH,
            f"{path} is not a plain directory (a symlink or another file is there)",
            "remove it so cotal can create a private 0700 directory",
        )
    if st.st_uid != os.geteuid():
        raise Refusal(
            Code.UNSAFE_PATH, f"{path} is owned by uid {st.st_uid}, not by us", "fix its ownership"
        )
    if stat.S_IMODE(st.st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE)
    return path


def make_private_dirs(path: Path) -> None:
    """Create every missing directory of `path`, ancestors included, 0700 whatever the umask.

    Directories that exist are left as they are (a workspace's own ancestors are not ours to
    change); nothing is checked, so a caller that needs a plain directory checks it after.
    """
    path = Path(path)
    for part in [*reversed(path.parents), path]:
        try:
            os.mkdir(part, DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(part, DIR_MODE)


def ensure_seat_dir(path: Path, *, agent: str) -> Path:
    """A connector's private directory for a seat: created like `make_private_dirs`, then
    refused when a symlink or another file is in its place, and made 0700."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        make_private_dirs(path)
        st = os.lstat(path)
    if not _plain_dir(st):
        raise Refusal(
            Code.UNSAFE_PATH,
            f"{agent} connector: {path} is not a plain directory "
            "(a symlink or another file is there)",
            "remove it so cotal can create the seat's private directory",
        )
    if stat.S_IMODE(st.st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE)
    return path


class UnsafeDirectory(Exception):
    """`path` cannot serve as a private directory; `reason` completes the sentence "path ..."."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path} {reason}")
        self.path = path
        self.reason = reason


def ensure_private_dirs_below(root: Path, relparts: Sequence[str]) -> Path:
    """Create `root/relparts...` and return it, never leaving `root` through a symlink.

    Each component is made (0700 where created) and opened with O_NOFOLLOW relative to the one
    before it, so a symlink anywhere below `root` is refused rather than followed out of it.
    The leaf is made 0700 whatever it was. Raises `UnsafeDirectory` when `root` cannot be opened
    ("cannot be opened: ...") or a component is a symlink or not a directory ("is a symlink",
    "is not a directory"); a caller words the refusal. Components must be single names: the
    caller refuses `..` and separators first, with its own words.
    """
    for part in relparts:
        if part in ("", ".", "..") or "/" in part or "\0" in part:
            raise ValueError(f"{part!r} is not a single directory name")
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise UnsafeDirectory(root, f"cannot be opened: {exc.strerror}") from None
    try:
        leaf = walk_below(fd, relparts, create_mode=DIR_MODE, root=root)
    finally:
        os.close(fd)
    try:
        os.fchmod(leaf, DIR_MODE)
    finally:
        os.close(leaf)
    return root.joinpath(*relparts)


def walk_below(
    dir_fd: int, parts: Sequence[str], *, create_mode: int | None = None, root: Path = Path(".")
) -> int:
    """Open `parts` one directory at a time beneath `dir_fd` and return the last one's fd.

    Every step is opened with O_NOFOLLOW|O_DIRECTORY relative to the one before it, so a symlink
    anywhere on the way (planted by an archive member, carried in a tracked tree, or swapped in
    meanwhile) is refused instead of followed out. `create_mode` makes missing directories with
    that mode (the umask applies). `dir_fd` stays open and the caller closes the result. Raises
    `UnsafeDirectory` naming `root/<parts so far>` when a step is a symlink or not a directory.
    """
    fd = os.dup(dir_fd)
    path = root
    try:
        for part in parts:
            path = path / part
            if create_mode is not None:
                try:
                    os.mkdir(part, create_mode, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                child = os.open(
                    part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                try:
                    link = stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode)
                except OSError:
                    link = False
                raise UnsafeDirectory(
                    path, "is a symlink" if link else "is not a directory"
                ) from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_parent_below(
    dir_fd: int, rel: str, *, create_mode: int | None = None, root: Path = Path(".")
) -> tuple[int, str]:
    """`walk_below` to the directory holding the relative path `rel`: (its fd, the leaf name)."""
    parts = rel.split("/")
    return walk_below(dir_fd, parts[:-1], create_mode=create_mode, root=root), parts[-1]


# -- files ----------------------------------------------------------------------------------------


def _durable_temp(path: Path, data: bytes | Iterable[bytes]) -> Path:
    """A sibling temp file of `path` holding `data` (bytes, or chunks a caller streams and may
    refuse by raising), 0600 and fsynced; removed on failure."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(
        tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE
    )
    try:
        try:
            # The umask may only have narrowed the mode; make it exactly 0600.
            os.fchmod(fd, FILE_MODE)
            for chunk in (data,) if isinstance(data, bytes) else data:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def write_private_atomic(path: Path, data: bytes) -> None:
    """Temp file (O_EXCL, 0600), write, fsync, rename over `path`, fsync the directory."""
    path = Path(path)
    tmp = _durable_temp(path, data)
    try:
        os.rename(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def create_private_exclusive(path: Path, data: bytes | Iterable[bytes]) -> bool:
    """Publish `data` at `path` only if nothing is there; False when another creator won.

    The bytes are made durable under a temp name first and then linked into place, so a reader
    never sees a half-written record under the final name.
    """
    path = Path(path)
    tmp = _durable_temp(path, data)
    try:
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        fsync_dir(path.parent)
        return True
    finally:
        tmp.unlink(missing_ok=True)


def create_private_new(path: Path, data: bytes) -> None:
    """`create_private_exclusive` for a name that must be new: FileExistsError when it is not."""
    if not create_private_exclusive(path, data):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))


def write_pointer(path: Path, session_id: str, status: Literal["running", "quit"]) -> None:
    """The session pointer `{version:1, sessionId, status}`, published atomically, 0600."""
    write_private_atomic(path, encode_pointer(session_id, status))


# -- reads ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StableRead:
    data: bytes
    st: os.stat_result


def file_identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What must not move while a file is read: a rename, a rewrite or a chmod all show here."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


FileProblem = Literal[
    "missing",
    "symlink",
    "not-regular",
    "unopenable",
    "not-private",
    "too-large",
    "grew",
    "size",
    "unstable",
]


class UnsafeFile(Exception):
    """`path` cannot be read as a stable regular file; `detail` completes the sentence "path ...".

    `problem` tells callers with their own vocabulary (checkpoint integrity, capture) which
    refusal to word; `errno` is the open's error for "unopenable".
    """

    def __init__(self, path: Path, problem: FileProblem, detail: str, err: int = 0) -> None:
        super().__init__(f"{path} {detail}")
        self.path = path
        self.problem: FileProblem = problem
        self.detail = detail
        self.errno = err


def open_regular(path: Path, *, dir_fd: int | None = None) -> tuple[int, os.stat_result]:
    """Open a regular file read-only without following a symlink: (fd, its fstat)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise UnsafeFile(path, "missing", "does not exist", exc.errno) from None
        if exc.errno == errno.ELOOP:
            raise UnsafeFile(path, "symlink", "is a symlink", exc.errno) from None
        raise UnsafeFile(
            path, "unopenable", f"cannot be opened ({exc.strerror})", exc.errno or 0
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(path, "not-regular", "is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def stream_stable(
    path: Path,
    consume: Callable[[bytes], object],
    *,
    cap: int | None = None,
    expect_size: int | None = None,
    require_private: bool = False,
) -> os.stat_result:
    """Feed a regular, non-symlink file to `consume` and prove it did not change meanwhile.

    The fd is fstat'd before and after and the path lstat'd again; any move of dev, inode, size,
    mtime or ctime is "unstable". `cap` bounds the bytes read, `expect_size` refuses a file of
    another size before reading it. Raises `UnsafeFile`; what `consume` got is then not the file.
    """
    path = Path(path)
    fd, before = open_regular(path)
    try:
        mode = stat.S_IMODE(before.st_mode)
        if require_private and mode & 0o077:
            raise UnsafeFile(
                path, "not-private", f"is not private (mode {mode:04o}, expected 0600)"
            )
        if cap is not None and before.st_size > cap:
            raise UnsafeFile(
                path, "too-large", f"is {before.st_size} bytes, over the {cap}-byte cap"
            )
        if expect_size is not None and before.st_size != expect_size:
            raise UnsafeFile(path, "size", f"is {before.st_size} bytes")
        total = 0
        while chunk := os.read(fd, CHUNK):
            total += len(chunk)
            if cap is not None and total > cap:
                raise UnsafeFile(path, "grew", f"grew past the {cap}-byte cap while being read")
            consume(chunk)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    try:
        again: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        again = None
    if (
        again is None
        or file_identity(before) != file_identity(after)
        or file_identity(after) != file_identity(again)
    ):
        raise UnsafeFile(path, "unstable", "changed while it was being read")
    return after


CHUNK = 1024 * 1024
UNSTABLE_TRIES = 3

_READ_CURES: dict[FileProblem, tuple[Code, str]] = {
    "missing": (Code.MISSING, "check the path"),
    "symlink": (Code.UNSAFE_PATH, "replace it with the real file"),
    "not-regular": (Code.UNSAFE_PATH, "replace it with the real file"),
    "too-large": (Code.TOO_LARGE, "check the file"),
    "unstable": (Code.UNSTABLE, "retry once nothing writes to it"),
}


def read_stable(path: Path, *, cap: int, what: str, require_private: bool = False) -> StableRead:
    """Read a regular, non-symlink file under a size cap and prove it did not change meanwhile.

    A file just published by link-then-unlink changes its ctime once as the temp name goes, so
    an unstable read is retried a few times; a file that keeps changing is refused.
    """
    path = Path(path)
    for attempt in range(UNSTABLE_TRIES):
        chunks: list[bytes] = []
        try:
            st = stream_stable(path, chunks.append, cap=cap, require_private=require_private)
        except UnsafeFile as exc:
            if exc.problem == "unstable" and attempt < UNSTABLE_TRIES - 1:
                time.sleep(0.01 * (attempt + 1))
                continue
            if exc.problem == "unopenable":
                # Not a property of the file (EACCES, EMFILE, ...): the caller's OSError.
                raise OSError(exc.errno, os.strerror(exc.errno), str(exc.path)) from None
            raise _read_refusal(exc, what) from None
        return StableRead(b"".join(chunks), st)
    raise AssertionError("unreachable")


def _read_refusal(exc: UnsafeFile, what: str) -> Refusal:
    message = f"{what} {exc.path} {exc.detail}"
    if exc.problem == "not-private":
        return Refusal(Code.NOT_PRIVATE, message, f"chmod 600 {exc.path}")
    if exc.problem == "grew":
        return Refusal(Code.TOO_LARGE, message, "retry once it is quiet")
    code, cure = _READ_CURES.get(exc.problem, (Code.UNSAFE_PATH, "check the file"))
    return Refusal(code, message, cure)
