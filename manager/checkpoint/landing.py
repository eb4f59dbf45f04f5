"""Where a `--map OLD=NEW` may land on this host: one rule, checked by the identity gate while
nothing has changed yet and again by the restore right before it writes a tree there.

A map puts a checkpoint's tree at a place the operator names, and the restore moves whatever
tree is there aside to make room. So NEW must be a directory the operator keeps for this work,
and the tree beneath it a place nothing else lives in:

* never `/`; never `/proc`, `/sys`, `/dev` (so never `/dev/shm`) or `/run`, nor anything beneath
  them, not even beneath this root; never `/usr`, `/etc`, `/bin`, `/sbin`, `/lib*`, `/boot`,
  `/efi`, `/var` (so `/var/tmp`), `/snap` or `/nix`, nor anything beneath them, unless NEW lies
  in this destination root; never `/home`, `/opt`, `/srv`, `/tmp`, `/mnt`, `/media`, `/root` or
  the operator's home directory itself (a directory beneath them may be the operator's);
* never a `.cotal` or a `.git` directory or anything beneath one, and never a directory that
  holds this destination root;
* no symlink anywhere on the path (each component is `lstat`ed from `/`), and each component
  a directory;
* never a mount point: NEW and every directory from it down to the tree, this root excepted,
  must be on its parent's device and absent from `/proc/self/mountinfo`;
* never another cotal root: no directory from `/` down to the tree holds a `.cotal` but this
  destination root (a tree beneath this root is checked only below it), and a tree the restore
  would move aside holds none;
* owned by the operator (`st_uid == euid`) where it exists, from NEW down to the tree;
* the tree itself (the seat's cwd at or beneath NEW) is missing or empty (the restore fills it
  in place), or the same repository (moved aside): a git work tree, its `.git` a directory the
  operator owns, whose history (HEAD or any ref) holds the recorded base commit. Anything else
  refuses `map-occupied` instead of being moved aside.

A missing NEW is fine only beneath this root (the restore creates it there). Every refusal
names the map, what is wrong with it and the cure.
"""

from __future__ import annotations

import errno
import os
import pwd
import re
import stat
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from manager.checkpoint.confine import lexical
from manager.checkpoint.gitstate import GIT, SAFE_CONFIG, git_env
from protocol.checkpoint import CONTROL_DIR
from protocol.errors import Refusal
from protocol.refusals import Code

Landing = Literal["absent", "empty", "present", "same-repository"]

# Kernel and runtime state: no map lands there, whatever the destination root is.
KERNEL_TREES = tuple(Path(p) for p in ("/proc", "/sys", "/dev", "/run"))
# The system's own trees, everything beneath them included, unless NEW lies in this root.
SYSTEM_TREES = tuple(
    Path(p) for p in ("/usr", "/etc", "/bin", "/sbin", "/boot", "/efi", "/var", "/snap", "/nix")
)
SYSTEM_TREE_RE = re.compile(r"lib[a-z0-9_]*")
# Parents every user shares: the directory itself never, one beneath it may be the operator's.
SHARED_DIRS = tuple(
    Path(p)
    for p in ("/home", "/opt", "/srv", "/tmp", "/mnt", "/media", "/root")  # noqa: S108
)
GIT_TIMEOUT_S = 60.0
_TOP = Path("/")


def _map(old: Path, new: Path) -> str:
    return f"--map {old}={new}"


def _cure_elsewhere(old: Path, root: Path) -> str:
    return (
        f"map {old} onto a directory you keep for this work: an empty or missing one under your "
        f"home directory, under /srv or /opt, or under this root ({root})"
    )


def operator_home() -> Path | None:
    try:
        return lexical(pwd.getpwuid(os.geteuid()).pw_dir)
    except KeyError:
        return None


def _forbidden(new: Path, root: Path) -> str | None:
    """What makes NEW itself no place for a map, read from its spelling alone."""
    parts = new.parts
    for i, part in enumerate(parts[1:], start=1):
        folded = part.casefold()
        if folded == ".git":
            return f"inside the .git directory {Path(*parts[: i + 1])} (hooks and config run there)"
        if folded == CONTROL_DIR:
            return f"a cotal control directory or inside one ({Path(*parts[: i + 1])})"
    if new == _TOP:
        return "the filesystem root"
    for tree in KERNEL_TREES:
        if new.is_relative_to(tree):
            return f"kernel or runtime state ({tree} and everything beneath it)"
    if not new.is_relative_to(root):
        top = _TOP / parts[1]
        if top in SYSTEM_TREES or SYSTEM_TREE_RE.fullmatch(parts[1]):
            return f"a system directory ({top} and everything beneath it)"
    if new in SHARED_DIRS:
        return "a directory every user shares (a directory beneath it may be yours; it is not)"
    if new == operator_home():
        return "your home directory itself (the restore would move it aside)"
    if root.is_relative_to(new) and root != new:
        return f"a directory that holds this destination root {root}"
    return None


def _below_problem(rel: tuple[str, ...]) -> str | None:
    for part in rel:
        if part.casefold() in (".git", CONTROL_DIR):
            return f"inside a {part} directory"
    return None


def mount_points() -> set[str]:
    """Every mount point this process sees (field 5 of mountinfo, octal escapes undone)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return set()
    return {
        re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split(" ")[4])
        for line in lines
        if len(line.split(" ")) > 4
    }


def _holds_control(path: Path) -> bool:
    try:
        os.lstat(path / CONTROL_DIR)
    except FileNotFoundError:
        return False
    except OSError:
        # Unreadable: it may hold one, and a map is not the place to find out.
        return True
    return True


def _unreadable(old: Path, new: Path, path: Path, exc: OSError) -> Refusal:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return Refusal(
            Code.MAP_NOT_OWNED,
            f"{_map(old, new)}: {path} cannot be examined by this operator ({exc.strerror})",
            f"map {old} onto a directory you own and can read",
        )
    return Refusal(
        Code.BAD_MAP,
        f"{_map(old, new)}: {path} cannot be examined ({exc.strerror})",
        f"map {old} onto a directory that exists here, or one under the destination root",
    )


def check_map_target(
    old: Path,
    new: Path,
    *,
    dest_root: Path,
    tree: Path | None = None,
    base: str | None = None,
    store: bool = False,
) -> Landing:
    """The rule for `--map OLD=NEW` (see the module's docstring), and for `tree`, the seat's
    tree at or beneath NEW that the restore would write (or with `store`, a directory a session
    file lands in, which may hold files already). Returns what is there: `absent`, `empty`,
    `present` (NEW, or a store directory) or `same-repository` (a tree the restore moves aside).
    """
    root = lexical(dest_root)
    new = lexical(new)
    path = lexical(tree) if tree is not None else new
    if not path.is_relative_to(new):
        raise ValueError(f"{path} is not at or beneath {new}")
    _check_place(old, new, path, root=root, store=store)
    if not _walk_to(old, new, path, root=root):
        return "absent"
    if tree is None or store:
        return "present"
    return _occupancy(old, new, path, root=root, base=base)


def _check_place(old: Path, new: Path, path: Path, *, root: Path, store: bool) -> None:
    """Refuse, by the names alone, a NEW no map may land on and a `path` beneath it that is
    inside a control or .git directory."""
    where = _map(old, new)
    problem = _forbidden(new, root)
    if problem is not None:
        raise Refusal(
            Code.MAP_FORBIDDEN, f"{where}: {new} is {problem}", _cure_elsewhere(old, root)
        )
    # The seat's own session store in this root's control directory is confined by
    # `confine.seat_paths`; any other control or .git directory beneath NEW is no place to land.
    if path != new and not (store and path.is_relative_to(root / CONTROL_DIR)):
        problem = _below_problem(path.relative_to(new).parts)
        if problem is not None:
            what = "a session file's directory" if store else "the seat's tree"
            raise Refusal(
                Code.MAP_FORBIDDEN,
                f"{where}: {what} {path} is {problem}",
                _cure_elsewhere(old, root),
            )


def _walk_to(old: Path, new: Path, path: Path, *, root: Path) -> bool:
    """Walk from / to `path` without following a symlink, judging each directory on the way;
    False when the walk meets a missing directory it may create."""
    where = _map(old, new)
    euid = os.geteuid()
    mounts: set[str] | None = None
    in_root = new.is_relative_to(root)
    parent = os.lstat(_TOP)
    cur = _TOP
    for part in path.parts[1:]:
        cur = cur / part
        st = _lstat_step(old, new, cur, root=root, in_root=in_root)
        if st is None:
            return False
        below = cur.is_relative_to(new)
        _check_owner(old, new, path, cur, st, root=root, in_root=in_root, euid=euid)
        if below and cur != root:
            if mounts is None:
                mounts = mount_points()
            if st.st_dev != parent.st_dev or str(cur) in mounts:
                raise Refusal(
                    Code.MAP_MOUNT_POINT,
                    f"{where}: {cur} is a mount point of this host; a restore would stage and "
                    "move aside across it",
                    f"map {old} onto a directory inside the mount instead, e.g. {cur / old.name}",
                )
        parent = st
    return True


def _lstat_step(
    old: Path, new: Path, cur: Path, *, root: Path, in_root: bool
) -> os.stat_result | None:
    """One directory on the walk: its lstat, or None when it is missing and may be created;
    a symlink or a non-directory refuses."""
    where = _map(old, new)
    try:
        st = os.lstat(cur)
    except FileNotFoundError:
        if not cur.is_relative_to(new) or cur == new:
            if not in_root:
                raise Refusal(
                    Code.BAD_MAP,
                    f"{where}: {new} is missing and not under the destination root {root}",
                    f"create {new} first (an empty directory you own), or map {old} under {root}",
                ) from None
        return None
    except OSError as exc:
        raise _unreadable(old, new, cur, exc) from None
    if stat.S_ISLNK(st.st_mode):
        raise Refusal(
            Code.MAP_SYMLINK,
            f"{where}: {cur} is a symlink; no map is followed through one",
            f"pass the directory it points to ({os.path.realpath(cur)}) as NEW, which is "
            "then checked itself, or replace the symlink with a directory",
        )
    if not stat.S_ISDIR(st.st_mode):
        raise Refusal(
            Code.BAD_MAP,
            f"{where}: {cur} is not a directory",
            f"map {old} onto a directory, or move {cur} aside",
        )
    return st


def _check_owner(
    old: Path,
    new: Path,
    path: Path,
    cur: Path,
    st: os.stat_result,
    *,
    root: Path,
    in_root: bool,
    euid: int,
) -> None:
    """Refuse a directory on the walk that is another root's, or one at or beneath NEW that
    this operator does not own."""
    where = _map(old, new)
    below = cur.is_relative_to(new)
    # A tree beneath this root is the root's own: only roots nested inside it are others'.
    judged = cur != root and (not in_root or cur.is_relative_to(root))
    if judged and _holds_control(cur):
        raise Refusal(
            Code.MAP_OTHER_ROOT,
            f"{where}: {cur} is another cotal root (it holds {CONTROL_DIR})"
            + (f", and {path} lies beneath it" if cur != path else ""),
            "another root's tree and secrets are its own: " + _cure_elsewhere(old, root),
        )
    if below and st.st_uid != euid:
        raise Refusal(
            Code.MAP_NOT_OWNED,
            f"{where}: {cur} is owned by uid {st.st_uid}, not by this operator (uid {euid})",
            f"map {old} onto a directory you own, or `chown` {cur} to uid {euid} if it is "
            "yours for this work",
        )


def _occupancy(old: Path, new: Path, tree: Path, *, root: Path, base: str | None) -> Landing:
    where = _map(old, new)
    try:
        entries = [n for n in os.listdir(tree) if not (tree == root and n == CONTROL_DIR)]
    except OSError as exc:
        raise _unreadable(old, new, tree, exc) from None
    if not entries:
        return "empty"
    if base is None or not same_repository(tree, base):
        shown = ", ".join(sorted(entries)[:5]) + (", …" if len(entries) > 5 else "")
        raise Refusal(
            Code.MAP_OCCUPIED,
            f"{where}: {tree} is not empty ({shown}) and is not the repository the checkpoint "
            f"recorded (a git work tree whose history holds the base commit {base}); a restore "
            "replaces only its own repository, never moves another tree aside",
            f"map {old} onto an empty or missing directory, or move what is in {tree} aside "
            "yourself, then retry",
        )
    nested = _nested_root(tree, root)
    if nested is not None:
        raise Refusal(
            Code.MAP_OTHER_ROOT,
            f"{where}: {tree} holds another cotal root ({nested}), which the restore would move "
            "aside with the tree",
            f"move {nested.parent} out of {tree} first, or map {old} onto an empty directory",
        )
    return "same-repository"


def _nested_root(tree: Path, root: Path) -> Path | None:
    """A `.cotal` anywhere beneath `tree` (its `.git` directories aside), never following a
    symlink; this root's own control directory is not another root's."""
    pending = [tree]
    while pending:
        here = pending.pop()
        try:
            with os.scandir(here) as entries:
                for entry in entries:
                    if entry.name == CONTROL_DIR and here != root:
                        return Path(entry.path)
                    if entry.name != ".git" and entry.is_dir(follow_symlinks=False):
                        pending.append(Path(entry.path))
        except OSError:
            # A directory that cannot be read may hold anything: name it as if it held a root.
            return here / CONTROL_DIR
    return None


def same_repository(tree: Path, base: str) -> bool:
    """Whether `tree` is a git work tree whose HEAD or any ref has `base` in its history.

    git runs on the `.git` directory only (no discovery above it), with hooks and fsmonitor
    off: nothing there runs a program.
    """
    gitdir = tree / ".git"
    try:
        st = os.lstat(gitdir)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return False

    def git(*args: str) -> subprocess.CompletedProcess[bytes] | None:
        try:
            return subprocess.run(
                [GIT, *SAFE_CONFIG, f"--git-dir={gitdir}", *args],
                cwd=tree,
                env=git_env({"GIT_CEILING_DIRECTORIES": str(tree.parent)}),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=GIT_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None

    found = git("cat-file", "-e", f"{base}^{{commit}}")
    if found is None or found.returncode != 0:
        return False
    on_head = git("merge-base", "--is-ancestor", base, "HEAD")
    if on_head is not None and on_head.returncode == 0:
        return True
    refs = git("for-each-ref", "--count=1", f"--contains={base}", "--format=%(refname)")
    return refs is not None and refs.returncode == 0 and bool(refs.stdout.strip())


def governing(path: Path, maps: Mapping[Path, Path]) -> tuple[Path, Path] | None:
    """The operator's pair whose NEW holds `path` most closely, or None (the root's own)."""
    path = lexical(path)
    best: tuple[Path, Path] | None = None
    for old, new in maps.items():
        new = lexical(new)
        if path.is_relative_to(new) and (best is None or len(new.parts) > len(best[1].parts)):
            best = (old, new)
    return best


def check_tree(
    tree: Path, maps: Mapping[Path, Path], *, dest_root: Path, base: str | None
) -> Landing | None:
    """The rule for a seat's tree that a `--map` places (None when no map holds it: the root's
    own tree): what admission checks per seat and the restore checks again at the write."""
    pair = governing(tree, maps)
    if pair is None:
        return None
    return check_map_target(pair[0], pair[1], dest_root=dest_root, tree=tree, base=base)


def check_store(directory: Path, maps: Mapping[Path, Path], *, dest_root: Path) -> None:
    """The rule for a directory a session file lands in, when a `--map` places it."""
    pair = governing(directory, maps)
    if pair is not None:
        check_map_target(pair[0], pair[1], dest_root=dest_root, tree=directory, store=True)
