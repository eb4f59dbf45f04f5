"""`cotal`: argument parsing and output for people (or `--json` for machines). Decisions live
below this module; it only parses, calls and prints."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec

from manager import logs
from protocol import names
from protocol.errors import Refusal


def _root(args: argparse.Namespace) -> Path:
    return Path(args.root or os.environ.get("COTAL_ROOT") or os.getcwd()).resolve()


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(msgspec.to_builtins(obj), sort_keys=True) + "\n")


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def progress(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _run(fn: Callable[..., Any], *a: Any) -> Any:
    return anyio.run(fn, *a, backend="asyncio")


# -- commands -----------------------------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    from manager.cli import mesh

    if args.restore:
        from manager.cli import restore as resume_cli

        return int(resume_cli.run_restore(args, _root(args)))
    result = mesh.up(
        _root(args),
        space=args.space,
        server=args.server,
        creds=args.creds,
        detach=args.detach,
        report=progress,
        replicas=args.replicas,
    )
    if args.json:
        emit_json(result)
    else:
        say(f"cotal is up in {result['root']}")
        say(f"  space     {result['space']}")
        say(f"  broker    {result['server']}{' (embedded)' if result['embedded'] else ''}")
        say(f"  manager   pid {result['pid']}  instance {result['instanceId']}")
        say(f"  socket    {result['socket']}")
        say("next: cotal spawn NAME --agent scribe")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from manager.cli import mesh

    if args.preserve_state:
        from manager.cli import cut as cut_cli

        return int(cut_cli.run_cut(args, _root(args)))
    result = mesh.down(_root(args), report=progress)
    if args.json:
        emit_json(result)
    else:
        for seat in result["seats"]:
            say(
                f"stopped {seat['name']} (uid {seat['lifecycleUid']}, exit {seat['exitCode']}); durable deleted"
            )
        if result["manager"]:
            say(f"manager pid {result['manager']} proven gone")
        if result["broker"]:
            say(f"embedded broker pid {result['broker']} proven gone")
        say("cotal is down")
    return 0


def cmd_manager_serve(args: argparse.Namespace) -> int:
    from manager.daemon import serve as daemon

    creds = Path(args.creds).resolve() if args.creds else None
    if args.resume_attempt:
        names.check_attempt_id(args.resume_attempt)
    _run(
        daemon.serve,
        _root(args),
        args.space,
        args.server,
        creds,
        args.resume_attempt,
        args.replicas,
    )
    return 0


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


def cmd_spawn(args: argparse.Namespace) -> int:
    payload: dict[str, Any] = {"name": args.name, "agent": args.agent}
    for key in ("prompt", "model", "resume"):
        if getattr(args, key):
            payload[key] = getattr(args, key)
    if args.cwd:
        payload["cwd"] = str(Path(args.cwd).resolve())
    row = _call(_root(args), "spawn", payload, timeout=90.0)
    if args.json:
        emit_json(row)
    else:
        say(f"spawned {row['name']} ({row['agent']}) pid {row['pid']} uid {row['lifecycleUid']}")
        say(f"  session {row['sessionId']}  continuity {row['continuity']}")
    return 0


PS_COLUMNS = [
    ("NAME", "name"),
    ("AGENT", "agent"),
    ("STATE", "state"),
    ("RESTARTS", "restarts"),
    ("STARTED", "startedAt"),
]
PS_WIDE = [
    ("PID", "pid"),
    ("CWD", "cwd"),
    ("LIFECYCLE UID", "lifecycleUid"),
    ("INSTANCE", "instanceId"),
    ("SESSION", "sessionId"),
    ("CONTINUITY", "continuity"),
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
    rows = _call(_root(args), "ps")
    if args.json:
        for row in rows:
            emit_json(row)
        return 0
    if not rows:
        say("no seats")
        return 0
    say(format_table(rows, PS_COLUMNS + (PS_WIDE if args.wide else [])))
    return 0


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
                f"queued {result['id']} for {result['seat']} at the broker (stream seq {result['seq']})"
            )
        return 0
    payload = {"name": args.name, "text": args.text, "wait": args.wait, "timeoutS": args.timeout}
    result = _call(_root(args), "send", payload, timeout=args.timeout + 10)
    if args.json:
        emit_json(result)
    elif args.wait:
        say(result["reply"])
    else:
        say(f"queued {result['id']} for {result['seat']} (stream seq {result['seq']})")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    result = _call(_root(args), "stop-seat", {"name": args.name})
    if args.json:
        emit_json(result)
    else:
        say(
            f"stopped {result['name']} (uid {result['lifecycleUid']}, exit {result['exitCode']}); durable deleted"
        )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    result = _call(_root(args), "status")
    if args.json:
        emit_json(result)
    else:
        for key in ("state", "pid", "space", "instanceId", "server", "seats", "startedAt"):
            say(f"{key:<11} {result[key]}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from manager.cli import doctor

    return doctor.run(_root(args), as_json=args.json, say=say)


def cmd_checkpoint_verify(args: argparse.Namespace) -> int:
    from manager.cli import verify

    return int(verify.run_verify(args, _root(args)))


# -- parser -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cotal", description="Run, cut and resume AI coding-agent seats."
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--root", help="workspace root (default: $COTAL_ROOT or the current directory)"
    )
    common.add_argument("--json", action="store_true", help="machine-readable output")
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser(
        "up", parents=[common], help="start the broker (unless --server) and the manager"
    )
    up.add_argument("--space", default="main")
    up.add_argument("--server", help="use this NATS server or cluster (comma-separated URLs)")
    up.add_argument("--creds", help="credential for --server (nkey seed or .creds file)")
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
        "--restore", metavar="DIR", help="resume the seats of a sealed checkpoint directory"
    )
    up.add_argument(
        "--trust-signer",
        action="append",
        metavar="KEY",
        help="with --restore: admit only checkpoints sealed by this Ed25519 key (base64; repeatable)",
    )
    up.add_argument(
        "--accept-stale-checkpoint",
        action="store_true",
        help="admit a checkpoint older than its recency horizon (recorded as consent)",
    )
    up.set_defaults(fn=cmd_up)

    down = sub.add_parser(
        "down", parents=[common], help="stop seats, the manager and the embedded broker"
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
    down.set_defaults(fn=cmd_down)

    mgr = sub.add_parser("manager", help="the manager daemon")
    mgr_sub = mgr.add_subparsers(dest="manager_command", required=True)
    serve = mgr_sub.add_parser("serve", parents=[common], help="run the manager in the foreground")
    serve.add_argument("--space", default="main")
    serve.add_argument("--server", required=True)
    serve.add_argument("--creds")
    serve.add_argument(
        "--resume-attempt", help="start fenced, admitting only this attempt's resume"
    )
    serve.add_argument(
        "--replicas", type=int, default=1, help="JetStream replicas for streams and buckets"
    )
    serve.set_defaults(fn=cmd_manager_serve)

    broker = sub.add_parser("broker", help="a standalone embedded broker")
    broker_sub = broker.add_subparsers(dest="broker_command", required=True)
    bserve = broker_sub.add_parser(
        "serve", parents=[common], help="run a broker several roots can share"
    )
    bserve.add_argument("--store-dir", required=True)
    bserve.add_argument("--port", type=int, default=-1)
    bserve.set_defaults(fn=cmd_broker_serve)

    spawn = sub.add_parser("spawn", parents=[common], help="start a seat")
    spawn.add_argument("name")
    spawn.add_argument("--agent", default="scribe", help="pi | claude | jcode | scribe")
    spawn.add_argument("--prompt")
    spawn.add_argument("--model")
    spawn.add_argument("--cwd")
    spawn.add_argument("--resume", metavar="SESSION", help="fork from an existing harness session")
    spawn.set_defaults(fn=cmd_spawn)

    ps = sub.add_parser("ps", parents=[common], help="list seats")
    ps.add_argument("--wide", action="store_true")
    ps.set_defaults(fn=cmd_ps)

    send = sub.add_parser("send", parents=[common], help="send a direct message to a seat")
    send.add_argument("name")
    send.add_argument("text")
    send.add_argument("--wait", action="store_true", help="print the seat's reply")
    send.add_argument("--timeout", type=float, default=120.0)
    send.add_argument(
        "--server", help="queue directly at this broker (for a seat that is cut); no --wait"
    )
    send.add_argument("--creds", help="credential for --server")
    send.add_argument("--space", default="main")
    send.set_defaults(fn=cmd_send)

    stop = sub.add_parser("stop", parents=[common], help="stop one seat and delete its durable")
    stop.add_argument("name")
    stop.set_defaults(fn=cmd_stop)

    status = sub.add_parser("status", parents=[common], help="the manager's state")
    status.set_defaults(fn=cmd_status)

    doctor = sub.add_parser(
        "doctor", parents=[common], help="which harnesses are installed and usable"
    )
    doctor.set_defaults(fn=cmd_doctor)

    ckpt = sub.add_parser("checkpoint", help="sealed checkpoints")
    ckpt_sub = ckpt.add_subparsers(dest="checkpoint_command", required=True)
    verify = ckpt_sub.add_parser(
        "verify", parents=[common], help="run the admission gates; change nothing"
    )
    verify.add_argument("dir")
    verify.add_argument("--accept-stale-checkpoint", action="store_true")
    verify.add_argument("--server", help="the broker to ask whether each uid is live")
    verify.add_argument(
        "--trust-signer",
        action="append",
        metavar="KEY",
        help="admit only checkpoints sealed by this Ed25519 key (base64; repeatable)",
    )
    verify.add_argument("--space", default="main")
    verify.add_argument("--creds")
    verify.set_defaults(fn=cmd_checkpoint_verify)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not (args.command == "manager"):
        logs.quiet()
    try:
        return int(args.fn(args))
    except Refusal as exc:
        if getattr(args, "json", False):
            emit_json({"ok": False, "code": exc.code, "error": exc.text})
        else:
            sys.stderr.write(f"cotal: {exc.text}\n")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
