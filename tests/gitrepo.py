"""Real git repositories in every state a cut must carry, shared by the checkpoint tests."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

AUTH_TOKEN = b"SECRET-AUTH-TOKEN-5c1e0f9a"
DOTENV_TOKEN = b"SECRET-DOTENV-TOKEN-77b2d4"


def git(repo: Path, *args: str, stdin: bytes | None = None, check: bool = True) -> bytes:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ["HOME"],
        "GIT_CONFIG_NOSYSTEM": "1",
        "LC_ALL": "C",
        "GIT_AUTHOR_NAME": "Test",
        "GIT_AUTHOR_EMAIL": "test@example.invalid",
        "GIT_COMMITTER_NAME": "Test",
        "GIT_COMMITTER_EMAIL": "test@example.invalid",
    }
    proc = subprocess.run(
        ["git", *args], cwd=repo, env=env, input=stdin, capture_output=True, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr.decode()}")
    return proc.stdout


def write(path: Path, data: bytes | str, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    if mode is not None:
        os.chmod(path, mode)


def init_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    return path


def committed_repo(path: Path, name: str = "a") -> Path:
    """A repository with one committed file, `<name>.txt`: a seat's cwd a cut can carry."""
    repo = init_repo(path)
    write(repo / f"{name}.txt", f"{name}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", name)
    return repo


def make_rich_repo(path: Path) -> Path:
    """A repository in every state the capture must carry, plus secrets it must not."""
    repo = init_repo(path)
    write(repo / ".gitignore", ".env\n*.log\n.cotal/\n")
    write(repo / "README.md", "# project\nline two\n")
    write(repo / "tracked.txt", "alpha\nbeta\ngamma\n")
    write(repo / "bin.dat", bytes(range(256)) * 4)
    write(repo / "gone_staged.txt", "delete me in the index\n")
    write(repo / "gone_unstaged.txt", "delete me in the worktree\n")
    write(repo / "old_name.txt", "renamed content\n" * 20)
    write(repo / "script.sh", "#!/bin/sh\necho hi\n", 0o644)
    write(repo / "typechange.txt", "becomes a symlink\n")
    write(repo / "dir/nested.txt", "nested\n")
    os.symlink("README.md", repo / "link")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    git(repo, "tag", "v1")
    git(repo, "tag", "-a", "v1-annotated", "-m", "annotated")
    git(repo, "branch", "feature")
    # A stash: refs/stash is in the bundle but a clone of it drops the ref (peers.md 6).
    write(repo / "tracked.txt", "stashed change\n")
    git(repo, "stash", "push", "-q", "-m", "work in progress")
    write(repo / "README.md", "# project\nline two\nstaged line\n")
    git(repo, "add", "README.md")
    write(repo / "README.md", "# project\nline two\nstaged line\nunstaged line\n")
    write(repo / "tracked.txt", "alpha\nbeta changed\ngamma\n")
    write(repo / "bin.dat", bytes(reversed(range(256))) * 4)
    git(repo, "add", "bin.dat")
    write(repo / "bin.dat", b"\x00\xff" * 700)
    write(repo / "new.bin", b"\x00\x01\x02binary\xfe" * 50)
    git(repo, "add", "new.bin")
    write(repo / "new.bin", b"\x00\x01\x02changed\xfe" * 50)
    git(repo, "rm", "-q", "gone_staged.txt")
    (repo / "gone_unstaged.txt").unlink()
    git(repo, "mv", "old_name.txt", "new_name.txt")
    os.chmod(repo / "script.sh", 0o755)
    (repo / "typechange.txt").unlink()
    os.symlink("tracked.txt", repo / "typechange.txt")
    os.symlink("dir/nested.txt", repo / "staged_link")
    git(repo, "add", "staged_link")
    write(repo / "ita.txt", "intent to add\n")
    git(repo, "add", "-N", "ita.txt")
    write(repo / "ita_gone.txt", "intent to add, then deleted\n")
    git(repo, "add", "-N", "ita_gone.txt")
    (repo / "ita_gone.txt").unlink()
    write(repo / "untracked.txt", "untracked text\n")
    write(repo / "udir/deep/u.bin", b"\x00untracked\xff" * 30)
    write(repo / "uexec.sh", "#!/bin/sh\n", 0o755)
    write(repo / "name with spaces ü.txt", "unicode name\n")
    os.symlink("untracked.txt", repo / "ulink")
    os.symlink("nowhere/at/all", repo / "udangling")
    write(repo / ".env", b"API_KEY=" + DOTENV_TOKEN + b"\n")
    write(repo / "build.log", "ignored log\n")
    write(repo / ".cotal/auth/broker.creds", AUTH_TOKEN + b"\n")
    return repo


def tree_digest(
    root: Path, *, skip: tuple[str, ...] = (".git", ".cotal"), times: bool = False
) -> dict[str, tuple[object, ...]]:
    """Every entry below `root` with its type, mode and content digest (or link target)."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in skip]
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if rel_dir == "." and name in skip:
                continue
            st = os.lstat(path)
            extra: tuple[object, ...] = (st.st_ino, st.st_mtime_ns) if times else ()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path), *extra)
            elif stat.S_ISDIR(st.st_mode):
                if times:
                    out[rel] = ("dir", stat.S_IMODE(st.st_mode), *extra)
            else:
                out[rel] = (
                    "file",
                    stat.S_IMODE(st.st_mode),
                    hashlib.sha256(path.read_bytes()).hexdigest(),
                    *extra,
                )
    return out


def full_digest(root: Path) -> dict[str, tuple[object, ...]]:
    """Byte-for-byte including .git, inodes and mtimes: proves a path was not touched at all."""
    return tree_digest(root, skip=(), times=True) if root.exists() else {}


def seat_dir_for(tmp_path: Path, name: str = "default") -> Path:
    seat = tmp_path / "ckpt" / name
    seat.mkdir(parents=True, mode=0o700)
    return seat


REMOTE_TOKEN = b"SECRET-REMOTE-TOKEN-3f9a21"


def make_fidelity_repo(path: Path) -> Path:
    """A committed repository whose .git holds what a checkpoint carries and what it must not:
    a remote URL with a token, an extra auth header, hooks (one not executable), a sample,
    info/exclude, a `credentials` file and a stale lock."""
    repo = init_repo(path)
    write(repo / ".gitignore", ".env\n*.log\nconfig/*.local\n.cotal/\n")
    write(repo / "README.md", "# fidelity\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    token = REMOTE_TOKEN.decode()
    git(repo, "remote", "add", "origin", f"https://alice:{token}@example.invalid/team/r.git")
    git(repo, "remote", "add", "upstream", "https://example.invalid/up/r.git")
    git(repo, "config", "branch.main.remote", "origin")
    git(repo, "config", "branch.main.merge", "refs/heads/main")
    git(repo, "config", "http.https://example.invalid/.extraheader", f"Authorization: {token}")
    git(repo, "config", "core.filemode", "true")
    hooks = repo / ".git" / "hooks"
    write(hooks / "pre-commit", "#!/bin/sh\nexit 0\n", 0o755)
    write(hooks / "post-checkout", "#!/bin/sh\n# not executable on purpose\n", 0o640)
    write(hooks / "pre-push.sample", "#!/bin/sh\n", 0o755)
    write(repo / ".git" / "info" / "exclude", "# local\nscratch/\n")
    write(repo / ".git" / "credentials", REMOTE_TOKEN + b"\n", 0o600)
    write(repo / ".git" / "stale.lock", b"lock\n")
    return repo


def stash_list(repo: Path) -> bytes:
    return git(repo, "stash", "list")


def git_config_list(repo: Path) -> list[str]:
    return git(repo, "config", "--local", "--list").decode().splitlines()
