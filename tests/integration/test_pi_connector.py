"""The pi connector against the real pi program (pinned, from `.tools/pi`) and a real fake
OpenAI-compatible server process on 127.0.0.1.

What every connector promises (readiness, turn outcomes, exact reopening, forks) is proved in
tests/integration/test_connector_contract.py. Here, what only pi does:
* a fresh seat killed before its first reply still continues, from the file cotal seeded;
* a turn killed mid-flight is `unknown`, and so is every later prompt and state query.
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
from connectors.pi import HarnessGone, PiConnector, PiDriver
from tests.conftest import PI_CLI, FakeServer
from tests.harness import Seat, read_pointer, running_seat, seat_opts, until

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
async def test_a_turn_killed_mid_flight_is_unknown(
    root: Path, fake_server: FakeServer, tmp_path: Path
) -> None:
    connector = PiConnector()
    opts = make_opts(root, fake_server, "erin")
    async with running_pi(connector, opts, tmp_path) as seat:
        driver = seat.driver
        with anyio.fail_after(TIMEOUT):
            await driver.get_state()

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
        assert gone.value.code == "harness-gone"
        assert "cannot query pi's state: pi exited" in gone.value.message
        assert await driver.prompt("anything", message_id="e4") == TurnOutcome(
            "unknown", detail="not delivered: pi exited (its stdout closed)"
        )
    # Everything pi sent went to the fake server on 127.0.0.1 (base_url is the only endpoint).
    assert all(r["model"] == "fake-model" for r in fake_server.requests())
    assert os.path.exists(opts.session_pointer_path)
