"""`cotal move`'s pre-copy: each seat's history shipped to the destination while the seat runs.

Before the fence, each seat's repository is bundled (`git bundle create --all`, under the same
safe git configuration as the capture), kept here as `<sha256>.bundle` in the root's pre-copy
directory (for a take-back), put in the move bucket and handed to the destination, which keeps
it by digest. The cut then carries, per seat, only what is new on top of those tips, and its
signed record pins the bundle by digest (`RepositoryRecord.precopy`), so the destination proves
it before its adoption unbundles it. A pre-copy that fails for any reason is said and skipped:
the cut then carries that seat's whole history, as without pre-copy (docs/design.md, "Pre-copy").
"""

from __future__ import annotations

import base64
import os
import secrets
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec

from manager.coord.report import say as progress
from protocol.control import PrecopyBase
from protocol.errors import Refusal
from protocol.refusals import Code

# The destination's fetch of one seat's history, hashed whole, into its pre-copy directory.
PRECOPY_TIMEOUT_S = 300.0

Ask = Callable[[str, Any, float], Awaitable[Any]]


async def ship(
    layout: Any,
    js: Any,
    space: str,
    source: str,
    ask: Ask,
    seats: Sequence[tuple[str, str, str]],
) -> dict[str, PrecopyBase]:
    """The pre-copy of each `(name, uid, cwd)`, by name; a seat whose pre-copy failed is left
    out (its cut carries the whole history)."""
    shipped: dict[str, PrecopyBase] = {}
    for name, uid, cwd in seats:
        try:
            base = await _ship_one(layout, js, space, source, ask, name, uid, Path(cwd))
        except Refusal as exc:
            progress(
                f"  pre-copy of {name} skipped ({exc.code}: {exc.message}); its cut carries "
                "the whole history"
            )
            continue
        if base is not None:
            shipped[name] = base
            progress(f"  pre-copied {name}'s history: {base.bundle_bytes} bytes")
    return shipped


async def _ship_one(
    layout: Any, js: Any, space: str, source: str, ask: Ask, name: str, uid: str, cwd: Path
) -> PrecopyBase | None:
    from manager.broker import carry
    from manager.checkpoint.chain import precopy_file, sweep_precopies
    from manager.checkpoint.gitstate import (
        BUNDLE_REVS,
        EMPTY_BUNDLE,
        bundle_heads,
        run_git,
        stream_git_to_file,
    )
    from manager.workspace.private import ensure_private_dir, fsync_dir
    from protocol import move
    from protocol.checkpoint import MAX_PREREQUISITES

    head = await run_git(cwd, "rev-parse", "-q", "--verify", "HEAD", ok=(0, 1, 128))
    if head.rc != 0:
        # An unborn branch: its cut builds on nothing (docs/design.md decision 17), so no
        # history is worth shipping ahead.
        return None
    store = layout.precopy
    await anyio.to_thread.run_sync(ensure_private_dir, store)
    await anyio.to_thread.run_sync(sweep_precopies, store)
    part = f"shipping-{secrets.token_hex(8)}.part"
    try:
        ref = await stream_git_to_file(
            # The refs a linked worktree sees and its HEAD, never the other worktrees' HEADs
            # (`--all` names them), as the cut's own bundle (gitstate.BUNDLE_REVS).
            cwd,
            ["bundle", "create", "--quiet", "-", *BUNDLE_REVS],
            store,
            part,
            background=True,
        )
    except Refusal as exc:
        (store / part).unlink(missing_ok=True)
        if exc.code == Code.GIT_FAILED and EMPTY_BUNDLE in exc.message:
            # A repository with no ref yet: no history to ship ahead.
            return None
        raise
    final = store / precopy_file(ref.sha256)
    os.rename(store / part, final)
    await anyio.to_thread.run_sync(fsync_dir, store)
    if ref.bytes > move.OBJECT_CAP:
        final.unlink(missing_ok=True)
        return None
    listed = await run_git(cwd, "bundle", "list-heads", str(final))
    tips = list(dict.fromkeys(bundle_heads(listed.stdout).values()))[:MAX_PREREQUISITES]
    obj = f"precopy-{ref.sha256}"
    try:
        # Streamed from the file in bounded memory, hashed as it is read: a bundle of a few
        # GiB never sits in this process whole.
        put = await carry.put(js, space, obj, final)
        if put != (ref.bytes, ref.sha256):
            raise Refusal(
                Code.INTEGRITY,
                f"the bundle {final.name} changed while it was put ({put[0]} bytes hashing to "
                f"{put[1]}, not {ref.bytes} bytes hashing to {ref.sha256})",
                "rerun `cotal move`; nothing was fenced",
            )
        record = _signed(layout, space, move.MovePrecopy(
            source=source, seat=name, uid=uid, object=obj, sha256=ref.sha256, bytes=ref.bytes,
            signer="", signature="",
        ))  # fmt: skip
        await ask("precopy", record, PRECOPY_TIMEOUT_S)
    finally:
        await carry.drop(js, space, obj)
    return PrecopyBase(bundle_sha256=ref.sha256, bundle_bytes=ref.bytes, tips=tips)


def _signed(layout: Any, space: str, unsigned: Any) -> Any:
    """The pre-copy record signed by this root's instance key, which it names as its signer."""
    from manager.workspace import identity
    from protocol import move

    ident = identity._load(layout.instance_identity(space), space)
    unsigned = msgspec.structs.replace(unsigned, signer=ident.public_key_b64)
    signature = ident.sign(move.precopy_payload(space, unsigned))
    return msgspec.structs.replace(unsigned, signature=base64.b64encode(signature).decode())


def forget(layout: Any, shipped: dict[str, PrecopyBase]) -> None:
    """This root's own copies, once no take-back can need them."""
    from manager.checkpoint.chain import precopy_file

    for base in shipped.values():
        (layout.precopy / precopy_file(base.bundle_sha256)).unlink(missing_ok=True)
