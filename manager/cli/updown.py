"""`cotal up` and `cotal down`: start or stop this root's mesh, or (`--restore`,
`--preserve-state`) hand over to the coordinator of a resume or a cut.

`main` imports every command module to build its parser, so what this module imports at its top
loads for every command; the mesh and the coordinators (with the broker and signing code they
bring) are imported by the handler that runs them, and only then."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from manager import concurrency
from manager.cli.args import (
    CREDS_HELP,
    MAP_HELP,
    SERVER_HELP,
    SPACE_HELP,
    STALE_HELP,
    TRUST_HELP,
    Subcommands,
    command,
    root_of,
)
from manager.cli.output import emit_json, progress, say
from protocol.errors import Refusal
from protocol.refusals import Code

if TYPE_CHECKING:
    from protocol.control import TeardownRow


def register(sub: Subcommands) -> None:
    _register_up(sub)
    _register_down(sub)


def _register_up(sub: Subcommands) -> None:
    up = command(
        sub,
        "up",
        "start the broker (unless --server) and the manager",
        "cotal up --detach",
        "cotal up --detach --server nats://10.0.0.5:4222 --creds broker.creds",
        "cotal up --restore /carried/20261129T142434Z-9356e4ba --server nats://10.0.0.5:4222"
        " --creds broker.creds",
        "cotal up --restore /carried/20261129T142434Z-9356e4ba.tar",
        "cotal up --restore /carried/20261129T142434Z-9356e4ba --map /srv/shared=/data/shared"
        " --server nats://10.0.0.5:4222 --creds broker.creds",
    )
    up.add_argument("--space", default="main", help=SPACE_HELP)
    up.add_argument("--server", help=SERVER_HELP + " instead of starting the embedded broker")
    up.add_argument("--creds", help=CREDS_HELP)
    up.add_argument(
        "--replicas",
        type=int,
        help="JetStream replicas (default 3 for a cluster of 3+ URLs, else 1)",
    )
    up.add_argument(
        "--monitor",
        help="the broker's monitoring URL(s), comma-separated: eviction evidence for a resume",
    )
    up.add_argument("--detach", action="store_true", help="return once the manager answers")
    _restore_flags(up)
    up.add_argument(
        "--jobs",
        action=concurrency.JobsAction,
        metavar="N",
        help="how many seats the restore and this manager's cuts and adoptions work on at once "
        "(sets COTAL_JOBS; default twice the cores, 2 to 16)",
    )
    up.set_defaults(run=run_up)


def _restore_flags(up: argparse.ArgumentParser) -> None:
    up.add_argument(
        "--restore",
        metavar="DIR|FILE",
        help="resume the seats of a sealed checkpoint directory, or of the file "
        "`cotal checkpoint pack` wrote",
    )
    up.add_argument(
        "--take-back",
        action="store_true",
        help="with --restore: resume seats this root handed off by packing them; "
        "only if the packed copy was destroyed or never resumed elsewhere; otherwise two hosts "
        "will run the same seat",
    )
    up.add_argument(
        "--trust-signer", action="append", metavar="KEY", help="with --restore: " + TRUST_HELP
    )
    up.add_argument("--accept-stale-checkpoint", action="store_true", help=STALE_HELP)
    up.add_argument("--map", action="append", metavar="OLD=NEW", help="with --restore: " + MAP_HELP)


def _register_down(sub: Subcommands) -> None:
    down = command(
        sub,
        "down",
        "stop seats, the manager and the embedded broker",
        "cotal down",
        "cotal down --preserve-state",
        "cotal down --preserve-state --session-store ~/.pi/sessions --json",
        "cotal down --preserve-state --abort",
        "cotal down --preserve-state --since 20261129T140000Z-0a1b2c3d",
        "cotal down --preserve-state --seat alice --seat bob",
    )
    down.add_argument(
        "--preserve-state",
        action="store_true",
        help="cut: keep durables, capture and seal checkpoints",
    )
    _cut_flags(down)
    down.set_defaults(run=run_down)


def _cut_flags(down: argparse.ArgumentParser) -> None:
    down.add_argument(
        "--session-store",
        action="append",
        default=[],
        metavar="DIR",
        help="an extra session-store directory to capture (repeatable)",
    )
    down.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="PATH",
        help="with --preserve-state: an ignored path or simple glob under each seat's repository "
        "to carry anyway, such as .env (repeatable; added to cotal.toml's [carry] include)",
    )
    down.add_argument(
        "--drain-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="with --preserve-state: seconds each seat's turn in flight may take to finish "
        "before it is cut anyway (its message is then redelivered after the resume; default 120)",
    )
    down.add_argument(
        "--since",
        metavar="ATTEMPT",
        help="with --preserve-state: an incremental cut; each seat's bundle carries only what "
        "is new since ATTEMPT, a sealed attempt of this root the destination already holds "
        "(copy both directories side by side there)",
    )
    down.add_argument(
        "--seat",
        action="append",
        default=[],
        metavar="NAME",
        help="with --preserve-state: cut only this seat (repeatable); the rest of the mesh, the "
        "manager and the broker keep running",
    )
    down.add_argument(
        "--abort",
        action="store_true",
        help="with --preserve-state: abandon a cut whose coordinator died before its commit "
        "began (lifts the manager's fence, discards its cut-intent journal; every seat keeps "
        "running)",
    )


def run_up(args: argparse.Namespace) -> int:
    from manager.coord import mesh

    root = root_of(args)
    mesh.check_root(root)
    if args.restore:
        return _run_restore(args, root)
    _warn_waiting(root)
    result = mesh.up(
        root,
        space=args.space,
        server=args.server,
        creds=args.creds,
        detach=args.detach,
        report=progress,
        replicas=args.replicas,
    )
    if args.json:
        emit_json(result)
    elif result.get("stopped"):
        say(f"the foreground manager stopped; cotal is down in {result['root']}")
    else:
        say(f"cotal is up in {result['root']}")
        say(f"  space     {result['space']}")
        say(f"  broker    {result['server']}{' (embedded)' if result['embedded'] else ''}")
        say(f"  manager   pid {result['pid']}  instance {result['instanceId']}")
        say(f"  socket    {result['socket']}")
        say("next: cotal spawn NAME --agent scribe")
    return 0


def _run_restore(args: argparse.Namespace, root: Path) -> int:
    from manager import eventloop
    from manager.cli import results
    from manager.coord import restore
    from manager.coord.requests import RestoreRequest

    req = RestoreRequest(
        restore=args.restore,
        space=args.space,
        server=args.server,
        creds=args.creds,
        replicas=args.replicas,
        monitor=args.monitor,
        map=tuple(args.map or ()),
        trust_signer=tuple(args.trust_signer or ()),
        accept_stale_checkpoint=args.accept_stale_checkpoint,
        take_back=args.take_back,
    )
    results.restored(args.json, eventloop.run(restore.restore, req, root))
    return 0


def _run_cut(args: argparse.Namespace, root: Path) -> int:
    from manager import eventloop
    from manager.cli import results
    from manager.coord import cut
    from manager.coord.requests import CutRequest

    req = CutRequest(
        session_store=tuple(args.session_store or ()),
        drain_timeout=args.drain_timeout,
        include=tuple(args.include or ()),
        since=args.since,
        abort=args.abort,
        seat=tuple(args.seat or ()),
    )
    done = eventloop.run(cut.cut, req, root)
    if isinstance(done, cut.Sealed):
        results.cut_sealed(args.json, done)
    elif isinstance(done, cut.AlreadySealed):
        results.cut_already(args.json, done)
    else:
        results.cut_aborted(args.json, done)
    return 0


def _warn_waiting(root: Path) -> None:
    """A plain `up` beside a sealed cut (or an attempt cut short) is allowed, since the operator
    may want a fresh mesh, but never silent: the cut's seats are not among the new mesh's."""
    from manager.cli import status
    from manager.workspace.layout import Layout

    for line in status.warning_lines(status.waiting(Layout.at(root))):
        progress(line)


def run_down(args: argparse.Namespace) -> int:
    if args.abort and not args.preserve_state:
        raise Refusal(
            Code.BAD_ARGS,
            "--abort abandons a cut, and plain `cotal down` is not one",
            "run `cotal down --preserve-state --abort`",
        )
    cut_only = [
        flag
        for flag, given in (
            ("--since", args.since),
            ("--include", args.include),
            ("--session-store", args.session_store),
            ("--seat", args.seat),
        )
        if given
    ]
    if cut_only and not args.preserve_state:
        # Ignoring them would stop every seat without the checkpoint the operator asked for.
        raise Refusal(
            Code.BAD_ARGS,
            f"{', '.join(cut_only)} shape a cut, and plain `cotal down` is not one",
            "add --preserve-state, or leave them out to stop the mesh without a checkpoint",
        )
    root = root_of(args)
    if args.preserve_state:
        return _run_cut(args, root)
    from manager.coord import mesh

    try:
        result = mesh.down(root, report=progress)
    except Refusal as exc:
        if _nothing_up(root, exc):
            return _say_nothing_up(args, root)
        raise
    if args.json:
        emit_json(result)
    else:
        for seat in result.seats:
            say(
                f"stopped {seat.name} (uid {seat.lifecycle_uid}, exit {seat.exit_code}); "
                + _durable_outcome(seat)
            )
        if result.manager:
            say(f"manager pid {result.manager} proven gone")
        if result.broker:
            say(f"embedded broker pid {result.broker} proven gone")
        say("cotal is down")
    return 0


def _nothing_up(root: Path, exc: Refusal) -> bool:
    """`cotal down` with nothing up has nothing to do, which is success. Only when there is no
    mesh record at all: `not-up` can also mean a record without its control token, where an
    embedded broker may still be running and the refusal must stand."""
    from manager.workspace.layout import Layout

    return exc.code == Code.NOT_UP and not Layout.at(root).mesh.exists()


def _say_nothing_up(args: argparse.Namespace, root: Path) -> int:
    if args.json:
        emit_json(
            {"nothingUp": True, "root": str(root), "seats": [], "manager": None, "broker": None}
        )
    else:
        say(f"nothing is up in {root}")
    return 0


def _durable_outcome(seat: TeardownRow) -> str:
    if seat.durable_deleted:
        return "durable deleted"
    if not seat.footprint_owned:
        return "durable kept (not this manager's to delete)"
    return (
        f"durable NOT deleted ({seat.durable_error or 'unknown reason'}): its record is "
        "kept; once the broker is back, run cotal up and then cotal down again"
    )
