"""`.cotal/mesh.json`: what `cotal up` started, so `cotal down` can prove it all gone."""

from __future__ import annotations

import msgspec

from protocol.codec import decode_json, encode_json

MESH_CAP = 16 * 1024


class ProcRef(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    pid: int
    start_time: int
    boot_id: str


class MeshRecord(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    version: int
    space: str
    server: str
    creds: str | None
    embedded_broker: ProcRef | None = None
    broker_store: str | None = None
    manager: ProcRef | None = None


def decode_mesh(data: bytes) -> MeshRecord:
    return decode_json(data, MeshRecord, what="mesh record", cap=MESH_CAP)


def encode_mesh(record: MeshRecord) -> bytes:
    return encode_json(record)
