"""A bucket's keys are listed from its stream's subject index (`footprint.bucket_keys`), and the
fleet's and the presence's reads built on it see exactly the live entries, on a real broker."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from manager.broker import fleet, presence
from manager.broker.footprint import bucket_keys, ensure_kv
from protocol.messages import Presence
from tests.conftest import SharedBroker
from tests.helpers import broker_at

pytestmark = pytest.mark.anyio


async def test_keys_live_and_deleted_are_listed_and_only_live_values_read(
    shared_broker: SharedBroker,
) -> None:
    bucket = "cotal_keys_test"
    async with broker_at(shared_broker.url, shared_broker.creds) as js:
        kv = await ensure_kv(js, bucket, ttl=None)
        assert await bucket_keys(js, bucket) == []
        for key in ("seat.b", "seat.a", "seat.c.d"):
            await kv.put(key, key.encode())
        await kv.put("seat.a", b"again")
        await kv.delete("seat.b")
        await kv.purge("seat.c.d")
        # Deleted and purged keys keep a marker on their subject, so they are listed.
        assert await bucket_keys(js, bucket) == ["seat.a", "seat.b", "seat.c.d"]
        assert await fleet._values(js, bucket) == {"seat.a": b"again"}


async def test_fifty_reads_at_once_each_see_every_presence(shared_broker: SharedBroker) -> None:
    # KeyValue.keys() could end its listing before the values arrived and list nothing; the
    # subject index is one answer, whatever the load.
    space = "main"
    instance = "i" * 31
    async with broker_at(shared_broker.url, shared_broker.creds) as js:
        kv = await presence.presence_kv(js, space)
        uids = [f"u{i:02d}{'x' * 28}" for i in range(20)]
        for i, uid in enumerate(uids):
            record = Presence(
                seat=f"s{i:02d}",
                lifecycle_uid=uid,
                instance_id=instance,
                agent="scribe",
                pid=1000 + i,
                since="2026-12-04T00:00:00Z",
            )
            await kv.put(uid, msgspec.json.encode(record))
        seen: list[dict[str, str]] = []

        async def read() -> None:
            live = await presence.live_uids(js, space)
            seen.append({uid: p.instance_id for uid, p in live.items()})

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for _ in range(50):
                    tg.start_soon(read)
        assert seen == [dict.fromkeys(uids, instance)] * 50
