"""The manager instance identity is kept, never re-minted; continuity comes from flags only."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest

from connectors.base import (
    Capabilities,
    LaunchOpts,
    LaunchSpec,
    continuity_class,
    refuse_mesh_without_tool,
)
from manager import registry
from manager.workspace.identity import load_or_create_identity
from manager.workspace.layout import Layout
from protocol.errors import Refusal


def test_identity_is_created_once_private_and_kept(tmp_path: Path) -> None:
    layout = Layout.at(tmp_path)
    first = load_or_create_identity(layout, "main")
    path = layout.instance_identity("main")
    assert path.name == "manager-instance.6d61696e.json"
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(layout.auth).st_mode) == 0o700
    again = load_or_create_identity(layout, "main")
    assert (again.instance_id, again.public_key_b64) == (first.instance_id, first.public_key_b64)
    assert again.sign(b"x") == first.sign(b"x")


@pytest.mark.parametrize("damage", ["truncate", "garbage", "wrong-key", "loose-mode", "symlink"])
def test_a_malformed_identity_is_a_loud_refusal_never_reminted(tmp_path: Path, damage: str) -> None:
    layout = Layout.at(tmp_path)
    load_or_create_identity(layout, "main")
    path = layout.instance_identity("main")
    original = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(original[: len(original) // 2])
    elif damage == "garbage":
        path.write_bytes(b'{"version":1,"unknown":true}')
    elif damage == "wrong-key":
        other = load_or_create_identity(Layout.at(tmp_path / "other"), "main")
        text = original.decode().replace('"publicKey":"', '"publicKey":"X', 1)
        assert other.public_key_b64 not in text
        path.write_text(text)
    elif damage == "loose-mode":
        os.chmod(path, 0o644)
    else:
        target = tmp_path / "elsewhere.json"
        target.write_bytes(original)
        path.unlink()
        path.symlink_to(target)
    damaged = path.read_bytes() if not path.is_symlink() else None
    with pytest.raises(Refusal) as err:
        load_or_create_identity(layout, "main")
    assert err.value.code in ("identity-malformed", "not-private", "unsafe-path")
    assert str(path) in err.value.text
    # Nothing was minted over it.
    if damaged is not None:
        assert path.read_bytes() == damaged


class _Named:
    """A connector named like pi that declares nothing: its class is still drain-only."""

    name = "pi"
    capabilities = Capabilities()

    def build_launch(self, opts: LaunchOpts) -> LaunchSpec:  # pragma: no cover - not launched
        raise NotImplementedError


def test_continuity_is_derived_from_declared_flags_only() -> None:
    assert continuity_class(_Named.capabilities) == "drain-only"
    assert continuity_class(Capabilities(supports_fresh_start=True)) == "fresh"
    assert continuity_class(Capabilities(supports_resume=True, supports_fresh_start=True)) == "fork"
    assert continuity_class(Capabilities(supports_session_continuation=True)) == "exact"
    assert (
        continuity_class(Capabilities(supports_session_continuation=True, supports_resume=True))
        == "exact"
    )


def test_a_harness_without_a_mesh_tool_refuses_a_mesh_permission_by_name() -> None:
    # Every harness cotal knows takes the mesh tool; one that could not is refused the flags.
    for agent in registry.KNOWN:
        assert registry.load_connector(agent).capabilities.mesh_tool, agent
    without = Capabilities(supports_fresh_start=True, mesh_tool=False)
    refuse_mesh_without_tool("toolless", without, [], [])
    with pytest.raises(Refusal) as exc:
        refuse_mesh_without_tool("toolless", without, ["b"], ["ops"])
    assert (exc.value.code, exc.value.message, exc.value.cure) == (
        "unsupported",
        "agent 'toolless' has no mesh tool, so its seat could never use --allow-send or "
        "--allow-post",
        "spawn it without --allow-send and --allow-post, or use an agent that has one "
        "(docs/mesh.md)",
    )


def test_an_identity_signs_what_cryptography_verifies_and_reads_a_key_cryptography_wrote(
    tmp_path: Path,
) -> None:
    # Identities written before the key moved to PyNaCl hold cryptography's raw private bytes;
    # both are RFC 8032 seeds, so the same file gives the same key and the same signatures.
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

    layout = Layout(tmp_path)
    ident = load_or_create_identity(layout, "main")
    public = Ed25519PublicKey.from_public_bytes(base64.b64decode(ident.public_key_b64))
    public.verify(ident.sign(b"payload"), b"payload")

    old = Ed25519PrivateKey.generate()
    raw = old.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    path = layout.instance_identity("main")
    record = json.loads(path.read_text())
    record["signingKey"] = base64.b64encode(raw).decode()
    record["publicKey"] = base64.b64encode(
        old.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    ).decode()
    path.write_bytes(json.dumps(record).encode())
    again = load_or_create_identity(layout, "main")
    assert again.public_key_b64 == record["publicKey"]
    assert again.sign(b"payload") == old.sign(b"payload")
