"""Process identity that survives pid reuse: a pid is only "ours" if its start time matches.

Proving a process gone means the pid no longer names the process we recorded, not merely
that signalling it failed once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from protocol.mesh import ProcRef


def process_start_time(pid: int, *, include_zombies: bool = False) -> int | None:
    """Start time of `pid` in clock ticks since boot (field 22 of /proc/<pid>/stat), or None
    when no such process exists (or, unless asked for, it is a zombie awaiting its reaper)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name may contain spaces and parentheses; fields resume after the last ')'.
    rest = data[data.rindex(b")") + 2 :].split()
    if rest[0] == b"Z" and not include_zombies:
        return None
    return int(rest[19])


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


def prove_gone(identity: ProcIdentity, *, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        reap_if_child(identity.pid)
        if not alive(identity):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


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
    each process's environment once, not 50 times."""
    needles = {f"{name}={value}".encode(): value for value in values}
    found: dict[str, list[int]] = {value: [] for value in needles.values()}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        hits = {needles[item] for item in env if item in needles}
        if hits and _start_time(int(entry)) is not None:
            for value in hits:
                found[value].append(int(entry))
    return {value: sorted(pids) for value, pids in found.items()}
