"""The retained-reference file checks against real files with real modes: regular, reached
without a symlink, a credential still private, bytes still hashing to what the cut recorded."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from manager.checkpoint.references import reference_errors
from protocol.inventory import parse_resume_args
from tests.unit.test_inventory import ATTEMPT, UID, agent_doc, inventory_doc, raw


def seat_with(credential: Path, dependency: Path, *, cred_sha: str, dep_sha: str) -> Any:
    seat = agent_doc()
    seat["identity"] = {
        "mode": "static",
        "lifecycleUid": UID,
        "owner": "local",
        "credential": {"kind": "file", "path": str(credential), "sha256": cred_sha},
    }
    seat["dependencies"] = [{"kind": "profile", "path": str(dependency), "sha256": dep_sha}]
    return parse_resume_args(ATTEMPT, raw(inventory_doc([seat]))).agents[0]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_every_reference_holds_or_is_named(tmp_path: Path) -> None:
    cred, dep = tmp_path / "seat.creds", tmp_path / "profile.json"
    cred.write_bytes(b"SUAKEY\n")
    cred.chmod(0o600)
    dep.write_bytes(b'{"v":1}\n')
    dep.chmod(0o644)
    agent = seat_with(cred, dep, cred_sha=sha(b"SUAKEY\n"), dep_sha=sha(b'{"v":1}\n'))
    assert reference_errors(agent) == []

    cred.chmod(0o640)
    assert reference_errors(agent) == [
        f"retained identity file is not private (expected 0600): {cred}"
    ]
    cred.chmod(0o600)

    dep.write_bytes(b'{"v":2}\n')
    assert reference_errors(agent) == [f"retained dependency changed since the cut: {dep}"]
    cred.write_bytes(b"SUBOTHER\n")
    assert reference_errors(agent) == [
        f"retained credential changed after the cut: {cred}",
        f"retained dependency changed since the cut: {dep}",
    ]


def test_a_symlink_a_directory_and_a_missing_file_are_refused(tmp_path: Path) -> None:
    real = tmp_path / "real.creds"
    real.write_bytes(b"K\n")
    real.chmod(0o600)
    link = tmp_path / "link.creds"
    os.symlink(real, link)
    folder = tmp_path / "profile.d"
    folder.mkdir()
    agent = seat_with(link, folder, cred_sha=sha(b"K\n"), dep_sha=sha(b""))
    assert reference_errors(agent) == [
        f"retained reference is not a regular non-symlink file: {link}",
        f"retained reference is not a regular non-symlink file: {folder}",
    ]
    gone = tmp_path / "gone.creds"
    agent = seat_with(gone, real, cred_sha=sha(b"K\n"), dep_sha=sha(b"K\n"))
    assert reference_errors(agent) == [f"retained reference unavailable: {gone} (does not exist)"]
