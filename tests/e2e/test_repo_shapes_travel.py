"""A shallow clone, a sparse checkout, a superproject with nested submodules, a linked worktree,
a repository that uses Git LFS, the shapes combined (a sparse linked worktree with a submodule
checked out), an unborn branch and a linked worktree of a bare repository with local edits git
does not look at (assume-unchanged, skip-worktree) cut on one root and resumed on another (issue
42): each host runs its own embedded broker, the source's tree and broker are gone before the
destination starts, the destination's root is at another path, and nothing reaches a remote. The
repository comes back identical by `fingerprint` (status, bytes, refs, history, stash, index
flags, the shallow boundary, the sparse patterns and config, the LFS objects the checkout and
the stash point at; for submodules, `git submodule status --recursive` and each submodule's
own; a linked worktree as a repository of its own) and the seat answers its phrase there. The
LFS repository's server is a closed port: every object comes from the checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Cli
from tests.e2e.test_move import two_roots  # noqa: F401  (the fixture)
from tests.e2e.test_relocation import _carry, _hosts, _restore, _spawn_and_cut
from tests.e2e.test_resume import PHRASE
from tests.helpers import signer_key
from tests.integration.test_repo_shapes import (
    bare_worktree_with_unwatched,
    combined_fingerprint,
    fingerprint,
    fingerprint_unborn,
    lfs_checkout,
    linked_worktree,
    shallow_clone,
    sparse_checkout,
    sparse_worktree_with_submodule,
    submodule_fingerprint,
    unborn_repo,
    with_submodules,
)

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]


def _shallow(depth: int) -> Callable[[Path, Path], Path]:
    def make(tmp_path: Path, root: Path) -> Path:
        repo = shallow_clone(tmp_path / f"made-{depth}", depth)
        repo.rename(root / "repo")
        return root / "repo"

    return make


def _sparse(mode: str) -> Callable[[Path, Path], Path]:
    def make(tmp_path: Path, root: Path) -> Path:
        return sparse_checkout(root / "repo", mode)

    return make


def _submodules(tmp_path: Path, root: Path) -> Path:
    # The submodules' origins are deleted before the cut: nothing can reach them.
    return with_submodules(root / "repo", tmp_path / "origins")


def _linked_worktree(tmp_path: Path, root: Path) -> Path:
    # The main checkout and the other worktree are under the source root too: gone before the
    # destination starts, the worktree comes back as a repository of its own.
    _main, seat, _other = linked_worktree(root, seat="repo")
    return seat


def _combined(tmp_path: Path, root: Path) -> Path:
    # A sparse linked worktree with its submodule checked out; the main checkout is under the
    # source root, gone before the destination starts, and the submodule's origin is deleted.
    return sparse_worktree_with_submodule(root, tmp_path / "origins", seat="repo")


def _lfs(tmp_path: Path, root: Path) -> Path:
    # Its LFS server is a closed port: the destination must find every object in the checkpoint.
    return lfs_checkout(root / "repo")


def _unborn(tmp_path: Path, root: Path) -> Path:
    return unborn_repo(root / "repo")


def _bare_worktree(tmp_path: Path, root: Path) -> Path:
    # The bare repository is under the source root: gone before the destination starts.
    return bare_worktree_with_unwatched(root, root / "repo")


SHAPES: dict[str, Callable[[Path, Path], Path]] = {
    "shallow-depth-1": _shallow(1),
    "shallow-depth-3": _shallow(3),
    "sparse-cone": _sparse("cone"),
    "sparse-no-cone": _sparse("no-cone"),
    "submodules": _submodules,
    "linked-worktree": _linked_worktree,
    "lfs": _lfs,
    "sparse-worktree-submodule": _combined,
    "unborn": _unborn,
    "bare-worktree-unwatched": _bare_worktree,
}
# A shape whose fingerprint reaches further than the repository's own.
PRINTS: dict[str, Callable[[Path], dict[str, object]]] = {
    "submodules": submodule_fingerprint,
    "sparse-worktree-submodule": combined_fingerprint,
    "unborn": fingerprint_unborn,
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
async def test_the_repository_shape_travels_to_another_root(tmp_path: Path, shape: str) -> None:
    a, dest = _hosts(tmp_path)
    cwd = SHAPES[shape](tmp_path, a.root)
    travels_to_another_root(tmp_path, a, dest, cwd, PRINTS.get(shape, fingerprint))


def travels_to_another_root(
    tmp_path: Path,
    a: Cli,
    dest: Cli,
    cwd: Path,
    print_of: Callable[[Path], dict[str, object]] = fingerprint,
) -> None:
    """The seat in `cwd` cut at `a`, carried to `dest` (another root at another path; `a` gone)
    and resumed there: the same session, the tree the same by `print_of`, its phrase answered."""
    before = print_of(cwd)
    row, attempt_dir = _spawn_and_cut(a, None, cwd)
    copy = _carry(a, dest, attempt_dir, tmp_path)
    assert not a.root.exists()

    result = _restore(dest, copy, None)
    [seat] = result["seats"]
    new_cwd = dest.root / "repo"
    assert seat["relocated"] == {"cwdBefore": str(cwd.resolve()), "cwdAfter": str(new_cwd)}
    assert seat["continuity"] == "exact" and seat["sessionAfter"] == row["sessionId"]
    assert print_of(new_cwd) == before
    assert (
        dest.json("send", "default", "What was the phrase?", "--wait")["reply"]
        == f"The phrase is {PHRASE}."
    )
    dest.run("down")


@pytest.mark.parametrize("shape", ["shallow-depth-3", "sparse-cone", "unborn"])
async def test_the_repository_shape_travels_with_cotal_move(
    tmp_path: Path,
    two_roots: tuple[Cli, Cli],  # noqa: F811
    shape: str,
) -> None:
    """A move pre-copies the history first: a sparse seat's cut builds on it, a shallow seat's
    carries its full (shallow) history again, an unborn branch's ships none (its cut builds on
    nothing), and each lands in the shape it left."""
    a, b = two_roots
    repo = SHAPES[shape](tmp_path, a.root)
    print_of = PRINTS.get(shape, fingerprint)
    before = print_of(repo)
    seat = a.json(
        "spawn", "shaped", "--agent", "scribe", "--cwd", str(repo),
        "--prompt", f"Remember the phrase {PHRASE}. Reply with it.",
    )  # fmt: skip
    stay_b = b.json("spawn", "stay_b", "--agent", "scribe")
    b.run("trust", "add", signer_key(a.root), "--name", "host-a")
    moved = a.json("move", "shaped", "--to", stay_b["instanceId"])
    [row] = moved["seats"]
    assert row["name"] == "shaped"
    at_b = {r["name"]: r for r in b.ps()}
    assert at_b["shaped"]["lifecycleUid"] == seat["lifecycleUid"]
    assert print_of(Path(at_b["shaped"]["cwd"])) == before
    reply = b.json("send", "shaped", "What was the phrase?", "--wait")
    assert reply["reply"] == f"The phrase is {PHRASE}.", reply
