"""`cotal`: the top parser, each command module's `register`, and dispatch. A command module
owns its parser (flags, help, examples) and its handler; this module only collects them, runs
the one asked for and turns its outcome into an exit status."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from manager import lean
from manager.cli import (
    checkpoint_cmd,
    console,
    drain,
    events,
    health,
    inbox,
    metrics,
    move,
    quiet,
    seats,
    serve,
    takeover,
    tools_cmd,
    trust,
    updown,
)
from manager.cli import logs as logs_cmd
from manager.cli.args import top
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
    "COMMAND_MODULES",
    "emit_json",
    "main",
    "parser",
    "progress",
    "say",
]

# In the order `cotal --help` lists their commands.
COMMAND_MODULES = (
    updown,
    serve,
    seats,
    move,
    takeover,
    drain,
    inbox,
    health,
    metrics,
    logs_cmd,
    events,
    console,
    tools_cmd,
    checkpoint_cmd,
    trust,
)


def parser() -> argparse.ArgumentParser:
    p, sub = top()
    for module in COMMAND_MODULES:
        module.register(sub)
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
        args = parser().parse_args(argv)
    except SystemExit as exc:
        # --help, --version and usage errors: returned, so the flush in main() covers them too.
        return exc.code if isinstance(exc.code, int) else EX_USAGE
    if not (args.command == "manager"):
        quiet.when_loaded()
    if args.command == "console":
        lean.with_console_libraries()
    else:
        lean.without_console_libraries()
    as_json = bool(getattr(args, "json", False))
    try:
        return int(args.run(args))
    except Refusal as exc:
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


if __name__ == "__main__":
    sys.exit(main())
