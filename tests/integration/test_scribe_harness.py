"""The real scribe process, launched from the connector's LaunchSpec and driven over its stdio.

Every child is reaped before its test ends: the seat helper kills what is still running and
waits for the exit status in a shielded scope.
"""

from __future__ import annotations

import hashlib
import json
import signal
import stat
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process

from connectors.base import LaunchOpts, LaunchSpec, TurnOutcome
from connectors.jsonl_driver import DriverEvent, JsonLinesDriver, TurnEnded, TurnStarted
from connectors.scribe.connector import ScribeCodec, ScribeConnector

DEADLINE_S = 15.0
PHRASE = "violet-otter-17"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class EventLog:
    def __init__(self) -> None:
        self.events: list[DriverEvent] = []
        self._changed = anyio.Event()

    def __call__(self, event: DriverEvent) -> None:
        self.events.append(event)
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, match: Callable[[DriverEvent], bool]) -> None:
        while not any(match(e) for e in self.events):
            await self._changed.wait()


@dataclass
class Seat:
    process: Process
    driver: JsonLinesDriver
    session_id: str
    spec: LaunchSpec
    log: EventLog = field(default_factory=EventLog)

    async def ask(self, text: str, mid: str | None = None) -> TurnOutcome:
        with anyio.fail_after(DEADLINE_S):
            return await self.driver.prompt(text, message_id=mid or uuid.uuid4().hex)

    async def exit_code(self) -> int:
        with anyio.fail_after(DEADLINE_S):
            return await self.process.wait()


def launch_opts(root: Path, **kw: object) -> LaunchOpts:
    base: dict[str, object] = dict(
        space="test",
        name="alpha",
        lifecycle_uid="u1",
        workspace_root=root,
        cwd=root,
        session_pointer_path=root / ".cotal" / "sessions" / "scribe" / "alpha-u1.json",
    )
    base.update(kw)
    return LaunchOpts(**base)  # type: ignore[arg-type]


@asynccontextmanager
async def seat(root: Path, *, own_driver: bool = False, **kw: object) -> AsyncIterator[Seat]:
    connector = ScribeConnector()
    spec = connector.build_launch(launch_opts(root, **kw))
    log = EventLog()
    process = await anyio.open_process(
        spec.argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=spec.cwd,
        env=spec.env,
    )
    try:
        assert process.stdin is not None and process.stdout is not None
        driver = (
            connector.make_driver(process.stdin, process.stdout, spec)
            if own_driver
            else JsonLinesDriver(process.stdin, process.stdout, ScribeCodec(), on_event=log)
        )
        async with anyio.create_task_group() as tg:
            await tg.start(driver.run)
            session_id = await driver.wait_ready(DEADLINE_S)
            try:
                yield Seat(process, driver, session_id, spec, log)
            finally:
                # EOF on stdin is the polite stop; only a child that ignores it is killed.
                await driver.aclose()
                with anyio.move_on_after(DEADLINE_S):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
            await process.aclose()


async def run_to_exit(argv: list[str], root: Path) -> tuple[int, str]:
    with anyio.fail_after(DEADLINE_S):
        done = await anyio.run_process(argv, cwd=root, env=env_for(root), check=False)
    return done.returncode, done.stderr.decode()


def env_for(root: Path) -> dict[str, str]:
    return ScribeConnector().build_launch(launch_opts(root)).env


def store_of(root: Path) -> Path:
    return root / ".cotal" / "sessions" / "scribe" / "alpha-u1.store"


def pointer_of(root: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads(
        (root / ".cotal/sessions/scribe/alpha-u1.json").read_bytes()
    )
    return data


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def transcript_lines(root: Path, session_id: str) -> list[dict[str, object]]:
    path = store_of(root) / f"{session_id}.jsonl"
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def ok(reply: str) -> TurnOutcome:
    return TurnOutcome("ok", reply, "")


# -- start, pointer, answering --------------------------------------------------------------


@pytest.mark.anyio
async def test_fresh_start_writes_a_private_pointer_and_answers(tmp_path: Path) -> None:
    async with seat(tmp_path, own_driver=True) as s:
        assert uuid.UUID(s.session_id).version == 4
        pointer = tmp_path / ".cotal/sessions/scribe/alpha-u1.json"
        assert stat.S_IMODE(pointer.stat().st_mode) == 0o600
        assert pointer_of(tmp_path) == {
            "version": 1,
            "sessionId": s.session_id,
            "status": "running",
        }
        assert stat.S_IMODE(store_of(tmp_path).stat().st_mode) == 0o700
        transcript = store_of(tmp_path) / f"{s.session_id}.jsonl"
        assert stat.S_IMODE(transcript.stat().st_mode) == 0o600

        assert await s.ask(f"remember the phrase {PHRASE}") == ok(f"Noted: {PHRASE}.")
        assert await s.ask("what was the phrase?") == ok(f"The phrase is {PHRASE}.")
        with anyio.fail_after(DEADLINE_S):
            assert await s.driver.get_state() == s.session_id
    assert s.process.returncode == 0
    assert [line.get("role") for line in transcript_lines(tmp_path, s.session_id)] == [
        None,
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    header = transcript_lines(tmp_path, s.session_id)[0]
    assert (header["type"], header["id"], header["parent"]) == ("session", s.session_id, None)
    # EOF ends the process without claiming the session was quit.
    assert pointer_of(tmp_path)["status"] == "running"


@pytest.mark.anyio
async def test_launch_prompt_is_turn_zero(tmp_path: Path) -> None:
    async with seat(tmp_path, prompt=f"remember the phrase {PHRASE}") as s:
        assert await s.ask("what was the phrase") == ok(f"The phrase is {PHRASE}.")
    assert [e.outcome.reply for e in s.log.events if isinstance(e, TurnEnded)] == [
        f"Noted: {PHRASE}.",
        f"The phrase is {PHRASE}.",
    ]


# -- continuation and fork ------------------------------------------------------------------


@pytest.mark.anyio
async def test_continue_creates_exactly_the_named_session(tmp_path: Path) -> None:
    async with seat(tmp_path, continue_session="named-session-1") as s:
        assert s.session_id == "named-session-1"
        assert await s.ask("what was the phrase") == ok("I do not know the phrase.")
    assert transcript_lines(tmp_path, "named-session-1")[0]["id"] == "named-session-1"


@pytest.mark.anyio
async def test_fork_of_a_missing_session_is_refused(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "connectors.scribe",
        "--store",
        str(tmp_path / "store"),
        "--fork",
        "nope",
    ]
    code, err = await run_to_exit(argv, tmp_path)
    assert code == 2
    assert err.startswith("scribe: cannot fork session 'nope': no session 'nope' in store ")


@pytest.mark.anyio
async def test_session_id_with_fork_is_refused(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "connectors.scribe",
        "--store",
        str(tmp_path / "store"),
        "--session-id",
        "a",
        "--fork",
        "b",
    ]
    code, err = await run_to_exit(argv, tmp_path)
    assert code == 2
    assert "argument --fork: not allowed with argument --session-id" in err


@pytest.mark.anyio
async def test_a_session_open_elsewhere_is_refused(tmp_path: Path) -> None:
    async with seat(tmp_path) as s:
        argv = [
            sys.executable,
            "-m",
            "connectors.scribe",
            "--store",
            str(store_of(tmp_path)),
            "--session-id",
            s.session_id,
        ]
        code, err = await run_to_exit(argv, tmp_path)
        assert code == 2
        assert f"session '{s.session_id}' is open in another scribe process" in err


# -- faults ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_error_once_fails_the_first_delivery_only(tmp_path: Path) -> None:
    async with seat(tmp_path) as s:
        text = "#error-once:t1 hello"
        assert await s.ask(text, "m1") == TurnOutcome("error", "", "injected fault error-once:t1")
        assert transcript_lines(tmp_path, s.session_id)[1:] == []
        assert await s.ask(text, "m1") == ok(f"ack: {text}")
    assert (store_of(tmp_path) / "faults" / "t1").is_file()
    assert [line["id"] for line in transcript_lines(tmp_path, s.session_id)[1:]] == ["m1", "m1"]


@pytest.mark.anyio
async def test_redelivery_of_an_answered_message_replays_it(tmp_path: Path) -> None:
    async with seat(tmp_path) as s:
        assert await s.ask(f"remember the phrase {PHRASE}", "m1") == ok(f"Noted: {PHRASE}.")
        replay = await s.ask(f"remember the phrase {PHRASE}", "m1")
        assert replay == TurnOutcome(
            "ok", f"Noted: {PHRASE}.", "duplicate delivery: replayed the recorded reply"
        )
    assert len(transcript_lines(tmp_path, s.session_id)) == 3


@pytest.mark.anyio
async def test_crash_directive_exits_3_and_the_turn_is_unknown(tmp_path: Path) -> None:
    async with seat(tmp_path) as s:
        assert await s.ask("#crash now", "m1") == TurnOutcome(
            "unknown", "", "harness exited mid-turn"
        )
        assert await s.exit_code() == 3
        assert TurnStarted("m1") in s.log.events
    assert transcript_lines(tmp_path, s.session_id)[1:] == []


@pytest.mark.anyio
async def test_sigint_aborts_the_turn_in_flight(tmp_path: Path) -> None:
    async with seat(tmp_path) as s:
        outcome: list[TurnOutcome] = []

        async def deliver() -> None:
            outcome.append(await s.ask("#slow:60000 think hard", "m1"))

        with anyio.fail_after(DEADLINE_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(deliver)
                await s.log.wait_for(lambda e: e == TurnStarted("m1"))
                s.process.send_signal(signal.SIGINT)
        assert outcome == [TurnOutcome("aborted", "", "interrupted by SIGINT")]
        assert await s.ask("hello", "m2") == ok("ack: hello")
    assert [line["id"] for line in transcript_lines(tmp_path, s.session_id)[1:]] == ["m2", "m2"]


# -- protocol robustness --------------------------------------------------------------------


@pytest.mark.anyio
async def test_malformed_and_oversize_lines_are_refused_not_fatal(tmp_path: Path) -> None:
    async with seat(tmp_path) as s:
        assert s.process.stdin is not None
        await s.process.stdin.send(b"not json\n")
        await s.process.stdin.send(b'{"type":"prompt","id":"m1","text":"x","extra":1}\n')
        await s.process.stdin.send(
            b'{"type":"prompt","id":"m2","text":"' + b"a" * (1024 * 1024) + b'"}\n'
        )
        assert await s.ask("still here", "m3") == ok("ack: still here")
    assert list(s.driver.protocol_errors) == [
        "harness refused a line: refused line: JSON is malformed: invalid character (byte 4)",
        "harness refused a line: refused line: Object contains unknown field `extra`",
        "harness refused a line: line exceeds the 1048576-byte cap",
    ]


# -- ending ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_sigterm_stops_a_plain_seat(tmp_path: Path) -> None:
    async with seat(tmp_path) as s:
        s.process.send_signal(signal.SIGTERM)
        assert await s.exit_code() == -signal.SIGTERM


@pytest.mark.anyio
async def test_ignore_sigterm_survives_sigterm_and_dies_on_sigkill(tmp_path: Path) -> None:
    async with seat(tmp_path, config={"ignore_sigterm": True}) as s:
        s.process.send_signal(signal.SIGTERM)
        # A round trip after the signal proves the process outlived it.
        with anyio.fail_after(DEADLINE_S):
            assert await s.driver.get_state() == s.session_id
        assert s.process.returncode is None
        s.process.kill()
        assert await s.exit_code() == -signal.SIGKILL
