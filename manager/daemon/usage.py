"""What each seat's turns used (docs/operations.md, "What each seat costs").

A seat's driver returns, with each turn's outcome, the tokens its harness reported for the
turn (`connectors.base.TurnUsage`). The manager keeps one `UsageRecord` per turn in the seat's
usage ledger, `cotal-usage/turns.jsonl` inside the seat's first session store: the store is what
a cut already carries whole and a destination restores at the same place under its own root, so
the ledger travels with the session by a cut, a `cotal move` or a restore, with no record of its
own in the checkpoint. (No connector's store reader looks below its own names: pi relocates the
store's top-level `*.jsonl`, Claude Code `projects/`, Codex `sessions/rollout-*`, which is why the
ledger sits one directory down.)

The ledger is read once per seat, when this manager first serves it, strictly: each line one
record, no unknown field, no negative count, the file under `LEDGER_CAP`. A ledger that does not
read is left as it is and not written again (its totals are unknown, `ps` says `-`), since a
rewrite would lose what it held. Records older than `FOLD_AFTER_S` (the longest budget window)
are folded into one record per model when the file would pass its cap, so the file stays
bounded and the totals stay exact; the rest are kept one per turn.

The store is the seat's own, so its harness could write the ledger too: what the manager
counted since it served the seat is in its memory, and a rewrite by the seat is read only by
the next manager. The counts are the harness's own; nothing here estimates a token. The cost is
an estimate from the root's `[prices]` table, keyed by the model the harness named.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import msgspec
import structlog

from connectors.base import MODEL_NAME_MAX, StoreDecl, TurnUsage
from connectors.privatefs import ensure_private_dir, read_stable, write_private_atomic
from manager.registry import PriceConfig
from protocol.errors import Refusal
from protocol.instant import format_instant, parse_instant
from protocol.refusals import Code

log = structlog.get_logger("cotal.usage")

LEDGER_DIR = "cotal-usage"
LEDGER_FILE = "turns.jsonl"
# The ledger's bound on disk. A record is about 150 bytes, so this holds several thousand turns
# of the last day one by one before even those are folded.
LEDGER_CAP = 1024 * 1024
# One record's line at most; a longer line is not one of ours.
RECORD_CAP = 1024
# Records older than this are folded (per model) once the file would pass its cap: no budget
# window is longer.
FOLD_AFTER_S = 86_400
# No harness reports more than this many tokens for one turn, or for a seat's life.
TOKENS_MAX = 10**15
MILLION = 1_000_000

Count = Annotated[int, msgspec.Meta(ge=0, le=TOKENS_MAX)]


class UsageRecord(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """One turn's tokens in a seat's ledger, or `turns` folded turns of one model (their `at`
    the latest of them). It crosses the disk and travels in a checkpoint, so it is strict."""

    at: Annotated[str, msgspec.Meta(max_length=40)]
    input_tokens: Count = 0
    output_tokens: Count = 0
    cache_read_tokens: Count = 0
    cache_write_tokens: Count = 0
    model: Annotated[str, msgspec.Meta(min_length=1, max_length=MODEL_NAME_MAX)] | None = None
    turns: Annotated[int, msgspec.Meta(ge=1, le=TOKENS_MAX)] = 1

    def __post_init__(self) -> None:
        parse_instant(self.at)

    @property
    def tokens_in(self) -> int:
        """Every input token: uncached, read from and written to the prompt cache."""
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.output_tokens


def record_of(usage: TurnUsage, at: str) -> UsageRecord:
    return UsageRecord(
        at=at,
        input_tokens=min(usage.input_tokens, TOKENS_MAX),
        output_tokens=min(usage.output_tokens, TOKENS_MAX),
        cache_read_tokens=min(usage.cache_read_tokens, TOKENS_MAX),
        cache_write_tokens=min(usage.cache_write_tokens, TOKENS_MAX),
        model=usage.model,
    )


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(UsageRecord, strict=True)


def encode_records(records: Iterable[UsageRecord]) -> bytes:
    return b"".join(_encoder.encode(r) + b"\n" for r in records)


def decode_records(data: bytes, *, where: str) -> list[UsageRecord]:
    """Every line of a ledger, each one record; a ValueError names the first that is not."""
    if len(data) > LEDGER_CAP:
        raise ValueError(f"{where} is {len(data)} bytes, over the {LEDGER_CAP}-byte cap")
    if data and not data.endswith(b"\n"):
        raise ValueError(f"{where} does not end with a whole line")
    out: list[UsageRecord] = []
    for number, line in enumerate(data.splitlines(), 1):
        if len(line) > RECORD_CAP:
            raise ValueError(f"{where} line {number} is over {RECORD_CAP} bytes")
        try:
            out.append(_decoder.decode(line))
        except (msgspec.DecodeError, ValueError) as exc:
            raise ValueError(f"{where} line {number}: {exc}") from None
    return out


def fold(records: list[UsageRecord], *, before: datetime) -> list[UsageRecord]:
    """The records older than `before` as one record per model (first seen first), then the
    rest as they are: the same totals in fewer lines."""
    folded: dict[str | None, UsageRecord] = {}
    kept: list[UsageRecord] = []
    for r in records:
        if parse_instant(r.at) >= before:
            kept.append(r)
            continue
        was = folded.get(r.model)
        folded[r.model] = (
            r
            if was is None
            else UsageRecord(
                at=max(was.at, r.at),
                input_tokens=min(was.input_tokens + r.input_tokens, TOKENS_MAX),
                output_tokens=min(was.output_tokens + r.output_tokens, TOKENS_MAX),
                cache_read_tokens=min(was.cache_read_tokens + r.cache_read_tokens, TOKENS_MAX),
                cache_write_tokens=min(was.cache_write_tokens + r.cache_write_tokens, TOKENS_MAX),
                model=r.model,
                turns=min(was.turns + r.turns, TOKENS_MAX),
            )
        )
    return [*folded.values(), *kept]


@dataclass(frozen=True)
class Totals:
    """A seat's tokens over its ledger, and the estimated cost (None: some model has no price,
    or no turn named its model)."""

    turns: int
    tokens_in: int
    tokens_out: int
    cost_usd: float | None


def cost_of(records: Iterable[UsageRecord], prices: Mapping[str, PriceConfig]) -> float | None:
    """US dollars at the root's `[prices]`; None when a record's model has no price."""
    total = 0.0
    for r in records:
        price = prices.get(r.model) if r.model is not None else None
        if price is None:
            if r.tokens == 0:
                continue
            return None
        read = price.input if price.cache_read is None else price.cache_read
        write = price.input if price.cache_write is None else price.cache_write
        total += (
            r.input_tokens * price.input
            + r.output_tokens * price.output
            + r.cache_read_tokens * read
            + r.cache_write_tokens * write
        ) / MILLION
    return round(total, 6)


class UsageLedger:
    """One seat's usage records: in memory, and in its file when it has one (`path` None: a
    seat with no session store keeps its count for this manager's life only).

    `add` is called off the event loop (it writes a file); the readers run on it, so the
    records are guarded by a lock."""

    def __init__(self, path: Path | None, records: list[UsageRecord], broken: str | None) -> None:
        self.path = path
        self._records = records
        # Why the file did not read: then it is never written, and the totals are unknown.
        self.broken = broken
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Path | None) -> UsageLedger:
        """The ledger at `path` as the file holds it (none yet: empty)."""
        if path is None:
            return cls(None, [], None)
        try:
            data = read_stable(path, cap=LEDGER_CAP, what="usage ledger").data
            return cls(path, decode_records(data, where=str(path)), None)
        except Refusal as exc:
            if exc.code == Code.MISSING:
                return cls(path, [], None)
            why = exc.message
        except (OSError, ValueError) as exc:
            why = str(exc)
        log.error("usage.unreadable", path=str(path), error=why)
        return cls(path, [], why)

    def records(self) -> list[UsageRecord]:
        with self._lock:
            return list(self._records)

    def add(self, record: UsageRecord) -> None:
        """One turn's record, kept and written (the whole file, atomically, folded when it
        would pass its cap). A write that fails is logged; the count in memory stands."""
        with self._lock:
            if self.broken is not None:
                return
            self._records.append(record)
            if self.path is None:
                return
            data = encode_records(self._records)
            if len(data) > LEDGER_CAP:
                self._records = fold(
                    self._records, before=datetime.now(UTC) - timedelta(seconds=FOLD_AFTER_S)
                )
                data = encode_records(self._records)
                if len(data) > LEDGER_CAP:
                    self._records = fold(self._records, before=datetime.max.replace(tzinfo=UTC))
                    data = encode_records(self._records)
            try:
                ensure_private_dir(self.path.parent)
                write_private_atomic(self.path, data)
            except (OSError, Refusal) as exc:
                log.error("usage.unwritten", path=str(self.path), error=str(exc))

    def totals(self, prices: Mapping[str, PriceConfig]) -> Totals | None:
        """The seat's tokens so far; None when its ledger did not read or holds no turn."""
        records = self.records()
        if self.broken is not None or not records:
            return None
        return Totals(
            turns=sum(r.turns for r in records),
            tokens_in=sum(r.tokens_in for r in records),
            tokens_out=sum(r.output_tokens for r in records),
            cost_usd=cost_of(records, prices),
        )

    def records_since(self, when: datetime) -> list[UsageRecord]:
        """The records at or after `when` (a folded record counts at its `at`), oldest first.
        Records are appended in time order, so it reads back from the newest."""
        stamp = format_instant(when)
        out: list[UsageRecord] = []
        for r in reversed(self.records()):
            # The one instant spelling sorts as text: no parse per record.
            if r.at < stamp:
                if r.turns == 1:
                    break
                continue
            out.append(r)
        return out[::-1]

    def since(self, when: datetime) -> tuple[int, int]:
        """(turns, tokens) recorded at or after `when`; a budget asks this before each
        message."""
        records = self.records_since(when)
        return sum(r.turns for r in records), sum(r.tokens for r in records)


def ledger_path(stores: tuple[StoreDecl, ...], *, root: Path, cwd: Path) -> Path | None:
    """Where a seat keeps its ledger: in its first session store, resolved as the cut resolves
    it (`manager.checkpoint.cut.store_dirs`); None for a seat with no store."""
    if not stores:
        return None
    bases = {"workspace-root": root, "cwd": cwd, "home": Path(os.path.expanduser("~"))}
    store = Path(os.path.normpath(bases[stores[0].anchor] / stores[0].relpath))
    return store / LEDGER_DIR / LEDGER_FILE


def now_record(usage: TurnUsage) -> UsageRecord:
    return record_of(usage, format_instant(datetime.now(UTC)))
