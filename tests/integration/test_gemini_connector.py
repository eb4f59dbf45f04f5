"""The trap the Gemini CLI connector makes unreachable, on the real pinned harness against the
fake Gemini API: a `session/load` in the minute the session's chat file is named by overwrites
the session (Gemini CLI 0.61.0 names a start's own chat file by the minute and the id's first 8
characters, and a load's start writes Gemini's fresh context into it). Without the connector's
preparation of the store the load finds no session; with it, the same load in the same minute
continues the session and the model is sent the earlier turns (docs/design.md, "Gemini CLI
continuity").

The file is renamed to the current minute just before each load, so the load runs in the
minute it names unless the minute turns in the second or two a start takes; the control's
failure is asserted only when it did not.

And a session that took no turn, which Gemini CLI cannot load at all, is continued under the
seat's id: Gemini opens a new one, and the next continuation loads that.
"""

from __future__ import annotations

import shutil
import signal
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from connectors import gemini
from connectors.gemini import GeminiConnector, chat_files
from protocol.errors import Refusal
from tests.e2e.test_gemini_seat import _installed, gemini_server
from tests.fixtures.fake_gemini import GeminiServer
from tests.harness import Seat, running_seat, seat_opts

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.gemini,
    pytest.mark.skipif(not _installed(), reason="Gemini CLI is not installed under .tools/"),
]
KEY_VAR = "COTAL_TEST_GEMINI_KEY"
PHRASE = "sandpiper-minute-12"
TIMEOUT = 40


@pytest.fixture
def fake_gemini(tmp_path: Path) -> Iterator[GeminiServer]:
    yield from gemini_server(tmp_path)


def minute() -> str:
    """The stamp Gemini CLI names a chat file by, for this minute."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H-%M")


def stamp_now(store: Path, session_id: str) -> str:
    """Name the session's chat file by this minute, as if the session were made in it."""
    [chat] = [c.path for c in chat_files(store, session_id) if c.resumable]
    now = minute()
    chat.rename(chat.with_name(f"session-{now}-{session_id[:8]}.jsonl"))
    return now


async def test_a_load_in_the_minute_of_the_sessions_file_keeps_the_session(
    root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fake_gemini: GeminiServer,
) -> None:
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(KEY_VAR, "fake-gemini-minute-key")
    config = {"base_url": fake_gemini.base_url, "model": "fake-gemini", "api_key_env": KEY_VAR}
    opts = seat_opts(root, "gemini", "alice", config=config, prompt=f"remember the phrase {PHRASE}")
    connector = GeminiConnector()
    async with running_seat(connector, opts, tmp_path, timeout=TIMEOUT, seat=Seat[Any]) as seat:
        with anyio.fail_after(TIMEOUT):
            await seat.driver.initial_done.wait()
        assert seat.driver.initial_outcome.reply == f"Noted: {PHRASE}."
        sid = seat.driver.session_id
        store = Path(seat.spec.env["GEMINI_CLI_HOME"])
        seat.proc.send_signal(signal.SIGKILL)
        with anyio.fail_after(TIMEOUT):
            await seat.proc.wait()
    again = replace(opts, prompt=None, continue_session=sid)
    kept = tmp_path / "store-copy"
    shutil.copytree(store, kept)

    # The control: the store as Gemini left it, loaded in the minute its file is named by.
    with monkeypatch.context() as unprepared:
        # The store left as it is, and the session loaded by its own id.
        unprepared.setattr(gemini, "prepare_continuation", lambda _store, sid, _cwd: sid)
        stamped = stamp_now(store, sid)
        async with running_seat(
            connector, again, tmp_path, timeout=TIMEOUT, seat=Seat[Any]
        ) as seat:
            with anyio.fail_after(TIMEOUT):
                await seat.driver.state_known.wait()
            refused: Refusal | None = None
            try:
                await seat.driver.get_state()
            except Refusal as exc:
                refused = exc
    # Only a load in the file's own minute loses the session: on a busy host Gemini's start can
    # cross into the next one, and then the control proves nothing either way.
    if minute() == stamped:
        # (Gemini's own words, in the error's data: `No previous sessions found for this
        # project.`)
        assert refused is not None and "refused session/load" in refused.message, refused
        # For good: Gemini's fresh context was written over the session's own file.
        assert not [c for c in chat_files(store, sid) if c.resumable]

    # The connector's way: the same store, the same minute, and the session goes on.
    shutil.rmtree(store)
    shutil.copytree(kept, store)
    stamp_now(store, sid)
    asked = len(fake_gemini.requests())
    async with running_seat(connector, again, tmp_path, timeout=TIMEOUT, seat=Seat[Any]) as seat:
        with anyio.fail_after(TIMEOUT):
            await seat.driver.state_known.wait()
            assert await seat.driver.get_state() == sid
            outcome = await seat.driver.prompt("what was the phrase?", message_id="m1")
        assert outcome.reply == f"The phrase is {PHRASE}."
    [request] = fake_gemini.requests()[asked:]
    assert GeminiServer.turns(request) == [
        ("user", f"remember the phrase {PHRASE}"),
        ("assistant", f"Noted: {PHRASE}."),
        ("user", "what was the phrase?"),
    ]
    assert (store / ".gemini").is_dir()
    names = [c.path.name for c in chat_files(store, sid) if c.resumable]
    assert names == [f"session-cotal-{sid[:8]}.jsonl"]


async def test_a_session_that_took_no_turn_is_continued_under_the_seats_id(
    root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fake_gemini: GeminiServer,
) -> None:
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(KEY_VAR, "fake-gemini-minute-key")
    config = {"base_url": fake_gemini.base_url, "model": "fake-gemini", "api_key_env": KEY_VAR}
    opts = seat_opts(root, "gemini", "idle", config=config)
    connector = GeminiConnector()
    # Killed before its first turn: Gemini CLI cannot load that session.
    async with running_seat(connector, opts, tmp_path, timeout=TIMEOUT, seat=Seat[Any]) as seat:
        with anyio.fail_after(TIMEOUT):
            await seat.driver.state_known.wait()
            sid = await seat.driver.get_state()
        store = Path(seat.spec.env["GEMINI_CLI_HOME"])
        seat.proc.send_signal(signal.SIGKILL)
        with anyio.fail_after(TIMEOUT):
            await seat.proc.wait()
    again = replace(opts, continue_session=sid)

    # Continued, it is the seat's session still, opened anew in Gemini: told a phrase now.
    async with running_seat(connector, again, tmp_path, timeout=TIMEOUT, seat=Seat[Any]) as seat:
        with anyio.fail_after(TIMEOUT):
            await seat.driver.state_known.wait()
            assert await seat.driver.get_state() == sid
            told = await seat.driver.prompt(f"remember the phrase {PHRASE}", message_id="m1")
        assert told.reply == f"Noted: {PHRASE}."
        seat.proc.send_signal(signal.SIGKILL)
        with anyio.fail_after(TIMEOUT):
            await seat.proc.wait()
    gemini_id = gemini.session_alias(store, sid)
    assert gemini_id != sid
    assert [r for r in fake_gemini.requests() if sid in str(r)] == []

    # Continued again: Gemini loads its session, which has the turn, under the seat's id.
    async with running_seat(connector, again, tmp_path, timeout=TIMEOUT, seat=Seat[Any]) as seat:
        with anyio.fail_after(TIMEOUT):
            await seat.driver.state_known.wait()
            assert await seat.driver.get_state() == sid
            asked = await seat.driver.prompt("what was the phrase?", message_id="m2")
        assert asked.reply == f"The phrase is {PHRASE}."
    names = [c.path.name for c in chat_files(store) if c.resumable]
    assert names == [f"session-cotal-{gemini_id[:8]}.jsonl"]
