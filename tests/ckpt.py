"""Real sealed checkpoints for the admission tests: cut one, copy it, re-seal it, and observe a
destination root and the broker's custody without changing either."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import msgspec
from nats.js.errors import KeyNotFoundError

from manager.checkpoint.reader import read_manifest, read_seat_checkpoint
from manager.checkpoint.seal import seal_manifest, seal_seat
from manager.workspace.identity import InstanceIdentity, load_or_create_identity
from manager.workspace.layout import Layout
from protocol.checkpoint import (
    CHECKPOINT_FILE,
    MANIFEST_FILE,
    AttemptManifest,
    FileRef,
    ManifestSeat,
    SeatCheckpoint,
)
from protocol.codec import encode_json
from protocol.inventory import Inventory, encode_inventory, parse_resume_args
from tests.conftest import Cli, SharedBroker
from tests.gitrepo import git, init_repo, tree_digest, write
from tests.helpers import broker_at


@dataclass
class Cut:
    """A sealed attempt cut by a real manager in `root`, and a copy of it outside that root."""

    root: Path
    source_dir: Path
    copy: Path
    attempt_id: str
    rows: dict[str, dict[str, Any]]
    broker: SharedBroker
    # The source manager's instance key: what a destination must trust to admit this cut.
    signer_key: str

    def uid(self, seat: str = "scribe1") -> str:
        return str(self.rows[seat]["lifecycleUid"])

    @property
    def trust(self) -> tuple[str, ...]:
        """The flags that make a destination trust this cut's signer for one run."""
        return ("--trust-signer", self.signer_key)

    @property
    def instance_id(self) -> str:
        return str(next(iter(self.rows.values()))["instanceId"])


def broker_args(b: SharedBroker) -> tuple[str, ...]:
    return ("--server", b.url, "--creds", b.creds)


def seed_tree(root: Path) -> None:
    """A git root with a commit, a modified tracked file and an untracked file."""
    init_repo(root)
    write(root / "tracked.txt", "alpha\nbeta\n")
    git(root, "add", "tracked.txt")
    git(root, "commit", "-q", "-m", "first")
    write(root / "tracked.txt", "alpha\nbeta changed\n")
    write(root / "notes-untracked.txt", "untracked at the cut\n")


def make_cut(
    cli: Cli, b: SharedBroker, copy_to: Path, seats: Collection[str] = ("scribe1",)
) -> Cut:
    """up against the shared broker, spawn scribe seats, `down --preserve-state`, copy it out."""
    seed_tree(cli.root)
    cli.run("up", "--detach", *broker_args(b))
    rows = {
        name: cli.json("spawn", name, "--prompt", f"Remember the phrase {name}-41")
        for name in seats
    }
    result = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    assert result["journal"] == "ready" and result["failures"] == [], result
    source_dir = Path(result["checkpointDir"])
    shutil.copytree(source_dir, copy_to)
    key = source_identity(cli.root).public_key_b64
    return Cut(cli.root, source_dir, copy_to, result["attemptId"], rows, b, key)


def make_destination(root: Path) -> None:
    """A root that already holds someone's older tree, so an untouched one can be recognised."""
    root.mkdir(parents=True, exist_ok=True)
    init_repo(root)
    write(root / "older.txt", "the destination's own older tree\n")
    git(root, "add", "older.txt")
    git(root, "commit", "-q", "-m", "older")
    write(root / "scratch-untracked.txt", "destination scratch\n")


def move_source_away(cut: Cut) -> Path:
    """The source root leaves its absolute path; a fresh destination takes that path."""
    moved = cut.root.with_name(cut.root.name + ".src")
    os.rename(cut.root, moved)
    make_destination(cut.root)
    return moved


def source_identity(source_root: Path, space: str = "main") -> InstanceIdentity:
    """The manager instance identity that sealed the cut (it must already exist: never mint)."""
    layout = Layout.at(source_root)
    assert layout.instance_identity(space).exists(), "the source root has no instance identity"
    return load_or_create_identity(layout, space)


def foreign_identity(
    instance_id: str = "f0reign0000000000000000000", space: str = "main"
) -> InstanceIdentity:
    from nacl.signing import SigningKey

    return InstanceIdentity(instance_id, space, SigningKey.generate())


def record_bytes(record: SeatCheckpoint | AttemptManifest) -> bytes:
    """A record laid out exactly as the writer lays it out."""
    return msgspec.json.format(encode_json(record), indent=2) + b"\n"


def file_ref(path: Path) -> FileRef:
    data = path.read_bytes()
    return FileRef(file=path.name, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())


def reseal_manifest(
    attempt: Path, identity: InstanceIdentity, *, drop: Collection[str] = ()
) -> None:
    """Re-sign the manifest over whatever checkpoint.json bytes each remaining seat holds now."""
    manifest = read_manifest(attempt)
    (attempt / MANIFEST_FILE).unlink()
    seats = [
        ManifestSeat(name=s.name, dir=s.dir, checkpoint=file_ref(attempt / s.dir / CHECKPOINT_FILE))
        for s in manifest.seats
        if s.name not in drop
    ]
    # The resume document too is named by whatever bytes it holds now (a forged plan included).
    resume = file_ref(attempt / manifest.resume.file)
    seal_manifest(
        attempt,
        msgspec.structs.replace(manifest, seats=seats, resume=resume),
        identity.sign,
        identity.public_key_b64,
        identity.instance_id,
    )


def reseal(
    src: Path,
    dst: Path,
    identity: InstanceIdentity,
    *,
    edit: Callable[[SeatCheckpoint], SeatCheckpoint] | None = None,
    only: Collection[str] | None = None,
    drop: Collection[str] = (),
    plan: Callable[[Inventory], Inventory] | None = None,
) -> Path:
    """Copy an attempt and seal it again with `identity`: each seat (or those in `only`) edited
    by `edit` and signed anew, `drop` seats removed with their manifest entries, the resume
    document rewritten by `plan` when given, the manifest re-signed last: what a hostile signer
    can send."""
    shutil.copytree(src, dst)
    for name in drop:
        shutil.rmtree(dst / name)
    if plan is not None:
        manifest = read_manifest(dst)
        path = dst / manifest.resume.file
        inventory = parse_resume_args(manifest.attempt_id, path.read_bytes())
        path.write_bytes(encode_inventory(plan(inventory)))
    if edit is not None:
        for seat in read_manifest(dst).seats:
            if seat.name in drop or (only is not None and seat.name not in only):
                continue
            seat_dir = dst / seat.dir
            record = read_seat_checkpoint(seat_dir)
            (seat_dir / CHECKPOINT_FILE).unlink()
            seal_seat(
                seat_dir, edit(record), identity.sign, identity.public_key_b64, identity.instance_id
            )
    reseal_manifest(dst, identity, drop=drop)
    return dst


def replace_agent(seat: str, **launch: Any) -> Callable[[Inventory], Inventory]:
    """A plan edit: seat `seat`'s launch fields replaced (e.g. `cwd`, `session_stores`)."""

    def edit(inventory: Inventory) -> Inventory:
        agents = [
            msgspec.structs.replace(a, launch=msgspec.structs.replace(a.launch, **launch))
            if a.name == seat
            else a
            for a in inventory.agents
        ]
        return msgspec.structs.replace(inventory, agents=agents)

    return edit


def snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    """Every entry under a root, .git and .cotal included, with inode and mtime, except the
    manager's logs (which a CLI may append to); a refused resume must leave all of it alone."""
    if not root.exists():
        return {}
    out = {
        k: v
        for k, v in tree_digest(root, skip=(), times=True).items()
        if k != ".cotal/logs" and not k.startswith(".cotal/logs/")
    }
    if ".cotal" in out:
        # Admission's scratch (.cotal/scratch, removed on a refusal) moves the control
        # directory's own mtime and nothing else.
        out[".cotal"] = out[".cotal"][:2]
    return out


def manager_answers(root: Path) -> bool:
    sock_path = root / ".cotal" / "manager.sock"
    if not sock_path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(sock_path))
        except OSError:
            return False
    return True


async def custody(
    b: SharedBroker, seat: str, uid: str, attempt_id: str, space: str = "main"
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The seat's custody record and the attempt's claim key at the broker (None when absent)."""
    async with broker_at(b.url, b.creds) as js:
        kv = await js.key_value(f"cotal_custody_{space}")
        out: list[dict[str, Any] | None] = []
        for key in (f"local.{seat}.{uid}", f"attempt.{attempt_id}"):
            try:
                entry = await kv.get(key)
            except KeyNotFoundError:
                out.append(None)
                continue
            out.append(json.loads(entry.value or b"null"))
    return out[0], out[1]


async def presence_uids(b: SharedBroker, space: str = "main") -> set[str]:
    async with broker_at(b.url, b.creds) as js:
        kv = await js.key_value(f"cotal_presence_{space}")
        try:
            keys = await kv.keys()
        except Exception as exc:
            if type(exc).__name__ == "NoKeysError":
                return set()
            raise
    return {k.rsplit(".", 1)[-1] for k in keys}


async def wait_presence(b: SharedBroker, uid: str, *, live: bool, timeout: float = 15.0) -> None:
    """Until the uid is (or is no longer) announced in the presence bucket, under a deadline."""
    with anyio.fail_after(timeout):
        while True:
            if (uid in await presence_uids(b)) == live:
                return
            await anyio.sleep(0.1)
