"""`cotal manager serve|warm` and `cotal broker serve`: the long-lived processes, run in the
foreground. `cotal manager serve` is the one place the CLI hands its process to the daemon
(`manager.daemon.serve`); it is how `cotal up` and a service manager start a manager.

`main` imports every command module to build its parser, so the daemon, the sandbox probe, the
warm hand-over and the mesh are imported by the handler that runs them, never at this module's
top."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import msgspec

from manager import eventloop
from manager.cli.args import CREDS_HELP, SPACE_HELP, Subcommands, command, root_of, subcommands
from manager.cli.args import top as top_parser
from manager.cli.output import EX_USAGE, say
from protocol import names
from protocol.errors import Refusal
from protocol.refusals import Code


def register(sub: Subcommands) -> None:
    _register_manager(sub)
    _register_broker(sub)


def _register_manager(sub: Subcommands) -> None:
    mgr = command(
        sub,
        "manager",
        "the manager daemon",
        "cotal manager serve --server nats://127.0.0.1:4222 --creds .cotal/auth/broker.creds",
        common_flags=False,
    )
    mgr_sub = subcommands(mgr, "manager_command")
    serve = command(
        mgr_sub,
        "serve",
        "run the manager in the foreground (what `cotal up --detach` starts)",
        "cotal manager serve --server nats://127.0.0.1:4222 --creds .cotal/auth/broker.creds",
    )
    serve.add_argument("--space", default="main", help=SPACE_HELP)
    serve.add_argument(
        "--server", required=True, help="the NATS server or cluster (URLs separated by commas)"
    )
    serve.add_argument("--creds", help=CREDS_HELP)
    serve.add_argument(
        "--resume-attempt",
        metavar="ATTEMPT",
        help="start fenced, admitting only this attempt's resume",
    )
    serve.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="JetStream replicas for streams and buckets (default: %(default)s)",
    )
    serve.set_defaults(run=run_manager_serve)
    warm = command(
        mgr_sub,
        "warm",
        "a manager that imports itself, then waits on stdin for what to serve (what `cotal up` "
        "and `cotal up --restore` start early; not for people)",
        "cotal manager warm --root .",
    )
    warm.set_defaults(run=run_manager_warm)


def _register_broker(sub: Subcommands) -> None:
    broker = command(
        sub,
        "broker",
        "a standalone embedded broker",
        "cotal broker serve --store-dir /srv/broker",
        common_flags=False,
    )
    broker_sub = subcommands(broker, "broker_command")
    bserve = command(
        broker_sub,
        "serve",
        "run a broker several roots can share, until SIGINT or SIGTERM",
        "cotal broker serve --store-dir /srv/broker",
        "cotal broker serve --store-dir /srv/broker --port 4222 --json",
    )
    bserve.add_argument(
        "--store-dir",
        required=True,
        metavar="DIR",
        help="where the broker keeps its JetStream store and writes its credential",
    )
    bserve.add_argument(
        "--port", type=int, default=-1, help="the port to listen on (default: a free port)"
    )
    bserve.add_argument(
        "--grants",
        action="append",
        metavar="SPACE",
        help="a space the grants cover from the start (repeatable; every space is covered "
        "once its first manager connects, so this is never needed; docs/operations.md, "
        "'Broker grants')",
    )
    bserve.add_argument(
        "--no-grants",
        action="store_true",
        help="one broker user with every right, shared by every host: no scoping of a host's "
        "credential to the seats it holds (a store that ran with grants keeps them)",
    )
    bserve.set_defaults(run=run_broker_serve)
    _register_hosts(broker_sub)


def _register_hosts(broker_sub: Subcommands) -> None:
    add = command(
        broker_sub,
        "add-host",
        "make and register a broker credential for a host's managers (its managers join it)",
        "cotal broker add-host --store-dir /srv/broker hostb",
    )
    add.add_argument("--store-dir", required=True, metavar="DIR", help="the broker's store")
    add.add_argument("name", help="the host's name in the registry")
    add.add_argument(
        "--holder",
        action="append",
        default=[],
        metavar="INSTANCE",
        help="a manager instance id counted as the host's ahead of its manager's own join "
        "(repeatable; never needed)",
    )
    add.set_defaults(run=run_add_host)
    revoke = command(
        broker_sub,
        "revoke-host",
        "drop a host's broker credential: its connections are closed and refused",
        "cotal broker revoke-host --store-dir /srv/broker hostb",
    )
    revoke.add_argument("--store-dir", required=True, metavar="DIR", help="the broker's store")
    revoke.add_argument("name", help="the host's name in the registry")
    revoke.set_defaults(run=run_revoke_host)


def run_manager_serve(args: argparse.Namespace) -> int:
    from connectors import sandbox

    # The isolation probe is a child interpreter of its own: started before the daemon's
    # imports, it is done by the time the daemon asks, instead of adding its start to every
    # manager start.
    sandbox.begin_probe()
    from manager.daemon import serve as daemon

    creds = Path(args.creds).resolve() if args.creds else None
    if args.resume_attempt:
        names.check_attempt_id(args.resume_attempt)
    eventloop.run(
        daemon.serve,
        root_of(args),
        args.space,
        args.server,
        creds,
        args.resume_attempt,
        args.replicas,
    )
    # Every `cotal down` and every cut waits for this process to be gone. Once serve returned,
    # what it owns is closed and its log is written (line-buffered), so the interpreter's own
    # teardown (module and thread finalization, about 60 ms) only delays that proof.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_manager_warm(args: argparse.Namespace) -> int:
    """A manager's interpreter with its imports done, waiting for the coordinator that started
    it to say what to serve (manager/coord/warm.py)."""
    from connectors import sandbox

    sandbox.begin_probe()
    from manager.coord import warm
    from manager.daemon import serve  # noqa: F401 - importing it now is the point

    try:
        go = warm.read_go(sys.stdin.buffer)
    except (ValueError, msgspec.DecodeError) as exc:
        # stderr is /dev/null until `go`: the coordinator sees this exit and starts cold.
        say(f"warm manager: {exc}")
        return 2
    if go is None:
        # The coordinator refused or died before it needed a manager.
        return 0
    warm.become(go)
    # `read_go` admits only `manager serve ...`, so this module's own commands parse it; the
    # top of the CLI is never imported back from here.
    parser, sub = top_parser()
    register(sub)
    try:
        served = parser.parse_args(go.argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EX_USAGE
    return int(served.run(served))


def run_broker_serve(args: argparse.Namespace) -> int:
    from manager.coord import mesh

    if args.grants and args.no_grants:
        raise Refusal(
            Code.BAD_ARGS,
            "--grants and --no-grants contradict each other",
            "pass one of them (grants are on by default)",
        )
    if args.grants:
        # Read by the embedded start (manager/broker/embedded.py, `grant_mode`).
        os.environ["COTAL_BROKER_GRANTS"] = ",".join(names.check_space(s) for s in args.grants)
    return mesh.broker_serve(
        Path(args.store_dir).resolve(),
        port=args.port,
        as_json=args.json,
        say=say,
        grants=not args.no_grants,
    )


def run_add_host(args: argparse.Namespace) -> int:
    from manager.broker import grants

    for holder in args.holder:
        names.check_lifecycle_uid(holder)  # the same token rule as an instance id
    gdir = grants.grants_dir(Path(args.store_dir).resolve())
    # On a broker that ran with one host alone this starts its grant keeper.
    creds = grants.add_host_live(gdir, args.name, args.holder)
    if args.json:
        print(json.dumps({"host": args.name, "creds": str(creds), "holders": args.holder}))
    else:
        say(f"creds   {creds}")
        say("copy it to the host (0600) and pass it there as --creds; the grant keeper picks the")
        say("host up within a second")
    return 0


def run_revoke_host(args: argparse.Namespace) -> int:
    from manager.broker import grants

    gdir = grants.grants_dir(Path(args.store_dir).resolve())
    if not grants.revoke_host_live(gdir, args.name):
        say(f"no host {args.name} in {grants.hosts_file(gdir)}")
        return 1
    say(f"revoked {args.name}: the broker drops its connections at the keeper's next reload")
    return 0
