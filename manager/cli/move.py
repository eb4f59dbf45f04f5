"""`cotal move NAME... --to INSTANCE`: the command line of a move; the move itself (probe,
pre-copy, the cut of some seats, the carry and the offer) is `manager/coord/move.py`, and the
destination's side of it `manager/daemon/mover.py`."""

from __future__ import annotations

import argparse

from manager.cli.args import Subcommands, command, root_of


def register(sub: Subcommands) -> None:
    move = command(
        sub,
        "move",
        "move seats to another manager on this broker: cut here, adopted there",
        "cotal move alice --to q6a6ihz3a8bsldggwykb2u9ubzcil3y",
        "cotal move alice bob --to q6a6ihz3a8bsldggwykb2u9ubzcil3y --json",
    )
    move.add_argument("names", nargs="+", metavar="NAME", help="a seat to move (repeatable)")
    move.add_argument(
        "--to",
        required=True,
        metavar="INSTANCE",
        help="the destination manager's instance id, as its `cotal status` (or `cotal ps "
        "--fleet`) prints it",
    )
    move.add_argument(
        "--drain-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="seconds each seat's turn in flight may take to finish before it is cut anyway",
    )
    move.set_defaults(run=run_move)


def run_move(args: argparse.Namespace) -> int:
    from manager import eventloop
    from manager.cli import results
    from manager.coord import move
    from manager.coord.requests import MoveRequest

    req = MoveRequest(names=tuple(args.names), to=args.to, drain_timeout=args.drain_timeout)
    results.moved(args.json, eventloop.run(move.move, req, root_of(args)))
    return 0
