"""Relocation: a seat resumed under a destination root at another absolute path.

A checkpoint records absolute paths (the seat's cwd, its declared session stores) because the
harnesses key their sessions by them. A destination at another path is the ordinary case, so
every such path is carried onto this host by a prefix map instead of refused:

* the source's workspace root maps to the destination root (always);
* each `--map OLD=NEW` adds a pair; the longest OLD holding a path wins, and an OLD equal to the
  source root overrides the implicit pair;
* a cwd or store under no OLD is refused by name (`cwd-unmapped`), never guessed at.

OLD and NEW are absolute, normalized (no `.`, `..` or doubled slash: a spelling a reviewer and a
prefix test could read differently), without NUL; NEW is a place a map may land
(`manager/checkpoint/landing.py`: an existing directory the operator owns for this work, or one
under the destination root the restore creates, never a system directory, a mount point, a
control directory or another root, and a seat's tree there missing, empty or the same
repository). The relocated inventory is what this root
journals as its resume document and hands to the daemon, so the seat runs, is listed and is
re-adopted after a crash at its new paths.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from connectors.base import Relocation
from manager.checkpoint.landing import check_map_target
from protocol.errors import Refusal
from protocol.inventory import Agent, Dependency, FileRef, Inventory
from protocol.refusals import Code

CURE_MAP = "pass --map OLD=NEW naming the source directory that holds it and where it goes here"


def _check_abs(flag: str, text: str) -> Path:
    if "\x00" in text or not text.startswith("/"):
        raise Refusal(
            Code.BAD_MAP,
            f"--map {flag} {text!r} is not an absolute path without NUL",
            "give absolute paths, e.g. --map /srv/old/tools=/opt/tools",
        )
    if posixpath.normpath(text) != text or text.startswith("//"):
        raise Refusal(
            Code.BAD_MAP,
            f"--map {flag} {text!r} is not normalized (no `.`, `..`, doubled or trailing slash)",
            f"write it as {posixpath.normpath(text)!r}",
        )
    return Path(text)


def parse_maps(values: Sequence[str]) -> dict[Path, Path]:
    """`OLD=NEW` strings from the command line, split at the first `=` (so NEW may hold one);
    one OLD named twice with different NEWs is refused."""
    out: dict[Path, Path] = {}
    for value in values:
        old_text, sep, new_text = value.partition("=")
        if not sep:
            raise Refusal(
                Code.BAD_MAP,
                f"--map {value!r} is not OLD=NEW",
                "write --map /source/dir=/destination/dir",
            )
        old, new = _check_abs("OLD", old_text), _check_abs("NEW", new_text)
        if out.get(old, new) != new:
            raise Refusal(
                Code.BAD_MAP,
                f"--map names {old} twice, onto {out[old]} and {new}",
                "map each source directory once",
            )
        out[old] = new
    return out


def check_maps(maps: Mapping[Path, Path], *, dest_root: Path) -> None:
    """Every pair well formed, and every NEW a place a map may land
    (`landing.check_map_target`: the rule the restore checks again where it writes)."""
    root = Path(os.path.normpath(dest_root))
    for old, new in maps.items():
        _check_abs("OLD", str(old))
        _check_abs("NEW", str(new))
        check_map_target(old, new, dest_root=root)


def relocation(
    source_root: Path, dest_root: Path, maps: Mapping[Path, Path], *, old_cwd: Path
) -> Relocation:
    """The seat's map: the source root onto this root, then the operator's pairs, longest OLD
    first. The cwd is mapped here and refused by name when no pair holds it."""
    pairs = {Path(os.path.normpath(source_root)): Path(os.path.normpath(dest_root))}
    pairs.update(maps)
    ordered = tuple(sorted(pairs.items(), key=lambda p: len(p[0].parts), reverse=True))
    probe = Relocation(old_cwd, old_cwd, source_root, dest_root, ordered)
    new_cwd = probe.map(old_cwd)
    if new_cwd is None:
        raise Refusal(
            Code.CWD_UNMAPPED,
            f"the seat's cwd {old_cwd} is outside the source root {source_root} and no --map "
            "covers it",
            CURE_MAP + f", e.g. --map {old_cwd}={dest_root / old_cwd.name}",
        )
    return Relocation(old_cwd, new_cwd, probe.old_root, probe.new_root, ordered)


def map_store(seat: str, store: str, reloc: Relocation) -> Path:
    """A declared session store carried here, or `cwd-unmapped` naming it."""
    source = (
        Path(os.path.normpath(store)) if store.startswith("/") and "\x00" not in store else None
    )
    here = None if source is None else reloc.map(source)
    if here is None:
        raise Refusal(
            Code.CWD_UNMAPPED,
            f"seat {seat}: its session store {store!r} is outside the source root "
            f"{reloc.old_root} and no --map covers it",
            CURE_MAP + ".",
        )
    return here


def _mapped(path: str, reloc: Relocation) -> str:
    # Files a seat merely references (a credential, a dependency) keep their path when no pair
    # holds them: their digests, not their places, are what the preflight proves.
    here = reloc.map(Path(path))
    return path if here is None else str(here)


def relocate_agent(agent: Agent, reloc: Relocation, *, keep_session: bool = True) -> Agent:
    """The inventory entry as it runs here: cwd, stores and referenced files mapped. Without
    `keep_session` the entry no longer names a session, so the daemon starts it fresh and says
    so, instead of reopening one the harness cannot continue at the new path."""
    launch = msgspec.structs.replace(
        agent.launch,
        cwd=str(reloc.new_cwd),
        session_stores=[str(map_store(agent.name, s, reloc)) for s in agent.launch.session_stores],
        session_id=agent.launch.session_id if keep_session else None,
    )
    identity = agent.identity
    if identity.credential is not None:
        cred = identity.credential
        identity = msgspec.structs.replace(
            identity,
            credential=FileRef(kind="file", path=_mapped(cred.path, reloc), sha256=cred.sha256),
        )
    deps = [
        Dependency(kind=d.kind, path=_mapped(d.path, reloc), sha256=d.sha256)
        for d in agent.dependencies
    ]
    return msgspec.structs.replace(agent, launch=launch, identity=identity, dependencies=deps)


def relocate_inventory(
    inventory: Inventory, seats: Mapping[str, tuple[Relocation, bool]]
) -> Inventory:
    """Each named seat relocated (with whether its session is kept); others unchanged."""
    agents = [
        relocate_agent(a, seats[a.name][0], keep_session=seats[a.name][1]) if a.name in seats else a
        for a in inventory.agents
    ]
    return msgspec.structs.replace(inventory, agents=agents)
