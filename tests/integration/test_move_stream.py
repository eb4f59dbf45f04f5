"""The move bucket streams: a file several times larger than a memory bound goes into the
JetStream Object Store and back out of it on a real nats-server with this process's Python
allocations staying under the bound both ways, and the digests `carry` computes while the
chunks pass are those of the file itself (docs/design.md, decision 29; bench/move_memory.py
measures a whole move's peak RSS with a 1 GiB history)."""

from __future__ import annotations

import hashlib
import os
import tracemalloc
from pathlib import Path

import anyio
import nats
import pytest

from manager.broker import carry
from tests.conftest import SharedBroker

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

SIZE = 192 * 1024 * 1024
# A quarter of the file: a put of the file's bytes, or a get that gathered them, would hold
# all of it; the streaming paths hold a chunk (put) and the consumer's flow-control window (get).
BOUND = SIZE // 4
SPACE = "streamtest"


def incompressible(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with path.open("wb") as f:
        for _ in range(size // (1 << 20)):
            block = os.urandom(1 << 20)
            digest.update(block)
            f.write(block)
    return digest.hexdigest()


def digest_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


async def test_a_big_object_goes_in_and_out_in_bounded_memory(
    tmp_path: Path, shared_broker: SharedBroker
) -> None:
    src, dst = tmp_path / "packed.tar", tmp_path / "fetched.tar"
    want = (SIZE, incompressible(src, SIZE))
    nc = await nats.connect(shared_broker.url, nkeys_seed=shared_broker.creds)
    tracemalloc.start()
    try:
        with anyio.fail_after(120):
            put = await carry.put(nc.jetstream(), SPACE, "big", src)
            put_peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.reset_peak()
            got = await carry.get_into(nc.jetstream(), SPACE, "big", dst)
            get_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        await nc.close()
    assert put == want and got == want
    assert digest_of(dst) == want[1]
    assert put_peak < BOUND, f"put held {put_peak} bytes at once"
    assert get_peak < BOUND, f"get held {get_peak} bytes at once"
