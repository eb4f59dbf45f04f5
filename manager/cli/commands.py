"""The body of each `cotal` command: read the parsed arguments, call below, print for people
(or `--json` for machines). Decisions live below this module."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from manager import eventloop
from manager.cli.output import (
    emit_json,
    progress,
    say,
)
from protocol import names
from protocol.errors import Refusal
from protocol.instant import parse_instant


def root_of(args: argparse.Namespace) -> Path:
    return Path(args.root or os.environ.get("COTAL_ROOT") or os.getcwd()).resolve()


def _run(fn: Callable[..., Any], *a: Any) -> Any:
    return eventloop.run(fn, *a)


# -- commands -----------------------------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    from manager.cli import mesh

    mesh.check_root(root_of(args))
    if args.restore:
        from manager.cli import restore as resume_cli

        return int(resume_cli.run_restore(args, root_of(args)))
    _warn_waiting(root_of(args))
    result = mesh.up(
        root_of(args),
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


def _warn_waiting(root: Path) -> None:
    """A plain `up` beside a sealed cut (or an attempt cut short) is allowed, since the operator
    may want a fresh mesh, but never silent: the cut's seats are not among the new mesh's."""
    from manager.cli import status
    from manager.workspace.layout import Layout

    for line in status.warning_lines(status.waiting(Layout.at(root))):
        progress(line)


def cmd_down(args: argparse.Namespace) -> int:
    from manager.cli import mesh

    if args.abort and not args.preserve_state:
        raise Refusal(
            "bad-args",
            "--abort abandons a cut, and plain `cotal down` is not one",
            "run `cotal down --preserve-state --abort`",
        )
    cut_only = [
        flag
        for flag, given in (
            ("--since", args.since),
            ("--include", args.include),
            ("--session-store", args.session_store),
        )
        if given
    ]
    if cut_only and not args.preserve_state:
        # Ignoring them would stop every seat without the checkpoint the operator asked for.
        raise Refusal(
            "bad-args",
            f"{', '.join(cut_only)} shape a cut, and plain `cotal down` is not one",
            "add --preserve-state, or leave them out to stop the mesh without a checkpoint",
        )
    if args.preserve_state:
        from manager.cli import cut as cut_cli

        return int(cut_cli.run_cut(args, root_of(args)))
    result = mesh.down(root_of(args), report=progress)
    if args.json:
        emit_json(result)
    else:
        for seat in result["seats"]:
            say(
                f"stopped {seat['name']} (uid {seat['lifecycleUid']}, exit {seat['exitCode']}); "
                + _durable_outcome(seat)
            )
        if result["manager"]:
            say(f"manager pid {result['manager']} proven gone")
        if result["broker"]:
            say(f"embedded broker pid {result['broker']} proven gone")
        say("cotal is down")
    return 0


def _durable_outcome(seat: dict[str, Any]) -> str:
    # A daemon that predates the per-seat outcome reports none; it said nothing either way, so
    # nothing is claimed for it.
    if "durableDeleted" not in seat:
        return "durable deletion not reported by this manager"
    if seat["durableDeleted"]:
        return "durable deleted"
    if not seat.get("footprintOwned", True):
        return "durable kept (not this manager's to delete)"
    return (
        f"durable NOT deleted ({seat.get('durableError') or 'unknown reason'}): its record is "
        "kept; once the broker is back, run cotal up and then cotal down again"
    )


def cmd_manager_serve(args: argparse.Namespace) -> int:
    from connectors import sandbox

    # The isolation probe is a child interpreter of its own: started before the daemon's
    # imports, it is done by the time the daemon asks, instead of adding its start to every
    # manager start.
    sandbox.begin_probe()
    from manager.daemon import serve as daemon

    creds = Path(args.creds).resolve() if args.creds else None
    if args.resume_attempt:
        names.check_attempt_id(args.resume_attempt)
    _run(
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


def cmd_manager_warm(args: argparse.Namespace) -> int:
    """A manager's interpreter with its imports done, waiting for the coordinator that started
    it to say what to serve (manager/cli/warm.py)."""
    from connectors import sandbox

    sandbox.begin_probe()
    import msgspec

    from manager.cli import warm
    from manager.cli.main import main
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
    return main(go.argv)


def cmd_broker_serve(args: argparse.Namespace) -> int:
    from manager.cli import mesh

    return mesh.broker_serve(
        Path(args.store_dir).resolve(), port=args.port, as_json=args.json, say=say
    )


def _call(
    root: Path, op: str, payload: dict[str, Any] | None = None, *, timeout: float = 60.0
) -> Any:
    from manager.cli import mesh

    return _run(mesh.call, root, op, payload or {}, timeout)


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


def cmd_spawn(args: argparse.Namespace) -> int:
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


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    cells = [[h for h, _ in columns]] + [
        ["-" if r.get(k) is None else str(r.get(k)) for _, k in columns] for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def cmd_ps(args: argparse.Namespace) -> int:
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


def cmd_send(args: argparse.Namespace) -> int:
    if args.server:
        from manager.cli import mesh

        if args.wait:
            raise Refusal(
                "bad-args",
                "--wait needs a running manager; with --server the message is only queued",
                "drop --wait, or send through the manager without --server",
            )
        creds = Path(args.creds).resolve() if args.creds else None
        result = _run(mesh.publish_direct, args.server, creds, args.space, args.name, args.text)
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


def cmd_stop(args: argparse.Namespace) -> int:
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


def cmd_start(args: argparse.Namespace) -> int:
    row = _call(root_of(args), "start-seat", {"name": args.name}, timeout=90.0)
    if args.json:
        emit_json(row)
    elif row.get("alreadyRunning"):
        say(f"{row['name']} is already running (pid {row['pid']})")
    else:
        _started(row, "started")
    return 0


def cmd_restart(args: argparse.Namespace) -> int:
    row = _call(root_of(args), "restart-seat", {"name": args.name}, timeout=120.0)
    if args.json:
        emit_json(row)
    else:
        _started(row, "restarted")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
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


def cmd_inbox(args: argparse.Namespace) -> int:
    from manager.cli import inbox

    return inbox.run(
        root_of(args),
        args.name,
        redeliver=args.redeliver,
        drop=args.drop,
        as_json=args.json,
        say=say,
        emit=emit_json,
    )


def cmd_status(args: argparse.Namespace) -> int:
    from manager.cli import status

    doc = status.gather(root_of(args))
    if args.json:
        emit_json(doc)
    else:
        status.print_human(doc, say)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from manager.cli import doctor

    return doctor.run(root_of(args), as_json=args.json, say=say)


def cmd_logs(args: argparse.Namespace) -> int:
    from manager.cli import logs as logs_cli

    return logs_cli.run(
        root_of(args),
        seat=args.seat,
        follow=args.follow,
        since=args.since,
        as_json=args.json,
        transcript=args.transcript,
    )


def cmd_tools(args: argparse.Namespace) -> int:
    from manager.cli import tools

    pins = tools.load_pins()
    for name in args.names or sorted(pins):
        say(tools.install(tools.get_pin(name)))
    return 0


def parse_since(text: str) -> Any:
    from manager.cli import logs as logs_cli

    try:
        return logs_cli.parse_since(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_checkpoint_verify(args: argparse.Namespace) -> int:
    from manager.cli import verify

    return int(verify.run_verify(args, root_of(args)))


def cmd_checkpoint_pack(args: argparse.Namespace) -> int:
    from manager.cli import checkpoints

    return checkpoints.run_pack(args, root_of(args))


def cmd_checkpoint_list(args: argparse.Namespace) -> int:
    from manager.cli import checkpoints

    return checkpoints.run_list(args, root_of(args))


def cmd_checkpoint_discard(args: argparse.Namespace) -> int:
    from manager.cli import checkpoints

    return checkpoints.run_discard(args, root_of(args))


def cmd_trust_add(args: argparse.Namespace) -> int:
    from manager.cli import trust

    return trust.run_add(
        root_of(args), args.key, args.name, as_json=args.json, say=say, emit=emit_json
    )


def cmd_trust_list(args: argparse.Namespace) -> int:
    from manager.cli import trust

    return trust.run_list(root_of(args), as_json=args.json, say=say, emit=emit_json)


def cmd_trust_remove(args: argparse.Namespace) -> int:
    from manager.cli import trust

    return trust.run_remove(root_of(args), args.signer, as_json=args.json, say=say, emit=emit_json)


# -- parser -------------------------------------------------------------------------------------
