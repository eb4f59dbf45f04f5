"""structlog set-up: key-value events, never a secret; the daemon's file sink is size-rotated
JSON lines (docs/design.md, "The core modules, in detail").
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict

from protocol.instant import now_iso

MAX_BYTES = 10 * 1024 * 1024
BACKUPS = 5


def rotated_files(log_path: Path, backups: int = BACKUPS) -> list[Path]:
    """The existing files of a rotated log, oldest first: `.N` ... `.1`, then the live file."""
    older = [log_path.with_name(f"{log_path.name}.{i}") for i in range(backups, 0, -1)]
    return [p for p in [*older, log_path] if p.exists()]


class RotatingFile:
    """An append-only text file that rotates by size. One writer per file (the daemon of a
    root); a reader that follows the file notices the rotation by its inode changing."""

    def __init__(self, path: Path, *, max_bytes: int = MAX_BYTES, backups: int = BACKUPS) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._size = 0
        self._stream = self._open()

    def _open(self) -> TextIO:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = os.fstat(fd).st_size
        return open(fd, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the daemon

    def write_line(self, line: str) -> None:
        data = line + "\n"
        size = len(data.encode())
        # A line larger than the cap still goes into a file of its own rather than being lost.
        if self._size > 0 and self._size + size > self.max_bytes:
            self._rotate()
        self._stream.write(data)
        self._size += size

    def _rotate(self) -> None:
        self._stream.close()
        if self.backups > 0:
            for i in range(self.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{i}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink(missing_ok=True)
        self._stream = self._open()


def _add_timestamp(_: Any, __: str, event_dict: EventDict) -> EventDict:
    # The project's one spelling of an instant (protocol.instant), not structlog's microseconds.
    event_dict["timestamp"] = now_iso()
    return event_dict


def _to_sink(_: Any, __: str, event_dict: EventDict) -> tuple[tuple[Any, ...], dict[str, Any]]:
    # The sink renders, so one event can be written as JSON and for a terminal at once.
    return (event_dict,), {}


class _Sink:
    """structlog's logger: every level method takes the finished event dict.

    Streams are looked up when an event is written, not when logging is configured: a process
    that swaps or closes its stderr (a test runner, a daemonizing parent) must not turn a later
    log line into a crash. A line that cannot reach stderr is dropped; the file is the record.
    """

    def __init__(self, file: RotatingFile | None, *, json_stderr: bool, console: bool) -> None:
        self.file = file
        self.json_stderr = json_stderr
        self.renderer = structlog.dev.ConsoleRenderer(colors=False) if console else None

    def msg(self, event_dict: Mapping[str, Any]) -> None:
        line = json.dumps(event_dict, sort_keys=True, default=repr)
        if self.file is not None:
            self.file.write_line(line)
        if self.json_stderr:
            _to_stderr(line)
        if self.renderer is not None:
            _to_stderr(str(self.renderer(None, "", dict(event_dict))))

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


def _to_stderr(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (ValueError, OSError):
        pass


def _stderr_is_tty() -> bool:
    try:
        return os.isatty(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        return False


def configure(
    log_path: Path | None = None,
    *,
    level: int = logging.INFO,
    max_bytes: int = MAX_BYTES,
    backups: int = BACKUPS,
) -> None:
    """Events to `log_path` (JSON lines, rotated), and to stderr for people when it is a
    terminal. Without `log_path`: stderr only, rendered for a terminal or as JSON lines."""
    file: RotatingFile | None = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        file = RotatingFile(log_path, max_bytes=max_bytes, backups=backups)
    tty = _stderr_is_tty()
    sink = _Sink(file, json_stderr=log_path is None and not tty, console=tty)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _add_timestamp,
            structlog.processors.format_exc_info,
            _to_sink,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=lambda *_: sink,
        cache_logger_on_first_use=False,
    )


def quiet() -> None:
    """For the CLI: no log line reaches the output people read. What a command has to say it
    prints, and a failure is a refusal; the daemon's own events are in its log file (`cotal
    logs`). `COTAL_DEBUG=1` shows the CLI process's warnings and errors on stderr."""
    if os.environ.get("COTAL_DEBUG") == "1":
        configure(None, level=logging.WARNING)
    else:
        # cotal logs nothing at CRITICAL: this keeps every event out of the output.
        configure(None, level=logging.CRITICAL)
