"""A pack sealed to one destination (issue 24, item 5): `cotal checkpoint pack --to KEY`
encrypts the file to root B's box key. Root C, which trusts the signer, refuses it by name and
is left exactly as it was; the file holds neither the transcript nor the repository's content
in plaintext; a flipped byte or a cut-short copy refuses `sealed-corrupt` at B with nothing
left behind; B resumes the file and the seat answers. Without `--to` the pack says that any
trusting host can resume it. Real brokers, real git, real processes.

B's and C's box keys are made with `box_public_key`, the function `cotal status` prints the key
with."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from manager.workspace.boxkey import box_public_key
from manager.workspace.layout import Layout
from tests.ckpt import snapshot
from tests.conftest import Cli
from tests.gitrepo import git, init_repo, write
from tests.helpers import processes_mentioning, signer_key

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

PHRASE = "larch-sealed-41"
WORK = "uncommitted-juniper-sealed-17"


def refusal(proc: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(proc.stderr.splitlines()[-1])
    return doc


def seed(root: Path) -> None:
    init_repo(root)
    write(root / "README.md", "# sealed pack\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    write(root / "work.txt", f"{WORK}\n")


def cut_with_a_seat(cli: Cli) -> tuple[dict[str, Any], Path]:
    seed(cli.root)
    cli.run("up", "--detach")
    row = cli.json(
        "spawn", "default", "--agent", "scribe", "--prompt", f"Remember the phrase {PHRASE}."
    )
    cut = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    return row, Path(cut["checkpointDir"])


def holds(directory: Path, needle: bytes) -> list[str]:
    return sorted(
        str(p.relative_to(directory))
        for p in directory.rglob("*")
        if p.is_file() and needle in p.read_bytes()
    )


def new_root(path: Path) -> tuple[Path, str]:
    path.mkdir()
    return path, box_public_key(Layout.at(path))


async def test_a_pack_sealed_to_b_opens_at_b_only(tmp_path: Path, cli: Cli) -> None:
    b, b_key = new_root(tmp_path / "ws.b")
    c, c_key = new_root(tmp_path / "ws.c")
    row, attempt = cut_with_a_seat(cli)
    carried = tmp_path / "carried"
    carried.mkdir()
    packed = carried / f"{attempt.name}.sealed"

    proc = cli.run("checkpoint", "pack", str(attempt), "-o", str(packed), "--to", b_key)
    data = packed.read_bytes()
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{hashlib.sha256(data).hexdigest()}  {packed}", proc.stdout
    assert lines[2] == (
        f"sealed to box key {b_key}: only the root whose `cotal status` prints it can resume it"
    )
    # One destination, so no warning about two of them.
    assert "no fence spans brokers" not in proc.stderr, proc.stderr
    again = carried / "again.sealed"
    doc = cli.json("checkpoint", "pack", str(attempt), "-o", str(again), "--to", b_key)
    assert (
        doc["sealedTo"] == b_key and doc["sha256"] == hashlib.sha256(again.read_bytes()).hexdigest()
    )
    # A key that is not a box key refuses before anything is packed.
    pack_x = ("checkpoint", "pack", str(attempt), "-o", str(carried / "x"))
    bad = cli.run(*pack_x, "--to", "x25519:nope", "--json", check=False)
    assert (bad.returncode, refusal(bad)) == (
        2,
        {
            "ok": False,
            "code": "bad-box-key",
            "error": "'x25519:nope' is not a box key (expected x25519: and 43 characters of "
            "base64url); pass the destination root's box key exactly as its `cotal status` "
            "prints it; nothing was packed",
        },
    )
    assert not (carried / "x").exists()

    # The cut holds the transcript and the uncommitted file in plaintext; the sealed file not.
    assert holds(attempt, PHRASE.encode()) and holds(attempt, WORK.encode())
    assert PHRASE.encode() not in data and WORK.encode() not in data
    assert b"ustar" not in data and attempt.name.encode() not in data

    key = signer_key(cli.root)
    os.rename(cli.root, cli.root.with_name("ws.src"))

    # Host C trusts the signer, and is not the recipient: refused by name, nothing touched.
    os.rename(c, cli.root)
    cli.run("trust", "add", key, "--name", "host-a")
    before = snapshot(cli.root)
    proc = cli.run("up", "--restore", str(packed), "--json", check=False)
    assert (proc.returncode, refusal(proc)) == (
        2,
        {
            "ok": False,
            "code": "sealed-to-other",
            "error": f"packed checkpoint {packed} is sealed to box key {b_key}; this root's box "
            f"key is {c_key}; resume it on the root whose `cotal status` prints that key, or "
            f"pack it again on the source with --to {c_key} (this root's key from `cotal "
            "status`); nothing was written",
        },
    ), proc.stderr
    assert snapshot(cli.root) == before
    assert processes_mentioning(str(cli.root / ".cotal" / "nats")) == []
    os.rename(cli.root, c)

    # Host B: a flipped byte and a cut-short copy refuse, and leave B as it was.
    os.rename(b, cli.root)
    before = snapshot(cli.root)
    flipped = carried / "flipped.sealed"
    damaged = bytearray(data)
    damaged[len(data) // 2] ^= 0x01
    flipped.write_bytes(bytes(damaged))
    short = carried / "short.sealed"
    short.write_bytes(data[: len(data) - 100])
    for bad_copy in (flipped, short):
        proc = cli.run(
            "up", "--restore", str(bad_copy), "--trust-signer", key, "--json", check=False
        )
        assert proc.returncode == 2, proc.stderr
        doc = refusal(proc)
        assert doc["code"] == "sealed-corrupt", doc
        assert doc["error"].startswith(f"sealed packed checkpoint {bad_copy}: chunk "), doc
        assert "fails authentication: the file was altered, cut short, reordered" in doc["error"]
        assert snapshot(cli.root) == before
        assert not (cli.root / ".cotal" / "maintenance").exists()
        assert processes_mentioning(str(cli.root / ".cotal" / "nats")) == []

    # B resumes the sealed file: same uid, same session, and the seat remembers.
    out = cli.run("up", "--restore", str(packed), "--trust-signer", key, "--json")
    [seat] = json.loads(out.stdout)["seats"]
    assert seat["sameSession"] and seat["sameUid"], seat
    assert seat["uidAfter"] == row["lifecycleUid"] and seat["sessionAfter"] == row["sessionId"]
    reply = cli.json("send", "default", "What was the phrase?", "--wait")
    assert reply["reply"] == f"The phrase is {PHRASE}."
    assert (cli.root / "work.txt").read_text() == f"{WORK}\n"
    assert list((cli.root / ".cotal" / "maintenance" / "v1" / "incoming").iterdir()) == []
    cli.run("down")


async def test_an_unsealed_pack_says_any_trusting_host_can_resume_it(
    tmp_path: Path, cli: Cli
) -> None:
    _row, attempt = cut_with_a_seat(cli)
    packed = tmp_path / "plain.tar"
    doc = cli.json("checkpoint", "pack", str(attempt), "-o", str(packed))
    assert doc["sealedTo"] is None
    assert PHRASE.encode() in packed.read_bytes()
    proc = cli.run("checkpoint", "pack", str(attempt), "-o", str(tmp_path / "plain2.tar"))
    assert proc.stdout.splitlines()[2] == (
        "not sealed: any host that trusts this root's signer can resume it (seal it to one root "
        "with --to KEY, the box key its `cotal status` prints)"
    )
    assert "no fence spans brokers that cannot see each other" in proc.stderr
