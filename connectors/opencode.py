"""The OpenCode connector: one long-lived `opencode acp` process, driven over the Agent Client
Protocol (`connectors/acp.py`). This module holds what is OpenCode's own: its launch (offline,
configured from `[agents.opencode]`), its store (one SQLite file and a data directory per seat)
and its quirks (the session's recorded directory, the plugin it would install at every start).
What was measured on the pinned version is in docs/design.md, "OpenCode".
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from connectors.acp import (
    LAUNCH_RECORD,
    AcpDriver,
    AcpHarness,
    EndpointLaunch,
    PermissionPolicy,
    PolicyMode,
    launch_record,
    mesh_servers,
    policy_mode,
)
from connectors.base import (
    ByteReceive,
    ByteSend,
    Capabilities,
    LaunchOpts,
    LaunchSpec,
    StoreDecl,
)
from connectors.doctorkit import (
    HarnessCheck,
    Pins,
    config_problem,
    pinned_or_configured,
    probe_env,
    version_run,
)
from connectors.harnesses import Native, Pin, binary_of, get_pin
from connectors.launchkit import (
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
    refuse_fork,
    require_executable,
    seat_cwd,
    seat_files,
)
from connectors.launchkit import (
    ProviderKey as Key,
)
from connectors.launchkit import (
    resolve_key as resolve_provider_key,
)
from connectors.privatefs import ensure_seat_dir, write_private_atomic
from protocol import names
from protocol.errors import Refusal
from protocol.refusals import Code

NAME = "opencode"
# The variable the seat's provider entry reads (`{env:...}` in its config): the key travels in
# it alone. Not OPENAI_API_KEY, so an operator's own key never reaches a seat unless
# `[agents.opencode]` names it.
KEY_VAR = "OPENCODE_PROVIDER_API_KEY"
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MODEL = "gpt-4o-mini"
PROVIDER = "cotal"
# An OpenCode session id (measured on 1.18.33: `ses_` and 26 letters and digits).
SESSION_ID_RE = re.compile(r"ses_[0-9A-Za-z]{20,40}\Z")
# The seat's `.home` store is OpenCode's data home (`XDG_DATA_HOME`): `opencode/` there holds
# its database, where it keeps every session (measured on 1.18.33: `opencode/opencode.db`, the
# default when `OPENCODE_DB` is unset), and its snapshots, logs and repository cache.
DB_PATH = ("opencode", "opencode.db")
# The platform package, for a pin file that does not name it (`harnesses.json` may).
NATIVE = Native("opencode-{platform}", "bin/opencode")
# OpenCode's switches for what it would otherwise fetch, read or share (measured on 1.18.33;
# the names are its own environment flags).
OFFLINE_ENV = {
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
    # `~/.claude` (CLAUDE.md, skills) is the operator's, not the seat's.
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    # Only `[agents.opencode]` configures a seat: a project's `opencode.json` could point the
    # provider (and the key in it) anywhere, or grant its tools more.
    "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
}
RESERVED_ENV = frozenset(
    {
        KEY_VAR,
        "OPENCODE_DB",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
        "XDG_STATE_HOME",
        "XDG_CACHE_HOME",
        *OFFLINE_ENV,
    }
)
# OpenCode's tool permissions: every tool that touches a file or runs a command asks, and the
# seat's policy (`connectors.acp.PermissionPolicy`) answers; what reaches beyond the seat (the
# web, subagents, skills, questions for a human) is denied outright.
PERMISSIONS = {
    "read": "ask",
    "edit": "ask",
    "bash": "ask",
    "glob": "ask",
    "grep": "ask",
    "list": "ask",
    "external_directory": "ask",
    "doom_loop": "ask",
    "webfetch": "deny",
    "websearch": "deny",
    "codesearch": "deny",
    "task": "deny",
    "lsp": "deny",
    "skill": "deny",
    "question": "deny",
    "todowrite": "allow",
}


# -- the store ------------------------------------------------------------------------------------


def store_db(store: Path) -> Path:
    return store.joinpath(*DB_PATH)


def session_directory(store: Path, session_id: str) -> str | None:
    """The directory OpenCode recorded for the session, or None when the store does not hold
    it (no database, no such row)."""
    db = store_db(store)
    if not db.is_file() or db.is_symlink():
        return None
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            row = conn.execute(
                "SELECT directory FROM session WHERE id = ?", (session_id,)
            ).fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return str(row[0]) if row is not None else None


def has_session(store: Path, session_id: str) -> bool:
    return session_directory(store, session_id) is not None


def repoint_session(store: Path, session_id: str, cwd: Path) -> None:
    """Make the store name the seat's cwd as the session's directory.

    OpenCode records a session's absolute directory and, at `session/load`, takes it over the
    cwd it is given (measured on 1.18.33: at another path the agent silently worked in the old
    directory while it existed, and failed every prompt once it was gone). The project the
    session belongs to records its worktree the same way; where the old worktree held the old
    directory, it is carried along by the same suffix."""
    db = store_db(store)
    try:
        conn = sqlite3.connect(db, timeout=5)
        try:
            with conn:
                row = conn.execute(
                    "SELECT directory, project_id FROM session WHERE id = ?", (session_id,)
                ).fetchone()
                if row is None or row[0] == str(cwd):
                    return
                old, project = Path(str(row[0])), str(row[1])
                conn.execute(
                    "UPDATE session SET directory = ? WHERE id = ?", (str(cwd), session_id)
                )
                found = conn.execute(
                    "SELECT worktree FROM project WHERE id = ?", (project,)
                ).fetchone()
                if found is not None:
                    worktree = Path(str(found[0]))
                    if old == worktree or old.is_relative_to(worktree):
                        depth = len(old.relative_to(worktree).parts)
                        moved = cwd.parents[depth - 1] if depth else cwd
                        conn.execute(
                            "UPDATE project SET worktree = ? WHERE id = ?", (str(moved), project)
                        )
                conn.execute(
                    "DELETE FROM project_directory WHERE project_id = ? AND directory = ?",
                    (project, str(old)),
                )
        finally:
            conn.close()
    except (sqlite3.Error, IndexError) as exc:
        raise Refusal(
            Code.HARNESS_ERROR,
            f"opencode connector: cannot point session {session_id} in {db} at {cwd} ({exc})",
            "restore the seat's session store from its checkpoint, or start the seat fresh",
        ) from None


# -- the seat's configuration directory -----------------------------------------------------------


def config_json(*, base_url: str, model: str) -> dict[str, Any]:
    """The seat's `opencode.json`: one OpenAI-compatible provider at `base_url` (its key read
    from KEY_VAR), the model, the tools' permissions, nothing shared, no update."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        # OpenCode's undo snapshots are a git repository of the whole worktree in its data
        # home, kept by `git` processes it starts in sessions of their own (measured on
        # 1.18.33): they outlive the seat's stop, and the cut would carry every object of the
        # tree as a store file. A seat's work is the repository the cut already carries.
        "snapshot": False,
        "enabled_providers": [PROVIDER],
        "model": f"{PROVIDER}/{model}",
        "small_model": f"{PROVIDER}/{model}",
        "permission": PERMISSIONS,
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": PROVIDER,
                "options": {"baseURL": base_url, "apiKey": "{env:" + KEY_VAR + "}"},
                "models": {model: {"name": model}},
            }
        },
    }


def write_config_dir(
    config_home: Path, pin: Pin | None, *, base_url: str, model: str, permission: PolicyMode
) -> None:
    """`<config_home>/opencode/`: the seat's `opencode.json`, and the plugin dependency OpenCode
    would otherwise install there from npm at every start (measured on 1.18.33: `opencode acp`
    runs an npm install of `@opencode-ai/plugin` into its config directory unless the directory
    already holds a tree it finds complete). The tree it finds complete is the pinned install's
    own: its `package.json`, its `package-lock.json` and a link to its `node_modules`, which
    `cotal tools install` put there with the harness (the pin's companion); nothing is fetched
    and nothing is copied."""
    target = config_home / "opencode"
    ensure_seat_dir(config_home, agent=NAME)
    ensure_seat_dir(target, agent=NAME)
    write_private_atomic(
        target / "opencode.json",
        json.dumps(config_json(base_url=base_url, model=model), indent=2).encode(),
    )
    # What the driver needs of this launch: the model it names in usage records and the policy
    # it answers the agent's permission requests by.
    write_private_atomic(
        config_home / LAUNCH_RECORD,
        json.dumps({"model": model, "permission": permission}).encode(),
    )
    if pin is None:
        return
    for name in ("package.json", "package-lock.json"):
        source = pin.prefix / name
        if source.is_file():
            write_private_atomic(target / name, source.read_bytes())
    link = target / "node_modules"
    modules = pin.prefix / "node_modules"
    if link.is_symlink() and os.readlink(link) == str(modules):
        return
    if link.is_symlink() or link.is_file():
        link.unlink()
    elif link.is_dir():
        shutil.rmtree(link)
    os.symlink(modules, link)


# -- the connector --------------------------------------------------------------------------------


class OpenCodeConfig(KeyedEndpointConfig, frozen=True):
    """`[agents.opencode]`: an OpenAI-compatible Chat Completions endpoint and model, where the
    key comes from (a variable or a 0600 file), what the agent's tools may do (`permission`:
    `workspace-write`, the default, or `read-only`), the executable, and variables passed
    through to the seat. Anything else is refused."""

    permission: str | None = None


class OpenCodeConnector:
    name = NAME
    # Exact continuation is measured on the pinned version (docs/design.md, "OpenCode"): after
    # a kill -9, a new process's `session/load` reopens the session under the same id and the
    # next request to the model carries the earlier turns. Forking is not implemented.
    capabilities = Capabilities(
        supports_resume=False,
        supports_session_continuation=True,
        supports_fresh_start=True,
        supports_prompt=True,
    )
    # Measured on 1.18.33: the store (OpenCode's data home) holds `opencode/opencode.db` with
    # its `-wal` and `-shm`, `opencode/log/` and an empty `opencode/repos/`, all regular files
    # and directories; its state (locks) and cache live under the seat's config directory,
    # which is not the store. With snapshots off, nothing in it is scratch.
    store_scratch: tuple[str, ...] = ()
    config_type = OpenCodeConfig
    session_versions: tuple[str, ...] = ()

    def build_launch(self, opts: LaunchOpts) -> LaunchSpec:
        refuse_fork(
            NAME,
            opts,
            "spawn the seat without --resume; an OpenCode seat continues its own session",
        )
        check_prompt(NAME, opts.prompt)
        cfg = _check_config(opts)
        files = seat_files(NAME, opts, ".home")
        config_home = files.pointer.with_suffix(".config")
        cwd = seat_cwd(NAME, opts)
        binary = cfg.binary or str(pinned_program())
        require_executable(NAME, binary, "run `cotal tools install` or fix agents.opencode.binary")
        if opts.continue_session:
            if not SESSION_ID_RE.match(opts.continue_session):
                raise Refusal(
                    Code.BAD_SESSION,
                    f"opencode connector: continueSession {opts.continue_session!r} is not an "
                    "OpenCode session id (ses_...)",
                    "pass the full id exactly as recorded",
                )
            if not has_session(files.store, opts.continue_session):
                raise Refusal(
                    Code.NO_SESSION,
                    f"opencode connector: no session {opts.continue_session} in the seat's "
                    f"store {store_db(files.store)}",
                    "restore the seat's session store (a checkpoint's harness store) or start "
                    "the seat fresh",
                )

        ensure_seat_dir(files.pointer.parent, agent=NAME)
        ensure_seat_dir(files.store, agent=NAME)
        write_config_dir(
            config_home,
            _companion_pin(cfg),
            base_url=cfg.base_url,
            model=cfg.model,
            permission=cfg.permission,
        )
        if opts.continue_session:
            repoint_session(files.store, opts.continue_session, cwd)
        else:
            drop_stale_pointer(files.pointer)

        env = base_env(opts, extra_allow=cfg.passthrough)
        env.update(OFFLINE_ENV)
        # The store is named as a directory, and `OPENCODE_DB` is left unset: the seat's sandbox
        # binds back the `.cotal` paths a launch names (making a directory of one not there
        # yet), and SQLite creates its journal beside the database.
        env["XDG_DATA_HOME"] = str(files.store)
        env["XDG_CONFIG_HOME"] = str(config_home)
        env["XDG_STATE_HOME"] = str(config_home / "state")
        env["XDG_CACHE_HOME"] = str(config_home / "cache")
        # The key travels in the child's environment only (never argv, never a file), declared
        # secret so the manager never logs it.
        env[KEY_VAR] = cfg.key.value
        return LaunchSpec(
            argv=[binary, "acp"],
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
        config = decode_config(NAME, opts.config, OpenCodeConfig)
        return {"permissionMode": _permission(config), "credentials": _key_source(config)}

    def doctor(self, config: Mapping[str, Any], pins: Pins) -> HarnessCheck:
        check = HarnessCheck()
        _doctor(check, decode_config(NAME, config, OpenCodeConfig), pins)
        return pins.noted(check)

    def make_driver(self, stdin: ByteSend, stdout: ByteReceive, spec: LaunchSpec) -> AcpDriver:
        data = spec.env.get("XDG_DATA_HOME")
        store = Path(data) if data else None
        config = _launched_config(spec)
        harness = AcpHarness(
            name=NAME,
            session_id=lambda sid: bool(SESSION_ID_RE.match(sid)),
            reopenable=(lambda sid: has_session(store, sid)) if store else (lambda _sid: False),
            # Measured on 1.18.33 against the fake's 120 prompt tokens, 20 of them cached:
            # `inputTokens` 100, `cachedReadTokens` 20.
            input_includes_cache=False,
            model=config.get("model"),
        )
        return OpenCodeDriver(
            stdin,
            stdout,
            harness=harness,
            policy=PermissionPolicy(config["permission"], spec.cwd),
            cwd=spec.cwd,
            pointer_path=spec.session_pointer_path,
            expected_session_id=spec.expected_session_id,
            initial_prompt=spec.initial_prompt,
            mcp_servers=mesh_servers(spec.env),
        )


class OpenCodeDriver(AcpDriver):
    who = NAME


def _launched_config(spec: LaunchSpec) -> dict[str, Any]:
    """The model and the tools' policy the launch recorded beside the seat's config
    (`acp.launch_record`)."""
    home = spec.env.get("XDG_CONFIG_HOME")
    return launch_record(Path(home) if home else None)[0]


def pinned_program() -> Path:
    """The native program in the pinned package's platform dependency (`opencode-<platform>`,
    `bin/opencode`); the main package's `bin` is a stub its postinstall replaces, and installs
    here run without scripts."""
    pin = get_pin(NAME)
    return binary_of(pin if pin.native is not None else replace(pin, native=NATIVE))


def _companion_pin(cfg: EndpointLaunch) -> Pin | None:
    """The pinned install whose plugin tree the seat's config directory links, or None for a
    configured binary (whose own version may want another plugin: OpenCode then installs it
    itself, as it would anywhere)."""
    if cfg.binary is not None:
        return None
    pin = get_pin(NAME)
    return pin if pin.companions else None


# -- configuration --------------------------------------------------------------------------------


def _permission(config: OpenCodeConfig) -> PolicyMode:
    return policy_mode(NAME, config.permission)


def _key_source(config: OpenCodeConfig) -> str:
    return key_source(NAME, config, DEFAULT_KEY_ENV)


def resolve_key(config: OpenCodeConfig) -> Key:
    """The provider key, read at every spawn (`launchkit.resolve_key`)."""
    return resolve_provider_key(NAME, config, DEFAULT_KEY_ENV)


def _doctor(check: HarnessCheck, cfg: OpenCodeConfig, pins: Pins) -> None:
    program = pinned_or_configured(
        check, NAME, cfg.binary, pins, locate=lambda _pin: pinned_program()
    )
    if program is None:
        return
    with tempfile.TemporaryDirectory(prefix="cotal-doctor-") as tmp:
        version_run(
            check,
            [program],
            probe_env(
                tmp,
                XDG_CONFIG_HOME=f"{tmp}/config",
                XDG_DATA_HOME=f"{tmp}/data",
                XDG_STATE_HOME=f"{tmp}/state",
                XDG_CACHE_HOME=f"{tmp}/cache",
                **OFFLINE_ENV,
            ),
        )
    try:
        resolve_key(cfg)
    except Refusal as exc:
        config_problem(check, exc)


def _check_config(opts: LaunchOpts) -> EndpointLaunch:
    config = decode_config(NAME, opts.config, OpenCodeConfig)
    base_url = endpoint_url(
        NAME,
        DEFAULT_BASE_URL if config.base_url is None else config.base_url,
        otherwise=Refusal(
            Code.BAD_LAUNCH,
            "opencode connector: base_url must be an http(s) URL of an OpenAI-compatible "
            f"endpoint (got {config.base_url!r})",
            "set agents.opencode.base_url in cotal.toml, e.g. http://127.0.0.1:8080/v1, or "
            "unset it",
        ),
    )
    model = opts.model or config.model or DEFAULT_MODEL
    if not names.HARNESS_MODEL.matches(model) or "/" in model:
        raise Refusal(
            Code.BAD_LAUNCH,
            f"opencode connector: model {model!r} is not a model name (the provider is cotal's)",
            "pass --model or set agents.opencode.model in cotal.toml, without a provider prefix",
        )
    permission = _permission(config)
    extra_env = passthrough_names(NAME, config.extra_env, RESERVED_ENV)
    binary = configured_binary(NAME, config.binary, what="the opencode executable")
    # Last among the checks: a launch refused for its config never reads a secret.
    key = resolve_key(config)
    return EndpointLaunch(base_url, model, permission, key, binary, tuple(extra_env))
