"""Recency as the deployment states it: the horizon from `cotal.toml`, recorded in every
checkpoint, and a destination clock the kernel does not call synchronized refused outright."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from manager.checkpoint import clock
from manager.workspace.journal import Journal
from manager.workspace.layout import Layout
from tests.conftest import Cli
from tests.gitrepo import git, init_repo, write
from tests.helpers import carry_to_new_host, trusting

pytestmark = pytest.mark.usefixtures("isolated_home")


def _cut_with_horizon(cli: Cli, horizon_s: int) -> Path:
    init_repo(cli.root)
    write(cli.root / "cotal.toml", f"[recency]\nhorizon_s = {horizon_s}\n")
    write(cli.root / "f.txt", "x\n")
    git(cli.root, "add", "cotal.toml", "f.txt")
    git(cli.root, "commit", "-q", "-m", "one")
    cli.run("up", "--detach")
    cli.run("spawn", "a", "--agent", "scribe", "--prompt", "Remember the phrase clock-11.")
    return Path(json.loads(cli.run("down", "--preserve-state", "--json").stdout)["checkpointDir"])


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_the_horizon_is_the_deployments_and_travels_in_the_checkpoint(
    cli: Cli, tmp_path: Path
) -> None:
    ckpt = _cut_with_horizon(cli, 120)
    record = json.loads((ckpt / "a" / "checkpoint.json").read_bytes())
    assert record["recencyHorizonMs"] == 120_000
    carried = tmp_path / "carried"
    carried.mkdir()
    copy = carry_to_new_host(cli.root, ckpt, carried, trust=False)
    resumed = cli.run("up", "--restore", str(copy), *trusting(copy), "--detach")
    assert "admitted: integrity, identity and recency pass for every seat" in resumed.stderr
    assert f"{clock.TEST_HOOK_ENV}=synchronized stands in for the kernel's reading" in (
        resumed.stderr
    )
    cli.run("down")


def test_an_unsynchronized_destination_clock_refuses_and_changes_nothing(
    cli: Cli, tmp_path: Path
) -> None:
    ckpt = _cut_with_horizon(cli, 3600)
    carried = tmp_path / "carried"
    carried.mkdir()
    copy = carry_to_new_host(cli.root, ckpt, carried, trust=False)
    before = _listing(cli.root)
    unsynced = {clock.TEST_HOOK_ENV: "unsynchronized"}
    proc = cli.run(
        "up", "--restore", str(copy), *trusting(copy), "--accept-stale-checkpoint", "--json",
        env=unsynced, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    doc = json.loads(proc.stderr.strip().splitlines()[-1])
    assert doc["code"] == "clock-unsynchronized", doc
    assert doc["error"].startswith(
        "admission refused at the recency gate: this host's clock is not synchronized "
        f"({clock.TEST_HOOK_ENV}=unsynchronized), so no checkpoint's age can be judged"
    )
    assert "no per-run override exists" in doc["error"]
    assert '[recency] clock = "trusted" with clock_reason' in doc["error"]
    assert _listing(cli.root) == before
    assert Journal(Layout.at(cli.root)).load() is None


REASON = "the VM's clock is kept by its hypervisor; no time daemon in this container"
DECLARED = (
    f"trusted by the operator's declaration ({REASON}); the kernel reads "
    f"{clock.TEST_HOOK_ENV}=unsynchronized"
)


def test_a_declared_clock_admits_and_says_so_everywhere(cli: Cli, tmp_path: Path) -> None:
    """A host that cannot run a time daemon: the operator's declaration in cotal.toml lets its
    clock judge ages (the test hook standing in for the kernel's unsynchronized answer), and
    the admission prints it, returns it and journals it, and `status` shows it."""
    ckpt = _cut_with_horizon(cli, 3600)
    carried = tmp_path / "carried"
    carried.mkdir()
    copy = carry_to_new_host(cli.root, ckpt, carried, trust=False)
    write(
        cli.root / "cotal.toml",
        f'[recency]\nhorizon_s = 3600\nclock = "trusted"\nclock_reason = "{REASON}"\n',
    )
    unsynced = {clock.TEST_HOOK_ENV: "unsynchronized"}
    proc = cli.run(
        "up", "--restore", str(copy), *trusting(copy), "--json", env=unsynced
    )  # fmt: skip
    note = {"source": clock.DECLARED, "detail": DECLARED}
    assert json.loads(proc.stdout)["clock"] == note
    assert f"clock: {DECLARED} ({clock.DECLARED})" in proc.stderr
    record = Journal(Layout.at(cli.root)).load()
    assert record is not None and record.state == "retired"
    assert (record.clock.source, record.clock.detail) == (clock.DECLARED, DECLARED)
    # The restored tree carries the cotal.toml the cut committed, without the declaration:
    # this host's own is kept aside, and `status` reads what the manager now reads.
    write(
        cli.root / "cotal.toml",
        f'[recency]\nhorizon_s = 3600\nclock = "trusted"\nclock_reason = "{REASON}"\n',
    )
    shown = cli.run("status", env=unsynced).stdout
    assert f"clock     synchronized, by {clock.DECLARED}: {DECLARED}" in shown
    status = json.loads(cli.run("status", "--json", env=unsynced).stdout)
    assert status["clock"] == {"synchronized": True, **note}
    cli.run("down")


def test_the_test_hook_is_journaled_where_it_stands_in(cli: Cli, tmp_path: Path) -> None:
    ckpt = _cut_with_horizon(cli, 3600)
    carried = tmp_path / "carried"
    carried.mkdir()
    copy = carry_to_new_host(cli.root, ckpt, carried, trust=False)
    proc = cli.run("up", "--restore", str(copy), *trusting(copy), "--json")
    hooked = {"source": clock.TEST_HOOK_ENV, "detail": f"{clock.TEST_HOOK_ENV}=synchronized"}
    assert json.loads(proc.stdout)["clock"] == hooked
    record = Journal(Layout.at(cli.root)).load()
    assert record is not None and record.clock is not None
    assert (record.clock.source, record.clock.detail) == (hooked["source"], hooked["detail"])
    cli.run("down")


@pytest.mark.parametrize(
    ("table", "fault"),
    [
        ('clock = "trusted"\n', '[recency] clock = "trusted" needs clock_reason'),
        ('clock_reason = "why"\n', '[recency] clock_reason is only read with clock = "trusted"'),
        ('clock = "sometimes"\n', "Invalid enum value 'sometimes' - at `$.recency.clock`"),
    ],
)
def test_a_clock_declaration_is_strict(tmp_path: Path, table: str, fault: str) -> None:
    from manager import registry
    from protocol.errors import Refusal

    write(tmp_path / "cotal.toml", "[recency]\n" + table)
    with pytest.raises(Refusal) as err:
        registry.load_config(tmp_path)
    assert err.value.code == "bad-config"
    assert fault in err.value.message, err.value.message


def test_the_real_reading_is_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(clock.TEST_HOOK_ENV, raising=False)
    reading = clock.read_clock()
    assert reading.source == "kernel"
    assert reading.detail.startswith("adjtimex state ")
    # The flag and the state agree with what the reading concluded.
    assert ("STA_UNSYNC" in reading.detail or "TIME_ERROR" in reading.detail) != (
        reading.synchronized
    )
