"""The manager instance identity: a stable instanceId and an Ed25519 signing key per space.

Kept across restarts so a restarted daemon is the same logical instance and its checkpoints
carry the same signer. A malformed file is a loud refusal, never re-minted: minting over it is
how a stale host would quietly become a new authority.

The key is PyNaCl's (libsodium), not cryptography's: every manager loads libsodium anyway to
sign its broker connection's nkey challenge, while cryptography's Ed25519 costs a manager 6.1 MB
of resident memory (measured: its import after asyncio, against 1.2 MB for `nacl.signing`) that
only a cut, a move or a takeover needs, which import it then. The signatures are the same
Ed25519 (RFC 8032) either library verifies.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import msgspec
from nacl.signing import SigningKey

from manager.workspace.layout import Layout
from manager.workspace.private import create_private_exclusive, ensure_private_dir, read_stable
from protocol.codec import decode_json, encode_json
from protocol.errors import DecodeError, Refusal
from protocol.instant import now_iso
from protocol.names import INSTANCE_ID, mint_instance_id
from protocol.refusals import Code

IDENTITY_CAP = 4096


class InstanceRecord(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    version: int
    instance_id: str
    space: str
    signing_key: str
    public_key: str
    created_at: str


@dataclass(frozen=True)
class InstanceIdentity:
    instance_id: str
    space: str
    key: SigningKey

    @property
    def public_key_b64(self) -> str:
        return base64.b64encode(bytes(self.key.verify_key)).decode()

    def sign(self, data: bytes) -> bytes:
        return self.key.sign(data).signature


def load_or_create_identity(layout: Layout, space: str) -> InstanceIdentity:
    path = layout.instance_identity(space)
    ensure_private_dir(layout.control)
    ensure_private_dir(layout.auth)
    if not path.exists() and not path.is_symlink():
        key = SigningKey.generate()
        record = InstanceRecord(
            version=1,
            instance_id=mint_instance_id(),
            space=space,
            # The 32-byte seed: RFC 8032's private key, the same bytes either library writes.
            signing_key=base64.b64encode(bytes(key)).decode(),
            public_key="",
            created_at=now_iso(),
        )
        ident = InstanceIdentity(record.instance_id, space, key)
        record = msgspec.structs.replace(record, public_key=ident.public_key_b64)
        # A lost create means another daemon of this root minted first: both are the same
        # logical instance, so adopt the winner's file below.
        create_private_exclusive(path, encode_json(record))
    return _load(path, space)


def _load(path: object, space: str) -> InstanceIdentity:
    from pathlib import Path

    p = Path(str(path))
    cure = (
        f"restore {p} from backup; a restart must preserve the logical instanceId, "
        "so cotal will not mint over it"
    )
    try:
        data = read_stable(
            p, cap=IDENTITY_CAP, what="manager instance identity", require_private=True
        ).data
        record = decode_json(
            data, InstanceRecord, what=f"manager instance identity {p}", cap=IDENTITY_CAP
        )
    except DecodeError as exc:
        raise Refusal(Code.IDENTITY_MALFORMED, exc.message, cure) from None
    if record.version != 1 or not INSTANCE_ID.matches(record.instance_id) or record.space != space:
        raise Refusal(
            Code.IDENTITY_MALFORMED,
            f"manager instance identity {p} is malformed (version, instanceId or space)",
            cure,
        )
    try:
        seed = base64.b64decode(record.signing_key, validate=True)
        if len(seed) != 32:
            raise ValueError("not a 32-byte seed")
        key = SigningKey(seed)
    except ValueError:
        raise Refusal(
            Code.IDENTITY_MALFORMED,
            f"manager instance identity {p} holds no valid signing key",
            cure,
        ) from None
    ident = InstanceIdentity(record.instance_id, space, key)
    if ident.public_key_b64 != record.public_key:
        raise Refusal(
            Code.IDENTITY_MALFORMED,
            f"manager instance identity {p}: public key does not match the signing key",
            cure,
        )
    return ident
