"""One row of the fleet's roster: a seat lifecycle as the broker shows it. What `cotal ps
--fleet --json` prints and what the `fleet` control op carries; read from the broker's buckets by
`manager/broker/fleet.py`. Here, apart from that reader, so the CLI decodes a manager's answer
without importing nats-py."""

from __future__ import annotations

from typing import Final, Literal

import msgspec

State = Literal["running", "in transit", "held", "lost", "stale-presence", "unreadable"]
RUNNING: Final = "running"
IN_TRANSIT: Final = "in transit"
HELD: Final = "held"
LOST: Final = "lost"
STALE_PRESENCE: Final = "stale-presence"
UNREADABLE: Final = "unreadable"


class FleetRow(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """One seat lifecycle as the broker shows it; what `cotal ps --fleet --json` prints.

    `instance` is the custody holder (the presence's writer when no custody record exists);
    `host` is the label in that instance's lease, None when it has no live lease; `to` is the
    destination instance of a `cotal move` carrying the seat (None when no move carries it, or
    its putter did not name one); `errors` names every entry of this seat that did not decode.

    `since` and `takeover` are set on a `lost` row only: `since` is the last moment the broker
    shows the holder alive (an instant, `protocol.instant`), `takeover` what will take the seat
    over. Both default, so a reply of a manager older than them still decodes.
    """

    name: str
    lifecycle_uid: str
    instance: str | None
    host: str | None
    state: State
    generation: int | None
    attempt_id: str | None
    presence_instance: str | None
    manager_live: bool
    errors: list[str] = msgspec.field(default_factory=list)
    to: str | None = None
    since: str | None = None
    takeover: str | None = None
