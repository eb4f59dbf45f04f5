"""The marker a running `cotal drain` keeps in its root (`.cotal/drain.json`): which process
drains, since when, and whether it was cancelled. The drain reads it before each wave, `cotal
drain --cancel` marks it, and the manager refuses spawns while a live process holds it
(manager/coord/drain.py). A marker whose process is gone is stale and means nothing.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from manager.procs import alive
from manager.workspace.layout import Layout
from manager.workspace.private import read_stable, write_private_atomic
from protocol.codec import decode_json, encode_json
from protocol.errors import DecodeError, Refusal
from protocol.mesh import ProcRef

MARKER = "drain.json"
MARKER_CAP = 4096


class DrainMarker(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    # The draining process, by pid and start time, so a reused pid is not taken for it.
    process: ProcRef
    started_at: str
    cancelled: bool = False


def marker_path(layout: Layout) -> Path:
    return layout.control / MARKER


def read_marker(layout: Layout) -> DrainMarker | None:
    """The drain marker, or None when there is none or its process is gone (stale)."""
    path = marker_path(layout)
    if not path.exists():
        return None
    try:
        data = read_stable(path, cap=MARKER_CAP, what="drain marker", require_private=True).data
        marker = decode_json(data, DrainMarker, what="drain marker", cap=MARKER_CAP)
    except (Refusal, DecodeError):
        return None
    return marker if alive(marker.process) else None


def draining(layout: Layout) -> DrainMarker | None:
    """The live drain of this root, if one runs and was not cancelled: what a spawn refuses on."""
    marker = read_marker(layout)
    return marker if marker is not None and not marker.cancelled else None


def cancel(layout: Layout) -> bool:
    """Mark this root's drain cancelled (it stops before its next wave); a stale marker is
    removed. Whether a live drain was told."""
    marker = read_marker(layout)
    if marker is None:
        marker_path(layout).unlink(missing_ok=True)
        return False
    write_private_atomic(
        marker_path(layout), encode_json(msgspec.structs.replace(marker, cancelled=True))
    )
    return True
