"""Incremental cuts: the predecessor a cut builds on, and the chain a destination restores.

A cut given `--since ATTEMPT` reads that attempt from this root's checkpoint directory, proven
sealed by a signer this root trusts. For each seat the predecessor also holds, the commits it
recorded (every ref's tip, every stash entry, its base) that still exist in the seat's
repository become the bundle's prerequisites: what the destination already has is not carried
again. The link is written into the seat's record (`RepositoryRecord.since`) with the digest of
the predecessor's `checkpoint.json`, so the successor's signature fixes the whole chain.

A destination resolves the chain backwards, one predecessor at a time: beside the attempt
directory it was given (a sibling named by the attempt id), else in its own checkpoint and
incoming directories. Each link is proven before it is used: a sealed manifest by a trusted
signer, the seat's record the one the successor pinned, its bundle of the recorded digest. A
predecessor that is not there refuses `predecessor-missing` naming the attempt and the seat; one
whose bytes differ refuses `integrity`. The restore then unbundles the chain oldest first.

See docs/design.md ("Incremental cuts") and docs/operations.md ("Incremental cuts").
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import stat
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio.to_thread

from manager.checkpoint.gitstate import run_git, settle_stat_data
from manager.checkpoint.reader import read_manifest, read_sealed_seat, verify_file
from manager.workspace import trust
from manager.workspace.layout import Layout
from manager.workspace.private import read_stable
from protocol.checkpoint import (
    MANIFEST_FILE,
    MAX_CHAIN,
    MAX_PREREQUISITES,
    FileRef,
    IncrementalLink,
    PrecopyLink,
    RepositoryRecord,
    parse_refs_list,
)
from protocol.errors import Refusal
from protocol.names import check_attempt_id
from protocol.refusals import Code

CURE_CUT_FULL = "or cut again without --since to carry the whole history"


def search_dirs(layout: Layout) -> tuple[Path, ...]:
    """Where a destination also looks for a predecessor or a pre-copied bundle, after the
    attempt's own siblings."""
    return (layout.checkpoints, layout.incoming, layout.precopy)


PRECOPY_LABEL = "pre-copy"


def precopy_file(sha256: str) -> str:
    return f"{sha256}.bundle"


def precopy_seed(sha256: str) -> str:
    return f"{sha256}.seed"


# A pre-copied history whose move never finished (taken back, or its coordinator died and was
# never rerun) is dropped after this long; a move takes seconds to minutes.
PRECOPY_KEEP_S = 24 * 3600.0


def sweep_precopies(store: Path) -> None:
    horizon = time.time() - PRECOPY_KEEP_S
    for entry in os.scandir(store):
        try:
            if entry.stat(follow_symlinks=False).st_mtime >= horizon:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        except FileNotFoundError:
            continue


# -- the source side ----------------------------------------------------------------------------


def _since_refusal(attempt_id: str, exc: Refusal) -> Refusal:
    return Refusal(
        exc.code,
        f"--since {attempt_id}: {exc.message}",
        f"{exc.cure}; {CURE_CUT_FULL}" if exc.cure else CURE_CUT_FULL,
    )


def predecessor_dir(layout: Layout, attempt_id: str) -> Path:
    try:
        check_attempt_id(attempt_id)
    except (Refusal, ValueError):
        raise Refusal(
            Code.BAD_ARGS,
            f"--since {attempt_id!r} is not an attempt id",
            "name an attempt `cotal checkpoint list` shows as sealed",
        ) from None
    path = layout.checkpoints / attempt_id
    if not (path / MANIFEST_FILE).is_file():
        raise Refusal(
            Code.SINCE_UNKNOWN,
            f"--since {attempt_id}: there is no sealed attempt at {path}",
            f"name an attempt `cotal checkpoint list` shows as sealed, {CURE_CUT_FULL}",
        )
    return path


def check_predecessor(layout: Layout, attempt_id: str) -> list[str]:
    """The coordinator's proof before it fences anything: the attempt is sealed here by a
    signer this root trusts, and every seat's record and bundle are intact. Returns its seats."""
    path = predecessor_dir(layout, attempt_id)
    try:
        space = read_manifest(path, trusted_keys=None).space
        trusted = trust.trusted_keys_for(layout, space, [])
        manifest = read_manifest(path, trusted_keys=trusted)
        for seat in manifest.seats:
            got = read_sealed_seat(path, seat.name, trusted_keys=trusted)
            assert got is not None  # the manifest names it
            repo = got[1].repository
            for ref in (repo.bundle, repo.refs):
                if ref is not None:
                    verify_file(path / seat.dir, ref)
    except Refusal as exc:
        raise _since_refusal(attempt_id, exc) from None
    return [seat.name for seat in manifest.seats]


def _recorded_refs(seat_dir: Path, repo: RepositoryRecord) -> dict[str, str]:
    if repo.refs is None:
        return {}
    data = read_stable(seat_dir / repo.refs.file, cap=max(repo.refs.bytes, 1), what="refs list")
    if hashlib.sha256(data.data).hexdigest() != repo.refs.sha256:
        raise Refusal(
            Code.INTEGRITY,
            f"checkpoint integrity: {seat_dir / repo.refs.file} is not the refs list its record "
            "names",
            "the predecessor was altered after it was sealed",
        )
    try:
        return parse_refs_list(data.data)
    except ValueError as exc:
        raise Refusal(
            Code.INTEGRITY, f"checkpoint integrity: {seat_dir / repo.refs.file}: {exc}", ""
        ) from None


async def _commits_here(cwd: Path, candidates: Sequence[str]) -> list[str]:
    """The commits `candidates` peel to that this repository holds, first mention kept."""
    if not candidates:
        return []
    out = await run_git(
        cwd,
        "cat-file",
        "--batch-check=%(objectname) %(objecttype)",
        stdin="".join(f"{oid}^{{commit}}\n" for oid in candidates).encode(),
    )
    found: dict[str, None] = {}
    for line in out.stdout.decode("utf-8", "replace").splitlines():
        oid, _, kind = line.partition(" ")
        if kind == "commit":
            found[oid] = None
    return list(found)


async def link_for(
    layout: Layout,
    attempt_id: str,
    seat: str,
    cwd: Path,
    *,
    space: str,
    path: Path | None = None,
) -> IncrementalLink | None:
    """The link an incremental capture of `seat` records, or None for a full bundle: the
    predecessor does not hold the seat, or none of its commits exist in this repository.
    `path` is the predecessor's directory when it is not one of this root's cuts (a standing
    checkpoint's base, manager/daemon/standing.py)."""
    path = path if path is not None else predecessor_dir(layout, attempt_id)
    trusted = trust.trusted_keys_for(layout, space, [])
    try:
        got = await anyio.to_thread.run_sync(
            lambda: read_sealed_seat(path, seat, trusted_keys=trusted)
        )
        if got is None:
            return None
        manifest, record, digest = got
        if manifest.attempt_id != attempt_id or manifest.space != space:
            raise Refusal(
                Code.CHAIN_BROKEN,
                f"{path} holds attempt {manifest.attempt_id} of space {manifest.space}, not "
                f"{attempt_id} of {space}",
                "name an attempt this root cut in this space",
            )
        repo = record.repository
        recorded = await anyio.to_thread.run_sync(_recorded_refs, path / seat, repo)
    except Refusal as exc:
        raise _since_refusal(attempt_id, exc) from None
    candidates = [*([repo.base] if repo.base else []), *recorded.values()]
    candidates += [entry.oid for entry in repo.stash]
    present = await _commits_here(cwd, list(dict.fromkeys(candidates)))
    if not present:
        return None
    return IncrementalLink(
        attempt_id=attempt_id,
        checkpoint_sha256=digest,
        bundle_sha256=repo.bundle.sha256 if repo.bundle is not None else None,
        prerequisites=present[:MAX_PREREQUISITES],
    )


async def precopy_link(cwd: Path, shipped: PrecopyLink) -> PrecopyLink | None:
    """The pre-copy link a capture records: the shipped bundle's tips this repository still
    holds (a reset may have dropped some), or None for a full bundle when it holds none."""
    present = await _commits_here(cwd, shipped.prerequisites)
    if not present:
        return None
    return PrecopyLink(
        bundle_sha256=shipped.bundle_sha256,
        bundle_bytes=shipped.bundle_bytes,
        prerequisites=present[:MAX_PREREQUISITES],
    )


_PACK_NAME = re.compile(r"pack-[0-9a-f]{40,64}\.(pack|idx|rev)")


async def grow_seed(bundle: Path, growing: Path, *, cure: str) -> None:
    """A seed repository at `growing` (a path that does not exist yet) from a pre-copied
    bundle: its history unbundled and indexed once, and its HEAD checked out with stat data
    older than the index, so a restore that takes the seed as its staging tree writes only what
    changed since and hashes nothing it did not write (`take_seed`)."""
    await run_git(growing.parent, "init", "--quiet", "--template=", str(growing), cure=cure)
    listed = await run_git(
        growing, "bundle", "unbundle", str(bundle), code=Code.INTEGRITY, cure=cure, background=True
    )
    # bundle_heads leaves the symbolic HEAD out; here it is the one line wanted.
    head = next(
        (
            oid
            for oid, _, name in (
                line.partition(" ")
                for line in listed.stdout.decode("ascii", "replace").splitlines()
            )
            if name == "HEAD"
        ),
        None,
    )
    if head is None:
        return
    await run_git(
        growing,
        "checkout",
        "--quiet",
        "--detach",
        head,
        code=Code.INTEGRITY,
        cure=cure,
        background=True,
    )
    await anyio.to_thread.run_sync(settle_stat_data, growing)
    await run_git(growing, "update-index", "-q", "--refresh", ok=(0, 1), cure=cure, background=True)


def take_seed(links: Sequence[Link], staging: Path) -> bool:
    """The one seed of the chain with a checked-out tree becomes the (empty, just made)
    staging directory, by a rename: its history and its tree are then the staging's, and the
    restore goes on from there. False, with nothing moved, when there is none or the rename
    cannot be made (another filesystem); the bundle beside the seed serves a later run."""
    seeds = [link.seed for link in links if link.seed is not None]
    if len(seeds) != 1 or not (seeds[0] / ".git").is_dir() or (seeds[0] / ".git").is_symlink():
        return False
    try:
        os.rename(seeds[0], staging)
    except OSError:
        return False
    return True


def _seed_objects(seed: Path) -> Path:
    return seed / ".git" / "objects" if (seed / ".git").is_dir() else seed / "objects"


def plant_seed(seed: Path, objects: Path) -> None:
    """The seed's packs into a repository's `objects/pack`: hard links where one filesystem
    holds both, copies otherwise; each index after its pack, since git counts a pack once its
    index is there. Only regular files named as git names packs."""
    src, dst = _seed_objects(seed) / "pack", objects / "pack"
    dst.mkdir(exist_ok=True)
    names = [n for n in os.listdir(src) if _PACK_NAME.fullmatch(n)]
    for name in sorted(names, key=lambda n: (n.endswith(".idx"), n)):
        if not stat.S_ISREG(os.lstat(src / name).st_mode):
            raise Refusal(
                Code.INTEGRITY,
                f"checkpoint integrity: {src / name} is not a regular file",
                "rerun `cotal move` at the source: it ships the history again",
            )
        try:
            os.link(src / name, dst / name)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            shutil.copyfile(src / name, dst / name)


# -- the destination side -----------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    """One proven predecessor of a seat: where its seat directory is and the bundle it holds,
    or, for a pre-copied history a destination already indexed, the seed repository whose packs
    stand for that bundle."""

    attempt_id: str
    seat_dir: Path
    bundle: FileRef | None
    seed: Path | None = None

    @property
    def bundle_path(self) -> Path | None:
        return self.seat_dir / self.bundle.file if self.bundle is not None else None


def _locate(attempt_id: str, places: Sequence[Path]) -> Path | None:
    for place in places:
        path = place / attempt_id
        if path.is_dir():
            return path
    return None


def resolve(
    attempt_dir: Path,
    seat: str,
    record: RepositoryRecord,
    *,
    space: str,
    trusted_keys: Collection[str],
    search: Sequence[Path] = (),
) -> list[Link]:
    """Every predecessor of `seat`'s incremental record, proven, oldest first ([] for a full
    record). Refuses `predecessor-missing`, `integrity`, `untrusted-signer` or `chain-broken`
    naming the attempt and the seat."""
    attempt_dir = Path(attempt_dir)
    places = [attempt_dir.parent, *(Path(p) for p in search)]
    if record.precopy is not None:
        return [_precopied(attempt_dir, seat, record.precopy, places)]
    links: list[Link] = []
    seen = {attempt_dir.name}
    link = record.since
    successor = attempt_dir.name
    while link is not None:
        at = link.attempt_id
        if at in seen or len(links) >= MAX_CHAIN:
            raise Refusal(
                Code.CHAIN_BROKEN,
                f"seat {seat}: its chain of predecessors loops back to attempt {at} or runs past "
                f"{MAX_CHAIN} attempts",
                "cut the seat again without --since",
            )
        seen.add(at)
        found = _find_predecessor(attempt_dir, seat, at, successor, places)
        proven, link = _prove_predecessor(
            found, seat, link, successor, space=space, trusted_keys=trusted_keys
        )
        links.append(proven)
        successor = at
    links.reverse()
    return links


def _find_predecessor(
    attempt_dir: Path, seat: str, at: str, successor: str, places: Sequence[Path]
) -> Path:
    found = _locate(at, places)
    if found is None:
        where = ", ".join(str(p) for p in places)
        raise Refusal(
            Code.PREDECESSOR_MISSING,
            f"seat {seat}: attempt {successor} carries only what is new since attempt {at}, "
            f"and attempt {at} is in none of {where}",
            f"copy the attempt directory {at} from the source host (its "
            f".cotal/maintenance/v1/checkpoints/{at}) beside {attempt_dir}, and retry; "
            f"{CURE_CUT_FULL}",
        )
    return found


def _prove_predecessor(
    found: Path,
    seat: str,
    link: IncrementalLink,
    successor: str,
    *,
    space: str,
    trusted_keys: Collection[str],
) -> tuple[Link, IncrementalLink | None]:
    """The predecessor `link` pins, proven in `found` (its sealed seat record by digest, its
    bundle by digest), and the link that predecessor builds on in turn."""
    at = link.attempt_id
    got = read_sealed_seat(found, seat, trusted_keys=trusted_keys)
    if got is None:
        raise Refusal(
            Code.CHAIN_BROKEN,
            f"seat {seat}: attempt {successor} builds on attempt {at}, which holds no seat {seat}",
            f"copy the right attempt {at} from the source host, {CURE_CUT_FULL}",
        )
    manifest, prev, digest = got
    if manifest.attempt_id != at or manifest.space != space:
        raise Refusal(
            Code.INTEGRITY,
            f"checkpoint integrity: {found} holds attempt {manifest.attempt_id} of space "
            f"{manifest.space}, not the predecessor {at} of space {space}",
            f"copy the attempt directory {at} again from the source host",
        )
    bundle = prev.repository.bundle
    bundle_sha = bundle.sha256 if bundle is not None else None
    if digest != link.checkpoint_sha256 or bundle_sha != link.bundle_sha256:
        raise Refusal(
            Code.INTEGRITY,
            f"checkpoint integrity: seat {seat}: attempt {successor} builds on the seat "
            f"record of attempt {at} hashing to {link.checkpoint_sha256} (bundle "
            f"{link.bundle_sha256}), but {found / seat} holds one hashing to {digest} "
            f"(bundle {bundle_sha})",
            f"copy the attempt directory {at} again from the source host; {CURE_CUT_FULL}",
        )
    if bundle is not None:
        verify_file(found / seat, bundle)
    proven = Link(attempt_id=at, seat_dir=found / seat, bundle=bundle)
    return proven, prev.repository.since


def _precopied(attempt_dir: Path, seat: str, link: PrecopyLink, places: Sequence[Path]) -> Link:
    """The pre-copied history the record pins: the seed this root's mover indexed it into
    (made only from a bundle of that digest, signed by a trusted source, in this root's own
    0700 pre-copy directory), else the bundle itself, proven by its digest."""
    name = precopy_file(link.bundle_sha256)
    ref = FileRef(file=name, bytes=link.bundle_bytes, sha256=link.bundle_sha256)
    for place in places:
        seed = place / precopy_seed(link.bundle_sha256)
        if seed.is_dir() and not seed.is_symlink():
            return Link(attempt_id=PRECOPY_LABEL, seat_dir=place, bundle=None, seed=seed)
    for place in places:
        if (place / name).is_file() and not (place / name).is_symlink():
            verify_file(place, ref)
            return Link(attempt_id=PRECOPY_LABEL, seat_dir=place, bundle=ref)
    where = ", ".join(str(p) for p in places)
    raise Refusal(
        Code.PREDECESSOR_MISSING,
        f"seat {seat}: attempt {attempt_dir.name} carries only what is new since the history "
        f"`cotal move` shipped before its fence (bundle {name}), and that bundle is in none of "
        f"{where}",
        "rerun the same `cotal move` at the source: it ships the history again; or cut the "
        "seat again without a move and carry the whole attempt",
    )
