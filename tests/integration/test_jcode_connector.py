"""The jcode connector driving a real process: tests/fixtures/jcode_standin.py, a STAND-IN
that speaks the connector's cotal JSON-lines protocol. It is not jcode (jcode cannot be
installed here), so these tests prove the connector's launch, private home and driver, not
jcode's behaviour. What every connector promises (readiness, turn outcomes, a killed harness,
refusing to reopen a drain-only seat) is proved in tests/integration/test_connector_contract.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
import pytest

from connectors.base import LaunchOpts, TurnOutcome
from connectors.jcode import JcodeConnector, JcodeDriver
from tests.conftest import REPO
from tests.harness import Seat, running_seat, seat_opts

STANDIN = REPO / "tests" / "fixtures" / "jcode_standin.py"
TIMEOUT = 20
PHRASE = "juniper-ledger-41"


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    """An executable that runs the stand-in with this interpreter, whatever PATH holds."""
    b = tmp_path / "bin" / "jcode"
    b.parent.mkdir()
    b.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN}" "$@"\n')
    b.chmod(0o755)
    return b


def make_opts(root: Path, binary: Path, name: str, **kw: Any) -> LaunchOpts:
    return seat_opts(root, "jcode", name, config={"binary": str(binary)}, **kw)


def running_jcode(
    opts: LaunchOpts, log_dir: Path
) -> AbstractAsyncContextManager[Seat[JcodeDriver]]:
    return running_seat(JcodeConnector(), opts, log_dir, timeout=TIMEOUT, seat=Seat[JcodeDriver])


@pytest.mark.anyio
async def test_the_launch_prompt_is_turn_zero_and_the_home_is_private(
    root: Path, binary: Path, tmp_path: Path
) -> None:
    opts = make_opts(root, binary, "alice", prompt=f"remember the phrase {PHRASE}")
    async with running_jcode(opts, tmp_path) as seat:
        with anyio.fail_after(TIMEOUT):
            session = await seat.driver.wait_ready(TIMEOUT)
            await seat.driver.initial_done.wait()
            assert seat.driver.initial_outcome == TurnOutcome("ok", f"Noted: {PHRASE}.")
            assert await seat.driver.prompt("what was the phrase?", message_id="m1") == TurnOutcome(
                "ok", f"The phrase is {PHRASE}."
            )
            assert await seat.driver.quit()
            assert await seat.proc.wait() == 0
    home = Path(seat.spec.env["JCODE_HOME"])
    assert home.parent == root / ".cotal" / "jcode"
    transcript = home / "sessions" / f"{session}.jsonl"
    assert [json.loads(line)["reply"] for line in transcript.read_text().splitlines()] == [
        f"Noted: {PHRASE}.",
        f"The phrase is {PHRASE}.",
    ]

    # A new process of the same seat starts a new session in the same home: there is nothing
    # to reopen.
    async with running_jcode(make_opts(root, binary, "alice"), tmp_path) as seat:
        with anyio.fail_after(TIMEOUT):
            again = await seat.driver.wait_ready(TIMEOUT)
            assert again != session
            assert await seat.driver.prompt("what was the phrase?", message_id="m4") == TurnOutcome(
                "ok", "I do not know the phrase."
            )
        assert seat.spec.env["JCODE_HOME"] == str(home)


def test_doctor_reports_the_configured_standin_as_drain_only(root: Path, binary: Path) -> None:
    (root / "cotal.toml").write_text(f'[agents.jcode]\nbinary = "{binary}"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "manager.cli", "doctor", "--json", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    rows = {r["name"]: r for r in map(json.loads, proc.stdout.splitlines())}
    # One row per harness, and the seat isolation in force on this machine.
    assert set(rows) == {
        "scribe",
        "pi",
        "claude",
        "codex",
        "jcode",
        "opencode",
        "gemini",
        "scribe-fork",
        "isolation",
        "clock",
    }
    jcode = rows["jcode"]
    assert (
        jcode["continuity"],
        jcode["installed"],
        jcode["usable"],
        jcode["ready"],
        jcode["configured"],
    ) == ("drain-only", True, True, True, True)
    assert (
        jcode["path"] == str(binary)
        and jcode["version"] == "jcode-standin 1 (a test stand-in, not jcode)"
    )
    assert rows["scribe"]["ready"] and rows["scribe"]["continuity"] == "exact"


def test_doctor_names_a_missing_configured_jcode_and_fails(root: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "jcode"
    (root / "cotal.toml").write_text(f'[agents.jcode]\nbinary = "{missing}"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "manager.cli", "doctor", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 1
    assert (
        f"missing: jcode is not installed (looked for it on agents.jcode.binary ({missing}))"
        in proc.stdout
    )
    assert "cure:    install jcode with an adapter for cotal's JSON-lines protocol" in proc.stdout
