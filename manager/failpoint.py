"""Test-only kill points: the crash-only rule is proven by dying at each step boundary.

`COTAL_FAILPOINT=<name>` makes `reached(<name>)` SIGKILL the calling process, with nothing
written first, so what survives is exactly what a real crash at that boundary leaves.
`COTAL_FAILPOINT=<name>:manager` or `<name>:broker` SIGKILLs the manager or the embedded broker
named in the root's `.cotal/mesh.json` instead, and the caller carries on as if it had not
noticed. Unset (always, outside the tests) every call is a dictionary lookup and nothing more.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

_TARGETS = {"manager": "manager", "broker": "embeddedBroker"}


def reached(name: str, root: Path | None = None) -> None:
    # Read on every call: one process may pass several points, and only the named one fires.
    wanted = os.environ.get("COTAL_FAILPOINT")
    if not wanted:
        return
    if wanted == name:
        os.kill(os.getpid(), signal.SIGKILL)
    point, _, target = wanted.rpartition(":")
    if point != name or target not in _TARGETS or root is None:
        return
    try:
        record = json.loads((root / ".cotal" / "mesh.json").read_text())
        pid = int(record[_TARGETS[target]]["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        found = _store_broker(root) if target == "broker" else None
        if found is None:
            return
        pid = found
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    # Carry on only once it is really gone, so the next step meets the crash, not a race.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    return
        except OSError:
            return
        time.sleep(0.02)


def _store_broker(root: Path) -> int | None:
    """A resume on a new root starts its broker before any mesh record names it: the one
    nats-server running on this root's store config is that broker."""
    # Imported here: outside the tests this module is a dictionary lookup and nothing more.
    from manager.broker.embedded import store_owners

    owners = store_owners(root / ".cotal" / "nats")
    return owners[0] if owners else None
