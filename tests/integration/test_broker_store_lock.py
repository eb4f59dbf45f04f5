"""One broker per store, always: a second embedded broker on a store that a live broker owns is
refused before it touches a file, and the lock dies with the broker that held it."""

from __future__ import annotations

import fcntl
import os
import signal
from pathlib import Path

import pytest

from manager.broker import embedded
from protocol.errors import Refusal
from tests.helpers import wait_gone, wait_until

pytestmark = pytest.mark.anyio


def lock_free(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


async def test_a_second_broker_on_one_store_is_refused_until_the_first_dies(
    tmp_path: Path,
) -> None:
    store, creds = tmp_path / "nats", tmp_path / "auth" / "broker.creds"
    first = embedded.start_embedded(store, creds, log_path=tmp_path / "first.log")
    try:
        conf_before = (store / "server.conf").read_bytes()
        with pytest.raises(Refusal) as refused:
            embedded.start_embedded(store, creds, log_path=tmp_path / "second.log")
        assert refused.value.code == "broker-running"
        assert str(store) in refused.value.message
        # Refused before anything was written: the running broker's config is untouched.
        assert (store / "server.conf").read_bytes() == conf_before
        assert not (tmp_path / "second.log").exists()
        # A broker that dies without any cleanup releases the store with it.
        os.kill(first.pid, signal.SIGKILL)
        await wait_gone([first.pid], timeout=10)
        # A Go broker's leader thread shows as a zombie while its other threads still hold the
        # descriptor table, so the lock is free a moment after the pid looks gone.
        await wait_until(lambda: lock_free(store / "owner.lock"), timeout=10)
        second = embedded.start_embedded(store, creds, log_path=tmp_path / "second.log")
        embedded.stop_embedded(second.identity)
    finally:
        if embedded.alive(first.identity):
            embedded.stop_embedded(first.identity)
