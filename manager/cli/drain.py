"""`cotal drain`: the command line of emptying this host; the drain itself (waves of moves, the
destination chosen, a refused seat named, the deadline, the marker a cancel and a spawn read)
is `manager/coord/drain.py`."""

from __future__ import annotations

import argparse

from manager.cli.args import Subcommands, command, root_of
from manager.cli.output import EX_OK, EX_REFUSED, emit_json, say


def register(sub: Subcommands) -> None:
    drain = command(
        sub,
        "drain",
        "empty this host: move every seat to another manager, N at a time",
        "cotal drain --to q6a6ihz3a8bsldggwykb2u9ubzcil3y",
        "cotal drain --fleet --max-parallel 4 --deadline 600",
        "cotal drain --cancel",
    )
    where = drain.add_mutually_exclusive_group()
    where.add_argument(
        "--to",
        metavar="INSTANCE",
        help="move every seat to this manager (its instance id, as `cotal ps --fleet` prints it)",
    )
    where.add_argument(
        "--fleet",
        action="store_true",
        help="move each wave to the live manager of this broker with the most free seats",
    )
    where.add_argument(
        "--cancel",
        action="store_true",
        help="stop this root's drain before its next wave (the seats still here stay)",
    )
    drain.add_argument(
        "--max-parallel",
        type=int,
        default=4,
        metavar="N",
        help="seats moved at once, in one wave (default: %(default)s)",
    )
    drain.add_argument(
        "--deadline",
        type=float,
        default=None,
        metavar="S",
        help="seconds after which the seats still here are moved mid-turn (default: none)",
    )
    drain.add_argument(
        "--drain-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="before the deadline, seconds each seat's turn may take to finish before its cut",
    )
    drain.set_defaults(run=run_drain)


def run_drain(args: argparse.Namespace) -> int:
    from manager.workspace import drainmark
    from manager.workspace.layout import Layout

    root = root_of(args)
    if args.cancel:
        told = drainmark.cancel(Layout.at(root))
        if args.json:
            emit_json({"cancelled": told})
        else:
            say("the drain stops before its next wave" if told else "no drain runs here")
        return 0
    from manager import eventloop
    from manager.coord import drain

    req = drain.DrainRequest(
        to=args.to,
        fleet=args.fleet,
        max_parallel=args.max_parallel,
        deadline_s=args.deadline,
        drain_timeout=args.drain_timeout,
    )
    out = eventloop.run(drain.drain, req, root)
    if args.json:
        emit_json(out)
    else:
        for seat in out.moved:
            late = " (mid-turn, past the deadline)" if seat.mid_turn else ""
            say(f"moved {seat.name} to {seat.to}: downtime {seat.downtime_ms} ms{late}")
        for refused in out.refused:
            say(f"{refused.name} stays here: {refused.code}: {refused.message}; {refused.cure}")
        if out.left:
            say(f"cancelled: {', '.join(out.left)} stay here")
        say(f"{len(out.moved)} moved in {out.waves} wave(s), {len(out.refused)} refused")
    # A host not emptied (a seat refused, or the drain cancelled) is the operator's to see in
    # the exit status as well as in what was printed.
    return EX_REFUSED if out.refused or out.cancelled else EX_OK
