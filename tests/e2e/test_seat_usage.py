"""What each seat costs (issue 40, item 3): real pi, Claude Code and Codex seats under real
managers, each against its fake model server, which reports the same fixed usage for every
call (tests/fixtures: `fake_openai.USAGE`, `fake_anthropic.START_USAGE`/`OUTPUT_TOKENS`,
`fake_responses.USAGE`). Each seat's tokens are read from what its harness reported, kept in its
usage ledger inside its session store, shown by `ps` (and `--wide` with the cost from
`[prices]`) and in each `turn.ended` event, and carried with the session: by `cotal move` to a
running manager (pi), and by a cut and `up --restore` at another path (Claude Code, Codex),
where the next turn adds to the carried totals."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from connectors.codex import pinned_program
from manager.daemon.usage import LEDGER_DIR, LEDGER_FILE, decode_records
from protocol.errors import Refusal
from protocol.instant import format_instant
from tests.conftest import PI_CLI, AnthropicServer, Cli, FakeServer
from tests.e2e.test_move import seat_repo, two_roots  # noqa: F401  (the fixture)
from tests.fixtures.fake_responses import ResponsesServer
from tests.gitrepo import committed_repo
from tests.harness import claude_installed
from tests.helpers import signer_key, wait_until
from tests.integration.test_metrics import scrape, value

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

PHRASE = "tally-usage-17"
KEYS = {
    "FAKE_ANTHROPIC_KEY": "sk-ant-fake-usage-key-0123456789",
    "FAKE_OPENAI_KEY": "sk-fake-codex-usage-key-0123456789",
}


def _codex_installed() -> bool:
    try:
        pinned_program()
        return True
    except Refusal:
        return False


# US dollars per million tokens: large, so each estimate is a short exact decimal.
PRICES = (
    '[prices."fake-model"]\ninput = 1000.0\noutput = 5000.0\ncache_read = 100.0\n'
    '[prices."claude-fake-1"]\ninput = 1000.0\noutput = 5000.0\ncache_read = 100.0\n'
    "cache_write = 2000.0\n"
)


def usage_of(cli: Cli, name: str) -> tuple[int | None, int | None, float | None]:
    [row] = [r for r in cli.ps() if r["name"] == name]
    return row.get("tokensIn"), row.get("tokensOut"), row.get("costUsd")


def wide_cells(cli: Cli, name: str) -> tuple[str, str]:
    """The TOKENS and COST cells of `ps --wide` for seat `name`."""
    lines = cli.run("ps", "--wide").stdout.splitlines()
    head = lines[0]
    [line] = [ln for ln in lines[1:] if ln.split()[0] == name]
    start, cost, reason = head.index("TOKENS"), head.index("COST"), head.index("REASON")
    return line[start:cost].strip(), line[cost:reason].strip()


def ledger(root: Path, agent: str) -> list[Any]:
    [path] = (root / ".cotal/sessions" / agent).glob(f"*/{LEDGER_DIR}/{LEDGER_FILE}")
    return decode_records(path.read_bytes(), where=str(path))


def ended_tokens(cli: Cli, name: str) -> list[int | None]:
    out = cli.run("events", "--json", "--seat", name, "--since", "1h", "--until", "now")
    events = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    return [e["detail"].get("tokens") for e in events if e["type"] == "turn.ended"]


@pytest.mark.pi
@pytest.mark.skipif(
    not PI_CLI.is_file(), reason="pi is not installed under .tools/pi (make harnesses)"
)
async def test_a_pi_seats_usage_is_counted_priced_and_moves_with_it(
    two_roots: tuple[Cli, Cli],  # noqa: F811
    fake_openai: FakeServer,
) -> None:
    a, b = two_roots
    config = f'[agents.pi]\nbase_url = "{fake_openai.base_url}"\nmodel = "fake-model"\n'
    (a.root / "cotal.toml").write_text(config + PRICES)
    (b.root / "cotal.toml").write_text(config)
    seat = a.json("spawn", "coder", "--agent", "pi", "--cwd", str(seat_repo(a, "coder")))
    assert usage_of(a, "coder") == (None, None, None)
    assert wide_cells(a, "coder") == ("-", "-")
    assert a.json("send", "coder", f"Remember the phrase {PHRASE}.", "--wait")["reply"] == (
        f"Noted: {PHRASE}."
    )
    assert a.json("send", "coder", "What was the phrase?", "--wait")["reply"] == (
        f"The phrase is {PHRASE}."
    )
    # Each call: 120 prompt tokens, 20 of them cached, 8 out; pi reports 100 + 20 cache read.
    # Cost per turn: (100 * 1000 + 20 * 100 + 8 * 5000) / 1e6 = 0.142.
    assert usage_of(a, "coder") == (240, 16, 0.284)
    assert wide_cells(a, "coder") == ("240/16", "$0.2840")
    assert ended_tokens(a, "coder") == [128, 128]
    assert [(r.input_tokens, r.cache_read_tokens, r.output_tokens, r.model) for r in
            ledger(a.root, "pi")] == [(100, 20, 8, "fake-model")] * 2  # fmt: skip

    b.run("trust", "add", signer_key(a.root), "--name", "host-a")
    moved = a.json("move", "coder", "--to", b.json("status")["instanceId"])
    assert [s["lifecycleUid"] for s in moved["seats"]] == [seat["lifecycleUid"]]
    # B has no price for the model: the tokens travelled, the cost is unknown there.
    assert usage_of(b, "coder") == (240, 16, None)
    assert wide_cells(b, "coder") == ("240/16", "-")
    assert b.json("send", "coder", "What was the phrase?", "--wait")["reply"] == (
        f"The phrase is {PHRASE}."
    )
    assert usage_of(b, "coder") == (360, 24, None)
    assert len(ledger(b.root, "pi")) == 3
    # A price written while the manager runs is read by the next `ps`.
    (b.root / "cotal.toml").write_text(config + PRICES)
    assert usage_of(b, "coder") == (360, 24, 0.426)


def claude_config(server: AnthropicServer) -> str:
    return (
        f'[agents.claude]\nbase_url = "{server.base_url}"\nmodel = "claude-fake-1"\n'
        'api_key_env = "FAKE_ANTHROPIC_KEY"\n'
    )


def codex_config(server: ResponsesServer) -> str:
    return (
        f'[agents.codex]\nbase_url = "{server.base_url}"\nmodel = "fake-model"\n'
        'api_key_env = "FAKE_OPENAI_KEY"\n'
    )


# Per turn, as each harness reports it: Claude Code 300 uncached + 40 cache read + 10 cache
# written in, 12 out; Codex 200 in of which 50 cached, 9 out.
CASES = {
    # (tokens in, tokens out, cost) per turn at PRICES:
    # Claude (300 * 1000 + 40 * 100 + 10 * 2000 + 12 * 5000) / 1e6 = 0.384;
    # Codex (150 * 1000 + 50 * 100 + 9 * 5000) / 1e6 = 0.2.
    "claude": (350, 12, 0.384),
    "codex": (200, 9, 0.2),
}


@pytest.mark.parametrize(
    "agent",
    [
        pytest.param(
            "claude",
            marks=[
                pytest.mark.claude,
                pytest.mark.skipif(not claude_installed(), reason="Claude Code is not installed"),
            ],
        ),
        pytest.param(
            "codex",
            marks=pytest.mark.skipif(not _codex_installed(), reason="Codex is not installed"),
        ),
    ],
)
async def test_claude_and_codex_usage_is_carried_by_a_cut_and_a_restore(
    agent: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    if agent == "claude":
        server: Any = request.getfixturevalue("fake_anthropic")
        config = claude_config(server)
    else:
        server = request.getfixturevalue("fake_responses")
        config = codex_config(server)
    per_in, per_out, per_cost = CASES[agent]
    a = Cli(committed_repo(tmp_path / "A" / "ws"))
    dest = Cli(tmp_path / "B" / "w2")
    (a.root / "cotal.toml").write_text(config + PRICES)
    a.run("up", "--detach", env=KEYS)
    row = a.json("spawn", "worker", "--agent", agent)
    assert a.json("send", "worker", f"Remember the phrase {PHRASE}.", "--wait")["reply"] == (
        f"Noted: {PHRASE}."
    )
    assert a.json("send", "worker", "What was the phrase?", "--wait")["reply"] == (
        f"The phrase is {PHRASE}."
    )
    assert usage_of(a, "worker") == (2 * per_in, 2 * per_out, round(2 * per_cost, 6))
    assert ended_tokens(a, "worker") == [per_in + per_out] * 2

    cut = json.loads(a.run("down", "--preserve-state", "--json").stdout)
    key = signer_key(a.root)
    carried = tmp_path / "carried" / Path(cut["checkpointDir"]).name
    shutil.copytree(cut["checkpointDir"], carried, symlinks=True)
    shutil.rmtree(a.root)
    dest.root.mkdir(parents=True)
    dest.run("trust", "add", key, "--name", "host-a")
    # Host B holds the same operator configuration (a checkpoint never carries settings).
    (dest.root / "cotal.toml").write_text(config + PRICES)
    result = json.loads(dest.run("up", "--restore", str(carried), "--json", env=KEYS).stdout)
    [obs] = result["seats"]
    assert obs["sessionBefore"] == obs["sessionAfter"] == row["sessionId"]
    assert usage_of(dest, "worker") == (2 * per_in, 2 * per_out, round(2 * per_cost, 6))
    assert dest.json("send", "worker", "What was the phrase?", "--wait")["reply"] == (
        f"The phrase is {PHRASE}."
    )
    assert usage_of(dest, "worker") == (3 * per_in, 3 * per_out, round(3 * per_cost, 6))
    assert len(ledger(dest.root, agent)) == 3
    # The same figures for a scraper, carried turns included (prometheus-client's own parser).
    samples = scrape(dest)
    assert value(samples, "cotal_seat_tokens_total", seat="worker", kind="input") == 3 * per_in
    assert value(samples, "cotal_seat_tokens_total", seat="worker", kind="output") == 3 * per_out
    cost = value(samples, "cotal_seat_cost_usd_total", seat="worker")
    assert round(cost, 6) == round(3 * per_cost, 6)
    dest.run("down")


def events_of(cli: Cli, name: str, kind: str) -> list[dict[str, Any]]:
    out = cli.run("events", "--json", "--seat", name, "--since", "1h", "--until", "now")
    events = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    return [e for e in events if e["type"] == kind]


@pytest.mark.pi
@pytest.mark.skipif(
    not PI_CLI.is_file(), reason="pi is not installed under .tools/pi (make harnesses)"
)
async def test_a_seat_at_its_budget_keeps_its_mail_queued_until_lifted_or_raised(
    cli: Cli, fake_openai: FakeServer
) -> None:
    """Each pi turn here is 128 tokens. The seat's own limit of 200 tokens a day stops it after
    its second turn: a third message stays queued (the model is never called) until `cotal
    budget lift`; then the root's limit of 3 turns an hour stops it again, until cotal.toml
    raises it."""
    config = f'[agents.pi]\nbase_url = "{fake_openai.base_url}"\nmodel = "fake-model"\n'
    (cli.root / "cotal.toml").write_text(config + "[budget.seats.coder]\ntokens_per_day = 200\n")
    cli.run("up", "--detach")
    cli.json("spawn", "coder", "--agent", "pi")
    for n in (1, 2):
        assert cli.json("send", "coder", f"turn {n}", "--wait")["reply"] == "OK."
    [row] = cli.ps()
    assert row["tokensIn"] == 240 and row["tokensOut"] == 16
    assert row["budget"] == (
        "at budget: its tokens_per_day = 200, 256 used; resumes at "
        f"{tomorrow()} or `cotal budget lift`"
    )
    table = cli.run("ps").stdout
    assert "at budget" in table.splitlines()[1]
    assert f"coder: {row['budget']}" in table

    calls = len(fake_openai.requests())
    cli.run("send", "coder", "turn 3")
    await wait_until(lambda: bool(events_of(cli, "coder", "seat.budget_reached")), timeout=30)
    [reached] = events_of(cli, "coder", "seat.budget_reached")
    assert reached["detail"] == {"limit": "seat.tokens_per_day", "tokens": 256}
    await anyio.sleep(3)
    # Nothing was handed to the harness: the model was never called, the turn is not busy.
    assert len(fake_openai.requests()) == calls
    [row] = cli.ps()
    assert not row["busy"] and row["tokensIn"] == 240

    lifted = cli.run("budget", "lift", "coder").stdout
    assert lifted.strip() == (
        f"lifted seat.tokens_per_day for coder until {tomorrow()}; delivery resumes"
    )
    await wait_until(lambda: cli.ps()[0]["tokensIn"] == 360, timeout=30, every=0.2)
    assert len(fake_openai.requests()) == calls + 1
    assert [e["detail"] for e in events_of(cli, "coder", "seat.budget_resumed")] == [
        {"limit": "seat.tokens_per_day", "tokens": 256}
    ]
    assert cli.ps()[0].get("budget") is None
    assert "not at its budget" in cli.run("budget", "lift", "coder").stdout

    # The root's turns an hour: three turns ran this hour, so the next waits.
    (cli.root / "cotal.toml").write_text(
        config + "[budget]\nturns_per_hour = 3\n[budget.seats.coder]\ntokens_per_day = 200\n"
    )
    await wait_until(lambda: cli.ps()[0].get("budget") is not None, timeout=10, every=0.2)
    assert cli.ps()[0]["budget"].startswith("at budget: the root's turns_per_hour = 3, 3 used;")
    cli.run("send", "coder", "turn 4")
    await anyio.sleep(3)
    # Whether the limit was seen before the pull or with the message in hand, it is not run.
    assert len(fake_openai.requests()) == calls + 1
    assert [e["detail"] for e in events_of(cli, "coder", "seat.budget_reached")][1:] == [
        {"limit": "root.turns_per_hour"}
    ]
    assert not cli.ps()[0]["busy"]
    # Raised in cotal.toml: the seat looks again and its queued mail runs.
    (cli.root / "cotal.toml").write_text(
        config + "[budget]\nturns_per_hour = 10\n[budget.seats.coder]\ntokens_per_day = 200\n"
    )
    await wait_until(lambda: cli.ps()[0]["tokensIn"] == 480, timeout=30, every=0.2)
    assert cli.ps()[0].get("budget") is None
    cli.run("down")


@pytest.mark.pi
@pytest.mark.skipif(
    not PI_CLI.is_file(), reason="pi is not installed under .tools/pi (make harnesses)"
)
async def test_a_dollar_budget_stops_a_seat_at_its_estimated_cost(
    cli: Cli, fake_openai: FakeServer
) -> None:
    """Each pi turn here costs $0.142 at PRICES (100 tokens in at $1,000 a million, 20 read
    from the cache at $100, 8 out at $5,000). A seat's limit of $0.25 a day stops it after its
    second turn ($0.284): its next message waits, queued, until `cotal budget lift`."""
    config = f'[agents.pi]\nbase_url = "{fake_openai.base_url}"\nmodel = "fake-model"\n'
    (cli.root / "cotal.toml").write_text(
        config + PRICES + "[budget.seats.coder]\nusd_per_day = 0.25\n"
    )
    cli.run("up", "--detach")
    cli.json("spawn", "coder", "--agent", "pi")
    for n in (1, 2):
        assert cli.json("send", "coder", f"turn {n}", "--wait")["reply"] == "OK."
    [row] = cli.ps()
    assert row["costUsd"] == 0.284
    assert row["budget"] == (
        f"at budget: its usd_per_day = 0.25, 0.284 used; resumes at {tomorrow()} or "
        "`cotal budget lift`"
    )
    await wait_until(lambda: bool(events_of(cli, "coder", "seat.budget_reached")), timeout=30)
    [reached] = events_of(cli, "coder", "seat.budget_reached")
    assert reached["detail"] == {"limit": "seat.usd_per_day"}
    calls = len(fake_openai.requests())
    cli.run("send", "coder", "turn 3")
    assert cli.run("budget", "lift", "coder").stdout.strip() == (
        f"lifted seat.usd_per_day for coder until {tomorrow()}; delivery resumes"
    )
    await wait_until(lambda: cli.ps()[0]["tokensIn"] == 360, timeout=30, every=0.2)
    assert len(fake_openai.requests()) == calls + 1
    cli.run("down")


def tomorrow() -> str:
    day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return format_instant(day + timedelta(days=1))
