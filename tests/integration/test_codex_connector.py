"""The Codex connector against the real Codex CLI (pinned, from `.tools/codex`) and a real fake
Responses API server process on 127.0.0.1 (tests/fixtures/fake_responses.py).

* the driver: the launch prompt is turn 0, a later turn sees it, a turn the provider refuses is
  `error`, `kill -9` then a continuation reopens the same thread with its history, and a fresh
  seat does not know the phrase;
* a seat under the real manager: `send --wait` answered, and a message whose turn fails at the
  provider is never acknowledged: it is delivered again, then set aside as a dead letter;
* doctor reports the pinned install as exact and ready.

The provider key is a fake value that must never appear in argv or in any file under the
workspace; HOME stays empty, since the seat's CODEX_HOME is its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from connectors.base import LaunchOpts, TurnOutcome
from connectors.codex import CodexConnector, CodexDriver, pinned_program, rollouts
from protocol.errors import Refusal
from tests.conftest import REPO, Cli
from tests.fixtures.fake_responses import ResponsesServer
from tests.harness import Seat, read_pointer, running_seat, seat_opts
from tests.helpers import wait_until


def _codex_missing() -> str | None:
    from connectors.codex import pinned_program

    try:
        pinned_program()
    except Refusal as exc:
        return exc.text
    return None


CODEX_MISSING = _codex_missing()
pytestmark = pytest.mark.skipif(
    CODEX_MISSING is not None, reason=f"Codex is not installed: {CODEX_MISSING}"
)

PHRASE = "juniper-ledger-41"
SECRET = "sk-fake-codex-test-0123456789"
KEY_VAR = "COTAL_TEST_CODEX_KEY"
TIMEOUT = 20
NOTED = TurnOutcome("ok", f"Noted: {PHRASE}.")
RECALLED = TurnOutcome("ok", f"The phrase is {PHRASE}.")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv(KEY_VAR, SECRET)
    return home


def make_opts(root: Path, server: ResponsesServer, name: str, **kw: Any) -> LaunchOpts:
    return seat_opts(
        root,
        "codex",
        name,
        config={"base_url": server.base_url, "model": "fake-model", "api_key_env": KEY_VAR},
        **kw,
    )


def running(opts: LaunchOpts, tmp_path: Path) -> Any:
    return running_seat(CodexConnector(), opts, tmp_path, timeout=TIMEOUT, seat=Seat[CodexDriver])


async def ready(seat: Seat[CodexDriver]) -> str:
    with anyio.fail_after(TIMEOUT):
        while (sid := await seat.driver.get_state()) is None:
            await seat.driver.state_known.wait()
    return sid


async def ask(seat: Seat[CodexDriver], text: str, message_id: str) -> TurnOutcome:
    with anyio.fail_after(TIMEOUT):
        return await seat.driver.prompt(text, message_id=message_id)


@pytest.mark.anyio
async def test_a_thread_continues_exactly_after_kill9_and_errors_are_not_ok(
    root: Path, home: Path, fake_responses: ResponsesServer, tmp_path: Path
) -> None:
    opts = make_opts(root, fake_responses, "alice", prompt=f"Remember the phrase {PHRASE}.")
    async with running(opts, tmp_path) as seat:
        sid = await ready(seat)
        assert seat.spec.expected_session_id is None
        assert read_pointer(opts.session_pointer_path).session_id == sid
        with anyio.fail_after(TIMEOUT):
            await seat.driver.initial_done.wait()
        assert seat.driver.initial_outcome == NOTED
        assert await ask(seat, "What was the phrase?", "m1") == RECALLED
        failed = await ask(seat, "fake:http-400 hello", "m2")
        assert failed.status == "error"
        assert "fake provider refusal (fake:http-400)" in failed.detail
        stream_failed = await ask(seat, "fake:failed hello", "m3")
        assert stream_failed == TurnOutcome(
            "error", detail="stream disconnected before completion: fake failure (fake:failed)"
        )
        home_dir = Path(seat.spec.env["CODEX_HOME"])
        (rollout,) = rollouts(home_dir, sid)
        seat.proc.send_signal(signal.SIGKILL)
        with anyio.fail_after(TIMEOUT):
            assert await seat.proc.wait() == -signal.SIGKILL
    assert read_pointer(opts.session_pointer_path).status == "running"
    size = rollout.stat().st_size

    again = replace(opts, prompt=None, continue_session=sid)
    async with running(again, tmp_path) as seat:
        assert seat.spec.expected_session_id == sid
        assert await ready(seat) == sid
        assert await ask(seat, "What was the phrase?", "m4") == RECALLED
        with anyio.fail_after(TIMEOUT):
            await seat.driver.quit()
            assert await seat.proc.wait() == 0
    assert read_pointer(opts.session_pointer_path).status == "quit"
    # The same rollout, grown: Codex appended to the thread rather than starting another.
    assert rollouts(home_dir, sid) == [rollout] and rollout.stat().st_size > size
    last = fake_responses.responses()[-1]
    assert last["body"]["prompt_cache_key"] == sid
    seen = ResponsesServer.turns(last)
    assert seen[:4] == [
        ("user", f"Remember the phrase {PHRASE}."),
        ("assistant", NOTED.reply),
        ("user", "What was the phrase?"),
        ("assistant", RECALLED.reply),
    ]
    assert seen[-1] == ("user", "What was the phrase?")

    async with running(make_opts(root, fake_responses, "bob"), tmp_path) as seat:
        assert await ready(seat) != sid
        assert await ask(seat, "What was the phrase?", "b1") == TurnOutcome(
            "ok", "I do not know the phrase."
        )
    assert ResponsesServer.turns(fake_responses.responses()[-1]) == [
        ("user", "What was the phrase?")
    ]
    assert list(home.iterdir()) == []
    assert not any(SECRET in a for a in seat.spec.argv)
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert SECRET.encode() not in path.read_bytes(), f"the key leaked into {path}"


@pytest.mark.anyio
async def test_a_seat_killed_before_its_first_turn_continues_its_thread(
    root: Path, home: Path, fake_responses: ResponsesServer, tmp_path: Path
) -> None:
    opts = make_opts(root, fake_responses, "carol")
    async with running(opts, tmp_path) as seat:
        sid = await ready(seat)
        seat.proc.send_signal(signal.SIGKILL)
        with anyio.fail_after(TIMEOUT):
            await seat.proc.wait()
    assert fake_responses.responses() == []
    async with running(replace(opts, continue_session=sid), tmp_path) as seat:
        assert await ready(seat) == sid
        assert await ask(seat, f"Remember the phrase {PHRASE}.", "c1") == NOTED


def configure(root: Path, server: ResponsesServer, extra: str = "") -> None:
    (root / "cotal.toml").write_text(
        f'[agents.codex]\nbase_url = "{server.base_url}"\nmodel = "fake-model"\n'
        f'api_key_env = "{KEY_VAR}"\n{extra}'
    )


@pytest.mark.anyio
async def test_send_wait_is_answered_and_a_failed_turn_is_never_acknowledged(
    cli: Cli, home: Path, fake_responses: ResponsesServer
) -> None:
    configure(cli.root, fake_responses, "\n[delivery]\nmax_deliveries = 2\n")
    cli.run("up", "--detach", env={KEY_VAR: SECRET})
    try:
        row = cli.json(
            "spawn", "x1", "--agent", "codex", "--prompt", f"Remember the phrase {PHRASE}."
        )
        assert (row["continuity"], row["permissionMode"]) == (
            "exact",
            "approvals=never,sandbox=workspace-write",
        )
        wide = cli.run("ps", "--wide").stdout.splitlines()
        column = wide[0].index(" MODE ") + 1
        assert wide[1][column:].split()[0] == "approvals=never,sandbox=workspace-write"
        reply = cli.json("send", "x1", "What was the phrase?", "--wait")["reply"]
        assert reply == RECALLED.reply

        cli.run("send", "x1", "fake:http-400 please")

        def tried(times: int) -> bool:
            return (
                sum(
                    "fake:http-400 please" in text
                    for r in fake_responses.responses()
                    for role, text in ResponsesServer.turns(r)[-1:]
                    if role == "user"
                )
                >= times
            )

        # Delivered, failed, not acknowledged: delivered again, then set aside.
        await wait_until(lambda: tried(2), timeout=TIMEOUT, every=0.1)
        await wait_until(lambda: cli.ps()[0]["deadLetters"] == 1, timeout=TIMEOUT, every=0.2)
        # The failed turn's harness process may still be relaunching when the dead letter is
        # counted; the seat comes back running, in the same thread (asserted below).
        await wait_until(lambda: cli.ps()[0]["state"] == "running", timeout=TIMEOUT, every=0.2)
        # The seat goes on with its thread.
        reply = cli.json("send", "x1", "What was the phrase?", "--wait")["reply"]
        assert reply == RECALLED.reply
        sids = {r["body"]["prompt_cache_key"] for r in fake_responses.responses()}
        assert sids == {row["sessionId"]}
    finally:
        cli.run("down", check=False)


def test_doctor_reports_the_pinned_codex_as_exact_and_ready(
    root: Path, home: Path, fake_responses: ResponsesServer
) -> None:
    configure(root, fake_responses)

    def doctor(env: dict[str, str]) -> tuple[int, dict[str, Any], str]:
        proc = subprocess.run(
            [sys.executable, "-m", "manager.cli", "doctor", "--json", "--root", str(root)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            env={**env, "PYTHONPATH": str(REPO)},
        )
        rows = {r["name"]: r for r in map(json.loads, proc.stdout.splitlines())}
        return proc.returncode, rows["codex"], proc.stdout + proc.stderr

    rc, codex, out = doctor(dict(os.environ))
    assert (rc, codex["continuity"], codex["state"], codex["version"], codex["missing"]) == (
        0,
        "exact",
        "ready",
        "0.169.0",
        [],
    )
    # The native program the seat runs, not the package's node stub.
    assert (codex["path"], codex["used_by"]) == (str(pinned_program()), ["cotal.toml"])
    assert SECRET not in out

    # A configured codex whose key variable is unset runs, but fails the check until it is set.
    rc, codex, out = doctor({k: v for k, v in os.environ.items() if k != KEY_VAR})
    assert (rc, codex["state"], codex["missing"]) == (
        1,
        "config",
        [
            {
                "problem": f"codex connector has no provider key: {KEY_VAR} is not set in the "
                "manager's environment and no agents.codex.api_key_file is configured",
                "cure": "set agents.codex.api_key_file to a 0600 file holding the key (read at "
                f"every spawn), or export {KEY_VAR} before starting the manager",
                "kind": "config",
            }
        ],
    )
