"""Prometheus metrics (issue 40, item 2): `cotal metrics` and `[metrics] listen`, read from a real
daemon over a real broker with real scribe seats.

The text is parsed with prometheus_client's own parser, and every value is checked exactly:
the seats by state against `cotal ps`, the turn counter and histogram against the turns asked
for, a dead letter against the seat's row, and a cut of one seat and its resume in place
against the cut's own result. The HTTP endpoint answers `GET /metrics` on loopback alone."""

from __future__ import annotations

import socket
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from manager.daemon.metrics import STATES
from tests.conftest import Cli
from tests.gitrepo import committed_repo
from tests.helpers import ask, ps_row, refused, wait_until

pytestmark = pytest.mark.anyio

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> tuple[list[str], Samples]:
    """The families' names, in order, and every sample by name and labels."""
    families, samples = [], {}
    for family in text_string_to_metric_families(text):
        families.append(family.name)
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return families, samples


def scrape(cli: Cli) -> Samples:
    return parse(cli.run("metrics").stdout)[1]


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def by_state(samples: Samples) -> dict[str, int]:
    return {state: int(value(samples, "cotal_seats", state=state)) for state in STATES}


def ps_states(cli: Cli) -> dict[str, int]:
    counted = Counter(row["state"] for row in cli.ps())
    return {state: counted.get(state, 0) for state in STATES}


def all_running(cli: Cli, names: set[str]) -> bool:
    rows = cli.ps()
    return {r["name"] for r in rows} == names and all(r["state"] == "running" for r in rows)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """One raw HTTP exchange: the status, the headers (lower-cased) and the body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    assert int(headers["content-length"]) == len(body)
    return int(status_line.split()[1]), headers, body


async def test_metrics_count_seats_turns_and_dead_letters_exactly(cli: Cli) -> None:
    # A cap of one: a message whose first delivery fails is a dead letter at once.
    (cli.root / "cotal.toml").write_text("[delivery]\nmax_deliveries = 1\n")
    cli.run("up", "--detach")
    try:
        cli.json("spawn", "alice", "--agent", "scribe")
        cli.json("spawn", "bob", "--agent", "scribe")
        first = scrape(cli)
        assert by_state(first) == ps_states(cli) == {**dict.fromkeys(STATES, 0), "running": 2}
        assert value(first, "cotal_seat_custody_generation", seat="alice") == 0
        assert ("cotal_seat_custody_generation", (("seat", "bob"),)) in first
        assert value(first, "cotal_manager_resident_memory_bytes") > 1024 * 1024
        assert value(first, "cotal_manager_start_time_seconds") > 1.7e9
        # No turn has run (the launch prompt is not a delivered message), and each seat's
        # series are there at 0 from its start.
        for name in ("cotal_deliveries_total", "cotal_redeliveries_total"):
            assert first[(name, (("seat", "alice"),))] == 0
        assert first[("cotal_turns_total", (("outcome", "ok"), ("seat", "bob")))] == 0
        assert first[("cotal_cuts_total", (("outcome", "sealed"), ("scope", "whole")))] == 0

        turns = 3
        for n in range(turns):
            assert ask(cli, "alice", f"hello {n}") == f"ack: hello {n}"
        after = scrape(cli)
        assert value(after, "cotal_turns_total", seat="alice", outcome="ok") == turns
        assert value(after, "cotal_turn_duration_seconds_count", seat="alice") == turns
        assert value(after, "cotal_turn_duration_seconds_sum", seat="alice") > 0
        assert value(after, "cotal_turn_duration_seconds_bucket", seat="alice", le="+Inf") == turns
        assert value(after, "cotal_deliveries_total", seat="alice") == turns
        assert value(after, "cotal_redeliveries_total", seat="alice") == 0
        assert value(after, "cotal_dead_letters_total", seat="alice") == 0
        assert value(after, "cotal_turns_total", seat="bob", outcome="ok") == 0

        # bob's first delivery fails at the cap: a dead letter, and the harness restarted.
        cli.json("send", "bob", "#error-until:1 remember the phrase lead-kite-4")
        await wait_until(
            lambda: ps_row(cli, "bob")["deadLetters"] == 1 and all_running(cli, {"alice", "bob"}),
            timeout=60,
            every=0.2,
        )
        dead = scrape(cli)
        assert value(dead, "cotal_dead_letters_total", seat="bob") == 1
        assert (
            value(dead, "cotal_seat_dead_letters", seat="bob") == ps_row(cli, "bob")["deadLetters"]
        )
        assert value(dead, "cotal_seat_dead_letters", seat="alice") == 0
        assert value(dead, "cotal_turns_total", seat="bob", outcome="failed") == 1
        assert value(dead, "cotal_turns_total", seat="bob", outcome="ok") == 0
        assert value(dead, "cotal_turn_duration_seconds_count", seat="bob") == 1
        assert value(dead, "cotal_deliveries_total", seat="bob") == 1
        assert value(dead, "cotal_redeliveries_total", seat="bob") == 0
        assert by_state(dead) == ps_states(cli)
        # alice's counts did not move.
        assert value(dead, "cotal_turns_total", seat="alice", outcome="ok") == turns
        # The loop-lag task has measured by now (once a second), and it is small.
        await wait_until(
            lambda: value(scrape(cli), "cotal_manager_event_loop_lag_seconds_count") >= 1,
            timeout=10,
            every=0.2,
        )
        # `--json` carries the same text as one record.
        doc = cli.json("metrics")
        assert set(doc) == {"text"} and "# TYPE cotal_seats gauge" in doc["text"]
        # A removed seat's series go with it; the table's gauges follow the table.
        cli.run("rm", "bob")
        gone = scrape(cli)
        assert not [key for key in gone if ("seat", "bob") in key[1]]
        assert value(gone, "cotal_turns_total", seat="alice", outcome="ok") == turns
        assert by_state(gone) == ps_states(cli) == {**dict.fromkeys(STATES, 0), "running": 1}
    finally:
        cli.run("down", check=False)


@pytest.mark.usefixtures("isolated_home")
async def test_a_cut_of_one_seat_and_its_resume_in_place_are_counted(cli: Cli) -> None:
    shared = committed_repo(cli.root / "shared")
    cli.run("up", "--detach")
    try:
        for name in ("a", "b"):
            cli.json("spawn", name, "--agent", "scribe", "--cwd", str(shared))
        assert ask(cli, "b", "before the cut") == "ack: before the cut"
        before = scrape(cli)
        assert value(before, "cotal_cuts_total", scope="seats", outcome="sealed") == 0
        assert value(before, "cotal_seat_custody_generation", seat="b") == 0

        cut = cli.json("down", "--preserve-state", "--seat", "b")
        assert (cut["partial"], cut["sealed"]) == (True, True), cut
        cutting = scrape(cli)
        assert value(cutting, "cotal_cuts_total", scope="seats", outcome="sealed") == 1
        assert value(cutting, "cotal_cuts_total", scope="seats", outcome="failed") == 0
        assert value(cutting, "cotal_cut_duration_seconds_count", scope="seats") == 1
        assert value(cutting, "cotal_cut_duration_seconds_sum", scope="seats") > 0
        # b is stopped and carried by the checkpoint: gone from the table, not yet back.
        assert value(cutting, "cotal_seat_downtime_seconds_count", cause="cut") == 0
        assert by_state(cutting) == ps_states(cli) == {**dict.fromkeys(STATES, 0), "running": 1}
        assert ("cotal_seat_custody_generation", (("seat", "b"),)) not in cutting

        restored = cli.json("up", "--restore", cut["checkpointDir"])
        assert restored["adopted"] is True, restored
        back = scrape(cli)
        # One seat was down and is running here again: one downtime, under the next writer.
        assert value(back, "cotal_seat_downtime_seconds_count", cause="cut") == 1
        assert value(back, "cotal_seat_downtime_seconds_sum", cause="cut") > 0
        assert value(back, "cotal_seat_custody_generation", seat="b") == 1
        assert value(back, "cotal_seat_custody_generation", seat="a") == 0
        assert value(back, "cotal_cuts_total", scope="seats", outcome="sealed") == 1
        assert by_state(back) == ps_states(cli) == {**dict.fromkeys(STATES, 0), "running": 2}
        # b's turn counter is this manager's, kept across its cut.
        assert value(back, "cotal_turns_total", seat="b", outcome="ok") == 1
    finally:
        cli.run("down", check=False)


async def test_the_http_endpoint_serves_get_metrics_on_loopback_alone(cli: Cli) -> None:
    port = free_port()
    (cli.root / "cotal.toml").write_text(f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
    cli.run("up", "--detach")
    try:
        cli.json("spawn", "alice", "--agent", "scribe")
        assert ask(cli, "alice", "one turn") == "ack: one turn"
        status, headers, body = http(
            port, b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/plain\r\n\r\n"
        )
        assert status == 200
        assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        served_families, served = parse(body.decode())
        cli_families, _ = parse(cli.run("metrics").stdout)
        assert served_families == cli_families
        assert {
            "cotal_seats",
            "cotal_turns",
            "cotal_turn_duration_seconds",
            "cotal_deliveries",
            "cotal_redeliveries",
            "cotal_dead_letters",
            "cotal_cuts",
            "cotal_cut_duration_seconds",
            "cotal_seat_downtime_seconds",
            "cotal_moves_in",
            "cotal_move_adoption_seconds",
            "cotal_seat_custody_generation",
            "cotal_seat_dead_letters",
            "cotal_manager_resident_memory_bytes",
            "cotal_manager_start_time_seconds",
            "cotal_manager_event_loop_lag_seconds",
        } <= set(served_families)
        assert by_state(served) == ps_states(cli)
        assert value(served, "cotal_turns_total", seat="alice", outcome="ok") == 1

        assert http(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 404
        assert http(port, b"GET /metricsx HTTP/1.1\r\n\r\n")[0] == 404
        assert http(port, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")[0] == 405
        assert http(port, b"nonsense\r\n\r\n")[0] == 400
        too_big = b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * 20_000 + b"\r\n\r\n"
        assert http(port, too_big)[0] == 431
        # A query string is the same path.
        assert http(port, b"GET /metrics?x=1 HTTP/1.1\r\n\r\n")[0] == 200
    finally:
        cli.run("down", check=False)


@pytest.mark.parametrize(
    ("listen", "said"),
    [
        ("0.0.0.0:9999", "0.0.0.0 is not a loopback address"),
        ("192.0.2.7:9464", "192.0.2.7 is not a loopback address"),
        ("localhost:9464", "'localhost' is not an IP address"),
        ("127.0.0.1:0", "port 0 is not between 1 and 65535"),
    ],
)
def test_a_listen_address_off_loopback_is_refused_at_up(cli: Cli, listen: str, said: str) -> None:
    (cli.root / "cotal.toml").write_text(f'[metrics]\nlisten = "{listen}"\n')
    out = cli.run("up", "--detach", "--json", check=False)
    message = refused(out, "bad-config")
    assert message == (
        f"{cli.root / 'cotal.toml'} [metrics] listen = '{listen}': {said}; the metrics are "
        "served on loopback only, for a scraper on this host; listen on a loopback address and "
        'a free port, such as listen = "127.0.0.1:9464" or "[::1]:9464", and scrape it from '
        "this host (or remove [metrics] listen; `cotal metrics` prints the same text)"
    )
    # Nothing was started.
    assert not (cli.root / ".cotal" / "mesh.json").exists()
