"""`cotal takeover NAME... [--from INSTANCE]`: a lost host's seats, run here from their standing
checkpoints. The running manager of this root does the work (manager/daemon/takeover.py): it
refuses while the holder still renews its lease, waits out the holder's self-fence, then claims
custody and adopts each seat as a move's destination does."""

from __future__ import annotations

import argparse

from manager.cli.args import Subcommands, command, root_of
from manager.cli.output import emit_json, say

# The holder's self-fence wait (after_s, 30 s by default, up to an hour) and the adoption.
DEFAULT_TIMEOUT_S = 600.0


def register(sub: Subcommands) -> None:
    takeover = command(
        sub,
        "takeover",
        "run a lost host's seats here, from their standing checkpoints",
        "cotal takeover keeper",
        "cotal takeover keeper scout --from q6a6ihz3a8bsldggwykb2u9ubzcil3y",
    )
    takeover.add_argument("names", nargs="+", metavar="NAME", help="the seats to take over")
    takeover.add_argument(
        "--from",
        dest="from_instance",
        metavar="INSTANCE",
        help="the holder they are taken from (its instance id, as `cotal ps --fleet` shows it); "
        "a seat held by any other is refused",
    )
    takeover.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help="seconds to wait for the whole takeover (default: %(default)s)",
    )
    takeover.set_defaults(run=run_takeover)


def run_takeover(args: argparse.Namespace) -> int:
    from manager.control.oneshot import run_request
    from protocol import control

    root = root_of(args)
    if not args.json:
        say(
            f"taking over {', '.join(args.names)}: waiting out each holder's self-fence, then "
            "claiming custody here"
        )
    reply = run_request(
        root,
        control.TAKEOVER,
        control.TakeoverArgs(names=list(args.names), from_instance=args.from_instance),
        args.timeout,
    )
    if args.json:
        emit_json(reply)
        return 0
    for seat in reply.seats:
        say(
            f"took over {seat.name} (uid {seat.lifecycle_uid}) from {seat.from_instance}: "
            f"generation {seat.generation}, standing checkpoint {seat.attempt_id} captured "
            f"{seat.captured_at}; waited {seat.waited_s:g} s for its holder's self-fence"
        )
    return 0
