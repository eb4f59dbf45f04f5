"""`cotal events`: this root's manager's lifecycle events, or every manager's on the broker.

The events are read from the stream `EVENTS_<space>` of the broker this root's mesh record
names (manager/broker/events.py), as `cotal ps --fleet` reads its roster: the manager need not
be running, only the broker. Without `--since` only new events are shown; `--since T` replays
from T what the broker kept (a day at most). `--until T` stops after the events up to T, for
scripts. Each event is one line: the time, the manager's instance (its first 8 characters), the
seat, the type and its details; `--json` prints its record, one JSON object a line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

from manager import eventloop
from manager.cli.args import Subcommands, command, root_of
from manager.cli.output import EX_OK, EX_PIPE_CLOSED, detach_stdout
from manager.workspace.layout import Layout
from protocol.errors import DecodeError, Refusal
from protocol.events import Event, decode_event, encode_event
from protocol.refusals import Code


def register(sub: Subcommands) -> None:
    events = command(
        sub,
        "events",
        "follow this root's lifecycle events (seats, turns, cuts, dead letters, refusals)",
        "cotal events",
        "cotal events --seat alice --since 10m",
        "cotal events --fleet --json",
        "cotal events --since 2026-12-01T13:00:00Z --until now --json",
    )
    events.add_argument("--seat", metavar="NAME", help="only this seat's events")
    events.add_argument(
        "--fleet",
        action="store_true",
        help="every manager's events on this root's broker, not only this root's",
    )
    events.add_argument(
        "--since",
        metavar="T",
        help="replay from T what the broker kept: an instant (2026-12-01T13:00:00Z) or a "
        "duration back from now (30s, 10m, 2h, 1d); default: new events only",
    )
    events.add_argument(
        "--until",
        metavar="T",
        help="stop after the events up to T (an instant, or `now`) instead of following",
    )
    events.set_defaults(run=run_events)


def _instant(flag: str, text: str | None, *, now_ok: bool = False) -> datetime | None:
    from manager.cli.logs import parse_since

    if text is None:
        return None
    if now_ok and text == "now":
        return datetime.now(UTC)
    try:
        return parse_since(text)
    except ValueError as exc:
        raise Refusal(
            Code.BAD_ARGS, f"{flag}: {exc}", f"give {flag} as shown in `cotal events --help`"
        ) from None


def _instance_of(layout: Layout, space: str) -> str:
    from connectors.privatefs import read_stable
    from manager.workspace.identity import IDENTITY_CAP, InstanceRecord
    from protocol.codec import decode_json

    path = layout.instance_identity(space)
    if not path.exists():
        raise Refusal(
            Code.NOT_UP,
            f"{layout.root} has no manager identity yet, so it has no events",
            "`cotal up` here first, or `--fleet` for every manager's events",
        )
    try:
        data = read_stable(path, cap=IDENTITY_CAP, what="manager instance identity").data
        return decode_json(data, InstanceRecord, what=str(path), cap=IDENTITY_CAP).instance_id
    except DecodeError as exc:
        raise Refusal(Code.IDENTITY_MALFORMED, exc.message, f"restore {path}") from None


def readable(event: Event) -> str:
    detail = {
        "duration": f"{event.detail.duration_s:.3f}s"
        if event.detail.duration_s is not None
        else None,
        "outcome": event.detail.outcome,
        "op": event.detail.op,
        "code": event.detail.code,
        "attempt": event.detail.attempt_id,
        "tokens": event.detail.tokens,
        "generation": event.detail.generation,
        "limit": event.detail.limit,
    }
    rest = " ".join(f"{k}={v}" for k, v in detail.items() if v is not None)
    line = f"{event.at}  {event.instance[:8]:<8}  {event.seat or '-':<16}  {event.type:<16}"
    return f"{line}  {rest}".rstrip()


async def _events(
    layout: Layout,
    *,
    fleet: bool,
    since: datetime | None,
    until: datetime | None,
) -> AsyncIterator[bytes]:
    from manager.broker import events
    from manager.broker.connection import LazyConnection
    from manager.cli.fleet import _broker_of

    record = _broker_of(layout)
    instance = None if fleet else _instance_of(layout, record.space)
    creds = Path(record.creds) if record.creds else None
    async with LazyConnection(record.server, creds, name="cotal-events") as conn:
        js = await conn.jetstream()
        if until is not None:
            source = events.replay(js, record.space, instance=instance, since=since)
        else:
            source = events.follow(js, record.space, instance=instance, since=since)
        async for data in source:
            yield data


def run_events(args: argparse.Namespace) -> int:
    since = _instant("--since", args.since)
    until = _instant("--until", args.until, now_ok=True)
    layout = Layout.at(root_of(args))
    return eventloop.run(_print, layout, args, since, until)


async def _print(
    layout: Layout, args: argparse.Namespace, since: datetime | None, until: datetime | None
) -> int:
    from protocol.instant import format_instant

    last = format_instant(until) if until is not None else None
    async for data in _events(layout, fleet=args.fleet, since=since, until=until):
        try:
            event = decode_event(data)
        except DecodeError:
            continue
        if args.seat is not None and event.seat != args.seat:
            continue
        if last is not None and event.at > last:
            # Past --until: the replay ends with what the stream held when it began, and a
            # manager's clock may be behind another's, so the rest are still looked at.
            continue
        line = encode_event(event).decode() if args.json else readable(event)
        try:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            detach_stdout()
            return EX_PIPE_CLOSED
    return EX_OK
