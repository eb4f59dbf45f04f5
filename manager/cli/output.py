"""What `cotal` writes and how it exits: results on stdout, progress and errors on stderr, one
exit status per class of outcome, and a closed stdout (`cotal ps | head -1`) ending quietly."""

from __future__ import annotations

import json
import os
import select
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import msgspec

from protocol.errors import Refusal
from protocol.instant import parse_instant
from protocol.refusals import Code

EX_OK = 0
"""Done, or nothing to do."""
EX_INTERNAL = 1
"""An unexpected exception: a bug to report, never an operator's mistake."""
EX_REFUSED = 2
"""A typed refusal: the request was understood and refused, and nothing changed."""
EX_USAGE = 64
"""EX_USAGE from sysexits.h: the command line does not parse."""
EX_INTERRUPTED = 130
"""Ctrl-C: 128 + SIGINT, as a shell reports it."""
EX_PIPE_CLOSED = 141
"""The reader of stdout went away: 128 + SIGPIPE, as a shell reports a tool killed by it."""

INTERNAL_CURE = "report this with .cotal/logs/manager.log"


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    # Flushed per line so a long command shows its results as they come, and a closed pipe
    # surfaces here, inside the command, rather than at interpreter exit.
    sys.stdout.flush()


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(msgspec.to_builtins(obj), sort_keys=True) + "\n")


def progress(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def refusal(exc: Refusal, *, as_json: bool) -> None:
    """A refusal on stderr, so stdout carries results only and a pipeline never parses an error
    as data; under `--json` it is one JSON document on one line."""
    if as_json:
        error_json(exc.code, exc.text)
    else:
        progress(f"cotal: {exc.text}")


def error_json(code: str, text: str) -> None:
    progress(json.dumps({"ok": False, "code": code, "error": text}, sort_keys=True))


def internal_error(exc: BaseException, *, as_json: bool) -> None:
    # One line: an operator pastes it into a report; the traceback is one COTAL_DEBUG=1 away.
    what = " ".join(f"{type(exc).__name__}: {exc}".split())
    if as_json:
        error_json(Code.INTERNAL_ERROR, f"{what}; {INTERNAL_CURE}")
    else:
        progress(f"cotal: internal error: {what}; {INTERNAL_CURE}")


def stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it. A BrokenPipeError can also come from
    the control socket, which is a failure to report, not a reader that has seen enough."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def detach_stdout() -> None:
    """Point stdout's descriptor at /dev/null: what is still buffered is flushed again at
    interpreter exit, and must not raise a second BrokenPipeError there (Python's documented
    recipe for SIGPIPE)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def format_table(rows: Sequence[Mapping[str, object]], columns: Sequence[tuple[str, str]]) -> str:
    """Columns padded to their widest cell, `-` for a missing value, no trailing blanks."""
    cells = [[h for h, _ in columns]] + [
        ["-" if r.get(k) is None else str(r.get(k)) for _, k in columns] for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def age(since: str | None, now: datetime) -> str | None:
    """`3d4h`, `2h05m`, `4m12s`, `9s` from an instant to `now`: the two largest units an
    operator reads at a glance; None when the instant is missing or does not parse."""
    if not since:
        return None
    try:
        seconds = max(0, int((now - parse_instant(since)).total_seconds()))
    except ValueError:
        return None
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
