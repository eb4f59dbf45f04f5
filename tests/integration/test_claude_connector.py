"""The Claude Code connector against the real Claude Code (pinned, from `.tools/claude`) and a
real fake Anthropic Messages server process on 127.0.0.1.

What is proved, with Claude Code's own transcript store (in the seat's private config dir) as
the only memory:
* a seat answers from its history; its pointer names the id the connector minted, which is the
  id Claude Code reports (registry, `system/init`, `result`, and the request header);
* after `kill -9`, a relaunch with `continue_session` reopens exactly that session: same id,
  the phrase is still known, the server saw the earlier turns in the request, and the same
  transcript file grew;
* resuming another seat's session forks it: a new id, the history carried, the source
  transcript byte-for-byte untouched;
* a seat killed before its first turn (fresh or forked) still continues under its id;
* failed, empty, interrupted and killed turns are never `ok`.

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

from connectors.base import LaunchOpts, LaunchSpec, TurnOutcome, continuity_class
from connectors.claude_code import ClaudeCodeConnector, ClaudeDriver, HarnessGone, transcripts
from protocol.errors import Refusal
from protocol.session import SessionPointer
from tests.conftest import REPO, AnthropicServer
from tests.harness import Seat, read_pointer, running_seat, seat_opts, sha256, until


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
    """build_launch + a real claude process + the driver's reader in a task group; reaps claude always."""
    return running_seat(connector, opts, log_dir, timeout=TIMEOUT, seat=ClaudeSeat)


def assert_no_secret(root: Path, *specs: LaunchSpec) -> None:
    for spec in specs:
        assert not any(SECRET in a for a in spec.argv)
        assert spec.secret_env == ("ANTHROPIC_API_KEY",)
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert SECRET.encode() not in path.read_bytes(), f"the API key leaked into {path}"


def test_declares_exact_continuity() -> None:
    assert continuity_class(ClaudeCodeConnector.capabilities) == "exact"


@pytest.mark.anyio
async def test_remember_kill9_continue_exact(
    root: Path, fake_server: AnthropicServer, tmp_path: Path
) -> None:
    connector = ClaudeCodeConnector()
    opts = make_opts(root, fake_server, "alice", prompt=f"remember the phrase {PHRASE}")

    async with running_claude(connector, opts, tmp_path) as seat:
        minted = seat.spec.expected_session_id
        assert minted is not None and seat.spec.argv[-2:] == ["--session-id", minted]
        with anyio.fail_after(TIMEOUT):
            sid = await seat.driver.get_state()
            assert sid == minted
            # The pointer is written by the driver once Claude Code reported the session, 0600.
            assert read_pointer(opts.session_pointer_path) == SessionPointer(
                version=1, session_id=sid, status="running"
            )
            assert opts.session_pointer_path.stat().st_mode & 0o777 == 0o600
            await seat.driver.initial_done.wait()
            assert seat.driver.initial_outcome == TurnOutcome("ok", f"Noted: {PHRASE}.")
            assert await seat.driver.prompt("what was the phrase?", message_id="m1") == TurnOutcome(
                "ok", f"The phrase is {PHRASE}."
            )
        assert seat.driver.session_id == sid  # also what system/init and result reported
        assert seat.config.stat().st_mode & 0o777 == 0o700
        (transcript,) = transcripts(seat.config, sid)
        # The driver noted that the session has a transcript now: if it ever goes missing, a
        # continuation refuses rather than restarting an empty session under this id.
        assert json.loads((seat.config / "cotal-launch.json").read_text()) == {
            "version": 1,
            "sessionId": sid,
            "origin": "fresh",
            "materialized": True,
        }
        seat.proc.send_signal(signal.SIGKILL)
        with anyio.fail_after(TIMEOUT):
            assert await seat.proc.wait() == -signal.SIGKILL
    first_spec = seat.spec

    # A crash leaves the pointer `running`, naming the session to continue.
    assert read_pointer(opts.session_pointer_path) == SessionPointer(
        version=1, session_id=sid, status="running"
    )
    lines_before = transcript.read_text().count("\n")
    requests_before = len(fake_server.messages())

    relaunch = replace(opts, prompt=None, continue_session=sid)
    async with running_claude(connector, relaunch, tmp_path) as seat:
        assert seat.spec.expected_session_id == sid
        assert seat.spec.argv[-2:] == ["--resume", sid] and "--fork-session" not in seat.spec.argv
        with anyio.fail_after(TIMEOUT):
            assert await seat.driver.get_state() == sid
            assert await seat.driver.prompt("what was the phrase?", message_id="m2") == TurnOutcome(
                "ok", f"The phrase is {PHRASE}."
            )
        assert seat.driver.session_id == sid
        # The same transcript grew; no other session appeared in the seat's store.
        assert transcripts(seat.config, sid) == [transcript]
        assert transcript.read_text().count("\n") > lines_before
        assert [p.name for p in transcript.parent.glob("*.jsonl")] == [transcript.name]
        with anyio.fail_after(TIMEOUT):
            await seat.driver.quit()
            assert await seat.proc.wait() == 0
    assert read_pointer(opts.session_pointer_path) == SessionPointer(
        version=1, session_id=sid, status="quit"
    )

    requests = fake_server.messages()
    assert len(requests) == requests_before + 1
    last = requests[-1]
    assert last["session"] == sid
    assert fake_server.turns(last) == [
        ("user", f"remember the phrase {PHRASE}"),
        ("assistant", f"Noted: {PHRASE}."),
        ("user", "what was the phrase?"),
        ("assistant", f"The phrase is {PHRASE}."),
        ("user", "what was the phrase?"),
    ]
    assert {r["session"] for r in requests} == {sid}
    assert all(r["body"]["model"] == "claude-fake-1" for r in requests)
    assert_no_secret(root, first_spec, seat.spec)
    assert list((tmp_path / "home").iterdir()) == []


@pytest.mark.anyio
async def test_resume_forks_with_new_id_and_history_and_leaves_source(
    root: Path, fake_server: AnthropicServer, tmp_path: Path
) -> None:
    connector = ClaudeCodeConnector()
    source_opts = make_opts(root, fake_server, "alice", prompt=f"remember the phrase {PHRASE}")
    async with running_claude(connector, source_opts, tmp_path) as seat:
        with anyio.fail_after(TIMEOUT):
            await seat.driver.initial_done.wait()
        assert seat.driver.initial_outcome == TurnOutcome("ok", f"Noted: {PHRASE}.")
        source_id = seat.driver.session_id
        assert source_id is not None
        (source_file,) = transcripts(seat.config, source_id)
    before = sha256(source_file)

    fork_opts = make_opts(root, fake_server, "bob", resume=source_id)
    async with running_claude(connector, fork_opts, tmp_path) as seat:
        fork_id = seat.spec.expected_session_id
        assert fork_id is not None and fork_id != source_id
        snapshot = seat.config / "cotal-forks" / fork_id / f"{source_id}.jsonl"
        assert seat.spec.argv[-5:] == [
            "--resume",
            str(snapshot),
            "--fork-session",
            "--session-id",
            fork_id,
        ]
        with anyio.fail_after(TIMEOUT):
            assert await seat.driver.get_state() == fork_id
            assert await seat.driver.prompt("what was the phrase?", message_id="f1") == TurnOutcome(
                "ok", f"The phrase is {PHRASE}."
            )
        assert seat.driver.session_id == fork_id
        (fork_file,) = transcripts(seat.config, fork_id)
        assert transcripts(seat.config, source_id) == []
    assert read_pointer(fork_opts.session_pointer_path) == SessionPointer(
        version=1, session_id=fork_id, status="running"
    )
    assert sha256(source_file) == before
    last = fake_server.messages()[-1]
    assert last["session"] == fork_id
    assert fake_server.turns(last) == [
        ("user", f"remember the phrase {PHRASE}"),
        ("assistant", f"Noted: {PHRASE}."),
        ("user", "what was the phrase?"),
    ]
    # The fork is its own session: telling it something new leaves the source as it was.
    async with running_claude(
        connector, replace(fork_opts, resume=None, continue_session=fork_id), tmp_path
    ) as seat:
        with anyio.fail_after(TIMEOUT):
            assert await seat.driver.prompt(
                "remember the phrase maple-rocket-7", message_id="f2"
            ) == TurnOutcome("ok", "Noted: maple-rocket-7.")
    assert sha256(source_file) == before
    assert sha256(fork_file) != before


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
            with anyio.fail_after(TIMEOUT):
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
                assert await seat.driver.get_state() == sid
                assert await seat.driver.prompt(
                    "what was the phrase?", message_id=f"{name}-1"
                ) == TurnOutcome("ok", answer)
            assert len(transcripts(seat.config, sid)) == 1
        assert fake_server.messages()[-1]["session"] == sid


@pytest.mark.anyio
async def test_failed_empty_interrupted_and_killed_turns_are_never_ok(
    root: Path, fake_server: AnthropicServer, tmp_path: Path
) -> None:
    connector = ClaudeCodeConnector()
    opts = make_opts(root, fake_server, "frank")
    async with running_claude(connector, opts, tmp_path) as seat:
        driver = seat.driver
        with anyio.fail_after(TIMEOUT):
            await driver.get_state()
            failed = await driver.prompt("fake:http-500 hello", message_id="e1")
            assert failed.status == "error" and failed.detail.startswith(
                "API Error: 500 fake server error (fake:http-500)."
            )
            # Claude Code asks once more after an empty reply; the fake stays empty.
            empty = await driver.prompt("fake:empty hello", message_id="e2")
            assert empty == TurnOutcome("unknown", detail="the model produced no output")
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
        assert gone.value.text == (
            "claude connector: cannot query claude's state: claude exited (its stdout closed); "
            "read the seat's log for why claude exited, then restart the seat"
        )
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
