"""The mesh record on disk (`.cotal/mesh.json`): which broker this root's mesh uses, its
manager and its embedded broker's processes.

Apart from `manager.coord.mesh`, which starts and stops brokers and managers and re-exports
these, because a command that only reads the record (`ps --fleet`, `events`) should not import
what starts a mesh.
"""

from __future__ import annotations

from manager.workspace.layout import Layout
from manager.workspace.private import read_stable, write_private_atomic
from protocol.mesh import MeshRecord, decode_mesh, encode_mesh

MESH_CAP = 16 * 1024


def read_mesh(layout: Layout) -> MeshRecord | None:
    if not layout.mesh.exists():
        return None
    return decode_mesh(read_stable(layout.mesh, cap=MESH_CAP, what="mesh record").data)


def write_mesh(layout: Layout, record: MeshRecord) -> None:
    write_private_atomic(layout.mesh, encode_mesh(record))
