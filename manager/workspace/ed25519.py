"""Ed25519 verification, the one way every signature cotal checks is checked: a checkpoint's
record, a pre-copied history, the seal's own check of what it just signed.

Through PyNaCl (libsodium), as the instance identity signs (manager/workspace/identity.py): the
library a manager has loaded anyway for its broker connection's nkey, where cryptography's
Ed25519 would cost every manager 6.1 MB of resident memory for a check most of them make only at
a restore or a move. libsodium refuses small-order public keys and non-canonical signatures that
OpenSSL accepts; no key or signature cotal makes is either.
"""

from __future__ import annotations

import base64
import binascii

from nacl.exceptions import CryptoError
from nacl.signing import VerifyKey

PUBLIC_BYTES = 32
SIGNATURE_BYTES = 64


def verifies(public_key_b64: str, signature: bytes, data: bytes) -> bool:
    """Whether `signature` is the signature of `data` under the raw public key `public_key_b64`
    (base64); False for any key or signature that is not one, never an exception."""
    try:
        raw = base64.b64decode(public_key_b64, validate=True)
    except (binascii.Error, ValueError):
        return False
    if len(raw) != PUBLIC_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        VerifyKey(raw).verify(data, signature)
    except (CryptoError, ValueError):
        return False
    return True


def verifies_b64(public_key_b64: str, signature_b64: str, data: bytes) -> bool:
    """`verifies`, with the signature in base64 as a record carries it."""
    try:
        signature = base64.b64decode(signature_b64, validate=True)
    except (binascii.Error, ValueError):
        return False
    return verifies(public_key_b64, signature, data)
