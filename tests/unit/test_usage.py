"""A seat's usage ledger (manager/daemon/usage.py), the `[prices]` table, and what each
connector reads from its harness's own report of a turn's tokens."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from connectors.base import TurnOutcome, TurnUsage
from connectors.claude_code import result_usage
from connectors.codex import call_usage
from connectors.pi import turn_usage
from manager.daemon import usage
from manager.daemon.usage import UsageLedger, UsageRecord, decode_records, encode_records
from manager.registry import PriceConfig, load_config
from protocol.errors import Refusal
from protocol.instant import format_instant

AT = "2026-12-01T10:00:00.000Z"


def rec(**kw: object) -> UsageRecord:
    return UsageRecord(**{"at": AT, **kw})  # type: ignore[arg-type]


# -- connectors --------------------------------------------------------------------------------


def test_pi_sums_the_turns_assistant_messages() -> None:
    end = {
        "messages": [
            {"role": "user", "content": "hi", "usage": {"input": 999}},
            {
                "role": "assistant",
                "model": "m1",
                "usage": {"input": 100, "output": 8, "cacheRead": 20, "cacheWrite": 0},
            },
            {"role": "toolResult", "content": []},
            {
                "role": "assistant",
                "model": "m1",
                "usage": {"input": 5, "output": 2, "cacheRead": 1, "cacheWrite": 3},
            },
        ]
    }
    assert turn_usage(end) == TurnUsage(105, 10, 21, 3, "m1")
    assert turn_usage({"messages": [{"role": "assistant", "content": []}]}) is None


def test_claude_reads_the_results_usage_and_names_the_main_model() -> None:
    result = {
        "usage": {
            "input_tokens": 300,
            "output_tokens": 12,
            "cache_read_input_tokens": 40,
            "cache_creation_input_tokens": 10,
        },
        "modelUsage": {"helper": {"outputTokens": 3}, "claude-x": {"outputTokens": 90}},
    }
    assert result_usage(result) == TurnUsage(300, 12, 40, 10, "claude-x")
    assert result_usage({"subtype": "success"}) is None


def test_codex_counts_the_cached_input_apart() -> None:
    params = {
        "turnId": "t",
        "tokenUsage": {
            "total": {"inputTokens": 900, "outputTokens": 90},
            "last": {"inputTokens": 200, "cachedInputTokens": 50, "outputTokens": 9},
        },
    }
    assert call_usage(params, "gpt") == TurnUsage(150, 9, 50, 0, "gpt")
    assert call_usage({"tokenUsage": {}}, "gpt") is None


def test_a_count_that_is_not_a_count_is_none_and_usage_is_not_the_outcomes_identity() -> None:
    end = {
        "messages": [
            {"role": "assistant", "usage": {"input": -4, "output": True, "cacheRead": "7"}}
        ]
    }
    assert turn_usage(end) == TurnUsage(0, 0, 0, 0, None)
    assert TurnOutcome("ok", "x", usage=TurnUsage(1, 2)) == TurnOutcome("ok", "x")


# -- the ledger --------------------------------------------------------------------------------


def test_records_round_trip_and_refuse_what_is_not_one() -> None:
    records = [rec(input_tokens=1, output_tokens=2, model="m"), rec(turns=3)]
    assert decode_records(encode_records(records), where="l") == records
    with pytest.raises(ValueError, match="line 1"):
        decode_records(b'{"at":"2026-12-01T10:00:00.000Z","extra":1}\n', where="l")
    with pytest.raises(ValueError, match="line 1"):
        decode_records(b'{"at":"2026-12-01T10:00:00.000Z","inputTokens":-1}\n', where="l")
    with pytest.raises(ValueError, match="line 1"):
        decode_records(b'{"at":"yesterday"}\n', where="l")
    with pytest.raises(ValueError, match="whole line"):
        decode_records(encode_records(records)[:-3], where="l")
    with pytest.raises(ValueError, match="cap"):
        decode_records(b"\n" * (usage.LEDGER_CAP + 1), where="l")


def test_a_ledger_is_written_read_again_and_left_alone_when_it_does_not_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store" / usage.LEDGER_DIR / usage.LEDGER_FILE
    ledger = UsageLedger.open(path)
    assert ledger.broken is None and ledger.totals({}) is None
    ledger.add(rec(input_tokens=100, cache_read_tokens=20, output_tokens=8, model="m"))
    ledger.add(rec(input_tokens=100, cache_read_tokens=20, output_tokens=8, model="m"))
    assert os.stat(path).st_mode & 0o777 == 0o600
    again = UsageLedger.open(path)
    prices = {"m": PriceConfig(input=1000.0, output=5000.0, cache_read=100.0)}
    assert again.totals(prices) == usage.Totals(2, 240, 16, 0.284)
    assert again.totals({}) == usage.Totals(2, 240, 16, None)
    path.write_bytes(path.read_bytes() + b"junk\n")
    broken = UsageLedger.open(path)
    assert broken.broken is not None and "line 3" in broken.broken
    before = path.read_bytes()
    broken.add(rec(input_tokens=1))
    assert path.read_bytes() == before and broken.totals({}) is None


def test_folding_keeps_the_totals_and_the_last_day(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = format_instant(datetime.now(UTC) - timedelta(days=2))
    new = format_instant(datetime.now(UTC))
    records = [
        UsageRecord(at=old, input_tokens=1, output_tokens=2, model="a"),
        UsageRecord(at=old, input_tokens=3, output_tokens=4, model="b"),
        UsageRecord(at=old, input_tokens=5, output_tokens=6, model="a"),
        UsageRecord(at=new, input_tokens=7, output_tokens=8, model="a"),
    ]
    folded = usage.fold(records, before=datetime.now(UTC) - timedelta(days=1))
    assert folded == [
        UsageRecord(at=old, input_tokens=6, output_tokens=8, model="a", turns=2),
        UsageRecord(at=old, input_tokens=3, output_tokens=4, model="b"),
        records[3],
    ]
    # At the cap, the file folds what is older than a day and stays under it.
    path = tmp_path / "l" / "turns.jsonl"
    monkeypatch.setattr(usage, "LEDGER_CAP", len(encode_records(records)) + 10)
    ledger = UsageLedger(path, records, None)
    ledger.add(UsageRecord(at=new, input_tokens=1, output_tokens=1, model="a"))
    assert len(ledger.records()) == 4
    assert ledger.totals({}) == usage.Totals(5, 17, 21, None)
    assert decode_records(path.read_bytes(), where="l") == ledger.records()
    turns, tokens = ledger.since(datetime.now(UTC) - timedelta(hours=1))
    assert (turns, tokens) == (2, 17)


# -- prices ------------------------------------------------------------------------------------


def test_prices_are_read_strictly_and_a_bad_entry_is_named(tmp_path: Path) -> None:
    (tmp_path / "cotal.toml").write_text(
        '[prices."claude-sonnet-4-5"]\ninput = 3.0\noutput = 15\ncache_read = 0.3\n'
    )
    assert load_config(tmp_path).prices == {
        "claude-sonnet-4-5": PriceConfig(input=3.0, output=15.0, cache_read=0.3)
    }
    for body, said in [
        ('[prices."m-1"]\ninput = 1\noutptu = 2\n', "unknown field `outptu`"),
        ('[prices."m-1"]\ninput = 1\n', "missing required field `output`"),
        ('[prices."m-1"]\ninput = -1\noutput = 2\n', "Expected `float` >= 0.0"),
        ('[prices."m-1"]\ninput = 1\noutput = 20000\n', "<= 10000.0"),
    ]:
        (tmp_path / "cotal.toml").write_text(body)
        with pytest.raises(Refusal) as caught:
            load_config(tmp_path)
        assert caught.value.code == "bad-config"
        assert '[prices."m-1"]' in caught.value.message and said in caught.value.message
        assert "US dollars per million tokens" in caught.value.cure
    (tmp_path / "cotal.toml").write_text('[prices.""]\ninput = 1\noutput = 2\n')
    with pytest.raises(Refusal, match="not a model's name"):
        load_config(tmp_path)
