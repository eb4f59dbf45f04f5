"""Admission (record 2.2): integrity, then identity, then recency, all-or-nothing over an attempt.

Cheapest and most conclusive first. Integrity and identity have no override; recency has one
(`--accept-stale-checkpoint`), because a stale checkpoint is sometimes the only checkpoint, and
the consent is returned so the caller can print and journal it. A capturedAt that cannot be read,
or one later than this host's clock beyond a small skew, refuses with no override: a freshness
gate that fails open is not a gate.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from manager import registry
from manager.checkpoint.reader import read_manifest, verify_integrity
from manager.workspace.private import read_stable
from protocol.checkpoint import AttemptManifest, SeatCheckpoint
from protocol.errors import Refusal
from protocol.instant import parse_instant
from protocol.inventory import INVENTORY_CAP, Agent, Inventory, parse_resume_args
from protocol.maintenance import Consent

CLOCK_SKEW_MS = 60_000


@dataclass
class Admission:
    attempt_dir: Path
    manifest: AttemptManifest
    inventory: Inventory
    resume_bytes: bytes
    records: dict[str, SeatCheckpoint]
    consents: list[Consent] = field(default_factory=list)
    verdicts: list[dict[str, Any]] = field(default_factory=list)

    def agent(self, name: str) -> Agent:
        return next(a for a in self.inventory.agents if a.name == name)


def _refuse(gate: str, code: str, message: str, cure: str) -> Refusal:
    return Refusal(code, f"admission refused at the {gate} gate: {message}", cure)


def integrity(attempt_dir: Path, *, trusted_keys: Collection[str] | None = None) -> Admission:
    """Gate 1: every named file present, regular, not a symlink, of its size and digest, stable
    while read; the signatures verify; the resume document is the one the manifest names."""
    records = verify_integrity(attempt_dir, trusted_keys=trusted_keys)
    manifest = read_manifest(attempt_dir, trusted_keys=trusted_keys)
    doc = read_stable(
        attempt_dir / manifest.resume.file, cap=INVENTORY_CAP, what="resume document"
    ).data
    if hashlib.sha256(doc).hexdigest() != manifest.resume.sha256:
        raise _refuse(
            "integrity",
            "integrity",
            f"{attempt_dir / manifest.resume.file} changed after it was verified",
            "copy the checkpoint again and retry",
        )
    inventory = parse_resume_args(manifest.attempt_id, doc, space=manifest.space)
    by_name = {r.name: r for r in records}
    missing = [a.name for a in inventory.agents if a.name not in by_name]
    if missing:
        raise _refuse(
            "integrity",
            "retained-unadmitted",
            f"retained seat(s) {', '.join(missing)} have no checkpoint in {attempt_dir}",
            "every seat of the cut must be admitted; copy the whole attempt directory",
        )
    for name, record in by_name.items():
        agent = next((a for a in inventory.agents if a.name == name), None)
        carried = record.session.continuity in ("exact", "fork")
        if (
            agent is None
            or agent.identity.lifecycle_uid != record.lifecycle_uid
            or (not carried and agent.launch.session_id is not None)
        ):
            raise _refuse(
                "integrity",
                "integrity",
                f"seat {name}: its checkpoint and the resume document disagree",
                "copy the checkpoint again from the source host",
            )
    return Admission(attempt_dir, manifest, inventory, doc, by_name)


def identity(
    adm: Admission,
    *,
    space: str,
    root: Path,
    live_uids: Collection[str],
    held_uids: Collection[str],
    settings_for: Mapping[str, Mapping[str, Any]],
) -> None:
    """Gate 2: same space, same paths, a uid nobody runs, and the recorded profile revision."""
    if adm.manifest.space != space:
        raise _refuse(
            "identity",
            "wrong-space",
            f"the checkpoint belongs to space {adm.manifest.space!r}, not {space!r}",
            f"resume it with --space {adm.manifest.space}",
        )
    for name, record in adm.records.items():
        if record.workspace_root is None or record.custody_revision is None:
            raise _refuse(
                "identity",
                "old-checkpoint",
                f"seat {name}: the checkpoint records no workspace root or custody revision",
                "cut the seat again with this version of cotal",
            )
        if Path(record.workspace_root) != root:
            raise _refuse(
                "identity",
                "paths-differ",
                f"seat {name} was cut in workspace root {record.workspace_root}, this root is "
                f"{root}",
                f"resume from a root at {record.workspace_root}: the seat's paths are absolute",
            )
        uid = record.lifecycle_uid
        if uid in held_uids:
            raise _refuse(
                "identity",
                "uid-held",
                f"seat {name} (uid {uid}) is already held by this root's manager",
                "this seat is live here; do not resume it twice",
            )
        if uid in live_uids:
            raise _refuse(
                "identity",
                "uid-live",
                f"retained principal {name} (uid {uid}) is already live at the broker and this "
                "runtime "
                "cannot authoritatively adopt it",
                "stop the running incarnation first (presence expires 6 s after it stops), or "
                "pass --monitor "
                "so cotal can verify its predecessor is gone",
            )
        agent = adm.agent(name)
        expected = registry.profile_digest(
            agent.launch.connector, agent.launch.model, settings_for.get(agent.launch.connector, {})
        )
        if expected != record.profile:
            raise _refuse(
                "identity",
                "profile-drift",
                f"seat {name}: this host's launch profile for {agent.launch.connector} has "
                "revision "
                f"{expected}, the checkpoint recorded {record.profile}",
                "make cotal.toml here match the source's settings for that agent; a resumed "
                "session "
                "never runs under a different profile",
            )


def recency(
    adm: Admission, *, now: datetime, accept_stale: bool, skew_ms: int = CLOCK_SKEW_MS
) -> list[Consent]:
    """Gate 3: capturedAt against this host's clock and the recorded horizon."""
    consents: list[Consent] = []
    for name, record in adm.records.items():
        try:
            captured = parse_instant(record.captured_at)
        except ValueError:
            raise _refuse(
                "recency",
                "unreadable-time",
                f"seat {name}: capturedAt {record.captured_at!r} is unreadable",
                "no override exists: cut the seat again",
            ) from None
        age_ms = int((now - captured).total_seconds() * 1000)
        if age_ms < -skew_ms:
            raise _refuse(
                "recency",
                "future-checkpoint",
                f"seat {name}: capturedAt {record.captured_at} is {-age_ms} ms later than this "
                "host's clock "
                f"({now.isoformat()}), beyond the {skew_ms} ms skew allowed",
                "fix this host's clock (or the source's) and retry; no override exists",
            )
        if age_ms > record.recency_horizon_ms:
            if not accept_stale:
                raise _refuse(
                    "recency",
                    "stale-checkpoint",
                    f"seat {name}: capturedAt {record.captured_at} is {age_ms} ms old at this "
                    "host's clock "
                    f"({now.isoformat()}), beyond its horizon of {record.recency_horizon_ms} ms",
                    "pass --accept-stale-checkpoint to resume it anyway (the consent is journaled)",
                )
            consents.append(
                Consent(
                    seat=name,
                    captured_at=record.captured_at,
                    age_ms=age_ms,
                    horizon_ms=record.recency_horizon_ms,
                )
            )
    adm.consents = consents
    return consents
