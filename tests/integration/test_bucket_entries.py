"""A bucket's entries are read by one pull reader of our own (`reader.bucket_entries`), and the
fleet's and the presence's reads built on it see exactly the live entries, on a real broker,
however many read at once; no reader outlives its read."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from manager.broker import fleet, presence, reader
from manager.broker.footprint import ensure_kv
from protocol import names
from protocol.messages import Presence
from tests.conftest import SharedBroker
from tests.helpers import broker_at

pytestmark = pytest.mark.anyio

BUCKET = "cotal_entries_test"


async def test_live_values_and_revisions_only_and_no_reader_left(
    shared_broker: SharedBroker,
) -> None:
    async with broker_at(shared_broker.url, shared_broker.creds) as js:
        kv = await ensure_kv(js, BUCKET, ttl=None)
        assert await reader.bucket_entries(js, BUCKET) == {}
        revs = {key: await kv.put(key, key.encode()) for key in ("seat.b", "seat.a", "seat.c.d")}
        again = await kv.put("seat.a", b"again")
        await kv.delete("seat.b")
        await kv.purge("seat.c.d")
        assert revs["seat.a"] < again
        assert await reader.bucket_entries(js, BUCKET) == {
            "seat.a": reader.BucketEntry(b"again", again)
        }
        assert await fleet._values(js, BUCKET) == {"seat.a": b"again"}
        info = await js.stream_info(f"KV_{BUCKET}")
        assert info.state.consumer_count == 0


async def test_more_keys_than_one_batch_are_all_read(shared_broker: SharedBroker) -> None:
    count = reader.BATCH * 2 + 7
    async with broker_at(shared_broker.url, shared_broker.creds) as js:
        kv = await ensure_kv(js, BUCKET, ttl=None)
        for i in range(count):
            await kv.put(f"k.{i:04d}", str(i).encode())
        entries = await reader.bucket_entries(js, BUCKET)
        assert sorted(entries) == [f"k.{i:04d}" for i in range(count)]
        assert [entries[f"k.{i:04d}"].value for i in range(count)] == [
            str(i).encode() for i in range(count)
        ]


async def test_fifty_reads_at_once_each_see_every_presence(shared_broker: SharedBroker) -> None:
    # KeyValue.keys() could end its listing before the values arrived and list nothing; a pull
    # reader delivers nothing before it is asked, whatever the load.
    space = "main"
    instance = "i" * 31
    async with broker_at(shared_broker.url, shared_broker.creds) as js:
        kv = await presence.presence_kv(js, space)
        uids = [names.mint_lifecycle_uid() for _ in range(20)]
        for i, uid in enumerate(uids):
            record = Presence(
                seat=f"s{i:02d}",
                lifecycle_uid=uid,
                instance_id=instance,
                agent="scribe",
                pid=1000 + i,
                since="2026-12-04T00:00:00Z",
            )
            await kv.put(
                names.presence_key(names.SEAT_OWNER, record.seat, uid), msgspec.json.encode(record)
            )
        seen: list[dict[str, str]] = []

        async def read() -> None:
            live = await presence.live_uids(js, space)
            seen.append({uid: p.instance_id for uid, p in live.items()})

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for _ in range(50):
                    tg.start_soon(read)
        assert seen == [dict.fromkeys(uids, instance)] * 50
        info = await js.stream_info(f"KV_{names.presence_bucket(space)}")
        assert info.state.consumer_count == 0
