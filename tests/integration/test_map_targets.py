"""A map lands only where a map may (issue 21 item 3).

A real manager cuts a scribe seat whose cwd lies outside its root, so the resume needs
`--map <that cwd>=NEW`. For every NEW no map belongs at (the filesystem root, system and kernel
trees, mount points, another root and its control directory, a symlink, a directory another uid
owns, a non-empty unrelated tree) `cotal checkpoint verify` and `cotal up --restore` refuse with
the rule's own code, and NEW, what is beside it and the destination root are left exactly as
they were. A fresh directory the operator owns and a clone of the same repository are admitted
and restored. The restore's write checks the same rule again: a target that changed after
admission is refused there too, before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from manager.checkpoint.gitstate import capture_repository
from manager.checkpoint.restore import restore_repository
from protocol.errors import Refusal
from tests.ckpt import broker_args, manager_answers, snapshot, source_identity
from tests.conftest import REPO, Cli, SharedBroker, cotal_env
from tests.e2e.test_resume import make_workspace, porcelain
from tests.gitrepo import git, init_repo, seat_dir_for, tree_digest, write

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

SEAT = "scribe1"
# Names a restore writes into its target, or beside it: the seat's tree, staging, aside.
TREE_NAMES = {".git", "README.md", "src", "notes", "data.bin"}
OTHER_UID = 54321


@dataclass
class OutsideCut:
    """A sealed attempt whose seat ran in `outside`, a directory outside the source root."""

    outside: Path
    copy: Path
    key: str
    broker: SharedBroker
    status: bytes
    tree: dict[str, tuple[object, ...]]

    def map(self, new: Path | str) -> tuple[str, str]:
        return ("--map", f"{self.outside}={new}")

    @property
    def trust(self) -> tuple[str, ...]:
        return ("--trust-signer", self.key)


def cut_outside(cli: Cli, b: SharedBroker, tmp_path: Path) -> OutsideCut:
    outside = (tmp_path / "shared").resolve()
    make_workspace(outside)
    status, tree = porcelain(outside), tree_digest(outside)
    cli.run("up", "--detach", *broker_args(b))
    cli.json("spawn", SEAT, "--cwd", str(outside), "--prompt", "Remember the phrase map-41")
    result = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    assert result["journal"] == "ready" and result["failures"] == [], result
    copy = tmp_path / "ckpt"
    shutil.copytree(result["checkpointDir"], copy)
    key = source_identity(cli.root).public_key_b64
    return OutsideCut(outside, copy, key, b, status, tree)


def destination(tmp_path: Path) -> Cli:
    root = tmp_path / "dest"
    root.mkdir()
    return Cli(root)


def verify_args(cut: OutsideCut, new: Path | str) -> tuple[str, ...]:
    return (
        "checkpoint",
        "verify",
        str(cut.copy),
        "--json",
        *broker_args(cut.broker),
        *cut.trust,
        *cut.map(new),
    )


def restore_args(cut: OutsideCut, new: Path | str) -> tuple[str, ...]:
    return (
        "up",
        "--restore",
        str(cut.copy),
        "--json",
        *broker_args(cut.broker),
        *cut.trust,
        *cut.map(new),
    )


def refusal_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 2, f"{proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout == "", proc.stdout
    out: dict[str, Any] = json.loads(proc.stderr.strip().splitlines()[-1])
    assert out["ok"] is False, out
    return out


# -- what "untouched" means ------------------------------------------------------------------------


def _entry(path: Path, *, times: bool) -> tuple[object, ...]:
    st = os.lstat(path)
    kind = stat.S_IFMT(st.st_mode)
    if stat.S_ISREG(st.st_mode) and st.st_size <= 1 << 20:
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            digest = "unreadable"
        return (kind, st.st_ino, st.st_size, digest, *((st.st_mtime_ns,) if times else ()))
    if stat.S_ISLNK(st.st_mode):
        return (kind, st.st_ino, os.readlink(path))
    return (kind, st.st_ino)


def _own_state(target: Path) -> dict[str, tuple[object, ...]]:
    """A directory this test made: every entry beneath it and beside it, with inode, mtime and
    digest; nothing else writes there."""
    if not os.path.lexists(target):
        return {}
    out = {".": _entry(target, times=True)}
    if not os.path.islink(target):
        out.update(tree_digest(target, skip=(), times=True))
    return out


def _shared_entries(target: Path) -> dict[str, tuple[object, ...]]:
    """A system directory: its own entries (not deeper, other processes live there), by type,
    inode and, for a small file, size and digest; a kernel tree's by name and type only."""
    volatile = _volatile(target)
    out: dict[str, tuple[object, ...]] = {}
    with os.scandir(target) as entries:
        for entry in entries:
            if target == Path("/proc") and entry.name.isdigit():
                continue  # processes come and go
            path = Path(entry.path)
            out[entry.name] = (
                (stat.S_IFMT(os.lstat(path).st_mode),) if volatile else _entry(path, times=False)
            )
    return out


def _volatile(target: Path) -> bool:
    return any(target.is_relative_to(t) for t in (Path("/proc"), Path("/sys"), Path("/dev")))


@dataclass
class Observed:
    target: Path
    own: bool
    before: dict[str, tuple[object, ...]]
    beside: set[str]

    @classmethod
    def take(cls, target: Path, *, own: bool) -> Observed:
        state = _own_state(target) if own else _shared_entries(target)
        return cls(target, own, state, cls._beside(target))

    @staticmethod
    def _beside(target: Path) -> set[str]:
        if target == Path("/"):
            return set()
        return {
            n
            for n in os.listdir(target.parent)
            if n.startswith((f"{target.name}.incoming", f"{target.name}.superseded"))
        }

    def assert_untouched(self) -> None:
        if self.own:
            assert _own_state(self.target) == self.before, self.target
        else:
            now = _shared_entries(self.target)
            # Every entry that was there is still there as it was (other processes may add
            # their own, and in a kernel tree or /dev/shm remove theirs), and none the restore
            # would write has appeared.
            gone_ok = _volatile(self.target)
            changed = {
                n
                for n, e in self.before.items()
                if now.get(n) != e and not (gone_ok and n not in now)
            }
            assert not changed, (self.target, changed)
            new = set(now) - set(self.before)
            assert not new & TREE_NAMES, (self.target, new)
            assert not [n for n in new if n.startswith(".cotal-")], (self.target, new)
        assert self._beside(self.target) == self.beside, self.target


# -- refusals --------------------------------------------------------------------------------------


def assert_refused(
    dest: Cli, cut: OutsideCut, new: Path, code: str, contains: str, *, own: bool
) -> None:
    """Refused by name at verify and at the restore, and nothing changed anywhere."""
    seen = Observed.take(new, own=own)
    root_before = snapshot(dest.root)
    for args in (verify_args(cut, new), restore_args(cut, new)):
        out = refusal_of(dest.run(*args, check=False))
        assert out["code"] == code, (new, args[0], out)
        assert f"--map {cut.outside}={new}: " in out["error"], out
        assert contains in out["error"], (contains, out["error"])
        seen.assert_untouched()
        assert snapshot(dest.root) == root_before
        assert not manager_answers(dest.root)
        assert not (dest.root / ".cotal/maintenance/v1/journal.json").exists()


def test_a_map_onto_the_system_is_refused_and_leaves_it_alone(
    cli: Cli, shared_broker: SharedBroker, tmp_path: Path
) -> None:
    cut = cut_outside(cli, shared_broker, tmp_path)
    dest = destination(tmp_path)
    for target, why in [
        ("/", "is the filesystem root"),
        ("/etc", "is a system directory (/etc and everything beneath it)"),
        ("/usr", "is a system directory (/usr and everything beneath it)"),
        ("/boot", "is a system directory (/boot and everything beneath it)"),
        ("/root", "is a directory every user shares"),
        ("/proc", "is kernel or runtime state (/proc and everything beneath it)"),
        ("/sys", "is kernel or runtime state (/sys and everything beneath it)"),
        ("/dev", "is kernel or runtime state (/dev and everything beneath it)"),
        ("/dev/shm", "is kernel or runtime state (/dev and everything beneath it)"),  # noqa: S108
    ]:
        assert_refused(dest, cut, Path(target), "map-forbidden", f"{target} {why}", own=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_map_onto_what_is_not_the_operators_own_is_refused_and_leaves_it_alone(
    cli: Cli, shared_broker: SharedBroker, tmp_path: Path
) -> None:
    cut = cut_outside(cli, shared_broker, tmp_path)
    dest = destination(tmp_path)
    place = tmp_path / "place"

    # Another root, as `cotal up` leaves one: its control directory with a token in it.
    other = place / "other-root"
    write(other / ".cotal" / "auth" / "control.token", "another root's secret\n", 0o600)
    write(other / "work.txt", "another root's tree\n")
    assert_refused(
        dest,
        cut,
        other / ".cotal",
        "map-forbidden",
        f"{other / '.cotal'} is a cotal control directory or inside one",
        own=True,
    )
    assert_refused(
        dest,
        cut,
        other,
        "map-other-root",
        f"{other} is another cotal root (it holds .cotal)",
        own=True,
    )
    (other / "sub").mkdir()
    assert_refused(
        dest,
        cut,
        other / "sub",
        "map-other-root",
        f"{other} is another cotal root (it holds .cotal), and {other / 'sub'} lies beneath it",
        own=True,
    )

    # A symlink as NEW, and one on the way to it.
    real = place / "real"
    write(real / "inside" / "keep.txt", "behind a symlink\n")
    (place / "link").symlink_to(real)
    assert_refused(
        dest, cut, place / "link", "map-symlink", f"{place / 'link'} is a symlink", own=True
    )
    assert_refused(
        dest,
        cut,
        place / "link" / "inside",
        "map-symlink",
        f"{place / 'link'} is a symlink",
        own=True,
    )

    # A directory another uid owns.
    theirs = place / "theirs"
    write(theirs / "their.txt", "someone else's\n")
    os.chown(theirs, OTHER_UID, OTHER_UID)
    assert_refused(
        dest,
        cut,
        theirs,
        "map-not-owned",
        f"{theirs} is owned by uid {OTHER_UID}, not by this operator (uid 0)",
        own=True,
    )

    # A decoy: a tree of its own, even a repository of its own, is never moved aside.
    decoy = place / "decoy"
    init_repo(decoy)
    write(decoy / "README.md", "# a different project\n")
    git(decoy, "add", "README.md")
    git(decoy, "commit", "-qm", "its own history")
    write(decoy / "src" / "app.py", "print('not the seat's')\n")
    assert_refused(
        dest,
        cut,
        decoy,
        "map-occupied",
        f"{decoy} is not empty (.git, README.md, src) and is not the repository the checkpoint "
        "recorded (a git work tree whose history holds the base commit ",
        own=True,
    )
    plain = place / "plain"
    write(plain / "photo.jpg", b"\xff\xd8 not a repository")
    assert_refused(dest, cut, plain, "map-occupied", f"{plain} is not empty (photo.jpg)", own=True)


# -- mount points, in a private mount namespace ----------------------------------------------------

_IN_NAMESPACE = r"""
import json, os, subprocess, sys

spec = json.loads(sys.argv[1])
tmpfs, bind = spec["tmpfs"], spec["bind"]
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "cotal-map", tmpfs], check=True)
subprocess.run(["mount", "--bind", bind, bind], check=True)
with open(os.path.join(tmpfs, "keep.txt"), "w") as f:
    f.write("on a tmpfs\n")
out = []
for target in (tmpfs, bind):
    for command in spec["commands"]:
        argv = [a.replace("@TARGET@", target) for a in command]
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=spec["env"], cwd=spec["cwd"]
        )
        listing = []
        for name in sorted(os.listdir(target)):
            with open(os.path.join(target, name), "rb") as f:
                listing.append([name, f.read().hex()])
        out.append(
            {"target": target, "rc": proc.returncode, "stdout": proc.stdout,
             "stderr": proc.stderr, "listing": listing}
        )
print(json.dumps(out))
"""


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare -m for a private mount")
def test_a_map_onto_a_mount_point_is_refused_and_leaves_it_alone(
    cli: Cli, shared_broker: SharedBroker, tmp_path: Path
) -> None:
    """A tmpfs (another device) and a bind mount of a directory onto itself (the same device,
    seen only in mountinfo), both mounted in a private namespace the CLI runs in."""
    cut = cut_outside(cli, shared_broker, tmp_path)
    dest = destination(tmp_path)
    tmpfs, bind = tmp_path / "mnt-tmpfs", tmp_path / "mnt-bind"
    tmpfs.mkdir()
    write(bind / "keep.txt", "under a bind mount\n")
    before = snapshot(dest.root)
    beside = sorted(os.listdir(tmp_path))
    cli_cmd = [sys.executable, "-m", "manager.cli"]
    spec = {
        "tmpfs": str(tmpfs),
        "bind": str(bind),
        "env": cotal_env(),
        "cwd": str(dest.root),
        "commands": [
            [*cli_cmd, *verify_args(cut, "@TARGET@"), "--root", str(dest.root)],
            [*cli_cmd, *restore_args(cut, "@TARGET@"), "--root", str(dest.root)],
        ],
    }
    proc = subprocess.run(
        ["unshare", "-m", sys.executable, "-c", _IN_NAMESPACE, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=cotal_env(),
    )
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(proc.stdout)
    assert len(runs) == 4
    for run in runs:
        out = refusal_of(
            subprocess.CompletedProcess([], run["rc"], stdout=run["stdout"], stderr=run["stderr"])
        )
        assert out["code"] == "map-mount-point", run
        assert (
            f"--map {cut.outside}={run['target']}: {run['target']} is a mount point"
            in (out["error"])
        )
        expected = "on a tmpfs\n" if run["target"] == str(tmpfs) else "under a bind mount\n"
        assert run["listing"] == [["keep.txt", expected.encode().hex()]], run
    # The namespace is gone with its mounts; the host saw none of it.
    assert os.listdir(tmpfs) == [] and (bind / "keep.txt").read_text() == "under a bind mount\n"
    assert sorted(os.listdir(tmp_path)) == beside
    assert snapshot(dest.root) == before


# -- where a map may land --------------------------------------------------------------------------


def test_a_fresh_directory_of_the_operators_own_is_admitted_and_restored(
    cli: Cli, shared_broker: SharedBroker, tmp_path: Path
) -> None:
    cut = cut_outside(cli, shared_broker, tmp_path)
    dest = destination(tmp_path)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    verified = json.loads(dest.run(*verify_args(cut, fresh)).stdout)
    [seat] = verified["seats"]
    assert seat["relocated"]["cwdAfter"] == str(fresh) and seat["mapLanding"] == "empty"
    assert os.listdir(fresh) == []
    result = json.loads(dest.run(*restore_args(cut, fresh)).stdout)
    [restored] = result["restored"]
    assert restored["cwd"] == str(fresh) and restored["superseded"] is None
    assert porcelain(fresh) == cut.status and tree_digest(fresh) == cut.tree
    assert dest.ps()[0]["cwd"] == str(fresh)
    dest.run("down")


def test_the_same_repository_is_admitted_and_moved_aside(
    cli: Cli, shared_broker: SharedBroker, tmp_path: Path
) -> None:
    cut = cut_outside(cli, shared_broker, tmp_path)
    dest = destination(tmp_path)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(cut.outside), str(clone))
    write(clone / "local-wip.txt", "the operator's own work in the clone\n")
    old = tree_digest(clone)
    verified = json.loads(dest.run(*verify_args(cut, clone)).stdout)
    assert verified["seats"][0]["mapLanding"] == "same-repository"
    text = dest.run(*[a for a in verify_args(cut, clone) if a != "--json"]).stdout
    assert "mapped tree: the same repository, moved aside by the restore" in text
    result = json.loads(dest.run(*restore_args(cut, clone)).stdout)
    [restored] = result["restored"]
    aside = Path(restored["superseded"])
    assert aside.parent == tmp_path and aside.name.startswith("clone.superseded.")
    assert tree_digest(aside) == old
    assert porcelain(clone) == cut.status and tree_digest(clone) == cut.tree
    dest.run("down")


# -- the write checks the same rule ----------------------------------------------------------------


async def test_the_restore_write_checks_the_rule_again(tmp_path: Path) -> None:
    """Admission saw an empty NEW; by the write it holds someone's tree, or NEW is a place no
    map lands: the restore refuses with the same code before writing anything."""
    repo = tmp_path / "src"
    make_workspace(repo)
    seat = seat_dir_for(tmp_path)
    record = await capture_repository(repo, seat)
    root = tmp_path / "root"
    root.mkdir()
    new = tmp_path / "new"
    write(new / "decoy.txt", "arrived after admission\n")
    seen = Observed.take(new, own=True)
    with pytest.raises(Refusal) as err:
        await restore_repository(
            seat,
            record,
            new,
            stamp="20261129T140000Z",
            confine_to=(root, new),
            dest_root=root,
            maps={repo: new},
        )
    assert err.value.code == "map-occupied" and f"{new} is not empty (decoy.txt)" in (
        err.value.message
    )
    seen.assert_untouched()
    with pytest.raises(Refusal) as err:
        await restore_repository(
            seat,
            record,
            Path("/etc/cotal-map-test"),
            stamp="20261129T140000Z",
            confine_to=(root, Path("/etc/cotal-map-test")),
            dest_root=root,
            maps={repo: Path("/etc/cotal-map-test")},
        )
    assert err.value.code == "map-forbidden"
    assert not os.path.lexists("/etc/cotal-map-test")
    assert not os.path.lexists("/etc/cotal-map-test.incoming")
