"""Reading the presence roster: which lifecycle uids some manager still claims is live.

Presence lags reality by up to its TTL, so what this reads is a claim, not proof of life; a
destination either finds the uid absent or earns its admission with eviction evidence
(`manager/broker/evict.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from manager.broker.footprint import ensure_kv
from manager.broker.reader import bucket_entries
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
    bucket = names.presence_bucket(space)
    # Made if missing, as before: a space nobody ran yet has an empty roster, not a refusal.
    await presence_kv(js, space)
    live: dict[str, LivePresence] = {}
    for key, entry in (await bucket_entries(js, bucket)).items():
        try:
            instance = decode_json(
                entry.value, Presence, what="presence", cap=PRESENCE_CAP
            ).instance_id
        except DecodeError:
            # A presence we cannot read still says "someone may be live": keep it, unknown.
            instance = ""
        live[key.rsplit(".", 1)[-1]] = LivePresence(instance, key, entry.revision)
    return live
