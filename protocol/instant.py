"""The one spelling of an instant: RFC 3339 in UTC with milliseconds (`2026-11-29T14:00:00.123Z`).

Every record, log field and table that carries a point in time uses `format_instant` or
`now_iso`; file names that must sort and contain no colon use `file_stamp`, which is the same
instant at second resolution in the compact ISO 8601 form.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

# The rule `protocol.names.INSTANT` publishes; [0-9], not \d, which also admits non-ASCII
# digits. It lives here so this module depends on nothing of ours.
INSTANT_BODY = r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z"
_INSTANT = re.compile(rf"^(?:{INSTANT_BODY})\Z")


def format_instant(when: datetime) -> str:
    if when.tzinfo is None:
        raise ValueError("an instant must be timezone-aware")
    utc = when.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def now_iso() -> str:
    return format_instant(datetime.now(UTC))


def parse_instant(text: str) -> datetime:
    """Parse what `format_instant` wrote; anything else is a ValueError that shows the form."""
    if not _INSTANT.match(text):
        raise ValueError(
            f"{text!r} is not RFC 3339 UTC with milliseconds (2026-11-29T14:00:00.123Z)"
        )
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def file_stamp(when: datetime | None = None) -> str:
    """`20261129T140000Z`: for names of files and directories set aside as evidence."""
    return (when or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
