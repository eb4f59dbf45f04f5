"""A destination manager's fetch of one pre-copied history, in a child process of its own.

`cotal move` ships a seat's history before its fence, while every seat on both hosts works on.
Fetched in the manager itself, the tens of megabytes of a large history went through the
manager's one event loop, chunk by chunk, for about a second, and the other seats' turns waited
behind it (bench/move.py: the slow round trips of the other seats fell in the pre-copy phase, at
the destination). A child at background niceness does the fetch and the hashing instead, over a
connection of its own, and says what it wrote; the manager's loop only waits for its exit.

    python -m manager.broker.precopyfetch ROOT SPACE OBJECT PATH

It connects as the root's manager does (the mesh record's server and credential), writes the object
to PATH chunk by chunk in bounded memory (0600, never followed, synced; the store checks the
object's digest as it reads, and the child hashes each chunk as it writes it, so the file is never
read again) and prints one line, `{"bytes": N, "sha256": "..."}`. Any failure is one line on stderr
and exit status 1; the caller refuses by name. A child whose manager died is ended by the
parent-death signal, and what it wrote is a `.part` file the next pre-copy sweeps.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path
from typing import Annotated

import msgspec

from manager import eventloop
from manager.broker import carry
from manager.broker.connection import LazyConnection
from manager.workspace.layout import Layout
from manager.workspace.private import read_stable
from protocol.codec import decode_json, encode_json
from protocol.mesh import decode_mesh

PR_SET_PDEATHSIG = 1


class Fetched(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    bytes: Annotated[int, msgspec.Meta(ge=0)]
    sha256: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]


def decode_fetched(stdout: bytes) -> Fetched:
    """The child's one line, strictly; a DecodeError names what was wrong."""
    lines = stdout.splitlines()
    return decode_json(lines[-1] if lines else b"", Fetched, what="pre-copy fetch", cap=4096)


async def _fetch(root: Path, space: str, name: str, path: Path) -> Fetched:
    layout = Layout.at(root)
    record = decode_mesh(read_stable(layout.mesh, cap=16 * 1024, what="mesh record").data)
    creds = Path(record.creds) if record.creds else None
    async with LazyConnection(record.server, creds, name="cotal-precopy-fetch") as broker:
        size, digest = await carry.get_into(await broker.jetstream(), space, name, path)
    return Fetched(bytes=size, sha256=digest)


def main(argv: list[str]) -> int:
    # Ended with its manager: nothing it does is worth finishing for a manager that is gone.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:
        # The manager died before the signal was asked for.
        return 1
    if len(argv) != 4:
        sys.stderr.write("usage: python -m manager.broker.precopyfetch ROOT SPACE OBJECT PATH\n")
        return 2
    root, space, name, path = argv
    try:
        done = eventloop.run(_fetch, Path(root), space, name, Path(path))
    except Exception as exc:
        sys.stderr.write(f"{type(exc).__name__}: {str(exc)[:2000]}\n")
        return 1
    sys.stdout.buffer.write(encode_json(done) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
