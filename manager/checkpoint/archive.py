"""The packed checkpoint's format, both ways: one POSIX ustar archive of a sealed attempt
directory, written by the source (`write_archive`), and unpacked by the destination into
`.cotal/maintenance/v1/incoming/<attempt>/` (`unpack`) after every header was checked
(`packfile`: regular files and directories only, plain relative names inside the attempt,
sizes the file itself holds, zero padding). The hand-off a pack records and what the CLI
prints are `manager/cli/checkpoints.py`'s.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from connectors.privatefs import ensure_private_dir, fsync_dir
from manager.checkpoint import packfile
from manager.workspace.layout import Layout
from protocol.errors import Refusal

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
                    "not-packable",
                    f"{path} is neither a regular file nor a directory",
                    "a sealed checkpoint holds only files and directories; cut again",
                )
            if st.st_size >= _USTAR_SIZE_LIMIT and stat.S_ISREG(st.st_mode):
                raise Refusal(
                    "not-packable",
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


def write_archive(attempt_dir: Path, tmp: Path) -> tuple[str, int]:
    """Write the attempt directory to `tmp` (created here, never there before) as one ustar
    archive, synced; its sha256 and size. Owner, group and times are zeroed and modes masked,
    so the bytes depend only on the attempt's names and contents."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        out = _Hashing(f)
        # Owner, group and times are the source host's business, not the destination's.
        with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:  # type: ignore[call-overload]
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
    unpacking of the same attempt from an earlier run, and is replaced whole."""
    with packfile.open_pack(src) as pack:
        plan = pack.plan()
        base = layout.incoming
        staged = base / plan.attempt
        kind = _staging_kind(staged)
        if kind is not None:
            raise Refusal(
                "staging-occupied",
                f"cannot unpack {src}: {staged} is {kind}, not a directory this root unpacked",
                f"cotal only ever puts a directory there: remove it (rm {staged}) and retry; "
                "nothing was written",
            )
        ensure_private_dir(layout.control)
        ensure_private_dir(layout.maintenance.parent)
        ensure_private_dir(layout.maintenance)
        ensure_private_dir(base)
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
            raise Refusal(
                "unpack-failed",
                f"unpacking {src} into {base} failed: {exc.strerror or exc} "
                f"({exc.filename or base})",
                "free space or fix permissions under .cotal/maintenance, then retry; nothing "
                "outside the staging directory was written, and it was removed",
            ) from None
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return staged
