"""`make demo`: the two-host story on one machine, with readable output.

Host A and host B are two workspace roots at different absolute paths, each with its own
`HOME` and its own embedded broker; no `--server` anywhere. Nothing passes between them but the
packed checkpoint file and host A's signing key, which the operator reads on A (`cotal status
--json`) and trusts on B (`cotal trust add`). A message still queued at the fence on A is
answered on B. Prints every command with its output, then a PASS/FAIL table; exits non-zero on
any FAIL.

When `cotal doctor` on host A finds the pinned Codex CLI usable, a second seat, `coder --agent
codex`, runs beside the scribe seat, its model a fake Responses API (tests/fixtures/
fake_responses.py) started as a real process on 127.0.0.1 and named in both hosts' cotal.toml;
it is told its own phrase in its first turn and must answer it on B from the same thread under
the same lifecycle uid. Without Codex the demo says why in one line and runs the scribe story
alone. Likewise, when `cotal doctor` finds the pinned OpenCode usable, a seat `oc --agent
opencode` (driven over ACP) runs beside them, its model the fake OpenAI-compatible server
(tests/fixtures/fake_openai.py), and must answer its own phrase on B from the same session.

Then `cotal move`: a `cotal broker serve` process and two more roots, host C and host D, each
its own `HOME` and both up against that one broker. Seat `walker` moves from the running C to
the running D with one command at C, while `stay_c` on C and `stay_d` on D keep their processes
and answer mail sent during and right after the move.

Last, failover: host E (`[failover] enabled, after_s = 5`) and host F (`[failover] standby`) on
another broker. Host E's manager and seat are SIGKILLed; F takes `survivor` over on its own from
its standing checkpoint and it answers its phrase there; E, brought back, forgets the seat.

The demo ends with the console's picture of that fleet: E spawns a seat of its own, and its
`cotal console --web` (loopback, its key in E's `.cotal/console-web.url`) is loaded in headless
Chromium (/usr/bin/chromium, every background fetch off) until both hosts' seats are drawn, and
screenshot to `.demo/console.png`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PHRASE = "juniper-ledger-41"
QUEUED = "queued-at-the-fence-73"
CODEX_PHRASE = "cobalt-harbor-58"
OPENCODE_PHRASE = "osprey-harbor-41"
WALK_PHRASE = "heron-crossing-62"
MESH_PHRASE = "tern-relay-19"
SURVIVOR_PHRASE = "petrel-standing-39"
CODEX_KEY_VAR = "DEMO_CODEX_KEY"
# The fake model takes any key; the seat still needs one in the manager's environment.
CODEX_KEY = "sk-demo-not-a-real-key"
FAKE_RESPONSES = REPO / "tests" / "fixtures" / "fake_responses.py"
FAKE_OPENAI = REPO / "tests" / "fixtures" / "fake_openai.py"
OPENCODE_KEY_VAR = "DEMO_OPENCODE_KEY"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "demo",
    "GIT_AUTHOR_EMAIL": "demo@example.invalid",
    "GIT_COMMITTER_NAME": "demo",
    "GIT_COMMITTER_EMAIL": "demo@example.invalid",
}


def env(home: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith("COTAL_")}
    tools = os.environ.get("COTAL_TOOLS_DIR")
    return {
        **keep,
        **GIT_ENV,
        "HOME": str(home),
        **({"COTAL_TOOLS_DIR": tools} if tools else {}),
        # Both "hosts" of the demo share this machine's one clock, so a checkpoint's age is
        # judged against the clock that stamped it, synchronized or not.
        "COTAL_TEST_CLOCK_STATUS": "synchronized",
    }


class Host:
    def __init__(self, name: str, base: Path) -> None:
        self.name = name
        self.home = base / name / "home"
        self.root = base / name / "srv" / f"workspace-{name.lower()[-1]}"
        self.home.mkdir(parents=True)
        self.root.mkdir(parents=True)
        self.extra_env: dict[str, str] = {}

    def cotal(
        self, *args: str, check: bool = True, show: bool = True
    ) -> subprocess.CompletedProcess[str]:
        if show:
            print(f"\n[{self.name}]$ cotal {' '.join(args)}", flush=True)
        t0 = time.monotonic()
        proc = subprocess.run(
            # -I: run from the root, plain `-m` would import a `manager/` a seat left there.
            [sys.executable, "-I", "-m", "manager.cli", *args, "--root", str(self.root)],
            cwd=self.root,
            env={**env(self.home), **self.extra_env},
            capture_output=True,
            text=True,
            timeout=300,
        )
        if show:
            out = (proc.stdout + proc.stderr).rstrip()
            if out:
                print("  " + out.replace("\n", "\n  "))
            print(f"  ({time.monotonic() - t0:.2f}s, exit {proc.returncode})", flush=True)
        if check and proc.returncode != 0:
            raise SystemExit(f"demo failed at [{self.name}] cotal {' '.join(args)}")
        return proc

    def git(self, *args: str) -> str:
        return subprocess.run(
            ["git", *args],
            cwd=self.root,
            env=env(self.home),
            check=True,
            capture_output=True,
            text=True,
        ).stdout


def porcelain(host: Host) -> str:
    # The record's selection rule: the control directory is never part of the seat's tree.
    return host.git("status", "--porcelain", "--", ".", ":(exclude).cotal")


def tree_bytes(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in (".git", ".cotal")]
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def hooks(root: Path) -> dict[str, bool]:
    d = root / ".git" / "hooks"
    return {
        p.name: bool(p.stat().st_mode & stat.S_IXUSR)
        for p in sorted(d.iterdir())
        if not p.name.endswith(".sample")
    }


def session_texts(root: Path) -> str:
    """Everything the scribe seat stored under a root, as text."""
    return "\n".join(
        p.read_text(errors="replace")
        for p in (root / ".cotal" / "sessions").rglob("*")
        if p.is_file()
    )


class FakeModel:
    """A fake model server (tests/fixtures/fake_responses.py for codex, fake_openai.py for
    opencode) as a process: it binds 127.0.0.1 and prints its port."""

    def __init__(self, log: Path, agent: str = "codex") -> None:
        self.agent = agent
        self.key_var = CODEX_KEY_VAR if agent == "codex" else OPENCODE_KEY_VAR
        script = FAKE_RESPONSES if agent == "codex" else FAKE_OPENAI
        with log.with_suffix(".err").open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(script), "--port", "0", "--log", str(log)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        assert self.proc.stdout is not None
        port = self.proc.stdout.readline().strip()
        if not port.isdigit():
            self.stop()
            raise SystemExit(f"the fake {agent} model did not start; see {log.with_suffix('.err')}")
        self.base_url = f"http://127.0.0.1:{port}/v1"

    def config(self) -> str:
        return (
            f'[agents.{self.agent}]\nbase_url = "{self.base_url}"\nmodel = "fake-model"\n'
            f'api_key_env = "{self.key_var}"\n'
        )

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def unusable(a: Host, agents: tuple[str, ...]) -> dict[str, str | None]:
    """Why host A cannot run a seat of each agent, as one `cotal doctor` judges it; None for
    an agent it can run."""
    print("\n[host-A]$ cotal doctor --json", flush=True)
    proc = a.cotal("doctor", "--json", check=False, show=False)
    rows: dict[str, dict[str, Any]] = {}
    for line in proc.stdout.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        rows[row.get("name")] = row
    return {agent: why_unusable(agent, rows.get(agent), proc.returncode) for agent in agents}


def why_unusable(agent: str, row: dict[str, Any] | None, rc: int) -> str | None:
    if row is None:
        return f"cotal doctor reported no {agent} row (exit {rc})"
    if row["usable"]:
        print(f"  {agent} {row['version']} usable, continuity {row['continuity']}: {row['path']}")
        return None
    missing = row.get("missing") or []
    return str(missing[0]["problem"] if missing else row.get("note") or row["state"])


def make_workspace(a: Host, config: str = "") -> None:
    root = a.root
    a.git("init", "-q", "-b", "main")
    a.git("remote", "add", "origin", "https://git.example.invalid/team/project.git")
    (root / "cotal.toml").write_text('[carry]\ninclude = [".env"]\n' + config)
    (root / ".gitignore").write_text(".env\n")
    (root / "README.md").write_text("# demo project\n")
    (root / "app.py").write_text("print('v1')\n")
    a.git("add", "-A")
    a.git("commit", "-q", "-m", "first")
    for n in (1, 2):
        (root / "app.py").write_text(f"print('stashed {n}')\n")
        a.git("stash", "push", "-q", "-m", f"experiment {n}")
    (root / "app.py").write_text("print('v2, staged')\n")
    a.git("add", "app.py")
    (root / "app.py").write_text("print('v3, unstaged on top')\n")
    (root / "notes.txt").write_text("untracked notes\n")
    (root / ".env").write_text("DEMO_SETTING=carried-by-declaration\n")
    hook = root / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)


class Broker:
    """`cotal broker serve` as a process: the one broker two running roots share."""

    def __init__(self, base: Path) -> None:
        home, store = base / "home", base / "store"
        home.mkdir(parents=True)
        argv = ["broker", "serve", "--store-dir", str(store), "--json"]
        print(f"\n[broker]$ cotal {' '.join(argv)}", flush=True)
        with (base / "serve.err").open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-m", "manager.cli", *argv],
                cwd=base,
                env=env(home),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.stop()
            raise SystemExit(f"cotal broker serve did not start; see {base / 'serve.err'}")
        print("  " + line.rstrip(), flush=True)
        info = json.loads(line)
        self.url: str = info["url"]
        self.creds: str = info["creds"]

    def stop(self) -> None:
        print(f"\n[broker]$ kill -TERM {self.proc.pid}", flush=True)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def committed_repo(host: Host, where: str, note: str) -> Path:
    host.git("init", "-q", "-b", "main", where)
    repo = host.root / where
    (repo / "notes.txt").write_text(f"{note}\n")
    host.git("-C", where, "add", "-A")
    host.git("-C", where, "commit", "-q", "-m", note)
    return repo


def move_story(base: Path, checks: list[tuple[str, bool]]) -> None:
    """Seat `walker` moves from the running host C to the running host D on one broker."""
    print("\n== one seat moves between two running hosts on one broker", flush=True)
    broker = Broker(base / "broker")
    c, d = Host("host-C", base), Host("host-D", base)
    try:
        print(f"\n== host C at {c.root}, host D at {d.root}: both up against {broker.url}")
        for host in (c, d):
            committed_repo(host, ".", f"{host.name} project")
            host.cotal("up", "--detach", "--server", broker.url, "--creds", broker.creds)
        walker = json.loads(
            c.cotal(
                "spawn",
                "walker",
                "--agent",
                "scribe",
                "--cwd",
                str(committed_repo(c, "walker", "the walker's own repository")),
                "--json",
                "--prompt",
                f"Remember the phrase {WALK_PHRASE}.",
            ).stdout
        )
        stay = {
            "stay_c": json.loads(c.cotal("spawn", "stay_c", "--agent", "scribe", "--json").stdout),
            "stay_d": json.loads(d.cotal("spawn", "stay_d", "--agent", "scribe", "--json").stdout),
        }
        at: dict[str, Host] = {"stay_c": c, "stay_d": d}
        key = json.loads(c.cotal("status", "--json").stdout)["manager"]["publicKey"]
        to_d = json.loads(d.cotal("status", "--json").stdout)["manager"]["instanceId"]
        print(f"  host C's signing key {key}; host D's instance {to_d}")
        d.cotal("trust", "add", key, "--name", "host-c")

        argv = ["move", "walker", "--to", to_d, "--json"]
        print(f"\n[{c.name}]$ cotal {' '.join(argv)}   (runs while the next sends do)", flush=True)
        t0 = time.monotonic()
        move = subprocess.Popen(
            [sys.executable, "-I", "-m", "manager.cli", *argv, "--root", str(c.root)],
            cwd=c.root,
            env=env(c.home),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        during: dict[str, str] = {}
        moving: dict[str, bool] = {}
        for name, host in at.items():
            during[name] = host.cotal(
                "send", name, f"are you there, {name}, while walker moves?", "--wait"
            ).stdout.strip()
            moving[name] = move.poll() is None
        out, err = move.communicate(timeout=300)
        print(f"\n[{c.name}] cotal {' '.join(argv)}:")
        print("  " + (out + err).rstrip().replace("\n", "\n  "))
        print(f"  ({time.monotonic() - t0:.2f}s, exit {move.returncode})", flush=True)
        if move.returncode != 0:
            raise SystemExit(f"demo failed at [{c.name}] cotal {' '.join(argv)}")
        moved = json.loads(out)
        after = {
            name: host.cotal("send", name, f"and now, {name}?", "--wait").stdout.strip()
            for name, host in at.items()
        }
        on_c = {r["name"]: r for r in map(json.loads, c.cotal("ps", "--json").stdout.splitlines())}
        on_d = {r["name"]: r for r in map(json.loads, d.cotal("ps", "--json").stdout.splitlines())}
        reply = d.cotal("send", "walker", "What was the phrase?", "--wait").stdout.strip()
        rows = {**on_c, **on_d}
        [seat] = moved["seats"]
        there = on_d.get("walker", {})

        print("\n== move observations")
        print(f"  walker       C -> D ({to_d}), attempt {moved['attemptId']}")
        print(f"  lifecycle    {walker['lifecycleUid']} -> {there.get('lifecycleUid')}")
        print(f"  session id   {walker['sessionId']} -> {there.get('sessionId')}")
        print(f"  cwd          {walker['cwd']} -> {there.get('cwd')}")
        print(f"  phrase on D  {reply!r}")
        print(f"  downtime     {moved['downtimeMs']} ms (fence on C to running on D)")
        print(f"  total        {moved['totalMs']} ms")
        for name in at:
            print(
                f"  {name:<12} pid {stay[name]['pid']} -> {rows[name]['pid']}; "
                f"{during[name]!r} (move still running: {moving[name]}), {after[name]!r}"
            )
        checks += [
            ("move: walker answers its phrase on D", WALK_PHRASE in reply),
            (
                "move: walker keeps its lifecycle uid on D",
                walker["lifecycleUid"] == seat["lifecycleUid"] == there.get("lifecycleUid"),
            ),
            (
                "move: walker keeps its session id on D",
                walker["sessionId"] == seat["session"] == there.get("sessionId"),
            ),
            ("move: walker is gone from C's ps", sorted(on_c) == ["stay_c"]),
            ("move: the move reports its downtime", moved["downtimeMs"] > 0),
        ]
        for name in at:
            checks += [
                (
                    f"move: {name} kept its pid and answered right after the move",
                    rows[name]["pid"] == stay[name]["pid"] and bool(after[name]),
                ),
                (
                    f"move: {name} answered while `cotal move` ran on C",
                    bool(during[name]) and moving[name],
                ),
            ]
    finally:
        for host in (d, c):
            if (host.root / ".cotal" / "mesh.json").exists():
                host.cotal("down", check=False)
        broker.stop()


def takeover_story(base: Path, checks: list[tuple[str, bool]]) -> None:
    """Host E dies with its seat; host F, a standby on the same broker, runs it on its own."""
    print("\n== a host dies; a standby on the same broker takes its seat over", flush=True)
    broker = Broker(base / "broker-ef")
    e, f = Host("host-E", base), Host("host-F", base)
    # The label each manager's lease carries: the HOST column of `ps --fleet` and the console.
    e.extra_env, f.extra_env = {"COTAL_HOST_LABEL": "host-E"}, {"COTAL_HOST_LABEL": "host-F"}
    try:
        (e.root / "cotal.toml").write_text("[failover]\nenabled = true\nafter_s = 5\n")
        (f.root / "cotal.toml").write_text("[failover]\nstandby = true\n")
        for host in (e, f):
            committed_repo(host, ".", f"{host.name} project")
            host.cotal("up", "--detach", "--server", broker.url, "--creds", broker.creds)
        key = json.loads(e.cotal("status", "--json").stdout)["manager"]["publicKey"]
        f.cotal("trust", "add", key, "--name", "host-e")
        survivor = json.loads(
            e.cotal(
                "spawn", "survivor", "--agent", "scribe", "--cwd",
                str(committed_repo(e, "survivor", "the survivor's own repository")), "--json",
            ).stdout
        )  # fmt: skip
        e.cotal("send", "survivor", f"Remember the phrase {SURVIVOR_PHRASE}.", "--wait")
        status = json.loads(e.cotal("status", "--json").stdout)
        rows = [json.loads(x) for x in e.cotal("ps", "--json", show=False).stdout.splitlines()]
        pids = [int(status["pid"]), *(int(r["pid"]) for r in rows if r.get("pid"))]
        print(f"\n[host-E]$ kill -KILL {' '.join(map(str, pids))}   # the host dies", flush=True)
        t0 = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        f.cotal("ps", "--fleet")
        there: dict[str, Any] = {}
        while time.monotonic() - t0 < 120 and there.get("state") != "running":
            time.sleep(0.5)
            rows = [json.loads(x) for x in f.cotal("ps", "--json", show=False).stdout.splitlines()]
            there = next((r for r in rows if r["name"] == "survivor"), {})
        took = time.monotonic() - t0
        f.cotal("ps")
        reply = f.cotal("send", "survivor", "What was the phrase?", "--wait").stdout.strip()
        print(f"\n== takeover observations: running on F {took:.1f} s after host E died")
        print(f"  lifecycle    {survivor['lifecycleUid']} -> {there.get('lifecycleUid')}")
        print(f"  session id   {survivor['sessionId']} -> {there.get('sessionId')}")
        print(f"  phrase on F  {reply!r}")
        e.cotal("up", "--detach", "--server", broker.url, "--creds", broker.creds)
        left: list[str] = ["survivor"]
        while time.monotonic() - t0 < 180 and left:
            time.sleep(0.5)
            left = [
                json.loads(x)["name"]
                for x in e.cotal("ps", "--json", show=False).stdout.splitlines()
            ]
        e.cotal("ps")
        checks += [
            ("takeover: the standby runs the dead host's seat", there.get("state") == "running"),
            (
                "takeover: same lifecycle uid and session on F",
                survivor["lifecycleUid"] == there.get("lifecycleUid")
                and survivor["sessionId"] == there.get("sessionId"),
            ),
            ("takeover: the seat answers its phrase on F", SURVIVOR_PHRASE in reply),
            ("takeover: host E, back, forgets the seat", left == []),
        ]
        # The fleet as the console shows it: a seat on each host, both managers up.
        e.cotal("spawn", "watcher", "--agent", "scribe")
        console_picture(e, ["survivor", "watcher", "host-E", "host-F"], base, checks)
    finally:
        for host in (f, e):
            if (host.root / ".cotal" / "mesh.json").exists():
                host.cotal("down", check=False)
        broker.stop()


def console_picture(
    host: Host, names: list[str], base: Path, checks: list[tuple[str, bool]]
) -> None:
    """`cotal console --web` at `host`, loaded in headless Chromium until every one of `names`
    is drawn, screenshot to .demo/console.png."""
    shot = base / "console.png"
    print("\n== the fleet in the console: cotal console --web, seen by headless Chromium")
    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        print(f"  {chromium} is not installed (deploy/system-packages.sh installs it)")
        checks.append(("console: the web view draws the fleet's seats (no chromium)", False))
        return
    # tests/chromium.py drives the browser over DevTools, as the console's own test does.
    sys.path.insert(0, str(REPO))
    import anyio

    from tests.chromium import shoot

    argv = ["console", "--web", "--port", "0", "--json"]
    print(f"\n[{host.name}]$ cotal {' '.join(argv)}", flush=True)
    with (base / "console-web.err").open("w") as err:
        server = subprocess.Popen(
            [sys.executable, "-I", "-m", "manager.cli", *argv, "--root", str(host.root)],
            cwd=host.root,
            env={**env(host.home), **host.extra_env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    drawn, why = False, ""
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        print("  " + line.rstrip(), flush=True)
        served = json.loads(line)
        keyed = Path(served["keyFile"]).read_text().strip()
        t0 = time.monotonic()
        text = anyio.run(shoot, keyed, shot, base / "chromium-profile", names)
        drawn = all(name in text for name in names) and shot.stat().st_size > 0
        print(
            f"  {', '.join(names)} drawn on the page in {time.monotonic() - t0:.1f} s; "
            f"screenshot {shot} ({shot.stat().st_size} bytes)",
            flush=True,
        )
    except (OSError, ValueError, TimeoutError, RuntimeError) as exc:
        why = f"{type(exc).__name__}: {exc}"
        print(f"  the console's picture failed: {why[:2000]}", flush=True)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    checks.append((f"console: the web view draws both hosts' seats, screenshot {shot.name}", drawn))


def main() -> int:
    base = REPO / ".demo"
    if base.exists():
        shutil.rmtree(base)
    a, b = Host("host-A", base), Host("host-B", base)
    carried = base / "carried"
    carried.mkdir()
    checks: list[tuple[str, bool]] = []
    fake: FakeModel | None = None
    fake_oc: FakeModel | None = None
    try:
        print(f"== host A at {a.root}, host B at {b.root}: two roots, two brokers", flush=True)
        why_not = unusable(a, ("codex", "opencode"))
        if why_not["codex"] is None:
            fake = FakeModel(base / "fake-responses.jsonl")
            a.extra_env[CODEX_KEY_VAR] = b.extra_env[CODEX_KEY_VAR] = CODEX_KEY
            print(
                f"\n== a codex seat `coder` beside `default`; its model: a fake Responses API "
                f"at {fake.base_url}, named in both hosts' cotal.toml, the key in ${CODEX_KEY_VAR}"
            )
        else:
            print(f"\n== codex seat skipped: {why_not['codex']}")
        if why_not["opencode"] is None:
            fake_oc = FakeModel(base / "fake-openai.jsonl", "opencode")
            a.extra_env[OPENCODE_KEY_VAR] = b.extra_env[OPENCODE_KEY_VAR] = CODEX_KEY
            print(
                f"\n== an opencode seat `oc` beside them (ACP); its model: a fake "
                f"OpenAI-compatible server at {fake_oc.base_url}, the key in ${OPENCODE_KEY_VAR}"
            )
        else:
            print(f"\n== opencode seat skipped: {why_not['opencode']}")
        agents_config = "".join("\n" + f.config() for f in (fake, fake_oc) if f)
        print("\n== host A: a git workspace (remote, hook, two stashes, a declared .env)")
        make_workspace(a, agents_config)
        status_before, bytes_before = porcelain(a), tree_bytes(a.root)
        stash_before, hooks_before = a.git("stash", "list"), hooks(a.root)
        print("  " + status_before.rstrip().replace("\n", "\n  "))
        a.cotal("up", "--detach")
        spawned = json.loads(
            a.cotal(
                "spawn",
                "default",
                "--agent",
                "scribe",
                "--json",
                "--prompt",
                f"Remember the phrase {PHRASE}. Reply with it.",
            ).stdout
        )
        # A second seat that may send to `default` only: its permission travels with it.
        a.cotal("spawn", "teller", "--agent", "scribe", "--allow-send", "default")
        coder: dict[str, Any] = {}
        coder_on_a = ""
        if fake:
            coder = json.loads(
                a.cotal(
                    "spawn",
                    "coder",
                    "--agent",
                    "codex",
                    "--json",
                    "--prompt",
                    f"Remember the phrase {CODEX_PHRASE}. Reply with it.",
                ).stdout
            )
            # The cut below drains for at most 1 s; an answer queued behind the first turn is
            # how the operator knows that turn ended before it.
            coder_on_a = a.cotal("send", "coder", "What was the phrase?", "--wait").stdout.strip()
        oc: dict[str, Any] = {}
        oc_on_a = ""
        if fake_oc:
            oc = json.loads(
                a.cotal(
                    "spawn",
                    "oc",
                    "--agent",
                    "opencode",
                    "--json",
                    "--prompt",
                    f"Remember the phrase {OPENCODE_PHRASE}. Reply with it.",
                ).stdout
            )
            oc_on_a = a.cotal("send", "oc", "What was the phrase?", "--wait").stdout.strip()
        # A slow turn holds the seat's one in-flight slot, so the next message is still queued
        # when the cut fences delivery: it travels in the checkpoint.
        a.cotal("send", "default", "take your time #slow:4000")
        a.cotal("send", "default", f"a note {QUEUED}")
        cut = json.loads(
            a.cotal("down", "--preserve-state", "--drain-timeout", "1", "--json").stdout
        )
        unanswered_on_a = QUEUED not in session_texts(a.root)
        key = json.loads(a.cotal("status", "--json").stdout)["manager"]["publicKey"]
        print(f"  host A's signing key {key} (the operator carries it to B)")
        packed = carried / f"{cut['attemptId']}.tar"
        pack = json.loads(
            a.cotal("checkpoint", "pack", cut["checkpointDir"], "-o", str(packed), "--json").stdout
        )
        a.cotal("checkpoint", "list")
        on_b = b.root.parent / packed.name
        print(f"\n== copy the packed file to host B\n  cp {packed} {on_b}")
        shutil.copyfile(packed, on_b)
        copied = hashlib.sha256(on_b.read_bytes()).hexdigest()
        print(f"  sha256 {copied}  (pack printed {pack['sha256']})")

        print("\n== host B: its own path, its own embedded broker", flush=True)
        b.cotal("trust", "add", key, "--name", "host-a")
        if agents_config:
            # B's own bindings for the agents, which admission checks against the source's.
            print(
                f"  {b.root / 'cotal.toml'}:\n    " + agents_config.strip().replace("\n", "\n    ")
            )
            (b.root / "cotal.toml").write_text(agents_config.lstrip())
        resumed = json.loads(b.cotal("up", "--restore", str(on_b), "--json").stdout)
        seats = {s["name"]: s for s in resumed["seats"]}
        seat, theirs, ours = seats["default"], seats.get("coder", {}), seats.get("oc", {})
        b.cotal("ps", "--wide")
        reply = b.cotal("send", "default", "What was the phrase?", "--wait").stdout.strip()
        coder_on_b = (
            b.cotal("send", "coder", "What was the phrase?", "--wait").stdout.strip()
            if fake
            else ""
        )
        oc_on_b = (
            b.cotal("send", "oc", "What was the phrase?", "--wait").stdout.strip()
            if fake_oc
            else ""
        )
        print("\n== host B: seat to seat across the cut: teller tells default, as itself")
        told = b.cotal(
            "send", "teller", f"Tell default: remember the phrase {MESH_PHRASE}", "--wait"
        ).stdout.strip()
        from_teller = b.cotal("send", "default", "What was the phrase?", "--wait").stdout.strip()
        teller_row = {
            r["name"]: r for r in map(json.loads, b.cotal("ps", "--json").stdout.splitlines())
        }.get("teller", {})
        handled = session_texts(b.root)
        print("\n== host A: the handed-off checkpoint must not resume there")
        again = a.cotal("up", "--restore", cut["checkpointDir"], "--json", check=False)
        refused = json.loads(again.stderr.splitlines()[-1]) if again.returncode == 2 else {}
        print("\n== continuity observations")
        print(f"  session id   {seat['sessionBefore']} -> {seat['sessionAfter']}")
        print(f"  lifecycle    {seat['uidBefore']} -> {seat['uidAfter']}")
        print(f"  phrase       {reply!r}")
        if fake:
            print("  coder (codex)")
            print(f"    thread id  {theirs['sessionBefore']} -> {theirs['sessionAfter']}")
            print(f"    lifecycle  {theirs['uidBefore']} -> {theirs['uidAfter']}")
            print(f"    phrase     {coder_on_a!r} on A, {coder_on_b!r} on B")
        if fake_oc:
            print("  oc (opencode)")
            print(f"    session id {ours['sessionBefore']} -> {ours['sessionAfter']}")
            print(f"    lifecycle  {ours['uidBefore']} -> {ours['uidAfter']}")
            print(f"    phrase     {oc_on_a!r} on A, {oc_on_b!r} on B")
        checks += [
            ("packed digest matches the copy on B", copied == pack["sha256"]),
            (
                "same session id",
                seat["sessionBefore"] == spawned["sessionId"] == seat["sessionAfter"],
            ),
            (
                "same lifecycle uid",
                seat["uidBefore"] == spawned["lifecycleUid"] == seat["uidAfter"],
            ),
            ("the phrase is answered on B", PHRASE in reply),
            ("porcelain identical", porcelain(b) == status_before),
            ("worktree bytes identical", tree_bytes(b.root) == bytes_before),
            (
                "remote present",
                b.git("remote", "get-url", "origin").strip()
                == "https://git.example.invalid/team/project.git",
            ),
            ("hooks present and executable", hooks(b.root) == hooks_before == {"pre-commit": True}),
            ("stash list identical", b.git("stash", "list") == stash_before != ""),
            ("declared .env present", (b.root / ".env").is_file()),
            (
                "the queued message is answered on B",
                unanswered_on_a
                and sum(i["republished"] for i in resumed["inbox"]) >= 1
                and QUEUED in handled,
            ),
            ("host A refuses to resume (handed-off)", refused.get("code") == "handed-off"),
            (
                "teller's permission crossed the cut (it may send to default only)",
                teller_row.get("allowSend") == ["default"],
            ),
            (
                "teller's message is answered on B, naming teller as its sender",
                "delivered" in told and f"{MESH_PHRASE}, from teller" in from_teller,
            ),
        ]
        if fake:
            checks += [
                ("codex seat: the phrase is answered on A", CODEX_PHRASE in coder_on_a),
                (
                    "codex seat: same thread id",
                    theirs["sessionBefore"] == coder["sessionId"] == theirs["sessionAfter"],
                ),
                (
                    "codex seat: same lifecycle uid",
                    theirs["uidBefore"] == coder["lifecycleUid"] == theirs["uidAfter"],
                ),
                ("codex seat: the phrase is answered on B", CODEX_PHRASE in coder_on_b),
            ]
        if fake_oc:
            checks += [
                ("opencode seat: the phrase is answered on A", OPENCODE_PHRASE in oc_on_a),
                (
                    "opencode seat: same session id",
                    ours["sessionBefore"] == oc["sessionId"] == ours["sessionAfter"],
                ),
                (
                    "opencode seat: same lifecycle uid",
                    ours["uidBefore"] == oc["lifecycleUid"] == ours["uidAfter"],
                ),
                ("opencode seat: the phrase is answered on B", OPENCODE_PHRASE in oc_on_b),
            ]
    finally:
        for host in (b, a):
            if (host.root / ".cotal" / "mesh.json").exists():
                host.cotal("down", check=False)
        for f in (fake, fake_oc):
            if f:
                f.stop()
    move_story(base, checks)
    takeover_story(base, checks)
    print("\nRESULT")
    for name, ok in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    if not checks:
        print("  FAIL  the demo did not reach its observations")
    return 0 if checks and all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
