"""Proving a lifecycle's processes gone: one pass over /proc answers for every seat."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from manager.procs import (
    ENV_LAYOUT_PATIENCE_S,
    alive,
    boot_id,
    pid_identity,
    process_environ,
    processes_with_env,
    processes_with_envs,
    prove_gone,
)
from protocol.mesh import ProcRef

NAME = "COTAL_LIFECYCLE_UID"


def _sleeper(value: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    # A setsid'd grandchild would be found the same way: the search reads environments, not
    # the process tree.
    env = {"PATH": os.environ["PATH"], NAME: value, "OTHER": f"x{value}"}
    return subprocess.Popen(["sleep", "60"], env=env, cwd=tmp_path, start_new_session=True)


def test_one_pass_finds_each_lifecycles_processes_and_only_them(tmp_path: Path) -> None:
    a, b, idle = (f"u{uuid.uuid4().hex}" for _ in range(3))
    procs = [_sleeper(a, tmp_path), _sleeper(a, tmp_path), _sleeper(b, tmp_path)]
    try:
        found = processes_with_envs(NAME, [a, b, idle])
        assert found == {a: sorted(p.pid for p in procs[:2]), b: [procs[2].pid], idle: []}
        assert processes_with_env(NAME, b) == [procs[2].pid]
        # A value is matched whole, as `name=value`, never as a prefix or in another variable.
        assert processes_with_envs(NAME, [a[:-1], f"x{a}"]) == {a[:-1]: [], f"x{a}": []}
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert processes_with_envs(NAME, [a, b]) == {a: [], b: []}


def test_a_process_just_started_is_read_after_its_exec_not_as_empty(tmp_path: Path) -> None:
    # Popen returns once the child's old image is gone, before its new stack (and so its
    # environment) is laid out; read at once, about a quarter of children used to read empty.
    for _ in range(200):
        value = f"u{uuid.uuid4().hex}"
        proc = _sleeper(value, tmp_path)
        try:
            env = process_environ(proc.pid)
        finally:
            proc.kill()
            proc.wait()
        assert env == [
            b"PATH=" + os.environ["PATH"].encode(),
            f"{NAME}={value}".encode(),
            f"OTHER=x{value}".encode(),
        ]


def test_a_busy_process_with_an_empty_environment_reads_empty_not_as_stuck(
    tmp_path: Path,
) -> None:
    # Running, with a command line and no environment: what a process inside the exec's
    # layout looks like, for a moment; past that moment it is just a process with none.
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], env={}, cwd=tmp_path)
    try:
        while not Path(f"/proc/{proc.pid}/cmdline").read_bytes():
            time.sleep(0.001)
        t0 = time.monotonic()
        assert process_environ(proc.pid) == []
        assert time.monotonic() - t0 < 2 * ENV_LAYOUT_PATIENCE_S + 0.5
    finally:
        proc.kill()
        proc.wait()


def test_an_empty_environment_reads_empty_and_a_zombie_reads_as_no_process(
    tmp_path: Path,
) -> None:
    proc = subprocess.Popen(["/bin/sleep", "60"], env={}, cwd=tmp_path)
    try:
        assert process_environ(proc.pid) == []
        proc.kill()
        # Exited but not reaped: a zombie, whose empty files no exec will ever fill.
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        assert process_environ(proc.pid) is None
    finally:
        proc.kill()
        proc.wait()
    assert process_environ(proc.pid) is None


# -- prove_gone: the wait a cut makes for its manager and its broker ---------------------------


def test_a_process_that_outlives_the_timeout_is_not_proven_gone(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "60"], cwd=tmp_path)
    try:
        identity = pid_identity(proc.pid)
        assert prove_gone(identity, timeout=0.3) is False
        assert alive(identity) and proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_a_child_that_ends_is_reaped_and_proven_gone(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "60"], cwd=tmp_path)
    identity = pid_identity(proc.pid)
    proc.kill()
    assert prove_gone(identity, timeout=10) is True
    # Reaped by the proof itself: no zombie of it is left for anyone.
    try:
        os.waitpid(proc.pid, os.WNOHANG)
    except ChildProcessError:
        pass
    else:
        raise AssertionError(f"pid {proc.pid} was left unreaped")


def test_a_process_of_another_parent_is_proven_gone_when_it_ends(tmp_path: Path) -> None:
    # The manager and the broker are not the cut's children: the proof is their exit, seen
    # through a pidfd, whoever reaps them.
    shell = subprocess.run(
        ["sh", "-c", "sleep 0.5 >/dev/null 2>&1 & echo $!"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    orphan = pid_identity(int(shell.stdout))
    assert alive(orphan)
    assert prove_gone(orphan, timeout=10) is True
    assert not alive(orphan)


def test_a_pid_that_names_another_process_now_is_proven_gone_at_once() -> None:
    # The recorded process ended long ago and its pid was reused: the successor's start time
    # differs, so it is not waited for.
    here = pid_identity(os.getpid())
    stale = ProcRef(pid=here.pid, start_time=here.start_time - 1, boot_id=boot_id())
    assert prove_gone(stale, timeout=30) is True
    assert alive(here)
