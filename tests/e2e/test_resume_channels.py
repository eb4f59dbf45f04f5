"""A seat's channels through a cut and a resume on another host against the same broker: the
resume entry carries `--subscribe` and `--allow-post` (pinned by the profile digest, so the
destination's `cotal.toml` cannot widen them), and the subscriber's `chathist_` frontier stays at
the broker, so a post made while the seat was cut is its turn after the resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from manager.broker import channels
from protocol import meshcall
from tests.conftest import Cli, SharedBroker
from tests.gitrepo import committed_repo, write
from tests.helpers import broker_at, carry_to_new_host, post_turns_acked, refused, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]


async def test_a_resumed_seat_keeps_its_channels_and_gets_a_post_made_while_cut(
    tmp_path: Path, cli: Cli, shared_broker: SharedBroker
) -> None:
    server = ["--server", shared_broker.url, "--creds", shared_broker.creds]
    cwd = cli.root / "proj"
    committed_repo(cwd)
    cli.run("up", "--detach", *server)
    cli.json("spawn", "b", "--cwd", str(cwd), "--subscribe", "plan")
    cli.json("spawn", "a", "--cwd", str(cwd), "--allow-post", "plan")
    uid_b = {r["name"]: r for r in cli.ps()}["b"]["lifecycleUid"]
    result = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    copy = carry_to_new_host(cli.root, Path(result["checkpointDir"]), tmp_path)
    write(cli.root / "cotal.toml", '[seats.a]\nallow_post = ["plan", "review"]\n')

    manifest = json.loads((copy / "manifest.json").read_text())
    doc = copy / manifest["resume"]["file"]
    sealed = doc.read_bytes()
    entries = {agent["name"]: agent["launch"] for agent in json.loads(sealed)["agents"]}
    assert entries["b"]["subscribe"] == ["plan"] and "allowPost" not in entries["b"]
    assert entries["a"]["allowPost"] == ["plan"] and "subscribe" not in entries["a"]
    altered = json.loads(sealed)
    [entry] = [agent for agent in altered["agents"] if agent["name"] == "a"]
    entry["launch"]["allowPost"] = ["plan", "review"]
    doc.write_text(json.dumps(altered))
    denied = cli.run("up", "--restore", str(copy), *server, "--json", check=False)
    assert "altered or damaged after it was sealed" in refused(denied, "integrity")
    doc.write_bytes(sealed)

    # No manager runs: a post made now (as another manager's seat would) waits in b's frontier.
    async with broker_at(shared_broker.url, shared_broker.creds) as js:
        post = meshcall.ChannelPost(
            id=meshcall.post_message_id("0" * 26, "e" * 32, 0),
            channel="plan",
            sender="a",
            text="remember the phrase posted-while-cut-5",
            sent_at="2026-12-03T18:00:00.000Z",
        )
        await channels.publish_post(js, "main", post)
        info = await js.consumer_info("CHAN_main", f"chathist_local-b-{uid_b}-plan")
        assert info.num_pending == 1

    cli.run("up", "--restore", str(copy), *server)
    rows = {r["name"]: r for r in cli.ps()}
    assert (rows["a"]["allowPost"], rows["b"]["subscribe"]) == (["plan"], ["plan"])
    assert rows["b"]["lifecycleUid"] == uid_b
    await wait_until(lambda: post_turns_acked(cli, "b") == 1, timeout=60)
    reply = cli.json("send", "b", "what was the phrase?", "--wait")["reply"]
    assert reply == "The phrase is posted-while-cut-5, from a on #plan."
    posted = cli.json("send", "a", "Post to #review: widened?", "--wait")["reply"]
    assert posted.startswith("Could not post to #review: refused post-not-allowed")
    cli.run("down")
