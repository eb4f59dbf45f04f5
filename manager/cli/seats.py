"""`cotal spawn|ps|send|stop|start|restart|rm`: one seat's life, asked of the manager over its
control socket and printed for people (or `--json` for machines).

`main` imports every command module to build its parser, so the mesh (the control client, the
broker's code) is imported by the handler that calls it, never at this module's top."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import msgspec

from manager import eventloop, registry
from manager.cli.args import CREDS_HELP, SPACE_HELP, Subcommands, command, root_of, subcommands
from manager.cli.output import age, emit_json, format_table, progress, say
from protocol import control
from protocol.errors import Refusal
from protocol.refusals import Code

A = TypeVar("A")
R = TypeVar("R")


def register(sub: Subcommands) -> None:
    for add in (_spawn, _ps, _send, _stop, _start, _restart, _rm, _budget):
        add(sub)


def _spawn(sub: Subcommands) -> None:
    spawn = command(
        sub,
        "spawn",
        "start a seat",
        "cotal spawn alice --agent scribe --prompt 'Remember the phrase juniper-ledger-41'",
        "cotal spawn bob --agent pi --model fake-model --cwd ../service",
        "cotal spawn carol --agent claude --resume 0f8c2d4e-...",
        "cotal spawn planner --allow-send coder_1 --allow-send coder_2",
        "cotal spawn reviewer --subscribe plan --allow-post review",
    )
    spawn.add_argument("name", help="the seat's name: letters, digits and _")
    spawn.add_argument(
        "--agent",
        default=registry.DEFAULT_AGENT,
        help=f"the harness: {' | '.join(registry.KNOWN)} (default: %(default)s)",
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
    _spawn_permissions(spawn)
    spawn.set_defaults(run=run_spawn)


def _spawn_permissions(spawn: argparse.ArgumentParser) -> None:
    """Whom the seat may send to, and which channels it hears and may post to."""
    spawn.add_argument(
        "--allow-send",
        action="append",
        default=[],
        metavar="SEAT",
        help="a seat this one may send direct messages to, or '*' for every other seat "
        "(repeatable; default: none, so the seat can only answer the operator)",
    )
    spawn.add_argument(
        "--subscribe",
        action="append",
        default=[],
        metavar="CHANNEL",
        help="a channel whose posts this seat gets as turns (repeatable; default: none)",
    )
    spawn.add_argument(
        "--allow-post",
        action="append",
        default=[],
        metavar="CHANNEL",
        help="a channel this seat may post to (repeatable; default: none)",
    )


def _ps(sub: Subcommands) -> None:
    ps = command(
        sub,
        "ps",
        "list seats",
        "cotal ps",
        "cotal ps --wide",
        "cotal ps --json",
        "cotal ps --fleet",
    )
    ps.add_argument(
        "--wide",
        action="store_true",
        help="add pid, cwd, lifecycle uid, instance id, session id, continuity, start instant,"
        " last exit, tokens (in/out), estimated cost (from [prices] in cotal.toml) and reason",
    )
    ps.add_argument(
        "--fleet",
        action="store_true",
        help="every seat of every manager on this root's broker: name, instance, host label, "
        "state, custody generation (read at the broker; --wide has no effect)",
    )
    ps.set_defaults(run=run_ps)


def _send(sub: Subcommands) -> None:
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
    send.add_argument("--creds", help="with --server: " + CREDS_HELP)
    send.add_argument("--space", default="main", help="with --server: " + SPACE_HELP)
    send.set_defaults(run=run_send)


def _stop(sub: Subcommands) -> None:
    stop = command(
        sub,
        "stop",
        "stop one seat and keep it: its inbox, session and custody stay",
        "cotal stop alice",
        "cotal stop alice --json",
    )
    stop.add_argument("name", help="the seat to stop")
    stop.set_defaults(run=run_stop)


def _start(sub: Subcommands) -> None:
    start = command(
        sub,
        "start",
        "start a stopped seat again: same lifecycle uid, same session",
        "cotal start alice",
    )
    start.add_argument("name", help="the stopped seat to start")
    start.set_defaults(run=run_start)


def _restart(sub: Subcommands) -> None:
    restart = command(
        sub,
        "restart",
        "stop one seat, prove the exit, and start it again in the same session",
        "cotal restart alice",
    )
    restart.add_argument("name", help="the seat to restart")
    restart.set_defaults(run=run_restart)


def _rm(sub: Subcommands) -> None:
    rm = command(
        sub,
        "rm",
        "remove one seat: stop it if running, then delete its durable, custody and session pointer",
        "cotal rm alice",
    )
    rm.add_argument("name", help="the seat to remove")
    rm.set_defaults(run=run_rm)


def _budget(sub: Subcommands) -> None:
    budget = command(
        sub,
        "budget",
        "a seat's budget ([budget] in cotal.toml): lift it for a seat that reached it",
        "cotal budget lift alice",
        common_flags=False,
    )
    budget_sub = subcommands(budget, "budget_command")
    lift = command(
        budget_sub,
        "lift",
        "waive the limits a seat has reached for the rest of their window: delivery resumes",
        "cotal budget lift alice",
        "cotal budget lift alice --json",
    )
    lift.add_argument("name", help="the seat at its budget")
    lift.set_defaults(run=run_budget_lift)


# How long a spawn or a start waits for its reply: past the longest readiness window a root may
# set (`[launch] ready_timeout_s`), so the manager's `seat-not-ready`, which names the seat's
# log, reaches the operator rather than this command's own timeout. A restart stops the old
# incarnation first.
LAUNCH_WAIT_S = registry.READY_TIMEOUT_LIMIT_S + 30.0
RESTART_WAIT_S = LAUNCH_WAIT_S + 30.0


def _request(root: Path, op: control.Op[A, R], args: A, *, timeout: float = 60.0) -> R:
    from manager.control.oneshot import run_request

    return run_request(root, op, args, timeout)


# -- spawn --------------------------------------------------------------------------------------


def check_prompt(prompt: str) -> str:
    """The documented `bad-prompt` rule, checked before the manager is asked. The connectors keep
    their own check: the daemon is not only reached through this CLI."""
    if not prompt.strip():
        raise Refusal(
            Code.BAD_PROMPT,
            "the prompt is empty",
            "pass the text the seat should start with, or leave --prompt out",
        )
    if prompt.startswith(("-", "@")):
        raise Refusal(
            Code.BAD_PROMPT,
            "refusing a prompt starting with '-' or '@' (the harness would parse it as an option"
            " or a file)",
            "reword the prompt so it does not start with '-' or '@'",
        )
    return prompt


def run_spawn(args: argparse.Namespace) -> int:
    spawn = control.SpawnArgs(
        name=args.name,
        agent=args.agent,
        prompt=check_prompt(args.prompt) if args.prompt is not None else None,
        model=args.model or None,
        cwd=str(Path(args.cwd).resolve()) if args.cwd else None,
        resume=args.resume or None,
        allow_send=list(args.allow_send),
        subscribe=list(args.subscribe),
        allow_post=list(args.allow_post),
    )
    row = _request(root_of(args), control.SPAWN, spawn, timeout=LAUNCH_WAIT_S)
    if args.json:
        emit_json(row)
    else:
        say(f"spawned {row.name} ({row.agent}) pid {row.pid} uid {row.lifecycle_uid}")
        say(f"  session {row.session_id}  continuity {row.continuity}")
    for gap in _isolation_gaps(row.isolation):
        progress(f"warning: seat isolation {row.isolation}: {gap}")
    warning = _cut_warning(Path(row.cwd))
    if warning:
        progress(warning)
    return 0


def _isolation_gaps(mode: str | None) -> list[str]:
    """What a seat's isolation lacks, said with what it means (connectors/sandbox.py)."""
    from connectors import sandbox

    return sandbox.missing_from(mode)


def _cut_warning(cwd: Path) -> str | None:
    """Said at spawn, when it is cheap to act on, rather than at the cut, which refuses such a
    seat by name (`not-a-repository`, `not-top-level`)."""
    import subprocess

    try:
        probe = subprocess.run(
            ["git", "-C", str(cwd), "rev-parse", "--is-inside-work-tree", "--show-toplevel"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        lines = probe.stdout.splitlines() if probe.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        lines = []
    if not lines or lines[0] != "true":
        return (
            f"warning: {cwd} is not a git repository: this seat cannot be cut (cotal down "
            "--preserve-state refuses it); use a git work tree or accept that it cannot move"
        )
    top = Path(lines[1]).resolve() if len(lines) > 1 else None
    if top is not None and top != cwd.resolve():
        return (
            f"warning: {cwd} is inside the git repository at {top} but not its top level: this "
            "seat cannot be cut (cotal down --preserve-state refuses it); run it at the top "
            "level or accept that it cannot move"
        )
    return None


# -- ps -----------------------------------------------------------------------------------------

# Each column is a field of `control.SeatRow`, or one `run_ps` derives from it.
PS_COLUMNS = [
    ("NAME", "name"),
    ("AGENT", "agent"),
    ("STATE", "state"),
    ("TURN", "turn"),
    ("UPTIME", "uptime"),
    ("RESTARTS", "restarts"),
    ("DEAD", "dead_letters"),
]
PS_WIDE = [
    ("PID", "pid"),
    ("CWD", "cwd"),
    ("LIFECYCLE UID", "lifecycle_uid"),
    ("INSTANCE", "instance_id"),
    ("SESSION", "session_id"),
    ("CONTINUITY", "continuity"),
    ("ISOLATION", "isolation"),
    ("MODE", "permission_mode"),
    ("SENDS TO", "sends_to"),
    ("SUBSCRIBES", "subscribes"),
    ("POSTS TO", "posts_to"),
    ("STARTED", "started_at"),
    ("LAST EXIT", "last_exit"),
    ("TOKENS", "tokens"),
    ("COST", "cost"),
    ("REASON", "reason"),
]


def run_ps(args: argparse.Namespace) -> int:
    if args.fleet:
        from manager.cli.fleet import run_fleet

        return run_fleet(args)
    rows = _request(root_of(args), control.PS, control.NoArgs())
    if args.json:
        for row in rows:
            emit_json(row)
        return 0
    if not rows:
        say("no seats")
        return 0
    now = datetime.now(UTC)
    shown = [
        {
            **msgspec.structs.asdict(row),
            "turn": "busy" if row.busy else ("at budget" if row.budget else "idle"),
            "uptime": age(row.started_at, now) if row.state == "running" else None,
            "sends_to": ",".join(row.allow_send) or None,
            "subscribes": ",".join(f"#{c}" for c in row.subscribe) or None,
            "posts_to": ",".join(f"#{c}" for c in row.allow_post) or None,
            "tokens": _tokens(row),
            "cost": f"${row.cost_usd:.4f}" if row.cost_usd is not None else None,
        }
        for row in rows
    ]
    say(format_table(shown, PS_COLUMNS + (PS_WIDE if args.wide else [])))
    if not args.wide:
        # A seat its manager killed itself (`[failover]`) says why even without --wide.
        for row in rows:
            if row.reason is not None and row.reason.startswith("self-fenced"):
                say(f"{row.name}: {row.reason}")
    # A seat at its budget says why, and how it resumes.
    for row in rows:
        if row.budget is not None:
            say(f"{row.name}: {row.budget}")
    if args.wide:
        modes = sorted({r.isolation for r in rows if r.isolation})
        for mode in modes:
            for gap in _isolation_gaps(mode):
                say(f"isolation {mode}: {gap}")
    return 0


def _tokens(row: control.SeatRow) -> str | None:
    """`IN/OUT`: every input token the seat's turns used (cache reads and writes included) and
    their output, as its harness reported them; None when it reported none."""
    if row.tokens_in is None or row.tokens_out is None:
        return None
    return f"{row.tokens_in}/{row.tokens_out}"


# -- send ---------------------------------------------------------------------------------------


def run_send(args: argparse.Namespace) -> int:
    if args.server:
        from manager.coord import mesh

        if args.wait:
            raise Refusal(
                Code.BAD_ARGS,
                "--wait needs a running manager; with --server the message is only queued",
                "drop --wait, or send through the manager without --server",
            )
        creds = Path(args.creds).resolve() if args.creds else None
        result = eventloop.run(
            mesh.publish_direct, args.server, creds, args.space, args.name, args.text
        )
        if args.json:
            emit_json(result)
        elif result["message"] is not None:
            # The seat is lost (`cotal ps --fleet`): queued, for a host that is gone.
            say(
                f"{result['message']}: {result['id']} for {result['seat']} at the broker"
                f" (stream seq {result['seq']})"
            )
        else:
            say(
                f"queued {result['id']} for {result['seat']} at the broker"
                f" (stream seq {result['seq']})"
            )
        return 0
    send = control.SendArgs(name=args.name, text=args.text, wait=args.wait, timeout_s=args.timeout)
    sent = _request(root_of(args), control.SEND, send, timeout=args.timeout + 10)
    if args.json:
        emit_json(sent)
    elif args.wait:
        say(sent.reply if isinstance(sent.reply, str) else "")
    else:
        say(f"queued {sent.id} for {sent.seat} (stream seq {sent.seq})")
    return 0


# -- stop, start, restart, rm -------------------------------------------------------------------


def run_stop(args: argparse.Namespace) -> int:
    stopped = _request(root_of(args), control.STOP_SEAT, control.StopSeatArgs(name=args.name))
    if args.json:
        emit_json(stopped)
    elif stopped.already_stopped:
        say(f"{stopped.name} was already stopped (last exit {stopped.last_exit})")
    else:
        say(
            f"stopped {stopped.name} (uid {stopped.lifecycle_uid}, exit {stopped.last_exit});"
            f" kept: inbox, session and custody stay (`cotal start {stopped.name}` brings it"
            f" back, `cotal rm {stopped.name}` removes it)"
        )
    return 0


def _started(row: control.SeatRow, verb: str) -> None:
    say(
        f"{verb} {row.name} ({row.agent}) pid {row.pid} uid {row.lifecycle_uid}"
        f" restarts {row.restarts}"
    )
    say(f"  session {row.session_id}  continuity {row.continuity}")


def run_start(args: argparse.Namespace) -> int:
    start = control.StartSeatArgs(name=args.name)
    row = _request(root_of(args), control.START_SEAT, start, timeout=LAUNCH_WAIT_S)
    if args.json:
        emit_json(row)
    elif row.already_running:
        say(f"{row.name} is already running (pid {row.pid})")
    else:
        _started(row, "started")
    return 0


def run_restart(args: argparse.Namespace) -> int:
    restart = control.RestartSeatArgs(name=args.name)
    row = _request(root_of(args), control.RESTART_SEAT, restart, timeout=RESTART_WAIT_S)
    if args.json:
        emit_json(row)
    else:
        _started(row, "restarted")
    return 0


def run_budget_lift(args: argparse.Namespace) -> int:
    reply = _request(root_of(args), control.BUDGET_LIFT, control.BudgetLiftArgs(name=args.name))
    if args.json:
        emit_json(reply)
    elif not reply.lifted:
        say(f"{reply.name} is not at its budget; nothing to lift")
    else:
        for limit, until in zip(reply.lifted, reply.resets_at, strict=True):
            say(f"lifted {limit} for {reply.name} until {until}; delivery resumes")
    return 0


def run_rm(args: argparse.Namespace) -> int:
    removed = _request(root_of(args), control.REMOVE_SEAT, control.RemoveSeatArgs(name=args.name))
    if args.json:
        emit_json(removed)
    elif removed.footprint_deleted:
        dead = removed.dead_letters_deleted
        say(
            f"removed {removed.name} (uid {removed.lifecycle_uid}, exit {removed.last_exit});"
            " durable, custody record and session pointer deleted"
            + (f", and {dead} dead letter(s)" if dead else "")
        )
    else:
        say(
            f"removed {removed.name} (uid {removed.lifecycle_uid}) from this manager; its "
            "durable and custody record belong to their new holder and were kept"
        )
    return 0
