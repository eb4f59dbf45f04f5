"""A packed checkpoint sealed to one destination root (`cotal checkpoint pack --to KEY`).

The file is a small header, then the ustar archive (`archive.py`) encrypted in chunks:

    MAGIC | u32 big-endian header length | header JSON (`SealedHeader`) | chunk 0 | chunk 1 | ...

The sender makes an ephemeral X25519 key, agrees a secret with the recipient's box key
(`manager/workspace/boxkey.py`) and derives the chunk key with HKDF-SHA256 whose info is the
whole header, so a header changed by one byte derives another key and no chunk opens. Each chunk
is ChaCha20-Poly1305 over `chunkBytes` of the archive (the last one shorter, possibly empty),
with its index as the nonce and `index | final flag` as the associated data. A chunk is final
when the file ends after it, and only the writer's last chunk was sealed as final: a file cut
short at any byte, chunks swapped, or a chunk taken from another file sealed to the same root
fails authentication (`sealed-corrupt`), and a full-size chunk is never final, so a cut exactly
at a chunk boundary fails too.

Opening decrypts into an unnamed file in the root's private staging; the plaintext archive is
then read by the same strict reader as an unsealed pack (`packfile.py`).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import msgspec

from manager.workspace import boxkey
from manager.workspace.layout import Layout
from protocol.codec import decode_json, encode_json
from protocol.errors import DecodeError, Refusal
from protocol.refusals import Code

if TYPE_CHECKING:
    # Imported where a pack is sealed or opened: cryptography costs a manager 6 MB of resident
    # memory (manager/workspace/ed25519.py) that only a sealed pack needs.
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

MAGIC = b"cotal-sealed-pack\n"
VERSION = 1
AEAD = "chacha20-poly1305"
KDF = "hkdf-sha256"
CHUNK_BYTES = 1 << 20
CHUNK_MIN = 1 << 12
CHUNK_MAX = 1 << 24
TAG = 16
HEADER_CAP = 4096
_LENGTH = struct.Struct(">I")
_INFO = b"cotal sealed pack v1\x00"
_COUNTER_LIMIT = 1 << 64


class SealedHeader(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    version: int
    aead: str
    kdf: str
    # The recipient's box key, printable (`x25519:...`): also its id, as `cotal status` shows it.
    recipient: str
    ephemeral: str
    chunk_bytes: int


class _Writable(Protocol):
    def write(self, data: bytes, /) -> int: ...


def corrupt(src: Path, what: str, cure: str | None = None) -> Refusal:
    return Refusal(
        Code.SEALED_CORRUPT,
        f"sealed packed checkpoint {src}: {what}",
        cure
        or "copy the file again and compare its sha256 with the one `cotal checkpoint pack` "
        "printed; nothing was written",
    )


def _chunk_key(shared: bytes, header: bytes) -> ChaCha20Poly1305:
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
    from cryptography.hazmat.primitives.hashes import SHA256
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    key = HKDF(algorithm=SHA256(), length=32, salt=None, info=_INFO + header).derive(shared)
    return ChaCha20Poly1305(key)


def _nonce(index: int) -> bytes:
    return index.to_bytes(12, "big")


def _aad(index: int, final: bool) -> bytes:
    return index.to_bytes(8, "big") + (b"\x01" if final else b"\x00")


def _valid_chunk_bytes(n: int) -> bool:
    return CHUNK_MIN <= n <= CHUNK_MAX and n & (n - 1) == 0


# -- sealing (the source) ---------------------------------------------------------------------


class Sealer:
    """A write-only file object for tarfile: what is written to it reaches `out` sealed.
    `tell()` counts the plaintext, which is what tarfile's own offsets are; `finish()` writes
    the final chunk and must be called once the archive is complete."""

    def __init__(
        self, out: _Writable, recipient: X25519PublicKey, chunk_bytes: int = CHUNK_BYTES
    ) -> None:
        if not _valid_chunk_bytes(chunk_bytes):
            raise ValueError(f"chunk size {chunk_bytes} is not a power of two in range")
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        ephemeral = X25519PrivateKey.generate()
        body = encode_json(
            SealedHeader(
                version=VERSION,
                aead=AEAD,
                kdf=KDF,
                recipient=boxkey.printable(recipient),
                ephemeral=boxkey.printable(ephemeral.public_key()),
                chunk_bytes=chunk_bytes,
            )
        )
        self.header = MAGIC + _LENGTH.pack(len(body)) + body
        self._aead = _chunk_key(ephemeral.exchange(recipient), self.header)
        self._out = out
        self._chunk = chunk_bytes
        self._buf = bytearray()
        self._index = 0
        self._plain = 0
        self._finished = False
        out.write(self.header)

    def tell(self) -> int:
        return self._plain

    def write(self, data: bytes) -> int:
        if self._finished:
            raise ValueError("write after the final chunk")
        self._buf += data
        self._plain += len(data)
        # A full chunk is never the final one (the final is shorter, possibly empty), so it can
        # go out before the writer knows whether more follows.
        while len(self._buf) >= self._chunk:
            self._emit(bytes(self._buf[: self._chunk]), final=False)
            del self._buf[: self._chunk]
        return len(data)

    def finish(self) -> None:
        if self._finished:
            return
        self._emit(bytes(self._buf), final=True)
        self._buf.clear()
        self._finished = True

    def _emit(self, plain: bytes, *, final: bool) -> None:
        if self._index >= _COUNTER_LIMIT:
            raise ValueError("chunk counter exhausted")
        self._out.write(self._aead.encrypt(_nonce(self._index), plain, _aad(self._index, final)))
        self._index += 1


# -- opening (the destination) ----------------------------------------------------------------


@dataclass(frozen=True)
class Sealed:
    src: Path
    header: SealedHeader
    # Everything before chunk 0: the HKDF info, and where the chunks start.
    header_bytes: bytes


def read_header(fd: int, src: Path) -> Sealed | None:
    """The sealed header of the open file, or None when the file is not sealed (an unsealed
    pack starts with its attempt directory's name, never with the magic)."""
    head = os.pread(fd, len(MAGIC) + _LENGTH.size, 0)
    n = min(len(head), len(MAGIC))
    if n == 0 or head[:n] != MAGIC[:n]:
        return None
    if len(head) < len(MAGIC) + _LENGTH.size:
        raise corrupt(src, "it ends inside its sealed header")
    (length,) = _LENGTH.unpack(head[len(MAGIC) :])
    if length > HEADER_CAP:
        raise corrupt(src, f"its sealed header declares {length} bytes, more than {HEADER_CAP}")
    body = os.pread(fd, length, len(head))
    if len(body) < length:
        raise corrupt(src, "it ends inside its sealed header")
    try:
        header = decode_json(body, SealedHeader, what="its sealed header", cap=HEADER_CAP)
    except DecodeError as exc:
        raise corrupt(src, exc.message) from None
    if header.version != VERSION:
        raise corrupt(
            src,
            f"its sealed header is version {header.version}; this cotal reads version {VERSION}",
            "open it with the cotal that packed it, or pack it again with this one; nothing "
            "was written",
        )
    if header.aead != AEAD or header.kdf != KDF:
        raise corrupt(src, f"it is sealed with {header.aead}/{header.kdf}, not {AEAD}/{KDF}")
    if not _valid_chunk_bytes(header.chunk_bytes):
        raise corrupt(src, f"its chunk size {header.chunk_bytes} is not one cotal writes")
    for field, value in (("recipient", header.recipient), ("ephemeral", header.ephemeral)):
        if boxkey.parse_public(value) is None:
            raise corrupt(src, f"its {field} key {value!r} is not an X25519 key")
    return Sealed(src, header, head + body)


def recipient_box_key(sealed: Sealed, layout: Layout) -> boxkey.BoxKey:
    """This root's box key when the file is sealed to it; else `sealed-to-other`, before
    anything is written (a root without a box key is not given one here)."""
    mine = boxkey.load_box_key(layout)
    to = sealed.header.recipient
    if mine is None:
        raise Refusal(
            Code.SEALED_TO_OTHER,
            f"packed checkpoint {sealed.src} is sealed to box key {to}; this root "
            f"({layout.root}) has no box key yet, so it is not that root",
            "resume it on the root whose `cotal status` prints that key; to bring it here, run "
            "`cotal status` on this root (it creates and prints this root's box key), then pack "
            "it again on the source with --to that key; nothing was written",
        )
    if mine.public != to:
        raise Refusal(
            Code.SEALED_TO_OTHER,
            f"packed checkpoint {sealed.src} is sealed to box key {to}; this root's box key is "
            f"{mine.public}",
            "resume it on the root whose `cotal status` prints that key, or pack it again on "
            f"the source with --to {mine.public} (this root's key from `cotal status`); "
            "nothing was written",
        )
    return mine


def decrypt(sealed: Sealed, fd: int, key: boxkey.BoxKey, out_fd: int) -> int:
    """Open every chunk of the file at `fd` in order and write its plaintext to `out_fd`; the
    bytes written. A chunk that does not authenticate refuses `sealed-corrupt`, and what was
    written to `out_fd` by then is the caller's to discard."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

    src = sealed.src
    raw = boxkey.parse_public(sealed.header.ephemeral)
    assert raw is not None
    try:
        shared = key.private.exchange(X25519PublicKey.from_public_bytes(raw))
    except ValueError:
        raise corrupt(src, "its ephemeral key is not a usable X25519 key") from None
    aead = _chunk_key(shared, sealed.header_bytes)
    size = os.fstat(fd).st_size
    step = sealed.header.chunk_bytes + TAG
    off = len(sealed.header_bytes)
    if off >= size:
        raise corrupt(src, "it ends after its sealed header, with no chunk")
    index = 0
    written = 0
    while True:
        n = min(step, size - off)
        final = off + n == size
        block = os.pread(fd, n, off)
        if len(block) != n:
            raise corrupt(src, "it shrank while it was opened")
        try:
            plain = aead.decrypt(_nonce(index), block, _aad(index, final))
        except InvalidTag:
            raise corrupt(
                src,
                f"chunk {index} (at byte {off}) fails authentication: the file was altered, cut "
                "short, reordered or spliced from another file",
            ) from None
        view = memoryview(plain)
        while view:
            view = view[os.write(out_fd, view) :]
        written += len(plain)
        if final:
            return written
        off += n
        index += 1
