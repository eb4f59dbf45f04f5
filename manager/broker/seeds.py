"""Nkey user seeds on disk: the broker credentials cotal makes (the embedded broker's, a grant
keeper's, each host's under grants) and the public key a server config names for one.

Its own module so the broker's launcher (`embedded.py`) and the grants (`grants.py`, which the
launcher uses) both take them from below, not from each other."""

from __future__ import annotations

import os
from pathlib import Path

from manager.workspace.private import ensure_private_dir, write_private_atomic


def generate_user_seed(creds_path: Path) -> str:
    """Write a fresh nkey user seed (0600) and return its public key for the server config."""
    # nkeys (and the nacl it loads) only when a credential is made or read: stopping a broker,
    # as every `cotal down` does, needs neither.
    import nkeys  # type: ignore[import-untyped]

    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    ensure_private_dir(creds_path.parent)
    write_private_atomic(creds_path, bytes(seed) + b"\n")
    return str(nkeys.from_seed(bytearray(seed)).public_key.decode())


def public_key_of(creds_path: Path) -> str:
    import nkeys

    seed = creds_path.read_bytes().strip()
    return str(nkeys.from_seed(bytearray(seed)).public_key.decode())
