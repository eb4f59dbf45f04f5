"""The pi connector: pi in RPC mode, driven over JSON lines on stdio.

Sessions are opened by file path, never by id prefix; the files, the fresh-session header and
the flags are explained in docs/design.md, "The harness connectors, in detail", pi.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import msgspec

from connectors.base import (
    ByteReceive,
    ByteSend,
    Capabilities,
    FileMove,
    LaunchOpts,
    LaunchSpec,
    Relocation,
    SessionMove,
    StoreDecl,
    TurnOutcome,
    TurnUsage,
    model_name,
    token_count,
)
from connectors.doctorkit import (
    HarnessCheck,
    Missing,
    Pins,
    pinned_or_configured,
    probe_env,
    version_run,
)
from connectors.driverkit import HarnessGone as HarnessGone
from connectors.driverkit import JsonStdioDriver, Turn, unavailable_outcome
from connectors.launchkit import (
    UUID_RE,
    base_env,
    check_prompt,
    configured_binary,
    decode_config,
    drop_stale_pointer,
    endpoint_url,
    extra_env_names,
    key_env_name,
    launch_prompt,
    pinned_binary,
    refuse_resume_with_continuation,
    seat_files,
)
from connectors.privatefs import create_private_new, ensure_seat_dir, write_private_atomic
from protocol import instant, names
from protocol.errors import Refusal
from protocol.refusals import Code

NAME = "pi"
DEFAULT_PROVIDER = "cotal"
# The one provider API measured against pi 0.73.1 (OpenAI-compatible chat completions, SSE).
PROVIDER_API = "openai-completions"
# Placeholder sent as the bearer token when no key is configured; pi needs *some* apiKey to
# consider the provider configured. It is not a secret.
NO_KEY = "cotal-no-key"
# pi's session file format version this connector writes and reads headers of.
SESSION_VERSION = 3
HEADER_CAP = 64 * 1024
# cotal's mesh tools as a pi extension (pi loads TypeScript through jiti, no build step). It
# lives in cotal's own source, which the seat's sandbox grants read-only.
MESH_EXTENSION = Path(__file__).resolve().parent / "meshtool" / "pi_extension.ts"


class PiConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """`[agents.pi]`: the OpenAI-compatible endpoint and model, the provider entry's name, the
    variable holding the key, pi's cli.js, and variables passed through to the seat. Anything
    else is refused, because a setting silently dropped would not survive a crash restart."""

    base_url: str | None = None
    model: str | None = None
    provider: str | None = None
    api_key_env: str | None = None
    binary: str | None = None
    extra_env: list[str] = []


# A full agent_end line carries every message of the run (tool output included), so the line
# cap is generous; past it the driver stops rather than buffering without bound.
LINE_CAP = 64 * 1024 * 1024


# -- session files --------------------------------------------------------------------------------


def read_session_header(path: Path) -> dict[str, Any]:
    """Line 1 of a pi session file, which must be a v3 `session` header. Refuses symlinks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise Refusal(
            Code.BAD_SESSION,
            f"pi connector cannot open session file {path}: {exc.strerror}",
            "check the seat's session store",
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refusal(
                Code.BAD_SESSION,
                f"pi connector: session file {path} is not a regular file",
                "check the seat's session store",
            )
        head = os.read(fd, HEADER_CAP)
    finally:
        os.close(fd)
    line = head.split(b"\n", 1)[0]
    try:
        header = json.loads(line)
    except ValueError:
        header = None
    if (
        not isinstance(header, dict)
        or header.get("type") != "session"
        or not isinstance(header.get("id"), str)
    ):
        raise Refusal(
            Code.BAD_SESSION,
            f"pi connector: {path} does not start with a pi session header",
            "check the seat's session store; the file is not a pi session",
        )
    return header


def mint_session_id() -> str:
    """A UUIDv7 like the ones pi mints: 48-bit unix milliseconds, then random bits."""
    raw = bytearray((time.time_ns() // 1_000_000).to_bytes(6, "big") + secrets.token_bytes(10))
    raw[6] = 0x70 | (raw[6] & 0x0F)
    raw[8] = 0x80 | (raw[8] & 0x3F)
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# -- paths ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SeatPaths:
    pointer: Path
    store: Path
    agent: Path
    store_relpath: str


def seat_paths(opts: LaunchOpts) -> SeatPaths:
    # The store is the pointer's sibling by construction, so the driver can find the pointer
    # from the session file pi reports, with no per-launch state outside the files.
    files = seat_files(NAME, opts, ".store")
    return SeatPaths(
        pointer=files.pointer,
        store=files.store,
        agent=files.pointer.with_suffix(".agent"),
        store_relpath=files.store_relpath,
    )


def pointer_for_session_file(session_file: str | Path) -> Path | None:
    """The pointer path that belongs to a session file in a seat store (`<base>.store/x.jsonl`)."""
    store = Path(session_file).parent
    if store.suffix != ".store":
        return None
    return store.with_suffix(".json")


def find_session_file(store: Path, session_id: str) -> list[Path]:
    """Files of `store` named `<ts>_<session_id>.jsonl`: exact suffix match, no glob, no prefix."""
    suffix = f"_{session_id}.jsonl"
    try:
        names = sorted(e.name for e in os.scandir(store) if e.name.endswith(suffix))
    except FileNotFoundError:
        return []
    return [store / n for n in names]


# -- relocation -----------------------------------------------------------------------------------


def relocated_header(line: bytes, reloc: Relocation) -> bytes:
    """A session header line with its `cwd` (and a fork's `parentSession`) carried through the
    relocation; any other line, or a path no pair holds, comes back unchanged.

    pi runs a reopened session in the header's cwd and exits when that directory is missing, so
    the header must name the seat's new cwd (measured on 0.73.1: a rewritten header continues
    the same id and runs there)."""
    try:
        header = json.loads(line)
    except ValueError:
        return line
    if not isinstance(header, dict) or header.get("type") != "session":
        return line
    changed = False
    for key in ("cwd", "parentSession"):
        value = header.get(key)
        if isinstance(value, str) and value.startswith("/"):
            here = reloc.map(Path(os.path.normpath(value)))
            if here is not None and str(here) != value:
                header[key] = str(here)
                changed = True
    if not changed:
        return line
    # pi writes its lines as compact JSON (JSON.stringify): keep that spelling.
    return json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()


def relocate_pi_session(files: Sequence[str], reloc: Relocation) -> SessionMove:
    """Every session file of the flat store stays where it is; its header names the new cwd."""

    def head(line: bytes) -> bytes:
        return relocated_header(line, reloc)

    return SessionMove(
        files={f: FileMove(f, head) for f in files if "/" not in f and f.endswith(".jsonl")}
    )


# -- the connector --------------------------------------------------------------------------------


class PiConnector:
    name = NAME
    capabilities = Capabilities(
        supports_resume=True,
        supports_session_continuation=True,
        supports_fresh_start=True,
        supports_prompt=True,
    )
    config_type = PiConfig
    # The session-format versions measured besides the pin in harnesses.json (0.73.1, whose
    # session file is version 3): none yet. A destination resumes a pi session only at these.
    session_versions: tuple[str, ...] = ()

    def doctor(self, config: Mapping[str, Any], pins: Pins) -> HarnessCheck:
        check = HarnessCheck()
        _doctor(check, decode_config(NAME, config, PiConfig), pins)
        return pins.noted(check)

    # -- launch -----------------------------------------------------------------------------------

    def build_launch(self, opts: LaunchOpts) -> LaunchSpec:
        refuse_resume_with_continuation(NAME, opts)
        check_prompt(NAME, opts.prompt)
        cfg = _check_config(opts)
        paths = seat_paths(opts)
        cwd = Path(os.path.abspath(opts.cwd))
        env = base_env(opts, extra_allow=cfg.passthrough)
        argv = _program(cfg.binary, env)
        extension_args = _mesh_extension(opts)

        # Everything that can refuse is read-only and comes first, so a refusal changes nothing.
        expected: str | None = None
        if opts.continue_session:
            session_args = [
                "--session",
                str(_continuation_file(paths.store, opts.continue_session, cwd)),
            ]
            expected = opts.continue_session
        elif opts.resume:
            session_args = ["--fork", str(_fork_source(paths, opts.resume))]

        ensure_seat_dir(paths.pointer.parent, agent=NAME)
        ensure_seat_dir(paths.store, agent=NAME)
        ensure_seat_dir(paths.agent, agent=NAME)
        _write_agent_config(paths.agent, cfg)
        if not opts.continue_session:
            if not opts.resume:
                expected = mint_session_id()
                session_args = ["--session", str(_seed_fresh_session(paths.store, expected, cwd))]
            drop_stale_pointer(paths.pointer)

        argv += [
            "--mode",
            "rpc",
            "--offline",
            # Nothing pi would discover (the operator's ~/.pi, the project's .pi/) is loaded;
            # only the extension named here is, and only for a seat the manager serves the
            # mesh to.
            "--no-extensions",
            *extension_args,
            "--no-skills",
            "--no-prompt-templates",
            "--session-dir",
            str(paths.store),
            "--provider",
            cfg.provider,
            "--model",
            cfg.model,
            *session_args,
        ]
        env.update(
            PI_CODING_AGENT_DIR=str(paths.agent),
            PI_OFFLINE="1",
            PI_SKIP_VERSION_CHECK="1",
            PI_TELEMETRY="0",
        )
        return LaunchSpec(
            argv=argv,
            env=env,
            cwd=cwd,
            session_pointer_path=paths.pointer,
            session_store=(StoreDecl("workspace-root", paths.store_relpath),),
            # For a fresh seat this is the id the connector minted, so readiness proves pi
            # opened the seeded file rather than some other session.
            expected_session_id=expected,
            # pi's RPC mode ignores a prompt on its command line; the driver sends it as the
            # first turn once the session is known.
            initial_prompt=launch_prompt(opts),
        )

    def relocate_session(
        self, files: Sequence[str], reloc: Relocation, session_id: str | None
    ) -> SessionMove:
        return relocate_pi_session(files, reloc)

    def make_driver(self, stdin: ByteSend, stdout: ByteReceive, spec: LaunchSpec) -> PiDriver:
        return PiDriver(
            stdin,
            stdout,
            pointer_path=spec.session_pointer_path,
            expected_session_id=spec.expected_session_id,
            initial_prompt=spec.initial_prompt,
        )


@dataclass(frozen=True)
class _Config:
    base_url: str
    model: str
    provider: str
    api_key_env: str | None
    binary: str | None
    passthrough: tuple[str, ...]


def _check_config(opts: LaunchOpts) -> _Config:
    config = decode_config(NAME, opts.config, PiConfig)
    base_url = endpoint_url(
        NAME,
        config.base_url,
        otherwise=Refusal(
            Code.BAD_LAUNCH,
            "pi connector needs config base_url, an http(s) URL of an OpenAI-compatible endpoint "
            f"(got {config.base_url!r})",
            "set agents.pi.base_url in cotal.toml, e.g. http://127.0.0.1:8080/v1",
        ),
    )
    model = opts.model or config.model
    if not names.HARNESS_MODEL.matches(model):
        raise Refusal(
            Code.BAD_LAUNCH,
            f"pi connector needs a model id (letters, digits, ._:/@+-), got {model!r}",
            "pass --model or set agents.pi.model in cotal.toml",
        )
    provider = config.provider or DEFAULT_PROVIDER
    if not names.PROVIDER.matches(provider):
        raise Refusal(
            Code.BAD_LAUNCH,
            f"pi connector: provider {provider!r} is not a simple name",
            "use letters, digits, _ and -",
        )
    api_key_env = config.api_key_env
    passthrough: list[str] = []
    if api_key_env is not None:
        api_key_env = key_env_name(NAME, api_key_env, example="OPENAI_API_KEY")
        if not os.environ.get(api_key_env):
            # pi would send the variable's *name* as the key (its value resolution falls back
            # to the literal), which fails late and confusingly at the first turn.
            raise Refusal(
                Code.BAD_LAUNCH,
                f"pi connector: api_key_env names {api_key_env}, which is not set in the manager's "
                "environment",
                f"export {api_key_env} before starting the manager, or drop api_key_env",
            )
        passthrough.append(api_key_env)
    passthrough += [n for n in extra_env_names(NAME, config.extra_env) if not n.startswith("PI_")]
    binary = configured_binary(NAME, config.binary, what="pi's cli.js")
    return _Config(base_url, model, provider, api_key_env, binary, tuple(passthrough))


def _doctor(check: HarnessCheck, cfg: PiConfig, pins: Pins) -> None:
    program = pinned_or_configured(check, NAME, cfg.binary, pins)
    if program is None:
        return
    argv = [program]
    if program.endswith((".js", ".mjs")):
        node = shutil.which("node")
        if node is None:
            check.missing.append(
                Missing("node is not on PATH (pi runs on Node.js)", "install Node.js >= 20")
            )
            return
        argv = [node, program]
    with tempfile.TemporaryDirectory(prefix="cotal-doctor-") as tmp:
        env = probe_env(
            tmp,
            PI_CODING_AGENT_DIR=tmp,
            PI_OFFLINE="1",
            PI_SKIP_VERSION_CHECK="1",
            PI_TELEMETRY="0",
        )
        version_run(check, argv, env)
    if not cfg.base_url:
        check.missing.append(
            Missing(
                "pi has no model endpoint configured (agents.pi.base_url)",
                "set agents.pi.base_url and agents.pi.model in cotal.toml",
                "config",
            )
        )
    var = cfg.api_key_env
    if var and not os.environ.get(var):
        check.missing.append(
            Missing(
                f"{var} (the API key variable) is not set in this environment",
                f"export {var} before starting the manager, or name another variable with "
                "agents.pi.api_key_env",
                "config",
            )
        )


def _program(binary: str | None, env: Mapping[str, str]) -> list[str]:
    if binary is None:
        binary = pinned_binary(NAME)
    if not os.path.isfile(binary):
        raise Refusal(
            Code.NOT_INSTALLED,
            f"pi connector: binary {binary} does not exist",
            "run `python -m manager.cli.tools install` or fix agents.pi.binary",
        )
    if binary.endswith((".js", ".mjs")):
        # Run the entry script with an explicit node, not its `#!/usr/bin/env node` shebang, so
        # the seat's PATH cannot pick another interpreter.
        node = shutil.which("node", path=env.get("PATH"))
        if node is None:
            raise Refusal(
                Code.NO_NODE,
                "pi connector: node is not on the manager's PATH",
                "install Node.js >= 20",
            )
        return [node, binary]
    return [binary]


def _mesh_extension(opts: LaunchOpts) -> list[str]:
    """`--extension <cotal's mesh tools>` when the manager serves this seat a mesh socket. The
    extension finds the socket by `COTAL_MESH_DIR`, which base_env puts in pi's environment."""
    if opts.mesh_dir is None:
        return []
    if not MESH_EXTENSION.is_file():
        raise Refusal(
            Code.NOT_INSTALLED,
            f"pi connector: cotal's mesh extension {MESH_EXTENSION} is missing",
            "reinstall cotal (the file ships in connectors/meshtool/)",
        )
    return ["--extension", str(MESH_EXTENSION)]


def _write_agent_config(agent_dir: Path, cfg: _Config) -> None:
    """models.json and settings.json for pi's private agent dir, both 0600.

    `apiKey` holds the *name* of the environment variable (pi resolves a name to its value at
    request time), so no key value is ever written to disk.
    """
    models = {
        "providers": {
            cfg.provider: {
                "baseUrl": cfg.base_url,
                "api": PROVIDER_API,
                "apiKey": cfg.api_key_env or NO_KEY,
                # Generic OpenAI-compatible servers reject the `developer` role and
                # reasoning_effort; plain system messages work everywhere.
                "compat": {
                    "supportsDeveloperRole": False,
                    "supportsReasoningEffort": False,
                    "supportsStore": False,
                },
                "models": [
                    {
                        "id": cfg.model,
                        "name": cfg.model,
                        "reasoning": False,
                        "input": ["text"],
                        "contextWindow": 128000,
                        "maxTokens": 4096,
                        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                    }
                ],
            }
        }
    }
    settings = {
        "defaultProvider": cfg.provider,
        "defaultModel": cfg.model,
        "defaultThinkingLevel": "off",
        "enableInstallTelemetry": False,
        "quietStartup": True,
        # With auto-retry on, pi emits agent_end for a failed attempt and may then retry it; an
        # agent_end would not be a terminal boundary. Off, every prompt ends in exactly one.
        "retry": {"enabled": False},
    }
    write_private_atomic(agent_dir / "models.json", json.dumps(models, indent=1).encode())
    write_private_atomic(agent_dir / "settings.json", json.dumps(settings, indent=1).encode())


def _check_session_id(session_id: str, what: str) -> None:
    if not UUID_RE.match(session_id):
        raise Refusal(
            Code.BAD_SESSION,
            f"pi connector: {what} {session_id!r} is not a full pi session id (a lowercase UUID)",
            "pass the full id exactly as recorded; pi would treat a partial id as a prefix and "
            "silently open the newest match",
        )


def _single_match(session_id: str, matches: list[Path], where: str) -> Path:
    if not matches:
        raise Refusal(
            Code.NO_SESSION,
            f"pi connector: no session file for id {session_id} in {where} (looked for "
            f"*_{session_id}.jsonl)",
            "restore the seat's session store (a checkpoint's harness store) or start the seat "
            "fresh",
        )
    if len(matches) > 1:
        raise Refusal(
            Code.AMBIGUOUS_SESSION,
            f"pi connector: session id {session_id} names {len(matches)} files: "
            f"{', '.join(map(str, matches))}",
            "remove the stale copies so exactly one file carries the id",
        )
    return matches[0]


def _continuation_file(store: Path, session_id: str, cwd: Path) -> Path:
    _check_session_id(session_id, "continueSession")
    path = _single_match(
        session_id, find_session_file(store, session_id), f"the seat's store {store}"
    )
    header = read_session_header(path)
    if header["id"] != session_id:
        raise Refusal(
            Code.SESSION_MISMATCH,
            f"pi connector: {path} is named for session {session_id} but its header says "
            f"{header['id']}",
            "the store was edited by hand; restore it from the checkpoint",
        )
    recorded = header.get("cwd")
    # pi runs a reopened session in the cwd its header recorded, not in the one it was
    # launched from, and exits if that directory is gone: both are refused here, by name.
    if not isinstance(recorded, str) or not os.path.isdir(recorded):
        raise Refusal(
            Code.SESSION_CWD_MISSING,
            f"pi connector: session {session_id} was recorded in cwd {recorded!r}, which does not "
            "exist on this host",
            "restore the workspace at that path (same workspace root on both hosts)",
        )
    if os.path.realpath(recorded) != os.path.realpath(cwd):
        raise Refusal(
            Code.SESSION_CWD_MISMATCH,
            f"pi connector: session {session_id} was recorded in cwd {recorded}, but the seat's "
            f"cwd is {cwd}; pi would silently run in {recorded}",
            f"launch the seat with cwd {recorded}",
        )
    return path


def _fork_source(paths: SeatPaths, resume: str) -> Path:
    if resume.endswith(".jsonl") and os.path.isabs(resume):
        source = Path(resume)
        read_session_header(source)
        return source
    _check_session_id(resume, "resume")
    # The source may be this seat's own earlier session or another pi seat's in this workspace.
    stores = [paths.store] + sorted(
        p for p in paths.pointer.parent.glob("*.store") if p != paths.store and p.is_dir()
    )
    matches = [f for s in stores for f in find_session_file(s, resume)]
    source = _single_match(resume, matches, f"the pi stores under {paths.pointer.parent}")
    if read_session_header(source)["id"] != resume:
        raise Refusal(
            Code.SESSION_MISMATCH,
            f"pi connector: {source} is named for session {resume} but its header disagrees",
            "restore the store from the checkpoint",
        )
    return source


def _seed_fresh_session(store: Path, session_id: str, cwd: Path) -> Path:
    stamp = instant.now_iso()
    header = {
        "type": "session",
        "version": SESSION_VERSION,
        "id": session_id,
        "timestamp": stamp,
        "cwd": str(cwd),
    }
    path = store / f"{stamp.replace(':', '-').replace('.', '-')}_{session_id}.jsonl"
    create_private_new(path, (json.dumps(header, separators=(",", ":")) + "\n").encode())
    return path


# -- the driver -----------------------------------------------------------------------------------


class _Turn(Turn):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.started = False


class PiDriver(JsonStdioDriver[_Turn]):
    """pi's RPC protocol over JSON lines (LF-framed; docs/rpc.md of the pinned package).

    Responses are routed by the `id` we put on each command. Agent events carry no id, so
    prompts are strictly serialized and a turn is the one `agent_start` .. `agent_end` that
    follows our accepted prompt, checked against the user text it carries.
    """

    who = NAME

    def __init__(
        self,
        stdin: ByteSend,
        stdout: ByteReceive,
        *,
        pointer_path: Path | None = None,
        expected_session_id: str | None = None,
        initial_prompt: str | None = None,
        line_cap: int = LINE_CAP,
    ) -> None:
        super().__init__(
            stdin,
            stdout,
            pointer_path=pointer_path,
            expected_session_id=expected_session_id,
            initial_prompt=initial_prompt,
            line_cap=line_cap,
        )
        self.session_file: str | None = None

    # -- reader ---------------------------------------------------------------------------------

    async def _handle(self, line: bytes) -> None:
        event = self._decode(line)
        if event is None:
            return
        kind = event.get("type")
        if kind == "response":
            if (
                not self._pending.resolve(str(event.get("id")), event)
                and event.get("success") is False
            ):
                self._note(f"pi rejected a command: {event.get('error')}")
        elif kind == "agent_start":
            if self._turn is not None:
                self._turn.started = True
        elif kind == "agent_end":
            if self._turn is not None and self._turn.started:
                self._turn.end.resolve(event)
        elif kind == "extension_ui_request" and event.get("method") in (
            "select",
            "confirm",
            "input",
            "editor",
        ):
            # The one extension loaded (cotal's mesh tools) opens no dialog; should one appear
            # anyway, dismiss it so pi never blocks waiting for a human who is not there.
            await self._send(
                {"type": "extension_ui_response", "id": event.get("id"), "cancelled": True}
            )

    # -- commands -------------------------------------------------------------------------------

    async def _command(self, kind: str, **fields: Any) -> dict[str, Any] | None:
        """Send one command and wait for its response; None when pi is gone."""
        return await self._request(kind, lambda cid: {"id": cid, "type": kind, **fields})

    async def get_state(self) -> str | None:
        """The session id pi reports now (and its file); writes the pointer once pi has proved
        it."""
        response = await self._command("get_state")
        if response is None:
            raise self._gone("query pi's state")
        if not response.get("success"):
            raise Refusal(
                Code.HARNESS_ERROR,
                f"pi connector: pi refused get_state: {response.get('error')}",
                "read the seat's log",
            )
        data = response.get("data") or {}
        sid, sfile = data.get("sessionId"), data.get("sessionFile")
        self.session_id = sid if isinstance(sid, str) and sid else None
        self.session_file = sfile if isinstance(sfile, str) and sfile else None
        await self._write_pointer("running")
        self.state_known.set()
        return self.session_id

    async def _write_pointer(
        self, status: Literal["running", "quit"], *, reopenable: Callable[[], bool] | None = None
    ) -> None:
        # The pointer must only ever name a session that can be reopened by its file.
        sfile = self.session_file
        if sfile is not None:
            await super()._write_pointer(status, reopenable=lambda: os.path.isfile(sfile))

    # -- turns ----------------------------------------------------------------------------------

    async def _learn_session(self) -> None:
        await self.state_known.wait()

    def _initial_ready(self) -> bool:
        return self.session_id is not None

    async def _turn_locked(self, text: str, message_id: str) -> TurnOutcome:
        if not self._reader.running:
            return TurnOutcome("unknown", detail=f"not delivered: {self._reader.detail}")
        turn = _Turn(text)
        self._turn = turn
        try:
            response = await self._command("prompt", message=text)
            if response is None:
                return TurnOutcome(
                    "unknown",
                    detail=f"pi did not acknowledge prompt {message_id}: {self._reader.detail}",
                )
            if not response.get("success"):
                return TurnOutcome(
                    "error", detail=f"pi refused prompt {message_id}: {response.get('error')}"
                )
            await turn.end.done.wait()
        finally:
            self._turn = None
        if turn.end.value is None:
            return TurnOutcome(
                "unknown", detail=f"turn {message_id} did not end: {self._reader.detail}"
            )
        outcome = replace(judge_turn(text, turn.end.value), usage=turn_usage(turn.end.value))
        # Every outcome that reached agent_end left a session file behind (pi persists on the
        # first assistant message, error or not); make the pointer durable before any ack.
        if self.session_id is None:
            try:
                await self.get_state()
            except Refusal:
                pass
        else:
            await self._write_pointer("running")
        return outcome


def _text_of(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def turn_usage(agent_end: Mapping[str, Any]) -> TurnUsage | None:
    """The tokens of one `agent_end`: pi puts each model call's `usage` (`input`, `output`,
    `cacheRead`, `cacheWrite`, as its provider reported them) and `model` on that call's
    assistant message, and the run's messages are this turn's alone. None when no assistant
    message carries a usage."""
    total: TurnUsage | None = None
    for message in agent_end.get("messages") or []:
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        usage = message.get("usage")
        if not isinstance(usage, dict):
            continue
        call = TurnUsage(
            input_tokens=token_count(usage.get("input")),
            output_tokens=token_count(usage.get("output")),
            cache_read_tokens=token_count(usage.get("cacheRead")),
            cache_write_tokens=token_count(usage.get("cacheWrite")),
            model=model_name(message.get("model")),
        )
        total = call if total is None else total.plus(call)
    return total


def judge_turn(sent: str, agent_end: Mapping[str, Any]) -> TurnOutcome:
    """Classify one `agent_end`. Only a run that carries our prompt and ends in a successful
    assistant message with some output is `ok`; everything else keeps the delivery."""
    messages = [m for m in agent_end.get("messages") or [] if isinstance(m, dict)]
    users = [m for m in messages if m.get("role") == "user"]
    if not users or _text_of(users[0]) != sent:
        return TurnOutcome("unknown", detail="agent_end does not carry the prompt that was sent")
    assistants = [m for m in messages if m.get("role") == "assistant"]
    if not assistants:
        return TurnOutcome("unknown", detail="pi ended the turn with no assistant message")
    final = assistants[-1]
    reason = final.get("stopReason")
    if reason == "error":
        # pi runs with its own retries off (see `_write_agent_config`), so a provider that is
        # down or rate limited ends the turn here, worded `503 ...`, `429 ...` or `Connection
        # error.`: the manager's backoff, not the delivery cap, rides that out.
        return unavailable_outcome(
            TurnOutcome("error", detail=str(final.get("errorMessage") or "provider error"))
        )
    if reason == "aborted":
        return TurnOutcome("aborted", detail=str(final.get("errorMessage") or "aborted"))
    if reason not in ("stop", "length"):
        return TurnOutcome("unknown", detail=f"pi ended the turn with stopReason {reason!r}")
    produced = any(
        (p.get("type") == "text" and str(p.get("text", "")).strip()) or p.get("type") == "toolCall"
        for m in assistants
        for p in (m.get("content") or [])
        if isinstance(p, dict)
    )
    if not produced:
        return TurnOutcome("unknown", detail="the model produced no output")
    detail = "reply truncated at the output limit (stopReason length)" if reason == "length" else ""
    return TurnOutcome("ok", reply=_text_of(final), detail=detail)
