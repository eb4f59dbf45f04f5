"""`cotal`: argument parsing and output for people (or `--json` for machines). Decisions live
below this module; it only parses, calls and prints."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from manager import concurrency, logs
from manager.cli import commands
from manager.cli.commands import root_of
from manager.cli.inbox import dead_letter_id
from manager.cli.output import (
    EX_INTERNAL,
    EX_INTERRUPTED,
    EX_OK,
    EX_PIPE_CLOSED,
    EX_REFUSED,
    EX_USAGE,
    detach_stdout,
    emit_json,
    internal_error,
    progress,
    refusal,
    say,
    stdout_gone,
)
from protocol.errors import Refusal

__all__ = [
    "EX_INTERNAL",
    "EX_INTERRUPTED",
    "EX_OK",
    "EX_PIPE_CLOSED",
    "EX_REFUSED",
    "EX_USAGE",
    "build_parser",
    "emit_json",
    "main",
    "progress",
    "say",
]


class CotalParser(argparse.ArgumentParser):
    """A usage error exits 64 (EX_USAGE), so a script can tell a typo from a refusal (2)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EX_USAGE, f"{self.prog}: error: {message}\n")


class _CommandParser(CotalParser):
    """A subcommand's parser. Left to argparse, an unknown flag after a subcommand is reported by
    the top parser with the top usage; refused here, the usage shown is the subcommand's own."""

    # The stubs overload on the namespace type; this parser only ever builds its own.
    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


class _VersionAction(argparse.Action):
    """`--version`, looked up only when asked: reading the installed metadata costs every other
    command start-up time."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        # Imported here: it is a fifth of the command's own import time, and only --version
        # needs it.
        from importlib import metadata

        try:
            version = metadata.version("cotal")
        except metadata.PackageNotFoundError:
            # A source checkout on PYTHONPATH, never installed: there is no version to name.
            version = "unknown (not installed)"
        say(f"cotal {version}")
        parser.exit(EX_OK)


def _examples(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


_SPACE_HELP = "the space: the namespace this mesh uses at the broker (default: %(default)s)"
_SERVER_HELP = "use this NATS server or cluster (URLs separated by commas)"
_CREDS_HELP = "the credential for --server: an nkey user seed or a NATS .creds file"
_TRUST_HELP = "admit only checkpoints sealed by this Ed25519 key (base64; repeatable)"
# RFC 8032's first test public key: a real Ed25519 key to show the shape of one.
_EXAMPLE_KEY = "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="
_STALE_HELP = "admit a checkpoint older than its recency horizon (recorded as consent)"
_MAP_HELP = (
    "carry a seat path outside the source root: source directory OLD is at NEW here "
    "(repeatable; the source root always maps onto this root; longest OLD wins), "
    "e.g. --map /srv/shared=/data/shared"
)
_TOP_EPILOG = (
    _examples(
        "cotal up --detach",
        "cotal spawn alice --agent scribe --prompt 'Remember the phrase juniper-ledger-41'",
        "cotal send alice 'what was the phrase?' --wait",
    )
    + "\n\nexit status: 0 done (or nothing to do), 1 internal error, 2 refused (nothing changed),"
    "\n64 usage error, 130 interrupted, 141 stdout closed early. See docs/cli.md."
)


def build_parser() -> argparse.ArgumentParser:
    p = CotalParser(
        prog="cotal",
        description="Run, cut and resume AI coding-agent seats.",
        epilog=_TOP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action=_VersionAction, help="print cotal's version and exit")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--root", help="workspace root (default: $COTAL_ROOT or the current directory)"
    )
    common.add_argument(
        "--json",
        action="store_true",
        help="machine-readable output on stdout; a refusal is one JSON document on stderr",
    )
    sub = p.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        parser_class=_CommandParser,
        help="run `cotal COMMAND --help` for its flags and examples",
    )

    def command(
        parent: Any, name: str, what: str, *examples: str, common_flags: bool = True
    ) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = parent.add_parser(
            name,
            parents=[common] if common_flags else [],
            help=what,
            description=what[0].upper() + what[1:] + ".",
            epilog=_examples(*examples),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        return parser

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
    up.add_argument("--space", default="main", help=_SPACE_HELP)
    up.add_argument("--server", help=_SERVER_HELP + " instead of starting the embedded broker")
    up.add_argument("--creds", help=_CREDS_HELP)
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
        "--trust-signer", action="append", metavar="KEY", help="with --restore: " + _TRUST_HELP
    )
    up.add_argument("--accept-stale-checkpoint", action="store_true", help=_STALE_HELP)
    up.add_argument(
        "--map", action="append", metavar="OLD=NEW", help="with --restore: " + _MAP_HELP
    )
    up.add_argument(
        "--jobs",
        action=concurrency.JobsAction,
        metavar="N",
        help="how many seats the restore and this manager's cuts and adoptions work on at once "
        "(sets COTAL_JOBS; default twice the cores, 2 to 16)",
    )
    up.set_defaults(fn=commands.cmd_up)

    down = command(
        sub,
        "down",
        "stop seats, the manager and the embedded broker",
        "cotal down",
        "cotal down --preserve-state",
        "cotal down --preserve-state --session-store ~/.pi/sessions --json",
        "cotal down --preserve-state --abort",
        "cotal down --preserve-state --since 20261129T140000Z-0a1b2c3d",
    )
    down.add_argument(
        "--preserve-state",
        action="store_true",
        help="cut: keep durables, capture and seal checkpoints",
    )
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
        "--abort",
        action="store_true",
        help="with --preserve-state: abandon a cut whose coordinator died before its commit "
        "began (lifts the manager's fence, discards its cut-intent journal; every seat keeps "
        "running)",
    )
    down.set_defaults(fn=commands.cmd_down)

    mgr = command(
        sub,
        "manager",
        "the manager daemon",
        "cotal manager serve --server nats://127.0.0.1:4222 --creds .cotal/auth/broker.creds",
        common_flags=False,
    )
    mgr_sub = mgr.add_subparsers(
        dest="manager_command", required=True, metavar="COMMAND", help="what to do"
    )
    serve = command(
        mgr_sub,
        "serve",
        "run the manager in the foreground (what `cotal up --detach` starts)",
        "cotal manager serve --server nats://127.0.0.1:4222 --creds .cotal/auth/broker.creds",
    )
    serve.add_argument("--space", default="main", help=_SPACE_HELP)
    serve.add_argument(
        "--server", required=True, help="the NATS server or cluster (URLs separated by commas)"
    )
    serve.add_argument("--creds", help=_CREDS_HELP)
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
    serve.set_defaults(fn=commands.cmd_manager_serve)
    warm = command(
        mgr_sub,
        "warm",
        "a manager that imports itself, then waits on stdin for what to serve (what `cotal up` "
        "and `cotal up --restore` start early; not for people)",
        "cotal manager warm --root .",
    )
    warm.set_defaults(fn=commands.cmd_manager_warm)

    broker = command(
        sub,
        "broker",
        "a standalone embedded broker",
        "cotal broker serve --store-dir /srv/broker",
        common_flags=False,
    )
    broker_sub = broker.add_subparsers(
        dest="broker_command", required=True, metavar="COMMAND", help="what to do"
    )
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
    bserve.set_defaults(fn=commands.cmd_broker_serve)

    spawn = command(
        sub,
        "spawn",
        "start a seat",
        "cotal spawn alice --agent scribe --prompt 'Remember the phrase juniper-ledger-41'",
        "cotal spawn bob --agent pi --model fake-model --cwd ../service",
        "cotal spawn carol --agent claude --resume 0f8c2d4e-...",
    )
    spawn.add_argument("name", help="the seat's name: letters, digits and _")
    spawn.add_argument(
        "--agent",
        default="scribe",
        help="the harness: pi | claude | jcode | scribe (default: %(default)s)",
    )
    spawn.add_argument(
        "--prompt",
        help="the seat's first turn; neither empty nor starting with '-' or '@'",
    )
    spawn.add_argument("--model", help="the model the harness uses (default: the connector's)")
    spawn.add_argument(
        "--cwd", metavar="DIR", help="the seat's working directory (default: the root)"
    )
    spawn.add_argument("--resume", metavar="SESSION", help="fork from an existing harness session")
    spawn.set_defaults(fn=commands.cmd_spawn)

    ps = command(sub, "ps", "list seats", "cotal ps", "cotal ps --wide", "cotal ps --json")
    ps.add_argument(
        "--wide",
        action="store_true",
        help="add pid, cwd, lifecycle uid, instance id, session id, continuity, start instant,"
        " last exit and reason",
    )
    ps.set_defaults(fn=commands.cmd_ps)

    send = command(
        sub,
        "send",
        "send a direct message to a seat",
        "cotal send alice 'what was the phrase?' --wait",
        "cotal send alice 'run the tests' --wait --timeout 600",
        "cotal send alice 'hello' --server nats://10.0.0.5:4222 --creds broker.creds",
    )
    send.add_argument("name", help="the seat to send to")
    send.add_argument("text", help="the message")
    send.add_argument("--wait", action="store_true", help="print the seat's reply")
    send.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="seconds --wait waits for a clean turn (default: %(default)s)",
    )
    send.add_argument(
        "--server", help="queue directly at this broker (for a seat that is cut); no --wait"
    )
    send.add_argument("--creds", help="with --server: " + _CREDS_HELP)
    send.add_argument("--space", default="main", help="with --server: " + _SPACE_HELP)
    send.set_defaults(fn=commands.cmd_send)

    stop = command(
        sub,
        "stop",
        "stop one seat and keep it: its inbox, session and custody stay",
        "cotal stop alice",
        "cotal stop alice --json",
    )
    stop.add_argument("name", help="the seat to stop")
    stop.set_defaults(fn=commands.cmd_stop)

    start = command(
        sub,
        "start",
        "start a stopped seat again: same lifecycle uid, same session",
        "cotal start alice",
    )
    start.add_argument("name", help="the stopped seat to start")
    start.set_defaults(fn=commands.cmd_start)

    restart = command(
        sub,
        "restart",
        "stop one seat, prove the exit, and start it again in the same session",
        "cotal restart alice",
    )
    restart.add_argument("name", help="the seat to restart")
    restart.set_defaults(fn=commands.cmd_restart)

    rm = command(
        sub,
        "rm",
        "remove one seat: stop it if running, then delete its durable, custody and session pointer",
        "cotal rm alice",
    )
    rm.add_argument("name", help="the seat to remove")
    rm.set_defaults(fn=commands.cmd_rm)

    inbox = command(
        sub,
        "inbox",
        "a seat's dead letters: list them, put one back into its inbox, or drop one",
        "cotal inbox alice",
        "cotal inbox alice --redeliver 7",
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
        "--drop", type=dead_letter_id, metavar="ID", help="delete dead letter ID for good"
    )
    inbox.set_defaults(fn=commands.cmd_inbox)

    status = command(
        sub,
        "status",
        "what is up in this root (manager, broker, seats) and what is waiting (a sealed cut)",
        "cotal status",
        "cotal status --json",
    )
    status.set_defaults(fn=commands.cmd_status)

    doctor = command(
        sub,
        "doctor",
        "which harnesses are installed and usable",
        "cotal doctor",
        "cotal doctor --json",
    )
    doctor.set_defaults(fn=commands.cmd_doctor)

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
        type=commands.parse_since,
        metavar="T",
        help="only events at or after T: an instant (2026-12-01T13:00:00Z) or a duration back "
        "from now (30s, 10m, 2h, 1d)",
    )
    logs_cmd.add_argument(
        "--transcript",
        action="store_true",
        help="print SEAT's conversation as its harness stored it (scribe, pi, claude)",
    )
    logs_cmd.set_defaults(fn=commands.cmd_logs)

    tools_cmd = command(
        sub,
        "tools",
        "the pinned harness programs (pi, Claude Code) in the tools directory",
        "cotal tools install",
        common_flags=False,
    )
    tools_sub = tools_cmd.add_subparsers(
        dest="tools_command", required=True, metavar="COMMAND", help="what to do"
    )
    tools_install = command(
        tools_sub,
        "install",
        "install the pinned versions with npm into $COTAL_TOOLS_DIR, a checkout's .tools, else"
        " the user data directory (or confirm they are there)",
        "cotal tools install",
        "cotal tools install pi",
        "COTAL_TOOLS_DIR=/opt/cotal-tools cotal tools install",
        common_flags=False,
    )
    tools_install.add_argument(
        "names", nargs="*", metavar="NAME", help="only these harnesses (default: every pin)"
    )
    tools_install.set_defaults(fn=commands.cmd_tools)

    ckpt = command(
        sub,
        "checkpoint",
        "sealed checkpoints",
        "cotal checkpoint verify /carried/20261129T142434Z-9356e4ba --server URL --creds FILE",
        common_flags=False,
    )
    ckpt_sub = ckpt.add_subparsers(
        dest="checkpoint_command", required=True, metavar="COMMAND", help="what to do"
    )
    verify = command(
        ckpt_sub,
        "verify",
        "run the admission gates; change nothing",
        "cotal checkpoint verify /carried/20261129T142434Z-9356e4ba --server nats://10.0.0.5:4222"
        " --creds broker.creds",
        "cotal checkpoint verify .cotal/maintenance/v1/checkpoints/20261129T142434Z-9356e4ba"
        " --json --server nats://10.0.0.5:4222 --creds broker.creds",
    )
    verify.add_argument("dir", metavar="DIR", help="the sealed attempt directory")
    verify.add_argument("--accept-stale-checkpoint", action="store_true", help=_STALE_HELP)
    verify.add_argument("--server", help="the broker to ask whether each uid is live")
    verify.add_argument("--trust-signer", action="append", metavar="KEY", help=_TRUST_HELP)
    verify.add_argument(
        "--space",
        default="main",
        help="the space whose instance key pins a root's own cut (default: %(default)s)",
    )
    verify.add_argument("--creds", help=_CREDS_HELP)
    verify.add_argument("--map", action="append", metavar="OLD=NEW", help=_MAP_HELP)
    verify.set_defaults(fn=commands.cmd_checkpoint_verify)
    pack = command(
        ckpt_sub,
        "pack",
        "pack a sealed cut into one file to carry away, and hand its seats off: this root will"
        " not resume them from it (--take-back overrides)",
        "cotal checkpoint pack .cotal/maintenance/v1/checkpoints/20261129T142434Z-9356e4ba"
        " -o /carried/20261129T142434Z-9356e4ba.tar",
        "cotal checkpoint pack .cotal/maintenance/v1/checkpoints/20261129T142434Z-9356e4ba"
        " -o ckpt.tar --server nats://10.0.0.5:4222 --creds broker.creds --json",
    )
    pack.add_argument("dir", metavar="DIR", help="the sealed attempt directory this root cut")
    pack.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE",
        help="the packed file to write (never overwritten); its sha256 is printed",
    )
    pack.add_argument(
        "--server",
        help="the broker that holds these seats' custody (default: the one this root's mesh "
        "record names; an embedded one is started briefly from this root's store)",
    )
    pack.add_argument("--creds", help=_CREDS_HELP)
    pack.add_argument(
        "--space",
        default="main",
        help="the space whose instance key pins this root's own cut (default: %(default)s)",
    )
    pack.set_defaults(fn=commands.cmd_checkpoint_pack)
    clist = command(
        ckpt_sub,
        "list",
        "list this root's checkpoints: state, seats, bytes, created, hand-off and journal",
        "cotal checkpoint list",
        "cotal checkpoint list --json",
    )
    clist.set_defaults(fn=commands.cmd_checkpoint_list)
    cdiscard = command(
        ckpt_sub,
        "discard",
        "remove a sealed or failed checkpoint of this root (and the journal of a sealed cut"
        " not restored); refused while an attempt under way still needs it",
        "cotal checkpoint discard 20261129T142434Z-9356e4ba",
        "cotal checkpoint discard 20261129T142434Z-9356e4ba.partial-20261129T142500Z --json",
    )
    cdiscard.add_argument(
        "attempt",
        metavar="ATTEMPT",
        help="the checkpoint's name as `cotal checkpoint list` shows it",
    )
    cdiscard.set_defaults(fn=commands.cmd_checkpoint_discard)

    trust_cmd = command(
        sub,
        "trust",
        "the checkpoint signers this root admits besides its own manager",
        f"cotal trust add {_EXAMPLE_KEY} --name host-a",
        "cotal trust list",
        "cotal trust remove host-a",
        common_flags=False,
    )
    trust_sub = trust_cmd.add_subparsers(
        dest="trust_command", required=True, metavar="COMMAND", help="what to do"
    )
    tadd = command(
        trust_sub,
        "add",
        "trust a manager's checkpoint signing key (compare it with `cotal status` there first)",
        f"cotal trust add {_EXAMPLE_KEY} --name host-a",
        f"cotal trust add {_EXAMPLE_KEY} --name host-a --json",
    )
    tadd.add_argument(
        "key",
        metavar="KEY",
        help="the signer's raw Ed25519 public key, base64, as an untrusted-signer refusal or "
        "`cotal status` on the source prints it",
    )
    tadd.add_argument(
        "--name",
        help="a label for the signer, e.g. the source host or its instance id "
        "(default: signer-<hex of the key's digest>)",
    )
    tadd.set_defaults(fn=commands.cmd_trust_add)
    tlist = command(
        trust_sub,
        "list",
        "list the trusted signers: name, fingerprint and key",
        "cotal trust list",
        "cotal trust list --json",
    )
    tlist.set_defaults(fn=commands.cmd_trust_list)
    tremove = command(
        trust_sub,
        "remove",
        "stop trusting a signer",
        "cotal trust remove host-a",
        f"cotal trust remove {_EXAMPLE_KEY}",
    )
    tremove.add_argument("signer", metavar="KEY|NAME", help="the signer's key or its name")
    tremove.set_defaults(fn=commands.cmd_trust_remove)
    return p


# -- running ------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit status (see output.EX_*); never a traceback unless
    COTAL_DEBUG=1."""
    try:
        code = _main(argv)
        # Flushed here rather than at interpreter exit, where a closed pipe could only be
        # reported as "Exception ignored" with a status of 120.
        sys.stdout.flush()
    except BrokenPipeError:
        detach_stdout()
        return EX_PIPE_CLOSED
    except KeyboardInterrupt:
        return EX_INTERRUPTED
    return code


def run() -> NoReturn:
    """The `cotal` command as a process: `main`, then an exit that skips the interpreter's own
    teardown. Every command has closed what it wrote and `main` flushed its output; finalizing
    modules and threads adds tens of milliseconds to every command and gives nothing back."""
    code = main()
    try:
        sys.stderr.flush()
    except OSError:
        pass
    os._exit(code)


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        # --help, --version and usage errors: returned, so the flush in main() covers them too.
        return exc.code if isinstance(exc.code, int) else EX_USAGE
    if not (args.command == "manager"):
        logs.quiet()
    as_json = bool(getattr(args, "json", False))
    try:
        return int(args.fn(args))
    except Refusal as exc:
        if _nothing_up(args, exc):
            return _say_nothing_up(args)
        refusal(exc, as_json=as_json)
        return EX_REFUSED
    except Exception as exc:
        if isinstance(exc, BrokenPipeError) and stdout_gone():
            raise
        # The daemon's stderr is its log file: a traceback there is the report.
        if os.environ.get("COTAL_DEBUG") == "1" or args.command == "manager":
            raise
        internal_error(exc, as_json=as_json)
        return EX_INTERNAL


def _nothing_up(args: argparse.Namespace, exc: Refusal) -> bool:
    """`cotal down` with nothing up has nothing to do, which is success. Only when there is no
    mesh record at all: `not-up` can also mean a record without its control token, where an
    embedded broker may still be running and the refusal must stand."""
    from manager.workspace.layout import Layout

    return (
        args.command == "down"
        and not args.preserve_state
        and exc.code == "not-up"
        and not Layout.at(root_of(args)).mesh.exists()
    )


def _say_nothing_up(args: argparse.Namespace) -> int:
    root = root_of(args)
    if args.json:
        emit_json(
            {"nothingUp": True, "root": str(root), "seats": [], "manager": None, "broker": None}
        )
    else:
        say(f"nothing is up in {root}")
    return EX_OK


if __name__ == "__main__":
    sys.exit(main())
