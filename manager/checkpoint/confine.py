"""Where a checkpoint may write on this host: the seat's tree under the destination root (or a
mapped directory), and each session file at the seat's own pointer or inside a session store
that is the seat's own. Checked at admission, when nothing has changed yet, and again at each
write, never following a symlink on the way.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from connectors.privatefs import (
    DIR_MODE,
    FILE_MODE,
    UnsafeDirectory,
    UnsafeFile,
    open_parent_below,
    open_regular,
    stream_stable,
)
from protocol.checkpoint import (
    CONTROL_DIR,
    SessionFile,
    check_relpath,
)
from protocol.errors import Refusal
from protocol.refusals import Code

# -- where a checkpoint may write ---------------------------------------------------------------
#
# Every path below comes from a record a remote signer wrote. A trusted signer is still not
# trusted to name arbitrary places on this host: a seat's tree lands only under the destination
# root (or a directory mapped onto it), and a session file only at the seat's own pointer or
# under a session store the seat declared, which itself must be the seat's own. The same checks
# run at admission (nothing changed yet) and again right before each write.

CHUNK = 1024 * 1024
# A relocated session file's first line (a harness header) is read whole to rewrite it.
HEAD_CAP = 1024 * 1024

CURE_FORGED = (
    "cotal's cut never records such a path: this checkpoint was altered and re-signed, or its "
    "signer is not who you think; do not restore it, cut the seat again on the source host, and "
    "`cotal trust remove` its signer if you did not expect this"
)


def lexical(path: Path | str) -> Path:
    return Path(os.path.normpath(path))


def parts_problem(parts: Sequence[str]) -> str | None:
    for part in parts:
        if "\x00" in part:
            return "contains a NUL"
        if part.casefold() == ".git":
            return "is inside a .git directory (hooks and config there run programs)"
    return None


def map_path(path: Path, maps: Mapping[Path, Path]) -> Path | None:
    """`path` carried onto this host through the longest `--map SRC=DST` prefix, if any."""
    best: tuple[Path, Path] | None = None
    for src, dst in maps.items():
        if path.is_relative_to(src) and (best is None or len(src.parts) > len(best[0].parts)):
            best = (src, dst)
    if best is None:
        return None
    return lexical(best[1]) / path.relative_to(best[0])


def _confining(root: Path, maps: Mapping[Path, Path]) -> list[Path]:
    return [lexical(root), *(lexical(dst) for dst in maps.values())]


def confine_cwd(seat: str, cwd: str, *, root: Path, maps: Mapping[Path, Path] = {}) -> Path:
    """The seat's working tree on this host: under the root or a mapped directory, never inside
    the control directory or a .git directory. Refuses `cwd-outside-root` otherwise."""
    if "\x00" in cwd or not cwd.startswith("/"):
        raise Refusal(
            Code.CWD_OUTSIDE_ROOT,
            f"seat {seat}: its cwd {cwd!r} is not an absolute path without NUL",
            CURE_FORGED,
        )
    source = lexical(cwd)
    mapped = map_path(source, maps)
    here = mapped if mapped is not None else source
    inside = [base for base in _confining(root, maps) if here.is_relative_to(base)]
    if not inside:
        raise Refusal(
            Code.CWD_OUTSIDE_ROOT,
            f"seat {seat}: its cwd {here} is outside the destination root {root}"
            + (
                f" and the mapped directories {', '.join(str(v) for v in maps.values())}"
                if maps
                else ""
            ),
            "a restore only rebuilds trees under the destination root; resume from a root that "
            "holds the seat's cwd, or map its directory onto this host",
        )
    rel = here.relative_to(inside[0]).parts
    problem = parts_problem(rel)
    if problem is None and CONTROL_DIR in rel:
        problem = "is inside the control directory"
    if problem is not None:
        raise Refusal(Code.CWD_OUTSIDE_ROOT, f"seat {seat}: its cwd {here} {problem}", CURE_FORGED)
    return here


@dataclass(frozen=True)
class SeatPaths:
    """What one seat may write on this host besides its tree."""

    seat: str
    pointer: Path
    stores: tuple[Path, ...]


def _own_session_name(name: str, seat: str, uid: str) -> bool:
    return name.startswith(f"{seat}-{uid}.")


def seat_paths(
    seat: str,
    uid: str,
    connector: str,
    declared_stores: Sequence[str],
    *,
    root: Path,
    maps: Mapping[Path, Path] = {},
) -> SeatPaths:
    """The seat's own pointer (the layout's path) and its declared stores, each proven to be a
    directory the seat may own: under the root or a mapped directory, outside .git, and inside
    the control directory only as `.cotal/sessions/<connector>/<seat>-<uid>.*`."""
    root = lexical(root)
    sessions = root / CONTROL_DIR / "sessions" / connector
    pointer = sessions / f"{seat}-{uid}.json"
    stores: list[Path] = []
    for declared in declared_stores:
        problem: str | None = None
        source = lexical(declared) if declared.startswith("/") and "\x00" not in declared else None
        here = None if source is None else (map_path(source, maps) or source)
        inside = (
            [] if here is None else [b for b in _confining(root, maps) if here.is_relative_to(b)]
        )
        if here is None:
            problem = "is not an absolute path without NUL"
        elif not inside or here == inside[0]:
            problem = f"is not strictly below the destination root {root}"
        else:
            rel = here.relative_to(inside[0]).parts
            problem = parts_problem(rel)
            if (
                problem is None
                and rel[0] == CONTROL_DIR
                and not (here.parent == sessions and _own_session_name(here.name, seat, uid))
            ):
                problem = (
                    f"is inside the control directory but not the seat's own "
                    f"{sessions}/{seat}-{uid}.* store"
                )
        if problem is not None:
            raise Refusal(
                Code.UNSAFE_STORE,
                f"seat {seat}: the declared session store {here or repr(declared)} {problem}",
                CURE_FORGED,
            )
        assert here is not None
        stores.append(here)
    return SeatPaths(seat=seat, pointer=pointer, stores=tuple(stores))


@dataclass(frozen=True)
class SessionTarget:
    """Where one session file lands: a directory this host trusts and a path below it that is
    walked one component at a time without following a symlink. `head`, set when the seat was
    relocated and its harness records a path in the file's first line, rewrites that line (given
    without its newline) as the file is placed."""

    base: Path
    relpath: str
    head: Callable[[bytes], bytes] | None = None

    @property
    def path(self) -> Path:
        return self.base / self.relpath


def session_target(
    entry: SessionFile,
    paths: SeatPaths,
    *,
    pointer: bool,
    cwd: Path,
    root: Path,
    home: Path,
    maps: Mapping[Path, Path] = {},
) -> SessionTarget:
    """Where a captured session file goes back, or a refusal naming the destination.

    The pointer lands exactly at the seat's pointer path; a store file strictly below one of the
    seat's declared stores. The walk starts at the root (or mapped directory) holding it, so a
    symlink anywhere below that, including one the restored tree itself carries, is refused.
    """
    base = {"cwd": cwd, "workspace-root": root, "home": home}[entry.anchor]
    try:
        check_relpath("relpath", entry.relpath)
    except ValueError as exc:
        raise Refusal(
            Code.UNSAFE_SESSION_PATH,
            f"seat {paths.seat}: session file {entry.file.file}: {exc}",
            CURE_FORGED,
        ) from None
    dest = lexical(base) / entry.relpath
    problem = parts_problem(entry.relpath.split("/"))
    if problem is not None:
        raise Refusal(
            Code.UNSAFE_SESSION_PATH,
            f"seat {paths.seat}: session file {entry.file.file} would land at {dest}, which "
            f"{problem}",
            CURE_FORGED,
        )
    if pointer:
        allowed = dest == paths.pointer
        wanted = f"the seat's pointer {paths.pointer}"
    else:
        allowed = any(dest.is_relative_to(s) and dest != s for s in paths.stores)
        wanted = (
            "a session store the seat declared ("
            + (", ".join(str(s) for s in paths.stores) or "none")
            + ")"
        )
    if not allowed:
        raise Refusal(
            Code.SESSION_OUTSIDE_STORE,
            f"seat {paths.seat}: session file {entry.file.file} would land at {dest}, which is "
            f"not {wanted}",
            CURE_FORGED,
        )
    holder = next(b for b in _confining(root, maps) if dest.is_relative_to(b))
    return SessionTarget(holder, dest.relative_to(holder).as_posix())


def _unsafe_walk(target: SessionTarget, exc: UnsafeDirectory) -> Refusal:
    return Refusal(
        Code.UNSAFE_SESSION_PATH,
        f"session file {target.path} would be written through {exc.path}, which {exc.reason}",
        "a session file is never written through a symlink; move it aside and restore again "
        "(if the checkpoint's own tree carries it: " + CURE_FORGED + ")",
    )


def probe_session_target(target: SessionTarget) -> None:
    """Admission's look at the destination: refuse a symlink or a non-directory on the way to
    (or a symlink at) the target, creating nothing. A missing directory is fine: the restore
    makes it."""
    try:
        fd = os.open(target.base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    parts = target.relpath.split("/")
    try:
        for i, part in enumerate(parts):
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return
            last = i == len(parts) - 1
            if stat.S_ISLNK(st.st_mode) or (
                not stat.S_ISDIR(st.st_mode) if not last else not stat.S_ISREG(st.st_mode)
            ):
                if stat.S_ISLNK(st.st_mode):
                    kind = "is a symlink"
                else:
                    kind = "is not a regular file" if last else "is not a directory"
                raise _unsafe_walk(
                    target, UnsafeDirectory(target.base.joinpath(*parts[: i + 1]), kind)
                )
            if last:
                return
            child = os.open(
                part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
            )
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


def session_destination(entry: SessionFile, *, cwd: Path, workspace_root: Path, home: Path) -> Path:
    """Where a captured session file goes back: its anchor resolved on this host, plus its
    relpath. Only the relpath's shape is checked here; `session_target` confines it."""
    base = {"cwd": cwd, "workspace-root": workspace_root, "home": home}[entry.anchor]
    try:
        check_relpath("relpath", entry.relpath)
    except ValueError as exc:
        raise Refusal(Code.UNSAFE_SESSION_PATH, str(exc), CURE_FORGED) from None
    problem = parts_problem(entry.relpath.split("/"))
    if problem is not None:
        raise Refusal(
            Code.UNSAFE_SESSION_PATH, f"{Path(base) / entry.relpath} {problem}", CURE_FORGED
        )
    return Path(base) / entry.relpath


def _hash_nofollow(path: Path, what: str) -> str:
    digest = hashlib.sha256()
    try:
        stream_stable(path, digest.update)
    except UnsafeFile as exc:
        match exc.problem:
            case "symlink":
                raise Refusal(
                    Code.UNSAFE_PATH, f"{what} {path} is a symlink", "replace it with the real file"
                ) from None
            case "not-regular":
                raise Refusal(
                    Code.UNSAFE_PATH, f"{what} {path} is not a regular file", "move it aside"
                ) from None
            case "unstable":
                raise Refusal(
                    Code.UNSTABLE, f"{what} {path} changed while it was read", "retry"
                ) from None
            case _:
                raise OSError(exc.errno, os.strerror(exc.errno), str(path)) from None
    return digest.hexdigest()


def _hash_at(parent: int, leaf: str, shown: Path) -> str:
    try:
        fd, _ = open_regular(Path(leaf), dir_fd=parent)
    except UnsafeFile as exc:
        if exc.problem in ("symlink", "not-regular"):
            raise Refusal(
                Code.UNSAFE_PATH,
                f"session destination {shown} {exc.detail}",
                f"move {shown} aside, then restore again",
            ) from None
        raise OSError(exc.errno, os.strerror(exc.errno), str(shown)) from None
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as stream:
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _create_exclusive_at(parent: int, leaf: str, chunks: Iterator[bytes]) -> bool:
    """Publish the chunks as `leaf` in the directory `parent` only if nothing is there: written
    under a temp name, fsynced, then linked, so a reader never sees half a file."""
    tmp = f".{leaf[:200]}.{secrets.token_hex(6)}.tmp"
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        FILE_MODE,
        dir_fd=parent,
    )
    try:
        try:
            os.fchmod(fd, FILE_MODE)
            for chunk in chunks:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, leaf, src_dir_fd=parent, dst_dir_fd=parent, follow_symlinks=False)
        except FileExistsError:
            return False
        os.fsync(parent)
        return True
    finally:
        os.unlink(tmp, dir_fd=parent)


def _relocated_chunks(
    src_file: Path, head: Callable[[bytes], bytes] | None
) -> Iterator[tuple[bytes, bytes]]:
    """(bytes read, bytes to write) pairs of a session file, its first line through `head`."""
    fd, _ = open_regular(src_file)
    with os.fdopen(fd, "rb") as src:
        if head is not None:
            first = src.readline(HEAD_CAP)
            line, end = (first[:-1], b"\n") if first.endswith(b"\n") else (first, b"")
            yield first, head(line) + end
        while chunk := src.read(CHUNK):
            yield chunk, chunk


def _as_target(dest: Path | SessionTarget) -> SessionTarget:
    """A plain absolute path as the target walked from `/`."""
    if isinstance(dest, SessionTarget):
        return dest
    dest = lexical(dest)
    if not dest.is_absolute() or dest == Path("/"):
        raise Refusal(
            Code.UNSAFE_SESSION_PATH,
            f"session destination {dest} is not an absolute file path",
            "pass the absolute path session_destination returned",
        )
    return SessionTarget(Path("/"), dest.relative_to("/").as_posix())


def _placed_digest(src_file: Path, target: SessionTarget, src_digest: str) -> str:
    # What lands is the checkpoint's bytes, or those bytes with the first line rewritten for the
    # new path; a retried restore finds exactly that file and accepts it.
    placed_digest = src_digest
    if target.head is not None:
        placed = hashlib.sha256()
        for _, out in _relocated_chunks(src_file, target.head):
            placed.update(out)
        placed_digest = placed.hexdigest()
    return placed_digest


def _place_or_hash(target: SessionTarget, copied: Callable[[], Iterator[bytes]]) -> str | None:
    """Create the file at `target` from `copied()` unless one is there: None when placed, else
    the digest of the file found."""
    base_fd = os.open(target.base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            parent, leaf = open_parent_below(
                base_fd, target.relpath, create_mode=DIR_MODE, root=target.base
            )
        except UnsafeDirectory as exc:
            raise _unsafe_walk(target, exc) from None
        try:
            try:
                os.stat(leaf, dir_fd=parent, follow_symlinks=False)
                present = True
            except FileNotFoundError:
                present = False
            if not present and _create_exclusive_at(parent, leaf, copied()):
                return None
            return _hash_at(parent, leaf, target.path)
        finally:
            os.close(parent)
    finally:
        os.close(base_fd)


def place_session_file(
    src_file: Path, dest: Path | SessionTarget, *, expected_sha256: str | None = None
) -> Literal["placed", "present"]:
    """Put one session file back: exclusive create 0600, missing parents 0700, never through a
    symlink (a plain absolute path is walked from `/`; a `SessionTarget` from its base).

    An existing file with the same digest is accepted (a retried restore); a different one is
    refused naming both digests, because overwriting a transcript is how a seat loses history.
    """
    src_file = Path(src_file)
    target = _as_target(dest)
    src_digest = _hash_nofollow(src_file, "session file")
    if expected_sha256 is not None and src_digest != expected_sha256:
        raise Refusal(
            Code.INTEGRITY,
            f"checkpoint integrity: {src_file} hashes to {src_digest}, the record says "
            f"{expected_sha256}",
            "copy the checkpoint again from the source host",
        )

    def copied() -> Iterator[bytes]:
        # The copy is checked against the digest just proven, before it is published.
        digest = hashlib.sha256()
        for raw, out in _relocated_chunks(src_file, target.head):
            digest.update(raw)
            yield out
        if digest.hexdigest() != src_digest:
            raise Refusal(
                Code.UNSTABLE, f"session file {src_file} changed while it was copied", "retry"
            )

    placed_digest = _placed_digest(src_file, target, src_digest)
    existing = _place_or_hash(target, copied)
    if existing is None:
        return "placed"
    if existing != placed_digest:
        raise Refusal(
            Code.SESSION_CONFLICT,
            f"{target.path} already exists with sha256 {existing}; the checkpoint's file "
            f"{src_file} places sha256 {placed_digest}",
            f"move {target.path} aside if the checkpoint's session is the one to resume, then "
            "restore again",
        )
    return "present"
