"""`cotal metrics`: this root's manager's metrics, in the Prometheus text exposition format.

The text is the manager's own (`manager/daemon/metrics.py`), asked over the control socket and
printed as it came; the CLI imports no metrics library. `[metrics] listen` in cotal.toml serves
the same text for a scraper (docs/operations.md, "Monitoring")."""

from __future__ import annotations

import argparse
import sys

from manager.cli.args import Subcommands, command, root_of
from manager.cli.output import emit_json
from protocol import control


def register(sub: Subcommands) -> None:
    metrics = command(
        sub,
        "metrics",
        "this root's metrics in the Prometheus text format (seats, turns, deliveries, cuts)",
        "cotal metrics",
        "cotal metrics | grep '^cotal_seats'",
        "cotal metrics --json",
    )
    metrics.set_defaults(run=run_metrics)


def run_metrics(args: argparse.Namespace) -> int:
    from manager.control.oneshot import run_request

    reply = run_request(root_of(args), control.METRICS, control.NoArgs(), 30.0)
    if args.json:
        emit_json(reply)
    else:
        sys.stdout.write(reply.text)
    return 0
