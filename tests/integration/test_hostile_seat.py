"""A hostile seat reaches none of the manager's authority.

The seat runs tests/fixtures/hostile_seat.py (a stand-in speaking the jcode connector's
protocol, launched through `agents.jcode.binary`). From inside the seat it tries to read the
control token, the broker credential, the signing key, the manager's log, another seat's store
and pointer, the manager's environment (which holds a fake `OPENAI_API_KEY`) and memory, to
signal the manager, to lift the overmount, and to use the control socket with a token the test
hands it in a loot directory next to a hard link to the socket, so only the socket's seat check
stands between it and the daemon. Every attempt must fail, and the manager's log must record
the refused connection. Before the hostile seat runs, the test reads each target itself from
outside the seat, so a target that does not exist cannot make an attempt fail by accident.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, Cli

pytestmark = pytest.mark.usefixtures("isolated_home")
HOSTILE = REPO / "tests" / "fixtures" / "hostile_seat.py"
SECRET_ENV = {"OPENAI_API_KEY": "sk-test-secret"}


def _hostile_binary(tmp_path: Path) -> Path:
    b = tmp_path / "bin" / "hostile"
    b.parent.mkdir()
    b.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{HOSTILE}" "$@"\n')
    b.chmod(0o755)
    return b


def _log_events(root: Path) -> list[dict[str, object]]:
    log = root / ".cotal" / "logs" / "manager.log"
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def test_a_hostile_seat_reaches_none_of_the_managers_authority(tmp_path: Path, cli: Cli) -> None:
    root = cli.root
    (root / "cotal.toml").write_text(f'[agents.jcode]\nbinary = "{_hostile_binary(tmp_path)}"\n')
    cli.run("up", "--detach", env=SECRET_ENV)
    try:
        doctor = [json.loads(line) for line in cli.run("doctor", "--json").stdout.splitlines()]
        [isolation] = [row for row in doctor if row["name"] == "isolation"]
        assert isolation["hidesSecrets"], isolation

        victim = cli.json("spawn", "victim")
        assert cli.json("send", "victim", "remember the phrase quartz-owl-17", "--wait")["reply"]
        auth = root / ".cotal" / "auth"
        store = root / ".cotal" / "sessions" / "scribe" / f"victim-{victim['lifecycleUid']}.store"
        [victim_session] = sorted(store.iterdir())
        mesh = json.loads((root / ".cotal" / "mesh.json").read_text())
        [signing_key] = sorted(auth.glob("manager-instance.*.json"))
        files = {
            "control token": auth / "control.token",
            "broker credential": auth / "broker.creds",
            "signing key": signing_key,
            "manager log": root / ".cotal" / "logs" / "manager.log",
            "other seat's session": victim_session,
            "other seat's pointer": store.with_suffix(".json"),
        }
        dirs = {
            ".cotal/auth": auth,
            "other seat's store": store,
            ".cotal/logs": root / ".cotal" / "logs",
        }
        # Every target is there and readable from outside the seat.
        for path in files.values():
            assert path.read_bytes(), path
        for path in dirs.values():
            assert os.listdir(path), path
        assert b"sk-test-secret" in Path(f"/proc/{mesh['manager']['pid']}/environ").read_bytes()

        loot = tmp_path / "loot"
        loot.mkdir()
        (loot / "control.token").write_text((auth / "control.token").read_text())
        os.link(root / ".cotal" / "manager.sock", loot / "manager.sock")
        plan = {
            "root": str(root),
            "managerPid": mesh["manager"]["pid"],
            "files": {k: str(v) for k, v in files.items()},
            "dirs": {k: str(v) for k, v in dirs.items()},
            "stolenToken": str(loot / "control.token"),
            "stolenSocket": str(loot / "manager.sock"),
        }
        (root / "hostile-plan.json").write_text(json.dumps(plan))

        row = cli.json("spawn", "hostile", "--agent", "jcode")
        assert row["state"] == "running"
        results = json.loads((root / "hostile-result.json").read_text())
        reached = [r for r in results if r["reached"]]
        assert not reached, json.dumps(reached, indent=1)
        by_target = {r["target"]: r["detail"] for r in results}
        assert by_target["control socket, stolen token"].startswith("closed without a reply")
        assert len(results) >= 25

        refused = [
            e
            for e in _log_events(root)
            if e.get("event") == "control.refused" and e.get("reason") == "seat-process"
        ]
        assert refused, "the refused seat connection is not in the manager log"
        token = (auth / "control.token").read_text().strip()
        assert token not in (root / ".cotal" / "logs" / "manager.log").read_text()

        # Isolated, the seat still does its work, and ps says how it is isolated.
        assert cli.json("send", "hostile", "hello", "--wait")["reply"] == "OK."
        rows = {r["name"]: r for r in cli.ps()}
        assert rows["hostile"]["isolation"] == isolation["mode"]
        assert rows["victim"]["isolation"] == isolation["mode"]
        assert "ISOLATION" in cli.run("ps", "--wide").stdout
        # The operator's own CLI, outside every seat, is still served.
        assert cli.json("status")["state"] == "active"
    finally:
        cli.run("down", check=False)
