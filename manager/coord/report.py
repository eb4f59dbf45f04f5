"""Where a coordinator's progress lines go: the operator's stderr, or whatever the caller set.

A line of progress is for people (`admitting DIR`, `claiming custody …`). The CLI lets it go to
stderr, the default; the daemon, running the restore coordinator for a move's destination, sets
its own sink for the length of that call (`reporting`), so the lines land in its log, keyed to
the attempt, and never on a terminal it does not have. A context variable rather than a
parameter, because the lines are said from deep inside helpers that would otherwise all pass a
callable along; anyio's tasks and worker threads inherit the caller's context, so a sink set
around a call reaches every line that call says.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Callable, Iterator

Sink = Callable[[str], None]


def _stderr(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


_sink: contextvars.ContextVar[Sink] = contextvars.ContextVar("cotal_report_sink", default=_stderr)


def say(text: str) -> None:
    _sink.get()(text)


@contextlib.contextmanager
def reporting(sink: Sink) -> Iterator[None]:
    token = _sink.set(sink)
    try:
        yield
    finally:
        _sink.reset(token)
