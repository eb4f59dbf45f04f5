"""structlog set-up: key-value events as JSON lines, one file per daemon; never a secret."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TextIO

import structlog


def configure(log_path: Path | None = None, *, level: int = logging.INFO) -> None:
    stream: TextIO
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        stream = open(log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the daemon
    else:
        stream = sys.stderr
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(sort_keys=True),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def quiet() -> None:
    """For the CLI: only warnings and worse reach stderr, people read the printed output."""
    configure(None, level=logging.WARNING)
