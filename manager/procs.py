"""Process identity that survives pid reuse: a pid is only "ours" if its start time matches.

Proving a process gone means the pid no longer names the process we recorded, not merely
that signalling it failed once.
"""

from __future__ import annotations

import enum
import os
import select
import time
from collections.abc import Iterable

from protocol.mesh import ProcRef


def process_start_time(pid: int, *, include_zombies: bool = False) -> int | None:
    """Start time of `pid` in clock ticks since boot (field 22 of /proc/<pid>/stat), or None
    when no such process exists (or, unless asked for, it is a zombie awaiting its reaper)."""
    rest = _stat_fields(pid)
    if rest is None or (rest[0] == b"Z" and not include_zombies):
        return None
    return int(rest[19])


def _stat_fields(pid: int) -> list[bytes] | None:
    """/proc/<pid>/stat from its third field (the state) on, or None when there is no such
    process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name may contain spaces and parentheses; fields resume after the last ')'.
    return data[data.rindex(b")") + 2 :].split()


_start_time = process_start_time


def boot_id() -> str:
    """This boot's id; unreadable is an error, never "", so no comparison silently passes."""
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        return f.read().strip()


ProcIdentity = ProcRef


def alive(identity: ProcIdentity) -> bool:
    if identity.boot_id and identity.boot_id != boot_id():
        return False
    return _start_time(identity.pid) == identity.start_time


def pid_identity(pid: int) -> ProcIdentity:
    st = _start_time(pid)
    if st is None:
        raise ProcessLookupError(pid)
    return ProcIdentity(pid=pid, start_time=st, boot_id=boot_id())


# How long one wait on a process's pidfd lasts before its identity is read again anyway.
_PIDFD_WAIT_S = 0.25


def pidfd_of(pid: int) -> int | None:
    """A pidfd for `pid`, or None where the process is gone or the kernel (or `os`) has none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def prove_gone(identity: ProcIdentity, *, timeout: float) -> bool:
    """Whether the process `identity` names ends within `timeout`.

    The wait is on a pidfd where the kernel has them, so the answer comes as the process ends,
    not at the next poll: a cut waits this way for its manager and then its broker. The pidfd
    is opened before the identity is first read, so a live reading proves it is that process's
    and not a successor's on a reused pid."""
    deadline = time.monotonic() + timeout
    pidfd = pidfd_of(identity.pid)
    try:
        while True:
            reap_if_child(identity.pid)
            if not alive(identity):
                # It may have ended between the reap and the reading: a child of ours is not
                # left a zombie by its proof.
                reap_if_child(identity.pid)
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if pidfd is None:
                time.sleep(min(0.02, left))
            else:
                select.select([pidfd], [], [], min(left, _PIDFD_WAIT_S))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def reap_if_child(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def processes_with_env(name: str, value: str) -> list[int]:
    """Live pids whose environment holds `name=value`: the proof that no process of a seat's
    lifecycle survives, including children that left the seat's process group."""
    return processes_with_envs(name, [value])[value]


def processes_with_envs(name: str, values: Iterable[str]) -> dict[str, list[int]]:
    """`processes_with_env` for many values in one pass over /proc: proving 50 seats gone reads
    each process's environment once, not 50 times. A process whose environment cannot be read
    even after waiting out an exec is counted under every value: it cannot be ruled out."""
    needles = {f"{name}={value}".encode(): value for value in values}
    found: dict[str, list[int]] = {value: [] for value in needles.values()}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        env = process_environ(int(entry))
        if env is None:
            continue
        hits = (
            set(needles.values())
            if env is STUCK_IN_EXEC
            else {needles[item] for item in env if item in needles}
        )
        if hits and _start_time(int(entry)) is not None:
            for value in hits:
                found[value].append(int(entry))
    return {value: sorted(pids) for value, pids in found.items()}


# A kernel thread has neither an environment nor a command line, and never runs a seat.
_PF_KTHREAD = 0x00200000
# How long a process may sit inside an exec, its old image gone and its new stack not yet laid
# out, before it is counted as unreadable rather than waited for.
EXEC_PATIENCE_S = 1.0
# How long a running process with a command line may take to show its environment: the
# layout is microseconds of kernel work, so this only covers preemption on a loaded machine;
# a busy process whose environment really is empty pays it once per read.
ENV_LAYOUT_PATIENCE_S = 0.1


class _Unreadable(enum.Enum):
    STUCK_IN_EXEC = "stuck-in-exec"


STUCK_IN_EXEC = _Unreadable.STUCK_IN_EXEC


def process_environ(pid: int) -> list[bytes] | _Unreadable | None:
    """`pid`'s environment as `name=value` items; None when it is gone, a zombie or a kernel
    thread; `STUCK_IN_EXEC` when it stayed inside an exec past `EXEC_PATIENCE_S`.

    An exec lays out the new image's stack in one stretch of kernel code: the command line
    first, then the environment. Until it is done /proc/<pid>/environ reads empty, and a
    parent's `Popen` (or `vfork`) has already returned by then: a seat just started, or a
    seat's child just exec'ing, would read as holding no lifecycle at all. So an empty
    environment is read again while the process may still be in that stretch: always while
    its command line is empty too, and while it is running or waiting in the kernel (not
    asleep, not stopped) once its command line is there, which a busy machine can stretch
    past a scheduler tick."""
    deadline = None
    laid_out_by = None
    while True:
        env = _read_proc(pid, "environ")
        if env:
            return [item for item in env.split(b"\0") if item]
        rest = _stat_fields(pid)
        if env is None or _exempt(rest):
            return None
        assert rest is not None
        cmdline = _read_proc(pid, "cmdline")
        if cmdline is None:
            return None
        now = time.monotonic()
        if cmdline:
            if laid_out_by is None:
                laid_out_by = now + ENV_LAYOUT_PATIENCE_S
            if rest[0] not in (b"R", b"D") or now > laid_out_by:
                # Out of the exec's stretch (or never in it): the environment is empty.
                env = _read_proc(pid, "environ")
                return None if env is None else [item for item in env.split(b"\0") if item]
        else:
            if deadline is None:
                deadline = now + EXEC_PATIENCE_S
            elif now > deadline:
                return STUCK_IN_EXEC
        time.sleep(0.001)


def _read_proc(pid: int, name: str) -> bytes | None:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:
        return None


def _exempt(rest: list[bytes] | None) -> bool:
    """Gone, a zombie or a kernel thread (from `_stat_fields`): empty proc files that no exec
    will fill."""
    return rest is None or rest[0] in (b"Z", b"X") or bool(int(rest[6]) & _PF_KTHREAD)
