"""The typed progress of one maintenance attempt, as the coordinator polls it (`progress` op).

Records are appended by the cut as each phase happens and read by sequence number, so a poller
that asks for `after=N` sees every later step exactly once. The structlog events stay for the
operator's log, but nothing reads them as an interface.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Final

import structlog

from manager.checkpoint import cut
from protocol import control
from protocol.errors import Refusal
from protocol.instant import now_iso
from protocol.refusals import Code

log = structlog.get_logger("cotal.preserve")

# Enough for every step of a full manager's cut; a poller that falls further behind than this
# loses the oldest records, never the newest.
KEEP_RECORDS: Final = 4096
CAPTURE_EVERY_S: Final = 0.5


class ProgressLog:
    def __init__(self) -> None:
        self.attempt_id: str | None = None
        self.done = False
        self._records: deque[control.ProgressRecord] = deque(maxlen=KEEP_RECORDS)
        self._seq = 0
        # Per seat, the last capture count the throttle held back: (step, bytes).
        self._held: dict[str, tuple[str, int]] = {}

    def begin(self, attempt_id: str) -> None:
        """A new attempt starts a new log; the same attempt again continues its own."""
        if attempt_id == self.attempt_id:
            self.done = False
            return
        self.attempt_id, self.done, self._seq = attempt_id, False, 0
        self._records.clear()
        self._held.clear()

    def add(
        self,
        phase: control.ProgressPhase,
        *,
        seat: str | None = None,
        step: str | None = None,
        size: int | None = None,
        detail: str | None = None,
    ) -> None:
        if phase != "capture":
            # Whatever comes next (a seal, a failure, the next phase), each step's total
            # reaches the coordinator first, however fast the step ran.
            for held_seat, (held_step, held_bytes) in sorted(self._held.items()):
                self._append("capture", held_seat, held_step, held_bytes, None)
            self._held.clear()
        self._append(phase, seat, step, size, detail)

    def _append(
        self,
        phase: control.ProgressPhase,
        seat: str | None,
        step: str | None,
        size: int | None,
        detail: str | None,
    ) -> None:
        self._seq += 1
        self._records.append(
            control.ProgressRecord(
                seq=self._seq,
                at=now_iso(),
                phase=phase,
                seat=seat,
                step=step,
                bytes=size,
                detail=detail,
            )
        )

    def capture_reporter(self, seat: str) -> cut.Progress:
        """Every step change, and within a step at most twice a second. A count the throttle
        held back is recorded when the next step or the next phase begins."""
        last: dict[str, float | str] = {"at": 0.0, "step": ""}

        def record(step: str, done: int) -> None:
            log.info("capture.progress", seat=seat, phase=step, bytes=done)
            self.add("capture", seat=seat, step=step, size=done)

        def report(step: str, done: int) -> None:
            now = time.monotonic()
            held = self._held.pop(seat, None)
            if step != last["step"]:
                if held is not None:
                    record(*held)
                last.update(at=now, step=step)
                record(step, done)
            elif now - float(last["at"]) >= CAPTURE_EVERY_S:
                last.update(at=now)
                record(step, done)
            else:
                self._held[seat] = (step, done)

        return report

    def read(self, args: control.ProgressArgs) -> control.ProgressResult:
        if self.attempt_id is None or args.attempt_id != self.attempt_id:
            raise Refusal(
                Code.NOT_THIS_ATTEMPT,
                f"this manager has no progress for attempt {args.attempt_id} "
                f"(its attempt is {self.attempt_id or '<none>'})",
                "poll the attempt this manager is preparing or committing",
            )
        return control.ProgressResult(
            attempt_id=self.attempt_id,
            records=[r for r in self._records if r.seq > args.after],
            done=self.done,
        )
