"""scribe's pure parts: answering, fault directives, wire strictness, launch specs, the driver."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import anyio
import msgspec
import pytest

from connectors.base import LaunchOpts, StoreDecl, TurnOutcome
from connectors.jsonl_driver import (
    OVERSIZE,
    DriverError,
    HarnessEvent,
    JsonLinesDriver,
    LineSplitter,
    Ready,
    Rejected,
    StateReported,
    TurnDelta,
    TurnEnded,
    TurnStarted,
)
from connectors.scribe.connector import ScribeCodec, ScribeConnector, ScribeDriver
from connectors.scribe.harness import (
    Directives,
    MeshOut,
    Message,
    PromptIn,
    ProtocolErrorOut,
    StoreError,
    answer,
    chunks,
    decode_inbound,
    parse_directives,
    parse_transcript,
    probe_id,
    read_lines,
)
from protocol.errors import DecodeError


def user(text: str, mid: str = "m") -> Message:
    return Message(role="user", text=text, id=mid, at="2025-01-01T00:00:00.000Z")


def assistant(text: str, mid: str = "m") -> Message:
    return Message(role="assistant", text=text, id=mid, at="2025-01-01T00:00:00.000Z")


# -- answering ------------------------------------------------------------------------------


def test_remember_is_noted_with_the_phrase_as_written() -> None:
    assert answer("Please REMEMBER the phrase Blue-Heron-9 now", []) == "Noted: Blue-Heron-9."


def test_question_answered_from_history() -> None:
    history = [user("remember the phrase amber-1"), assistant("Noted: amber-1.")]
    assert answer("So, what was the phrase?", history) == "The phrase is amber-1."


def test_question_uses_the_most_recent_phrase() -> None:
    history = [user("remember the phrase old-1"), user("remember the phrase new-2")]
    assert answer("WHAT WAS THE PHRASE", history) == "The phrase is new-2."


def test_question_without_phrase_in_history() -> None:
    history = [user("hello"), assistant("ack: hello")]
    assert answer("what was the phrase?", history) == "I do not know the phrase."


def test_assistant_lines_never_teach_a_phrase() -> None:
    history = [assistant("remember the phrase planted-1")]
    assert answer("what was the phrase", history) == "I do not know the phrase."


def test_anything_else_is_acked_with_200_chars() -> None:
    text = "x" * 250
    assert answer(text, []) == "ack: " + "x" * 200
    assert answer("hello", []) == "ack: hello"


def test_chunks_rebuild_the_reply() -> None:
    assert chunks("The phrase is a-1.") == ["The ", "phrase ", "is ", "a-1."]
    assert "".join(chunks("  two  spaces ")) == "  two  spaces "


# -- fault directives -----------------------------------------------------------------------


def test_directives_parsed() -> None:
    assert parse_directives("#error-once:tag_1 hi") == Directives(error_once="tag_1")
    assert parse_directives("boom #crash") == Directives(crash=True)
    assert parse_directives("#slow:250 x") == Directives(slow_ms=250)
    assert parse_directives("#slow:99999999 #crash") == Directives(crash=True, slow_ms=600_000)


def test_directive_lookalikes_are_plain_text() -> None:
    assert parse_directives("#crashing #slow:abc #error-once:") == Directives()
    assert parse_directives("#error-once:../etc") == Directives()


# -- wire strictness ------------------------------------------------------------------------


def test_inbound_refuses_unknown_field() -> None:
    with pytest.raises(msgspec.ValidationError, match="unknown field `extra`"):
        decode_inbound(b'{"type":"prompt","id":"m1","text":"hi","extra":1}')


def test_inbound_refuses_unknown_type_and_empty_id() -> None:
    with pytest.raises(msgspec.ValidationError):
        decode_inbound(b'{"type":"shout","id":"m1"}')
    with pytest.raises(msgspec.ValidationError):
        decode_inbound(b'{"type":"prompt","id":"","text":"hi"}')


def test_inbound_decodes_prompt() -> None:
    assert decode_inbound(b'{"type":"prompt","id":"m1","text":"hi"}') == PromptIn(
        id="m1", text="hi"
    )


def test_protocol_error_names_the_refused_id_only_when_known() -> None:
    assert probe_id(b'{"type":"prompt","id":"m9","bogus":true}') == "m9"
    assert probe_id(b"not json") is None
    assert (
        msgspec.json.encode(ProtocolErrorOut(detail="d"))
        == b'{"type":"protocol_error","detail":"d"}'
    )


def test_codec_refuses_unknown_event_field() -> None:
    with pytest.raises(DecodeError, match="unknown field `extra`"):
        ScribeCodec().decode(b'{"type":"ready","sessionId":"s","extra":1}')


def test_codec_maps_events() -> None:
    codec = ScribeCodec()
    assert codec.decode(b'{"type":"ready","sessionId":"s1"}') == Ready("s1")
    assert codec.decode(b'{"type":"turn_start","id":"m"}') == TurnStarted("m")
    assert codec.decode(b'{"type":"delta","id":"m","text":"t"}') == TurnDelta("m", "t")
    assert codec.decode(
        b'{"type":"turn_end","id":"m","status":"error","reply":"","detail":"d"}'
    ) == TurnEnded("m", TurnOutcome("error", "", "d"))
    assert codec.decode(b'{"type":"state","id":"q","sessionId":"s1"}') == StateReported("q", "s1")
    assert codec.decode(b'{"type":"protocol_error","detail":"d"}') == Rejected(None, "d")
    assert codec.encode_prompt("hi", "m1") == b'{"id":"m1","text":"hi","type":"prompt"}'


# -- transcript and line reading ------------------------------------------------------------


HEADER = b'{"type":"session","id":"s1","parent":null,"createdAt":"t"}\n'
LINE = b'{"role":"user","text":"remember the phrase p-1","id":"m","at":"t"}\n'


def test_transcript_ignores_a_torn_tail() -> None:
    transcript = parse_transcript(
        HEADER + LINE + b'{"role":"assis', session_id="s1", where=Path("x")
    )
    assert transcript.messages == [
        Message(role="user", text="remember the phrase p-1", id="m", at="t")
    ]
    assert transcript.intact == len(HEADER + LINE)


def test_transcript_refuses_a_foreign_header_and_garbage() -> None:
    with pytest.raises(StoreError, match="names session 's1', not 's2'"):
        parse_transcript(HEADER, session_id="s2", where=Path("x"))
    with pytest.raises(StoreError, match="malformed"):
        parse_transcript(
            HEADER + b'{"role":"user","text":"x","id":"m","at":"t","k":1}\n',
            session_id="s1",
            where=Path("x"),
        )


def test_read_lines_skips_oversize_and_keeps_going() -> None:
    data = b"short\n" + b"y" * 20 + b"\nnext\nend"
    assert list(read_lines(io.BytesIO(data), 8)) == [b"short", None, b"next", b"end"]


def test_read_lines_accepts_a_line_exactly_at_the_cap() -> None:
    assert list(read_lines(io.BytesIO(b"12345678\n"), 8)) == [b"12345678"]


def test_splitter_frames_and_caps() -> None:
    splitter = LineSplitter(cap=8)
    assert splitter.feed(b"ab") == []
    assert splitter.feed(b"c\nde") == [b"abc"]
    assert splitter.feed(b"f" * 10) == [OVERSIZE]
    assert splitter.feed(b"ggg\nok\n") == [b"ok"]
    assert splitter.feed(b"123456789\n") == [OVERSIZE]
    assert splitter.feed(b"tail") == []
    assert splitter.finish() == [b"tail"]


# -- the connector --------------------------------------------------------------------------


def opts(root: Path, **kw: object) -> LaunchOpts:
    base: dict[str, object] = dict(
        space="s",
        name="alpha",
        lifecycle_uid="u1",
        workspace_root=root,
        cwd=root / "work",
        session_pointer_path=root / ".cotal/sessions/scribe/alpha-u1.json",
    )
    base.update(kw)
    return LaunchOpts(**base)  # type: ignore[arg-type]


def test_launch_fresh(tmp_path: Path) -> None:
    spec = ScribeConnector().build_launch(opts(tmp_path))
    store = tmp_path / ".cotal/sessions/scribe/alpha-u1.store"
    assert spec.argv == [
        sys.executable,
        "-I",
        "-m",
        "connectors.scribe",
        "--store",
        str(store),
        "--pointer",
        str(tmp_path / ".cotal/sessions/scribe/alpha-u1.json"),
    ]
    assert spec.session_store == (
        StoreDecl("workspace-root", ".cotal/sessions/scribe/alpha-u1.store"),
    )
    assert spec.expected_session_id is None
    assert spec.cwd == tmp_path / "work"
    assert not any(k.startswith("PYTHON") for k in spec.env)
    assert spec.env["COTAL_NAME"] == "alpha"


def test_launch_continue_fork_prompt_and_sigterm(tmp_path: Path) -> None:
    connector = ScribeConnector()
    cont = connector.build_launch(
        opts(tmp_path, continue_session="sid-1", prompt="go on", config={"ignore_sigterm": True})
    )
    assert cont.argv[-5:] == ["--session-id", "sid-1", "--prompt", "go on", "--ignore-sigterm"]
    assert cont.expected_session_id == "sid-1"
    fork = connector.build_launch(opts(tmp_path, resume="sid-0"))
    assert fork.argv[-2:] == ["--fork", "sid-0"]
    assert fork.expected_session_id is None


def test_launch_configured_store(tmp_path: Path) -> None:
    inside = ScribeConnector().build_launch(opts(tmp_path, config={"store": "stores/a"}))
    assert inside.argv[inside.argv.index("--store") + 1] == str(tmp_path / "stores/a")
    assert inside.session_store == (StoreDecl("workspace-root", "stores/a"),)
    outside = ScribeConnector().build_launch(
        opts(tmp_path / "root", config={"store": str(tmp_path / "x")})
    )
    assert outside.session_store == ()


# -- the driver over in-memory streams ------------------------------------------------------


class FakeStdin:
    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.closed = False
        self._sent = anyio.Event()

    async def send(self, item: bytes) -> None:
        if self.closed:
            raise anyio.ClosedResourceError
        self.lines.append(item)
        self._sent.set()
        self._sent = anyio.Event()

    async def aclose(self) -> None:
        self.closed = True

    async def wait_lines(self, count: int) -> None:
        while len(self.lines) < count:
            await self._sent.wait()


class FakeStdout:
    def __init__(self) -> None:
        self.writer, self._reader = anyio.create_memory_object_stream[bytes](16)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self._reader.receive()


@pytest.mark.anyio
async def test_driver_routes_by_id_and_survives_garbage() -> None:
    stdin, stdout = FakeStdin(), FakeStdout()
    driver = JsonLinesDriver(stdin, stdout, ScribeCodec(), line_cap=128)
    outcome: list[TurnOutcome] = []

    async def deliver() -> None:
        outcome.append(await driver.prompt("hi", message_id="m1"))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(driver.run)
            await stdout.writer.send(b'{"type":"ready","sessionId":"s1"}\n')
            assert await driver.wait_ready(5) == "s1"
            tg.start_soon(deliver)
            await stdin.wait_lines(1)
            assert stdin.lines[0] == b'{"id":"m1","text":"hi","type":"prompt"}\n'
            await stdout.writer.send(b"junk\n" + b"z" * 300 + b"\n")
            await stdout.writer.send(
                b'{"type":"turn_end","id":"stale","status":"ok","reply":"no","detail":""}\n'
            )
            await stdout.writer.send(
                b'{"type":"turn_end","id":"m1","status":"ok","reply":"yes","detail":""}\n'
            )
            await stdout.writer.aclose()
    assert outcome == [TurnOutcome("ok", "yes", "")]
    assert len(driver.protocol_errors) == 2
    assert driver.protocol_errors[1] == "harness line exceeds the 128-byte cap"
    assert not driver.running


@pytest.mark.anyio
async def test_driver_eof_mid_turn_is_unknown_and_state_fails_cleanly() -> None:
    stdin, stdout = FakeStdin(), FakeStdout()
    driver = JsonLinesDriver(stdin, stdout, ScribeCodec())
    outcome: list[TurnOutcome] = []

    async def deliver() -> None:
        outcome.append(await driver.prompt("hi", message_id="m1"))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(driver.run)
            tg.start_soon(deliver)
            await stdin.wait_lines(1)
            await stdout.writer.send(b'{"type":"turn_start","id":"m1"}\n')
            await stdout.writer.aclose()
    assert outcome == [TurnOutcome("unknown", "", "harness exited mid-turn")]
    assert await driver.prompt("again", message_id="m2") == TurnOutcome(
        "unknown", "", "not delivered: harness exited mid-turn"
    )
    with pytest.raises(DriverError) as stopped:
        await driver.get_state()
    assert stopped.value.code == "harness-gone"
    with pytest.raises(DriverError, match="never reported ready"):
        await driver.wait_ready(1)


@pytest.mark.anyio
async def test_driver_refused_prompt_is_an_error_turn() -> None:
    stdin, stdout = FakeStdin(), FakeStdout()
    driver = JsonLinesDriver(stdin, stdout, ScribeCodec())
    outcome: list[TurnOutcome] = []

    async def deliver() -> None:
        outcome.append(await driver.prompt("hi", message_id="m1"))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(driver.run)
            tg.start_soon(deliver)
            await stdin.wait_lines(1)
            await stdout.writer.send(b'{"type":"protocol_error","detail":"bad","id":"m1"}\n')
            await stdout.writer.aclose()
    assert outcome == [TurnOutcome("error", "", "harness refused the prompt: bad")]


@pytest.mark.anyio
async def test_driver_without_reader_does_not_hang() -> None:
    driver = JsonLinesDriver(FakeStdin(), FakeStdout(), ScribeCodec())
    with anyio.fail_after(5):
        assert await driver.prompt("hi", message_id="m1") == TurnOutcome(
            "unknown", "", "not delivered: the driver's reader was never started"
        )
    with pytest.raises(DriverError):
        await driver.get_state()


MESH_LINE = b'{"type":"mesh","id":"m1-0","call":{"op":"seats"}}\n'


def test_the_codec_hands_a_mesh_call_over_as_a_harness_event() -> None:
    event = ScribeCodec().decode(MESH_LINE.strip())
    assert isinstance(event, HarnessEvent) and isinstance(event.value, MeshOut)
    assert (event.value.id, bytes(event.value.call)) == ("m1-0", b'{"op":"seats"}')


@pytest.mark.anyio
async def test_a_driver_without_the_hook_says_it_does_not_take_the_event() -> None:
    stdin, stdout = FakeStdin(), FakeStdout()
    driver = JsonLinesDriver(stdin, stdout, ScribeCodec())
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(driver.run)
            await stdout.writer.send(MESH_LINE)
            await stdout.writer.aclose()
    assert list(driver.protocol_errors) == ["the harness sent a MeshOut this driver does not take"]
    assert stdin.lines == []


class Hooked(JsonLinesDriver):
    """A driver that takes non-turn events through the public hook and answers each."""

    def __init__(self, stdin: FakeStdin, stdout: FakeStdout) -> None:
        super().__init__(stdin, stdout, ScribeCodec())
        self.seen: list[object] = []
        self.answer, self._answers = anyio.create_memory_object_stream[bytes](4)

    def on_harness_event(self, value: object) -> None:
        self.seen.append(value)
        self.answer.send_nowait(b'{"answered":true}')

    async def answer_all(self) -> None:
        async for line in self._answers:
            assert await self.send_line(line)


@pytest.mark.anyio
async def test_the_hook_gets_non_turn_events_in_line_order_beside_a_turn() -> None:
    stdin, stdout = FakeStdin(), FakeStdout()
    driver = Hooked(stdin, stdout)
    outcome: list[TurnOutcome] = []

    async def deliver() -> None:
        outcome.append(await driver.prompt("hi", message_id="m1"))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(driver.run)
            tg.start_soon(driver.answer_all)
            tg.start_soon(deliver)
            await stdin.wait_lines(1)
            await stdout.writer.send(MESH_LINE)
            await stdout.writer.send(MESH_LINE.replace(b"m1-0", b"m1-1"))
            await stdin.wait_lines(3)
            await stdout.writer.send(
                b'{"type":"turn_end","id":"m1","status":"ok","reply":"yes","detail":""}\n'
            )
            await stdout.writer.aclose()
            driver.answer.close()
    assert [v.id for v in driver.seen if isinstance(v, MeshOut)] == ["m1-0", "m1-1"]
    assert stdin.lines[1:] == [b'{"answered":true}\n'] * 2
    assert outcome == [TurnOutcome("ok", "yes", "")]
    assert list(driver.protocol_errors) == []


@pytest.mark.anyio
async def test_scribe_driver_hands_each_mesh_call_to_its_port_and_answers_it() -> None:
    stdin, stdout = FakeStdin(), FakeStdout()
    driver = ScribeDriver(stdin, stdout, ScribeCodec())
    calls: list[bytes] = []

    async def port(call: bytes) -> bytes:
        calls.append(call)
        return b'{"status":"listed","seats":["b"]}'

    driver.mesh_port = port
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(driver.run)
            await stdout.writer.send(MESH_LINE)
            await stdin.wait_lines(1)
            await stdout.writer.aclose()
    assert calls == [b'{"op":"seats"}']
    assert stdin.lines == [
        b'{"id":"m1-0","result":{"status":"listed","seats":["b"]},"type":"mesh_result"}\n'
    ]
    assert list(driver.protocol_errors) == []
