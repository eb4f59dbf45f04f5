"""What the console reads and what it does, each through the code the CLI's verbs run.

Reads: the roster and this root's seats from the root's running manager over one control
session held open (`fleet` and `ps`, the ops `cotal ps --fleet` and `cotal ps` ask), and the
lifecycle events of every manager from the broker (`cotal events --fleet`'s reader: the one
thing a manager has no op for, since it is a stream); a seat's log and transcript tail as
`cotal logs SEAT` and `--transcript` read them from this root's files.

Does: `stop`, `start`, `restart` and `send` as one request each on a session of its own
(`manager.control.oneshot.request`, what `cotal stop` and the others call); `move` and `drain`
through their coordinators (`manager.coord.move.move`, `manager.coord.drain.drain`), with
their progress lines handed to the console rather than to a stderr it draws over. Each
returns one line for people; a refusal is raised as the CLI would print it.
"""

from __future__ import annotations

import contextlib
import io
import math
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import msgspec

from manager.control.client import ControlSession
from manager.workspace.layout import Layout
from protocol import control
from protocol.control import InboxDepth, SeatRow
from protocol.errors import DecodeError, Refusal
from protocol.events import Event, decode_event
from protocol.fleet import FleetRow
from protocol.refusals import Code

# How far back the event stream is replayed when the console starts: the turns in flight,
# dead letters and budgets of other managers' seats the console can know of.
REPLAY = timedelta(hours=1)
# Lines of a seat's log and transcript shown.
TAIL_LINES = 200
READ_TIMEOUT_S = 10.0


@dataclass
class Read:
    """One read: the roster, this root's seats, and its seats' inbox depths (the last ones
    asked: see `Reader`)."""

    fleet: list[FleetRow]
    local: list[SeatRow]
    depths: list[InboxDepth] = field(default_factory=list)


class Reader:
    """The roster and this root's seats, over one control session kept open between reads (a
    read is two requests on it, not a connection each); and the inbox depths, asked at most
    every `depth_every` seconds, since they cost the manager a broker request per seat while
    the roster and the table are read from memory and one bucket listing."""

    def __init__(self, root: Path, depth_every: float = 2.0) -> None:
        self.layout = Layout.at(root)
        self.depth_every = depth_every
        self._session: ControlSession | None = None
        self._depths: list[InboxDepth] = []
        self._depths_at = -math.inf
        # A manager older than the op refuses it (`unknown-op`): not asked again.
        self._depths_known = True

    async def read(self) -> Read:
        from manager.control.oneshot import control as session_of

        if self._session is None:
            self._session = session_of(self.layout)
        try:
            fleet = await self._session.request(
                control.FLEET, control.NoArgs(), timeout=READ_TIMEOUT_S
            )
            local = await self._session.request(
                control.PS, control.NoArgs(), timeout=READ_TIMEOUT_S
            )
            if self._depths_known and time.monotonic() - self._depths_at >= self.depth_every:
                self._depths = await self._inboxes(self._session)
                self._depths_at = time.monotonic()
        except BaseException:
            # A manager that went away (or a request cut short) leaves the connection unusable;
            # the next read opens a new one.
            await self.aclose()
            raise
        rows = msgspec.json.decode(fleet.rows, type=list[FleetRow])
        return Read(rows, local, self._depths)

    async def _inboxes(self, session: ControlSession) -> list[InboxDepth]:
        try:
            return await session.request(
                control.INBOX_DEPTHS, control.NoArgs(), timeout=READ_TIMEOUT_S
            )
        except Refusal as exc:
            if exc.code != Code.UNKNOWN_OP:
                raise
            self._depths_known = False
            return []

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.aclose()


def down_reason(exc: BaseException) -> str:
    """What the status line says of a manager that did not answer."""
    if isinstance(exc, Refusal):
        return f"{exc.code}: {exc.message}"
    if isinstance(exc, TimeoutError):
        return f"no answer in {READ_TIMEOUT_S:.0f} s"
    return f"{type(exc).__name__}: {exc}"


def broker_of(root: Path) -> tuple[str | None, str]:
    """The broker this root's mesh record names, as `cotal events` finds it, or None and why
    there is none to follow (no mesh up, its embedded broker not running)."""
    from manager.cli.fleet import _broker_of

    try:
        return _broker_of(Layout.at(root)).server, ""
    except Refusal as exc:
        return None, exc.message


async def events(root: Path, *, replay: bool) -> AsyncGenerator[Event, None]:
    """Every manager's lifecycle events on this root's broker, as `cotal events --fleet`
    follows them; `replay` first replays the last hour the broker kept. An event that does not
    decode is skipped, as `cotal events` skips it."""
    from manager.cli.events import _events

    since = datetime.now(UTC) - REPLAY if replay else None
    # Closed as soon as the caller stops (a cancel when the broker moved), so the connection
    # goes with it rather than with the garbage collector.
    source = _events(Layout.at(root), fleet=True, since=since, until=None)
    async with contextlib.aclosing(cast(AsyncGenerator[bytes, None], source)) as stream:
        async for data in stream:
            try:
                yield decode_event(data)
            except DecodeError:
                continue


# -- the verbs -----------------------------------------------------------------------------------


async def stop(root: Path, name: str) -> str:
    from manager.control.oneshot import request

    out = await request(root, control.STOP_SEAT, control.StopSeatArgs(name=name))
    if out.already_stopped:
        return f"{out.name} was already stopped (last exit {out.last_exit})"
    return f"stopped {out.name} (exit {out.last_exit}); inbox, session and custody kept"


async def start(root: Path, name: str) -> str:
    from manager.control.oneshot import request

    out = await request(root, control.START_SEAT, control.StartSeatArgs(name=name), 90.0)
    if out.already_running:
        return f"{out.name} is already running (pid {out.pid})"
    return f"started {out.name} pid {out.pid} restarts {out.restarts}"


async def restart(root: Path, name: str) -> str:
    from manager.control.oneshot import request

    out = await request(root, control.RESTART_SEAT, control.RestartSeatArgs(name=name), 120.0)
    return f"restarted {out.name} pid {out.pid} restarts {out.restarts}"


async def send(root: Path, name: str, text: str) -> str:
    from manager.control.oneshot import request

    # `cotal send` takes any text; an empty one is refused here only because the console's
    # field starts empty, and a turn on nothing is a slip, not a message.
    if not text.strip():
        raise Refusal(Code.BAD_ARGS, "the message is empty", "type the text to send")
    args = control.SendArgs(name=name, text=text, wait=False, timeout_s=120.0)
    out = await request(root, control.SEND, args, 60.0)
    return f"queued {out.id} for {out.seat} (stream seq {out.seq})"


async def move(root: Path, name: str, to: str, say: Callable[[str], None]) -> str:
    from manager.coord import move as coordinator
    from manager.coord import report
    from manager.coord.requests import MoveRequest

    req = MoveRequest(names=(name,), to=to, drain_timeout=120.0)
    with report.reporting(say):
        out = await coordinator.move(req, root)
    names = ", ".join(seat.name for seat in out.seats) or "nothing"
    return f"moved {names} to {out.to}: downtime {out.downtime_ms} ms"


async def drain(
    root: Path,
    to: str | None,
    say: Callable[[str], None],
    refused: Callable[[str, str], None],
) -> str:
    """`cotal drain --to INSTANCE`, or `--fleet` when `to` is None; each seat the destination
    refused is told to `refused` (seat, why) for the rail."""
    from manager.coord import drain as coordinator
    from manager.coord import report

    req = coordinator.DrainRequest(to=to, fleet=to is None)
    with report.reporting(say):
        out = await coordinator.drain(req, root)
    for seat in out.refused:
        refused(seat.name, f"{seat.name} stays here: {seat.code}: {seat.message}; {seat.cure}")
    left = f"; cancelled: {', '.join(out.left)} stay" if out.left else ""
    return f"drain: {len(out.moved)} moved in {out.waves} wave(s), {len(out.refused)} refused{left}"


# -- a seat's log and transcript -------------------------------------------------------------------


def log_tail(root: Path, name: str, lines: int = TAIL_LINES) -> str:
    """The end of what `cotal logs SEAT` prints: the seat's events in the manager's log, then
    its harness's stderr. Blocking (it reads files): run it in a worker thread."""
    from manager.cli import logs

    out = io.StringIO()
    try:
        logs.run(
            root, seat=name, follow=False, since=None, as_json=False, transcript=False, out=out
        )
    except Refusal as exc:
        return exc.text
    return _tail(out.getvalue(), lines)


def transcript_tail(root: Path, name: str, lines: int = TAIL_LINES) -> str:
    """The end of what `cotal logs SEAT --transcript` prints. Blocking, as `log_tail`."""
    from manager.cli import logs

    out = io.StringIO()
    try:
        logs.print_transcript(Layout.at(root), name, as_json=False, out=out)
    except Refusal as exc:
        return exc.text
    return _tail(out.getvalue(), lines)


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])
