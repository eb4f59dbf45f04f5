"""`cotal inbox SEAT`: a seat's dead letters. List them, put one back into the seat's inbox
(`--redeliver ID`: it arrives marked as a redelivery, with its delivery count), put every one
back in order (`--redeliver-all`), or delete one (`--drop ID`). The manager does the work (the
`dead-letters`, `redeliver-dead-letter`, `redeliver-all-dead-letters` and `drop-dead-letter`
ops); this module only asks and prints.

`main` imports every command module to build its parser, so the mesh (the control client, the
broker's code) is imported when a dead letter is asked for, not at this module's top."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from manager.cli.args import Subcommands, command, root_of
from manager.cli.output import emit_json, format_table, say
from protocol import control

A = TypeVar("A")
R = TypeVar("R")


def register(sub: Subcommands) -> None:
    inbox = command(
        sub,
        "inbox",
        "a seat's dead letters: list them, put one back into its inbox, or drop one",
        "cotal inbox alice",
        "cotal inbox alice --redeliver 7",
        "cotal inbox alice --redeliver-all",
        "cotal inbox alice --drop 7 --json",
    )
    inbox.add_argument("name", help="the seat whose dead letters to show")
    which = inbox.add_mutually_exclusive_group()
    which.add_argument(
        "--redeliver",
        type=dead_letter_id,
        metavar="ID",
        help="publish dead letter ID into the seat's inbox again (it arrives marked as a "
        "redelivery, with its delivery count), then remove it from the dead letters",
    )
    which.add_argument(
        "--redeliver-all",
        action="store_true",
        help="publish every dead letter of the seat into its inbox again, oldest first, then "
        "remove each from the dead letters",
    )
    which.add_argument(
        "--drop", type=dead_letter_id, metavar="ID", help="delete dead letter ID for good"
    )
    inbox.set_defaults(run=run_inbox)


def run_inbox(args: argparse.Namespace) -> int:
    return run(
        root_of(args),
        args.name,
        redeliver=args.redeliver,
        drop=args.drop,
        redeliver_all=args.redeliver_all,
        as_json=args.json,
        say=say,
        emit=emit_json,
    )


def dead_letter_id(text: str) -> int:
    """An id as `cotal inbox` lists it: a positive whole number."""
    if not text.isascii() or not text.isdigit() or int(text) < 1 or len(text) > 19:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a dead letter id (a positive number `cotal inbox SEAT` lists)"
        )
    return int(text)


def _request(root: Path, op: control.Op[A, R], args: A) -> R:
    from manager.control.oneshot import run_request

    return run_request(root, op, args)


def run(
    root: Path,
    name: str,
    *,
    redeliver: int | None,
    drop: int | None,
    as_json: bool,
    say: Callable[[str], None],
    emit: Callable[[Any], None],
    redeliver_all: bool = False,
) -> int:
    if redeliver_all:
        return _redeliver_all(root, name, as_json=as_json, say=say, emit=emit)
    if redeliver is not None:
        back = control.DeadLetterArgs(name=name, id=redeliver)
        redelivered = _request(root, control.REDELIVER_DEAD_LETTER, back)
        if as_json:
            emit(redelivered)
        else:
            say(
                f"redelivered dead letter {redelivered.id} (message {redelivered.message_id}) "
                f"into {redelivered.name}'s inbox (stream seq {redelivered.seq}); it arrives "
                f"marked as delivery {redelivered.delivery}"
            )
        return 0
    if drop is not None:
        gone = control.DeadLetterArgs(name=name, id=drop)
        dropped = _request(root, control.DROP_DEAD_LETTER, gone)
        if as_json:
            emit(dropped)
        else:
            say(
                f"dropped dead letter {dropped.id} (message {dropped.message_id}) of {dropped.name}"
            )
        return 0
    listed = _request(root, control.DEAD_LETTERS, control.DeadLettersArgs(name=name))
    if as_json:
        emit(listed)
        return 0
    if not listed.count:
        say(f"{listed.name} has no dead letters")
        return 0
    say(f"{listed.name}: {listed.count} dead letter(s) (uid {listed.lifecycle_uid})")
    say(_table(listed.letters))
    if listed.truncated:
        say(f"(the oldest {len(listed.letters)} shown)")
    say(
        f"next: cotal inbox {listed.name} --redeliver ID (back into its inbox, marked as a "
        f"redelivery), or cotal inbox {listed.name} --drop ID"
    )
    return 0


def _redeliver_all(
    root: Path, name: str, *, as_json: bool, say: Callable[[str], None], emit: Callable[[Any], None]
) -> int:
    back = _request(root, control.REDELIVER_ALL_DEAD_LETTERS, control.RedeliverAllArgs(name=name))
    if as_json:
        emit(back)
        return 0
    if not back.count:
        say(f"{back.name} has no dead letters")
        return 0
    for row in back.letters:
        say(
            f"redelivered dead letter {row.id} (message {row.message_id}) into {row.name}'s "
            f"inbox (stream seq {row.seq}); it arrives marked as delivery {row.delivery}"
        )
    if back.truncated:
        say(f"(the first {len(back.letters)} shown)")
    say(f"{back.name}: {back.count} dead letter(s) put back into its inbox, oldest first")
    return 0


def _table(rows: list[control.DeadLetterRow]) -> str:
    shown = [
        {
            "id": r.id,
            "from": r.sender or "-",
            "deliveries": r.deliveries,
            "deadAt": r.dead_at,
            "reason": _cut(r.reason, 48),
            "head": _cut(r.head, 40),
        }
        for r in rows
    ]
    columns = [
        ("ID", "id"),
        ("FROM", "from"),
        ("DELIVERIES", "deliveries"),
        ("DEAD AT", "deadAt"),
        ("REASON", "reason"),
        ("TEXT", "head"),
    ]
    return format_table(shown, columns)


def _cut(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"
