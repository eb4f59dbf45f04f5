"""Where things live under a workspace root's `.cotal/` control directory.

`.cotal/` is never captured into a checkpoint and never moved while a daemon uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from protocol.names import check_lifecycle_uid, check_seat_name, space_hex

CONTROL_DIR = ".cotal"


@dataclass(frozen=True)
class Layout:
    root: Path

    @classmethod
    def at(cls, root: Path | str) -> Layout:
        return cls(Path(root).resolve())

    @property
    def control(self) -> Path:
        return self.root / CONTROL_DIR

    @property
    def socket(self) -> Path:
        return self.control / "manager.sock"

    @property
    def mesh(self) -> Path:
        return self.control / "mesh.json"

    @property
    def auth(self) -> Path:
        return self.control / "auth"

    @property
    def control_token(self) -> Path:
        return self.auth / "control.token"

    @property
    def broker_creds(self) -> Path:
        return self.auth / "broker.creds"

    @property
    def broker_user(self) -> Path:
        return self.auth / "broker.user"

    @property
    def box_key(self) -> Path:
        """The X25519 key pair a pack sealed to this root is encrypted to (`boxkey.py`)."""
        return self.auth / "box.key"

    def instance_identity(self, space: str) -> Path:
        return self.auth / f"manager-instance.{space_hex(space)}.json"

    def seat_generation_dir(self, space: str, seat: str) -> Path:
        return self.auth / "seat-generation" / space_hex(space) / check_seat_name(seat)

    @property
    def nats_store(self) -> Path:
        return self.control / "nats"

    @property
    def sessions(self) -> Path:
        return self.control / "sessions"

    def session_pointer(self, connector: str, seat: str, uid: str) -> Path:
        return self.sessions / connector / f"{check_seat_name(seat)}-{uid}.json"

    def seat_store(self, connector: str, seat: str, uid: str) -> Path:
        """A per-seat session store for harnesses whose store the manager chooses."""
        return self.sessions / connector / f"{check_seat_name(seat)}-{uid}.store"

    @property
    def seat_mesh(self) -> Path:
        return self.control / "seat-mesh"

    def seat_mesh_dir(self, seat: str, uid: str) -> Path:
        """Where the manager serves one seat's mesh socket; the seat's sandbox binds it."""
        return self.seat_mesh / f"{check_seat_name(seat)}-{check_lifecycle_uid(uid)}"

    @property
    def seats(self) -> Path:
        """The daemon's persisted seat table, one record per seat, read back after a crash."""
        return self.control / "seats"

    def seat_record(self, seat: str, uid: str) -> Path:
        return self.seats / f"{check_seat_name(seat)}-{check_lifecycle_uid(uid)}.json"

    @property
    def maintenance(self) -> Path:
        return self.control / "maintenance" / "v1"

    @property
    def journal(self) -> Path:
        return self.maintenance / "journal.json"

    @property
    def checkpoints(self) -> Path:
        """This root's own cuts, one directory per attempt."""
        return self.maintenance / "checkpoints"

    @property
    def incoming(self) -> Path:
        """Packed checkpoints unpacked here, one directory per attempt."""
        return self.maintenance / "incoming"

    @property
    def precopy(self) -> Path:
        """Bundles `cotal move` shipped before its fence, one `<sha256>.bundle` each: at the
        source for a take-back, at the destination for the chain its adoption unbundles."""
        return self.maintenance / "precopy"

    @property
    def standing(self) -> Path:
        """Failover seats' standing checkpoints as captured here, one directory per seat with
        the newest sealed attempt in it (the broker's object store holds the copy that counts)."""
        return self.maintenance / "standing"

    @property
    def handoffs(self) -> Path:
        """This root's notes of the attempts it packed and handed off."""
        return self.maintenance / "handoffs"

    @property
    def logs(self) -> Path:
        return self.control / "logs"

    @property
    def manager_log(self) -> Path:
        return self.logs / "manager.log"

    def seat_log(self, seat: str, uid: str) -> Path:
        return self.logs / f"seat-{check_seat_name(seat)}-{uid}.log"

    @property
    def config(self) -> Path:
        return self.control / "config.json"
