"""What every command's parser shares: the parser classes (a usage error exits 64 and shows the
subcommand's own usage), the top parser, the shape of a command's parser (help, description,
examples, `--root` and `--json`), the help texts several commands repeat, and the root a
command runs in. Each command module builds its own parser from these in its `register`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeAlias

from manager.cli.output import EX_OK, EX_USAGE, say

# argparse keeps the type private; every `register` takes one.
Subcommands: TypeAlias = "argparse._SubParsersAction[Any]"

SPACE_HELP = "the space: the namespace this mesh uses at the broker (default: %(default)s)"
SERVER_HELP = "use this NATS server or cluster (URLs separated by commas)"
CREDS_HELP = "the credential for --server: an nkey user seed or a NATS .creds file"
TRUST_HELP = "admit only checkpoints sealed by this Ed25519 key (base64; repeatable)"
STALE_HELP = "admit a checkpoint older than its recency horizon (recorded as consent)"
MAP_HELP = (
    "carry a seat path outside the source root: source directory OLD is at NEW here "
    "(repeatable; the source root always maps onto this root; longest OLD wins), "
    "e.g. --map /srv/shared=/data/shared"
)


class CotalParser(argparse.ArgumentParser):
    """A usage error exits 64 (EX_USAGE), so a script can tell a typo from a refusal (2)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EX_USAGE, f"{self.prog}: error: {message}\n")


class CommandParser(CotalParser):
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


def examples(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


_TOP_EPILOG = (
    examples(
        "cotal up --detach",
        "cotal spawn alice --agent scribe --prompt 'Remember the phrase juniper-ledger-41'",
        "cotal send alice 'what was the phrase?' --wait",
    )
    + "\n\nexit status: 0 done (or nothing to do), 1 internal error, 2 refused (nothing changed),"
    "\n64 usage error, 130 interrupted, 141 stdout closed early. See docs/cli.md."
)


def top() -> tuple[CotalParser, Subcommands]:
    """`cotal` with no command yet: the parser and the place each command module registers."""
    p = CotalParser(
        prog="cotal",
        description="Run, cut and resume AI coding-agent seats.",
        epilog=_TOP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action=_VersionAction, help="print cotal's version and exit")
    sub = p.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        parser_class=CommandParser,
        help="run `cotal COMMAND --help` for its flags and examples",
    )
    return p, sub


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--root", help="workspace root (default: $COTAL_ROOT or the current directory)"
    )
    common.add_argument(
        "--json",
        action="store_true",
        help="machine-readable output on stdout; a refusal is one JSON document on stderr",
    )
    return common


def command(
    parent: Subcommands, name: str, what: str, *lines: str, common_flags: bool = True
) -> argparse.ArgumentParser:
    """One (sub)command's parser: `what` is its help line and, capitalized, its description;
    `lines` are its examples. `common_flags` adds `--root` and `--json`; a command that only
    groups subcommands leaves them to its leaves."""
    parser: argparse.ArgumentParser = parent.add_parser(
        name,
        parents=[_common()] if common_flags else [],
        help=what,
        description=what[0].upper() + what[1:] + ".",
        epilog=examples(*lines),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def subcommands(parser: argparse.ArgumentParser, dest: str) -> Subcommands:
    """The subcommands of a grouping command (`cotal checkpoint ...`)."""
    return parser.add_subparsers(dest=dest, required=True, metavar="COMMAND", help="what to do")


def root_of(args: argparse.Namespace) -> Path:
    return Path(args.root or os.environ.get("COTAL_ROOT") or os.getcwd()).resolve()
