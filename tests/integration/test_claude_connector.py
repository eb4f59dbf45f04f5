"""The Claude Code connector against the real Claude Code (pinned, from `.tools/claude`) and a
real fake Anthropic Messages server process on 127.0.0.1.

What every connector promises (readiness, turn outcomes, exact reopening after `kill -9`,
forks that leave the source untouched) is proved in tests/integration/test_connector_contract.py.
Here, what only Claude Code does:
* a seat killed before its first turn (fresh or forked) still continues under its id, since
  Claude Code writes a transcript only once a turn starts;
* a text starting with '/' is answered locally, never run as a command; an interrupted turn is
  `aborted`; a killed one is `unknown`, and so is every later prompt and state query;
* doctor reports the pinned install as exact and ready.

Every test's cwd is a temp directory outside any git repository, so Claude Code's per-repo
auto-memory cannot leak between seats. The API key is a fake value that must never appear in
argv or in any file under the workspace.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from connectors.base import LaunchOpts, TurnOutcome
from connectors.claude_code import ClaudeCodeConnector, ClaudeDriver, HarnessGone, transcripts
from protocol.errors import Refusal
from tests.conftest import REPO, AnthropicServer
from tests.harness import Seat, read_pointer, running_seat, seat_opts, until


def _claude_installed() -> str | None:
    from manager.cli.tools import which

    try:
        which("claude")
    except Refusal as exc:
        return exc.text
    return None


NOT_INSTALLED = _claude_installed()
pytestmark = [
    pytest.mark.claude,
    pytest.mark.skipif(
        NOT_INSTALLED is not None, reason=f"Claude Code is not installed: {NOT_INSTALLED}"
    ),
]

PHRASE = "juniper-ledger-41"
SECRET = "sk-ant-fake-cotal-test-0123456789"
KEY_VAR = "COTAL_TEST_ANTHROPIC_KEY"
TIMEOUT = 60


@pytest.fixture
def fake_server(fake_anthropic: AnthropicServer) -> AnthropicServer:
    return fake_anthropic


@pytest.fixture
def root(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    # HOME must stay untouched: with a private CLAUDE_CONFIG_DIR nothing belongs there.
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv(KEY_VAR, SECRET)
    # A dead or failing endpoint must fail a turn at once, not after minutes of retries.
    monkeypatch.setenv("CLAUDE_CODE_MAX_RETRIES", "0")
    return root


def make_opts(
    root: Path, server: AnthropicServer, name: str, *, uid: str | None = None, **kw: Any
) -> LaunchOpts:
    return seat_opts(
        root,
        "claude",
        name,
        uid=uid,
        config={
            "base_url": server.base_url,
            "model": "claude-fake-1",
            "api_key_env": KEY_VAR,
            "extra_env": ["CLAUDE_CODE_MAX_RETRIES"],
        },
        **kw,
    )


class ClaudeSeat(Seat[ClaudeDriver]):
    @property
    def config(self) -> Path:
        return Path(self.spec.env["CLAUDE_CONFIG_DIR"])


def running_claude(
    connector: ClaudeCodeConnector, opts: LaunchOpts, log_dir: Path
) -> AbstractAsyncContextManager[ClaudeSeat]:
    """build_launch + a real claude process + the driver's reader in a task group; reaps
    claude always."""
    return running_seat(connector, opts, log_dir, timeout=TIMEOUT, seat=ClaudeSeat)


@pytest.mark.anyio
async def test_seats_killed_before_their_first_turn_still_continue(
    root: Path, fake_server: AnthropicServer, tmp_path: Path
) -> None:
    """Claude Code writes a transcript only when a session's first turn starts; the launch
    record lets a continuation redo the fresh start or the fork under the same id."""
    connector = ClaudeCodeConnector()
    source_opts = make_opts(root, fake_server, "alice", prompt=f"remember the phrase {PHRASE}")
    async with running_claude(connector, source_opts, tmp_path) as seat:
        with anyio.fail_after(TIMEOUT):
            await seat.driver.initial_done.wait()
        source_id = seat.driver.session_id
    assert source_id is not None

    for name, extra, answer in (
        ("dora", {}, "I do not know the phrase."),
        ("erin", {"resume": source_id}, f"The phrase is {PHRASE}."),
    ):
        opts = make_opts(root, fake_server, name, **extra)
        seen = len(fake_server.messages())
        async with running_claude(connector, opts, tmp_path) as seat:
            # Claude Code registers its session during its start, which a loaded machine
            # stretches: until then its state names none, so the driver's own boot poll is
            # waited for first.
            with anyio.fail_after(TIMEOUT):
                await seat.driver.state_known.wait()
                sid = await seat.driver.get_state()
            assert sid == seat.spec.expected_session_id
            assert read_pointer(opts.session_pointer_path).session_id == sid
            assert transcripts(seat.config, sid) == []
            seat.proc.send_signal(signal.SIGKILL)
            with anyio.fail_after(TIMEOUT):
                await seat.proc.wait()
        assert len(fake_server.messages()) == seen

        assert sid is not None
        async with running_claude(
            connector, replace(opts, resume=None, continue_session=sid), tmp_path
        ) as seat:
            with anyio.fail_after(TIMEOUT):
                # As above: the continued start registers its session a moment after it runs.
                await seat.driver.state_known.wait()
                assert await seat.driver.get_state() == sid
                assert await seat.driver.prompt(
                    "what was the phrase?", message_id=f"{name}-1"
                ) == TurnOutcome("ok", answer)
            assert len(transcripts(seat.config, sid)) == 1
        assert fake_server.messages()[-1]["session"] == sid


@pytest.mark.anyio
async def test_local_interrupted_and_killed_turns_are_never_ok(
    root: Path, fake_server: AnthropicServer, tmp_path: Path
) -> None:
    connector = ClaudeCodeConnector()
    opts = make_opts(root, fake_server, "frank")
    async with running_claude(connector, opts, tmp_path) as seat:
        driver = seat.driver
        with anyio.fail_after(TIMEOUT):
            await driver.get_state()
            # A peer's text starting with '/' must not run a command (e.g. switch sessions).
            local = await driver.prompt("/clear", message_id="e3")
            assert local.detail == "answered by claude locally, without a model turn"
            assert await driver.get_state() == seat.spec.expected_session_id

        outcome: list[TurnOutcome] = []

        async def slow_turn(message_id: str) -> None:
            outcome.append(
                await driver.prompt("fake:slow what was the phrase?", message_id=message_id)
            )

        seen = len(fake_server.messages())
        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_turn, "e4")
            with anyio.fail_after(TIMEOUT):
                await until(lambda: len(fake_server.messages()) > seen)
                assert await driver.interrupt()
        assert [o.status for o in outcome] == ["aborted"]

        seen = len(fake_server.messages())
        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_turn, "e5")
            with anyio.fail_after(TIMEOUT):
                await until(lambda: len(fake_server.messages()) > seen)
            # The request is at the provider and streaming: kill claude mid-turn.
            seat.proc.send_signal(signal.SIGKILL)
        assert outcome[1] == TurnOutcome(
            "unknown", detail="turn e5 did not end: claude exited (its stdout closed)"
        )
        with anyio.fail_after(TIMEOUT):
            await seat.proc.wait()
        with pytest.raises(HarnessGone) as gone:
            await driver.get_state()
        assert gone.value.code == "harness-gone"
        assert "cannot query claude's state: claude exited" in gone.value.message
        assert await driver.prompt("anything", message_id="e6") == TurnOutcome(
            "unknown", detail="not delivered: claude exited (its stdout closed)"
        )
    # Everything Claude Code sent went to the fake server on 127.0.0.1 (the only endpoint).
    assert {r["session"] for r in fake_server.messages()} == {seat.spec.expected_session_id}


def test_doctor_reports_the_pinned_claude_as_exact_and_ready(
    root: Path, fake_server: AnthropicServer
) -> None:
    (root / "cotal.toml").write_text(
        f'[agents.claude]\nbase_url = "{fake_server.base_url}"\napi_key_env = "{KEY_VAR}"\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "manager.cli", "doctor", "--json", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    rows = {r["name"]: r for r in map(json.loads, proc.stdout.splitlines())}
    claude = rows["claude"]
    assert (
        claude["continuity"],
        claude["installed"],
        claude["usable"],
        claude["version"],
        claude["missing"],
    ) == ("exact", True, True, "2.1.197", [])
    assert claude["path"].endswith("/claude") and claude["ready"]
    assert SECRET not in proc.stdout + proc.stderr
