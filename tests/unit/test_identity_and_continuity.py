"""The manager instance identity is kept, never re-minted; continuity comes from flags only."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from connectors.base import Capabilities, LaunchOpts, LaunchSpec, continuity_class
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
