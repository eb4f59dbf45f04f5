"""`cotal trust add|list|remove` as an operator runs it: a real CLI process, a real private file.

The store decides which checkpoint signers admission accepts, so it is held to the rules of
every secret in `.cotal/auth`: 0600 in 0700, replaced atomically, and parsed strictly.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from manager.workspace.identity import load_or_create_identity
from manager.workspace.layout import Layout
from manager.workspace.trust import (
    TRUST_FILE,
    fingerprint,
    parse_trust_file,
    read_trusted,
    trusted_keys_for,
)
from protocol.errors import Refusal
from tests.conftest import Cli

pytestmark = pytest.mark.usefixtures("isolated_home")


def new_key() -> str:
    raw = (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )
    return base64.b64encode(raw).decode()


def ssh_fingerprint(key: str) -> str:
    digest = hashlib.sha256(base64.b64decode(key)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    root = tmp_path / "root"
    root.mkdir()
    return Cli(root)


def trust_file(cli: Cli) -> Path:
    return cli.root / ".cotal" / "auth" / TRUST_FILE


def listed(cli: Cli) -> list[dict[str, Any]]:
    out = cli.run("trust", "list", "--json").stdout
    return [json.loads(line) for line in out.splitlines()]


def refused(proc: subprocess.CompletedProcess[str], code: str) -> dict[str, Any]:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    doc: dict[str, Any] = json.loads(proc.stderr.splitlines()[-1])
    assert doc["ok"] is False and doc["code"] == code, doc
    return doc


def test_add_list_remove_round_trip_in_a_private_file(cli: Cli) -> None:
    a, b = new_key(), new_key()
    assert fingerprint(a) == ssh_fingerprint(a) and fingerprint(a).startswith("SHA256:")
    assert "=" not in fingerprint(a)
    assert listed(cli) == []
    assert not (cli.root / ".cotal").exists()  # listing an empty store creates nothing

    added = json.loads(cli.run("trust", "add", a, "--name", "host-a", "--json").stdout)
    assert added == {
        "key": a,
        "fingerprint": ssh_fingerprint(a),
        "name": "host-a",
        "outcome": "added",
    }
    path = trust_file(cli)
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(path.parent).st_mode) == 0o700
    assert path.read_text() == f"{a} host-a\n"

    text = cli.run("trust", "add", b, "--name", "host-b").stdout
    assert "now trusts signer host-b" in text and ssh_fingerprint(b) in text
    assert [(s["key"], s["name"], s["fingerprint"]) for s in listed(cli)] == [
        (a, "host-a", ssh_fingerprint(a)),
        (b, "host-b", ssh_fingerprint(b)),
    ]
    human = cli.run("trust", "list").stdout
    assert "host-a" in human and ssh_fingerprint(b) in human and a in human

    # Adding the same key under the same name is idempotent: same bytes, same inode.
    before = os.lstat(path)
    again = json.loads(cli.run("trust", "add", a, "--name", "host-a", "--json").stdout)
    assert again["outcome"] == "unchanged"
    after = os.lstat(path)
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)
    assert path.read_text() == f"{a} host-a\n{b} host-b\n"

    # Remove by name, then by key.
    gone = json.loads(cli.run("trust", "remove", "host-a", "--json").stdout)
    assert (gone["key"], gone["outcome"]) == (a, "removed")
    assert [s["name"] for s in listed(cli)] == ["host-b"]
    cli.run("trust", "remove", b)
    assert listed(cli) == [] and path.read_text() == ""
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600

    doc = refused(cli.run("trust", "remove", "host-a", "--json", check=False), "not-trusted")
    assert "cotal trust list" in doc["error"]


def test_a_name_already_taken_by_another_key_is_refused_and_a_rename_is_explicit(
    cli: Cli,
) -> None:
    a, b = new_key(), new_key()
    cli.run("trust", "add", a, "--name", "host-a")
    doc = refused(
        cli.run("trust", "add", b, "--name", "host-a", "--json", check=False), "trust-name-taken"
    )
    assert a in doc["error"] and "cotal trust remove host-a" in doc["error"]
    renamed = json.loads(cli.run("trust", "add", a, "--name", "host-a2", "--json").stdout)
    assert renamed["outcome"] == "renamed"
    assert [(s["key"], s["name"]) for s in listed(cli)] == [(a, "host-a2")]
    # Without --name the key still gets a stable, unique label.
    plain = json.loads(cli.run("trust", "add", b, "--json").stdout)
    assert plain["name"].startswith("signer-") and len(listed(cli)) == 2


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("not base64!", id="not-base64"),
        pytest.param(base64.b64encode(b"x" * 31).decode(), id="31-bytes"),
        pytest.param(base64.b64encode(b"x" * 33).decode(), id="33-bytes"),
        pytest.param(base64.b64encode(b"x" * 32).decode().rstrip("="), id="unpadded"),
        pytest.param("11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURp=", id="non-canonical"),
        pytest.param("", id="empty"),
    ],
)
def test_a_malformed_key_is_refused_with_exit_2_and_nothing_written(cli: Cli, key: str) -> None:
    doc = refused(cli.run("trust", "add", key, "--name", "x", "--json", check=False), "bad-key")
    assert "32 raw bytes" in doc["error"] or "raw Ed25519" in doc["error"]
    assert not trust_file(cli).exists()
    human = cli.run("trust", "add", key, "--name", "x", check=False)
    assert human.returncode == 2 and human.stderr.startswith("cotal: ")


def test_a_bad_name_is_refused(cli: Cli) -> None:
    for name in ("-rf", "two words", "a/b", "x" * 129):
        refused(
            cli.run("trust", "add", new_key(), f"--name={name}", "--json", check=False),
            "bad-signer-name",
        )
    assert not trust_file(cli).exists()


def test_a_malformed_store_refuses_naming_the_line_and_trusts_nothing(cli: Cli) -> None:
    a = new_key()
    cli.run("trust", "add", a, "--name", "host-a")
    path = trust_file(cli)
    for text, where in [
        (f"{a} host-a\n{a[:-2]}== host-b\n", "line 2"),
        (f"{a} host-a\nnot a key line\n", "line 2"),
        (f"{a} host-a\n{a} host-b\n", "line 2"),
        (f"{a}  host-a\n", "line 1"),
        (f"{a} host-a", "does not end with a newline"),
    ]:
        path.write_text(text)
        os.chmod(path, 0o600)
        doc = refused(cli.run("trust", "list", "--json", check=False), "trust-malformed")
        assert where in doc["error"], doc
        refused(cli.run("trust", "add", new_key(), "--json", check=False), "trust-malformed")
        with pytest.raises(Refusal) as err:
            trusted_keys_for(Layout.at(cli.root), "main", [])
        assert err.value.code == "trust-malformed"

    # A store others can read is not trusted either: someone may have written it.
    path.write_text(f"{a} host-a\n")
    os.chmod(path, 0o644)
    refused(cli.run("trust", "list", "--json", check=False), "not-private")
    os.chmod(path, 0o600)
    assert [s.key for s in read_trusted(Layout.at(cli.root))] == [a]

    # An oversized store refuses before it is parsed.
    path.write_bytes(b"#" * (64 * 1024 + 1))
    refused(cli.run("trust", "list", "--json", check=False), "too-large")


def test_trusted_keys_for_joins_own_key_store_and_pins_without_minting(cli: Cli) -> None:
    layout = Layout.at(cli.root)
    pin, stored = new_key(), new_key()
    assert trusted_keys_for(layout, "main", []) == []
    assert not (cli.root / ".cotal").exists()  # asking never mints an identity
    cli.run("trust", "add", stored, "--name", "host-b")
    own = load_or_create_identity(layout, "main").public_key_b64
    keys = trusted_keys_for(layout, "main", [pin, pin])
    assert keys == [pin, own, stored]
    # Another space's own key is not this space's.
    assert own not in trusted_keys_for(layout, "other", [])
    with pytest.raises(Refusal) as err:
        trusted_keys_for(layout, "main", ["bogus"])
    assert err.value.code == "bad-key" and "--trust-signer" in err.value.message


def test_parse_trust_file_is_strict() -> None:
    a = new_key()
    assert [s.name for s in parse_trust_file(f"{a} h\n".encode())] == ["h"]
    assert parse_trust_file(b"") == []
    for bad in (b"\n", f"{a} h\r\n".encode(), f"{a} h x\n".encode(), "é\n".encode()):
        with pytest.raises(Refusal) as err:
            parse_trust_file(bad)
        assert err.value.code == "trust-malformed"
