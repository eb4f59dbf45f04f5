"""`cotal up --restore DIR` and `cotal checkpoint verify DIR`: the destination's coordinator.

admit (integrity, identity, recency; all-or-nothing) -> journal `resume-intent` -> claim custody
(writer generation N+1, in this root and at the broker, before any tree is touched) -> restore
every repository and place the session files -> start the manager fenced to this attempt ->
`resume-preserved` -> journal `resume-active` -> `commit-resume` -> journal the token ->
`finalize-resume` -> journal `retired`. Then the continuity observations of record 6 step 9.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import msgspec
import nats.errors

from manager import registry
from manager.broker import custody
from manager.broker.connection import connect
from manager.broker.evict import verify_gone
from manager.broker.footprint import ensure_kv
from manager.broker.retry import ELECTION_S, TRANSIENT, riding_elections, unavailable
from manager.checkpoint import admit
from manager.checkpoint.restore import place_session_file, restore_repository, session_destination
from manager.cli import mesh
from manager.workspace.generation import claim_successor, withdraw_claim
from manager.workspace.identity import InstanceIdentity, load_or_create_identity
from manager.workspace.journal import Journal, write_resume_document
from manager.workspace.layout import Layout
from manager.workspace.lock import MaintenanceLock
from protocol import names
from protocol.codec import decode_json, encode_json
from protocol.errors import Refusal
from protocol.inventory import encode_inventory
from protocol.maintenance import Degraded
from protocol.messages import Presence

RESUME_TIMEOUT_S = 600.0


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


@dataclass(frozen=True)
class BrokerRef:
    server: str
    creds: Path | None
    embedded: bool


def _broker_for(args: argparse.Namespace, layout: Layout) -> BrokerRef:
    if args.server:
        return BrokerRef(args.server, Path(args.creds).resolve() if args.creds else None, False)
    if (layout.nats_store / "js").is_dir() and layout.broker_creds.exists():
        return BrokerRef("", layout.broker_creds, True)
    raise Refusal(
        "no-broker",
        "a resume needs the broker that holds the seats' inboxes",
        "pass --server URL --creds FILE (the broker the source used), or resume in the source root",
    )


@dataclass(frozen=True)
class LivePresence:
    instance_id: str
    key: str
    revision: int


async def _live_uids(server: str, creds: Path | None, space: str) -> dict[str, LivePresence]:
    """uid -> the presence entry that claims it (and the manager instance that wrote it)."""
    nc = await connect(server, creds, name="cotal-admission")
    try:
        kv = await ensure_kv(nc.jetstream(), names.presence_bucket(space), ttl=names.PRESENCE_TTL_S)
        try:
            keys = await riding_elections("presence keys", kv.keys)
        except Exception as exc:
            if type(exc).__name__ == "NoKeysError":
                return {}
            raise
        live: dict[str, LivePresence] = {}
        for key in keys:
            try:
                entry = await riding_elections(f"presence {key}", lambda key=key: kv.get(key))
            except Exception as exc:
                if type(exc).__name__ in ("KeyNotFoundError", "KeyDeletedError"):
                    continue
                raise
            try:
                instance = decode_json(
                    entry.value or b"", Presence, what="presence", cap=4096
                ).instance_id
            except Exception:
                # A presence we cannot read still says "someone may be live": keep it, unknown.
                instance = ""
            live[key.rsplit(".", 1)[-1]] = LivePresence(instance, key, int(entry.revision or 0))
        return live
    finally:
        await nc.close()


async def _evict_ghosts(
    adm: admit.Admission,
    live: dict[str, LivePresence],
    monitors: list[str],
    server: str,
    creds: Path | None,
    space: str,
) -> list[dict[str, Any]]:
    """A seat whose predecessor still shows presence is admitted only with verified-gone
    evidence for that predecessor; without a monitor to ask, it stays live (and is refused).
    Once verified, exactly the presence entry that was checked is retired (deleted at its
    revision), so the manager's own roster check sees the predecessor as confirmed retired."""
    evidence = []
    retire: list[LivePresence] = []
    for name, record in adm.records.items():
        uid = record.lifecycle_uid
        if uid not in live or not monitors:
            continue
        predecessor = live[uid]
        if not predecessor.instance_id:
            raise Refusal(
                "eviction-unverified",
                f"seat {name}: its presence names no readable predecessor",
                "wait for the presence to expire (6 s) and retry",
            )
        proof = await verify_gone(monitors, predecessor.instance_id)
        retire.append(live.pop(uid))
        evidence.append({"seat": name, **proof.as_dict()})
    if retire:
        nc = await connect(server, creds, name="cotal-eviction")
        try:
            kv = await ensure_kv(
                nc.jetstream(), names.presence_bucket(space), ttl=names.PRESENCE_TTL_S
            )
            for ghost in retire:
                try:
                    await riding_elections(
                        f"retire presence {ghost.key}",
                        lambda ghost=ghost: kv.delete(ghost.key, last=ghost.revision),
                    )
                except Exception as exc:
                    if type(exc).__name__ != "KeyWrongLastSequenceError":
                        raise
                    raise Refusal(
                        "predecessor-live",
                        f"presence {ghost.key} changed while it was being retired",
                        "something still heartbeats as this seat; stop it first",
                    ) from None
        finally:
            await nc.close()
    return evidence


def _settings(layout: Layout) -> dict[str, Any]:
    cfg = registry.load_config(layout.root)
    return {agent: registry.agent_settings(cfg, agent) for agent in registry.KNOWN}


def _trusted_keys(args: argparse.Namespace, layout: Layout, src: Path) -> list[str] | None:
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


def _signer(adm: admit.Admission, pinned: list[str] | None) -> dict[str, Any]:
    signer = adm.manifest.signer
    assert signer is not None
    return {
        "instanceId": signer.instance_id,
        "publicKey": signer.public_key,
        "pinned": pinned is not None,
    }


def run_verify(args: argparse.Namespace, root: Path) -> int:
    layout = Layout.at(root)
    src = Path(args.dir).resolve()
    trusted = _trusted_keys(args, layout, src)
    adm = admit.integrity(src, trusted_keys=trusted)
    verdicts = {"integrity": "pass"}
    broker = _broker_for_verify(args, layout)
    live = _broker_phase(
        "admission (presence)", _live_uids, broker.server, broker.creds, adm.manifest.space
    )
    admit.identity(
        adm,
        space=adm.manifest.space,
        root=layout.root,
        live_uids=set(live),
        held_uids=set(),
        settings_for=_settings(layout),
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
    out = {
        "attemptId": adm.manifest.attempt_id,
        "space": adm.manifest.space,
        "gates": verdicts,
        "seats": seats,
        "signer": _signer(adm, trusted),
        "consents": [msgspec.to_builtins(c) for c in consents],
        "admitted": True,
    }
    if args.json:
        sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
    else:
        sys.stdout.write(
            f"checkpoint {src}: admitted (attempt {out['attemptId']}, space {out['space']})\n"
        )
        for gate, verdict in verdicts.items():
            sys.stdout.write(f"  {gate:<10} {verdict}\n")
        sig = out["signer"]
        sys.stdout.write(
            f"  signer     instance {sig['instanceId']} key {sig['publicKey']}"
            f"{' (pinned)' if sig['pinned'] else ' (not pinned: compare it with the source, or pass --trust-signer)'}\n"
        )
        for s in seats:
            sys.stdout.write(
                f"  seat {s['name']:<16} {s['continuity']:<10} uid {s['lifecycleUid']} captured {s['capturedAt']}\n"
            )
    return 0


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


async def _claim_custody(
    broker_server: str,
    creds: Path | None,
    adm: admit.Admission,
    identity: InstanceIdentity,
    layout: Layout,
) -> list[dict[str, Any]]:
    """The attempt key first (one destination wins the whole attempt), then each seat's key by
    compare-and-set against the revision its checkpoint recorded."""
    attempt = adm.manifest.attempt_id
    nc = await connect(broker_server, creds, name="cotal-custody")
    try:
        kv = await ensure_kv(nc.jetstream(), names.custody_bucket(adm.manifest.space), ttl=None)
        for name, record in adm.records.items():
            current = await custody.read(kv, name, record.lifecycle_uid)
            if (
                current is not None
                and current.record.generation > record.generation
                and not (
                    current.record.holder == identity.instance_id
                    and current.record.attempt_id == attempt
                )
            ):
                raise Refusal(
                    "generation-behind",
                    f"seat {name}: this checkpoint is at writer generation {record.generation}, but custody is at "
                    f"generation {current.record.generation}, held by instance {current.record.holder}",
                    "this record is stale: the seat was resumed elsewhere; do not launch it here",
                )
        claim_key = f"attempt.{attempt}"
        mine = encode_json({"holder": identity.instance_id, "root": str(layout.root)})
        if await custody.create_exclusive(kv, claim_key, mine) is None:
            entry = await riding_elections(f"claim {claim_key}", lambda: kv.get(claim_key))
            if entry.value != mine:
                holder = json.loads(entry.value or b"{}")
                raise Refusal(
                    "custody-lost",
                    f"attempt {attempt} was already claimed by instance {holder.get('holder')} at {holder.get('root')}",
                    "another destination is resuming these seats; this one must not start them",
                ) from None
        claims = []
        for name, record in adm.records.items():
            assert record.custody_revision is not None
            held = await custody.claim(
                kv,
                name,
                record.lifecycle_uid,
                expected_revision=record.custody_revision,
                generation=record.generation + 1,
                holder=identity.instance_id,
                attempt_id=attempt,
            )
            claims.append(
                {"name": name, "generation": held.record.generation, "revision": held.revision}
            )
        return claims
    finally:
        await nc.close()


def run_restore(args: argparse.Namespace, root: Path) -> int:
    t0 = time.monotonic()
    layout = Layout.at(root)
    src = Path(args.restore).resolve()
    space = args.space
    status = mesh.daemon_status(layout)
    if status is not None:
        raise Refusal(
            "already-up",
            f"a manager (pid {status['pid']}) already serves {layout.root}",
            "a resume starts its own manager: stop this one first",
        )
    _say(f"admitting {src}")
    trusted = _trusted_keys(args, layout, src)
    adm = admit.integrity(src, trusted_keys=trusted)
    sig = _signer(adm, trusted)
    _say(
        f"sealed by instance {sig['instanceId']} key {sig['publicKey']}"
        f"{' (pinned)' if sig['pinned'] else ' (not pinned; pass --trust-signer KEY to require it)'}"
    )
    attempt = adm.manifest.attempt_id
    broker = _broker_for(args, layout)
    embedded_info = None
    if broker.embedded:
        from manager.broker import embedded

        _say("starting the embedded broker from this root's store")
        embedded_info = embedded.start_embedded(
            layout.nats_store, layout.broker_creds, log_path=layout.logs / "nats.log"
        )
        broker = BrokerRef(embedded_info.url, layout.broker_creds, True)
    try:
        live = _broker_phase("admission (presence)", _live_uids, broker.server, broker.creds, space)
        monitors = [m.strip() for m in (args.monitor or "").split(",") if m.strip()]
        if embedded_info is not None and embedded_info.monitor:
            monitors.append(embedded_info.monitor)
        evidence = _broker_phase(
            "eviction evidence",
            _evict_ghosts,
            adm,
            live,
            monitors,
            broker.server,
            broker.creds,
            space,
        )
        for proof in evidence:
            _say(
                f"EVICTION EVIDENCE: seat {proof['seat']}: predecessor {proof['instanceId']} has no broker "
                f"connection ({proof['connectionsScanned']} scanned across {len(proof['servers'])} server(s))"
            )
        admit.identity(
            adm,
            space=space,
            root=layout.root,
            live_uids=set(live),
            held_uids=set(),
            settings_for=_settings(layout),
        )
        consents = admit.recency(
            adm, now=datetime.now(UTC), accept_stale=args.accept_stale_checkpoint
        )
    except BaseException:
        if embedded_info is not None:
            from manager.broker import embedded

            embedded.stop_embedded(embedded_info.identity)
        raise
    for c in consents:
        _say(
            f"CONSENT: seat {c.seat} captured {c.captured_at} is {c.age_ms} ms old, beyond its "
            f"{c.horizon_ms} ms horizon; admitted by --accept-stale-checkpoint"
        )
    _say("admitted: integrity, identity and recency pass for every seat")
    inventory = adm.inventory
    journal = Journal(layout)
    with MaintenanceLock(layout, attempt):
        record = journal.load() if (layout.maintenance / "journal.json").exists() else None
        if record is not None and record.state in ("retired", "degraded"):
            journal.discard(record.attempt_id)
            record = None
        if record is not None and record.attempt_id != attempt:
            raise Refusal(
                "journal-busy",
                f"this root's maintenance journal is at {record.state} for attempt "
                f"{record.attempt_id}",
                "finish or discard that attempt first",
            )
        if record is None:
            descriptor = write_resume_document(layout, inventory)
        else:
            # Same-root resume continues the cut's journal, or a rerun continues this resume:
            # either way the journal's plan must be the very document this checkpoint seals.
            descriptor = record.resume
            if descriptor is None or journal.resume_document(record) != inventory:
                raise Refusal(
                    "journal-mismatch",
                    f"this root's journal for attempt {attempt} names a different resume document",
                    "resume from the checkpoint this root cut, or discard the journal first",
                )
        if record is not None and record.kind == "resume" and record.consents:
            # A rerun of an admitted attempt: the operator's consent was journaled at its first
            # admission and stands; a fresh age reading must not contradict the record.
            consents = list(record.consents)
        journal.advance(attempt, "resume-intent", resume=descriptor, consents=consents)
        identity = load_or_create_identity(layout, space)
        _say("claiming custody (writer generation N+1) in this root and at the broker")
        local: list[tuple[str, int]] = []
        try:
            for name, rec in adm.records.items():
                local.append(
                    (
                        name,
                        claim_successor(
                            layout,
                            space,
                            name,
                            rec.lifecycle_uid,
                            rec.generation,
                            identity.instance_id,
                            attempt,
                        ),
                    )
                )
            claims = _broker_phase(
                "custody claim", _claim_custody, broker.server, broker.creds, adm, identity, layout
            )
        except Refusal as exc:
            # Lost before any tree was touched: give back what this root claimed and say why.
            for name, generation in local:
                withdraw_claim(layout, space, name, generation, identity.instance_id, attempt)
            journal.advance(
                attempt,
                "degraded",
                resume=descriptor,
                consents=consents,
                degraded=Degraded(
                    reason=exc.message[:4000], recourse=(exc.cure or "see the message")[:4000]
                ),
            )
            raise
        restored = anyio.run(_restore_all, layout, adm, backend="asyncio")
        _say("starting the manager fenced to this attempt")
        if embedded_info is not None:
            from manager.broker import embedded

            embedded.stop_embedded(embedded_info.identity)
            server, creds = None, None
        else:
            server, creds = broker.server, str(broker.creds) if broker.creds else None
        mesh.up(
            layout.root,
            space=space,
            server=server,
            creds=creds,
            detach=True,
            report=_say,
            resume_attempt=attempt,
        )
        result = _call(
            layout,
            "resume-preserved",
            {"attemptId": attempt, "inventory": json.loads(encode_inventory(inventory))},
        )
        journal.advance(attempt, "resume-active", resume=descriptor, consents=consents)
        commit = _call(layout, "commit-resume", {"attemptId": attempt})
        token = commit["durableCommitToken"]
        journal.advance(
            attempt,
            "resume-committed",
            resume=descriptor,
            consents=consents,
            durable_commit_token=token,
        )
        final = _call(
            layout, "finalize-resume", {"attemptId": attempt, "durableCommitToken": token}
        )
        journal.advance(
            attempt, "retired", resume=descriptor, consents=consents, durable_commit_token=token
        )
    rows = {r["name"]: r for r in _call(layout, "ps", {})}
    observations = []
    for seat in result["seats"]:
        rec = adm.records[seat["name"]]
        row = rows.get(seat["name"], {})
        observations.append(
            {
                "name": seat["name"],
                "continuity": seat["continuity"],
                "observation": seat["observation"],
                "sessionBefore": rec.session.session_id,
                "sessionAfter": row.get("sessionId"),
                "uidBefore": rec.lifecycle_uid,
                "uidAfter": row.get("lifecycleUid"),
                "sameSession": rec.session.session_id is not None
                and rec.session.session_id == row.get("sessionId"),
                "sameUid": rec.lifecycle_uid == row.get("lifecycleUid"),
            }
        )
    out = {
        "attemptId": attempt,
        "state": final["state"],
        "journal": "retired",
        "claims": claims,
        "evictionEvidence": evidence,
        "signer": sig,
        "restored": restored,
        "seats": observations,
        "consents": [msgspec.to_builtins(c) for c in consents],
        "wallMs": int((time.monotonic() - t0) * 1000),
    }
    _print(args, out)
    return 0


async def _restore_all(layout: Layout, adm: admit.Admission) -> list[dict[str, Any]]:
    """Restore each distinct working tree once, then place every seat's session files.

    Seats that share a cwd were captured from the same stopped tree, so their records must
    agree; restoring it once per seat would only stack superseded copies beside it.
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    home = Path(os.path.expanduser("~"))
    dirs = {s.name: s.dir for s in adm.manifest.seats}
    restored: dict[Path, tuple[str, Any]] = {}
    out = []
    for name, record in adm.records.items():
        cwd = Path(adm.agent(name).launch.cwd)
        seat_dir = adm.attempt_dir / dirs[name]
        if cwd in restored:
            first, result = restored[cwd]
            other = adm.records[first].repository
            if (record.repository.base, record.repository.status) != (other.base, other.status):
                raise Refusal(
                    "inconsistent-checkpoint",
                    f"seats {first} and {name} share {cwd} but their checkpoints record different trees",
                    "cut the seats again; a shared tree is captured once, stopped",
                )
            _say(f"{name} shares {cwd} with {first}: already restored")
        else:
            keep = (".cotal",) if cwd == layout.root else ()
            _say(f"restoring {name} into {cwd}")
            result = await restore_repository(
                seat_dir, record.repository, cwd, stamp=stamp, keep_paths=keep
            )
            restored[cwd] = (name, result)
        placed = []
        files = ([record.session.pointer] if record.session.pointer else []) + list(
            record.session.store
        )
        for entry in files:
            dest = session_destination(entry, cwd=cwd, workspace_root=layout.root, home=home)
            placed.append(
                place_session_file(
                    seat_dir / entry.file.file, dest, expected_sha256=entry.file.sha256
                )
            )
        out.append(
            {
                "name": name,
                "cwd": str(cwd),
                "superseded": str(result.superseded) if result.superseded else None,
                "sessionFiles": len(placed),
            }
        )
    return out


def _broker_phase(what: str, fn: Any, *args: Any) -> Any:
    """Run one broker-facing phase; a broker failure becomes a refusal that names the phase."""
    try:
        return anyio.run(fn, *args, backend="asyncio")
    except Refusal:
        raise
    except (*TRANSIENT, nats.errors.Error) as exc:
        raise unavailable(what, ELECTION_S, exc) from None


def _call(layout: Layout, op: str, args: dict[str, Any]) -> Any:
    return anyio.run(mesh.call, layout.root, op, args, RESUME_TIMEOUT_S, backend="asyncio")


def _print(args: argparse.Namespace, out: dict[str, Any]) -> None:
    if args.json:
        sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
        return
    w = sys.stdout.write
    w(
        f"resumed attempt {out['attemptId']}: manager {out['state']}, journal {out['journal']} ({out['wallMs']} ms)\n"
    )
    for s in out["seats"]:
        w(f"  {s['name']:<16} {s['continuity']:<10} {s['observation']}\n")
        w(
            f"    session  {s['sessionBefore']} -> {s['sessionAfter']}  ({'same' if s['sameSession'] else 'different'})\n"
        )
        w(
            f"    uid      {s['uidBefore']} -> {s['uidAfter']}  ({'same' if s['sameUid'] else 'DIFFERENT'})\n"
        )
    w("next: cotal send NAME 'what was the phrase?' --wait\n")
