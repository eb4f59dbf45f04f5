"""The harness's version travels (issue 41, item 5): a cut records each seat's harness and the
version its connector's check reported, and a destination refuses, by name and before any
claim, a version its connector was not measured against, the one the seat ran or the one
installed there, with the move probe's own words (`admit.harness_refusal`). A record sealed
before the fields travelled decodes, verifies as it was signed, and is admitted as before.

Real managers, a real broker, real seat processes (scribe; pi where the pinned pi is
installed), cut once per test and read back for every assertion.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
import pytest

from connectors.harnesses import load_pins
from connectors.scribe.connector import ScribeConnector
from manager import registry
from manager.checkpoint import admit
from manager.checkpoint.reader import read_seat_checkpoint
from manager.coord.admission import agent_settings
from protocol.checkpoint import CHECKPOINT_FILE, SeatCheckpoint, decode_seat_checkpoint
from protocol.errors import DecodeError, Refusal
from tests.ckpt import (
    Cut,
    broker_args,
    make_cut,
    move_source_away,
    reseal,
    seed_tree,
    source_identity,
)
from tests.conftest import PI_CLI, Cli, FakeServer, SharedBroker
from tests.gitrepo import write
from tests.integration.test_admission import refused

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

SEAT = "scribe1"


def _admission(copy: Path, key: str) -> admit.Admission:
    return admit.integrity(copy, trusted_keys=[key])


def _older(record: SeatCheckpoint) -> SeatCheckpoint:
    """The record as a cotal from before the fields travelled sealed it."""
    return msgspec.structs.replace(record, harness=msgspec.UNSET, harness_version=msgspec.UNSET)


async def test_a_scribe_seat_records_its_harness_and_an_older_record_still_verifies(
    cli: Cli, shared_broker: SharedBroker, tmp_path: Path
) -> None:
    cut = make_cut(cli, shared_broker, tmp_path / "ckpt")
    record = read_seat_checkpoint(cut.copy / SEAT, trusted_keys=[cut.signer_key])
    version = ScribeConnector.builtin_version()
    assert (record.harness, record.harness_version) == ("scribe", version)
    sealed = json.loads((cut.copy / SEAT / CHECKPOINT_FILE).read_text())
    assert (sealed["harness"], sealed["harnessVersion"]) == ("scribe", version)

    # This host's scribe is the one that ran: admitted.
    settings = agent_settings(registry.load_config(cli.root))
    admit.harnesses(_admission(cut.copy, cut.signer_key), settings)

    identity = source_identity(cli.root)
    # A record sealed before the fields travelled: no key of them in its bytes, it decodes and
    # verifies exactly as it was signed, and the harness gate admits it as before.
    old = reseal(cut.copy, tmp_path / "old", identity, edit=_older)
    data = (old / SEAT / CHECKPOINT_FILE).read_bytes()
    assert b"harness" not in data
    decoded = decode_seat_checkpoint(data)
    assert decoded.harness is msgspec.UNSET and decoded.harness_version is msgspec.UNSET
    assert read_seat_checkpoint(old / SEAT, trusted_keys=[cut.signer_key]) == decoded
    admit.harnesses(_admission(old, cut.signer_key), settings)

    # A scribe of another cotal: its session format is not this build's, refused by name.
    other = reseal(
        cut.copy,
        tmp_path / "other",
        identity,
        edit=lambda r: msgspec.structs.replace(r, harness_version="cotal 0.0.1"),
    )
    with pytest.raises(Refusal) as refusal:
        admit.harnesses(_admission(other, cut.signer_key), settings)
    assert refusal.value.code == "harness-version"
    assert refusal.value.message == (
        f"admission refused at the identity gate: seat {SEAT}: this host has scribe {version} "
        f"(built-in), the seat ran cotal 0.0.1 at the source, and this build's scribe "
        f"connector resumes sessions of scribe {version} only"
    )
    assert refusal.value.cure == (
        "install at the destination a cotal whose scribe connector was measured against cotal "
        "0.0.1, then its harness (`cotal tools install`), or run the seat under scribe "
        f"{version} at the source and cut it again; nothing was claimed"
    )

    # Strict: a version that is not one printable line, or a harness the entry does not
    # launch, is not a record.
    raw = json.loads(data)
    for field, value in (
        ("harnessVersion", "0.73.1\nforged"),
        ("harnessVersion", "x" * 129),
        ("harness", "pi"),
    ):
        forged = {**raw, "harness": "scribe", "harnessVersion": version, field: value}
        with pytest.raises(DecodeError):
            decode_seat_checkpoint(json.dumps(forged).encode())
    with pytest.raises(DecodeError):
        decode_seat_checkpoint(json.dumps({**raw, "harnessVersion": version}).encode())


def _pi_config(server: FakeServer, extra: str = "") -> str:
    return f'[agents.pi]\nbase_url = "{server.base_url}"\nmodel = "fake-model"\n{extra}'


def _cut_with_pi(cli: Cli, b: SharedBroker, server: FakeServer, copy_to: Path) -> Cut:
    """A scribe seat and a pi seat (the pinned pi) cut by one real manager, copied out."""
    seed_tree(cli.root)
    write(cli.root / "cotal.toml", _pi_config(server))
    cli.run("up", "--detach", *broker_args(b))
    rows = {
        SEAT: cli.json("spawn", SEAT),
        "coder": cli.json("spawn", "coder", "--agent", "pi"),
    }
    result = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    assert result["journal"] == "ready" and result["failures"] == [], result
    shutil.copytree(Path(result["checkpointDir"]), copy_to)
    key = source_identity(cli.root).public_key_b64
    return Cut(cli.root, Path(result["checkpointDir"]), copy_to, result["attemptId"], rows, b, key)


@pytest.mark.pi
@pytest.mark.skipif(
    not PI_CLI.is_file(), reason="pi is not installed under .tools/pi (make harnesses)"
)
async def test_a_restore_where_pi_is_another_version_is_refused_before_any_claim(
    cli: Cli, shared_broker: SharedBroker, fake_openai: FakeServer, tmp_path: Path
) -> None:
    cut = _cut_with_pi(cli, shared_broker, fake_openai, tmp_path / "ckpt")
    pinned = load_pins()["pi"].version
    coder = read_seat_checkpoint(cut.copy / "coder", trusted_keys=[cut.signer_key])
    assert (coder.harness, coder.harness_version) == ("pi", pinned)
    scribe = read_seat_checkpoint(cut.copy / SEAT, trusted_keys=[cut.signer_key])
    assert (scribe.harness, scribe.harness_version) == ("scribe", ScribeConnector.builtin_version())

    # The destination takes the source root's path; its cotal.toml binds pi to a program that
    # says it is another version (a host binding, not part of the launch profile).
    source = move_source_away(cut)
    other = tmp_path / "pi-other"
    other.write_text("#!/bin/sh\necho 0.0.9\n")
    other.chmod(0o755)
    write(cli.root / "cotal.toml", _pi_config(fake_openai, f'binary = "{other}"\n'))
    message = await refused(
        cli,
        cut,
        cut.copy,
        code="harness-version",
        contains=[],
        seats=(SEAT, "coder"),
    )
    assert message == (
        f"admission refused at the identity gate: seat coder: this host has pi 0.0.9 ({other}), "
        f"the seat ran {pinned} at the source; this build's pi connector resumes sessions of "
        f"pi {pinned} only; install pi {pinned} at the destination (`cotal tools install`, or "
        "agents.pi.binary in its cotal.toml), or resume it on a host that has it; nothing was "
        "claimed"
    )

    # The same checkpoint sealed as an older cotal sealed it, without the version: the harness
    # gate admits it as before.
    settings = agent_settings(registry.load_config(cli.root))
    old = reseal(cut.copy, tmp_path / "old", source_identity(source), edit=_older)
    admit.harnesses(_admission(old, cut.signer_key), settings)
