"""This root's box key: the X25519 key pair a packed checkpoint sealed to this root is encrypted
to (`cotal checkpoint pack --to KEY`, `manager/checkpoint/sealed.py`).

The key is per root, not per space: a sealed file names one destination root, whatever spaces it
runs. It is created on first need and then kept: a root whose key changed could no longer open
a file already sealed to it, so a malformed file is a refusal, never re-minted. Its public half
is printed as `x25519:<base64url>` (`cotal status`), and the printable form is also the key's
id in a sealed file's header.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from manager.workspace.layout import Layout
from manager.workspace.private import create_private_exclusive, ensure_private_dir, read_stable
from protocol.codec import decode_json, encode_json
from protocol.errors import DecodeError, Refusal
from protocol.instant import now_iso
from protocol.refusals import Code

if TYPE_CHECKING:
    # Imported where a key is made or read: cryptography costs a manager 6 MB of resident memory
    # (manager/workspace/ed25519.py), and only a sealed pack needs a box key.
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

PREFIX = "x25519:"
BOX_KEY_CAP = 4096
_RAW = 32


class BoxKeyRecord(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    version: int
    private_key: str  # base64url of the raw 32 bytes
    public_key: str  # the printable form
    created_at: str


@dataclass(frozen=True)
class BoxKey:
    private: X25519PrivateKey

    @property
    def public(self) -> str:
        return printable(self.private.public_key())


def raw_public(key: X25519PublicKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes | None:
    """Canonical unpadded base64url of 32 bytes, or None: one key has one spelling, so two
    spellings can never name the same root as two keys."""
    if len(text) != 43 or not text.isascii():
        return None
    try:
        raw = base64.b64decode(text + "=", altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == _RAW and _b64(raw) == text else None


def format_public(raw: bytes) -> str:
    return PREFIX + _b64(raw)


def printable(key: X25519PublicKey) -> str:
    return format_public(raw_public(key))


def parse_public(text: str) -> bytes | None:
    """The raw public key of a printable `x25519:<base64url>`, or None when it is not one."""
    if not text.startswith(PREFIX):
        return None
    return _unb64(text[len(PREFIX) :])


def recipient_key(text: str) -> X25519PublicKey:
    """A `--to KEY` argument as the public key a pack is sealed to."""
    cure = (
        "pass the destination root's box key exactly as its `cotal status` prints it; nothing "
        "was packed"
    )
    raw = parse_public(text)
    if raw is None:
        raise Refusal(
            Code.BAD_BOX_KEY,
            f"{text!r} is not a box key (expected {PREFIX} and 43 characters of base64url)",
            cure,
        )
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

    key = X25519PublicKey.from_public_bytes(raw)
    try:
        # A low-order point agrees the all-zero secret with every sender: no secret at all.
        X25519PrivateKey.generate().exchange(key)
    except ValueError:
        raise Refusal(
            Code.BAD_BOX_KEY, f"{text!r} is not a usable X25519 public key", cure
        ) from None
    return key


def load_box_key(layout: Layout) -> BoxKey | None:
    """This root's box key, or None when it has none yet; never creates one, so a root that is
    only asked to open a file changes nothing."""
    path = layout.box_key
    if not path.exists() and not path.is_symlink():
        return None
    return _load(layout)


def load_or_create_box_key(layout: Layout) -> BoxKey:
    path = layout.box_key
    if not path.exists() and not path.is_symlink():
        ensure_private_dir(layout.control)
        ensure_private_dir(layout.auth)
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        key = X25519PrivateKey.generate()
        raw = key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        record = BoxKeyRecord(
            version=1,
            private_key=_b64(raw),
            public_key=BoxKey(key).public,
            created_at=now_iso(),
        )
        # A lost create means another cotal of this root minted first: adopt its key below.
        create_private_exclusive(path, encode_json(record))
    return _load(layout)


def box_public_key(layout: Layout) -> str:
    """This root's box key in its printable form, created if the root has none yet."""
    return load_or_create_box_key(layout).public


def _load(layout: Layout) -> BoxKey:
    path = layout.box_key
    cure = (
        f"restore {path} from backup; files sealed to this root open only with that key, so "
        "cotal will not mint over it"
    )
    try:
        data = read_stable(path, cap=BOX_KEY_CAP, what="box key", require_private=True).data
        record = decode_json(data, BoxKeyRecord, what=f"box key {path}", cap=BOX_KEY_CAP)
    except DecodeError as exc:
        raise Refusal(Code.BOX_KEY_MALFORMED, exc.message, cure) from None
    raw = _unb64(record.private_key)
    if record.version != 1 or raw is None:
        raise Refusal(
            Code.BOX_KEY_MALFORMED, f"box key {path} is malformed (version or private key)", cure
        )
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    key = BoxKey(X25519PrivateKey.from_private_bytes(raw))
    if key.public != record.public_key:
        raise Refusal(
            Code.BOX_KEY_MALFORMED,
            f"box key {path}: its public key does not match its private key",
            cure,
        )
    return key
