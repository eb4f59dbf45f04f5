"""The space's bounds that need no broker to know: the DM stream's limits and how many copies a
stream keeps. Apart from the code that talks to the broker, because `cotal up` decides both
before it starts anything, and importing nats-py costs every `up` a tenth of a second of CPU.

A seat's inbox is the one place a message waits for its reader, so the stream refuses a publish
it cannot hold (the sender sees the error) rather than drop the oldest (which is silent, and the
oldest is the next unread message). These bound the whole stream, which holds little but
unacknowledged mail (manager/broker/retention.py), so a space's broker disk stays finite.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from protocol.errors import Refusal
from protocol.refusals import Code

DM_MAX_MSGS: Final = 1_000_000
DM_MAX_BYTES: Final = 4 * 1024 * 1024 * 1024
MAX_MSGS_ENV: Final = "COTAL_DM_MAX_MSGS"
MAX_BYTES_ENV: Final = "COTAL_DM_MAX_BYTES"
_LIMIT = re.compile(r"[1-9][0-9]{0,17}")


@dataclass(frozen=True)
class DmLimits:
    msgs: int
    bytes: int

    @property
    def cadence(self) -> int:
        """How many sequences apart the publish path looks at the stream's fill."""
        return max(1, self.msgs // 8)


def _parse(environ: Mapping[str, str], key: str, default: int) -> int:
    raw = environ.get(key)
    if raw is None or raw == "":
        return default
    if _LIMIT.fullmatch(raw) is None:
        raise Refusal(
            Code.BAD_DM_LIMIT,
            f"{key}={raw[:40]!r} is not a whole number from 1 to 10^18",
            f"set {key} to a positive whole number (messages for COTAL_DM_MAX_MSGS, bytes for "
            f"COTAL_DM_MAX_BYTES) or unset it for the default ({default}); nothing was started",
        )
    return int(raw)


def dm_limits(environ: Mapping[str, str] = os.environ) -> DmLimits:
    """The DM stream's bounds: the defaults, or COTAL_DM_MAX_MSGS / COTAL_DM_MAX_BYTES (a test
    and operations knob, read where the stream is declared, so a manager's start applies it)."""
    return DmLimits(
        msgs=_parse(environ, MAX_MSGS_ENV, DM_MAX_MSGS),
        bytes=_parse(environ, MAX_BYTES_ENV, DM_MAX_BYTES),
    )


def default_replicas(server: str) -> int:
    """Three copies when the operator names a cluster of three or more, else one."""
    return 3 if len([u for u in server.split(",") if u.strip()]) >= 3 else 1
