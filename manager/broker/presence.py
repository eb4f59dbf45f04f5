"""Reading the presence roster: which lifecycle uids some manager still claims is live.

Presence lags reality by up to its TTL, so what this reads is a claim, not proof of life; a
destination either finds the uid absent or earns its admission with eviction evidence
(`manager/broker/evict.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.errors import KeyDeletedError, KeyNotFoundError, NoKeysError
from nats.js.kv import KeyValue

from manager.broker.footprint import ensure_kv
from manager.broker.retry import riding_elections
from protocol import names
from protocol.codec import decode_json
from protocol.errors import DecodeError
from protocol.messages import Presence

PRESENCE_CAP = 4096


@dataclass(frozen=True)
class LivePresence:
    """One presence entry as read: the manager instance that wrote it, and where it sits."""

    instance_id: str
    key: str
    revision: int


async def presence_kv(js: JetStreamContext, space: str) -> KeyValue:
    return await ensure_kv(js, names.presence_bucket(space), ttl=names.PRESENCE_TTL_S)


async def live_uids(js: JetStreamContext, space: str) -> dict[str, LivePresence]:
    """uid -> the presence entry that claims it (and the manager instance that wrote it)."""
    kv = await presence_kv(js, space)
    try:
        keys = await riding_elections("presence keys", kv.keys)
    except NoKeysError:
        return {}
    live: dict[str, LivePresence] = {}
    for key in keys:

        async def get(key: str = key) -> KeyValue.Entry:
            return await kv.get(key)

        try:
            entry = await riding_elections(f"presence {key}", get)
        except (KeyNotFoundError, KeyDeletedError):
            continue
        try:
            instance = decode_json(
                entry.value or b"", Presence, what="presence", cap=PRESENCE_CAP
            ).instance_id
        except DecodeError:
            # A presence we cannot read still says "someone may be live": keep it, unknown.
            instance = ""
        live[key.rsplit(".", 1)[-1]] = LivePresence(instance, key, int(entry.revision or 0))
    return live
