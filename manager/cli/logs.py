"""`cotal logs`: the manager's event log for people, one seat's harness stderr, a transcript.

The daemon writes `.cotal/logs/manager.log` as JSON lines (`manager.logs`), rotated by size
into `manager.log.1` ... `.5`; this reads the set oldest first and renders each event as

    HH:MM:SS.mmm  LEVEL  seat      event                 key=value ...

(UTC, as the log records it; `timestamp`, `level`, `logger`, `event` and `seat` are the columns,
every other field follows sorted by key). A line that is not a JSON object is printed as it is:
a log half-written by a crash is still evidence. With a seat, only events whose `seat` is that
seat are shown, then the lines of the seat's harness stderr (`seat-<name>-<uid>.log`, the newest
uid), each prefixed `stderr`.

`-f` polls the files rather than using inotify: it must follow a rotation (the file is renamed
under the reader) and a seat log that appears later, and a poll does both with one code path.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import BinaryIO, TextIO

from manager.cli.args import Subcommands, command, root_of
from manager.cli.output import EX_OK, EX_PIPE_CLOSED, detach_stdout, stdout_gone
from manager.workspace.layout import Layout
from protocol import names
from protocol.errors import DecodeError, Refusal
from protocol.refusals import Code
from protocol.session import decode_pointer

POLL_S = 0.2
LEVELS = {"debug": "DEBUG", "info": "INFO", "warning": "WARN", "error": "ERROR"}
LEVELS |= {"critical": "CRIT", "exception": "ERROR"}
COLUMNS = ("timestamp", "level", "logger", "event", "seat")
SEAT_LOG = re.compile(r"seat-(?P<name>[A-Za-z0-9_]{1,64})-(?P<uid>[a-z0-9]{26,32})\.log")
_DURATION = re.compile(r"(\d{1,9})([smhd])")
_INSTANT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z")
_BARE = re.compile(r"[^\s\"'=\\]+")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


# -- parsing and rendering --------------------------------------------------------------------


def register(sub: Subcommands) -> None:
    logs_cmd = command(
        sub,
        "logs",
        "the manager's events for people, a seat's harness stderr, or its transcript",
        "cotal logs",
        "cotal logs alice --since 10m",
        "cotal logs -f",
        "cotal logs alice --since 2026-12-01T13:00:00Z --json",
        "cotal logs alice --transcript",
    )
    logs_cmd.add_argument(
        "seat",
        nargs="?",
        metavar="SEAT",
        help="only this seat's events, then its harness stderr (lines prefixed `stderr`)",
    )
    logs_cmd.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing new events as they are written, until Ctrl-C or SIGTERM",
    )
    logs_cmd.add_argument(
        "--since",
        type=since_arg,
        metavar="T",
        help="only events at or after T: an instant (2026-12-01T13:00:00Z) or a duration back "
        "from now (30s, 10m, 2h, 1d)",
    )
    logs_cmd.add_argument(
        "--transcript",
        action="store_true",
        help="print SEAT's conversation as its harness stored it (scribe, pi, claude)",
    )
    logs_cmd.set_defaults(run=run_logs)


def run_logs(args: argparse.Namespace) -> int:
    return run(
        root_of(args),
        seat=args.seat,
        follow=args.follow,
        since=args.since,
        as_json=args.json,
        transcript=args.transcript,
    )


def since_arg(text: str) -> datetime:
    """`--since` as argparse takes it: the reason a text is neither shape is the usage error."""
    try:
        return parse_since(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """`--since`: an instant in UTC (`2026-12-01T13:00:00Z`, `...00.000Z`) or a duration back
    from now (`30s`, `10m`, `2h`, `1d`)."""
    if m := _DURATION.fullmatch(text):
        delta = timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})
        return (now or datetime.now(UTC)) - delta
    if _INSTANT.fullmatch(text):
        return datetime.fromisoformat(text)
    raise ValueError(
        f"{text!r} is neither an instant (2026-12-01T13:00:00Z) nor a duration (30s, 10m, 2h, 1d)"
    )


# One structlog line: its keys are whatever the event said, so each value is read as an
# object and narrowed where it is used.
Event = dict[str, object]


def event_time(obj: Event) -> datetime | None:
    stamp = obj.get("timestamp")
    if not isinstance(stamp, str):
        return None
    try:
        when = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _value(value: object) -> str:
    if isinstance(value, str) and _BARE.fullmatch(value):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def render_event(obj: Event) -> str:
    when = event_time(obj)
    clock = when.astimezone(UTC).strftime("%H:%M:%S.%f")[:12] if when else "-"
    level = str(obj.get("level") or "-")
    seat = obj.get("seat")
    tail = " ".join(f"{k}={_value(obj[k])}" for k in sorted(obj) if k not in COLUMNS)
    line = (
        f"{clock:<12}  {LEVELS.get(level, level.upper()):<5}  "
        f"{'-' if seat is None else _value(seat):<8}  {_value(obj.get('event', '-')):<20}  {tail}"
    )
    return line.rstrip()


def decode_line(line: str) -> Event | None:
    """The event of one log line, or None when it is not a JSON object."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


@dataclass
class Filter:
    seat: str | None = None
    since: datetime | None = None
    # Log lines are written in time order, so a line without a readable time belongs where it
    # stands: shown once the log has reached --since.
    reached: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.reached = self.since is None

    def admits(self, obj: Event | None, raw: str) -> bool:
        if obj is not None and self.since is not None:
            when = event_time(obj)
            if when is not None:
                self.reached = when >= self.since
        if not self.reached:
            return False
        if self.seat is None:
            return True
        if obj is None:
            return f'"seat": "{self.seat}"' in raw
        return obj.get("seat") == self.seat


class Printer:
    """Writes what passes the filter, as text for people or as JSON lines."""

    def __init__(self, out: TextIO, *, as_json: bool, flt: Filter) -> None:
        self.out = out
        self.as_json = as_json
        self.filter = flt
        self.events = 0

    def log_line(self, raw: str) -> None:
        raw = raw.rstrip("\n")
        if not raw.strip():
            return
        obj = decode_line(raw)
        if not self.filter.admits(obj, raw):
            return
        self.events += 1
        if obj is None:
            self._write({"malformed": raw} if self.as_json else raw)
        else:
            self._write(obj if self.as_json else render_event(obj))

    def stderr_line(self, seat: str, uid: str, raw: str) -> None:
        raw = raw.rstrip("\n")
        if self.as_json:
            self._write({"seat": seat, "stderr": raw, "uid": uid})
        else:
            self._write(f"stderr  {raw}")

    def _write(self, item: str | Event) -> None:
        if isinstance(item, dict):
            item = json.dumps(item, sort_keys=True)
        self.out.write(item + "\n")


# -- files ------------------------------------------------------------------------------------


def seat_logs(layout: Layout, seat: str) -> list[tuple[Path, str]]:
    """The seat's harness stderr files with their lifecycle uids, newest first."""
    try:
        entries = list(os.scandir(layout.logs))
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        m = SEAT_LOG.fullmatch(entry.name)
        if m and m.group("name") == seat and entry.is_file(follow_symlinks=False):
            found.append((entry.stat().st_mtime_ns, entry.name, Path(entry.path), m.group("uid")))
    found.sort(reverse=True)
    return [(path, uid) for _, _, path, uid in found]


def _lines(path: Path) -> Iterator[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            yield from f
    except FileNotFoundError:
        # Rotated away between the listing and the open: its lines are in the next file.
        return


def _older_than(path: Path, since: datetime | None) -> bool:
    """Whether every event of a (rotated) file predates `since`: its last write does."""
    if since is None:
        return False
    try:
        mtime = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    except FileNotFoundError:
        return True
    return mtime < since


# -- following --------------------------------------------------------------------------------


class Tail:
    """One file read incrementally, across renames: when the path names another inode the old
    file is read to its end first, then the new one from its start."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle: BinaryIO | None = None
        self.partial = b""
        self._open()

    def _open(self) -> None:
        try:
            self.handle = open(self.path, "rb")  # noqa: SIM115 - kept open across polls
        except FileNotFoundError:
            self.handle = None

    def read(self) -> list[str]:
        """The complete lines written since the last read."""
        if self.handle is None:
            self._open()
            if self.handle is None:
                return []
        lines = self._drain()
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return lines
        ours = os.fstat(self.handle.fileno())
        moved = (now.st_dev, now.st_ino) != (ours.st_dev, ours.st_ino)
        if moved or now.st_size < self.handle.tell():
            # Rotated (renamed aside) or truncated: what is left in the old file, then the new.
            lines += self._drain()
            if self.partial:
                lines.append(self.partial.decode("utf-8", "replace"))
                self.partial = b""
            self.handle.close()
            self._open()
            if self.handle is not None:
                lines += self._drain()
        return lines

    def _drain(self) -> list[str]:
        assert self.handle is not None
        *complete, self.partial = (self.partial + self.handle.read()).split(b"\n")
        return [line.decode("utf-8", "replace") for line in complete]

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


class _Stopped(Exception):
    pass


def _stop(signum: int, frame: FrameType | None) -> None:
    raise _Stopped


# -- the command ------------------------------------------------------------------------------


def run(
    root: Path,
    *,
    seat: str | None,
    follow: bool,
    since: datetime | None,
    as_json: bool,
    transcript: bool,
    out: TextIO | None = None,
) -> int:
    layout = Layout.at(root)
    stream = out or sys.stdout
    if seat is not None:
        names.check_seat_name(seat)
    if transcript:
        if seat is None or follow or since is not None:
            raise Refusal(
                Code.BAD_ARGS,
                "--transcript prints one seat's stored conversation: it needs SEAT and takes "
                "neither -f nor --since",
                "run `cotal logs SEAT --transcript`",
            )
        return print_transcript(layout, seat, as_json=as_json, out=stream)
    if not layout.control.is_dir():
        raise Refusal(
            Code.NO_LOGS,
            f"{layout.root} has no .cotal directory, so no manager has logged here",
            "pass the workspace root with --root, or run `cotal up --detach` there",
        )
    # Here, not at the top: `manager.logs` brings structlog, which every command would pay for.
    from manager.logs import BACKUPS, rotated_files

    printer = Printer(stream, as_json=as_json, flt=Filter(seat=seat, since=since))
    for path in rotated_files(layout.manager_log, BACKUPS):
        if path == layout.manager_log or _older_than(path, since):
            continue
        for line in _lines(path):
            printer.log_line(line)
    # Following, the live file is read by the tail that goes on following it, so no line
    # written between a first read and the start of following can fall between the two.
    tail = Tail(layout.manager_log) if follow else None
    for line in tail.read() if tail is not None else _lines(layout.manager_log):
        printer.log_line(line)
    logs = seat_logs(layout, seat) if seat is not None else []
    seat_log = logs[0] if logs else None
    stderr_tail = Tail(seat_log[0]) if follow and seat_log is not None else None
    if seat is not None and seat_log is not None:
        lines = stderr_tail.read() if stderr_tail is not None else _lines(seat_log[0])
        for line in lines:
            printer.stderr_line(seat, seat_log[1], line)
    if tail is not None:
        return _follow(layout, seat, printer, stream, tail, stderr_tail, seat_log)
    if seat is not None and printer.events == 0 and seat_log is None:
        raise Refusal(
            Code.NO_SUCH_SEAT,
            f"no event and no harness log of a seat named {seat!r} in {layout.logs}",
            "see `cotal ps`; `cotal logs` without SEAT shows every event",
        )
    if printer.events == 0 and not layout.manager_log.exists():
        raise Refusal(
            Code.NO_LOGS,
            f"{layout.manager_log} does not exist",
            "run `cotal up --detach` in this root; the manager writes it",
        )
    return EX_OK


def _follow(
    layout: Layout,
    seat: str | None,
    printer: Printer,
    stream: TextIO,
    tail: Tail,
    stderr_tail: Tail | None,
    seat_log: tuple[Path, str] | None,
) -> int:
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        stream.flush()
        while True:
            for line in tail.read():
                printer.log_line(line)
            if seat is not None:
                newest = seat_logs(layout, seat)
                if newest and (seat_log is None or newest[0][0] != seat_log[0]):
                    # A new lifecycle of the seat (a fresh spawn): its stderr is the one to show.
                    if stderr_tail is not None:
                        stderr_tail.close()
                    seat_log = newest[0]
                    stderr_tail = Tail(seat_log[0])
                if stderr_tail is not None and seat_log is not None:
                    for line in stderr_tail.read():
                        printer.stderr_line(seat, seat_log[1], line)
            stream.flush()
            if stdout_gone():
                detach_stdout()
                return EX_PIPE_CLOSED
            time.sleep(POLL_S)
    except (_Stopped, KeyboardInterrupt):
        # Following ends only this way: an ordinary end, not an interruption of work.
        stream.flush()
        return EX_OK
    finally:
        signal.signal(signal.SIGTERM, previous)
        tail.close()
        if stderr_tail is not None:
            stderr_tail.close()


# -- transcripts ------------------------------------------------------------------------------


def _pointer(layout: Layout, seat: str) -> tuple[str, str, str]:
    """(connector, uid, session id) of the seat's newest session pointer."""
    found = []
    try:
        connectors = [e for e in os.scandir(layout.sessions) if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        connectors = []
    pattern = re.compile(re.escape(seat) + r"-(?P<uid>[a-z0-9]{26,32})\.json")
    for directory in connectors:
        for entry in os.scandir(directory.path):
            m = pattern.fullmatch(entry.name)
            if m and entry.is_file(follow_symlinks=False):
                found.append((entry.stat().st_mtime_ns, directory.name, m.group("uid"), entry.path))
    if not found:
        raise Refusal(
            Code.NO_SUCH_SEAT,
            f"no session pointer of a seat named {seat!r} under {layout.sessions}",
            "see `cotal ps`; `cotal rm` and `cotal down` delete a seat's pointer",
        )
    _, connector, uid, path = max(found)
    try:
        pointer = decode_pointer(Path(path).read_bytes(), where=f"session pointer {path}")
    except FileNotFoundError:
        raise Refusal(
            Code.NO_SUCH_SEAT, f"the session pointer {path} was just removed", "see `cotal ps`"
        ) from None
    except DecodeError as exc:
        raise Refusal(
            Code.NO_TRANSCRIPT, exc.message, "the seat's harness has not written it yet"
        ) from None
    return connector, uid, pointer.session_id


def transcript_files(layout: Layout, seat: str) -> list[Path]:
    connector, uid, session_id = _pointer(layout, seat)
    if connector == "scribe":
        if not names.SCRIBE_SESSION_ID.matches(session_id):
            raise Refusal(
                Code.NO_TRANSCRIPT,
                f"scribe session id {session_id[:80]!r} in the pointer does not name a file",
                "the pointer is damaged; see the seat's log",
            )
        files = [layout.seat_store("scribe", seat, uid) / f"{session_id}.jsonl"]
        files = [p for p in files if p.is_file()]
    elif connector == "pi":
        from connectors.pi import find_session_file

        files = find_session_file(layout.seat_store("pi", seat, uid), session_id)
    elif connector == "claude":
        from connectors.claude_code import transcripts

        files = transcripts(layout.sessions / "claude" / f"{seat}-{uid}.config", session_id)
    else:
        raise Refusal(
            Code.NO_TRANSCRIPT,
            f"the {connector} connector keeps no transcript cotal can read (seat {seat!r})",
            f"read the seat's harness log: `cotal logs {seat}`",
        )
    if not files:
        raise Refusal(
            Code.NO_TRANSCRIPT,
            f"seat {seat!r} ({connector}) has no stored transcript of session {session_id} yet",
            "a harness may write it only once the first turn starts; send the seat a message",
        )
    return files


def print_transcript(layout: Layout, seat: str, *, as_json: bool, out: TextIO) -> int:
    for path in transcript_files(layout, seat):
        if not as_json:
            out.write(f"==> {path} <==\n")
        for line in _lines(path):
            line = line.rstrip("\n")
            if as_json and decode_line(line) is None:
                out.write(json.dumps({"malformed": line}) + "\n")
            else:
                out.write(line + "\n")
    return EX_OK
