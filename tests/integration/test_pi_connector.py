"""The pi connector against the real pi program (pinned, from `.tools/pi`) and a real fake
OpenAI-compatible server process on 127.0.0.1.

What is proved, with pi's own session store as the only memory:
* a seat answers from its history, and its pointer names the id pi reports;
* after `kill -9`, a relaunch with `continue_session` reopens exactly that session: same id,
  the phrase is still known, and the server saw the earlier turns in the request history;
* a fresh seat does not know the phrase; a fork gets a new id, knows it, and leaves the
  source file byte-for-byte untouched;
* failed, empty and interrupted turns are never `ok` (so a delivery is never acknowledged).
"""

from __future__ import annotations

import json
import os
import signal
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from connectors.base import LaunchOpts, LaunchSpec, TurnOutcome
from connectors.pi import HarnessGone, PiConnector, PiDriver, read_session_header
from protocol.session import SessionPointer
from tests.conftest import PI_CLI, FakeServer
from tests.harness import Seat, read_pointer, running_seat, seat_opts, sha256, until

PI_INSTALLED = PI_CLI.is_file()

pytestmark = [
    pytest.mark.pi,
    pytest.mark.skipif(
        not PI_INSTALLED,
        reason="pi is not installed under .tools/pi; run `python -m manager.cli.tools install`",
    ),
]

PHRASE = "juniper-ledger-41"
TIMEOUT = 30


@pytest.fixture
def fake_server(fake_openai: FakeServer) -> FakeServer:
    return fake_openai


def make_opts(
    root: Path, server: FakeServer, name: str, *, uid: str | None = None, **kw: Any
) -> LaunchOpts:
    return seat_opts(
        root, "pi", name, uid=uid, config={"base_url": server.base_url, "model": "fake-model"}, **kw
    )


def running_pi(
    connector: PiConnector, opts: LaunchOpts, log_dir: Path
) -> AbstractAsyncContextManager[Seat[PiDriver]]:
    """build_launch + a real pi process + the driver's reader in a task group; reaps pi always."""
    return running_seat(connector, opts, log_dir, timeout=TIMEOUT, seat=Seat[PiDriver])


def session_files(spec: LaunchSpec, root: Path) -> list[Path]:
    (decl,) = spec.session_store
    return sorted((root / decl.relpath).glob("*.jsonl"))


@pytest.mark.anyio
async def test_remember_kill9_continue_and_fresh(
    root: Path, fake_server: FakeServer, tmp_path: Path
) -> None:
    connector = PiConnector()
    opts = make_opts(root, fake_server, "alice", prompt=f"remember the phrase {PHRASE}")

    async with running_pi(connector, opts, tmp_path) as seat:
        with anyio.fail_after(TIMEOUT):
            sid = await seat.driver.get_state()
        assert sid is not None and sid == seat.spec.expected_session_id
        # The pointer is written on pi's behalf once get_state proved the session, 0600.
        assert read_pointer(opts.session_pointer_path) == SessionPointer(
            version=1, session_id=sid, status="running"
        )
        assert opts.session_pointer_path.stat().st_mode & 0o777 == 0o600
        with anyio.fail_after(TIMEOUT):
            await seat.driver.initial_done.wait()
            assert seat.driver.initial_outcome == TurnOutcome("ok", f"Noted: {PHRASE}.")
            assert await seat.driver.prompt("what was the phrase?", message_id="m1") == TurnOutcome(
                "ok", f"The phrase is {PHRASE}."
            )
        (session_file,) = session_files(seat.spec, root)
        assert session_file.name.endswith(f"_{sid}.jsonl")
        seat.proc.send_signal(signal.SIGKILL)
        with anyio.fail_after(TIMEOUT):
            assert await seat.proc.wait() == -signal.SIGKILL

    # A crash leaves the pointer `running`, naming the session to continue.
    assert read_pointer(opts.session_pointer_path) == SessionPointer(
        version=1, session_id=sid, status="running"
    )
    requests_before = len(fake_server.requests())

    relaunch = replace(opts, prompt=None, continue_session=sid)
    async with running_pi(connector, relaunch, tmp_path) as seat:
        assert seat.spec.expected_session_id == sid
        assert seat.spec.argv[-2:] == ["--session", str(session_file)]
        with anyio.fail_after(TIMEOUT):
            assert await seat.driver.get_state() == sid
            assert await seat.driver.prompt("what was the phrase?", message_id="m2") == TurnOutcome(
                "ok", f"The phrase is {PHRASE}."
            )
        # Exactly one file, the same one, grown: pi continued it rather than starting another.
        assert session_files(seat.spec, root) == [session_file]
        with anyio.fail_after(TIMEOUT):
            await seat.driver.quit()
            assert await seat.proc.wait() == 0
    assert read_pointer(opts.session_pointer_path) == SessionPointer(
        version=1, session_id=sid, status="quit"
    )

    requests = fake_server.requests()
    assert len(requests) == requests_before + 1
    last = requests[-1]
    assert fake_server.user_texts(last) == [
        f"remember the phrase {PHRASE}",
        "what was the phrase?",
        "what was the phrase?",
    ]
    assert [m["content"] for m in last["messages"] if m["role"] == "assistant"] == [
        f"Noted: {PHRASE}.",
        f"The phrase is {PHRASE}.",
    ]

    # A fresh seat in the same workspace has its own store and does not know the phrase.
    fresh = make_opts(root, fake_server, "bob")
    async with running_pi(connector, fresh, tmp_path) as seat:
        with anyio.fail_after(TIMEOUT):
            bob_sid = await seat.driver.get_state()
            assert await seat.driver.prompt("what was the phrase?", message_id="m3") == TurnOutcome(
                "ok", "I do not know the phrase."
            )
    assert bob_sid not in (None, sid)
    assert fake_server.user_texts(fake_server.requests()[-1]) == ["what was the phrase?"]


@pytest.mark.anyio
async def test_fork_gets_new_id_and_history_and_leaves_source(
    root: Path, fake_server: FakeServer, tmp_path: Path
) -> None:
    connector = PiConnector()
    source_opts = make_opts(root, fake_server, "alice", prompt=f"remember the phrase {PHRASE}")
    async with running_pi(connector, source_opts, tmp_path) as seat:
        with anyio.fail_after(TIMEOUT):
            source_id = await seat.driver.get_state()
            await seat.driver.initial_done.wait()
        assert seat.driver.initial_outcome == TurnOutcome("ok", f"Noted: {PHRASE}.")
        (source_file,) = session_files(seat.spec, root)
    before = sha256(source_file)

    fork_opts = make_opts(root, fake_server, "carol", resume=source_id)
    async with running_pi(connector, fork_opts, tmp_path) as seat:
        assert seat.spec.expected_session_id is None
        assert seat.spec.argv[-2:] == ["--fork", str(source_file)]
        with anyio.fail_after(TIMEOUT):
            fork_id = await seat.driver.get_state()
            assert await seat.driver.prompt("what was the phrase?", message_id="f1") == TurnOutcome(
                "ok", f"The phrase is {PHRASE}."
            )
        assert fork_id is not None and fork_id != source_id
        (fork_file,) = session_files(seat.spec, root)
        header = read_session_header(fork_file)
        assert (header["id"], header["parentSession"], header["cwd"]) == (
            fork_id,
            str(source_file),
            str(root),
        )
    assert read_pointer(fork_opts.session_pointer_path) == SessionPointer(
        version=1, session_id=fork_id, status="running"
    )
    assert sha256(source_file) == before
    assert fake_server.user_texts(fake_server.requests()[-1]) == [
        f"remember the phrase {PHRASE}",
        "what was the phrase?",
    ]


@pytest.mark.anyio
async def test_fresh_seat_killed_before_first_reply_still_continues(
    root: Path, fake_server: FakeServer, tmp_path: Path
) -> None:
    """pi writes nothing for a new session until its first reply; the seeded file makes a
    fresh seat's id recoverable from its first instant."""
    connector = PiConnector()
    opts = make_opts(root, fake_server, "dora")
    async with running_pi(connector, opts, tmp_path) as seat:
        with anyio.fail_after(TIMEOUT):
            sid = await seat.driver.get_state()
        assert read_pointer(opts.session_pointer_path).session_id == sid
        seat.proc.send_signal(signal.SIGKILL)
        with anyio.fail_after(TIMEOUT):
            await seat.proc.wait()
    assert fake_server.requests() == []

    async with running_pi(connector, replace(opts, continue_session=sid), tmp_path) as seat:
        with anyio.fail_after(TIMEOUT):
            assert await seat.driver.get_state() == sid
            assert await seat.driver.prompt(
                f"remember the phrase {PHRASE}", message_id="d1"
            ) == TurnOutcome("ok", f"Noted: {PHRASE}.")
            assert await seat.driver.prompt("what was the phrase?", message_id="d2") == TurnOutcome(
                "ok", f"The phrase is {PHRASE}."
            )
        (only,) = session_files(seat.spec, root)
        lines = only.read_text().splitlines()
        # Measured pi 0.73.1 behaviour on a seeded file: at the first reply it writes the header
        # a second time (its buffered entries are flushed whole). Reopening reads the first.
        assert lines[0] == lines[1] and json.loads(lines[0])["id"] == sid
        assert [json.loads(line)["type"] for line in lines[2:]] == [
            "model_change",
            "thinking_level_change",
            "message",
            "message",
            "message",
            "message",
        ]


@pytest.mark.anyio
async def test_failed_empty_and_interrupted_turns_are_never_ok(
    root: Path, fake_server: FakeServer, tmp_path: Path
) -> None:
    connector = PiConnector()
    opts = make_opts(root, fake_server, "erin")
    async with running_pi(connector, opts, tmp_path) as seat:
        driver = seat.driver
        with anyio.fail_after(TIMEOUT):
            await driver.get_state()
            failed = await driver.prompt("fake:http-500 hello", message_id="e1")
            assert failed == TurnOutcome("error", detail="500 fake server error (fake:http-500)")
            empty = await driver.prompt("fake:empty hello", message_id="e2")
            assert empty == TurnOutcome("unknown", detail="the model produced no output")

        outcome: list[TurnOutcome] = []

        async def slow_turn() -> None:
            outcome.append(await driver.prompt("fake:slow what was the phrase?", message_id="e3"))

        seen = len(fake_server.requests())
        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_turn)
            with anyio.fail_after(TIMEOUT):
                await until(lambda: len(fake_server.requests()) > seen)
            # The request is at the provider and streaming: kill pi mid-turn.
            seat.proc.send_signal(signal.SIGKILL)
        assert outcome == [
            TurnOutcome("unknown", detail="turn e3 did not end: pi exited (its stdout closed)")
        ]
        with anyio.fail_after(TIMEOUT):
            await seat.proc.wait()
        with pytest.raises(HarnessGone) as gone:
            await driver.get_state()
        assert gone.value.text == (
            "pi connector: cannot query pi's state: pi exited (its stdout closed); "
            "read the seat's log for why pi exited, then restart the seat"
        )
        assert await driver.prompt("anything", message_id="e4") == TurnOutcome(
            "unknown", detail="not delivered: pi exited (its stdout closed)"
        )
    # Everything pi sent went to the fake server on 127.0.0.1 (base_url is the only endpoint).
    assert all(r["model"] == "fake-model" for r in fake_server.requests())
    assert os.path.exists(opts.session_pointer_path)
