"""The packed checkpoint a destination accepts: one POSIX ustar archive of an attempt directory,
read as that and nothing else.

Reading is two passes over one open file. The plan reads only the headers (and the padding
after each member's data) and refuses, by the member's name, anything that is not a regular
file or a directory of the attempt: links, devices, fifos, sparse files (GNU type `S` or PAX
`GNU.sparse.*` headers), PAX and GNU extension headers, `.`, `..`, absolute or duplicate names,
a member before its directory, sizes the file does not hold. Only then does the write copy
exactly the planned bytes from the planned offsets: a member's declared size is at most the
bytes that follow its header, so what the write produces is bounded by the file's own size,
whatever the headers say. tarfile is not used to read, because it expands sparse members, reads
extension headers of any size into memory and normalizes `a/./b` to `a/b` before a caller sees
the name.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from protocol.errors import Refusal
from protocol.names import ATTEMPT_ID
from protocol.refusals import Code

BLOCK = 512
MEMBERS_CAP = 200_000
_CHUNK = 1 << 20
# An extension header is read only to say what it describes, and only this much of it.
_PEEK_CAP = 64 * 1024

_POSIX_MAGIC = b"ustar\x0000"
_GNU_MAGIC = b"ustar  \x00"
_REGULAR = (b"0", b"\x00")
_DIRECTORY = b"5"
_KINDS = {
    b"1": "a hard link",
    b"2": "a symlink",
    b"3": "a character device",
    b"4": "a block device",
    b"6": "a fifo",
    b"7": "a contiguous file",
    b"S": "a GNU sparse file",
    b"g": "a PAX global header",
    b"D": "a GNU directory dump",
    b"M": "a GNU multi-volume continuation",
    b"V": "a volume label",
    b"N": "an old GNU long-name header",
}


def unsafe(src: Path, what: str, cure: str | None = None) -> Refusal:
    return Refusal(
        Code.UNSAFE_ARCHIVE,
        f"packed checkpoint {src}: {what}",
        cure
        or "a packed checkpoint holds only the attempt's regular files and directories; pack it "
        "again on the source with `cotal checkpoint pack`; nothing was written",
    )


def bad(src: Path, what: str) -> Refusal:
    return Refusal(
        Code.BAD_ARCHIVE,
        f"packed checkpoint {src} is damaged: {what}",
        "copy the file again and compare its sha256 with the one `cotal checkpoint pack` "
        "printed; nothing was written",
    )


@dataclass(frozen=True)
class Member:
    name: str  # as the archive spells it, for messages
    parts: tuple[str, ...]
    directory: bool
    offset: int  # of its data
    size: int
    executable: bool


@dataclass(frozen=True)
class Plan:
    attempt: str
    members: tuple[Member, ...]
    data_bytes: int
    archive_bytes: int


class Pack:
    """One open packed file: `plan()` reads it, `write(plan, dest)` unpacks what it planned."""

    def __init__(self, src: Path, fd: int) -> None:
        self.src = src
        self.fd = fd
        self.stat = os.fstat(fd)

    def _read(self, offset: int, n: int) -> bytes:
        return os.pread(self.fd, n, offset)

    def _zeros(self, start: int, end: int) -> bool:
        while start < end:
            chunk = self._read(start, min(end - start, _CHUNK))
            if not chunk or chunk.count(0) != len(chunk):
                return False
            start += len(chunk)
        return True

    def plan(self) -> Plan:
        size = self.stat.st_size
        members: list[Member] = []
        seen: set[str] = set()
        dirs: set[str] = set()
        attempt: str | None = None
        total = 0
        off = 0
        while True:
            block = self._read(off, BLOCK)
            if not block:
                break
            if len(block) < BLOCK:
                raise bad(self.src, f"it ends inside the header at byte {off}")
            if block.count(0) == BLOCK:
                if not self._zeros(off, size):
                    raise bad(self.src, "bytes after the last member are not the zero trailer")
                break
            if len(members) >= MEMBERS_CAP:
                raise unsafe(self.src, f"it has more than {MEMBERS_CAP} members")
            member = self._member(block, off, size)
            key = "/".join(member.parts)
            if attempt is None:
                if not member.directory or len(member.parts) != 1:
                    raise unsafe(
                        self.src, f"its first member {member.name!r} is not the attempt directory"
                    )
                if not ATTEMPT_ID.matches(key):
                    raise unsafe(self.src, f"its top directory {key!r} is not an attempt id")
                attempt = key
            elif key in seen:
                raise unsafe(self.src, f"member {member.name!r} appears twice")
            elif member.parts[0] != attempt:
                raise unsafe(self.src, f"member {member.name!r} is outside {attempt}/")
            elif "/".join(member.parts[:-1]) not in dirs:
                raise unsafe(
                    self.src,
                    f"member {member.name!r} comes before (or without) its directory "
                    f"{'/'.join(member.parts[:-1])!r}",
                )
            seen.add(key)
            if member.directory:
                dirs.add(key)
            members.append(member)
            total += member.size
            off = member.offset + _padded(member.size)
        if attempt is None:
            raise bad(self.src, "it holds no members")
        # Each member's data lies between its header and the next: the sum cannot pass the file.
        assert total + BLOCK * len(members) <= size
        return Plan(attempt, tuple(members), total, size)

    def _member(self, block: bytes, off: int, size: int) -> Member:
        if not _checksum_ok(block):
            raise bad(self.src, f"the header at byte {off} fails its checksum")
        flag = block[156:157]
        magic = block[257:265]
        name = _text(block[0:100])
        if magic == _POSIX_MAGIC and block[345] != 0:
            name = _text(block[345:500]) + "/" + name
        declared = _octal(block[124:136])
        if flag == b"x":
            raise self._pax(name, off, declared, size)
        if flag in (b"L", b"K"):
            what = "long name" if flag == b"L" else "long link name"
            long = self._peek(off, declared, size)
            named = _text(long) if long is not None else name
            raise unsafe(self.src, f"member {named!r} carries a GNU {what} header")
        if flag not in _REGULAR and flag != _DIRECTORY:
            kind = _KINDS.get(flag, f"of unknown type {flag!r}")
            if flag in (b"1", b"2"):
                kind += f" to {_text(block[157:257])!r}"
            raise unsafe(self.src, f"member {name!r} is {kind}")
        if magic not in (_POSIX_MAGIC, _GNU_MAGIC):
            raise unsafe(self.src, f"member {name!r} has no ustar header (magic {magic!r})")
        if declared is None:
            raise bad(self.src, f"member {name!r} has an unreadable size field")
        directory = flag == _DIRECTORY
        if directory and declared:
            raise unsafe(self.src, f"directory member {name!r} declares {declared} bytes of data")
        parts = self._parts(name, directory)
        data = off + BLOCK
        if data + _padded(declared) > size:
            raise unsafe(
                self.src,
                f"member {name!r} declares {declared} bytes, but only {max(0, size - data)} "
                "bytes of the file follow its header",
                "a member's data must be in the file itself: a copy cut short refuses this way, "
                "so copy the file again and compare its sha256 with the one `cotal checkpoint "
                "pack` printed; nothing was written",
            )
        # Padding is covered by no checkpoint digest: it must be what a writer puts there, so
        # no byte of the file goes unchecked.
        if not self._zeros(data + declared, data + _padded(declared)):
            raise bad(self.src, f"the padding after {name!r} is not zero")
        mode = _octal(block[100:108]) or 0
        return Member(name, parts, directory, data, declared, bool(mode & 0o100))

    def _parts(self, name: str, directory: bool) -> tuple[str, ...]:
        path = name[:-1] if directory and name.endswith("/") else name
        if path.startswith("/"):
            raise unsafe(self.src, f"member {name!r} is an absolute name")
        parts = tuple(path.split("/"))
        if ".." in parts:
            raise unsafe(self.src, f"member {name!r} climbs out of the attempt with '..'")
        if any(p in ("", ".") or "\\" in p for p in parts):
            raise unsafe(
                self.src,
                f"member {name!r} is not a plain relative name (an empty or '.' step, or a "
                "backslash)",
            )
        return parts

    def _peek(self, off: int, declared: int | None, size: int) -> bytes | None:
        if declared is None or declared > _PEEK_CAP or off + BLOCK + declared > size:
            return None
        return self._read(off + BLOCK, declared)

    def _pax(self, name: str, off: int, declared: int | None, size: int) -> Refusal:
        """Name the member a PAX header describes (its `path`, `GNU.sparse.name` or the next
        header's name) and say whether it is a sparse file."""
        records = _pax_records(self._peek(off, declared, size) or b"")
        described = records.get("GNU.sparse.name") or records.get("path")
        if described is None and declared is not None:
            after = self._read(off + BLOCK + _padded(declared), BLOCK)
            if len(after) == BLOCK and after.count(0) != BLOCK:
                described = _text(after[0:100])
        named = described or name
        if any(k.startswith("GNU.sparse.") for k in records):
            return unsafe(self.src, f"member {named!r} is a sparse file (PAX GNU.sparse.* headers)")
        keys = ", ".join(sorted(records)) or "unreadable"
        return unsafe(self.src, f"member {named!r} carries PAX extended headers ({keys})")

    def write(self, plan: Plan, dest: Path) -> None:
        """Create the planned tree under the empty directory `dest`: directories 0700, files
        0600 (0700 with the owner's execute bit, which a checkpoint's hooks need)."""
        for m in plan.members:
            target = dest.joinpath(*m.parts)
            if m.directory:
                os.mkdir(target, 0o700)
                continue
            fd = os.open(
                target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
            with os.fdopen(fd, "wb") as out:
                done = 0
                while done < m.size:
                    chunk = self._read(m.offset + done, min(m.size - done, _CHUNK))
                    if not chunk:
                        raise bad(self.src, f"member {m.name!r} ended early: the file shrank")
                    out.write(chunk)
                    done += len(chunk)
                os.fchmod(out.fileno(), 0o700 if m.executable else 0o600)
        now = os.fstat(self.fd)
        if (now.st_size, now.st_mtime_ns, now.st_ino) != (
            self.stat.st_size,
            self.stat.st_mtime_ns,
            self.stat.st_ino,
        ):
            raise bad(self.src, "it changed while it was unpacked")


@contextmanager
def open_pack(src: Path) -> Iterator[Pack]:
    try:
        fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise Refusal(
            Code.UNPACK_FAILED,
            f"cannot open packed checkpoint {src}: {exc.strerror or exc}",
            "make the file readable by this user, then retry; nothing was written",
        ) from None
    try:
        pack = Pack(src, fd)
        if not stat.S_ISREG(pack.stat.st_mode):
            raise bad(src, "it is not a regular file")
        yield pack
    finally:
        os.close(fd)


def _padded(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


def _text(field: bytes) -> str:
    return field.split(b"\x00", 1)[0].decode("utf-8", "backslashreplace")


def _octal(field: bytes) -> int | None:
    """A ustar number: octal digits, space or NUL padded. GNU's base-256 is not ustar."""
    digits = field.split(b"\x00", 1)[0].strip(b" ")
    if not digits:
        return 0
    if any(c not in b"01234567" for c in digits):
        return None
    return int(digits, 8)


def _checksum_ok(block: bytes) -> bool:
    stored = _octal(block[148:156])
    body = block[:148] + b" " * 8 + block[156:]
    unsigned = sum(body)
    signed = unsigned - 256 * sum(1 for b in body if b > 127)
    return stored is not None and stored in (unsigned, signed)


def _pax_records(data: bytes) -> dict[str, str]:
    """`LEN key=value\\n` records, as far as they parse; only to describe the member."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0 or not data[pos:space].isdigit():
            break
        end = pos + int(data[pos:space])
        record = data[space + 1 : end].rstrip(b"\n")
        key, sep, value = record.partition(b"=")
        if not sep or end <= space:
            break
        out[key.decode("utf-8", "backslashreplace")] = value.decode("utf-8", "backslashreplace")
        pos = end
    return out
