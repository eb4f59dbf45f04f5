"""The jcode connector: a drain-only seat whose harness keeps no session cotal can reopen.

Its private home and the JSON-lines wire protocol cotal defines for it are in docs/design.md,
"The harness connectors, in detail", jcode.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskStatus

from connectors.base import (
    ByteReceive,
    ByteSend,
    Capabilities,
    LaunchOpts,
    LaunchSpec,
    TurnOutcome,
    framed_prompt,
)
from connectors.doctorkit import HarnessCheck, Missing, Pins, probe_env, version_run
from connectors.driverkit import INITIAL_PROMPT_ID, LaunchPromptWatch, json_line
from connectors.jsonl_driver import (
    DriverEvent,
    JsonLinesDriver,
    Ready,
    Rejected,
    StateReported,
    TurnDelta,
    TurnEnded,
    TurnStarted,
)
from connectors.launchkit import (
    base_env,
    check_prompt,
    decode_config,
    launch_prompt,
    require_executable,
    seat_cwd,
)
from connectors.privatefs import UnsafeDirectory, ensure_private_dirs_below
from protocol import names
from protocol.errors import DecodeError, Refusal
from protocol.names import check_seat_name, check_space
from protocol.refusals import Code

NAME = "jcode"
DEFAULT_BINARY = "jcode"
PROTOCOL_FLAG = "--cotal-jsonl"
SLUG_MAX = 40
HASH_HEX = 12
LINE_CAP = 16 * 1024 * 1024
READY_TIMEOUT_S = 30.0

# Upstream's texts (Cotal-AI/Cotal, extensions/connector-jcode, drain-only version), verbatim.
CONTINUE_REFUSED = (
    "jcode connector does not support exact-session continuation — "
    "its private Harness API instance is retired with the seat"
)
RESUME_REFUSED = (
    "jcode connector: resuming an existing session is not supported — "
    "the private Harness API instance never shares a session with another seat"
)


# -- the private home ------------------------------------------------------------------------------


def home_slug(space: str, name: str) -> str:
    slug = re.sub(r"[^a-z0-9_-]+", "-", f"{space}-{name}".lower()).strip("-")
    # Cut, then trim again, so a cut that lands after a dash leaves no trailing one.
    return slug[:SLUG_MAX].strip("-") or "agent"


def home_relparts(space: str, name: str) -> tuple[str, ...]:
    digest = hashlib.sha256(f"{space}\0{name}".encode()).hexdigest()[:HASH_HEX]
    return (".cotal", "jcode", f"{home_slug(space, name)}-{digest}")


def private_home(managed_root: Path, relparts: tuple[str, ...]) -> Path:
    """Create `managed_root/relparts...` (0700 where created, the leaf always 0700) and return it.

    Refuses a component that could leave the root (`..`, `.`, a separator, empty), a symlink
    at any component below the root, and anything there that is not a directory.
    """
    root = Path(os.path.normpath(managed_root))
    if not root.is_absolute():
        raise Refusal(
            Code.BAD_LAUNCH,
            f"jcode connector: the managed root {root} is not an absolute path",
            "set agents.jcode.home to an absolute path, or unset it to use the workspace root",
        )
    for part in relparts:
        if part in ("", ".", "..") or "/" in part or "\0" in part:
            raise Refusal(
                Code.UNSAFE_PATH,
                f"jcode connector: private home component {part!r} would escape the managed root "
                f"{root}",
                "use a seat name and space made of letters, digits, _ and -",
            )
    try:
        return ensure_private_dirs_below(root, relparts)
    except UnsafeDirectory as exc:
        if exc.path == root:
            raise Refusal(
                Code.UNSAFE_PATH,
                f"jcode connector: the managed root {root} {exc.reason}",
                "create it, or point agents.jcode.home at an existing directory",
            ) from None
        raise Refusal(
            Code.UNSAFE_PATH,
            f"jcode connector: {exc.path} {exc.reason}; a private home must not leave the managed "
            f"root {root}",
            f"remove {exc.path} so cotal can create a plain private directory",
        ) from None


# -- the connector --------------------------------------------------------------------------------


class JcodeConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """`[agents.jcode]`: the program (a name found on PATH, or a path), the model, and the
    directory the seats' private homes are made under (relative to the workspace root).
    Anything else is refused."""

    binary: str | None = None
    model: str | None = None
    home: str | None = None


class JcodeConnector:
    name = NAME
    # Neither continuity flag, and no fresh start the manager could substitute: drain-only.
    # A launch prompt is supported (delivered by the driver as the seat's first turn).
    capabilities = Capabilities(supports_prompt=True)
    config_type = JcodeConfig
    # Not pinned, and drain-only: no session travels, so no version is declared; a destination
    # compares its jcode's version with the one the seat ran, as a move's probe does.
    session_versions: tuple[str, ...] = ()

    def doctor(self, config: Mapping[str, Any], pins: Pins) -> HarnessCheck:
        """jcode is not pinned: its program is `agents.jcode.binary` or `jcode` on PATH."""
        cfg = decode_config(NAME, config, JcodeConfig, dropped="at launch")
        check = HarnessCheck()
        if cfg.binary:
            found = cfg.binary if os.path.isabs(cfg.binary) else shutil.which(cfg.binary)
            where = f"agents.jcode.binary ({cfg.binary})"
        else:
            found = shutil.which(DEFAULT_BINARY)
            where = "PATH"
        if not found or not os.path.isfile(found):
            check.missing.append(
                Missing(
                    f"jcode is not installed (looked for it on {where})",
                    "install jcode with an adapter for cotal's JSON-lines protocol "
                    "(connectors/jcode.py) and set agents.jcode.binary",
                )
            )
            return check
        check.installed = True
        check.path = found
        version_run(check, [found], probe_env())
        return check

    def build_launch(self, opts: LaunchOpts) -> LaunchSpec:
        if opts.continue_session:
            raise Refusal(
                Code.UNSUPPORTED,
                CONTINUE_REFUSED,
                "let the seat drain and spawn a fresh jcode seat (jcode seats are drain-only)",
            )
        if opts.resume:
            raise Refusal(
                Code.UNSUPPORTED, RESUME_REFUSED, "spawn a fresh jcode seat without --resume"
            )
        check_prompt(NAME, opts.prompt)
        check_space(opts.space)
        check_seat_name(opts.name)
        config = decode_config(NAME, opts.config, JcodeConfig, dropped="at launch")
        model = opts.model or config.model
        if model is not None and not names.HARNESS_MODEL.matches(model):
            raise Refusal(
                Code.BAD_LAUNCH,
                f"jcode connector: model {model!r} is not a model name (letters, digits, ._:/@+-)",
                "pass --model or set agents.jcode.model in cotal.toml",
            )
        home_cfg = config.home
        # A relative home is anchored at the workspace root, like every other seat path.
        managed_root = (
            Path(opts.workspace_root) / home_cfg if home_cfg else Path(opts.workspace_root)
        )
        env = base_env(opts)
        binary = _program(config.binary, env)
        cwd = seat_cwd(NAME, opts)

        home = private_home(managed_root, home_relparts(opts.space, opts.name))
        argv = [binary, PROTOCOL_FLAG]
        if model is not None:
            argv += ["--model", model]
        env.update(JCODE_HOME=str(home), COTAL_JCODE_HOME=str(Path(os.path.normpath(managed_root))))
        return LaunchSpec(
            argv=argv,
            env=env,
            cwd=cwd,
            # Drain-only: no pointer and no store a checkpoint could carry to a reopening.
            session_pointer_path=None,
            session_store=(),
            expected_session_id=None,
            initial_prompt=launch_prompt(opts),
        )

    def make_driver(self, stdin: ByteSend, stdout: ByteReceive, spec: LaunchSpec) -> JcodeDriver:
        return JcodeDriver(stdin, stdout, initial_prompt=spec.initial_prompt)


def _program(binary: str | None, env: Mapping[str, str]) -> str:
    if binary is None:
        found = shutil.which(DEFAULT_BINARY, path=env.get("PATH"))
        if found is None:
            raise Refusal(
                Code.NOT_INSTALLED,
                "jcode connector: no `jcode` on the manager's PATH",
                "install jcode (with a cotal JSON-lines adapter) or set agents.jcode.binary to its "
                "absolute path",
            )
        return found
    if not binary:
        raise Refusal(
            Code.BAD_LAUNCH,
            f"jcode connector: binary must be a path, got {binary!r}",
            "fix agents.jcode.binary",
        )
    if not os.path.isabs(binary):
        found = shutil.which(binary, path=env.get("PATH"))
        if found is None:
            raise Refusal(
                Code.NOT_INSTALLED,
                f"jcode connector: {binary!r} is not on the manager's PATH",
                "set agents.jcode.binary to an absolute path",
            )
        return found
    return require_executable(NAME, binary, "fix agents.jcode.binary")


# -- the driver -----------------------------------------------------------------------------------


class JcodeCodec:
    """The cotal JSON-lines protocol above, as the generic driver sees it."""

    def encode_prompt(self, text: str, message_id: str, delivery: int = 1) -> bytes:
        # The wire has no delivery field: the model reads the notice in the text.
        return json_line(
            {"type": "prompt", "id": message_id, "text": framed_prompt(text, delivery)}
        )

    def encode_get_state(self, request_id: str) -> bytes | None:
        return json_line({"type": "get_state", "id": request_id})

    def encode_quit(self) -> bytes | None:
        return json_line({"type": "quit"})

    def decode(self, line: bytes) -> DriverEvent | None:
        try:
            event = json.loads(line)
        except ValueError as exc:
            raise DecodeError("jcode event", f"not JSON ({exc})") from None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise DecodeError("jcode event", "not an object with a string type")
        kind = event["type"]
        ident = event.get("id")
        if kind == "ready":
            return Ready(_text(event, "session"))
        if kind == "state":
            session = event.get("session")
            return StateReported(
                _text(event, "id"), session if isinstance(session, str) and session else None
            )
        if kind == "turn_start":
            return TurnStarted(_text(event, "id"))
        if kind == "delta":
            return TurnDelta(_text(event, "id"), str(event.get("text", "")))
        if kind == "turn_end":
            return TurnEnded(_text(event, "id"), judge_turn_end(event))
        if kind == "error":
            return Rejected(ident if isinstance(ident, str) else None, str(event.get("detail", "")))
        return None


def _text(event: Mapping[str, Any], key: str) -> str:
    value = event.get(key)
    if not isinstance(value, str) or not value:
        raise DecodeError("jcode event", f"{event.get('type')} needs a non-empty string {key}")
    return value


def judge_turn_end(event: Mapping[str, Any]) -> TurnOutcome:
    """Only a turn the harness says ended `ok` with some reply is `ok`."""
    status = event.get("status")
    reply = event.get("reply") if isinstance(event.get("reply"), str) else ""
    detail = event.get("detail") if isinstance(event.get("detail"), str) else ""
    if status == "ok":
        if not str(reply).strip():
            return TurnOutcome("unknown", detail="the harness produced no output")
        return TurnOutcome("ok", reply=str(reply), detail=str(detail))
    if status in ("error", "aborted"):
        return TurnOutcome(status, detail=str(detail) or f"the harness ended the turn {status}")
    return TurnOutcome("unknown", detail=f"the harness ended the turn with status {status!r}")


class JcodeDriver(LaunchPromptWatch, JsonLinesDriver):
    """The generic JSON-lines driver plus the launch's initial prompt, delivered as turn 0 once
    the harness is ready and before any inbox message."""

    def __init__(
        self, stdin: ByteSend, stdout: ByteReceive, *, initial_prompt: str | None = None
    ) -> None:
        super().__init__(stdin, stdout, JcodeCodec(), line_cap=LINE_CAP)
        self._initial = initial_prompt
        self._launch_prompt = initial_prompt is not None
        self._initial_lock = anyio.Lock()
        self.initial_outcome: TurnOutcome | None = None
        self.initial_done = anyio.Event()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._deliver_initial)
                await super().run(task_status=task_status)
                tg.cancel_scope.cancel()
        finally:
            self.initial_done.set()

    async def _deliver_initial(self) -> None:
        try:
            await self.wait_ready(READY_TIMEOUT_S)
        except (Refusal, TimeoutError):
            # The harness never got ready; the manager's readiness check reports why.
            return
        await self._initial_first()
        self.initial_done.set()

    async def _initial_first(self) -> None:
        async with self._initial_lock:
            if self._initial is None:
                return
            text, self._initial = self._initial, None
            self.initial_outcome = await super().prompt(text, message_id=INITIAL_PROMPT_ID)

    async def prompt(self, text: str, *, message_id: str, delivery: int = 1) -> TurnOutcome:
        # The launch prompt goes first even when an inbox message arrives the instant the
        # seat is ready.
        await self._initial_first()
        return await super().prompt(text, message_id=message_id, delivery=delivery)
