"""The maintenance lock: one coordinator per workspace root runs a cut or a resume at a time.

A lock is reaped only when its owner is provably gone (pid, start time and boot id); why, and
how reaping is serialized, is in docs/design.md, "The core modules, in detail".
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path
from types import TracebackType

import msgspec

from manager import procs
from manager.procs import boot_id
from manager.workspace.layout import Layout
from manager.workspace.private import (
    FILE_MODE,
    create_private_exclusive,
    ensure_private_dir,
    fsync_dir,
    read_stable,
)
from protocol.codec import decode_json, encode_json
from protocol.errors import DecodeError, Refusal
from protocol.instant import now_iso
from protocol.names import check_attempt_id
from protocol.refusals import Code

LOCK_FILE = "lock"
REAPER_FILE = "lock.reaper"
LOCK_CAP = 4096


class LockRecord(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    pid: int
    # Field 22 of /proc/<pid>/stat (clock ticks since boot): with the boot id, it names one
    # process, where a pid alone may be reused by an unrelated one.
    start_time: int
    boot_id: str
    # A shared directory seen by two hosts has two boot ids for live owners; the host name
    # keeps "another host" from reading as "rebooted".
    host: str
    attempt_id: str
    created_at: str


def process_start_time(pid: int) -> int | None:
    # A zombie still owns its pid until reaped: it is "running" for the lock's purposes.
    return procs.process_start_time(pid, include_zombies=True)


def _owner_status(owner: LockRecord) -> tuple[str, str]:
    """("dead" | "alive" | "unknown", why). Only "dead" may be reaped."""
    if owner.host != socket.gethostname():
        return (
            "unknown",
            f"it was taken on host {owner.host!r}, and this host cannot see that process",
        )
    if owner.boot_id != boot_id():
        return "dead", "the host has rebooted since"
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return "dead", f"pid {owner.pid} no longer exists"
    except PermissionError:
        pass  # exists, under another uid: the start time still decides
    try:
        started = process_start_time(owner.pid)
    except (OSError, ValueError, IndexError) as exc:
        return "unknown", f"/proc/{owner.pid}/stat could not be read ({exc})"
    if started is None:
        # kill(0) just said it exists; a /proc that hides it (hidepid) proves nothing.
        return "unknown", f"pid {owner.pid} exists but /proc/{owner.pid}/stat is not visible"
    if started != owner.start_time:
        return "dead", f"pid {owner.pid} now belongs to another process (started at {started})"
    return "alive", f"pid {owner.pid} is still running"


class MaintenanceLock:
    """`with MaintenanceLock(layout, attempt_id):` holds the root's maintenance lock."""

    def __init__(self, layout: Layout, attempt_id: str) -> None:
        self.layout = layout
        self.attempt_id = check_attempt_id(attempt_id)
        self.path = layout.maintenance / LOCK_FILE
        self._reaper = layout.maintenance / REAPER_FILE
        self._record: LockRecord | None = None
        self._bytes = b""

    @property
    def held(self) -> bool:
        return self._record is not None

    def _read_owner(self) -> tuple[LockRecord, bytes] | None:
        try:
            got = read_stable(self.path, cap=LOCK_CAP, what="maintenance lock")
        except Refusal as exc:
            if exc.code == Code.MISSING:
                return None
            raise
        try:
            return decode_json(
                got.data, LockRecord, what=f"maintenance lock {self.path}", cap=LOCK_CAP
            ), got.data
        except DecodeError as exc:
            # Published by link after fsync, a lock is never torn: a malformed one was written
            # by something else, and nothing about it proves its owner is gone.
            raise Refusal(
                Code.LOCK_MALFORMED,
                exc.message,
                f"make sure no cotal is cutting or resuming this root, then remove {self.path}",
            ) from None

    def _refuse_held(self, owner: LockRecord, why: str) -> Refusal:
        return Refusal(
            Code.LOCK_HELD,
            f"maintenance lock {self.path} is held by pid {owner.pid} for attempt "
            f"{owner.attempt_id} (since {owner.created_at}; {why})",
            "wait for that cut or resume to finish, or stop it; a lock whose owner is provably "
            "gone is reaped automatically",
        )

    def acquire(self) -> None:
        if self._record is not None:
            raise Refusal(
                Code.LOCK_HELD, f"maintenance lock {self.path} is already held by this object", ""
            )
        ensure_private_dir(self.layout.control)
        ensure_private_dir(self.layout.maintenance.parent)
        ensure_private_dir(self.layout.maintenance)
        pid = os.getpid()
        start = process_start_time(pid)
        assert start is not None  # we are running
        record = LockRecord(
            pid=pid,
            start_time=start,
            boot_id=boot_id(),
            host=socket.gethostname(),
            attempt_id=self.attempt_id,
            created_at=now_iso(),
        )
        data = encode_json(record)
        if create_private_exclusive(self.path, data):
            self._record, self._bytes = record, data
            return
        fd = os.open(self._reaper, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # Under the reaper lock the lock file can only change by its own owner releasing it
            # or by a fresh create after that, so what is judged here is what gets removed.
            found = self._read_owner()
            if found is not None:
                owner, _ = found
                status, why = _owner_status(owner)
                if status != "dead":
                    raise self._refuse_held(owner, why)
                os.unlink(self.path)
                fsync_dir(self.path.parent)
            if not create_private_exclusive(self.path, data):
                raced = self._read_owner()
                if raced is None:
                    raise Refusal(
                        Code.LOCK_HELD, f"maintenance lock {self.path} is contended", "retry"
                    )
                raise self._refuse_held(raced[0], "it was taken a moment ago")
            self._record, self._bytes = record, data
        finally:
            os.close(fd)  # closing drops the flock

    def verify(self) -> None:
        """Re-read the lock before a mutating step: refuse if it is no longer ours."""
        found = self._read_owner() if self._record is not None else None
        if found is None or found[1] != self._bytes:
            raise Refusal(
                Code.LOCK_LOST,
                f"maintenance lock {self.path} is no longer held by this coordinator",
                "stop: another coordinator may be acting on this root; inspect the journal first",
            )

    def release(self) -> None:
        """Remove the lock only if it is still exactly ours."""
        if self._record is None:
            return
        try:
            found = self._read_owner()
        except Refusal:
            found = None
        if found is not None and found[1] == self._bytes:
            os.unlink(self.path)
            fsync_dir(self.path.parent)
        self._record, self._bytes = None, b""

    def __enter__(self) -> MaintenanceLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def lock_path(layout: Layout) -> Path:
    return layout.maintenance / LOCK_FILE
