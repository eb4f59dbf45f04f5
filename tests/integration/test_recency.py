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
    assert "no override exists" in doc["error"]
    assert _listing(cli.root) == before
    assert Journal(Layout.at(cli.root)).load() is None


def test_the_real_reading_is_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(clock.TEST_HOOK_ENV, raising=False)
    reading = clock.read_clock()
    assert reading.source == "kernel"
    assert reading.detail.startswith("adjtimex state ")
    # The flag and the state agree with what the reading concluded.
    assert ("STA_UNSYNC" in reading.detail or "TIME_ERROR" in reading.detail) != (
        reading.synchronized
    )
