"""Eviction evidence (record 3.3): is a predecessor manager verifiably gone from the broker?

Verified-gone is conclusive only as a complete scan with none remaining: every named server's
monitoring endpoint answers, every page of its connection list is read, and no connection is
named for the predecessor instance. A server that does not answer, a truncated or garbled
answer, or a page that contradicts its own totals is not evidence: the oracle refuses, it never
passes.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

import anyio

from protocol.errors import Refusal

PAGE = 256
CALL_S = 3.0
MAX_BODY = 8 * 1024 * 1024


def manager_connection_name(instance_id: str) -> str:
    return f"cotal-manager:{instance_id}"


@dataclass(frozen=True)
class GoneEvidence:
    instance_id: str
    servers: tuple[str, ...]
    scanned: int

    def as_dict(self) -> dict[str, object]:
        return {
            "instanceId": self.instance_id,
            "servers": list(self.servers),
            "connectionsScanned": self.scanned,
            "remaining": 0,
        }


def _unverified(monitor: str, detail: str) -> Refusal:
    return Refusal(
        "eviction-unverified",
        f"cannot verify the predecessor is gone: {monitor} {detail}",
        "make every broker monitoring endpoint reachable (--monitor), or wait for the predecessor's "
        "presence to expire; an oracle that cannot answer is a refusal, never a pass",
    )


def _fetch(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=CALL_S) as resp:  # noqa: S310 - operator-given loopback/cluster URL
        body = resp.read(MAX_BODY + 1)
    if len(body) > MAX_BODY:
        raise ValueError("answer too large")
    data = json.loads(body)
    if not isinstance(data, dict):
        raise ValueError("answer is not an object")
    return data


def _scan_one(monitor: str, name: str) -> int:
    offset, seen = 0, 0
    while True:
        url = f"{monitor.rstrip('/')}/connz?limit={PAGE}&offset={offset}"
        try:
            page = _fetch(url)
        except (OSError, ValueError, urllib.error.URLError) as exc:
            raise _unverified(monitor, f"did not answer ({exc})") from None
        conns, total = page.get("connections"), page.get("total")
        if not isinstance(conns, list) or not isinstance(total, int) or total < 0:
            raise _unverified(monitor, "returned a garbled connection list")
        for conn in conns:
            if not isinstance(conn, dict):
                raise _unverified(monitor, "returned a garbled connection entry")
            if conn.get("name") == name:
                raise Refusal(
                    "predecessor-live",
                    f"the predecessor manager ({name}) still holds a broker connection "
                    f"(cid {conn.get('cid')} on {monitor})",
                    "stop the predecessor manager first; a resume never starts a second writer",
                )
        seen += len(conns)
        offset += len(conns)
        if offset >= total or not conns:
            if seen < total:
                raise _unverified(monitor, f"listed {seen} of {total} connections")
            return seen


async def verify_gone(monitors: list[str], instance_id: str) -> GoneEvidence:
    if not monitors:
        raise _unverified("(no monitoring endpoint)", "was given")
    name = manager_connection_name(instance_id)
    scanned = 0
    for monitor in monitors:
        scanned += await anyio.to_thread.run_sync(_scan_one, monitor, name)
    return GoneEvidence(instance_id, tuple(monitors), scanned)
