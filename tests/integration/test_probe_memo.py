"""A harness's `--version` answer is remembered for the same program files and run again when
they change; a failure is never remembered; a memo that is not the probe's own is ignored.
Real programs (shell scripts that count their runs), real files and modes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import msgspec
import pytest

from connectors.doctorkit import PROBE_MEMO_DIR, ProbeMemo, memo_key, probe, probe_env


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("COTAL_TOOLS_DIR", str(tmp_path / "tools"))
    return tmp_path / "tools"


def harness(path: Path, runs: Path, *, answer: str = "1.2.3", exit_code: int = 0) -> Path:
    path.write_text(f'#!/bin/sh\necho run >> "{runs}"\necho {answer}\nexit {exit_code}\n')
    path.chmod(0o755)
    return path


def runs_of(runs: Path) -> int:
    return len(runs.read_text().splitlines()) if runs.exists() else 0


def ask(program: Path, home: Path) -> tuple[bool, str]:
    home.mkdir(exist_ok=True)
    return probe([str(program), "--version"], probe_env(str(home), HARNESS_DIR=str(home)))


def test_an_answer_is_remembered_until_the_program_changes(tools: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    program = harness(tmp_path / "h", runs)
    # Two probes, each with its own private home: the second is answered from the memo.
    assert ask(program, tmp_path / "home1") == (True, "1.2.3")
    assert ask(program, tmp_path / "home2") == (True, "1.2.3")
    assert runs_of(runs) == 1
    [memo] = (tools / PROBE_MEMO_DIR).iterdir()
    assert stat.S_IMODE(memo.stat().st_mode) == 0o600
    assert stat.S_IMODE(memo.parent.stat().st_mode) == 0o700
    assert msgspec.json.decode(memo.read_bytes(), type=ProbeMemo) == ProbeMemo(
        key=memo.name, detail="1.2.3"
    )
    # An upgrade in place: new bytes at the same path. It runs again and its answer is new.
    harness(program, runs, answer="1.2.4")
    assert ask(program, tmp_path / "home3") == (True, "1.2.4")
    assert runs_of(runs) == 2


def test_a_failure_is_never_remembered(tools: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    program = harness(tmp_path / "h", runs, exit_code=3)
    assert ask(program, tmp_path / "home1") == (False, "exit code 3: 1.2.3")
    assert ask(program, tmp_path / "home2") == (False, "exit code 3: 1.2.3")
    assert runs_of(runs) == 2
    assert not (tools / PROBE_MEMO_DIR).exists()


def test_a_memo_that_is_not_the_probes_own_is_ignored_and_replaced(
    tools: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    program = harness(tmp_path / "h", runs)
    home = tmp_path / "home"
    home.mkdir()
    key = memo_key([str(program), "--version"], probe_env(str(home), HARNESS_DIR=str(home)))
    assert key is not None
    memos = tools / PROBE_MEMO_DIR
    memos.mkdir(parents=True, mode=0o700)
    forged = [
        msgspec.json.encode(ProbeMemo(key="0" * 64, detail="9.9.9")),  # another key's
        b'{"key": "%s", "detail": "9.9.9", "extra": 1}' % key.encode(),  # unknown field
        msgspec.json.encode(ProbeMemo(key=key, detail="9" * 5000)),  # over the cap
    ]
    for n, data in enumerate(forged, start=1):
        (memos / key).write_bytes(data)
        assert ask(program, home) == (True, "1.2.3")
        assert runs_of(runs) == n
    # A symlink in the memo's place is not followed: the probe runs, and the memo written is a
    # regular file of its own.
    target = tmp_path / "elsewhere"
    target.write_bytes(msgspec.json.encode(ProbeMemo(key=key, detail="9.9.9")))
    (memos / key).unlink()
    os.symlink(target, memos / key)
    assert ask(program, home) == (True, "1.2.3")
    assert runs_of(runs) == len(forged) + 1
    assert not (memos / key).is_symlink()
    assert ask(program, home) == (True, "1.2.3")
    assert runs_of(runs) == len(forged) + 1


def test_a_program_that_is_gone_is_not_remembered(tools: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here"
    assert memo_key([str(missing), "--version"], {}) is None
    assert ask(missing, tmp_path / "home") == (False, "No such file or directory")
    assert not (tools / PROBE_MEMO_DIR).exists()
