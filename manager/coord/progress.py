"""A cut in flight, for people: the daemon's progress records, polled over the control socket.

The coordinator asks the daemon (op `progress`) rather than reading its log, so no log event name
is an interface. What is shown: one line per phase; a seat's capture steps only once that
capture has run longer than a second (then the steps it already went through as well, so the
sequence reads whole); and every failure. A daemon that predates the op answers with a refusal
and the cut simply shows no progress.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio

from manager.control.client import ControlClient, ControlError, ControlSession
from protocol import control
from protocol.control import ProgressRecord
from protocol.errors import Refusal
from protocol.refusals import Code

T = TypeVar("T")

POLL_S = 0.25
# How long a poll still in flight when the commit returns is given to answer.
FOLLOW_GRACE_S = 5.0
SLOW_CAPTURE_S = 1.0
# A capture step that has written this much is a large repository: its byte counts are shown
# however quickly the machine gets through them.
LARGE_STEP_BYTES = 8 * 1024 * 1024
# How often a step that is still running repeats its line with the bytes written so far.
REPEAT_S = 1.0
# A daemon without the op: the refusal its dispatcher or its argument decoder gives.
_NO_PROGRESS_OP = frozenset({Code.UNSUPPORTED_OP, Code.UNKNOWN_OP})


@dataclass
class _Capture:
    began: float
    shown: bool = False
    done: bool = False
    step: str | None = None
    last_line: float = 0.0
    pending: list[str] = field(default_factory=list)


class ProgressView:
    """Turns progress records into lines for people; `after` is the last sequence seen."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.after = 0
        self._phases: set[str] = set()
        self._captures: dict[str, _Capture] = {}

    def take(self, records: list[ProgressRecord], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for record in sorted(records, key=lambda r: r.seq):
            if record.seq <= self.after:
                continue
            self.after = record.seq
            self._one(record, now)

    def tick(self, now: float | None = None) -> None:
        """A seat whose capture passed a second shows its steps, even between records."""
        now = time.monotonic() if now is None else now
        for capture in self._captures.values():
            if not capture.shown and not capture.done and now - capture.began >= SLOW_CAPTURE_S:
                capture.shown = True
                for line in capture.pending:
                    self.say(line)
                capture.pending.clear()
                capture.last_line = now

    def _one(self, record: ProgressRecord, now: float) -> None:
        if record.phase == "failed":
            who = f"seat {record.seat}" if record.seat else "the attempt"
            self.say(f"  failed: {who}{': ' + record.detail if record.detail else ''}")
            if record.seat in self._captures:
                self._captures[record.seat].done = True
            return
        if record.phase not in self._phases:
            self._phases.add(record.phase)
            detail = f": {record.detail}" if record.seat is None and record.detail else ""
            self.say(f"  {record.phase}{detail}")
        if record.seat is None:
            return
        if record.phase == "sealed":
            capture = self._captures.get(record.seat)
            if capture is not None:
                capture.done = True
            return
        if record.phase == "capture" and record.step is not None:
            self._step(record, record.seat, record.step, now)

    def _step(self, record: ProgressRecord, seat: str, step: str, now: float) -> None:
        capture = self._captures.setdefault(seat, _Capture(began=now))
        if step == "seal":
            # The last step of a seat's capture: what follows is the seal's own write, not work
            # a person waits on, so a capture that was quick stays quiet.
            capture.done = True
        size = f" bytes={record.bytes}" if record.bytes is not None else ""
        line = f"  capture.progress: seat={seat} phase={step}{size}"
        new_step = step != capture.step
        capture.step = step
        if not capture.shown and (record.bytes or 0) >= LARGE_STEP_BYTES:
            capture.shown = True
            for earlier in capture.pending[:-1] if not new_step else capture.pending:
                self.say(earlier)
            capture.pending.clear()
            self.say(line)
            capture.last_line = now
            return
        if not capture.shown:
            if new_step:
                capture.pending.append(line)
            elif capture.pending:
                capture.pending[-1] = line
            return
        if new_step or now - capture.last_line >= REPEAT_S:
            self.say(line)
            capture.last_line = now


async def poll(client: ControlClient | ControlSession, attempt: str, view: ProgressView) -> bool:
    """One poll; False once the daemon has said it has no progress to give."""
    try:
        since = control.ProgressArgs(attempt_id=attempt, after=view.after)
        result = await client.request(control.PROGRESS, since)
    except ControlError as exc:
        if exc.code in _NO_PROGRESS_OP:
            return False
        raise
    view.take(result.records)
    return True


async def _poll_and_tick(client: ControlClient, attempt: str, view: ProgressView) -> bool:
    more = await poll(client, attempt, view)
    view.tick()
    return more


async def _follow(
    session: ControlSession, attempt: str, view: ProgressView, over: anyio.Event
) -> None:
    # The daemon answers one request at a time per connection and the commit holds the
    # session's connection until it returns, so polling needs a second connection: exactly two
    # control connections while the commit is in flight, one otherwise.
    try:
        async with session.side_channel() as side:
            while not over.is_set():
                if not await _poll_and_tick(side, attempt, view):
                    return
                with anyio.move_on_after(POLL_S):
                    await over.wait()
    except Refusal as exc:
        # Progress is for people; losing it must not fail the cut it describes.
        view.say(f"  (progress unavailable: {exc.text})")


async def follow_commit(
    session: ControlSession,
    attempt: str,
    view: ProgressView,
    commit: Callable[[], Awaitable[T]],
) -> T:
    """Run `commit` on the session while progress is polled beside it, then show whatever the
    daemon recorded after the last poll.

    The poller is told the commit is over and ends between polls, never cancelled inside one:
    anyio's asyncio socket streams wait for a readable socket with a future the loop resolves
    from a reader callback, and a cancellation landing in the same loop pass as the reply makes
    that callback resolve a cancelled future (`InvalidStateError`, printed by asyncio as an
    "Exception in callback" traceback on the command's stderr; seen in CI on a cut)."""
    failure: BaseException | None = None
    result: Any = None
    over = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_follow, session, attempt, view, over)
        try:
            result = await commit()
        except Refusal as exc:
            # Raised outside the task group, so the caller sees the refusal, not a group.
            failure = exc
        finally:
            over.set()
            # A poll that does not answer (a daemon gone mid-commit) is not waited for long.
            tg.cancel_scope.deadline = anyio.current_time() + FOLLOW_GRACE_S
    if failure is not None:
        raise failure
    # The commit is over: a capture not shown by now was quick, so the last records only add
    # phase lines, failures and the steps of captures already shown.
    try:
        await poll(session, attempt, view)
    except Refusal as exc:
        view.say(f"  (progress unavailable: {exc.text})")
    return result  # type: ignore[no-any-return]
