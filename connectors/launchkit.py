"""Launch-option plumbing the connectors share: the environment a seat gets, the checks every
connector applies to prompts, config keys, endpoints, environment names and binaries, and the
seat's files beside its session pointer.

Each refusal names the connector (`agent`); where connectors word a refusal differently, the
helper takes the connector's words or leaves the refusal to the connector.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from connectors.base import LaunchOpts
from connectors.harnesses import which
from connectors.meshclient import MESH_DIR_ENV
from protocol.errors import Refusal
from protocol.names import ENV_NAME, SESSION_UUID, check_lifecycle_uid, check_seat_name
from protocol.refusals import Code

# Only these variables of the manager's environment reach a seat; the operator's tokens and
# keys do not leak into a harness by accident.
ENV_ALLOW = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TMPDIR",
    "USER",
    "LOGNAME",
    "TZ",
)
ENV_NAME_RE = ENV_NAME.regex
# A session id in the lowercase UUID form pi and Claude Code both mint.
UUID_RE = SESSION_UUID.regex
_URL_RE = re.compile(r"^https?://[^\s/@]+(/\S*)?\Z")


def base_env(opts: LaunchOpts, extra_allow: tuple[str, ...] = ()) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ENV_ALLOW or k in extra_allow}
    env.update(
        COTAL_SPACE=opts.space,
        COTAL_NAME=opts.name,
        COTAL_LIFECYCLE_UID=opts.lifecycle_uid,
        COTAL_WORKSPACE_ROOT=str(opts.workspace_root),
        COTAL_SESSION_STATE=str(opts.session_pointer_path),
    )
    if opts.mesh_dir is not None:
        # Named in the launch, so the sandbox binds it into this seat's file tree.
        env[MESH_DIR_ENV] = str(opts.mesh_dir)
    return env


# -- options --------------------------------------------------------------------------------------


def refuse_resume_with_continuation(agent: str, opts: LaunchOpts) -> None:
    if opts.resume and opts.continue_session:
        raise Refusal(
            Code.BAD_LAUNCH,
            f"{agent} connector: resume and continueSession are mutually exclusive",
            "pass either --resume (fork) or let the manager continue the seat's own session",
        )


def check_prompt(agent: str, prompt: str | None) -> None:
    if prompt is None:
        return
    if not prompt.strip():
        raise Refusal(
            Code.BAD_PROMPT,
            f"{agent} connector refuses an empty prompt",
            "pass a non-empty --prompt",
        )
    if prompt.startswith(("-", "@")):
        raise Refusal(
            Code.BAD_PROMPT,
            f"{agent} connector refuses a prompt starting with '-' or '@' (the harness would "
            "parse it as an option or a file)",
            "reword the prompt so it starts with a letter",
        )


def launch_prompt(opts: LaunchOpts) -> str | None:
    """The launch prompt a driver delivers as turn 0, for harnesses that take none in argv."""
    return opts.prompt.strip() if opts.prompt else None


def seat_cwd(agent: str, opts: LaunchOpts) -> Path:
    cwd = Path(os.path.abspath(opts.cwd))
    if not cwd.is_dir():
        raise Refusal(
            Code.BAD_CWD,
            f"{agent} connector: cwd {cwd} is not a directory",
            "pass an existing directory as the seat's cwd",
        )
    return cwd


# -- the operator's per-agent config --------------------------------------------------------------

C = TypeVar("C", bound=msgspec.Struct)


def config_keys(config_type: type[msgspec.Struct]) -> tuple[str, ...]:
    """The keys a connector's config struct honours, sorted for messages."""
    return tuple(sorted(config_type.__struct_fields__))


def unknown_keys(config: Mapping[str, Any], config_type: type[msgspec.Struct]) -> list[str]:
    """Every key of `config` the struct does not declare (msgspec names only the first)."""
    return sorted(set(config) - set(config_type.__struct_fields__))


class KeyedEndpointConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The settings every harness that calls a provider with a key shares: the endpoint, the
    model, where the key comes from (the NAME of a variable, or a 0600 file), the executable,
    and the variables passed through to the seat. A connector's own record adds its own."""

    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    api_key_file: str | None = None
    binary: str | None = None
    extra_env: list[str] = []


def decode_config(
    agent: str,
    config: Mapping[str, Any],
    config_type: type[C],
    *,
    dropped: str = "at launch and on every restart",
) -> C:
    """`config` decoded strictly into the connector's one config struct. A key silently dropped
    would not survive into a crash restart either, so an unknown key is refused by name."""
    unknown = unknown_keys(config, config_type)
    if unknown:
        raise Refusal(
            Code.BAD_LAUNCH,
            f"{agent} connector: config key(s) {', '.join(unknown)} are not implemented, so they "
            f"would be dropped {dropped}",
            f"remove them; {agent} honours {', '.join(config_keys(config_type))}",
        )
    try:
        return msgspec.convert(dict(config), config_type, strict=True)
    except msgspec.ValidationError as exc:
        raise Refusal(
            Code.BAD_LAUNCH,
            f"{agent} connector: config is malformed: {exc}",
            f"fix agents.{agent} in cotal.toml",
        ) from None


def endpoint_url(agent: str, value: Any, *, otherwise: Refusal) -> str:
    """`value` when it is an http(s) URL without credentials in it; else a refusal that names
    the credentials, or `otherwise` (the connector's words for a missing or malformed URL)."""
    if isinstance(value, str) and _URL_RE.match(value):
        return value
    if isinstance(value, str) and "@" in value:
        raise Refusal(
            Code.BAD_LAUNCH,
            f"{agent} connector: base_url must not carry credentials (user:password@)",
            "put the key in an environment variable and name it with api_key_env",
        )
    raise otherwise


def key_env_name(agent: str, value: str, *, example: str) -> str:
    if not ENV_NAME.matches(value):
        raise Refusal(
            Code.BAD_LAUNCH,
            f"{agent} connector: api_key_env {value!r} is not an environment variable name",
            f"name the variable that holds the key, e.g. {example}",
        )
    return value


def one_key_source(agent: str, api_key_env: str | None, api_key_file: str | None) -> None:
    """Refuse a configuration naming the key twice (a variable and a file)."""
    if api_key_env is not None and api_key_file is not None:
        raise Refusal(
            Code.BAD_LAUNCH,
            f"{agent} connector: api_key_env and api_key_file both name the key",
            f"keep one of agents.{agent}.api_key_env and agents.{agent}.api_key_file",
        )


def key_file_path(agent: str, value: str | None) -> Path | None:
    """`agents.<agent>.api_key_file` as an absolute, normalized path, or None when unset."""
    if value is None:
        return None
    if not os.path.isabs(value):
        raise Refusal(
            Code.BAD_LAUNCH,
            f"{agent} connector: api_key_file must be an absolute path, got {value!r}",
            f"set agents.{agent}.api_key_file to the absolute path of a 0600 file holding the key",
        )
    return Path(os.path.normpath(value))


def key_in_file(agent: str, path: Path, data: bytes) -> str:
    """The one key a key file holds: one printable ASCII line without spaces."""
    try:
        key = data.decode("ascii").strip()
    except UnicodeDecodeError:
        key = ""
    if not key or any(c.isspace() or not c.isprintable() for c in key):
        raise Refusal(
            Code.BAD_CREDENTIALS,
            f"{agent} connector: api_key_file {path} does not hold one key (one line, no spaces)",
            f"write the key alone into {path} (chmod 600), or unset agents.{agent}.api_key_file",
        )
    return key


def extra_env_names(agent: str, extra_env: Sequence[str]) -> list[str]:
    if not all(ENV_NAME.matches(n) for n in extra_env):
        raise Refusal(
            Code.BAD_LAUNCH,
            f"{agent} connector: extra_env must be a list of environment variable names, got "
            f"{list(extra_env)!r}",
            f"fix agents.{agent}.extra_env in cotal.toml",
        )
    return list(extra_env)


def passthrough_names(
    agent: str,
    extra_env: Sequence[str],
    reserved: frozenset[str],
    *,
    prefixes: tuple[str, ...] = ("COTAL_",),
    why: str = "which the connector sets itself",
) -> list[str]:
    """`agents.<agent>.extra_env` checked: names of variables, none the connector sets itself
    (`reserved`, or starting with one of `prefixes`)."""
    names = extra_env_names(agent, extra_env)
    clash = sorted(n for n in names if n in reserved or n.startswith(prefixes))
    if clash:
        raise Refusal(
            Code.BAD_LAUNCH,
            f"{agent} connector: extra_env names {', '.join(clash)}, {why}",
            f"remove them from agents.{agent}.extra_env",
        )
    return names


def configured_binary(agent: str, binary: str | None, *, what: str) -> str | None:
    """`binary` from the config, which must be an absolute path to `what`; None when unset."""
    if binary is not None and not os.path.isabs(binary):
        raise Refusal(
            Code.BAD_LAUNCH,
            f"{agent} connector: binary must be an absolute path, got {binary!r}",
            f"set agents.{agent}.binary to the absolute path of {what}, or unset it to use the "
            "pinned install",
        )
    return binary


def pinned_binary(agent: str) -> str:
    """Where the installer put the pinned harness `agent`."""
    return str(which(agent))


# -- the seat's files ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SeatFiles:
    """The session pointer the manager chose and the seat's store, its sibling by construction:
    one name identifies the seat's whole state, and a checkpoint restores both at the same
    relative place."""

    pointer: Path
    store: Path
    store_relpath: str


def seat_files(agent: str, opts: LaunchOpts, store_suffix: str) -> SeatFiles:
    check_seat_name(opts.name)
    check_lifecycle_uid(opts.lifecycle_uid)
    root = Path(os.path.normpath(opts.workspace_root))
    pointer = Path(os.path.normpath(opts.session_pointer_path))
    if not root.is_absolute() or not pointer.is_absolute():
        raise Refusal(
            Code.BAD_LAUNCH,
            f"{agent} connector needs absolute paths (root {root}, pointer {pointer})",
            "pass the workspace root and pointer path as absolute paths",
        )
    if pointer.suffix != ".json":
        raise Refusal(
            Code.BAD_LAUNCH,
            f"{agent} connector: the session pointer {pointer} must end in .json",
            f"use the workspace layout's pointer path (.cotal/sessions/{agent}/<name>-<uid>.json)",
        )
    store = pointer.with_suffix(store_suffix)
    try:
        relpath = store.relative_to(root).as_posix()
    except ValueError:
        raise Refusal(
            Code.BAD_LAUNCH,
            f"{agent} connector: the session pointer {pointer} is outside the workspace root "
            f"{root}",
            "keep the pointer under <root>/.cotal so the session store is captured relative to "
            "the root",
        ) from None
    return SeatFiles(pointer=pointer, store=store, store_relpath=relpath)


def drop_stale_pointer(pointer: Path) -> None:
    """Remove a pointer left by an earlier launch of this lifecycle: it names a session this
    launch does not continue, and a crash before the driver rewrites it must not reopen that one."""
    try:
        os.unlink(pointer)
    except FileNotFoundError:
        pass


# -- a provider key: a 0600 file or a variable of the manager's environment ---------------------

KEY_FILE_CAP = 4096


@dataclass(frozen=True)
class ProviderKey:
    value: str = field(repr=False)
    # Where it was read (`api_key_file PATH` or `api_key_env NAME`): what doctor and ps show.
    source: str


def _key_file(agent: str, config: KeyedEndpointConfig) -> Path | None:
    one_key_source(agent, config.api_key_env, config.api_key_file)
    return key_file_path(agent, config.api_key_file)


def _key_var(agent: str, config: KeyedEndpointConfig, default_env: str) -> str:
    return key_env_name(agent, config.api_key_env or default_env, example=default_env)


def key_source(agent: str, config: KeyedEndpointConfig, default_env: str) -> str:
    """Where `resolve_key` would read the key, without reading it (a seat's description)."""
    path = _key_file(agent, config)
    if path is not None:
        return f"api_key_file {path}"
    return f"api_key_env {_key_var(agent, config, default_env)}"


def resolve_key(agent: str, config: KeyedEndpointConfig, default_env: str) -> ProviderKey:
    """The provider key, read now (every spawn): the key file, else the named variable of the
    manager's environment. Nothing is stored: a moved seat takes its key from its new host."""
    from connectors.privatefs import read_stable

    path = _key_file(agent, config)
    if path is not None:
        cure = f"write the key alone into {path} (chmod 600), or unset agents.{agent}.api_key_file"
        try:
            data = read_stable(
                path,
                cap=KEY_FILE_CAP,
                what=f"{agent} connector: api_key_file",
                require_private=True,
            ).data
        except OSError as exc:
            raise Refusal(
                Code.BAD_CREDENTIALS,
                f"{agent} connector: api_key_file {path} cannot be read ({exc.strerror})",
                cure,
            ) from None
        return ProviderKey(key_in_file(agent, path, data), f"api_key_file {path}")
    var = _key_var(agent, config, default_env)
    value = os.environ.get(var)
    if not value:
        raise Refusal(
            Code.NO_CREDENTIALS,
            f"{agent} connector has no provider key: {var} is not set in the manager's "
            f"environment and no agents.{agent}.api_key_file is configured",
            f"set agents.{agent}.api_key_file to a 0600 file holding the key (read at every "
            f"spawn), or export {var} before starting the manager",
        )
    return ProviderKey(value, f"api_key_env {var}")


def require_executable(agent: str, binary: str, cure: str) -> str:
    """`binary`, once it is a regular file this process may execute."""
    if not os.path.isfile(binary) or not os.access(binary, os.X_OK):
        raise Refusal(
            Code.NOT_INSTALLED,
            f"{agent} connector: binary {binary} does not exist or is not executable",
            cure,
        )
    return binary


def refuse_fork(agent: str, opts: LaunchOpts, cure: str) -> None:
    """Refuse `--resume` (a new session forked from another) for a harness that only continues
    its own session."""
    if opts.resume:
        raise Refusal(
            Code.UNSUPPORTED,
            f"{agent} connector: forking session {opts.resume} is not supported",
            cure,
        )
