"""Proving a lifecycle's processes gone: one pass over /proc answers for every seat."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

from manager.procs import processes_with_env, processes_with_envs

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
