"""The trust store: which checkpoint signers this root admits, besides its own manager.

A valid signature proves only that some key sealed a checkpoint, so admission also asks who
(docs/design.md, "The core modules, in detail").
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from manager.workspace.layout import Layout
from manager.workspace.private import (
    FILE_MODE,
    ensure_private_dir,
    read_stable,
    write_private_atomic,
)
from protocol.errors import Refusal
from protocol.names import TokenRule
from protocol.refusals import Code

TRUST_FILE = "trusted-signers"
TRUST_CAP = 64 * 1024
MAX_SIGNERS = 256
# A name is a label for people and shell arguments: no spaces (the line format splits on one),
# nothing that can start an option.
SIGNER_NAME = TokenRule("signer name", r"[A-Za-z0-9][A-Za-z0-9_.@:-]{0,127}", "host-a")

_CURE_KEY = (
    "pass the signer's raw Ed25519 public key in base64 (44 characters ending in '='), "
    "exactly as `cotal status` or `cotal checkpoint verify` prints it"
)


@dataclass(frozen=True)
class TrustedSigner:
    key: str
    name: str

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.key)

    def as_dict(self) -> dict[str, str]:
        return {"key": self.key, "fingerprint": self.fingerprint, "name": self.name}


def trust_file(layout: Layout) -> Path:
    return layout.auth / TRUST_FILE


def fingerprint(key_b64: str) -> str:
    """`SHA256:<base64 of sha256(raw key), unpadded>`, the form `ssh-keygen -l` prints."""
    raw = base64.b64decode(key_b64, validate=True)
    return "SHA256:" + base64.b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")


def key_problem(text: str) -> str | None:
    """Why `text` is not a canonical base64 raw Ed25519 public key, or None when it is one."""
    if not text.isascii():
        return "is not ASCII base64"
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return "is not valid base64"
    if len(raw) != 32:
        return f"decodes to {len(raw)} bytes, not the 32 of a raw Ed25519 public key"
    # One key, one spelling: a second base64 form of the same bytes would slip past the
    # string comparison admission makes against the signer the record names.
    if base64.b64encode(raw).decode() != text:
        return "is not in canonical base64 (the padding bits or '=' differ)"
    return None


def check_key(text: str, *, what: str = "signer key") -> str:
    problem = key_problem(text)
    if problem is not None:
        raise Refusal(Code.BAD_KEY, f"{what} {text[:80]!r} {problem}", _CURE_KEY)
    return text


def check_signer_name(name: str) -> str:
    if not SIGNER_NAME.matches(name):
        raise Refusal(
            Code.BAD_SIGNER_NAME,
            f"signer name {name[:80]!r} is not a label (letters, digits and _ . @ : -, at most "
            "128, starting with a letter or digit)",
            "name it after the source host or its manager instance id, e.g. --name host-a",
        )
    return name


def default_name(key: str) -> str:
    return "signer-" + hashlib.sha256(base64.b64decode(key)).hexdigest()[:12]


# -- the file -----------------------------------------------------------------------------------


def parse_trust_file(data: bytes, *, where: str = TRUST_FILE) -> list[TrustedSigner]:
    """Every signer the file lists, in file order; any defect refuses naming its line."""
    cure = f"fix or remove line(s) of {where} by hand, or rebuild it with `cotal trust add`"
    if len(data) > TRUST_CAP:
        raise Refusal(
            Code.TRUST_MALFORMED,
            f"{where} is {len(data)} bytes, over the {TRUST_CAP}-byte cap",
            cure,
        )
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise Refusal(Code.TRUST_MALFORMED, f"{where} is not ASCII text", cure) from None
    if text and not text.endswith("\n"):
        raise Refusal(Code.TRUST_MALFORMED, f"{where} does not end with a newline", cure)
    signers: list[TrustedSigner] = []
    keys: set[str] = set()
    names: set[str] = set()
    for number, line in enumerate(text.split("\n")[:-1], start=1):
        fields = line.split(" ")
        if len(fields) != 2:
            raise Refusal(
                Code.TRUST_MALFORMED,
                f"{where} line {number} is not '<base64 key> <name>' (one space between)",
                cure,
            )
        key, name = fields
        problem = key_problem(key)
        if problem is not None:
            raise Refusal(Code.TRUST_MALFORMED, f"{where} line {number}: the key {problem}", cure)
        if not SIGNER_NAME.matches(name):
            raise Refusal(
                Code.TRUST_MALFORMED,
                f"{where} line {number}: {name[:80]!r} is not a signer name",
                cure,
            )
        if key in keys or name in names:
            raise Refusal(
                Code.TRUST_MALFORMED,
                f"{where} line {number} lists {'key ' + key if key in keys else 'name ' + name} "
                "a second time",
                cure,
            )
        keys.add(key)
        names.add(name)
        signers.append(TrustedSigner(key, name))
    if len(signers) > MAX_SIGNERS:
        raise Refusal(
            Code.TRUST_MALFORMED, f"{where} lists {len(signers)} signers, over {MAX_SIGNERS}", cure
        )
    return signers


def format_trust_file(signers: Iterable[TrustedSigner]) -> bytes:
    return "".join(f"{s.key} {s.name}\n" for s in signers).encode("ascii")


def read_trusted(layout: Layout) -> list[TrustedSigner]:
    """The operator's trusted signers; an absent file trusts nobody beyond the root's own key."""
    path = trust_file(layout)
    if not os.path.lexists(path):
        return []
    data = read_stable(path, cap=TRUST_CAP, what="trust store", require_private=True).data
    return parse_trust_file(data, where=str(path))


@contextmanager
def _locked(layout: Layout) -> Iterator[None]:
    ensure_private_dir(layout.control)
    ensure_private_dir(layout.auth)
    lock = layout.auth / f".{TRUST_FILE}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@dataclass(frozen=True)
class TrustChange:
    signer: TrustedSigner
    # "added", "unchanged" (the same key under the same name), "renamed", or "removed".
    outcome: str

    def as_dict(self) -> dict[str, str]:
        return {**self.signer.as_dict(), "outcome": self.outcome}


def add_signer(layout: Layout, key: str, name: str | None = None) -> TrustChange:
    """Trust `key` under `name`; adding a key already trusted under that name changes nothing."""
    check_key(key)
    name = check_signer_name(name) if name is not None else default_name(key)
    with _locked(layout):
        signers = read_trusted(layout)
        for existing in signers:
            if existing.name == name and existing.key != key:
                raise Refusal(
                    Code.TRUST_NAME_TAKEN,
                    f"the name {name} already trusts key {existing.key} ({existing.fingerprint})",
                    f"choose another --name, or `cotal trust remove {name}` first",
                )
        same = next((s for s in signers if s.key == key), None)
        if same is not None and same.name == name:
            return TrustChange(same, "unchanged")
        signer = TrustedSigner(key, name)
        if same is not None:
            signers = [signer if s.key == key else s for s in signers]
            outcome = "renamed"
        else:
            if len(signers) >= MAX_SIGNERS:
                raise Refusal(
                    Code.TRUST_FULL,
                    f"the trust store already lists {MAX_SIGNERS} signers",
                    "remove signers you no longer resume from (`cotal trust remove NAME`)",
                )
            signers.append(signer)
            outcome = "added"
        write_private_atomic(trust_file(layout), format_trust_file(signers))
        return TrustChange(signer, outcome)


def remove_signer(layout: Layout, key_or_name: str) -> TrustChange:
    """Stop trusting the signer with this key or name; one that is not trusted refuses."""
    with _locked(layout):
        signers = read_trusted(layout)
        gone = next((s for s in signers if key_or_name in (s.key, s.name)), None)
        if gone is None:
            raise Refusal(
                Code.NOT_TRUSTED,
                f"no trusted signer has the key or name {key_or_name[:80]!r}",
                "run `cotal trust list` to see the keys and names this root trusts",
            )
        write_private_atomic(
            trust_file(layout), format_trust_file(s for s in signers if s is not gone)
        )
        return TrustChange(gone, "removed")


# -- what admission trusts -----------------------------------------------------------------------


def own_key(layout: Layout, space: str) -> str | None:
    """This root's own manager instance key for `space`, or None when it has never minted one.

    Never minted here: admission changes nothing, and a key minted now has sealed nothing.
    """
    # The identity module brings the key serialization code; most readers of a manifest (every
    # cut's own check of what it sealed) never ask for this root's key.
    from manager.workspace.identity import load_or_create_identity

    path = layout.instance_identity(space)
    if not os.path.lexists(path):
        return None
    return load_or_create_identity(layout, space).public_key_b64


def trusted_keys_for(layout: Layout, space: str, pinned: Iterable[str]) -> list[str]:
    """Every key admission accepts for one run: the root's own instance key for the space, the
    trust store's keys, and the keys pinned on the command line (each checked first)."""
    keys: list[str] = []
    for key in [check_key(k, what="--trust-signer key") for k in pinned]:
        if key not in keys:
            keys.append(key)
    mine = own_key(layout, space)
    if mine is not None and mine not in keys:
        keys.append(mine)
    for signer in read_trusted(layout):
        if signer.key not in keys:
            keys.append(signer.key)
    return keys


def why_trusted(layout: Layout, space: str, pinned: Iterable[str], key: str) -> str:
    """How admission came to trust `key`, for the operator's record: "pinned" (--trust-signer),
    "own" (this root's manager instance key) or the trust-store name it was added under."""
    if key in set(pinned):
        return "pinned"
    if key == own_key(layout, space):
        return "own"
    for signer in read_trusted(layout):
        if signer.key == key:
            return f"trust store: {signer.name}"
    return "not trusted"
