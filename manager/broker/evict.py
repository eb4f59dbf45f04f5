"""Eviction evidence (record 3.3): is a predecessor manager verifiably gone from the broker?

Verified-gone is conclusive only as a complete scan with none remaining: every named server's
monitoring endpoint answers, every page of its connection list is read, and no connection is
named for the predecessor instance. A server that does not answer, a truncated or garbled
answer, or a page that contradicts its own totals is not evidence: the oracle refuses, it never
passes.

See docs/design.md ("Eviction evidence").
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import anyio
from nats.js import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError

from manager.broker.presence import LivePresence, presence_kv
from manager.broker.retry import riding_elections
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
        "make every broker monitoring endpoint reachable (--monitor), or wait for the "
        "predecessor's presence to expire; an oracle that cannot answer is a refusal, never a pass",
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


@dataclass(frozen=True)
class Eviction:
    """What a destination proved about its seats' predecessors, and the roster that remains."""

    evidence: list[dict[str, object]]
    live: dict[str, LivePresence]


async def evict_ghosts(
    js: JetStreamContext,
    space: str,
    seats: Mapping[str, str],
    live: Mapping[str, LivePresence],
    monitors: Sequence[str],
) -> Eviction:
    """`seats` maps each seat to its lifecycle uid. A seat whose predecessor still shows presence
    is admitted only with verified-gone evidence for that predecessor; without a monitor to ask,
    its uid stays live (and the identity gate refuses it). Once verified, exactly the presence
    entry that was checked is retired (deleted at its revision), so the manager's own roster
    check sees the predecessor as confirmed retired."""
    remaining = dict(live)
    evidence: list[dict[str, object]] = []
    retire: list[LivePresence] = []
    for name, uid in seats.items():
        if uid not in remaining or not monitors:
            continue
        predecessor = remaining[uid]
        if not predecessor.instance_id:
            raise Refusal(
                "eviction-unverified",
                f"seat {name}: its presence names no readable predecessor",
                "wait for the presence to expire (6 s) and retry",
            )
        proof = await verify_gone(list(monitors), predecessor.instance_id)
        retire.append(remaining.pop(uid))
        evidence.append({"seat": name, **proof.as_dict()})
    if retire:
        kv = await presence_kv(js, space)
        for ghost in retire:

            async def delete(ghost: LivePresence = ghost) -> bool:
                return bool(await kv.delete(ghost.key, last=ghost.revision))

            try:
                await riding_elections(f"retire presence {ghost.key}", delete)
            except KeyWrongLastSequenceError:
                raise Refusal(
                    "predecessor-live",
                    f"presence {ghost.key} changed while it was being retired",
                    "something still heartbeats as this seat; stop it first",
                ) from None
    return Eviction(evidence, remaining)
