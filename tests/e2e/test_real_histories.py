"""Real public histories (tests/data/real, issue 42 item 8) cut on one root and resumed on
another at another path, each host with its own broker, the source gone first: h11 and
itsdangerous as cloned, a shallow clone of h11, and itsdangerous checked out sparse, each with
staged, unstaged and untracked work and a stash. The repository comes back identical by the
repository-shape tests' `fingerprint` (status, bytes, refs, HEAD, history, stash, index flags,
the shallow boundary, the sparse patterns) and the seat answers its phrase there."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.test_relocation import _hosts
from tests.e2e.test_repo_shapes_travel import travels_to_another_root
from tests.gitrepo import git, write

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

REAL = Path(__file__).resolve().parent.parent / "data" / "real"
BRANCH = {"h11": "master", "itsdangerous": "main"}


def _work(repo: Path, edit: str, readme: str) -> None:
    """Work in flight on a real tree: a stash, a staged and an unstaged change to one of its
    own files, another tracked file edited, an untracked note."""
    path = repo / edit
    original = path.read_text()
    write(path, original + "# stashed while the cut ran\n")
    git(repo, "stash", "push", "-q", "-m", "kept aside")
    write(path, original + "# staged\n")
    git(repo, "add", edit)
    write(path, original + "# staged\n# and then unstaged\n")
    write(repo / readme, (repo / readme).read_text() + "\nUnstaged note.\n")
    write(repo / "notes" / "todo.txt", "untracked, beside the real tree\n")


def _clone(name: str, into: Path, *extra: str) -> Path:
    git(into.parent, "clone", "-q", *extra, "--branch", BRANCH[name], str(REAL / f"{name}.bundle"),
        into.name)  # fmt: skip
    # Nothing reaches a remote: the bundle's path is not one the destination has.
    git(into, "remote", "remove", "origin")
    return into


def _full(name: str, edit: str, readme: str) -> Callable[[Path, Path], Path]:
    def make(tmp_path: Path, root: Path) -> Path:
        repo = _clone(name, root / "repo")
        _work(repo, edit, readme)
        return repo

    return make


def _shallow(tmp_path: Path, root: Path) -> Path:
    # A shallow clone needs a repository to clone from: the bundle's history, bare, then gone.
    origin = _clone("h11", tmp_path / "h11-origin", "--bare")
    repo = root / "repo"
    git(root, "clone", "-q", "--depth", "20", f"file://{origin}", "repo")
    shutil.rmtree(origin)
    git(repo, "remote", "remove", "origin")
    _work(repo, "h11/_util.py", "README.rst")
    return repo


def _sparse(tmp_path: Path, root: Path) -> Path:
    repo = _clone("itsdangerous", root / "repo")
    git(repo, "sparse-checkout", "set", "--cone", "src", "docs")
    _work(repo, "src/itsdangerous/signer.py", "README.md")
    return repo


SHAPES: dict[str, Callable[[Path, Path], Path]] = {
    "h11": _full("h11", "h11/_util.py", "README.rst"),
    "itsdangerous": _full("itsdangerous", "src/itsdangerous/signer.py", "README.md"),
    "h11-shallow-20": _shallow,
    "itsdangerous-sparse": _sparse,
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
async def test_a_real_history_travels_to_another_root(tmp_path: Path, shape: str) -> None:
    a, dest = _hosts(tmp_path)
    cwd = SHAPES[shape](tmp_path, a.root)
    assert git(cwd, "tag").strip(), "the real history's tags came with the clone"
    travels_to_another_root(tmp_path, a, dest, cwd)
