"""`cotal checkpoint verify DIR`: the three admission gates against this root and this broker,
changing nothing; and the admission pieces the resume shares with it.

The verification is one async run with one broker connection (the identity gate's roster read).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import msgspec

from manager import eventloop, registry
from manager.broker import presence
from manager.broker.connection import LazyConnection
from manager.broker.retry import phase
from manager.checkpoint import admit, chain, clock, relocate
from manager.cli import mesh
from manager.workspace import trust
from manager.workspace.layout import Layout
from protocol.errors import Refusal
from protocol.refusals import Code


@dataclass(frozen=True)
class BrokerRef:
    server: str
    creds: Path | None
    embedded: bool


def agent_settings(layout: Layout) -> dict[str, Mapping[str, Any]]:
    """This host's settings per known agent: the identity gate compares the recorded profile."""
    cfg = registry.load_config(layout.root)
    return {agent: registry.agent_settings(cfg, agent) for agent in registry.KNOWN}


def trusted_keys(args: argparse.Namespace, layout: Layout) -> list[str]:
    """Which signers a destination admits: this root's own instance key for the space, the
    operator's trust store (`cotal trust add`), and any `--trust-signer` pins for this run."""
    return trust.trusted_keys_for(layout, args.space, getattr(args, "trust_signer", None) or [])


def signer(adm: admit.Admission, args: argparse.Namespace, layout: Layout) -> dict[str, Any]:
    sealed_by = adm.manifest.signer
    assert sealed_by is not None
    pins = getattr(args, "trust_signer", None) or []
    return {
        "instanceId": sealed_by.instance_id,
        "publicKey": sealed_by.public_key,
        "fingerprint": trust.fingerprint(sealed_by.public_key),
        "pinned": sealed_by.public_key in pins,
        "trustedAs": trust.why_trusted(layout, args.space, pins, sealed_by.public_key),
    }


def signer_line(sig: dict[str, Any]) -> str:
    return (
        f"instance {sig['instanceId']} key {sig['publicKey']} "
        f"({sig['fingerprint']}; trusted: {sig['trustedAs']})"
    )


def relocation_of(adm: admit.Admission, name: str) -> dict[str, Any]:
    """Where an admitted seat runs here, and the class its harness can promise there when that
    is less than the recorded one. A resume continued from its journal skips the identity gate
    (the first run passed it and journaled the relocated plan), so it has nothing to add."""
    confined = adm.confined.get(name)
    if confined is None:
        return {}
    reloc = confined.reloc
    out: dict[str, Any] = {}
    if reloc is not None and reloc.moves:
        out["relocated"] = {"cwdBefore": str(reloc.old_cwd), "cwdAfter": str(reloc.new_cwd)}
    if confined.continuity is not None:
        out["continuity"] = confined.continuity
        out["relocationNote"] = confined.why
    landing = adm.landings.get(name)
    if landing is not None:
        # What a --map's restore finds at the tree: only its own repository is moved aside.
        out["mapLanding"] = landing
    return out


LANDING_SHOWN = {
    "absent": "created by the restore",
    "empty": "an empty directory, filled by the restore",
    "same-repository": "the same repository, moved aside by the restore",
}


def chain_of(adm: admit.Admission, name: str) -> dict[str, Any]:
    """An incremental seat's proven predecessors as `chain`, oldest first: where each was found
    and the bytes of its bundle. Nothing for a seat whose bundle carries its whole history."""
    links = adm.chains.get(name, [])
    if not links:
        return {}
    return {
        "chain": [
            {
                "attemptId": link.attempt_id,
                # A pre-copied bundle lies in a directory of bundles, not in a seat's directory.
                "dir": str(
                    link.seat_dir
                    if link.attempt_id == chain.PRECOPY_LABEL
                    else link.seat_dir.parent
                ),
                "bundleBytes": link.bundle.bytes if link.bundle is not None else 0,
            }
            for link in links
        ]
    }


async def admit_integrity(
    src: Path, trusted: list[str], search: tuple[Path, ...] = (), keep_in: Path | None = None
) -> admit.Admission:
    """Gate 1 reads and hashes every file of the attempt: off the event loop. An incremental
    seat's predecessors are looked for beside `src`, then under `search` (`chain.search_dirs`).
    `keep_in` keeps the unbundled repositories for the restore (`admit.integrity`)."""
    if src.exists() and not src.is_dir():
        raise Refusal(
            Code.NOT_A_CHECKPOINT,
            f"{src} is a file, not a checkpoint directory",
            "pass the attempt directory the cut printed (.cotal/maintenance/v1/checkpoints/"
            "<attempt>, or its copy), not a file inside it",
        )
    try:
        return await anyio.to_thread.run_sync(
            functools.partial(
                admit.integrity, src, trusted_keys=trusted, search=search, keep_in=keep_in
            )
        )
    except OSError as exc:
        # The gates name every problem they expect; what is left is the filesystem refusing.
        raise Refusal(
            Code.NOT_A_CHECKPOINT,
            f"{src} cannot be read as a checkpoint: {exc.strerror or exc} ({exc.filename or src})",
            "pass a readable checkpoint directory, copied whole",
        ) from None


def _broker_for_verify(args: argparse.Namespace, layout: Layout) -> BrokerRef:
    if getattr(args, "server", None):
        return BrokerRef(args.server, Path(args.creds).resolve() if args.creds else None, False)
    record = mesh.read_mesh(layout)
    if record is not None:
        return BrokerRef(record.server, Path(record.creds) if record.creds else None, False)
    raise Refusal(
        Code.NO_BROKER,
        "the identity gate must ask the broker whether each uid is live",
        "pass --server URL --creds FILE; an oracle that cannot answer is a refusal, never a pass",
    )


async def _verify(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    layout = Layout.at(root)
    src = Path(args.dir).resolve()
    adm = await admit_integrity(src, trusted_keys(args, layout), chain.search_dirs(layout))
    verdicts = {"integrity": "pass"}
    broker = _broker_for_verify(args, layout)
    async with LazyConnection(broker.server, broker.creds, name="cotal-admission") as conn:
        with phase("admission (presence)"):
            live = await presence.live_uids(await conn.jetstream(), adm.manifest.space)
    admit.identity(
        adm,
        space=adm.manifest.space,
        root=layout.root,
        live_uids=set(live),
        held_uids=set(),
        settings_for=agent_settings(layout),
        home=Path(os.path.expanduser("~")),
        maps=relocate.parse_maps(getattr(args, "map", None) or []),
    )
    verdicts["identity"] = "pass"
    consents = admit.recency(
        adm,
        now=datetime.now(UTC),
        clock=clock.read_clock(),
        accept_stale=args.accept_stale_checkpoint,
        skew_ms=registry.load_config(layout.root).recency.skew_s * 1000,
    )
    verdicts["recency"] = "pass" if not consents else "stale, accepted by --accept-stale-checkpoint"
    seats = [
        {
            "name": n,
            "lifecycleUid": r.lifecycle_uid,
            "continuity": r.session.continuity,
            "capturedAt": r.captured_at,
            "sessionId": r.session.session_id,
            **chain_of(adm, n),
            **relocation_of(adm, n),
        }
        for n, r in adm.records.items()
    ]
    return {
        "src": str(src),
        "attemptId": adm.manifest.attempt_id,
        "space": adm.manifest.space,
        "gates": verdicts,
        "seats": seats,
        "signer": signer(adm, args, layout),
        "consents": [msgspec.to_builtins(c) for c in consents],
        "admitted": True,
    }


def run_verify(args: argparse.Namespace, root: Path) -> int:
    out: dict[str, Any] = eventloop.run(_verify, args, root)
    src = out.pop("src")
    if args.json:
        sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
        return 0
    w = sys.stdout.write
    w(f"checkpoint {src}: admitted (attempt {out['attemptId']}, space {out['space']})\n")
    for gate, verdict in out["gates"].items():
        w(f"  {gate:<10} {verdict}\n")
    sig = out["signer"]
    w(f"  signer     {signer_line(sig)}\n")
    for s in out["seats"]:
        w(
            f"  seat {s['name']:<16} {s['continuity']:<10} uid {s['lifecycleUid']} "
            f"captured {s['capturedAt']}\n"
        )
        if "chain" in s:
            w(
                "    incremental on "
                + " <- ".join(link["attemptId"] for link in reversed(s["chain"]))
                + f" (found at {s['chain'][-1]['dir']})\n"
            )
        if "relocated" in s:
            moved = s["relocated"]
            w(f"    relocated {moved['cwdBefore']} -> {moved['cwdAfter']}\n")
        if "relocationNote" in s:
            w(f"    {s['relocationNote']}\n")
        if "mapLanding" in s:
            w(f"    mapped tree: {LANDING_SHOWN[s['mapLanding']]}\n")
    return 0
