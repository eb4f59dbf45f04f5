"""Packing a checkpoint hands it off (issue 12, item 2): one file with its digest, resumed on
another root with its own embedded broker, while the source root refuses to resume the same
seats unless the operator takes them back. Real brokers, real processes."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cli
from tests.gitrepo import git, init_repo, write
from tests.helpers import processes_mentioning, signer_key

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

PHRASE = "cedar-handoff-5"


def refusal(proc: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(proc.stderr.splitlines()[-1])
    return doc


def seed(root: Path) -> None:
    init_repo(root)
    write(root / "README.md", "# pack\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    write(root / "work.txt", "uncommitted at the cut\n")


def flip_in_member(packed: Path, out: Path, suffix: str) -> None:
    """A copy of `packed` with one byte flipped inside the data of the member ending `suffix`."""
    with tarfile.open(packed) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(suffix))
    data = bytearray(packed.read_bytes())
    data[member.offset_data + member.size // 2] ^= 0x01
    out.write_bytes(bytes(data))


def hostile_tar(out: Path, attempt: str, kind: str) -> None:
    with tarfile.open(out, "w", format=tarfile.USTAR_FORMAT) as tar:
        top = tarfile.TarInfo(attempt)
        top.type = tarfile.DIRTYPE
        top.mode = 0o700
        tar.addfile(top)
        if kind == "dotdot":
            body = b"escaped\n"
            info = tarfile.TarInfo(f"{attempt}/../evil")
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
        else:
            info = tarfile.TarInfo(f"{attempt}/link")
            info.type = tarfile.SYMTYPE
            info.linkname = "/etc/passwd"
            tar.addfile(info)


async def test_pack_hands_off_and_the_source_refuses(tmp_path: Path, cli: Cli) -> None:
    seed(cli.root)
    cli.run("up", "--detach")
    row = cli.json(
        "spawn", "default", "--agent", "scribe", "--prompt", f"Remember the phrase {PHRASE}."
    )
    cut = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    attempt = Path(cut["checkpointDir"])
    carried = tmp_path / "carried"
    carried.mkdir()
    packed = carried / f"{attempt.name}.tar"

    proc = cli.run("checkpoint", "pack", str(attempt), "-o", str(packed))
    digest = hashlib.sha256(packed.read_bytes()).hexdigest()
    assert proc.stdout.splitlines()[0] == f"{digest}  {packed}", proc.stdout
    assert "no fence spans brokers that cannot see each other" in proc.stderr
    # The cut stopped the embedded broker; pack started it only for as long as it needed it.
    assert processes_mentioning(str(cli.root / ".cotal" / "nats")) == []
    with tarfile.open(packed) as tar:
        names = tar.getnames()
        assert all(m.isreg() or m.isdir() for m in tar.getmembers())
    assert names[0] == attempt.name and not any("/auth" in n for n in names)
    listed = cli.json("checkpoint", "list")["checkpoints"]
    [entry] = listed
    assert entry["handedOff"]["sha256"] == digest and entry["journalState"] == "ready"
    status = cli.json("status")
    assert [h["attemptId"] for h in status["handedOff"]] == [attempt.name]
    assert status["waiting"][0]["what"] == "handed-off"
    # Packing again keeps the hand-off as first recorded; the file is never overwritten.
    again = cli.run("checkpoint", "pack", str(attempt), "-o", str(packed), "--json", check=False)
    assert again.returncode == 2 and refusal(again)["code"] == "output-exists"

    key = signer_key(cli.root)
    source = cli.root.with_name("ws.src")
    os.rename(cli.root, source)
    cli.root.mkdir()

    # Damage or hostility refuses before anything is left at the destination.
    bad = carried / "bad.tar"
    flip_in_member(packed, bad, "default/checkpoint.json")
    proc = cli.run("up", "--restore", str(bad), "--trust-signer", key, "--json", check=False)
    assert proc.returncode == 2 and refusal(proc)["code"] == "integrity", proc.stderr
    assert list(cli.root.iterdir()) == []
    for kind in ("dotdot", "symlink"):
        evil = carried / f"{kind}.tar"
        hostile_tar(evil, attempt.name, kind)
        proc = cli.run("up", "--restore", str(evil), "--trust-signer", key, "--json", check=False)
        assert proc.returncode == 2 and refusal(proc)["code"] == "unsafe-archive", proc.stderr
        assert list(cli.root.iterdir()) == []
    assert not (cli.root.parent / "evil").exists() and not list(tmp_path.rglob("evil"))

    # Host B: its own embedded broker, from the packed file alone.
    out = cli.run("up", "--restore", str(packed), "--trust-signer", key, "--json")
    [seat] = json.loads(out.stdout)["seats"]
    assert seat["sameSession"] and seat["sameUid"], seat
    assert seat["uidAfter"] == row["lifecycleUid"] and seat["sessionAfter"] == row["sessionId"]
    reply = cli.json("send", "default", "What was the phrase?", "--wait")
    assert reply["reply"] == f"The phrase is {PHRASE}."
    # The staging directory served its resume and is gone.
    assert list((cli.root / ".cotal" / "maintenance" / "v1" / "incoming").iterdir()) == []
    cli.run("down")
    # The same file again, at a root that already resumed it: refused, and no copy left.
    proc = cli.run("up", "--restore", str(packed), "--trust-signer", key, "--json", check=False)
    assert proc.returncode == 2 and refusal(proc)["code"] == "custody-lost", proc.stderr
    assert list((cli.root / ".cotal" / "maintenance" / "v1" / "incoming").iterdir()) == []

    # Host A again, its own broker: the same checkpoint is refused, named and dated.
    os.rename(cli.root, cli.root.with_name("ws.b"))
    os.rename(source, cli.root)
    proc = cli.run("up", "--restore", str(attempt), "--json", check=False)
    assert proc.returncode == 2, proc.stderr
    doc = refusal(proc)
    assert doc["code"] == "handed-off" and attempt.name in doc["error"], doc
    assert entry["handedOff"]["packedAt"] in doc["error"] and "--take-back" in doc["error"]
    assert processes_mentioning(str(cli.root / ".cotal" / "nats")) == []
    # The packed file brought back to A is refused the same way.
    proc = cli.run("up", "--restore", str(packed), "--json", check=False)
    assert proc.returncode == 2 and refusal(proc)["code"] == "handed-off", proc.stderr

    # Taken back explicitly, the seats resume here.
    out = cli.run("up", "--restore", str(attempt), "--take-back", "--json")
    assert "two hosts will run the same seat" in out.stderr
    [seat] = json.loads(out.stdout)["seats"]
    assert seat["sameUid"] and seat["uidAfter"] == row["lifecycleUid"]
    [entry] = cli.json("checkpoint", "list")["checkpoints"]
    assert entry["handedOff"]["takenBackAt"] is not None
    assert cli.json("status")["handedOff"] == []
    cli.run("down")

    # A new lifecycle of the same seat name is a new seat: nothing about the hand-off stops it.
    cli.run("up", "--detach")
    fresh = cli.json("spawn", "default", "--agent", "scribe", "--prompt", "hello")
    assert fresh["lifecycleUid"] != row["lifecycleUid"]
    cli.run("down")
