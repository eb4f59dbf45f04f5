"""The Codex connector: one long-lived `codex app-server` process, driven over its JSON-RPC
protocol on stdio (one JSON object per line, no `"jsonrpc"` member).

Each seat has its own `CODEX_HOME` (`.cotal/sessions/codex/<seat>-<uid>.home/`), declared as its
session store: the connector writes its `config.toml` at every launch from the operator's
`[agents.codex]` (endpoint, model, approvals, sandbox), and Codex keeps the seat's threads there
as rollout files. What was measured on the pinned version, and why the app-server mode, is in
docs/design.md, "Codex".
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
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
from connectors.harnesses import Native, binary_of, get_pin
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
    key_source,
    launch_prompt,
    passthrough_names,
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
from connectors.meshclient import MESH_DIR_ENV
from connectors.meshtool.mcp import SERVER_NAME as MESH_SERVER
from connectors.privatefs import ensure_seat_dir, write_private_atomic
from protocol import names
from protocol.errors import Refusal
from protocol.refusals import Code

NAME = "codex"
# The variable the seat's provider entry names (`env_key`): the key travels in it alone. Not
# OPENAI_API_KEY, so an operator's own key in the manager's environment never reaches a seat
# unless `[agents.codex]` names it.
KEY_VAR = "CODEX_PROVIDER_API_KEY"
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
PROVIDER = "cotal"
# What the pinned app-server accepts (its generated JSON schema: AskForApproval, SandboxMode),
# less `untrusted`: the schema still names it, but Codex 0.169.0 refuses it in config.toml at
# start ("no longer supported"), so such a seat would exit before ready. Refused at the spawn.
APPROVAL_POLICIES = ("on-request", "never")
SANDBOX_MODES = ("read-only", "workspace-write", "danger-full-access")
# A seat has nobody to answer an approval, and edits its own workspace.
DEFAULT_APPROVAL = "never"
DEFAULT_SANDBOX = "workspace-write"
RESERVED_ENV = frozenset({"CODEX_HOME", KEY_VAR})
LINE_CAP = 64 * 1024 * 1024
PERSIST_TIMEOUT_S = 10.0
PERSIST_POLL_S = 0.02
# The platform package, for a pin file that does not name it (`harnesses.json` may).
NATIVE = Native("@openai/codex-{os}-{arch}", "vendor/*/bin/codex")


# -- the store ------------------------------------------------------------------------------------


def rollouts(home: Path, thread_id: str) -> list[Path]:
    """`sessions/YYYY/MM/DD/rollout-<stamp>-<thread id>.jsonl` in one CODEX_HOME, exact id."""
    return sorted(
        p
        for p in (home / "sessions").glob(f"*/*/*/rollout-*-{thread_id}.jsonl")
        if p.is_file() and not p.is_symlink()
    )


def repoint_state(home: Path, thread_id: str, rollout: Path, cwd: Path) -> None:
    """Make Codex's thread index name the rollout where it now is, and the seat's cwd.

    Codex's `state_<n>.sqlite` records each thread's rollout by absolute path and looks a
    thread up there first (measured on 0.169.0: a store copied to another path resumed by
    appending to the *original* path's file while it existed, and said "no rollout found" once
    it was gone). A store restored at another root would otherwise write outside itself."""
    for db in sorted(home.glob("state_*.sqlite")):
        try:
            with sqlite3.connect(db, timeout=5) as conn:
                known = conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'threads'"
                ).fetchone()
                if known is not None:
                    conn.execute(
                        "UPDATE threads SET rollout_path = ?, cwd = ? WHERE id = ?",
                        (str(rollout), str(cwd), thread_id),
                    )
            conn.close()
        except sqlite3.Error as exc:
            raise Refusal(
                Code.HARNESS_ERROR,
                f"codex connector: cannot update the thread index {db} ({exc})",
                f"remove {db} (Codex rebuilds it from the rollouts under sessions/) and start "
                "the seat again",
            ) from None


def config_toml(
    *, base_url: str, model: str | None, approval: str, sandbox: str, mesh_dir: Path | None = None
) -> str:
    """The seat's `config.toml`. JSON strings are TOML basic strings (ASCII, `\\u` escapes).

    With `mesh_dir`, the mesh tool (cotal's own MCP server, connectors/meshtool) is one of the
    seat's MCP servers, the one Claude Code seats are given: Codex starts it as its child, inside
    the seat's sandbox, and it reaches the manager through the seat's mesh socket."""
    q = json.dumps
    lines = [f"model = {q(model)}"] if model is not None else []
    lines += [
        f"model_provider = {q(PROVIDER)}",
        f"approval_policy = {q(approval)}",
        f"sandbox_mode = {q(sandbox)}",
        "check_for_update_on_startup = false",
        "",
        "[analytics]",
        "enabled = false",
        "",
        # Codex snapshots the shell's environment into CODEX_HOME/shell_snapshots (measured:
        # the provider key landed there, so it would travel with the cut); and the commands it
        # runs must not inherit the key either.
        "[features]",
        "shell_snapshot = false",
        "",
        "[shell_environment_policy]",
        f"exclude = [{q(KEY_VAR)}]",
        "",
        f"[model_providers.{PROVIDER}]",
        f"name = {q(PROVIDER)}",
        f"base_url = {q(base_url)}",
        'wire_api = "responses"',
        f"env_key = {q(KEY_VAR)}",
    ]
    if mesh_dir is not None:
        python, *args = own_python("connectors.meshtool")
        lines += [
            "",
            f"[mcp_servers.{MESH_SERVER}]",
            f"command = {q(python)}",
            f"args = [{', '.join(q(a) for a in args)}]",
            # Codex hands a stdio server only a few variables of its own (not the seat's whole
            # environment), so the mesh dir is named here or the server could not find its socket.
            f"env = {{ {MESH_DIR_ENV} = {q(str(mesh_dir))} }}",
        ]
    return "\n".join(lines) + "\n"


# -- relocation -----------------------------------------------------------------------------------


def _moved_meta(reloc: Relocation) -> Any:
    def head(line: bytes) -> bytes:
        try:
            entry = json.loads(line)
        except ValueError:
            return line
        payload = entry.get("payload") if isinstance(entry, dict) else None
        if entry.get("type") != "session_meta" or not isinstance(payload, dict):
            return line

        def moved(value: Any) -> Any:
            if isinstance(value, str) and os.path.isabs(value):
                new = reloc.map(Path(value))
                return str(new) if new is not None else value
            return value

        payload["cwd"] = moved(payload.get("cwd"))
        roots = payload.get("runtime_workspace_roots")
        if isinstance(roots, list):
            payload["runtime_workspace_roots"] = [moved(r) for r in roots]
        return json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode()

    return head


def relocate_codex_session(
    files: Sequence[str], reloc: Relocation, session_id: str | None
) -> SessionMove:
    """Each rollout's `session_meta` line (its first) names the cwd it was recorded in; that
    cwd is carried to the new path. Nothing moves: Codex finds a thread by id under
    `sessions/` whatever the cwd (measured on 0.169.0: a copied CODEX_HOME resumed the thread
    from another cwd, even without its sqlite state), and `thread/resume` is given the new cwd."""
    head = _moved_meta(reloc)
    return SessionMove(
        files={
            rel: FileMove(rel, head)
            for rel in files
            if rel.startswith("sessions/") and rel.rsplit("/", 1)[-1].startswith("rollout-")
        }
    )


# -- the connector --------------------------------------------------------------------------------


class CodexConfig(KeyedEndpointConfig, frozen=True):
    """`[agents.codex]`: an OpenAI Responses endpoint and model, where the key comes from (a
    variable or a 0600 file), what Codex may do without asking and its sandbox for the commands
    it runs, the executable, and variables passed through to the seat. Anything else is
    refused."""

    approval_policy: str | None = None
    sandbox: str | None = None


class CodexConnector:
    name = NAME
    # Exact continuation is measured on the pinned version (docs/design.md, "Codex"):
    # `thread/resume` keeps the thread id, appends to the same rollout file and sends the
    # earlier turns to the model. Forking another seat's thread is not implemented.
    capabilities = Capabilities(
        supports_resume=False,
        supports_session_continuation=True,
        supports_fresh_start=True,
        supports_prompt=True,
    )
    # Measured on 0.169.0: while it runs, `tmp/arg0-linux/codex-arg0*/` holds symlinks to its
    # own binary (`apply_patch`, `applypatch`, `codex-linux-sandbox`; skipped only when
    # CODEX_HOME lies under $TMPDIR, else /tmp), and `.tmp/` its git scratch and
    # `plugins.sync.lock`. Codex makes both again at every start; no thread state lives there.
    store_scratch = ("tmp", ".tmp")
    config_type = CodexConfig
    # The session-format versions measured besides the pin in harnesses.json: none yet. A
    # destination resumes a Codex thread only at these.
    session_versions: tuple[str, ...] = ()

    def build_launch(self, opts: LaunchOpts) -> LaunchSpec:
        if opts.resume:
            raise Refusal(
                Code.UNSUPPORTED,
                f"codex connector: forking thread {opts.resume} is not supported",
                "spawn the seat without --resume; a Codex seat continues its own thread",
            )
        check_prompt(NAME, opts.prompt)
        cfg = _check_config(opts)
        files = seat_files(NAME, opts, ".home")
        cwd = seat_cwd(NAME, opts)
        binary = cfg.binary or str(pinned_program())
        require_executable(NAME, binary, "run `cotal tools install` or fix agents.codex.binary")
        if opts.continue_session:
            if not UUID_RE.match(opts.continue_session):
                raise Refusal(
                    Code.BAD_SESSION,
                    f"codex connector: continueSession {opts.continue_session!r} is not a Codex "
                    "thread id (a lowercase UUID)",
                    "pass the full id exactly as recorded",
                )
            if not rollouts(files.store, opts.continue_session):
                raise Refusal(
                    Code.NO_SESSION,
                    f"codex connector: no rollout for thread {opts.continue_session} in the "
                    f"seat's store {files.store} (looked for sessions/*/*/*/rollout-*-"
                    f"{opts.continue_session}.jsonl)",
                    "restore the seat's session store (a checkpoint's harness store) or start "
                    "the seat fresh",
                )

        ensure_seat_dir(files.pointer.parent, agent=NAME)
        ensure_seat_dir(files.store, agent=NAME)
        write_private_atomic(
            files.store / "config.toml",
            config_toml(
                base_url=cfg.base_url,
                model=cfg.model,
                approval=cfg.approval,
                sandbox=cfg.sandbox,
                mesh_dir=opts.mesh_dir,
            ).encode(),
        )
        if opts.continue_session:
            (rollout,) = rollouts(files.store, opts.continue_session)[-1:]
            repoint_state(files.store, opts.continue_session, rollout, cwd)
        else:
            drop_stale_pointer(files.pointer)

        env = base_env(opts, extra_allow=cfg.passthrough)
        env["CODEX_HOME"] = str(files.store)
        # The key travels in the child's environment only (never argv, never config.toml),
        # declared secret so the manager never logs it.
        env[KEY_VAR] = cfg.key.value
        return LaunchSpec(
            argv=[binary, "app-server", "--listen", "stdio://", "--strict-config"],
            env=env,
            cwd=cwd,
            session_pointer_path=files.pointer,
            session_store=(StoreDecl("workspace-root", files.store_relpath),),
            expected_session_id=opts.continue_session,
            initial_prompt=launch_prompt(opts),
            secret_env=(KEY_VAR,),
        )

    def describe(self, opts: LaunchOpts) -> dict[str, str]:
        """What `ps --wide` may show: approvals and sandbox, and where the key comes from."""
        config = decode_config(NAME, opts.config, CodexConfig)
        return {
            "permissionMode": f"approvals={_approval(config)},sandbox={_sandbox(config)}",
            "credentials": _key_source(config),
        }

    def doctor(self, config: Mapping[str, Any], pins: Pins) -> HarnessCheck:
        check = HarnessCheck()
        _doctor(check, decode_config(NAME, config, CodexConfig), pins)
        return pins.noted(check)

    def relocate_session(
        self, files: Sequence[str], reloc: Relocation, session_id: str | None
    ) -> SessionMove:
        return relocate_codex_session(files, reloc, session_id)

    def make_driver(self, stdin: ByteSend, stdout: ByteReceive, spec: LaunchSpec) -> CodexDriver:
        home = spec.env.get("CODEX_HOME")
        return CodexDriver(
            stdin,
            stdout,
            home=Path(home) if home else None,
            cwd=spec.cwd,
            pointer_path=spec.session_pointer_path,
            expected_session_id=spec.expected_session_id,
            initial_prompt=spec.initial_prompt,
            thread_name=spec.env.get("COTAL_NAME") or NAME,
        )


def pinned_program() -> Path:
    """The native program in the pinned package's platform dependency: `bin/codex.js` would
    only start it as a child of node, so the seat runs it directly. npm installs it under the
    alias `@openai/codex-<os>-<arch>` (one static build for glibc and musl alike), version
    `<pin>-<os>-<arch>`, in `vendor/<target triple>/bin/`."""
    pin = get_pin(NAME)
    return binary_of(pin if pin.native is not None else replace(pin, native=NATIVE))


# -- configuration --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Config:
    base_url: str
    model: str | None
    approval: str
    sandbox: str
    key: Key
    binary: str | None
    passthrough: tuple[str, ...]


def _choice(value: str | None, key: str, allowed: tuple[str, ...], default: str) -> str:
    value = default if value is None else value
    if value not in allowed:
        raise Refusal(
            Code.BAD_LAUNCH,
            f"codex connector: {key} {value!r} is not one Codex accepts",
            f"set agents.codex.{key} to one of {', '.join(allowed)}, or unset it for {default}",
        )
    return str(value)


def _approval(config: CodexConfig) -> str:
    return _choice(config.approval_policy, "approval_policy", APPROVAL_POLICIES, DEFAULT_APPROVAL)


def _sandbox(config: CodexConfig) -> str:
    return _choice(config.sandbox, "sandbox", SANDBOX_MODES, DEFAULT_SANDBOX)


def _key_source(config: CodexConfig) -> str:
    return key_source(NAME, config, DEFAULT_KEY_ENV)


def resolve_key(config: CodexConfig) -> Key:
    """The provider key, read at every spawn (`launchkit.resolve_key`)."""
    return resolve_provider_key(NAME, config, DEFAULT_KEY_ENV)


def _doctor(check: HarnessCheck, cfg: CodexConfig, pins: Pins) -> None:
    # The native program the seat runs, not the node stub the package's `bin` names.
    program = pinned_or_configured(
        check, NAME, cfg.binary, pins, locate=lambda _pin: pinned_program()
    )
    if program is None:
        return
    with tempfile.TemporaryDirectory(prefix="cotal-doctor-") as tmp:
        version_run(check, [program], probe_env(tmp, CODEX_HOME=tmp))
    # The key file or the key variable, read as a spawn reads it; only its source is shown.
    try:
        resolve_key(cfg)
    except Refusal as exc:
        config_problem(check, exc)


def _check_config(opts: LaunchOpts) -> _Config:
    config = decode_config(NAME, opts.config, CodexConfig)
    base_url = endpoint_url(
        NAME,
        DEFAULT_BASE_URL if config.base_url is None else config.base_url,
        otherwise=Refusal(
            Code.BAD_LAUNCH,
            "codex connector: base_url must be an http(s) URL of an OpenAI Responses endpoint "
            f"(got {config.base_url!r})",
            "set agents.codex.base_url in cotal.toml, e.g. http://127.0.0.1:8080/v1, or unset it",
        ),
    )
    model = opts.model or config.model
    if model is not None and not names.HARNESS_MODEL.matches(model):
        raise Refusal(
            Code.BAD_LAUNCH,
            f"codex connector: model {model!r} is not a model name",
            "pass --model or set agents.codex.model in cotal.toml",
        )
    approval, sandbox = _approval(config), _sandbox(config)
    extra_env = passthrough_names(NAME, config.extra_env, RESERVED_ENV)
    binary = configured_binary(NAME, config.binary, what="the codex executable")
    # Last among the checks: a launch refused for its config never reads a secret.
    key = resolve_key(config)
    return _Config(base_url, model, approval, sandbox, key, binary, tuple(extra_env))


# -- the driver -----------------------------------------------------------------------------------


class _Turn(Turn):
    def __init__(self, offset: int) -> None:
        super().__init__()
        self.id: str | None = None
        self.reply = ""
        self.error = ""
        self.interrupted = False
        # The rollout's size when the turn began; the turn's entries are appended after it.
        self.offset = offset
        # The tokens of the turn's model calls so far (`thread/tokenUsage/updated`).
        self.usage: TurnUsage | None = None


class CodexDriver(JsonStdioDriver[_Turn]):
    """Codex's app-server protocol: requests carry our id and their responses are routed by it;
    a turn is the `turn/completed` notification naming the turn id `turn/start` answered with.
    A request Codex sends us (an approval) is answered at once: a seat has nobody to ask."""

    who = NAME

    def __init__(
        self,
        stdin: ByteSend,
        stdout: ByteReceive,
        *,
        home: Path | None,
        cwd: Path,
        pointer_path: Path | None = None,
        expected_session_id: str | None = None,
        initial_prompt: str | None = None,
        thread_name: str = NAME,
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
        self._home = home
        self._cwd = cwd
        self._thread_name = thread_name
        self._refusal: Refusal | None = None
        # The model the open thread runs, as `thread/start` or `thread/resume` named it.
        self.model: str | None = None

    # -- reader ---------------------------------------------------------------------------------

    async def _handle(self, line: bytes) -> None:
        msg = self._decode(line)
        if msg is None:
            return
        method = msg.get("method")
        if "id" in msg and method is None:
            self._pending.resolve(str(msg.get("id")), msg)
        elif "id" in msg and isinstance(method, str):
            await self._answer(msg["id"], method)
        elif method == "item/completed":
            item = (msg.get("params") or {}).get("item") or {}
            turn = self._turn
            if turn is not None and item.get("type") == "agentMessage":
                text = item.get("text")
                turn.reply = text if isinstance(text, str) else turn.reply
        elif method == "error":
            params = msg.get("params") or {}
            if self._turn is not None and not params.get("willRetry"):
                self._turn.error = str((params.get("error") or {}).get("message") or "")
        elif method == "thread/tokenUsage/updated":
            params = msg.get("params") or {}
            turn = self._turn
            # Before `turn/start` has answered with the turn's id, the one turn in flight.
            if turn is not None and (turn.id is None or params.get("turnId") == turn.id):
                call = call_usage(params, self.model)
                if call is not None:
                    turn.usage = call if turn.usage is None else turn.usage.plus(call)
        elif method == "turn/completed":
            params = msg.get("params") or {}
            turn = self._turn
            done = params.get("turn") or {}
            if turn is None or params.get("threadId") != self.session_id:
                self._note("codex completed a turn while no prompt was in flight")
            elif turn.id is None or done.get("id") == turn.id:
                turn.end.resolve(done)

    async def _answer(self, request_id: Any, method: str) -> None:
        if method in ("item/commandExecution/requestApproval", "item/fileChange/requestApproval"):
            await self._send({"id": request_id, "result": {"decision": "decline"}})
        elif method in ("execCommandApproval", "applyPatchApproval"):
            await self._send({"id": request_id, "result": {"decision": "denied"}})
        else:
            await self._send(
                {
                    "id": request_id,
                    "error": rpc_error(f"cotal does not serve {method!r}"),
                }
            )

    # -- commands -------------------------------------------------------------------------------

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """One request and its result; a refusal when Codex answers an error or is gone."""
        reply = await self._request(
            method.replace("/", "-"), lambda rid: {"id": rid, "method": method, "params": params}
        )
        if reply is None:
            raise self._gone(f"call {method}")
        if "error" in reply:
            error = reply.get("error") or {}
            raise Refusal(
                Code.HARNESS_ERROR,
                f"codex connector: codex refused {method}: {error.get('message')}",
                "read the seat's log",
            )
        result = reply.get("result")
        return result if isinstance(result, dict) else {}

    async def _open_thread(self) -> str:
        await self._call(
            "initialize", {"clientInfo": {"name": "cotal", "title": "cotal", "version": "1"}}
        )
        await self._send({"method": "initialized"})
        # Approvals and sandbox come from the seat's config.toml, rewritten at every launch;
        # the cwd is given so a thread resumed at another path works there (and says so).
        params: dict[str, Any] = {"cwd": str(self._cwd)}
        if self._expected is not None:
            result = await self._call("thread/resume", {"threadId": self._expected, **params})
        else:
            result = await self._call("thread/start", params)
        thread_id = (result.get("thread") or {}).get("id")
        self.model = model_name(result.get("model"))
        if not isinstance(thread_id, str) or not UUID_RE.match(thread_id):
            raise Refusal(
                Code.HARNESS_ERROR,
                f"codex connector: codex opened no thread id we can record ({thread_id!r})",
                "run the pinned Codex version (`cotal tools install`)",
            )
        self.session_id = thread_id
        if self._expected is None:
            # A new thread has no rollout until something is recorded in it, and a thread
            # without one cannot be resumed (measured: "no rollout found"); naming it writes it,
            # so a seat that dies before its first turn still continues under this id.
            await self._call("thread/name/set", {"threadId": thread_id, "name": self._thread_name})
        return thread_id

    async def _learn_session(self) -> None:
        try:
            thread_id = await self._open_thread()
            with anyio.move_on_after(PERSIST_TIMEOUT_S):
                while True:
                    if await anyio.to_thread.run_sync(self._rollout_exists, thread_id):
                        break
                    await anyio.sleep(PERSIST_POLL_S)
            if await anyio.to_thread.run_sync(self._rollout_exists, thread_id):
                await self._write_pointer("running")
            else:
                self._refusal = Refusal(
                    Code.HARNESS_ERROR,
                    f"codex connector: codex wrote no rollout for thread {thread_id} within "
                    f"{PERSIST_TIMEOUT_S:.0f}s",
                    "read the seat's log",
                )
        except Refusal as exc:
            self._refusal = exc
            self._note(exc.text)
        finally:
            self.state_known.set()

    def _rollout_exists(self, thread_id: str) -> bool:
        return self._home is not None and bool(rollouts(self._home, thread_id))

    async def get_state(self) -> str | None:
        """The thread id once Codex opened it and its rollout is on disk, else None."""
        if self._refusal is not None:
            raise self._refusal
        if not self._reader.running:
            raise self._gone("query codex's state")
        return self.session_id if self._written is not None else None

    # -- turns ----------------------------------------------------------------------------------

    def _rollout_size(self) -> int:
        if self._home is None or self.session_id is None:
            return 0
        found = rollouts(self._home, self.session_id)
        return found[0].stat().st_size if found else 0

    async def _turn_locked(self, text: str, message_id: str) -> TurnOutcome:
        if not self._reader.running:
            return TurnOutcome("unknown", detail=f"not delivered: {self._reader.detail}")
        await self.state_known.wait()
        if self.session_id is None or self._written is None:
            why = self._refusal.text if self._refusal is not None else "no thread is open"
            return TurnOutcome("unknown", detail=f"not delivered: {why}")
        turn = _Turn(await anyio.to_thread.run_sync(self._rollout_size))
        self._turn = turn
        try:
            try:
                result = await self._call(
                    "turn/start",
                    {
                        "threadId": self.session_id,
                        "input": [{"type": "text", "text": text, "text_elements": []}],
                    },
                )
            except HarnessGone:
                return TurnOutcome(
                    "unknown", detail=f"turn {message_id} did not end: {self._reader.detail}"
                )
            except Refusal as exc:
                return TurnOutcome("error", detail=exc.message)
            started = result.get("turn") or {}
            turn.id = started.get("id") if isinstance(started.get("id"), str) else None
            await turn.end.done.wait()
        finally:
            self._turn = None
        if turn.end.value is None:
            return TurnOutcome(
                "unknown", detail=f"turn {message_id} did not end: {self._reader.detail}"
            )
        outcome = judge_turn(turn.end.value, reply=turn.reply, error=turn.error)
        outcome = replace(outcome, usage=turn.usage)
        if outcome.status == "ok" and not await self._await_persisted(turn):
            # An ack for a turn a crash then loses would leave it neither in the thread nor
            # redelivered, so `ok` waits until the rollout records the turn complete.
            return TurnOutcome(
                "unknown",
                detail=f"codex did not record turn {message_id} in its rollout within "
                f"{PERSIST_TIMEOUT_S:.0f}s",
                usage=outcome.usage,
            )
        return outcome

    def _persisted(self, turn: _Turn) -> bool:
        if self._home is None or self.session_id is None or turn.id is None:
            return False
        needle = turn.id.encode()
        for path in rollouts(self._home, self.session_id):
            with open(path, "rb") as f:
                f.seek(turn.offset)
                for line in f:
                    if b'"task_complete"' in line and needle in line:
                        return True
        return False

    async def _await_persisted(self, turn: _Turn) -> bool:
        with anyio.move_on_after(PERSIST_TIMEOUT_S):
            while True:
                if await anyio.to_thread.run_sync(self._persisted, turn):
                    return True
                if not self._reader.running:
                    # Codex is gone: what it wrote is all there will be; one last look.
                    return await anyio.to_thread.run_sync(self._persisted, turn)
                await anyio.sleep(PERSIST_POLL_S)
        return False

    async def interrupt(self) -> bool:
        """Ask Codex to stop the turn in flight; its `turn/completed` then ends it `aborted`."""
        turn = self._turn
        if turn is None or turn.id is None or self.session_id is None:
            return False
        turn.interrupted = True
        try:
            await self._call("turn/interrupt", {"threadId": self.session_id, "turnId": turn.id})
        except Refusal:
            return False
        return True


def rpc_error(message: str) -> dict[str, Any]:
    """A JSON-RPC "method not found" error object."""
    return dict(code=-32601, message=message)


def call_usage(params: Mapping[str, Any], model: str | None) -> TurnUsage | None:
    """One model call's tokens from `thread/tokenUsage/updated` (measured on 0.169.0: sent
    after each call of a turn, naming the turn; `tokenUsage.last` is that call's, `total` the
    thread's so far). Codex's `inputTokens` counts the cached input too, as the Responses API
    does, so the uncached input is the difference."""
    usage = params.get("tokenUsage")
    last = usage.get("last") if isinstance(usage, dict) else None
    if not isinstance(last, dict):
        return None
    cached = token_count(last.get("cachedInputTokens"))
    return TurnUsage(
        input_tokens=max(0, token_count(last.get("inputTokens")) - cached),
        output_tokens=token_count(last.get("outputTokens")),
        cache_read_tokens=cached,
        cache_write_tokens=token_count(last.get("cacheWriteInputTokens")),
        model=model,
    )


def judge_turn(done: Mapping[str, Any], *, reply: str, error: str) -> TurnOutcome:
    """Classify one `turn/completed`: only `completed` with an agent message is `ok`; a failed
    turn is `error`, an interrupted one `aborted`, anything else `unknown` (no ack for any)."""
    status = done.get("status")
    detail = str(((done.get("error") or {}).get("message")) or error)
    if status == "completed":
        if not reply.strip():
            return TurnOutcome("unknown", detail="the model produced no output")
        return TurnOutcome("ok", reply=reply)
    if status == "failed":
        # A provider down or rate limited (after Codex's own retries) is not the turn's fault.
        return unavailable_outcome(
            TurnOutcome("error", detail=detail or "codex reported the turn failed")
        )
    if status == "interrupted":
        return TurnOutcome("aborted", detail="turn interrupted")
    return TurnOutcome("unknown", detail=f"codex ended the turn with status {status!r}")
