"""The host's registry of cotal roots: which roots a seat of any other root must never see.

Where it lives and why an entry outlives its manager: docs/design.md, "The core modules, in
detail".
"""

from __future__ import annotations

import errno
import hashlib
import os
import pwd
import stat
from pathlib import Path

import msgspec
import structlog

from manager.workspace.layout import CONTROL_DIR
from manager.workspace.private import ensure_private_dir, read_stable, write_private_atomic
from protocol.errors import Refusal

log = structlog.get_logger("cotal.roots")

SYSTEM_REGISTRY = Path("/var/lib/cotal/roots")
USER_REGISTRY = Path(".local/state/cotal/roots")
ENTRY_CAP = 8 * 1024
ENTRY_SUFFIX = ".json"


class RootEntry(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    version: int
    root: str


def registry_dir() -> Path | None:
    """This uid's registry: `/var/lib/cotal/roots` as root, else under the home directory
    the password database names for the uid; None when it names none (`NO_REGISTRY` says
    what that means)."""
    uid = os.geteuid()
    if uid == 0:
        return SYSTEM_REGISTRY
    try:
        home = pwd.getpwuid(uid).pw_dir
    except KeyError:
        home = ""
    return Path(home) / USER_REGISTRY if home.startswith("/") else None


NO_REGISTRY = (
    "this uid has no home directory in the password database to keep the registry of cotal "
    "roots in: seats are not kept from other cotal roots of this uid outside /tmp, /var/tmp and "
    "/dev/shm"
)


def _entry_name(root: Path) -> str:
    return hashlib.sha256(os.fsencode(str(root))).hexdigest()[:32] + ENTRY_SUFFIX


def _private_dirs(path: Path) -> Path:
    """`path` and the cotal directory above it made 0700 and checked ours, never a symlink."""
    ensure_private_dir(path.parent)
    return ensure_private_dir(path)


def register(root: Path, registry: Path | None = None) -> Path:
    """Record `root` (absolute, resolved) in the registry, and drop the entries of roots that
    are gone; the entry's path. Rewritten at every start, so an entry another process removed
    comes back."""
    where = registry or registry_dir()
    if where is None:
        raise OSError(errno.ENOENT, NO_REGISTRY)
    where = _private_dirs(where)
    entry = where / _entry_name(root)
    write_private_atomic(entry, msgspec.json.encode(RootEntry(version=1, root=str(root))))
    known(where)
    return entry


def _control_dir_exists(root: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(os.path.join(root, CONTROL_DIR)).st_mode)
    except OSError:
        return False


def known(registry: Path | None = None) -> list[Path]:
    """Every root the registry names whose `.cotal` is still a directory, sorted. An entry whose
    root's `.cotal` is gone is removed; an entry that cannot be read as one (not private, not
    a plain file, not a record) is skipped and logged, never trusted."""
    where = registry or registry_dir()
    if where is None:
        return []
    try:
        names = sorted(os.listdir(where))
    except FileNotFoundError:
        return []
    roots: set[Path] = set()
    for name in names:
        if not name.endswith(ENTRY_SUFFIX) or name.startswith("."):
            continue
        path = where / name
        try:
            entry = msgspec.json.decode(
                read_stable(
                    path, cap=ENTRY_CAP, what="roots registry entry", require_private=True
                ).data,
                type=RootEntry,
            )
        except (Refusal, OSError, msgspec.DecodeError) as exc:
            log.warning("roots.entry_unreadable", path=str(path), error=str(exc))
            continue
        if (
            entry.version != 1
            or not entry.root.startswith("/")
            or name != _entry_name(Path(entry.root))
        ):
            log.warning("roots.entry_unreadable", path=str(path), error="not an entry for its name")
            continue
        if not _control_dir_exists(entry.root):
            try:
                path.unlink()
            except OSError:
                pass
            continue
        roots.add(Path(entry.root))
    return sorted(roots)
