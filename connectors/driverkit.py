"""What every stdio driver needs, whatever the harness's wire: framing stdout into capped lines,
writing lines to stdin without tearing them, routing replies to the request that waits for them
by id, knowing whether the reader runs (and why it stopped), and the session pointer written on
a harness's behalf.

`JsonStdioDriver` assembles these for a long-lived harness that speaks JSON lines and does not
write its own pointer (pi, Claude Code): the reader, the initial prompt delivered as turn 0,
serialized turns, the pointer guard and the deliberate quit. A connector module keeps its
protocol: what a line means, how a turn is sent and how its end is judged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar

import anyio
from anyio.abc import TaskStatus

from connectors.base import (
    PROVIDER_UNAVAILABLE,
    ByteReceive,
    ByteSend,
    TurnOutcome,
    framed_prompt,
)
from connectors.privatefs import write_pointer
from protocol.errors import Refusal
from protocol.refusals import Code

T = TypeVar("T")
# A harness that stops reading its stdin must not wedge a sender forever.
SEND_TIMEOUT_S = 10.0
INITIAL_PROMPT_ID = "initial-prompt"
# What a cut says of a seat it stopped in the middle of that prompt's turn.
LAUNCH_PROMPT_LOST = (
    "in its launch prompt, which is not in its inbox and so is not redelivered after the "
    "resume: send it again"
)
# What a failed write to a harness's stdin raises: the pipe is gone or we closed it.
STDIN_GONE: tuple[type[BaseException], ...] = (
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    OSError,
)
_STDOUT_GONE = (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError)


def json_line(obj: dict[str, Any]) -> bytes:
    """One JSON object as a line without its newline. ensure_ascii keeps U+2028/U+2029 escaped,
    so no line-splitting reader can misframe it."""
    return json.dumps(obj, ensure_ascii=True).encode()


# How the harnesses word a provider that could not serve a turn: the HTTP status leading the
# error (pi `503 ...`, Claude Code `API Error: 529 ...`, Codex's `... status 429 ...`), or the
# transport's own words for an endpoint that never answered. 500 is not among them: an internal
# error can be the request's own doing, so it counts against the message as any failure does.
_UNAVAILABLE_STATUS = re.compile(
    r"^(?:API Error:\s*)?(?:408|429|502|503|504|529)\b"
    r"|\bstatus(?: code)?:? (?:408|429|502|503|504|529)\b",
    re.IGNORECASE,
)
_UNREACHABLE = re.compile(
    r"\bconnection error\b|\bECONNREFUSED\b|\bECONNRESET\b|\bETIMEDOUT\b|\bENOTFOUND\b|"
    r"\bEAI_AGAIN\b|\bfetch failed\b|\bconnection refused\b|\boverloaded_error\b|"
    r"\brate_limit_error\b|\btoo many requests\b",
    re.IGNORECASE,
)


def provider_unavailable(detail: str) -> bool:
    """Whether a failed turn's error text says the model provider did not serve it (down,
    unreachable, rate limited, overloaded), rather than the turn failing by itself."""
    text = detail.strip()
    return bool(_UNAVAILABLE_STATUS.search(text) or _UNREACHABLE.search(text))


def unavailable_outcome(outcome: TurnOutcome) -> TurnOutcome:
    """An `error` end the provider caused, reported as `provider-unavailable` (the connector
    contract's kind for it, `connectors.base.TurnOutcome`); every other outcome as it is."""
    if outcome.status == "error" and provider_unavailable(outcome.detail):
        return TurnOutcome(PROVIDER_UNAVAILABLE, outcome.reply, outcome.detail, outcome.usage)
    return outcome


class HarnessGone(Refusal):
    """The driver can no longer talk to the harness: its stdout ended or the reader stopped."""


# -- reading ---------------------------------------------------------------------------------------


class Oversize:
    pass


OVERSIZE = Oversize()


class LineSplitter:
    """Sans-I/O line framing with a per-line cap: feed bytes, take complete lines out.

    A line over the cap comes out as `OVERSIZE` and the rest of it is dropped as it arrives, so
    memory stays bounded and the stream stays usable.
    """

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._buf = bytearray()
        self._scanned = 0
        self._discarding = False

    def feed(self, data: bytes) -> list[bytes | Oversize]:
        out: list[bytes | Oversize] = []
        self._buf += data
        while (newline := self._buf.find(b"\n", self._scanned)) >= 0:
            line = bytes(self._buf[:newline])
            del self._buf[: newline + 1]
            self._scanned = 0
            if self._discarding:
                self._discarding = False
            elif len(line) > self._cap:
                out.append(OVERSIZE)
            else:
                out.append(line)
        self._scanned = len(self._buf)
        if len(self._buf) > self._cap:
            # Keep memory bounded: the rest of this line is dropped as it arrives.
            if not self._discarding:
                out.append(OVERSIZE)
                self._discarding = True
            self._buf.clear()
            self._scanned = 0
        return out

    def finish(self) -> list[bytes | Oversize]:
        """The unterminated tail at end of stream, if any, as a last line."""
        tail, discarding = bytes(self._buf), self._discarding
        self._buf.clear()
        self._scanned, self._discarding = 0, False
        return [tail] if tail and not discarding else []


async def pump_lines(
    stdout: ByteReceive, on_line: Callable[[bytes], Awaitable[None]], *, cap: int, who: str
) -> str:
    """Hand each LF-terminated line of `stdout` (a trailing CR removed) to `on_line` until stdout
    ends or an unterminated line outgrows `cap`, which ends the pump rather than buffering
    without bound. Returns why it stopped, worded for the harness `who`."""
    buf = bytearray()
    while True:
        try:
            chunk = await stdout.receive()
        except _STDOUT_GONE:
            return f"{who} exited (its stdout closed)"
        buf += chunk
        while (nl := buf.find(b"\n")) >= 0:
            line = bytes(buf[:nl])
            del buf[: nl + 1]
            await on_line(line.rstrip(b"\r"))
        if len(buf) > cap:
            return f"{who} wrote a line over the {cap}-byte cap"


class ReaderState:
    """Whether a driver's reader has not started, runs, or has stopped, and the first reason it
    stopped; that reason is what every later refusal and `unknown` turn reports."""

    def __init__(self) -> None:
        self.phase: Literal["idle", "running", "stopped"] = "idle"
        self.detail = "the driver's reader was never started"

    @property
    def running(self) -> bool:
        return self.phase == "running"

    def start(self, what: str) -> None:
        if self.phase != "idle":
            raise RuntimeError(f"{what} may be started only once")
        self.phase = "running"

    def stop(self, detail: str) -> None:
        if self.phase != "stopped":
            self.phase = "stopped"
            self.detail = detail


# -- requests and replies --------------------------------------------------------------------------


class Waiter(Generic[T]):
    """One awaited reply; resolved once, with None when the harness went away instead."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.value: T | None = None

    def resolve(self, value: T | None) -> None:
        if not self.done.is_set():
            self.value = value
            self.done.set()


class Waiters(Generic[T]):
    """Requests in flight by id, so a reply wakes exactly its request and a late reply to an
    abandoned one is dropped, not mistaken for the next."""

    def __init__(self) -> None:
        self._by_id: dict[str, Waiter[T]] = {}
        self._seq = 0

    def next_id(self, kind: str) -> str:
        self._seq += 1
        return f"cotal-{kind}-{self._seq}"

    @contextmanager
    def expect(self, key: str) -> Iterator[Waiter[T]]:
        waiter: Waiter[T] = Waiter()
        self._by_id[key] = waiter
        try:
            yield waiter
        finally:
            if self._by_id.get(key) is waiter:
                del self._by_id[key]

    def resolve(self, key: str, value: T) -> bool:
        """Wake the request waiting on `key`; False when none is."""
        waiter = self._by_id.get(key)
        if waiter is None:
            return False
        waiter.resolve(value)
        return True

    def resolve_all(self, value: T | None) -> None:
        for waiter in list(self._by_id.values()):
            waiter.resolve(value)


class LineSender:
    """Writes whole lines to a harness's stdin, one at a time.

    A send is shielded so a caller's deadline cannot cut a line in half (which would corrupt
    every later line), and bounded so a harness that stopped reading cannot wedge us: past the
    bound stdin is closed. `gone` is what a failed write may raise; it reports False.
    """

    def __init__(
        self, stdin: ByteSend, *, gone: tuple[type[BaseException], ...] = STDIN_GONE
    ) -> None:
        self._stdin = stdin
        self._gone = gone
        self._lock = anyio.Lock()
        self.closed = False

    async def send(self, line: bytes) -> bool:
        """Write `line` and its newline; False when stdin is closed or the write failed."""
        if self.closed:
            return False
        async with self._lock:
            with anyio.CancelScope(shield=True) as scope:
                scope.deadline = anyio.current_time() + SEND_TIMEOUT_S
                try:
                    await self._stdin.send(line + b"\n")
                    return True
                except self._gone:
                    return False
            await self.aclose()
            return False

    async def aclose(self) -> None:
        """Close stdin (EOF); the harness exits and the reader ends when its stdout does."""
        if self.closed:
            return
        self.closed = True
        with anyio.CancelScope(shield=True):
            try:
                await self._stdin.aclose()
            except STDIN_GONE:
                pass


# -- the JSON-lines driver skeleton ----------------------------------------------------------------


class Turn:
    """A prompt in flight; `end` is resolved with the event that ended it, or None."""

    def __init__(self) -> None:
        self.end: Waiter[dict[str, Any]] = Waiter()


TurnT = TypeVar("TurnT", bound=Turn)


class LaunchPromptWatch:
    """`Driver.launch_prompt_running` and `launch_prompt_settled` for a driver that sends the
    launch's prompt itself: `_launch_prompt` says whether the launch had one, and `initial_done`
    is set once it has ended (or will never be sent)."""

    _launch_prompt: bool
    initial_done: anyio.Event

    def launch_prompt_running(self) -> bool:
        return self._launch_prompt and not self.initial_done.is_set()

    async def launch_prompt_settled(self) -> None:
        if self._launch_prompt:
            await self.initial_done.wait()


class JsonStdioDriver(LaunchPromptWatch, Generic[TurnT]):
    """The driver of a long-lived harness speaking JSON lines, whose pointer we write.

    It owns no task: the caller runs `run()` in the seat's task group, ideally with
    `await tg.start(driver.run)`. A subclass supplies `_handle` (one stdout line),
    `_learn_session` (run beside the reader before the launch's initial prompt goes out),
    `get_state` and `_turn_locked` (one turn, under the turn lock).
    """

    who: ClassVar[str]

    def __init__(
        self,
        stdin: ByteSend,
        stdout: ByteReceive,
        *,
        pointer_path: Path | None,
        expected_session_id: str | None,
        initial_prompt: str | None,
        line_cap: int,
    ) -> None:
        self._stdout = stdout
        self._out = LineSender(stdin)
        self._pointer_path = pointer_path
        self._expected = expected_session_id
        self._initial = initial_prompt
        self._launch_prompt = initial_prompt is not None
        self._line_cap = line_cap
        self._turn_lock = anyio.Lock()
        self._pending: Waiters[dict[str, Any]] = Waiters()
        self._turn: TurnT | None = None
        self._reader = ReaderState()
        self._written: tuple[str, str] | None = None
        # One pointer write at a time, each in a worker thread: a `running` write the reader
        # began must not land after the `quit` a deliberate stop wrote.
        self._pointer_lock = anyio.Lock()
        self.session_id: str | None = None
        self.state_known = anyio.Event()
        self.initial_outcome: TurnOutcome | None = None
        self.initial_done = anyio.Event()
        self.protocol_errors: list[str] = []

    # -- reader ---------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Pump the harness's stdout until it ends; meanwhile learn the session and deliver the
        launch's initial prompt. Start it once, in the caller's task group."""
        self._reader.start(f"{type(self).__name__}.run()")
        task_status.started()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._deliver_initial)
                self._stop(
                    await pump_lines(self._stdout, self._handle, cap=self._line_cap, who=self.who)
                )
                tg.cancel_scope.cancel()
        finally:
            self._stop("the driver's reader was cancelled")
            self.state_known.set()
            self.initial_done.set()

    def _stop(self, detail: str) -> None:
        self._reader.stop(detail)
        self._pending.resolve_all(None)
        if self._turn is not None:
            self._turn.end.resolve(None)

    async def _handle(self, line: bytes) -> None:
        raise NotImplementedError

    def _decode(self, line: bytes) -> dict[str, Any] | None:
        """The JSON object a line carries; None for a blank line, a non-object, or (noted) junk."""
        if not line.strip():
            return None
        try:
            event = json.loads(line)
        except ValueError:
            self._note(f"{self.who} wrote a line that is not JSON: {line[:120]!r}")
            return None
        return event if isinstance(event, dict) else None

    def _note(self, detail: str) -> None:
        self.protocol_errors = [*self.protocol_errors[-31:], detail]

    def _gone(self, action: str) -> HarnessGone:
        return HarnessGone(
            Code.HARNESS_GONE,
            f"{self.who} connector: cannot {action}: {self._reader.detail}",
            f"read the seat's log for why {self.who} exited, then restart the seat",
        )

    # -- commands -------------------------------------------------------------------------------

    async def _send(self, obj: dict[str, Any]) -> bool:
        return await self._out.send(json_line(obj))

    async def _request(
        self, kind: str, message: Callable[[str], dict[str, Any]]
    ) -> dict[str, Any] | None:
        """Send `message(request id)` and wait for the reply routed to that id; None when the
        harness is gone."""
        if not self._reader.running:
            return None
        request_id = self._pending.next_id(kind)
        with self._pending.expect(request_id) as waiter:
            if not await self._send(message(request_id)):
                return None
            await waiter.done.wait()
            return waiter.value

    async def get_state(self) -> str | None:
        raise NotImplementedError

    async def _write_pointer(
        self, status: Literal["running", "quit"], *, reopenable: Callable[[], bool] | None = None
    ) -> None:
        """Write the pointer for the session the harness reports, once it is the one this launch
        meant to open and (when `reopenable` is given) can be reopened."""
        sid, path = self.session_id, self._pointer_path
        if path is None or sid is None:
            return
        if self._expected is not None and sid != self._expected:
            # Never let the pointer name a session this launch did not mean to open: the
            # manager compares the reported id with the expected one and refuses the seat.
            self._note(
                f"{self.who} reports session {sid}, expected {self._expected}; pointer not written"
            )
            return
        async with self._pointer_lock:
            if self._written == (sid, status) or (
                status == "running" and self._written == (sid, "quit")
            ):
                return
            if reopenable is not None and not reopenable():
                return
            await anyio.to_thread.run_sync(write_pointer, path, sid, status)
            self._written = (sid, status)

    # -- turns ----------------------------------------------------------------------------------

    async def _learn_session(self) -> None:
        raise NotImplementedError

    async def _deliver_initial(self) -> None:
        await self._learn_session()
        async with self._turn_lock:
            await self._initial_locked()
        self.initial_done.set()

    async def prompt(self, text: str, *, message_id: str, delivery: int = 1) -> TurnOutcome:
        """Deliver `text` as one turn and wait for its terminal boundary; a redelivery reaches
        the model opening with the notice that says so (`framed_prompt`).

        Never raises for a dead harness: a turn whose end was not seen is `unknown`, which the
        caller must not acknowledge. Bound the wait with a cancel scope around the call.
        """
        async with self._turn_lock:
            await self._initial_locked()
            return await self._turn_locked(framed_prompt(text, delivery), message_id)

    def _initial_ready(self) -> bool:
        return True

    async def _initial_locked(self) -> None:
        # Whoever takes the turn lock first sends the launch's prompt, so it always precedes
        # any inbox message even when one is delivered the instant the seat is ready.
        if self._initial is None or not self._initial_ready():
            return
        text, self._initial = self._initial, None
        self.initial_outcome = await self._turn_locked(text, INITIAL_PROMPT_ID)

    async def _turn_locked(self, text: str, message_id: str) -> TurnOutcome:
        raise NotImplementedError

    # -- shutdown -------------------------------------------------------------------------------

    async def quit(self) -> None:
        """A deliberate quit: record `status: quit` in the pointer, then close the harness's
        stdin (it exits 0 at EOF). A crash never passes here, so its pointer stays `running` and
        the manager may continue the session."""
        if self.session_id is None and self._reader.running:
            try:
                await self.get_state()
            except Refusal:
                pass
        await self._write_pointer("quit")
        await self.aclose()

    async def aclose(self) -> None:
        """Close the harness's stdin; it exits and the reader ends when its stdout does."""
        await self._out.aclose()
