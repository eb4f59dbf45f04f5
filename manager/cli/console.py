"""`cotal console [--web [--host H] [--port N]]`: the fleet, live, in a terminal or a browser.

The console itself is `manager/console/` (model, feed, app, web server); this is its command
line. It is imported inside the handler, so no other command pays for textual's import.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from manager.cli.args import Subcommands, command, root_of
from manager.cli.output import emit_json, say
from protocol.errors import Refusal
from protocol.refusals import Code

DEFAULT_PORT = 8765


def register(sub: Subcommands) -> None:
    console = command(
        sub,
        "console",
        "a live view of every seat of the fleet, with keys to stop, start, restart, send, "
        "move and drain",
        "cotal console",
        "cotal console --web",
        "cotal console --web --port 9000 --json",
    )
    console.add_argument(
        "--web",
        action="store_true",
        help="serve the console as a web page on 127.0.0.1 instead of drawing it here",
    )
    console.add_argument(
        "--host",
        default="127.0.0.1",
        metavar="ADDR",
        help="with --web: a loopback address to listen on (any other is refused; default: "
        "%(default)s)",
    )
    console.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        metavar="N",
        help="with --web: the port (0: any free one; default: %(default)s)",
    )
    console.add_argument(
        "--poll",
        type=float,
        default=2.0,
        metavar="S",
        help="seconds between two reads when no event wakes the console (default: %(default)s)",
    )
    console.set_defaults(run=run_console)


def run_console(args: argparse.Namespace) -> int:
    root = root_of(args)
    if not 0.1 <= args.poll <= 60:
        raise Refusal(Code.BAD_ARGS, f"--poll {args.poll} is not from 0.1 to 60 s", "give --poll 2")
    if args.web:
        return _web(args, root)
    if args.json:
        raise Refusal(
            Code.BAD_ARGS,
            "the terminal console draws a screen and prints no JSON",
            "use `cotal console --web --json` for the web console's address, or `cotal ps "
            "--fleet --json` and `cotal events --fleet --json` for the same data",
        )
    # textual-serve runs this command with its web driver and pipes; anywhere else the screen
    # needs a terminal to draw on.
    if not os.environ.get("TEXTUAL_DRIVER") and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise Refusal(
            Code.BAD_ARGS,
            "the console draws on a terminal, and stdin or stdout is not one",
            "run it in a terminal, or `cotal console --web` and open the page",
        )
    if not os.environ.get("TEXTUAL_DRIVER"):
        # textual sizes its screen with shutil.get_terminal_size, which takes COLUMNS and LINES
        # over the terminal's own size, after a resize too: exported by a parent (a CI runner,
        # pytest-xdist's workers, a shell), they drew the console 80 wide in a 160-column
        # terminal, its last columns cut off. On a terminal, the terminal's size is drawn on.
        # (textual-serve's web driver sets both to the page's size; they are kept there.)
        os.environ.pop("COLUMNS", None)
        os.environ.pop("LINES", None)
    from manager.console.app import ConsoleApp

    ConsoleApp(root, poll_s=args.poll).run()
    return 0


def _web(args: argparse.Namespace, root: Path) -> int:
    from manager.workspace.layout import Layout

    if not Layout.at(root).control.is_dir():
        raise Refusal(
            Code.NOT_UP,
            f"no manager has been started in {root}",
            "run `cotal up --detach` there",
        )
    from manager.console import web

    host = web.check_host(args.host)
    if not 0 <= args.port <= 65535:
        raise Refusal(Code.BAD_ARGS, f"--port {args.port} is not a port", "give 0 to 65535")

    def ready(url: str, keyed: Path) -> None:
        if args.json:
            emit_json({"url": url, "keyFile": str(keyed)})
        else:
            say(
                f"serving the console at {url} (loopback only; Ctrl-C stops it); open the "
                f"address with its key, in {keyed}"
            )
        sys.stdout.flush()

    web.serve(root, host, args.port, ready)
    return 0
