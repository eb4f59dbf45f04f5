"""`cotal spawn|ps|send|stop|start|restart|rm`: one seat's life, asked of the manager over its
control socket and printed for people (or `--json` for machines).

`main` imports every command module to build its parser, so the mesh (the control client, the
broker's code) is imported by the handler that calls it, never at this module's top."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from manager import eventloop
from manager.cli.args import CREDS_HELP, SPACE_HELP, Subcommands, command, root_of
from manager.cli.output import emit_json, format_table, progress, say
from protocol.errors import Refusal
from protocol.instant import parse_instant


def register(sub: Subcommands) -> None:
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
    spawn.set_defaults(run=run_spawn)

    ps = command(sub, "ps", "list seats", "cotal ps", "cotal ps --wide", "cotal ps --json")
    ps.add_argument(
        "--wide",
        action="store_true",
        help="add pid, cwd, lifecycle uid, instance id, session id, continuity, start instant,"
        " last exit and reason",
    )
    ps.set_defaults(run=run_ps)

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

    stop = command(
        sub,
        "stop",
        "stop one seat and keep it: its inbox, session and custody stay",
        "cotal stop alice",
        "cotal stop alice --json",
    )
    stop.add_argument("name", help="the seat to stop")
    stop.set_defaults(run=run_stop)

    start = command(
        sub,
        "start",
        "start a stopped seat again: same lifecycle uid, same session",
        "cotal start alice",
    )
    start.add_argument("name", help="the stopped seat to start")
    start.set_defaults(run=run_start)

    restart = command(
        sub,
        "restart",
        "stop one seat, prove the exit, and start it again in the same session",
        "cotal restart alice",
    )
    restart.add_argument("name", help="the seat to restart")
    restart.set_defaults(run=run_restart)

    rm = command(
        sub,
        "rm",
        "remove one seat: stop it if running, then delete its durable, custody and session pointer",
        "cotal rm alice",
    )
    rm.add_argument("name", help="the seat to remove")
    rm.set_defaults(run=run_rm)


def _call(
    root: Path, op: str, payload: dict[str, Any] | None = None, *, timeout: float = 60.0
) -> Any:
    from manager.cli import mesh

    return eventloop.run(mesh.call, root, op, payload or {}, timeout)


# -- spawn --------------------------------------------------------------------------------------


def check_prompt(prompt: str) -> str:
    """The documented `bad-prompt` rule, checked before the manager is asked. The connectors keep
    their own check: the daemon is not only reached through this CLI."""
    if not prompt.strip():
        raise Refusal(
            "bad-prompt",
            "the prompt is empty",
            "pass the text the seat should start with, or leave --prompt out",
        )
    if prompt.startswith(("-", "@")):
        raise Refusal(
            "bad-prompt",
            "refusing a prompt starting with '-' or '@' (the harness would parse it as an option"
            " or a file)",
            "reword the prompt so it does not start with '-' or '@'",
        )
    return prompt


def run_spawn(args: argparse.Namespace) -> int:
    payload: dict[str, Any] = {"name": args.name, "agent": args.agent}
    if args.prompt is not None:
        payload["prompt"] = check_prompt(args.prompt)
    for key in ("model", "resume"):
        if getattr(args, key):
            payload[key] = getattr(args, key)
    if args.cwd:
        payload["cwd"] = str(Path(args.cwd).resolve())
    row = _call(root_of(args), "spawn", payload, timeout=90.0)
    if args.json:
        emit_json(row)
    else:
        say(f"spawned {row['name']} ({row['agent']}) pid {row['pid']} uid {row['lifecycleUid']}")
        say(f"  session {row['sessionId']}  continuity {row['continuity']}")
    for gap in _isolation_gaps(row.get("isolation")):
        progress(f"warning: seat isolation {row.get('isolation')}: {gap}")
    warning = _cut_warning(Path(row["cwd"]))
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

PS_COLUMNS = [
    ("NAME", "name"),
    ("AGENT", "agent"),
    ("STATE", "state"),
    ("TURN", "turn"),
    ("UPTIME", "uptime"),
    ("RESTARTS", "restarts"),
    ("DEAD", "deadLetters"),
]
PS_WIDE = [
    ("PID", "pid"),
    ("CWD", "cwd"),
    ("LIFECYCLE UID", "lifecycleUid"),
    ("INSTANCE", "instanceId"),
    ("SESSION", "sessionId"),
    ("CONTINUITY", "continuity"),
    ("ISOLATION", "isolation"),
    ("MODE", "permissionMode"),
    ("STARTED", "startedAt"),
    ("LAST EXIT", "lastExit"),
    ("REASON", "reason"),
]


def run_ps(args: argparse.Namespace) -> int:
    rows = _call(root_of(args), "ps")
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
            **row,
            "turn": "busy" if row.get("busy") else "idle",
            "uptime": _uptime(row.get("startedAt"), now) if row.get("state") == "running" else None,
        }
        for row in rows
    ]
    say(format_table(shown, PS_COLUMNS + (PS_WIDE if args.wide else [])))
    if args.wide:
        modes = sorted({str(r["isolation"]) for r in rows if r.get("isolation")})
        for mode in modes:
            for gap in _isolation_gaps(mode):
                say(f"isolation {mode}: {gap}")
    return 0


def _uptime(started_at: str | None, now: datetime) -> str | None:
    """`3d4h`, `2h05m`, `4m12s`, `9s`: the two largest units an operator reads at a glance."""
    if not started_at:
        return None
    try:
        seconds = max(0, int((now - parse_instant(started_at)).total_seconds()))
    except ValueError:
        return None
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


# -- send ---------------------------------------------------------------------------------------


def run_send(args: argparse.Namespace) -> int:
    if args.server:
        from manager.cli import mesh

        if args.wait:
            raise Refusal(
                "bad-args",
                "--wait needs a running manager; with --server the message is only queued",
                "drop --wait, or send through the manager without --server",
            )
        creds = Path(args.creds).resolve() if args.creds else None
        result = eventloop.run(
            mesh.publish_direct, args.server, creds, args.space, args.name, args.text
        )
        if args.json:
            emit_json(result)
        else:
            say(
                f"queued {result['id']} for {result['seat']} at the broker"
                f" (stream seq {result['seq']})"
            )
        return 0
    payload = {"name": args.name, "text": args.text, "wait": args.wait, "timeoutS": args.timeout}
    result = _call(root_of(args), "send", payload, timeout=args.timeout + 10)
    if args.json:
        emit_json(result)
    elif args.wait:
        say(result["reply"])
    else:
        say(f"queued {result['id']} for {result['seat']} (stream seq {result['seq']})")
    return 0


# -- stop, start, restart, rm -------------------------------------------------------------------


def run_stop(args: argparse.Namespace) -> int:
    result = _call(root_of(args), "stop-seat", {"name": args.name})
    if args.json:
        emit_json(result)
    elif result.get("alreadyStopped"):
        say(f"{result['name']} was already stopped (last exit {result['lastExit']})")
    else:
        say(
            f"stopped {result['name']} (uid {result['lifecycleUid']}, exit {result['lastExit']});"
            f" kept: inbox, session and custody stay (`cotal start {result['name']}` brings it"
            f" back, `cotal rm {result['name']}` removes it)"
        )
    return 0


def _started(row: dict[str, Any], verb: str) -> None:
    say(
        f"{verb} {row['name']} ({row['agent']}) pid {row['pid']} uid {row['lifecycleUid']}"
        f" restarts {row['restarts']}"
    )
    say(f"  session {row['sessionId']}  continuity {row['continuity']}")


def run_start(args: argparse.Namespace) -> int:
    row = _call(root_of(args), "start-seat", {"name": args.name}, timeout=90.0)
    if args.json:
        emit_json(row)
    elif row.get("alreadyRunning"):
        say(f"{row['name']} is already running (pid {row['pid']})")
    else:
        _started(row, "started")
    return 0


def run_restart(args: argparse.Namespace) -> int:
    row = _call(root_of(args), "restart-seat", {"name": args.name}, timeout=120.0)
    if args.json:
        emit_json(row)
    else:
        _started(row, "restarted")
    return 0


def run_rm(args: argparse.Namespace) -> int:
    result = _call(root_of(args), "remove-seat", {"name": args.name})
    if args.json:
        emit_json(result)
    elif result.get("footprintDeleted"):
        dead = result.get("deadLettersDeleted") or 0
        say(
            f"removed {result['name']} (uid {result['lifecycleUid']}, exit {result['lastExit']});"
            " durable, custody record and session pointer deleted"
            + (f", and {dead} dead letter(s)" if dead else "")
        )
    else:
        say(
            f"removed {result['name']} (uid {result['lifecycleUid']}) from this manager; its "
            "durable and custody record belong to their new holder and were kept"
        )
    return 0
