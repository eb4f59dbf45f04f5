"""One broker per store, always: a second embedded broker on a store that a live broker owns is
refused before it touches a file, the lock dies with the broker that held it, and every refusal
after a command started a broker stops that broker (one that ran before the command is kept)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import msgspec
import pytest

from manager.broker import embedded
from manager.checkpoint import admit
from manager.procs import pid_identity
from manager.workspace.journal import Journal, write_resume_document
from manager.workspace.layout import Layout
from manager.workspace.lock import MaintenanceLock
from protocol.errors import Refusal
from tests.conftest import Cli
from tests.gitrepo import git, init_repo, write
from tests.helpers import carry_to_new_host, trusting, wait_gone, wait_until

PHRASE = "lone-broker-4"


def signer_of(checkpoint: Path) -> str:
    key = json.loads((checkpoint / "manifest.json").read_text())["signer"]["publicKey"]
    assert isinstance(key, str)
    return key


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


# -- every refusal after a broker start stops that broker -----------------------------------------


def owners(root: Path) -> list[int]:
    return embedded.store_owners(Layout.at(root).nats_store)


def refused(out: subprocess.CompletedProcess[str], code: str) -> None:
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert json.loads(out.stderr.strip().splitlines()[-1])["code"] == code, out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def break_manager_log(root: Path) -> None:
    """The manager dies at start: its log path is a directory it cannot open."""
    log = Layout.at(root).manager_log
    log.parent.mkdir(parents=True, exist_ok=True)
    log.mkdir()


@pytest.mark.usefixtures("isolated_home")
def test_up_whose_manager_fails_stops_the_broker_it_started(cli: Cli) -> None:
    break_manager_log(cli.root)
    refused(cli.run("up", "--detach", "--json", check=False), "daemon-failed")
    assert owners(cli.root) == []


@pytest.mark.usefixtures("isolated_home")
async def test_up_whose_manager_fails_keeps_a_broker_that_was_running_before(cli: Cli) -> None:
    cli.run("up", "--detach")
    record = json.loads((cli.root / ".cotal/mesh.json").read_text())
    broker, manager = record["embeddedBroker"]["pid"], record["manager"]["pid"]
    os.kill(manager, signal.SIGKILL)
    await wait_gone([manager])
    Layout.at(cli.root).manager_log.unlink()
    break_manager_log(cli.root)
    refused(cli.run("up", "--detach", "--json", check=False), "daemon-failed")
    # The broker was there before the command, with the store its mesh names: not its to stop.
    assert owners(cli.root) == [broker]
    embedded.stop_embedded(pid_identity(broker))


@pytest.fixture
def sealed(cli: Cli, tmp_path: Path) -> Path:
    """A sealed checkpoint of one scribe seat (phrase remembered), carried out of a root that
    is then empty: the destination is the same path on a new host."""
    repo = init_repo(cli.root / "repo")
    write(repo / "a.txt", "a\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "a")
    cli.run("up", "--detach")
    cli.json("spawn", "w", "--cwd", str(repo))
    cli.run("send", "w", f"remember the phrase {PHRASE}", "--wait")
    result = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    return carry_to_new_host(cli.root, Path(result["checkpointDir"]), tmp_path / "carried")


def fresh(root: Path) -> None:
    shutil.rmtree(root)
    root.mkdir()


def restore(cli: Cli, checkpoint: Path) -> subprocess.CompletedProcess[str]:
    return cli.run("up", "--restore", str(checkpoint), *trusting(checkpoint), "--json", check=False)


@pytest.mark.usefixtures("isolated_home")
async def test_each_refusal_of_a_resume_after_its_broker_started_stops_it(
    cli: Cli, sealed: Path
) -> None:
    layout = Layout.at(cli.root)
    # The maintenance lock held by a live process (this one) for another attempt.
    layout.maintenance.mkdir(parents=True)
    with MaintenanceLock(layout, "elsewhere-1"):
        refused(restore(cli, sealed), "lock-held")
    assert owners(cli.root) == []

    # A journal at another attempt.
    fresh(cli.root)
    adm = admit.integrity(sealed, trusted_keys=[signer_of(sealed)])
    Journal(layout).advance(
        "elsewhere-2", "cut-intent", resume=write_resume_document(layout, adm.inventory)
    )
    refused(restore(cli, sealed), "journal-busy")
    assert owners(cli.root) == []

    # A journal at this attempt whose resume document is not the one the checkpoint seals.
    fresh(cli.root)
    other = msgspec.structs.replace(adm.inventory, created_at="2020" + adm.inventory.created_at[4:])
    Journal(layout).advance(
        adm.manifest.attempt_id, "cut-intent", resume=write_resume_document(layout, other)
    )
    refused(restore(cli, sealed), "journal-mismatch")
    assert owners(cli.root) == []

    # A staging directory in the way of the tree restore: custody is claimed and the inbox
    # imported by then, which a rerun answers as its own.
    fresh(cli.root)
    (cli.root / "repo.incoming").mkdir()
    refused(restore(cli, sealed), "staging-exists")
    assert owners(cli.root) == []
    (cli.root / "repo.incoming").rmdir()
    out = restore(cli, sealed)
    assert out.returncode == 0, out.stderr
    reply = cli.json("send", "w", "What was the phrase?", "--wait")["reply"]
    assert reply == f"The phrase is {PHRASE}."
    cli.run("down")
    assert owners(cli.root) == []

    # The same checkpoint again, into the broker that already took it: the custody claim is
    # refused at the broker (after the journal and this root's generation claim).
    refused(restore(cli, sealed), "custody-lost")
    record = Journal(layout).load()
    assert record is not None and record.state == "degraded"
    assert owners(cli.root) == []
