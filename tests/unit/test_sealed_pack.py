"""A pack sealed to one root (issue 24, item 5): the box key, the chunk format and what
`archive.unpack` does with a sealed file. Real files and real keys throughout; every damage is
refused by its exact code and message, and a refusal leaves the destination as it was."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import stat
import struct
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from manager.checkpoint import archive, sealed
from manager.workspace import boxkey
from manager.workspace.layout import Layout
from protocol.errors import Refusal
from tests.ckpt import snapshot

A = "20261129T140000Z-0a1b2c3d"
C = sealed.CHUNK_MIN
STEP = C + sealed.TAG
CURE = (
    "copy the file again and compare its sha256 with the one `cotal checkpoint pack` printed; "
    "nothing was written"
)
PHRASE = b"juniper-sealed-77"


def root_with_key(tmp_path: Path, name: str) -> tuple[Layout, boxkey.BoxKey]:
    root = tmp_path / name
    root.mkdir()
    layout = Layout.at(root)
    return layout, boxkey.load_or_create_box_key(layout)


def public(key: boxkey.BoxKey) -> X25519PublicKey:
    return key.private.public_key()


def seal_bytes(plain: bytes, to: X25519PublicKey, chunk: int = C) -> bytes:
    out = io.BytesIO()
    sealer = sealed.Sealer(out, to, chunk)
    # Written in uneven pieces, as tarfile writes: the chunking must not depend on them.
    for i in range(0, len(plain), 1000):
        sealer.write(plain[i : i + 1000])
    sealer.finish()
    return out.getvalue()


def header_len(data: bytes) -> int:
    (n,) = struct.unpack(">I", data[len(sealed.MAGIC) : len(sealed.MAGIC) + 4])
    return len(sealed.MAGIC) + 4 + int(n)


def open_bytes(tmp_path: Path, data: bytes, key: boxkey.BoxKey) -> bytes:
    src = tmp_path / "in.sealed"
    src.write_bytes(data)
    fd = os.open(src, os.O_RDONLY)
    out = os.open(tmp_path / "out.plain", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        found = sealed.read_header(fd, src)
        assert found is not None
        n = sealed.decrypt(found, fd, key, out)
        plain = os.pread(out, n + 1, 0)
        assert len(plain) == n
        return plain
    finally:
        os.close(fd)
        os.close(out)


def refuses(act: Callable[[], object], code: str, message: str) -> Refusal:
    with pytest.raises(Refusal) as err:
        act()
    assert (err.value.code, err.value.message) == (code, message)
    return err.value


# -- the box key --------------------------------------------------------------------------------


def test_the_box_key_is_made_once_private_and_printed_canonically(tmp_path: Path) -> None:
    layout = Layout.at(tmp_path)
    assert boxkey.load_box_key(layout) is None
    assert list(tmp_path.iterdir()) == []
    printed = boxkey.box_public_key(layout)
    assert printed.startswith("x25519:") and len(printed) == 50
    assert boxkey.parse_public(printed) is not None
    assert stat.S_IMODE(os.stat(layout.box_key).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(layout.auth).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(layout.control).st_mode) == 0o700
    assert layout.box_key == tmp_path / ".cotal" / "auth" / "box.key"
    record = json.loads(layout.box_key.read_bytes())
    assert sorted(record) == ["createdAt", "privateKey", "publicKey", "version"]
    assert record["publicKey"] == printed and record["version"] == 1
    before = layout.box_key.read_bytes()
    assert boxkey.box_public_key(layout) == printed
    loaded = boxkey.load_box_key(layout)
    assert loaded is not None and loaded.public == printed
    assert layout.box_key.read_bytes() == before


def test_a_malformed_box_key_refuses_and_is_never_minted_over(tmp_path: Path) -> None:
    layout = Layout.at(tmp_path)
    printed = boxkey.box_public_key(layout)
    record = json.loads(layout.box_key.read_bytes())
    other = boxkey.BoxKey(X25519PrivateKey.generate()).public
    cure = (
        f"restore {layout.box_key} from backup; files sealed to this root open only with that "
        "key, so cotal will not mint over it"
    )
    for broken, message in (
        (
            {**record, "publicKey": other},
            f"box key {layout.box_key}: its public key does not match its private key",
        ),
        (
            {**record, "privateKey": "short"},
            f"box key {layout.box_key} is malformed (version or private key)",
        ),
        (
            {**record, "extra": 1},
            f"box key {layout.box_key} is malformed: Object contains unknown field `extra`",
        ),
    ):
        data = json.dumps(broken).encode()
        os.unlink(layout.box_key)
        fd = os.open(layout.box_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, data)
        os.close(fd)
        for act in (lambda: boxkey.load_box_key(layout), lambda: boxkey.box_public_key(layout)):
            err = refuses(act, "box-key-malformed", message)
            assert err.cure == cure
        assert layout.box_key.read_bytes() == data
    assert printed != other


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("dVHsg43vg6RBMkRDMfz9FTAAZI71UZpyh76xelK0T1s", "syntax"),
        ("x25519:dVHsg43vg6RBMkRDMfz9FTAAZI71UZpyh76xelK0T1", "syntax"),
        ("x25519:dVHsg43vg6RBMkRDMfz9FTAAZI71UZpyh76xelK0T1s=", "syntax"),
        ("x25519:dVHsg43vg6RBMkRDMfz9FTAAZI71UZpyh76xelK0T1t", "syntax"),
        ("x25519:dVHsg43vg6RBMkRDMfz9FTAAZI71UZpyh76xelK0T1+", "syntax"),
        ("ed25519:dVHsg43vg6RBMkRDMfz9FTAAZI71UZpyh76xelK0T1s", "syntax"),
        ("x25519:" + base64.urlsafe_b64encode(bytes(32)).rstrip(b"=").decode(), "low-order"),
    ],
    ids=["no-prefix", "short", "padded", "non-canonical", "not-url-safe", "ed25519", "zero"],
)
def test_a_to_key_that_is_not_a_box_key_refuses(text: str, why: str) -> None:
    message = (
        f"{text!r} is not a box key (expected x25519: and 43 characters of base64url)"
        if why == "syntax"
        else f"{text!r} is not a usable X25519 public key"
    )
    err = refuses(lambda: boxkey.recipient_key(text), "bad-box-key", message)
    assert err.cure == (
        "pass the destination root's box key exactly as its `cotal status` prints it; nothing "
        "was packed"
    )


def test_a_genuine_to_key_parses_to_itself(tmp_path: Path) -> None:
    _, key = root_with_key(tmp_path, "b")
    assert boxkey.raw_public(boxkey.recipient_key(key.public)) == boxkey.raw_public(public(key))


# -- the chunk format ---------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, C - 1, C, C + 1, 3 * C, 3 * C + 7])
def test_chunks_are_fixed_size_and_the_last_one_is_shorter(tmp_path: Path, size: int) -> None:
    _, key = root_with_key(tmp_path, "b")
    plain = os.urandom(size)
    data = seal_bytes(plain, public(key))
    start = header_len(data)
    # Every chunk but the last holds C bytes; the last holds the rest, none when size is a
    # multiple of C: a full chunk is never final.
    chunks = size // C + 1
    assert len(data) == start + size + chunks * sealed.TAG
    assert open_bytes(tmp_path, data, key) == plain


def test_the_header_is_strict_and_names_the_recipient(tmp_path: Path) -> None:
    _, key = root_with_key(tmp_path, "b")
    data = seal_bytes(b"x" * 10, public(key))
    assert data.startswith(b"cotal-sealed-pack\n")
    doc = json.loads(data[len(sealed.MAGIC) + 4 : header_len(data)])
    assert sorted(doc) == ["aead", "chunkBytes", "ephemeral", "kdf", "recipient", "version"]
    assert (doc["version"], doc["aead"], doc["kdf"], doc["chunkBytes"]) == (
        1,
        "chacha20-poly1305",
        "hkdf-sha256",
        C,
    )
    assert doc["recipient"] == key.public and doc["ephemeral"] != key.public
    # A second seal of the same bytes uses another ephemeral key: no two files share a key.
    again = seal_bytes(b"x" * 10, public(key))
    assert (
        json.loads(again[len(sealed.MAGIC) + 4 : header_len(again)])["ephemeral"]
        != (doc["ephemeral"])
    )
    assert again[header_len(again) :] != data[header_len(data) :]


def _rewrite_header(data: bytes, change: Callable[[dict[str, object]], object]) -> bytes:
    start = header_len(data)
    doc = json.loads(data[len(sealed.MAGIC) + 4 : start])
    change(doc)
    body = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    return sealed.MAGIC + struct.pack(">I", len(body)) + body + data[start:]


def _damage(kind: str, data: bytes, other: bytes) -> tuple[bytes, str]:
    """The damaged file and the message it refuses with; `data` and `other` are two seals of
    3 chunks and 100 bytes (4 chunks) to the same key."""
    h = header_len(data)
    at = [h + i * STEP for i in range(4)]

    def auth(i: int) -> str:
        return (
            f"chunk {i} (at byte {at[i]}) fails authentication: the file was altered, cut short, "
            "reordered or spliced from another file"
        )

    flipped = bytearray(data)
    if kind == "flip-first":
        flipped[at[0] + 10] ^= 0x01
        return bytes(flipped), auth(0)
    if kind == "flip-tag-of-last":
        flipped[-1] ^= 0x80
        return bytes(flipped), auth(3)
    if kind == "cut-at-chunk-boundary":
        return data[: at[3]], auth(2)
    if kind == "cut-by-one-byte":
        return data[:-1], auth(3)
    if kind == "cut-mid-chunk":
        return data[: at[1] + 100], auth(1)
    if kind == "cut-inside-a-tag":
        return data[: at[3] + 5], auth(3)
    if kind == "cut-after-header":
        return data[:h], "it ends after its sealed header, with no chunk"
    if kind == "cut-inside-header":
        return data[: h - 3], "it ends inside its sealed header"
    if kind == "cut-inside-magic":
        return data[:5], "it ends inside its sealed header"
    if kind == "swap-chunks":
        return data[: at[0]] + data[at[1] : at[2]] + data[at[0] : at[1]] + data[at[2] :], auth(0)
    if kind == "splice-from-another-file":
        oh = header_len(other)
        return data[: at[1]] + other[oh + STEP : oh + 2 * STEP] + data[at[2] :], auth(1)
    if kind == "append-a-byte":
        return data + b"\x00", auth(3)
    if kind == "append-a-chunk":
        return data + data[at[0] : at[1]], auth(3)
    if kind == "other-ephemeral":
        fresh = boxkey.BoxKey(X25519PrivateKey.generate()).public
        return _rewrite_header(data, lambda d: d.update(ephemeral=fresh)), auth(0)
    if kind == "header-unknown-field":
        return (
            _rewrite_header(data, lambda d: d.update(note="hi")),
            "its sealed header is malformed: Object contains unknown field `note`",
        )
    if kind == "header-bad-chunk-size":
        return (
            _rewrite_header(data, lambda d: d.update(chunkBytes=5000)),
            "its chunk size 5000 is not one cotal writes",
        )
    if kind == "header-not-json":
        body = b"{not json"
        return (
            sealed.MAGIC + struct.pack(">I", len(body)) + body + data[h:],
            "its sealed header is malformed: not valid JSON (JSON is malformed: object keys must "
            "be strings (byte 1))",
        )
    if kind == "header-too-long":
        return (
            sealed.MAGIC + struct.pack(">I", 1 << 20) + data[len(sealed.MAGIC) + 4 :],
            f"its sealed header declares {1 << 20} bytes, more than 4096",
        )
    raise AssertionError(kind)


DAMAGE = [
    "flip-first",
    "flip-tag-of-last",
    "cut-at-chunk-boundary",
    "cut-by-one-byte",
    "cut-mid-chunk",
    "cut-inside-a-tag",
    "cut-after-header",
    "cut-inside-header",
    "cut-inside-magic",
    "swap-chunks",
    "splice-from-another-file",
    "append-a-byte",
    "append-a-chunk",
    "other-ephemeral",
    "header-unknown-field",
    "header-bad-chunk-size",
    "header-not-json",
    "header-too-long",
]


@pytest.mark.parametrize("kind", DAMAGE)
def test_damage_anywhere_is_sealed_corrupt(tmp_path: Path, kind: str) -> None:
    _, key = root_with_key(tmp_path, "b")
    plain = os.urandom(3 * C + 100)
    data = seal_bytes(plain, public(key))
    other = seal_bytes(os.urandom(3 * C + 100), public(key))
    damaged, what = _damage(kind, data, other)
    src = tmp_path / "in.sealed"
    err = refuses(
        lambda: open_bytes(tmp_path, damaged, key),
        "sealed-corrupt",
        f"sealed packed checkpoint {src}: {what}",
    )
    assert err.cure == CURE


def test_a_header_of_another_version_names_it(tmp_path: Path) -> None:
    _, key = root_with_key(tmp_path, "b")
    data = _rewrite_header(seal_bytes(b"x", public(key)), lambda d: d.update(version=2))
    err = refuses(
        lambda: open_bytes(tmp_path, data, key),
        "sealed-corrupt",
        f"sealed packed checkpoint {tmp_path / 'in.sealed'}: its sealed header is version 2; "
        "this cotal reads version 1",
    )
    assert err.cure == (
        "open it with the cotal that packed it, or pack it again with this one; nothing was written"
    )


# -- unpack: the destination ------------------------------------------------------------------


def attempt_tree(base: Path) -> Path:
    top = base / A
    (top / "default" / "repo").mkdir(parents=True)
    (top / "manifest.json").write_text('{"attempt": "sealed"}\n')
    (top / "default" / "transcript.jsonl").write_bytes(
        b'{"role":"user","text":"Remember the phrase ' + PHRASE + b'."}\n'
    )
    # Incompressible and several chunks long, so the unpacking crosses chunk boundaries.
    (top / "default" / "repo" / "blob.bin").write_bytes(os.urandom(5 * C + 321))
    hook = top / "default" / "hook.sh"
    hook.write_text("#!/bin/sh\n")
    hook.chmod(0o700)
    return top


def tree(path: Path) -> dict[str, tuple[bool, bytes | None]]:
    """Each entry's owner-execute bit and contents: an unpacking makes its own modes (0700 and
    0600) and keeps only that bit."""
    out: dict[str, tuple[bool, bytes | None]] = {}
    for dirpath, dirnames, files in os.walk(path):
        for name in dirnames + files:
            p = Path(dirpath) / name
            executable = bool(os.lstat(p).st_mode & stat.S_IXUSR)
            out[str(p.relative_to(path))] = (
                executable,
                None if name in dirnames else p.read_bytes(),
            )
    return out


def pack_to(tmp_path: Path, to: X25519PublicKey | None, name: str = "ckpt.sealed") -> Path:
    src = attempt_tree(tmp_path / "source")
    out = tmp_path / name
    archive.write_archive(src, out, to=to, chunk_bytes=C)
    return out


def test_a_sealed_pack_unpacks_at_its_recipient_exactly(tmp_path: Path) -> None:
    layout, key = root_with_key(tmp_path, "b")
    src = attempt_tree(tmp_path / "source")
    out = tmp_path / "ckpt.sealed"
    digest, size = archive.write_archive(src, out, to=public(key), chunk_bytes=C)
    data = out.read_bytes()
    assert (size, stat.S_IMODE(out.stat().st_mode)) == (len(data), 0o600)
    assert digest == hashlib.sha256(data).hexdigest()
    # The archive inside is a whole ustar file, in chunks (tarfile pads it to 10240-byte
    # records), and none of its bytes are in the file as they are.
    assert len(data) > 6 * STEP
    assert PHRASE not in data and b"ustar" not in data and A.encode() not in data
    staged = archive.unpack(out, layout)
    assert staged == layout.incoming / A
    assert tree(staged) == tree(src)
    assert stat.S_IMODE(os.stat(staged / "default" / "hook.sh").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(staged / "default" / "transcript.jsonl").st_mode) == 0o600
    # The opened plaintext had no name, and nothing else is left in the staging.
    assert sorted(os.listdir(layout.incoming)) == [A]
    assert stat.S_IMODE(os.stat(layout.incoming).st_mode) == 0o700


def test_an_unsealed_pack_still_holds_its_plaintext(tmp_path: Path) -> None:
    layout = Layout.at(tmp_path / "c")
    (tmp_path / "c").mkdir()
    out = pack_to(tmp_path, None, "ckpt.tar")
    assert PHRASE in out.read_bytes()
    assert tree(archive.unpack(out, layout)) == tree(tmp_path / "source" / A)


def test_another_root_refuses_it_by_name_and_changes_nothing(tmp_path: Path) -> None:
    _, b_key = root_with_key(tmp_path, "b")
    c, c_key = root_with_key(tmp_path, "c")
    out = pack_to(tmp_path, public(b_key))
    before = snapshot(c.root)
    err = refuses(
        lambda: archive.unpack(out, c),
        "sealed-to-other",
        f"packed checkpoint {out} is sealed to box key {b_key.public}; this root's box key is "
        f"{c_key.public}",
    )
    assert err.cure == (
        "resume it on the root whose `cotal status` prints that key, or pack it again on the "
        f"source with --to {c_key.public} (this root's key from `cotal status`); nothing was "
        "written"
    )
    assert snapshot(c.root) == before
    # A root without any box key is told so, and is not given one.
    d = tmp_path / "d"
    d.mkdir()
    err = refuses(
        lambda: archive.unpack(out, Layout.at(d)),
        "sealed-to-other",
        f"packed checkpoint {out} is sealed to box key {b_key.public}; this root ({d}) has no "
        "box key yet, so it is not that root",
    )
    assert "run `cotal status` on this root" in err.cure
    assert list(d.iterdir()) == []


def test_a_changed_recipient_in_the_header_is_refused_at_the_recipient(tmp_path: Path) -> None:
    b, b_key = root_with_key(tmp_path, "b")
    out = pack_to(tmp_path, public(b_key))
    other = boxkey.BoxKey(X25519PrivateKey.generate()).public
    out.write_bytes(_rewrite_header(out.read_bytes(), lambda d: d.update(recipient=other)))
    refuses(
        lambda: archive.unpack(out, b),
        "sealed-to-other",
        f"packed checkpoint {out} is sealed to box key {other}; this root's box key is "
        f"{b_key.public}",
    )


@pytest.mark.parametrize("kind", ["flip", "truncate"])
def test_a_damaged_sealed_pack_leaves_nothing_behind(tmp_path: Path, kind: str) -> None:
    b, b_key = root_with_key(tmp_path, "b")
    out = pack_to(tmp_path, public(b_key))
    data = bytearray(out.read_bytes())
    h = header_len(bytes(data))
    if kind == "flip":
        data[h + 3 * STEP + 7] ^= 0x01
        what = f"chunk 3 (at byte {h + 3 * STEP}) fails authentication"
    else:
        del data[h + 4 * STEP :]
        what = f"chunk 3 (at byte {h + 3 * STEP}) fails authentication"
    out.write_bytes(bytes(data))
    before = snapshot(b.root)
    err = refuses(
        lambda: archive.unpack(out, b),
        "sealed-corrupt",
        f"sealed packed checkpoint {out}: {what}: the file was altered, cut short, reordered "
        "or spliced from another file",
    )
    assert err.cure == CURE
    # The staging directories this unpacking made are gone again, and nothing else moved.
    assert snapshot(b.root) == before
    assert not (b.control / "maintenance").exists()


def test_a_sealed_hostile_archive_meets_every_ustar_check(tmp_path: Path) -> None:
    b, b_key = root_with_key(tmp_path, "b")
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        top = tarfile.TarInfo(A)
        top.type = tarfile.DIRTYPE
        tar.addfile(top)
        link = tarfile.TarInfo(f"{A}/link")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        tar.addfile(link)
    out = tmp_path / "evil.sealed"
    out.write_bytes(seal_bytes(plain.getvalue(), public(b_key)))
    before = snapshot(b.root)
    refuses(
        lambda: archive.unpack(out, b),
        "unsafe-archive",
        f"packed checkpoint {out}: member '{A}/link' is a symlink to '/etc/passwd'",
    )
    assert snapshot(b.root) == before
    assert not (b.control / "maintenance").exists()


def test_a_staging_symlink_refuses_before_the_file_is_opened(tmp_path: Path) -> None:
    b, b_key = root_with_key(tmp_path, "b")
    out = pack_to(tmp_path, public(b_key))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, b.maintenance.parent)
    before = snapshot(b.root)
    err = refuses(
        lambda: archive.unpack(out, b),
        "unsafe-path",
        f"{b.maintenance.parent} is not a plain directory (a symlink or another file is there)",
    )
    assert err.cure == "remove it so cotal can create a private 0700 directory"
    assert snapshot(b.root) == before
    assert list(elsewhere.iterdir()) == []
