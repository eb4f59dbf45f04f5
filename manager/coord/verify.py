"""`cotal checkpoint verify DIR`: the three admission gates against this root and this broker,
changing nothing; and the admission pieces the resume shares with it.

The verification is one async run with one broker connection (the identity gate's roster read).
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
from msgspec import UNSET

from manager import registry
from manager.broker import presence
from manager.broker.connection import LazyConnection
from manager.broker.retry import phase
from manager.checkpoint import admit, chain, relocate
from manager.coord import mesh
from manager.coord.admission import (
    BrokerRef,
    admit_integrity,
    agent_settings,
    chain_of,
    recency_gate,
    relocation_of,
    signer,
    trusted_keys,
)
from manager.coord.records import Gates, VerifiedSeat, VerifyResult
from manager.coord.requests import VerifyRequest
from manager.workspace.layout import Layout
from protocol.errors import Refusal
from protocol.refusals import Code


def _broker_for_verify(req: VerifyRequest, layout: Layout) -> BrokerRef:
    if req.server:
        return BrokerRef(req.server, Path(req.creds).resolve() if req.creds else None, False)
    record = mesh.read_mesh(layout)
    if record is not None:
        return BrokerRef(record.server, Path(record.creds) if record.creds else None, False)
    raise Refusal(
        Code.NO_BROKER,
        "the identity gate must ask the broker whether each uid is live",
        "pass --server URL --creds FILE; an oracle that cannot answer is a refusal, never a pass",
    )


async def verify(req: VerifyRequest, root: Path) -> VerifyResult:
    layout = Layout.at(root)
    src = Path(req.dir).resolve()
    pins = req.trust_signer
    adm = await admit_integrity(
        src, trusted_keys(layout, req.space, pins), chain.search_dirs(layout)
    )
    broker = _broker_for_verify(req, layout)
    async with LazyConnection(broker.server, broker.creds, name="cotal-admission") as conn:
        with phase("admission (presence)"):
            live = await presence.live_uids(await conn.jetstream(), adm.manifest.space)
    config = registry.load_config(layout.root)
    admit.identity(
        adm,
        space=adm.manifest.space,
        root=layout.root,
        live_uids=set(live),
        held_uids=set(),
        settings_for=agent_settings(config),
        home=Path(os.path.expanduser("~")),
        maps=relocate.parse_maps(list(req.map)),
    )
    # The same harness check a restore makes before its claim (a `--version` run per agent).
    await anyio.to_thread.run_sync(admit.harnesses, adm, agent_settings(config))
    consents, note = recency_gate(adm, config.recency, accept_stale=req.accept_stale_checkpoint)
    recency = "pass" if not consents else "stale, accepted by --accept-stale-checkpoint"
    return VerifyResult(
        src=str(src),
        attempt_id=adm.manifest.attempt_id,
        space=adm.manifest.space,
        gates=Gates(integrity="pass", identity="pass", recency=recency),
        seats=[_verified(adm, n) for n in adm.records],
        signer=signer(adm, layout, req.space, pins),
        consents=consents,
        admitted=True,
        clock=note if note is not None else UNSET,
    )


def _verified(adm: admit.Admission, name: str) -> VerifiedSeat:
    r = adm.records[name]
    moved = relocation_of(adm, name)
    links = chain_of(adm, name)
    return VerifiedSeat(
        name=name,
        lifecycle_uid=r.lifecycle_uid,
        # The class its harness can promise here, when relocation makes it less.
        continuity=moved.continuity or r.session.continuity,
        captured_at=r.captured_at,
        session_id=r.session.session_id,
        chain=links if links else UNSET,
        relocated=moved.relocated,
        relocation_note=moved.note,
        map_landing=moved.landing,
    )
