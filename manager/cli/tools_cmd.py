"""`cotal tools install`: the pinned harness programs, installed by `tools.py`.

`main` imports every command module to build its parser, so the pins (and the platform lookup
they bring) are imported by the handler that installs them."""

from __future__ import annotations

import argparse

from manager.cli.args import Subcommands, command, subcommands
from manager.cli.output import say


def register(sub: Subcommands) -> None:
    tools_cmd = command(
        sub,
        "tools",
        "the pinned harness programs (pi, Claude Code) in the tools directory",
        "cotal tools install",
        common_flags=False,
    )
    tools_sub = subcommands(tools_cmd, "tools_command")
    install = command(
        tools_sub,
        "install",
        "install the pinned versions with npm into $COTAL_TOOLS_DIR, a checkout's .tools, else"
        " the user data directory (or confirm they are there)",
        "cotal tools install",
        "cotal tools install pi",
        "COTAL_TOOLS_DIR=/opt/cotal-tools cotal tools install",
        common_flags=False,
    )
    install.add_argument(
        "names", nargs="*", metavar="NAME", help="only these harnesses (default: every pin)"
    )
    install.set_defaults(run=run_install)


def run_install(args: argparse.Namespace) -> int:
    from manager.cli import tools

    pins = tools.load_pins()
    for name in args.names or sorted(pins):
        say(tools.install(tools.get_pin(name)))
    return 0
