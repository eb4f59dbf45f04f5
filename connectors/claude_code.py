"""The Claude Code connector: one long-lived Claude Code process in stream-json mode, driven
over JSON lines.

Its files, sessions (fresh, continue, fork), credential order and flags are explained in
docs/design.md, "The harness connectors, in detail", Claude Code.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio

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
    Pins,
    config_problem,
    pinned_or_configured,
    probe_env,
    version_run,
)
from connectors.driverkit import HarnessGone as HarnessGone
from connectors.driverkit import JsonStdioDriver, Turn, unavailable_outcome
from connectors.interpreter import own_python
from connectors.launchkit import (
    UUID_RE,
    KeyedEndpointConfig,
    base_env,
    check_prompt,
    configured_binary,
    decode_config,
    drop_stale_pointer,
    endpoint_url,
    key_env_name,
    key_file_path,
    key_in_file,
    launch_prompt,
    one_key_source,
    passthrough_names,
    pinned_binary,
    refuse_resume_with_continuation,
    require_executable,
    seat_cwd,
    seat_files,
)
from connectors.meshclient import MESH_DIR_ENV
from connectors.meshtool.mcp import SERVER_NAME as MESH_SERVER
from connectors.meshtool.mcp import TOOLS as MESH_TOOLS
from connectors.privatefs import create_private_new, ensure_seat_dir, write_private_atomic
from protocol import names
from protocol.errors import Refusal
from protocol.refusals import Code

NAME = "claude"
KEY_VAR = "ANTHROPIC_API_KEY"
OAUTH_VAR = "CLAUDE_CODE_OAUTH_TOKEN"
# What `claude --permission-mode` accepts in the pinned version (its --help choices).
PERMISSION_MODES = ("acceptEdits", "auto", "bypassPermissions", "default", "dontAsk", "plan")
DEFAULT_PERMISSION_MODE = "bypassPermissions"
CREDENTIALS_FILE = ".credentials.json"
KEY_FILE_CAP = 4096
CREDENTIALS_CAP = 64 * 1024
# Variables this connector sets itself; an operator passing them through would silently
# override the seat's isolation (config dir, endpoint, key) or its safety switches.
RESERVED_ENV = frozenset(
    {
        "CLAUDE_CONFIG_DIR",
        KEY_VAR,
        OAUTH_VAR,
        "CLAUDE_CODE_OAUTH_REFRESH_TOKEN",
        "ANTHROPIC_AUTH_TOKEN",
        "ANTHROPIC_BASE_URL",
        "IS_SANDBOX",
        "DISABLE_TELEMETRY",
        "DISABLE_ERROR_REPORTING",
        "DISABLE_AUTOUPDATER",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
    }
)
# Offline-by-default switches, measured to leave only the configured endpoint in use.
QUIET_ENV = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
}
# Claude Code deletes transcripts older than `cleanupPeriodDays` (default 30) at startup, which
# would silently empty a seat continued from an old checkpoint. 100 years is "keep".
SETTINGS = {"cleanupPeriodDays": 36500}
# The mesh tool's names as Claude Code calls them (`mcp__<server>__<tool>`). Allowed by name:
# in -p mode Claude Code answers a tool no rule allows with a denial and never asks (measured on
# 2.1.197 in every mode but bypassPermissions, plan included), and the exact names allow
# nothing else a server of that name might offer.
MESH_TOOL_NAMES = tuple(f"mcp__{MESH_SERVER}__{tool['name']}" for tool in MESH_TOOLS)


LAUNCH_RECORD = "cotal-launch.json"
FORKS_DIR = "cotal-forks"
RECORD_CAP = 64 * 1024
REGISTRY_CAP = 64 * 1024
# How much of a transcript is scanned for the cwd it was recorded in.
CWD_SCAN_CAP = 1024 * 1024
# Claude Code cuts encoded project dir names at this length and appends a hash we cannot
# recompute, so longer cwds are matched by the cwd recorded inside the transcript instead.
PROJECT_NAME_MAX = 200
SNAPSHOT_TRIES = 5

# An `assistant` or `user` line carries whole tool outputs, so the cap is generous; past it the
# driver stops rather than buffering without bound.
LINE_CAP = 64 * 1024 * 1024
BOOT_POLL_S = 10.0
PERSIST_TIMEOUT_S = 10.0
PERSIST_POLL_S = 0.02


# -- paths ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SeatPaths:
    pointer: Path
    config: Path
    config_relpath: str


def seat_paths(opts: LaunchOpts) -> SeatPaths:
    files = seat_files(NAME, opts, ".config")
    return SeatPaths(pointer=files.pointer, config=files.store, config_relpath=files.store_relpath)


def transcripts(config: Path, session_id: str) -> list[Path]:
    """`projects/*/<session_id>.jsonl` in one config dir: exact file name, no prefix match."""
    try:
        projects = sorted(
            e.path for e in os.scandir(config / "projects") if e.is_dir(follow_symlinks=False)
        )
    except FileNotFoundError:
        return []
    name = f"{session_id}.jsonl"
    return [Path(p) / name for p in projects if os.path.isfile(os.path.join(p, name))]


def project_dir_name(cwd: Path) -> str | None:
    """The project dir Claude Code files a cwd's sessions under, when it can be recomputed."""
    encoded = re.sub(r"[^A-Za-z0-9]", "-", os.path.realpath(cwd))
    return encoded if len(encoded) <= PROJECT_NAME_MAX else None


def _read_capped(path: Path, cap: int | None) -> bytes:
    """The bytes of a regular file, at most `cap` of them (all when None); OSError for a
    symlink or anything but a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, "not a regular file", str(path))
        if cap is not None:
            return os.read(fd, cap)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def recorded_cwd(transcript: Path) -> str | None:
    """The cwd the first message entry of a transcript was recorded in."""
    try:
        head = _read_capped(transcript, CWD_SCAN_CAP)
    except OSError:
        return None
    for line in head.split(b"\n"):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("cwd"), str):
            return str(entry["cwd"])
    return None


def _same_cwd(transcript: Path, cwd: Path) -> bool:
    if transcript.parent.name == project_dir_name(cwd):
        return True
    recorded = recorded_cwd(transcript)
    return recorded is not None and os.path.realpath(recorded) == os.path.realpath(cwd)


# -- relocation -----------------------------------------------------------------------------------


def relocate_claude_session(
    files: Sequence[str], reloc: Relocation, session_id: str | None
) -> SessionMove:
    """Each `projects/<encoded dir>/...` of the seat's config dir renamed to the encoding of
    that dir's new path; everything else in the config dir stays where it is.

    Claude Code looks a session id up only under the project dir of its cwd (measured on
    2.1.197: a transcript copied into the new cwd's project dir resumes under the same id), so
    the session's transcript must move with the cwd. A dir whose name this connector cannot
    recompute (an encoding past 200 characters, which Claude Code shortens with a hash) is left
    as it is; when that holds the seat's own transcript, the session cannot be continued at the
    new path and the seat is started fresh, said so.
    """
    # The dirs a transcript or memory dir can be keyed by: the cwd and each of its ancestors.
    renames: dict[str, str | None] = {}
    for old in (reloc.old_cwd, *reloc.old_cwd.parents, reloc.old_root):
        new = reloc.map(old)
        name = re.sub(r"[^A-Za-z0-9]", "-", str(old))
        if new is not None and len(name) <= PROJECT_NAME_MAX and name not in renames:
            renames[name] = project_dir_name(new)
    moves: dict[str, FileMove] = {}
    stranded = False
    for rel in files:
        parts = rel.split("/")
        if len(parts) < 3 or parts[0] != "projects":
            continue
        target = renames.get(parts[1])
        if target is not None:
            moves[rel] = FileMove("/".join(["projects", target, *parts[2:]]))
        elif session_id is not None and parts[-1] == f"{session_id}.jsonl":
            stranded = parts[1] != project_dir_name(reloc.new_cwd)
    if stranded:
        return SessionMove(
            files=moves,
            continuity="fresh",
            why=(
                f"started fresh: Claude Code cannot find session {session_id} at the new cwd "
                f"{reloc.new_cwd} (its project dir name cannot be recomputed there); the "
                "transcript is restored in the seat's store"
            ),
        )
    return SessionMove(files=moves)


# -- the configuration ----------------------------------------------------------------------------


class ClaudeConfig(KeyedEndpointConfig, frozen=True):
    """`[agents.claude]`: an Anthropic Messages endpoint (default: Claude Code's own), the
    model, where the key comes from (a variable or a 0600 file; else an OAuth token or the
    operator's `claude login`), the permission mode, the executable, and variables passed
    through to the seat. Anything else is refused."""

    permission_mode: str | None = None


# -- the connector --------------------------------------------------------------------------------


class ClaudeCodeConnector:
    name = NAME
    # Exact continuation is proved against the real program by
    # tests/integration/test_claude_connector.py: after SIGKILL, `--resume <id>` reports the same
    # id, answers from the history, and the provider receives the earlier turns.
    capabilities = Capabilities(
        supports_resume=True,
        supports_session_continuation=True,
        supports_fresh_start=True,
        supports_prompt=True,
    )
    config_type = ClaudeConfig
    # The session-format versions measured besides the pin in harnesses.json: none yet. A
    # destination resumes a Claude Code session only at these.
    session_versions: tuple[str, ...] = ()

    def build_launch(self, opts: LaunchOpts) -> LaunchSpec:
        refuse_resume_with_continuation(NAME, opts)
        check_prompt(NAME, opts.prompt)
        cfg = _check_config(opts)
        paths = seat_paths(opts)
        cwd = seat_cwd(NAME, opts)
        binary = _program(cfg.binary)

        # Everything that can refuse is read-only and comes first, so a refusal changes nothing.
        source: Path | None = None
        if opts.continue_session:
            session_args = _continuation_args(paths.config, opts.continue_session, cwd)
            expected = opts.continue_session
        else:
            if opts.resume:
                source = _fork_source(paths, opts.resume)
            expected = str(uuid.uuid4())

        ensure_seat_dir(paths.pointer.parent, agent=NAME)
        ensure_seat_dir(paths.config, agent=NAME)
        write_private_atomic(
            paths.config / "settings.json", json.dumps(SETTINGS, indent=1).encode()
        )
        if not opts.continue_session:
            if source is not None:
                snapshot = _snapshot(source, paths.config, expected)
                session_args = [
                    "--resume",
                    str(snapshot),
                    "--fork-session",
                    "--session-id",
                    expected,
                ]
                record = {
                    "version": 1,
                    "sessionId": expected,
                    "origin": "fork",
                    "forkOf": source.stem,
                    "snapshot": snapshot.relative_to(paths.config).as_posix(),
                }
            else:
                session_args = ["--session-id", expected]
                record = {"version": 1, "sessionId": expected, "origin": "fresh"}
            write_private_atomic(
                paths.config / LAUNCH_RECORD, json.dumps(record, indent=1).encode()
            )
            drop_stale_pointer(paths.pointer)

        argv = [
            binary,
            "-p",
            "--input-format",
            "stream-json",
            "--output-format",
            "stream-json",
            "--verbose",
            "--replay-user-messages",
            "--disable-slash-commands",
            "--permission-mode",
            cfg.permission_mode,
            "--strict-mcp-config",
        ]
        if opts.mesh_dir is not None:
            # `=` joins each value to its flag: both flags take several values, and a bare next
            # word would be read as one more of them.
            argv += [
                f"--mcp-config={json.dumps(mesh_mcp_config(opts.mesh_dir))}",
                f"--allowedTools={','.join(MESH_TOOL_NAMES)}",
            ]
        if cfg.model is not None:
            argv += ["--model", cfg.model]
        argv += session_args

        env = base_env(opts, extra_allow=cfg.passthrough)
        env.update(QUIET_ENV)
        env["CLAUDE_CONFIG_DIR"] = str(paths.config)
        if cfg.base_url is not None:
            env["ANTHROPIC_BASE_URL"] = cfg.base_url
        # The credential travels in the child's environment only (never argv, never a file),
        # under the one name Claude Code reads for its kind, and is declared secret so the
        # manager never logs it.
        env[cfg.credential.var] = cfg.credential.value
        if cfg.permission_mode == "bypassPermissions" and os.geteuid() == 0:
            env["IS_SANDBOX"] = "1"
        return LaunchSpec(
            argv=argv,
            env=env,
            cwd=cwd,
            session_pointer_path=paths.pointer,
            session_store=(StoreDecl("workspace-root", paths.config_relpath),),
            expected_session_id=expected,
            # stream-json mode takes no prompt in argv; the driver sends it as the first turn.
            initial_prompt=launch_prompt(opts),
            secret_env=(cfg.credential.var,),
        )

    def describe(self, opts: LaunchOpts) -> dict[str, str]:
        """What an operator may see about a seat's launch (for `ps --wide`): the permission mode
        and where its credential comes from, never the credential itself. Reads no secret."""
        config = decode_config(NAME, opts.config, ClaudeConfig)
        return {
            "permissionMode": _permission_mode(config),
            "credentials": _credential_source(config),
        }

    def doctor(self, config: Mapping[str, Any], pins: Pins) -> HarnessCheck:
        check = HarnessCheck()
        _doctor(check, decode_config(NAME, config, ClaudeConfig), pins)
        return pins.noted(check)

    def relocate_session(
        self, files: Sequence[str], reloc: Relocation, session_id: str | None
    ) -> SessionMove:
        return relocate_claude_session(files, reloc, session_id)

    def make_driver(self, stdin: ByteSend, stdout: ByteReceive, spec: LaunchSpec) -> ClaudeDriver:
        config = spec.env.get("CLAUDE_CONFIG_DIR")
        return ClaudeDriver(
            stdin,
            stdout,
            config_dir=Path(config) if config else None,
            pointer_path=spec.session_pointer_path,
            expected_session_id=spec.expected_session_id,
            initial_prompt=spec.initial_prompt,
        )


def mesh_mcp_config(mesh_dir: Path) -> dict[str, Any]:
    """The `--mcp-config` that gives Claude Code the mesh tool: cotal's own MCP server
    (connectors/meshtool), started by Claude Code as its child inside the seat's sandbox.

    Claude Code hands a stdio server its own whole environment with the config's `env` on top
    (measured on 2.1.197), so the mesh dir would reach it anyway; it is named here so the
    server's environment does not hang on that.
    """
    python, *args = own_python("connectors.meshtool")
    return {
        "mcpServers": {
            MESH_SERVER: {
                "type": "stdio",
                "command": python,
                "args": args,
                "env": {MESH_DIR_ENV: str(mesh_dir)},
            }
        }
    }


@dataclass(frozen=True)
class _Config:
    base_url: str | None
    model: str | None
    credential: Credential
    permission_mode: str
    binary: str | None
    passthrough: tuple[str, ...]


def _doctor(check: HarnessCheck, cfg: ClaudeConfig, pins: Pins) -> None:
    program = pinned_or_configured(check, NAME, cfg.binary, pins)
    if program is None:
        return
    with tempfile.TemporaryDirectory(prefix="cotal-doctor-") as tmp:
        version_run(check, [program], probe_env(tmp, CLAUDE_CONFIG_DIR=tmp, **QUIET_ENV))
    # A key file, a key variable, an OAuth token or a `claude login` each satisfy Claude Code;
    # the refusal names only the source, never the secret it would have read.
    try:
        resolve_credential(cfg)
    except Refusal as exc:
        config_problem(check, exc)


def _check_config(opts: LaunchOpts) -> _Config:
    config = decode_config(NAME, opts.config, ClaudeConfig)
    base_url = config.base_url
    if base_url is not None:
        base_url = endpoint_url(
            NAME,
            base_url,
            otherwise=Refusal(
                Code.BAD_LAUNCH,
                "claude connector: base_url must be an http(s) URL of an Anthropic Messages "
                f"endpoint (got {base_url!r})",
                "set agents.claude.base_url in cotal.toml, e.g. http://127.0.0.1:8080, or unset it",
            ),
        )
    model = opts.model or config.model
    if model is not None and not names.CLAUDE_MODEL.matches(model):
        raise Refusal(
            Code.BAD_LAUNCH,
            f"claude connector: model {model!r} is not a model name (letters, digits, ._:/@[]+-)",
            "pass --model or set agents.claude.model in cotal.toml",
        )
    permission_mode = _permission_mode(config)
    extra_env = passthrough_names(NAME, config.extra_env, RESERVED_ENV)
    binary = configured_binary(NAME, config.binary, what="the claude executable")
    # Last among the checks: a launch refused for its config never reads a secret.
    credential = resolve_credential(config)
    return _Config(base_url, model, credential, permission_mode, binary, tuple(extra_env))


def _permission_mode(config: ClaudeConfig) -> str:
    mode = DEFAULT_PERMISSION_MODE if config.permission_mode is None else config.permission_mode
    if mode not in PERMISSION_MODES:
        raise Refusal(
            Code.BAD_LAUNCH,
            f"claude connector: permission_mode {mode!r} is not one Claude Code accepts",
            f"set agents.claude.permission_mode to one of {', '.join(PERMISSION_MODES)}, or unset "
            f"it for {DEFAULT_PERMISSION_MODE}",
        )
    return str(mode)


# -- credentials ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Credential:
    """A secret and the one variable it travels in. `source` names where it came from and is
    safe to show; the value never is."""

    var: str
    value: str = field(repr=False)
    source: str


def login_credentials_path() -> Path:
    """Where `claude login` left the operator's credentials, for the manager's environment."""
    config_dir = os.environ.get("CLAUDE_CONFIG_DIR")
    base = Path(config_dir) if config_dir else Path(os.path.expanduser("~")) / ".claude"
    return base / CREDENTIALS_FILE


def _key_file_path(config: ClaudeConfig) -> Path | None:
    return key_file_path(NAME, config.api_key_file)


def _key_env(config: ClaudeConfig) -> str:
    one_key_source(NAME, config.api_key_env, config.api_key_file)
    return key_env_name(NAME, config.api_key_env or KEY_VAR, example=KEY_VAR)


def _credential_source(config: ClaudeConfig) -> str:
    """The source `resolve_credential` would use, judged by presence alone."""
    key_file = _key_file_path(config)
    api_key_env = _key_env(config)
    if key_file is not None:
        return f"api_key_file {key_file}"
    if os.environ.get(api_key_env) or config.api_key_env is not None:
        return f"api_key_env {api_key_env}"
    if os.environ.get(OAUTH_VAR):
        return OAUTH_VAR
    return f"login {login_credentials_path()}"


def _read_private(path: Path, cap: int, what: str, cure: str) -> bytes:
    """A file only this uid can read or write: regular, not a symlink, ours, no group or other
    bits, at most `cap` bytes. Anything else is refused, since a secret others can change or
    read is not the operator's alone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise Refusal(
            Code.NO_CREDENTIALS, f"claude connector: {what} {path} does not exist", cure
        ) from None
    except OSError as exc:
        reason = "is a symlink" if exc.errno == errno.ELOOP else f"cannot be read ({exc.strerror})"
        raise Refusal(
            Code.BAD_CREDENTIALS, f"claude connector: {what} {path} {reason}", cure
        ) from None
    try:
        st = os.fstat(fd)
        problem = None
        if not stat.S_ISREG(st.st_mode):
            problem = "is not a regular file"
        elif st.st_uid != os.geteuid():
            problem = f"is owned by uid {st.st_uid}, not by the manager's uid {os.geteuid()}"
        elif st.st_mode & 0o077:
            problem = f"has mode {stat.S_IMODE(st.st_mode):04o}; it must be 0600 or stricter"
        elif st.st_size > cap:
            problem = f"is over {cap} bytes"
        if problem is not None:
            raise Refusal(Code.BAD_CREDENTIALS, f"claude connector: {what} {path} {problem}", cure)
        return os.read(fd, cap + 1)[:cap]
    finally:
        os.close(fd)


def _key_from_file(path: Path) -> Credential:
    cure = f"write the key alone into {path} (chmod 600), or unset agents.claude.api_key_file"
    data = _read_private(path, KEY_FILE_CAP, "api_key_file", cure)
    return Credential(KEY_VAR, key_in_file(NAME, path, data), f"api_key_file {path}")


def _login_token(path: Path) -> Credential:
    cure = (
        f"run `claude login` as the manager's user (it writes {path}), or set an API key "
        f"(agents.claude.api_key_file, or {KEY_VAR} exported before starting the manager)"
    )
    data = _read_private(path, CREDENTIALS_CAP, "the login's credentials", cure)
    try:
        oauth = json.loads(data).get("claudeAiOauth")
    except (ValueError, AttributeError):
        oauth = None
    token = oauth.get("accessToken") if isinstance(oauth, dict) else None
    if not isinstance(token, str) or not token or any(c.isspace() for c in token):
        raise Refusal(
            Code.NO_CREDENTIALS,
            f"claude connector: {path} holds no Claude login (claudeAiOauth.accessToken)",
            cure,
        )
    expires = oauth.get("expiresAt") if isinstance(oauth, dict) else None
    if isinstance(expires, int | float) and expires / 1000 <= time.time():
        # The seat gets the access token only: refreshing needs the refresh token, and a
        # refresh rotates it, which would log the operator's own Claude Code out.
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires / 1000))
        raise Refusal(
            Code.NO_CREDENTIALS,
            f"claude connector: the Claude login in {path} expired at {when}",
            "run `claude` once as the manager's user so it refreshes the login, then spawn again; "
            "or set an API key",
        )
    return Credential(OAUTH_VAR, token, f"login {path}")


def resolve_credential(config: ClaudeConfig) -> Credential:
    """The seat's credential, read now (see the module doc for the order)."""
    key_file = _key_file_path(config)
    api_key_env = _key_env(config)
    if key_file is not None:
        return _key_from_file(key_file)
    key = os.environ.get(api_key_env)
    if key:
        return Credential(KEY_VAR, key, f"api_key_env {api_key_env}")
    if config.api_key_env is not None:
        raise Refusal(
            Code.NO_CREDENTIALS,
            f"claude connector: agents.claude.api_key_env names {api_key_env}, which is not set "
            "in the manager's environment",
            f"export {api_key_env} before starting the manager, or use agents.claude.api_key_file "
            "(read at every spawn), or drop api_key_env to use the operator's `claude login`",
        )
    token = os.environ.get(OAUTH_VAR)
    if token:
        return Credential(OAUTH_VAR, token, OAUTH_VAR)
    login = login_credentials_path()
    if not os.path.lexists(login):
        raise Refusal(
            Code.NO_CREDENTIALS,
            f"claude connector has no credentials: no API key ({KEY_VAR} is not set in the "
            f"manager's environment, no agents.claude.api_key_file) and no Claude login ({login} "
            "does not exist)",
            f"set agents.claude.api_key_file to a 0600 file holding the key (read at every "
            f"spawn), or export {KEY_VAR} before starting the manager, or run `claude login` as "
            "the manager's user",
        )
    return _login_token(login)


def _program(binary: str | None) -> str:
    if binary is None:
        binary = pinned_binary(NAME)
    return require_executable(
        NAME, binary, "run `python -m manager.cli.tools install` or fix agents.claude.binary"
    )


def _check_session_id(session_id: str, what: str) -> None:
    if not isinstance(session_id, str) or not UUID_RE.match(session_id):
        raise Refusal(
            Code.BAD_SESSION,
            f"claude connector: {what} {session_id!r} is not a Claude Code session id (a lowercase "
            "UUID)",
            "pass the full id exactly as recorded",
        )


def _refuse_live_holder(config: Path, session_id: str) -> None:
    """Refuse to reopen a session another live process of this config dir still holds.

    Claude Code takes no lock: two processes resuming one id both append and the transcript
    branches (measured). Its live registry names each running process's session.
    """
    try:
        entries = list(os.scandir(config / "sessions"))
    except FileNotFoundError:
        return
    for entry in entries:
        if not entry.name.endswith(".json"):
            continue
        try:
            record = json.loads(_read_capped(Path(entry.path), REGISTRY_CAP))
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("sessionId") != session_id:
            continue
        pid = record.get("pid")
        if isinstance(pid, int) and _alive_since(pid, record.get("procStart")):
            raise Refusal(
                Code.SESSION_BUSY,
                f"claude connector: session {session_id} is open in live process {pid}",
                f"stop that process (kill {pid}) before continuing the session",
            )


def _alive_since(pid: int, proc_start: Any) -> bool:
    """True when `pid` runs and started at `proc_start` (field 22 of /proc/<pid>/stat), so a
    recycled pid is not mistaken for the process that registered the session."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    fields = data[data.rindex(b")") + 2 :].split()
    if fields[0] == b"Z":
        return False
    return proc_start is None or fields[19].decode() == str(proc_start)


def _read_launch_record(config: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(_read_capped(config / LAUNCH_RECORD, RECORD_CAP))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("version") == 1 else None


def _continuation_args(config: Path, session_id: str, cwd: Path) -> list[str]:
    _check_session_id(session_id, "continueSession")
    _refuse_live_holder(config, session_id)
    found = transcripts(config, session_id)
    if any(_same_cwd(t, cwd) for t in found):
        return ["--resume", session_id]
    if found:
        # Claude Code looks an id up only under the cwd's project dir: from here it would say
        # "No conversation found" and exit.
        recorded = sorted({recorded_cwd(t) or t.parent.name for t in found})
        raise Refusal(
            Code.SESSION_CWD_MISMATCH,
            f"claude connector: session {session_id} was recorded in cwd {', '.join(recorded)}, "
            f"but the seat's cwd is {cwd}",
            f"launch the seat with cwd {recorded[0]}",
        )
    record = _read_launch_record(config)
    if record is not None and record.get("sessionId") == session_id:
        if record.get("materialized"):
            # It had a transcript once: starting it afresh under the old id would present an
            # empty session as the continued one.
            raise Refusal(
                Code.NO_SESSION,
                f"claude connector: the transcript of session {session_id} is missing from the "
                f"seat's store {config} "
                f"(looked for projects/*/{session_id}.jsonl; the session had one)",
                "restore the seat's session store (a checkpoint's harness store) or start the seat "
                "fresh",
            )
        # The session never reached its first turn, so it has no transcript; redo exactly what
        # made it, under the same id.
        if record.get("origin") == "fresh":
            return ["--session-id", session_id]
        snapshot = record.get("snapshot")
        if record.get("origin") == "fork" and isinstance(snapshot, str):
            path = Path(os.path.normpath(config / snapshot))
            if path.is_relative_to(config / FORKS_DIR) and path.is_file():
                return ["--resume", str(path), "--fork-session", "--session-id", session_id]
    raise Refusal(
        Code.NO_SESSION,
        f"claude connector: no transcript for session {session_id} in the seat's store {config} "
        f"(looked for projects/*/{session_id}.jsonl)",
        "restore the seat's session store (a checkpoint's harness store) or start the seat fresh",
    )


def _fork_source(paths: SeatPaths, resume: str) -> Path:
    if os.path.isabs(resume):
        source = Path(os.path.normpath(resume))
        if source.suffix != ".jsonl" or not UUID_RE.match(source.stem):
            raise Refusal(
                Code.BAD_SESSION,
                f"claude connector: {source} is not a Claude Code transcript (<session id>.jsonl)",
                "pass a session id or the absolute path of a transcript",
            )
        if not source.is_file() or source.is_symlink():
            raise Refusal(
                Code.NO_SESSION,
                f"claude connector: transcript {source} does not exist or is not a regular file",
                "pass the path of an existing transcript",
            )
        return source
    _check_session_id(resume, "resume")
    # The source may be this seat's own earlier session or another Claude seat's in this
    # workspace: each seat has a private config dir, all of them siblings of this one.
    configs = [paths.config] + sorted(
        p
        for p in paths.pointer.parent.glob("*.config")
        if p != paths.config and p.is_dir() and not p.is_symlink()
    )
    matches = [t for c in configs for t in transcripts(c, resume)]
    if not matches:
        raise Refusal(
            Code.NO_SESSION,
            f"claude connector: no transcript for session {resume} in the Claude seats under "
            f"{paths.pointer.parent} "
            "(a session has one only after its first turn)",
            "pass the session id of a Claude seat in this workspace, or the absolute path of a "
            "transcript",
        )
    if len(matches) > 1:
        raise Refusal(
            Code.AMBIGUOUS_SESSION,
            f"claude connector: session id {resume} names {len(matches)} transcripts: "
            f"{', '.join(map(str, matches))}",
            "pass the absolute path of the one to fork",
        )
    return matches[0]


def _snapshot(source: Path, config: Path, fork_id: str) -> Path:
    """Copy `source` into the seat's store and return the copy, 0600 in 0700 dirs.

    The source may be a live seat's transcript being appended to; a read is accepted only when
    two in a row agree, and a trailing partial line is left out.
    """
    data: bytes | None = None
    for _ in range(SNAPSHOT_TRIES):
        try:
            first = _read_capped(source, None)
            second = _read_capped(source, None)
        except OSError as exc:
            raise Refusal(
                Code.NO_SESSION,
                f"claude connector cannot read transcript {source}: {exc.strerror}",
                "check the file and its permissions",
            ) from None
        if first == second:
            data = first
            break
    if data is None:
        raise Refusal(
            Code.SESSION_BUSY,
            f"claude connector: transcript {source} kept changing while it was copied",
            "retry once the source seat is idle, or stop it first",
        )
    data = data[: data.rfind(b"\n") + 1]
    if not data:
        raise Refusal(
            Code.NO_SESSION,
            f"claude connector: transcript {source} is empty",
            "fork a session that has had a turn",
        )
    target_dir = ensure_seat_dir(config / FORKS_DIR / fork_id, agent=NAME)
    target = target_dir / source.name
    # The launch record that names this copy is written next; the copy is durable first.
    create_private_new(target, data)
    return target


# -- the driver -----------------------------------------------------------------------------------


class _Turn(Turn):
    def __init__(self, message_uuid: str, offsets: dict[Path, int]) -> None:
        super().__init__()
        self.uuid = message_uuid
        self.replayed = False
        self.interrupted = False
        # The uuid of the turn's last assistant message: Claude Code files it in the transcript
        # under the same uuid, which is how the driver sees the turn is durable.
        self.last_uuid: str | None = None
        # Transcript sizes when the turn began; the turn's entries are appended after them.
        self.offsets = offsets


class ClaudeDriver(JsonStdioDriver[_Turn]):
    """Claude Code's stream-json protocol (one JSON object per LF-terminated line).

    Control requests carry our `request_id` and their responses are routed by it. Turn events
    carry no id we chose, so prompts are strictly serialized; a turn is the `result` that
    follows the replay of the message uuid we sent (or, for a message Claude Code answered
    locally without the model, the `result` with `num_turns: 0`).
    """

    who = NAME

    def __init__(
        self,
        stdin: ByteSend,
        stdout: ByteReceive,
        *,
        config_dir: Path | None,
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
        self._config_dir = config_dir
        self._init_lock = anyio.Lock()
        self._reported: str | None = None
        self._materialized = False
        self.pid: int | None = None

    # -- reader ---------------------------------------------------------------------------------

    async def _handle(self, line: bytes) -> None:
        event = self._decode(line)
        if event is None:
            return
        kind = event.get("type")
        if kind == "control_response":
            response = event.get("response") or {}
            self._pending.resolve(str(response.get("request_id")), response)
        elif kind == "control_request":
            # Claude Code asking us something (a permission, a hook callback). Nothing is
            # registered to ask for, so answer at once rather than leave it waiting forever.
            request = event.get("request") or {}
            await self._send(
                {
                    "type": "control_response",
                    "response": {
                        "subtype": "error",
                        "request_id": event.get("request_id"),
                        "error": f"cotal does not serve {request.get('subtype')!r} requests",
                    },
                }
            )
        elif kind == "system" and event.get("subtype") == "init":
            self._observe(event.get("session_id"))
            self._check_mesh_server(event.get("mcp_servers"))
        elif kind == "user" and event.get("isReplay"):
            if self._turn is not None and event.get("uuid") == self._turn.uuid:
                self._turn.replayed = True
        elif kind == "assistant":
            if self._turn is not None and isinstance(event.get("uuid"), str):
                self._turn.last_uuid = event["uuid"]
        elif kind == "result":
            self._observe(event.get("session_id"))
            turn = self._turn
            if turn is None:
                self._note("claude reported a result while no prompt was in flight")
            elif turn.replayed or event.get("num_turns") == 0:
                turn.end.resolve(event)
            else:
                self._note(
                    "claude reported a result for a message that is not the prompt in flight"
                )

    def _check_mesh_server(self, servers: Any) -> None:
        """Claude Code goes on without an MCP server that did not start (it reports `failed` in
        its init and the model simply has no such tool), so say so where the seat's protocol
        notes are read."""
        if not isinstance(servers, list):
            return
        for server in servers:
            if (
                isinstance(server, dict)
                and server.get("name") == MESH_SERVER
                and server.get("status") != "connected"
            ):
                self._note(
                    f"claude's mesh tool server {MESH_SERVER!r} is {server.get('status')!r}: "
                    "the seat cannot send"
                )

    def _observe(self, session_id: Any) -> None:
        if isinstance(session_id, str) and session_id:
            if self.session_id is not None and session_id != self.session_id:
                self._note(f"claude switched from session {self.session_id} to {session_id}")
            self._reported = session_id
            self.session_id = session_id

    # -- commands -------------------------------------------------------------------------------

    async def _control(self, subtype: str, **fields: Any) -> dict[str, Any] | None:
        """Send one control request and wait for its response; None when Claude Code is gone."""
        return await self._request(
            subtype,
            lambda rid: {
                "type": "control_request",
                "request_id": rid,
                "request": {"subtype": subtype, **fields},
            },
        )

    async def _initialize(self) -> int:
        async with self._init_lock:
            if self.pid is not None:
                return self.pid
            response = await self._control("initialize")
            if response is None:
                raise self._gone("initialize claude")
            if response.get("subtype") != "success":
                raise Refusal(
                    Code.HARNESS_ERROR,
                    f"claude connector: claude refused initialize: {response.get('error')}",
                    "read the seat's log",
                )
            pid = (response.get("response") or {}).get("pid")
            if not isinstance(pid, int) or pid <= 0:
                raise Refusal(
                    Code.HARNESS_ERROR,
                    "claude connector: claude's initialize response names no pid",
                    "this Claude Code version is not the pinned one; run `python -m "
                    "manager.cli.tools install`",
                )
            self.pid = pid
            return pid

    def _registry_session(self, pid: int) -> str | None:
        """The session Claude Code's live registry says process `pid` holds."""
        if self._config_dir is None:
            return None
        try:
            record = json.loads(
                _read_capped(self._config_dir / "sessions" / f"{pid}.json", REGISTRY_CAP)
            )
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict) or record.get("pid") != pid:
            return None
        sid = record.get("sessionId")
        return sid if isinstance(sid, str) and sid else None

    async def get_state(self) -> str | None:
        """The session id Claude Code reports now; writes the pointer once it matches the launch."""
        if not self._reader.running:
            raise self._gone("query claude's state")
        pid = await self._initialize()
        sid = await anyio.to_thread.run_sync(self._registry_session, pid) or self._reported
        if sid is not None:
            if self.session_id is not None and sid != self.session_id:
                self._note(f"claude switched from session {self.session_id} to {sid}")
            self.session_id = sid
            await self._write_pointer("running")
            self.state_known.set()
        return sid

    # -- turns ----------------------------------------------------------------------------------

    async def _learn_session(self) -> None:
        try:
            # The registry entry is written during startup; poll it for a bounded time, then
            # go on: the first turn's events report the session too.
            with anyio.move_on_after(BOOT_POLL_S):
                while self.session_id is None and self._reader.running:
                    if await self.get_state() is None:
                        await anyio.sleep(0.05)
        except Refusal as exc:
            # Not fatal here: the initial prompt still goes out (or ends `unknown` when claude
            # is gone), and the manager's own get_state reports the refusal.
            self._note(exc.text)
        finally:
            self.state_known.set()

    async def _turn_locked(self, text: str, message_id: str) -> TurnOutcome:
        if not self._reader.running:
            return TurnOutcome("unknown", detail=f"not delivered: {self._reader.detail}")
        offsets = await anyio.to_thread.run_sync(self._transcript_sizes)
        turn = _Turn(str(uuid.uuid4()), offsets)
        self._turn = turn
        try:
            sent = await self._send(
                {
                    "type": "user",
                    "uuid": turn.uuid,
                    "parent_tool_use_id": None,
                    "message": {"role": "user", "content": text},
                }
            )
            if not sent:
                return TurnOutcome(
                    "unknown",
                    detail=f"claude's stdin closed before prompt {message_id} was delivered",
                )
            await turn.end.done.wait()
        finally:
            self._turn = None
        if not self._materialized:
            await anyio.to_thread.run_sync(self._mark_materialized)
        if turn.end.value is None:
            return TurnOutcome(
                "unknown", detail=f"turn {message_id} did not end: {self._reader.detail}"
            )
        outcome = replace(
            judge_result(turn.end.value, interrupted=turn.interrupted),
            usage=result_usage(turn.end.value),
        )
        if outcome.status == "ok" and not await self._await_persisted(turn):
            # Claude Code emits `result` before its transcript write lands (measured: 50-100 ms
            # later). A turn acknowledged but lost to a crash in that window would be neither
            # in the session nor redelivered, so `ok` waits until the transcript holds it.
            return TurnOutcome(
                "unknown",
                detail=f"claude did not write turn {message_id} to its transcript "
                f"within {PERSIST_TIMEOUT_S:.0f}s "
                f"({self._reader.detail if self._reader.phase == 'stopped' else 'still running'})",
                usage=outcome.usage,
            )
        return outcome

    def _mark_materialized(self) -> None:
        """Record in the launch record that the session now has a transcript, so a later
        continuation that finds none refuses instead of redoing the start (see the module doc)."""
        if (
            self._config_dir is None
            or self.session_id is None
            or not transcripts(self._config_dir, self.session_id)
        ):
            return
        record = _read_launch_record(self._config_dir)
        if (
            record is not None
            and record.get("sessionId") == self.session_id
            and not record.get("materialized")
        ):
            record["materialized"] = True
            write_private_atomic(
                self._config_dir / LAUNCH_RECORD, json.dumps(record, indent=1).encode()
            )
        self._materialized = True

    def _transcript_sizes(self) -> dict[Path, int]:
        if self._config_dir is None or self.session_id is None:
            return {}
        sizes = {}
        for path in transcripts(self._config_dir, self.session_id):
            try:
                sizes[path] = os.stat(path).st_size
            except FileNotFoundError:
                pass
        return sizes

    def _persisted(self, turn: _Turn) -> bool:
        if self._config_dir is None or self.session_id is None or turn.last_uuid is None:
            return False
        needle = turn.last_uuid.encode()
        for path in transcripts(self._config_dir, self.session_id):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                os.lseek(fd, turn.offsets.get(path, 0), os.SEEK_SET)
                chunks = []
                while chunk := os.read(fd, 1 << 20):
                    chunks.append(chunk)
            finally:
                os.close(fd)
            if needle in b"".join(chunks):
                return True
        return False

    async def _await_persisted(self, turn: _Turn) -> bool:
        with anyio.move_on_after(PERSIST_TIMEOUT_S):
            while True:
                if await anyio.to_thread.run_sync(self._persisted, turn):
                    return True
                if not self._reader.running:
                    # The process is gone: whatever it wrote is all there will be; one last look.
                    return await anyio.to_thread.run_sync(self._persisted, turn)
                await anyio.sleep(PERSIST_POLL_S)
        return False

    async def interrupt(self) -> bool:
        """Ask Claude Code to abort the turn in flight; its `result` then ends it as `aborted`."""
        turn = self._turn
        if turn is None:
            return False
        turn.interrupted = True
        response = await self._control("interrupt")
        return response is not None and response.get("subtype") == "success"


def result_usage(result: Mapping[str, Any]) -> TurnUsage | None:
    """The tokens of one `result` event: its `usage` is this turn's, summed over the turn's
    model calls (`input_tokens`, `output_tokens`, `cache_read_input_tokens`,
    `cache_creation_input_tokens`, measured on 2.1.x). Its `modelUsage` is the session's so far,
    keyed by model, so it names the model and no more: the one that wrote the most output (a
    helper model Claude Code calls on the side writes little). None when there is no usage."""
    usage = result.get("usage")
    if not isinstance(usage, dict):
        return None
    by_model = result.get("modelUsage")
    model = None
    if isinstance(by_model, dict) and by_model:
        named = [
            (token_count(v.get("outputTokens")) if isinstance(v, dict) else 0, k)
            for k, v in by_model.items()
        ]
        model = model_name(max(named)[1])
    return TurnUsage(
        input_tokens=token_count(usage.get("input_tokens")),
        output_tokens=token_count(usage.get("output_tokens")),
        cache_read_tokens=token_count(usage.get("cache_read_input_tokens")),
        cache_write_tokens=token_count(usage.get("cache_creation_input_tokens")),
        model=model,
    )


def judge_result(result: Mapping[str, Any], *, interrupted: bool = False) -> TurnOutcome:
    """Classify one `result` event. Only a successful, non-error result with some output is
    `ok`; everything else keeps the delivery.

    `is_error` is checked, not only `subtype`: Claude Code reports an unreachable API or a
    missing login as subtype `success` with `is_error: true` (measured).
    """
    subtype = result.get("subtype")
    text = result.get("result")
    text = text if isinstance(text, str) else ""
    if subtype == "success":
        if result.get("is_error") is True:
            # An unreachable or overloaded API (`API Error: 529 ...`, after Claude Code's own
            # retries) is the provider's, not the turn's: `provider-unavailable`.
            return unavailable_outcome(
                TurnOutcome("error", detail=text or "claude reported an error")
            )
        if result.get("is_error") is not False:
            return TurnOutcome(
                "unknown", detail="claude's result does not say whether it is an error"
            )
        if not text.strip():
            return TurnOutcome("unknown", detail="the model produced no output")
        if result.get("num_turns") == 0:
            # With slash commands disabled, a message starting with '/' is answered locally and
            # recorded in the transcript; the model reads it with the next turn. Redelivering it
            # would only be answered the same way.
            return TurnOutcome(
                "ok", reply=text, detail="answered by claude locally, without a model turn"
            )
        detail = (
            "reply truncated at the output limit (stop_reason max_tokens)"
            if result.get("stop_reason") == "max_tokens"
            else ""
        )
        return TurnOutcome("ok", reply=text, detail=detail)
    errors = result.get("errors")
    extra = f": {'; '.join(map(str, errors))}" if isinstance(errors, list) and errors else ""
    if subtype == "error_during_execution":
        if interrupted:
            return TurnOutcome("aborted", detail=f"turn interrupted{extra}")
        return TurnOutcome(
            "error", detail=f"claude ended the turn with error_during_execution{extra}"
        )
    if isinstance(subtype, str) and subtype.startswith("error"):
        return TurnOutcome("error", detail=f"claude ended the turn with {subtype}{extra}")
    return TurnOutcome("unknown", detail=f"claude ended the turn with result subtype {subtype!r}")
