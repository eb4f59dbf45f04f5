"""Two standbys racing to take one lost seat over (issue 39): exactly one holder, 50 rounds.

What decides a takeover race is the claim a takeover's restore makes (`custody.claim_attempt`,
from `Mover.restore_here`): the standing checkpoint's attempt key by exclusive create, then the
seat's custody by compare-and-set at generation + 1. Both standbys restore the same standing
checkpoint, so both claim the same attempt. Here two standbys, each on a connection of its own
to a real broker, make that claim at the same instant, 50 times over (the starting order
alternating): each round one wins, the other is refused (`custody-lost` or
`generation-behind`, by when it read custody) having claimed nothing,
and the custody record names the winner at generation 1. The whole path with real managers and
seats (two standbys, four seats, each run exactly once) is `tests/e2e/test_takeover.py`.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from nats.js import JetStreamContext

from manager.broker import custody
from manager.broker.embedded import start_embedded, stop_embedded
from protocol import names
from protocol.checkpoint import SeatCheckpoint
from protocol.errors import Refusal
from tests.helpers import broker_at
from tests.unit.test_checkpoint_record import seat

pytestmark = pytest.mark.anyio

SPACE = "main"
ROUNDS = 50
WON = "won"
LOSER_REFUSALS = ("custody-lost", "generation-behind")


async def _take(
    js: JetStreamContext,
    holder: str,
    attempt: str,
    record: SeatCheckpoint,
    root: Path,
    out: dict[str, str],
) -> None:
    try:
        await custody.claim_attempt(js, SPACE, attempt, {"lost": record}, holder=holder, root=root)
        out[holder] = WON
    except Refusal as refusal:
        out[holder] = refusal.code


async def test_two_standbys_racing_for_one_seat_make_one_holder_fifty_rounds(
    tmp_path: Path,
) -> None:
    info = start_embedded(tmp_path / "nats", tmp_path / "broker.creds")
    try:
        async with (
            broker_at(info.url, info.creds) as first,
            broker_at(info.url, info.creds) as second,
        ):
            kv = await custody.custody_kv(first, SPACE)
            standbys = [(first, names.mint_instance_id()), (second, names.mint_instance_id())]
            wins = {holder: 0 for _, holder in standbys}
            for n in range(ROUNDS):
                uid, dead = names.mint_lifecycle_uid(), names.mint_instance_id()
                held = await custody.establish(kv, "lost", uid, dead)
                record = seat(
                    name="lost", lifecycle_uid=uid, generation=0, custody_revision=held.revision
                )
                attempt = names.mint_attempt_id()
                out: dict[str, str] = {}
                order = standbys if n % 2 == 0 else standbys[::-1]
                async with anyio.create_task_group() as tg:
                    for js, holder in order:
                        tg.start_soon(_take, js, holder, attempt, record, tmp_path / holder, out)
                # The loser read custody before the winner's claim (its attempt key is taken:
                # `custody-lost`) or after it (the record is past its checkpoint's generation).
                [winner] = [h for h, said in out.items() if said == WON]
                [lost] = [said for said in out.values() if said != WON]
                assert lost in LOSER_REFUSALS, (n, out)
                wins[winner] += 1
                now = await custody.read(kv, "lost", uid)
                assert now is not None
                assert (now.record.holder, now.record.generation) == (winner, 1), (n, now)
            assert sum(wins.values()) == ROUNDS
    finally:
        stop_embedded(info.identity)
