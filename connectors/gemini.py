"""The Gemini CLI connector: one long-lived `gemini --acp` process, driven over the Agent Client
Protocol (`connectors/acp.py`). This module holds what is Gemini CLI's own: its launch (offline,
configured from `[agents.gemini]`, its settings pinned where a workspace cannot override them),
its store (the seat's own `GEMINI_CLI_HOME`) and its quirks (the chat file named by the minute,
the project slug keyed by the absolute path). What was measured on the pinned version is in
docs/design.md, "Gemini CLI continuity".
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio

from connectors.acp import (
    LAUNCH_RECORD,
    AcpDriver,
    AcpHarness,
    EndpointLaunch,
    PermissionPolicy,
    PolicyMode,
    launch_record,
    policy_mode,
)
from connectors.base import (
    ByteReceive,
    ByteSend,
    Capabilities,
    LaunchOpts,
    LaunchSpec,
    StoreDecl,
    TurnOutcome,
    TurnUsage,
    token_count,
)
from connectors.doctorkit import (
    HarnessCheck,
    Missing,
    Pins,
    config_problem,
    pinned_or_configured,
    probe_env,
    version_run,
)
from connectors.interpreter import own_python
from connectors.launchkit import (
    KEY_FILE_CAP,
    KeyedEndpointConfig,
    base_env,
    check_prompt,
    configured_binary,
    decode_config,
    drop_stale_pointer,
    endpoint_url,
    key_source,
    launch_prompt,
    passthrough_names,
    pinned_binary,
    refuse_fork,
    seat_cwd,
    seat_files,
)
from connectors.launchkit import (
    ProviderKey as Key,
)
from connectors.launchkit import (
    resolve_key as resolve_provider_key,
)
from connectors.meshclient import MESH_DIR_ENV
from connectors.meshtool.mcp import SERVER_NAME as MESH_SERVER
from connectors.privatefs import ensure_seat_dir, read_stable, write_private_atomic
from protocol import names
from protocol.errors import Refusal
from protocol.refusals import Code

NAME = "gemini"
# Gemini CLI reads its key from GEMINI_API_KEY alone; the operator's own variable of that name
# never reaches a seat unless `[agents.gemini]` names it (base_env passes an allow-list only).
KEY_VAR = "GEMINI_API_KEY"
DEFAULT_KEY_ENV = "GEMINI_API_KEY"
DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com"
DEFAULT_MODEL = "gemini-2.5-flash"
# A Gemini CLI session id is a random UUID (measured on 0.61.0).
SESSION_ID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
# Inside the seat's store (its GEMINI_CLI_HOME): Gemini CLI's own directory.
GEMINI_DIR = ".gemini"
# The chat files: `<store>/.gemini/tmp/<project slug>/chats/session-<stamp>-<id[:8]>.jsonl`.
CHAT_PREFIX = "session-"
# The stamp a continued session's chat file carries instead of Gemini's minute: no clock
# writes it, so no start of Gemini CLI can name a file of its own the same (see `canonical`).
CANONICAL_STAMP = "cotal"
CHAT_CAP = 256 * 1024 * 1024
PROJECT_ROOT_FILE = ".project_root"
# In the seat's store: Gemini's id of the seat's session, when it is not the seat's own (see
# `prepare_continuation`).
ALIAS_FILE = "cotal-gemini-session.json"
SYSTEM_SETTINGS = "system-settings.json"
# What Gemini CLI would read of the host, each replaced by the seat's own empty file.
HOST_FILES = {
    "GEMINI_CLI_SYSTEM_SETTINGS_PATH": SYSTEM_SETTINGS,
    "GEMINI_CLI_SYSTEM_DEFAULTS_PATH": "system-defaults.json",
    "GEMINI_CLI_TRUSTED_FOLDERS_PATH": "trustedFolders.json",
}
SETTINGS = "settings.json"
# Gemini CLI's switches, as environment (the names are its own; measured on 0.61.0).
FIXED_ENV = {
    # One process: without it the entry script starts itself again as its child, for a bigger
    # heap, and the seat's pid would not be the harness's.
    "GEMINI_CLI_NO_RELAUNCH": "true",
    "GEMINI_TELEMETRY_ENABLED": "false",
    # No sandbox of Gemini's own (a container): the seat's is cotal's.
    "GEMINI_SANDBOX": "false",
    # The seat's own tree is trusted: Gemini CLI starts no stdio MCP server (the mesh tool) in
    # an untrusted folder. What a workspace's own settings may not change is pinned on the
    # command line and here.
    "GEMINI_CLI_TRUST_WORKSPACE": "true",
    "NO_COLOR": "1",
}
RESERVED_ENV = frozenset(
    {
        KEY_VAR,
        "GEMINI_CLI_HOME",
        "GOOGLE_GEMINI_BASE_URL",
        *HOST_FILES,
        *FIXED_ENV,
    }
)


def seat_settings(model: str, mesh_dir: Path | None = None) -> dict[str, Any]:
    """The seat's Gemini CLI settings (`<store>/.gemini/settings.json`, written at every launch):
    the key's auth type, the model, nothing sent home (usage statistics, telemetry, update
    checks), no session deleted by age (Gemini's default keeps 30 days, and its clean-up at
    start deletes a continued session's chat file: measured), every tool call asked of the
    seat's policy (no YOLO, no always-allow), no hooks, and commands run without a
    pseudo-terminal. What matters most is pinned again where no settings file reaches (the
    command line and the environment, `build_launch`): Gemini CLI takes its system settings
    only from a file owned by root in directories only root may write (measured), which a seat
    of an ordinary operator cannot have.

    With `mesh_dir`, the mesh tool: cotal's own MCP server (connectors/meshtool), the one every
    other seat is given, started by Gemini CLI as its child inside the seat's sandbox and
    reaching the manager through the seat's mesh socket. It is named here rather than in ACP's
    `mcpServers` because only a configured server can be `trust`ed: Gemini CLI asks permission
    for every call of an untrusted server's tools as a tool of kind `other` (measured on
    0.61.0), which the seat's policy refuses; the mesh's own rules (`--allow-send`) judge the
    call instead, in the manager. Its environment is named in full."""
    out: dict[str, Any] = {
        "security": {
            "auth": {"selectedType": "gemini-api-key"},
            "disableYoloMode": True,
            "disableAlwaysAllow": True,
        },
        "model": {"name": model},
        "general": {
            "enableAutoUpdate": False,
            "enableAutoUpdateNotification": False,
            "sessionRetention": {"enabled": False},
        },
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "hooksConfig": {"enabled": False},
        # Commands through child_process: a pseudo-terminal cannot be opened in the seat's
        # sandbox (node-pty answered `forkpty(3) failed.`, measured), and a seat has no user
        # at a terminal.
        "tools": {"shell": {"enableInteractiveShell": False}},
    }
    if mesh_dir is not None:
        python, *args = own_python("connectors.meshtool")
        out["mcpServers"] = {
            MESH_SERVER: {
                "command": python,
                "args": args,
                "env": {MESH_DIR_ENV: str(mesh_dir)},
                "trust": True,
            }
        }
    return out


# -- the store ------------------------------------------------------------------------------------


def gemini_dir(store: Path) -> Path:
    return store / GEMINI_DIR


def chats_dirs(store: Path) -> Iterator[Path]:
    top = gemini_dir(store) / "tmp"
    if not top.is_dir() or top.is_symlink():
        return
    for slug in sorted(top.iterdir()):
        chats = slug / "chats"
        if not slug.is_symlink() and chats.is_dir() and not chats.is_symlink():
            yield chats


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if isinstance(content, list):
        return "".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def _resumable_message(msg: Mapping[str, Any]) -> bool:
    """Gemini CLI's own rule (0.61.0, `isResumableMessageRecord`): a user message that is not
    its injected context or a command, or a model message that said or did something."""
    text = _content_text(msg.get("content")).strip()
    if msg.get("type") == "user":
        return bool(text) and not text.startswith(("/", "?", "<session_context>", "<hook_context>"))
    if msg.get("type") == "gemini":
        return bool(text or msg.get("toolCalls") or msg.get("thoughts"))
    return False


@dataclass(frozen=True)
class ChatFile:
    path: Path
    session_id: str
    # Messages Gemini CLI would load, replayed as it replays the file (its `$set` of the
    # messages replaces them, a `$rewindTo` cuts them back).
    messages: int
    resumable: bool


def read_chat(path: Path) -> ChatFile | None:
    """One chat file as Gemini CLI reads it, or None when it is not one (no session header)."""
    try:
        data = read_stable(path, cap=CHAT_CAP, what="gemini connector: chat file").data
    except (OSError, Refusal):
        return None
    session_id: str | None = None
    messages: dict[str, Mapping[str, Any]] = {}
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if isinstance(record.get("$rewindTo"), str):
            ids = list(messages)
            cut = ids.index(record["$rewindTo"]) if record["$rewindTo"] in ids else 0
            messages = {k: messages[k] for k in ids[:cut]}
        elif isinstance(record.get("id"), str):
            messages[record["id"]] = record
        elif isinstance(record.get("$set"), dict):
            replaced = record["$set"].get("messages")
            if isinstance(replaced, list):
                messages = {
                    m["id"]: m
                    for m in replaced
                    if isinstance(m, dict) and isinstance(m.get("id"), str)
                }
        elif isinstance(record.get("sessionId"), str) and session_id is None:
            session_id = record["sessionId"]
    if session_id is None:
        return None
    return ChatFile(
        path,
        session_id,
        len(messages),
        any(_resumable_message(m) for m in messages.values()),
    )


def chat_files(store: Path, session_id: str | None = None) -> list[ChatFile]:
    """The store's chat files (of `session_id` only, when given)."""
    out = []
    for chats in chats_dirs(store):
        suffix = f"-{session_id[:8]}.jsonl" if session_id else ".jsonl"
        for path in sorted(chats.iterdir()):
            name = path.name
            if not (name.startswith(CHAT_PREFIX) and name.endswith(suffix)):
                continue
            if path.is_symlink() or not path.is_file():
                continue
            chat = read_chat(path)
            if chat is not None and (session_id is None or chat.session_id == session_id):
                out.append(chat)
    return out


def has_session(store: Path, session_id: str) -> bool:
    """Whether the store holds a chat file of the session (Gemini CLI writes its header at
    `session/new`)."""
    return bool(chat_files(store, session_id))


def canonical(chats: Path, session_id: str) -> Path:
    """The name a continued session's chat file is given: `session-cotal-<id[:8]>.jsonl`.

    Gemini CLI names a new chat file by the minute and the id's first 8 characters, and a
    `session/load` opens a new one for the session before it reads the session (measured on
    0.61.0): a load in the minute the session was created therefore writes Gemini's fresh
    context over the session's own file, whose history is then lost for good. A file named
    without a minute is never one Gemini opens anew, so the load finds the history whole; the
    load's own new file holds only Gemini's context and is not a session Gemini lists."""
    return chats / f"{CHAT_PREFIX}{CANONICAL_STAMP}-{session_id[:8]}.jsonl"


def session_alias(store: Path, session_id: str) -> str:
    """Gemini CLI's id of the seat's session `session_id`: the same id, unless a continuation
    of a session that had taken no turn started Gemini anew (`ALIAS_FILE`)."""
    try:
        data = read_stable(store / ALIAS_FILE, cap=KEY_FILE_CAP, what="gemini connector").data
        alias = json.loads(data).get(session_id)
    except (OSError, ValueError, AttributeError, Refusal):
        return session_id
    return alias if isinstance(alias, str) and SESSION_ID_RE.match(alias) else session_id


def record_alias(store: Path, session_id: str, gemini_id: str) -> None:
    write_private_atomic(store / ALIAS_FILE, json.dumps({session_id: gemini_id}).encode())


def prepare_continuation(store: Path, session_id: str, cwd: Path) -> str | None:
    """Make the store's session loadable by a new Gemini CLI process in `cwd`: its chat file
    under the canonical name, the empty files of earlier starts and loads removed, and the
    project the file lies in keyed by `cwd` (a new path is a new project to Gemini CLI, which
    would look for the session in another directory). Returns Gemini's id of the session to
    load, or None when the session has taken no turn: Gemini CLI 0.61.0 cannot load such a
    session (it lists only sessions with a turn), and there is nothing in it to continue, so
    the driver opens a new one for the seat's session (`GeminiDriver`). Refuses `no-session`
    when the store holds no chat file of the session at all."""
    for path in (store, gemini_dir(store)):
        if path.is_symlink():
            raise Refusal(
                Code.UNSAFE_STORE,
                f"gemini connector: the seat's store {path} is a symlink",
                "replace it with the real directory (a checkpoint's harness store), or start "
                "the seat fresh",
            )
    gemini_id = session_alias(store, session_id)
    chats = chat_files(store, gemini_id)
    if not chats:
        raise Refusal(
            Code.NO_SESSION,
            f"gemini connector: cannot continue session {session_id} from {store}: the store "
            "holds no chat file of it",
            "restore the seat's session store (a checkpoint's harness store) or start the seat "
            "fresh",
        )
    loadable = [c for c in chats if c.resumable]
    chosen = max(
        loadable or chats,
        key=lambda c: (c.path.name.startswith(f"{CHAT_PREFIX}cotal-"), c.messages),
    )
    target = canonical(chosen.path.parent, gemini_id) if loadable else None
    try:
        if target is not None and chosen.path != target:
            os.replace(chosen.path, target)
        # The new chat files of earlier loads of this session, and of the session each
        # process start opens of its own, hold nothing Gemini can load; Gemini's clean-up at a
        # start (off for a seat) would delete every file of a short id such a file shares.
        # (A session that took no turn keeps its own file until the driver has opened its
        # successor: a start that fails first is continued as this one was.)
        keep = target or chosen.path
        for chat in chat_files(store):
            if chat.path != keep and not chat.resumable:
                chat.path.unlink(missing_ok=True)
        reseed_project(store, chosen.path.parent.parent.name, cwd)
    except OSError as exc:
        raise Refusal(
            Code.HARNESS_ERROR,
            f"gemini connector: cannot prepare session {session_id} in {store} for {cwd} ({exc})",
            "restore the seat's session store from its checkpoint, or start the seat fresh",
        ) from None
    return gemini_id if target is not None else None


def reseed_project(store: Path, slug: str, cwd: Path) -> None:
    """Key the project directory `slug` by `cwd`: Gemini CLI finds a project's directory through
    `projects.json` (absolute path -> slug) and checks the slug's `.project_root` markers (in
    `tmp/` and `history/`) name the same path; at a new path it would make a new project."""
    top = gemini_dir(store)
    registry = top / "projects.json"
    projects: dict[str, str] = {}
    try:
        data = read_stable(registry, cap=CHAT_CAP, what="gemini connector: projects.json").data
        found = json.loads(data).get("projects")
        if isinstance(found, dict):
            projects = {str(k): str(v) for k, v in found.items()}
    except (OSError, ValueError, AttributeError, Refusal):
        # None yet, or not Gemini's: the seat's project is all it needs to name.
        projects = {}
    projects = {k: v for k, v in projects.items() if v != slug and k != str(cwd)}
    projects[str(cwd)] = slug
    for base in (top / "tmp", top / "history"):
        ensure_seat_dir(base, agent=NAME)
        ensure_seat_dir(base / slug, agent=NAME)
        write_private_atomic(base / slug / PROJECT_ROOT_FILE, str(cwd).encode())
    write_private_atomic(registry, json.dumps({"projects": projects}, indent=2).encode())


# -- the connector --------------------------------------------------------------------------------


class GeminiConfig(KeyedEndpointConfig, frozen=True):
    """`[agents.gemini]`: the Gemini API endpoint (`base_url`, which Gemini CLI takes from
    GOOGLE_GEMINI_BASE_URL) and model, where the key comes from (a variable or a 0600 file),
    what the agent's tools may do (`permission`: `workspace-write`, the default, or
    `read-only`), the entry script, and variables passed through to the seat."""

    permission: str | None = None


class GeminiConnector:
    name = NAME
    # Exact continuation is measured on the pinned version (docs/design.md, "Gemini CLI
    # continuity"): after a kill -9, a new process's `session/load` reopens the session under
    # the same id and the next request to the model carries the earlier turns. No fork.
    capabilities = Capabilities(
        supports_resume=False,
        supports_session_continuation=True,
        supports_fresh_start=True,
        supports_prompt=True,
    )
    # Measured on 0.61.0: the store holds only `.gemini/` (the chats, the project registry and
    # markers); nothing is rebuilt per run.
    store_scratch: tuple[str, ...] = ()
    config_type = GeminiConfig
    session_versions: tuple[str, ...] = ()

    def build_launch(self, opts: LaunchOpts) -> LaunchSpec:
        refuse_fork(
            NAME,
            opts,
            "spawn the seat without --resume; a Gemini CLI seat continues its own session",
        )
        check_prompt(NAME, opts.prompt)
        cfg = _check_config(opts)
        files = seat_files(NAME, opts, ".home")
        config_home = files.pointer.with_suffix(".config")
        cwd = seat_cwd(NAME, opts)
        env = base_env(opts, extra_allow=cfg.passthrough)
        # The model and the approval mode on the command line, which no settings file
        # overrides (the workspace's own `.gemini/settings.json` is read: the seat's folder is
        # trusted, which the mesh tool needs).
        argv = [
            *_program(cfg.binary, env),
            "--acp",
            "--model",
            cfg.model,
            "--approval-mode",
            "default",
        ]
        if opts.continue_session and not SESSION_ID_RE.match(opts.continue_session):
            raise Refusal(
                Code.BAD_SESSION,
                f"gemini connector: continueSession {opts.continue_session!r} is not a Gemini "
                "CLI session id (a UUID)",
                "pass the full id exactly as recorded",
            )

        # Gemini's id of the session to load, or None to open a new one for the seat's.
        load: str | None = None
        if opts.continue_session:
            # Refuses (changing nothing) when the store holds no chat file of the session.
            load = prepare_continuation(files.store, opts.continue_session, cwd)
        ensure_seat_dir(files.pointer.parent, agent=NAME)
        ensure_seat_dir(files.store, agent=NAME)
        ensure_seat_dir(gemini_dir(files.store), agent=NAME)
        ensure_seat_dir(config_home, agent=NAME)
        if not opts.continue_session:
            drop_stale_pointer(files.pointer)
        write_private_atomic(
            gemini_dir(files.store) / SETTINGS,
            json.dumps(seat_settings(cfg.model, opts.mesh_dir), indent=2).encode(),
        )
        # What the driver needs of this launch: the model it names, the policy it answers the
        # agent's permission requests by, and at a continuation the Gemini session it loads.
        record: dict[str, Any] = {"model": cfg.model, "permission": cfg.permission}
        if opts.continue_session:
            record["load"] = load
        write_private_atomic(config_home / LAUNCH_RECORD, json.dumps(record).encode())

        env.update(FIXED_ENV)
        env["GEMINI_CLI_HOME"] = str(files.store)
        env["GOOGLE_GEMINI_BASE_URL"] = cfg.base_url
        # Each an empty object: the host's own (/etc/gemini-cli, the operator's trusted folders)
        # are not the seat's. They must exist: the sandbox makes a directory of a path under
        # `.cotal` a launch names that is not there.
        for var, name in HOST_FILES.items():
            write_private_atomic(config_home / name, b"{}\n")
            env[var] = str(config_home / name)
        # The key travels in the child's environment only (never argv, never a file), declared
        # secret so the manager never logs it.
        env[KEY_VAR] = cfg.key.value
        return LaunchSpec(
            argv=argv,
            env=env,
            cwd=cwd,
            session_pointer_path=files.pointer,
            session_store=(StoreDecl("workspace-root", files.store_relpath),),
            expected_session_id=opts.continue_session,
            initial_prompt=launch_prompt(opts),
            secret_env=(KEY_VAR,),
        )

    def describe(self, opts: LaunchOpts) -> dict[str, str]:
        """What `ps --wide` may show: the tools' policy, and where the key comes from."""
        config = decode_config(NAME, opts.config, GeminiConfig)
        return {"permissionMode": _permission(config), "credentials": _key_source(config)}

    def doctor(self, config: Mapping[str, Any], pins: Pins) -> HarnessCheck:
        check = HarnessCheck()
        _doctor(check, decode_config(NAME, config, GeminiConfig), pins)
        return pins.noted(check)

    def make_driver(self, stdin: ByteSend, stdout: ByteReceive, spec: LaunchSpec) -> AcpDriver:
        home = spec.env.get("GEMINI_CLI_HOME")
        store = Path(home) if home else None
        config = _launched_config(spec)
        harness = AcpHarness(
            name=NAME,
            session_id=lambda sid: bool(SESSION_ID_RE.match(sid)),
            reopenable=(
                (lambda sid: has_session(store, session_alias(store, sid)))
                if store
                else (lambda _sid: False)
            ),
            model=config.get("model"),
        )
        return GeminiDriver(
            stdin,
            stdout,
            store=store,
            load=config["load"] if "load" in config else spec.expected_session_id,
            harness=harness,
            policy=PermissionPolicy(config["permission"], spec.cwd),
            cwd=spec.cwd,
            pointer_path=spec.session_pointer_path,
            expected_session_id=spec.expected_session_id,
            initial_prompt=spec.initial_prompt,
            # The mesh tool is in the seat's settings (`seat_settings`), trusted there.
            mcp_servers=(),
        )


class GeminiDriver(AcpDriver):
    """The ACP driver, with two things of Gemini CLI's own.

    The turn's usage is read where Gemini CLI puts it: not in the prompt result's `usage` but
    in its `_meta.quota` (measured on 0.61.0: `token_count.input_tokens` is the prompt's whole
    input, cache included, with no cache split, and `model_usage` names the model).

    The seat's session may be another Gemini session: a continuation of a session that took no
    turn cannot be loaded (Gemini lists only sessions with a turn), so the driver opens a new
    one, empty as the seat's was, records it as the seat's (`record_alias`), and goes on under
    the seat's id: the manager, the pointer and every record see the seat's id, and only the
    wire to Gemini carries Gemini's (`_send`, `_handle`). A later continuation loads it."""

    who = NAME

    def __init__(
        self, *args: Any, store: Path | None = None, load: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._quota: Any = None
        self._store = store
        # At a continuation: Gemini's id of the session to load; None to open a new one.
        self._load = load
        # Gemini's id of the seat's session on the wire, when it is not the seat's.
        self._wire: str | None = None

    async def _open_session(self) -> str:
        seat_id = self._expected
        if seat_id is None or self._load == seat_id:
            return await super()._open_session()
        # Open Gemini's session (`session/load` of Gemini's id, or `session/new`) as the
        # shared driver opens any, then take the seat's id for it.
        self._expected = self._load
        try:
            gemini_id = await super()._open_session()
        finally:
            self._expected = seat_id
        if self._load is None and self._store is not None:
            await anyio.to_thread.run_sync(record_alias, self._store, seat_id, gemini_id)
        self._wire = gemini_id
        self.session_id = seat_id
        return seat_id

    async def _send(self, obj: dict[str, Any]) -> bool:
        params = obj.get("params")
        wire = self._wire
        if wire is not None and isinstance(params, dict):
            if params.get("sessionId") == self.session_id:
                obj = {**obj, "params": {**params, "sessionId": wire}}
        return await super()._send(obj)

    async def _handle(self, line: bytes) -> None:
        wire = self._wire
        if wire is not None and wire.encode() in line:
            try:
                msg = json.loads(line)
            except ValueError:
                msg = None
            params = msg.get("params") if isinstance(msg, dict) else None
            if isinstance(params, dict) and params.get("sessionId") == wire:
                params["sessionId"] = self.session_id
                line = json.dumps(msg).encode()
        await super()._handle(line)

    async def _request(
        self, kind: str, message: Callable[[str], dict[str, Any]]
    ) -> dict[str, Any] | None:
        reply = await super()._request(kind, message)
        if kind == "session-prompt":
            result = reply["envelope"].result if reply is not None else None
            self._quota = result.get("_meta", {}).get("quota") if isinstance(result, dict) else None
        return reply

    async def _turn_locked(self, text: str, message_id: str) -> TurnOutcome:
        self._quota = None
        outcome = await super()._turn_locked(text, message_id)
        if outcome.usage is None:
            usage = quota_usage(self._quota, self.harness.model)
            if usage is not None:
                outcome = replace(outcome, usage=usage)
        return outcome


def quota_usage(quota: Any, model: str | None) -> TurnUsage | None:
    """The usage in a prompt result's `_meta.quota`, or None when it has none."""
    if not isinstance(quota, dict) or not isinstance(quota.get("token_count"), dict):
        return None
    count = quota["token_count"]
    named = [
        m["model"]
        for m in quota.get("model_usage") or ()
        if isinstance(m, dict) and isinstance(m.get("model"), str)
    ]
    return TurnUsage(
        input_tokens=token_count(count.get("input_tokens")),
        output_tokens=token_count(count.get("output_tokens")),
        model=named[-1] if named else model,
    )


def _launched_config(spec: LaunchSpec) -> dict[str, Any]:
    """The model and the tools' policy the launch recorded beside the seat's settings
    (`acp.launch_record`), and the session it asked Gemini CLI to load."""
    settings = spec.env.get("GEMINI_CLI_SYSTEM_SETTINGS_PATH")
    out, written = launch_record(Path(settings).parent if settings else None)
    load = written.get("load", "")
    if load is None or (isinstance(load, str) and SESSION_ID_RE.match(load)):
        out["load"] = load
    return out


def pinned_program() -> Path:
    """The pinned install's entry script (`bundle/gemini.js`), run by node."""
    return Path(pinned_binary(NAME))


def _program(binary: str | None, env: Mapping[str, str]) -> list[str]:
    """The seat's command line up to its options: node and the entry script. Node is named,
    not found through the script's `#!/usr/bin/env node`, so the seat's PATH picks nothing."""
    script = binary or str(pinned_program())
    if not os.path.isfile(script):
        raise Refusal(
            Code.NOT_INSTALLED,
            f"gemini connector: {script} does not exist",
            "run `cotal tools install` or fix agents.gemini.binary",
        )
    if not script.endswith((".js", ".mjs")):
        return [script]
    node = shutil.which("node", path=env.get("PATH"))
    if node is None:
        raise Refusal(
            Code.NO_NODE,
            "gemini connector: node is not on the manager's PATH",
            "install Node.js >= 20",
        )
    return [node, script]


# -- configuration --------------------------------------------------------------------------------


def _permission(config: GeminiConfig) -> PolicyMode:
    return policy_mode(NAME, config.permission)


def _key_source(config: GeminiConfig) -> str:
    return key_source(NAME, config, DEFAULT_KEY_ENV)


def resolve_key(config: GeminiConfig) -> Key:
    """The provider key, read at every spawn (`launchkit.resolve_key`)."""
    return resolve_provider_key(NAME, config, DEFAULT_KEY_ENV)


def _doctor(check: HarnessCheck, cfg: GeminiConfig, pins: Pins) -> None:
    program = pinned_or_configured(
        check, NAME, cfg.binary, pins, locate=lambda _pin: pinned_program()
    )
    if program is None:
        return
    argv = [program]
    if program.endswith((".js", ".mjs")):
        node = shutil.which("node")
        if node is None:
            check.missing.append(
                Missing("node is not on PATH (Gemini CLI runs on Node.js)", "install Node.js >= 20")
            )
            return
        argv = [node, program]
    with tempfile.TemporaryDirectory(prefix="cotal-doctor-") as tmp:
        version_run(
            check,
            argv,
            probe_env(
                tmp,
                GEMINI_CLI_HOME=tmp,
                GEMINI_CLI_SYSTEM_SETTINGS_PATH=f"{tmp}/system-settings.json",
                GEMINI_CLI_SYSTEM_DEFAULTS_PATH=f"{tmp}/system-defaults.json",
                **FIXED_ENV,
            ),
        )
    try:
        resolve_key(cfg)
    except Refusal as exc:
        config_problem(check, exc)


def _check_config(opts: LaunchOpts) -> EndpointLaunch:
    config = decode_config(NAME, opts.config, GeminiConfig)
    base_url = endpoint_url(
        NAME,
        DEFAULT_BASE_URL if config.base_url is None else config.base_url,
        otherwise=Refusal(
            Code.BAD_LAUNCH,
            "gemini connector: base_url must be an http(s) URL of a Gemini API endpoint (got "
            f"{config.base_url!r})",
            "set agents.gemini.base_url in cotal.toml, e.g. http://127.0.0.1:8080, or unset it",
        ),
    )
    model = opts.model or config.model or DEFAULT_MODEL
    if not names.HARNESS_MODEL.matches(model) or "/" in model:
        raise Refusal(
            Code.BAD_LAUNCH,
            f"gemini connector: model {model!r} is not a model name",
            "pass --model or set agents.gemini.model in cotal.toml, e.g. gemini-2.5-flash",
        )
    permission = _permission(config)
    extra_env = passthrough_names(
        NAME,
        config.extra_env,
        RESERVED_ENV,
        prefixes=("COTAL_", "GEMINI_", "GOOGLE_"),
        why="which the connector sets or which would configure Gemini CLI around it",
    )
    binary = configured_binary(NAME, config.binary, what="Gemini CLI's bundle/gemini.js")
    # Last among the checks: a launch refused for its config never reads a secret.
    key = resolve_key(config)
    return EndpointLaunch(base_url, model, permission, key, binary, tuple(extra_env))
