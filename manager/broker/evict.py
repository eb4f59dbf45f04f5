"""Eviction evidence (record 3.3): is a predecessor manager verifiably gone from the broker?

Verified-gone is conclusive only as a complete scan with none remaining: every connection list
asked answers, every page of it is read, and no connection is named for the predecessor
instance. A list that does not answer, a truncated or garbled answer, a page that contradicts
its own totals, or a list that keeps changing under the read is not evidence: the oracle
refuses, it never passes.

Two oracles give such a list. An HTTP monitoring endpoint the operator names with `--monitor`
(one server of a `--server` broker or cluster, `/connz`). And the embedded broker itself, asked
over the authenticated NATS connection: nats-server imports `$SYS.REQ.ACCOUNT.PING.CONNZ` from
its system account into every account and answers it with that account's connections, so the
embedded broker needs no HTTP port that seats could read.

See docs/design.md ("Eviction evidence").
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Protocol

import anyio
import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError

from manager.broker.embedded import SERVER_NAME
from manager.broker.presence import LivePresence, presence_kv
from manager.broker.retry import riding_elections
from protocol.errors import Refusal
from protocol.refusals import Code

PAGE = 256
CALL_S = 3.0
MAX_BODY = 8 * 1024 * 1024
# A list read again from the start when it moved under the read (a connection before the read
# position closed), at most this often; then the scan refuses.
RESCANS = 3
MAX_PAGES = 4096
ACCOUNT_CONNZ = "$SYS.REQ.ACCOUNT.PING.CONNZ"


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


class Unanswered(Exception):
    """An oracle gave no usable answer; `detail` says what it gave instead."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class ConnectionList(Protocol):
    """One broker connection list, read a page at a time in connection-id order."""

    @property
    def label(self) -> str: ...

    @property
    def cure(self) -> str: ...

    async def page(self, offset: int, limit: int) -> Mapping[str, object]:
        """The connz page at `offset` (`connections`, `total`, `offset`), or `Unanswered`."""
        ...

    def incomplete(self, cids: Set[int]) -> str | None:
        """What a whole list this oracle read proves it is not, or None."""
        ...


_MONITOR_CURE = (
    "make every broker monitoring endpoint reachable (--monitor), or wait for the "
    "predecessor's presence to expire; an oracle that cannot answer is a refusal, never a pass"
)


def _unverified(label: str, detail: str, cure: str = _MONITOR_CURE) -> Refusal:
    return Refusal(
        Code.EVICTION_UNVERIFIED,
        f"cannot verify the predecessor is gone: {label} {detail}",
        cure,
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


class MonitorEndpoint:
    """A server's HTTP monitoring endpoint, as the operator named it with `--monitor`."""

    cure = _MONITOR_CURE

    def __init__(self, url: str) -> None:
        self.label = url

    async def page(self, offset: int, limit: int) -> Mapping[str, object]:
        url = f"{self.label.rstrip('/')}/connz?limit={limit}&offset={offset}&sort=cid"
        try:
            return await anyio.to_thread.run_sync(_fetch, url)
        except (OSError, ValueError, urllib.error.URLError) as exc:
            raise Unanswered(f"did not answer ({exc})") from None

    def incomplete(self, cids: Set[int]) -> str | None:
        return None


class AccountConnz:
    """The embedded broker's own list of this account's connections, asked over `nc`.

    Only a standalone server answers for the whole account: in a cluster every node answers
    with its own connections, so a node's answer is refused as partial. A genuine answer comes
    from the broker this connection reached (its configured name, one server id throughout) and
    lists this connection itself; an answer that does not is refused, whoever sent it.
    """

    def __init__(self, nc: Client, *, server_name: str = SERVER_NAME) -> None:
        self._nc = nc
        self._server_name = server_name
        self._server_id: str | None = None
        self._cid = nc.client_id
        url = nc.connected_url
        where = f"nats://{url.hostname}:{url.port}" if url is not None else "the broker"
        self.label = f"{where} {ACCOUNT_CONNZ}"
        self.cure = (
            "the embedded broker must answer its account's connection list over NATS "
            f"({ACCOUNT_CONNZ}): read .cotal/logs/nats.log, or wait for the predecessor's "
            "presence to expire (6 s) and retry; an oracle that cannot answer is a refusal, never "
            "a pass"
        )

    async def page(self, offset: int, limit: int) -> Mapping[str, object]:
        if self._nc.discovered_servers:
            raise Unanswered("is one node of a cluster: its answer lists that node's connections")
        body = json.dumps({"offset": offset, "limit": limit, "sort": "cid"}).encode()
        try:
            msg = await self._nc.request(ACCOUNT_CONNZ, body, timeout=CALL_S)
        except (nats.errors.Error, OSError) as exc:
            raise Unanswered(f"did not answer ({exc or type(exc).__name__})") from None
        if len(msg.data) > MAX_BODY:
            raise Unanswered("answered more than 8 MiB")
        try:
            reply = json.loads(msg.data)
        except ValueError:
            raise Unanswered("returned a garbled answer (not JSON)") from None
        if not isinstance(reply, dict):
            raise Unanswered("returned a garbled answer (not an object)")
        error = reply.get("error")
        if error is not None:
            what = error.get("description") if isinstance(error, dict) else error
            raise Unanswered(f"answered an error ({str(what)[:200]})")
        server, data = reply.get("server"), reply.get("data")
        if not isinstance(server, dict) or not isinstance(data, dict):
            raise Unanswered("returned a garbled answer (no server or data)")
        name, server_id = server.get("name"), server.get("id")
        if name != self._server_name or not isinstance(server_id, str):
            raise Unanswered(f"answered as {str(name)[:80]!r}, not the embedded broker")
        if data.get("server_id") != server_id or self._server_id not in (None, server_id):
            raise Unanswered("answered for more than one server")
        self._server_id = server_id
        return data

    def incomplete(self, cids: Set[int]) -> str | None:
        if self._cid is None or self._nc.client_id != self._cid or self._cid not in cids:
            return (
                f"returned a list without this connection (cid {self._cid}): not this "
                "account's whole list at the broker this connection reached"
            )
        return None


def _cid(conn: Mapping[str, object]) -> int | None:
    cid = conn.get("cid")
    return cid if isinstance(cid, int) and not isinstance(cid, bool) else None


async def _read_once(source: ConnectionList, name: str) -> set[int] | str:
    """The whole list's connection ids, or why the list moved while it was read.

    Each page after the first starts at the last id the previous one ended on: if that id is
    not where it was, a connection before it closed and the list shifted under the read (a
    plain offset walk would skip one entry silently), so the read starts again."""
    seen: list[int] = []
    offset, anchor = 0, None
    for _ in range(MAX_PAGES):
        try:
            page = await source.page(offset, PAGE)
        except Unanswered as exc:
            raise _unverified(source.label, exc.detail, source.cure) from None
        conns, total = page.get("connections"), page.get("total")
        if (
            not isinstance(conns, list)
            or not isinstance(total, int)
            or isinstance(total, bool)
            or total < 0
            or page.get("offset") != offset
        ):
            raise _unverified(source.label, "returned a garbled connection list", source.cure)
        cids = []
        for conn in conns:
            cid = _cid(conn) if isinstance(conn, dict) else None
            if cid is None:
                raise _unverified(source.label, "returned a garbled connection entry", source.cure)
            if conn.get("name") == name:
                raise Refusal(
                    Code.PREDECESSOR_LIVE,
                    f"the predecessor manager ({name}) still holds a broker connection "
                    f"(cid {cid} on {source.label})",
                    "stop the predecessor manager first; a resume never starts a second writer",
                )
            cids.append(cid)
        if any(b <= a for a, b in zip(cids, cids[1:], strict=False)):
            raise _unverified(source.label, "returned connections out of id order", source.cure)
        if anchor is not None:
            if not cids or cids[0] != anchor:
                return "changed while it was read"
            cids = cids[1:]
        seen.extend(cids)
        end = offset + len(conns)
        if end >= total:
            if len(seen) != total:
                return f"listed {len(seen)} of {total} connections"
            return set(seen)
        if not cids:
            raise _unverified(
                source.label, f"listed {len(seen)} of {total} connections", source.cure
            )
        anchor, offset = seen[-1], end - 1
    raise _unverified(source.label, f"lists more than {MAX_PAGES} pages", source.cure)


async def _scan_one(source: ConnectionList, name: str) -> int:
    why = ""
    for _ in range(RESCANS):
        outcome = await _read_once(source, name)
        if isinstance(outcome, set):
            problem = source.incomplete(outcome)
            if problem is not None:
                raise _unverified(source.label, problem, source.cure)
            return len(outcome)
        why = outcome
    raise _unverified(source.label, f"{why}, on each of {RESCANS} reads", source.cure)


async def verify_gone(sources: Sequence[ConnectionList], instance_id: str) -> GoneEvidence:
    if not sources:
        raise _unverified("(no monitoring endpoint)", "was given")
    name = manager_connection_name(instance_id)
    scanned = 0
    for source in sources:
        scanned += await _scan_one(source, name)
    return GoneEvidence(instance_id, tuple(s.label for s in sources), scanned)


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
    sources: Sequence[ConnectionList],
) -> Eviction:
    """`seats` maps each seat to its lifecycle uid. A seat whose predecessor still shows presence
    is admitted only with verified-gone evidence for that predecessor; without a connection list
    to ask, its uid stays live (and the identity gate refuses it). Once verified, exactly the
    presence entry that was checked is retired (deleted at its revision), so the manager's own
    roster check sees the predecessor as confirmed retired."""
    remaining = dict(live)
    evidence: list[dict[str, object]] = []
    retire: list[LivePresence] = []
    for name, uid in seats.items():
        if uid not in remaining or not sources:
            continue
        predecessor = remaining[uid]
        if not predecessor.instance_id:
            raise Refusal(
                Code.EVICTION_UNVERIFIED,
                f"seat {name}: its presence names no readable predecessor",
                "wait for the presence to expire (6 s) and retry",
            )
        proof = await verify_gone(sources, predecessor.instance_id)
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
                    Code.PREDECESSOR_LIVE,
                    f"presence {ghost.key} changed while it was being retired",
                    "something still heartbeats as this seat; stop it first",
                ) from None
    return Eviction(evidence, remaining)
