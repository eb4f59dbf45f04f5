"""What a standing checkpoint in the broker's object store says of itself (its description), so
a standby judges it before fetching a byte: whose it is, at which custody generation, and how
long its holder waits before it fences itself (manager/daemon/standing.py, takeover.py)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from protocol.codec import decode_json, encode_json
from protocol.names import AttemptIdField as AttemptId

STANDING_META_CAP = 2048


class StandingMeta(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """`instance` held the seat at `generation` when it captured `attempt_id` at `captured_at`;
    `after_s` is that instance's `[failover] after_s`, fixed for its life (a manager reads its
    configuration once), which is what a takeover must wait out once its lease is gone."""

    instance: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    generation: Annotated[int, msgspec.Meta(ge=0)]
    after_s: Annotated[float, msgspec.Meta(gt=0, le=3600)]
    attempt_id: AttemptId
    captured_at: Annotated[str, msgspec.Meta(max_length=64)]
    # The attempt this one's history bundle builds on (its `since`), kept as the lifecycle's
    # base object (`names.standing_base_object`); None for a capture that carries it whole.
    base: AttemptId | None = None


def encode_standing_meta(meta: StandingMeta) -> str:
    return encode_json(meta).decode()


def decode_standing_meta(data: str) -> StandingMeta:
    return decode_json(
        data.encode(), StandingMeta, what="standing checkpoint's description", cap=STANDING_META_CAP
    )
