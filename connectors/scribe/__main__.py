"""`python -m connectors.scribe`: parse the command line, open the session, serve stdin.

Exit codes: 0 normal end (quit or EOF), 2 usage error or refused session, 3 `#crash` directive.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

from connectors.scribe.harness import (
    EXIT_OK,
    EXIT_REFUSED,
    LINE_CAP,
    Harness,
    ReadyOut,
    Store,
    StoreError,
    open_session,
    read_lines,
    write_pointer,
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m connectors.scribe", description="scribe: the built-in offline harness"
    )
    parser.add_argument("--store", required=True, type=Path, help="session store directory")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--session-id", help="reopen this session, or create exactly this id")
    which.add_argument("--fork", metavar="ID", help="start a new session carrying ID's history")
    parser.add_argument("--pointer", type=Path, help="where to write the session pointer")
    parser.add_argument("--prompt", help="first prompt, answered as turn 0 before reading stdin")
    parser.add_argument(
        "--ignore-sigterm", action="store_true", help="test aid: only SIGKILL stops it"
    )
    return parser.parse_args(argv)


def _refuse(message: str) -> int:
    print(f"scribe: {message}", file=sys.stderr, flush=True)
    return EXIT_REFUSED


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        store = Store.open(args.store)
        session = open_session(store, session_id=args.session_id, fork=args.fork)
        if args.pointer is not None:
            write_pointer(args.pointer, session.id, "running")
    except StoreError as exc:
        return _refuse(str(exc))
    except OSError as exc:
        return _refuse(f"cannot open the session store: {exc.strerror} ({exc.filename})")
    harness = Harness(store, session, sys.stdout.buffer, args.pointer)
    # The launch prompt's turn may make a mesh call too, so it reads the same lines.
    harness.lines = read_lines(sys.stdin.buffer, LINE_CAP)
    signal.signal(signal.SIGINT, harness.on_sigint)
    try:
        harness.emit(ReadyOut(session_id=session.id))
        if args.prompt is not None:
            harness.run_turn(f"launch-{uuid.uuid4().hex}", args.prompt)
        return harness.serve(sys.stdin.buffer)
    except BrokenPipeError:
        # The driver went away; there is nobody left to answer. Point stdout at /dev/null so
        # the interpreter's final flush does not report the same broken pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
