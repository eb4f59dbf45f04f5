"""`cotal status` and `cotal doctor`: what is up in this root and what is waiting, and which
harnesses are installed and usable. The reports are `status.py` and `doctor.py`.

`main` imports every command module to build its parser, so the reports (the mesh, the signing
keys, the connectors and their pins) are imported by the handler that prints them."""

from __future__ import annotations

import argparse

from manager.cli.args import Subcommands, command, root_of
from manager.cli.output import emit_json, say


def register(sub: Subcommands) -> None:
    status = command(
        sub,
        "status",
        "what is up in this root (manager, broker, seats) and what is waiting (a sealed cut)",
        "cotal status",
        "cotal status --json",
    )
    status.set_defaults(run=run_status)

    doctor = command(
        sub,
        "doctor",
        "which harnesses are installed and usable",
        "cotal doctor",
        "cotal doctor --json",
    )
    doctor.set_defaults(run=run_doctor)


def run_status(args: argparse.Namespace) -> int:
    from manager.cli import status

    doc = status.gather(root_of(args))
    if args.json:
        emit_json(doc)
    else:
        status.print_human(doc, say)
    return 0


def run_doctor(args: argparse.Namespace) -> int:
    from manager.cli import doctor

    return doctor.run(root_of(args), as_json=args.json, say=say)
