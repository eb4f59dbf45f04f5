"""`cotal checkpoint verify DIR`: the three admission gates against this root and this broker,
changing nothing; and the admission pieces the resume shares with it.

The verification is one async run with one broker connection (the identity gate's roster read).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import msgspec

from manager import registry
from manager.broker import presence
from manager.broker.connection import LazyConnection
from manager.broker.retry import phase
from manager.checkpoint import admit
from manager.cli import mesh
from manager.workspace.identity import load_or_create_identity
from manager.workspace.layout import Layout
from protocol.errors import Refusal


@dataclass(frozen=True)
class BrokerRef:
    server: str
    creds: Path | None
    embedded: bool


def agent_settings(layout: Layout) -> dict[str, Mapping[str, Any]]:
    """This host's settings per known agent: the identity gate compares the recorded profile."""
    cfg = registry.load_config(layout.root)
    return {agent: registry.agent_settings(cfg, agent) for agent in registry.KNOWN}


def trusted_keys(args: argparse.Namespace, layout: Layout, src: Path) -> list[str] | None:
    """Which signers a destination admits. `--trust-signer` pins explicitly; a root resuming its
    own cut pins its own instance key; otherwise any valid signature is accepted and the signer
    is printed, because a destination on another host has nothing of its own to compare with."""
    pinned = list(getattr(args, "trust_signer", None) or [])
    if pinned:
        return pinned
    try:
        own_cut = src.is_relative_to(layout.maintenance / "checkpoints")
    except ValueError:
        own_cut = False
    if own_cut and layout.instance_identity(args.space).exists():
        return [load_or_create_identity(layout, args.space).public_key_b64]
    return None


def signer(adm: admit.Admission, pinned: list[str] | None) -> dict[str, Any]:
    sealed_by = adm.manifest.signer
    assert sealed_by is not None
    return {
        "instanceId": sealed_by.instance_id,
        "publicKey": sealed_by.public_key,
        "pinned": pinned is not None,
    }


async def admit_integrity(src: Path, trusted: list[str] | None) -> admit.Admission:
    """Gate 1 reads and hashes every file of the attempt: off the event loop."""
    return await anyio.to_thread.run_sync(
        functools.partial(admit.integrity, src, trusted_keys=trusted)
    )


def _broker_for_verify(args: argparse.Namespace, layout: Layout) -> BrokerRef:
    if getattr(args, "server", None):
        return BrokerRef(args.server, Path(args.creds).resolve() if args.creds else None, False)
    record = mesh.read_mesh(layout)
    if record is not None:
        return BrokerRef(record.server, Path(record.creds) if record.creds else None, False)
    raise Refusal(
        "no-broker",
        "the identity gate must ask the broker whether each uid is live",
        "pass --server URL --creds FILE; an oracle that cannot answer is a refusal, never a pass",
    )


async def _verify(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    layout = Layout.at(root)
    src = Path(args.dir).resolve()
    trusted = trusted_keys(args, layout, src)
    adm = await admit_integrity(src, trusted)
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
    )
    verdicts["identity"] = "pass"
    consents = admit.recency(adm, now=datetime.now(UTC), accept_stale=args.accept_stale_checkpoint)
    verdicts["recency"] = "pass" if not consents else "stale, accepted by --accept-stale-checkpoint"
    seats = [
        {
            "name": n,
            "lifecycleUid": r.lifecycle_uid,
            "continuity": r.session.continuity,
            "capturedAt": r.captured_at,
            "sessionId": r.session.session_id,
        }
        for n, r in adm.records.items()
    ]
    return {
        "src": str(src),
        "attemptId": adm.manifest.attempt_id,
        "space": adm.manifest.space,
        "gates": verdicts,
        "seats": seats,
        "signer": signer(adm, trusted),
        "consents": [msgspec.to_builtins(c) for c in consents],
        "admitted": True,
    }


def run_verify(args: argparse.Namespace, root: Path) -> int:
    out: dict[str, Any] = anyio.run(_verify, args, root, backend="asyncio")
    src = out.pop("src")
    if args.json:
        sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
        return 0
    w = sys.stdout.write
    w(f"checkpoint {src}: admitted (attempt {out['attemptId']}, space {out['space']})\n")
    for gate, verdict in out["gates"].items():
        w(f"  {gate:<10} {verdict}\n")
    sig = out["signer"]
    pinned = (
        " (pinned)"
        if sig["pinned"]
        else " (not pinned: compare it with the source, or pass --trust-signer)"
    )
    w(f"  signer     instance {sig['instanceId']} key {sig['publicKey']}{pinned}\n")
    for s in out["seats"]:
        w(
            f"  seat {s['name']:<16} {s['continuity']:<10} uid {s['lifecycleUid']} "
            f"captured {s['capturedAt']}\n"
        )
    return 0
