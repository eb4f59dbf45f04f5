"""`cotal doctor`: which harnesses this host can run seats with, and what is missing.

For each harness (scribe, pi, claude, jcode, codex) it reports:

* installed: where its program is (the pinned install under the tools directory,
  `agents.<name>.binary` from cotal.toml, or PATH for jcode) and which version it holds;
* usable: whether the program answers a quick `--version` run within a timeout;
* continuity: the class the connector's declared capability flags give (never a probe);
* used: whether this root uses it (`used_by`: the built-in default agent, `cotal.toml`, a seat
  the running manager holds);
* missing: each problem with its cure.

States in the table: `ready`; `config` (runs, but a seat launch needs a setting first);
`broken` (installed, does not run); `absent` (not installed).

The `--version` runs get an empty private config dir and the harness's offline switches, so a
check neither reads nor writes the operator's own harness state and needs no network.

Then one `isolation` row: what keeps a seat from the manager's authority on this host
(`mount-ns+landlock`, `mount-ns`, `landlock` or `none`), probed the way the daemon probes it;
where the manager's secrets are not hidden from seats it says so plainly, with the cure. It
never fails the check: a host without isolation can still run seats, knowingly.

Exit code: 1 when a harness this root uses is not ready; 0 otherwise. A harness the root does
not use is reported (`not installed (not used by this root)` when absent) but never fails the
check: a machine that only runs scribe seats needs no Node.js. A `cotal.toml` that cannot be
read is a refusal (status 2, on stderr), as for every other command.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from connectors import sandbox
from connectors.base import continuity_class
from connectors.interpreter import own_python
from manager import registry
from manager.checkpoint import clock
from manager.cli import tools
from manager.workspace import roots
from manager.workspace.layout import Layout
from protocol import control
from protocol.errors import Refusal

HARNESSES = ("scribe", "pi", "claude", "jcode", "codex")
VERSION_TIMEOUT_S = 15.0
PS_TIMEOUT_S = 5.0
UNUSED_ABSENT = "not installed (not used by this root)"


@dataclass
class Missing:
    problem: str
    cure: str
    # "program": the harness cannot run at all; "config": it runs, but a seat launch would be
    # refused until the operator supplies a setting (an endpoint, a key).
    kind: str = "program"


@dataclass
class Report:
    name: str
    continuity: str
    installed: bool = False
    path: str | None = None
    version: str | None = None
    usable: bool = False
    missing: list[Missing] = field(default_factory=list)

    configured: bool = False
    used_by: list[str] = field(default_factory=list)

    @property
    def used(self) -> bool:
        return bool(self.used_by)

    @property
    def ready(self) -> bool:
        return self.installed and self.usable and not self.missing

    @property
    def state(self) -> str:
        if self.ready:
            return "ready"
        if not self.installed:
            return "absent"
        if self.usable and all(m.kind == "config" for m in self.missing):
            return "config"
        return "broken"

    @property
    def failing(self) -> bool:
        """Fails the check: a used harness that cannot run, or a configured one whose
        configuration is incomplete. A harness used without configuration (the default scribe,
        a running seat) that lacks settings is only reported, as is every unused harness."""
        if not self.used:
            return False
        if not (self.installed and self.usable) or any(m.kind == "program" for m in self.missing):
            return True
        return self.configured and bool(self.missing)

    @property
    def note(self) -> str | None:
        return UNUSED_ABSENT if not self.used and not self.installed else None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(ready=self.ready, used=self.used, state=self.state, note=self.note)
        return out


def run(root: Path, *, as_json: bool, say: Callable[[str], None]) -> int:
    cfg = registry.load_config(root)
    seats = running_seats(root)
    try:
        pins = tools.load_pins()
        pin_problem: Missing | None = None
    except Refusal as exc:
        pins, pin_problem = {}, Missing(exc.message, exc.cure)
    reports = [
        check(
            name,
            registry.agent_settings(cfg, name),
            pins,
            configured=name in cfg.agents,
            used_by=used_by(name, cfg, seats),
        )
        for name in HARNESSES
    ]
    if pin_problem is not None:
        for report in reports:
            if report.name in ("pi", "claude", "codex"):
                report.missing.append(pin_problem)
    isolation = isolation_row()
    time_row = clock_row()
    if as_json:
        for report in reports:
            say(json.dumps(report.as_dict(), sort_keys=True))
        say(json.dumps(isolation, sort_keys=True))
        say(json.dumps(time_row, sort_keys=True))
    else:
        for line in render(reports) + render_isolation(isolation) + render_clock(time_row):
            say(line)
    return 1 if any(r.failing for r in reports) else 0


def used_by(name: str, cfg: registry.FileConfig, seats: Mapping[str, str]) -> list[str]:
    """Why this root needs the harness: the reasons, in a stable order; empty when it does not."""
    reasons = ["default agent"] if name == "scribe" else []
    if name in cfg.agents:
        reasons.append("cotal.toml")
    reasons += [f"seat {seat}" for seat, agent in sorted(seats.items()) if agent == name]
    return reasons


def running_seats(root: Path) -> dict[str, str]:
    """Seat name -> agent of the seats the root's manager holds, or nothing when no manager
    answers: a doctor run must work on a machine where nothing is up."""
    from manager.cli import mesh

    layout = Layout.at(root)
    if not (layout.mesh.exists() and layout.control_token.exists() and layout.socket.exists()):
        return {}
    try:
        rows = mesh.run_request(root, control.PS, control.NoArgs(), PS_TIMEOUT_S)
    except (Refusal, OSError, TimeoutError):
        return {}
    return {row.name: row.agent for row in rows}


def render(reports: list[Report]) -> list[str]:
    lines = [f"{'harness':<8} {'continuity':<11} {'state':<8} {'version':<12} program"]
    for r in reports:
        program = r.note or r.path or "-"
        lines.append(
            f"{r.name:<8} {r.continuity:<11} {r.state:<8} {r.version or '-':<12} {program}"
        )
        if r.note:
            # Not used here: what it would take to install it is noise until it is.
            continue
        for m in r.missing:
            lines.append(f"         missing: {m.problem}")
            lines.append(f"         cure:    {m.cure}")
    return lines


def isolation_row() -> dict[str, Any]:
    found = sandbox.probe()
    row: dict[str, Any] = {
        "name": "isolation",
        "mode": found.mode,
        "hidesSecrets": found.hides_secrets,
        "detail": found.detail,
        "warning": None,
    }
    if not found.hides_secrets:
        row["warning"] = (
            "seats can read .cotal/auth (control token, broker credential, signing key); only "
            "the control socket's seat check stands between a seat and the manager. Cure: run "
            "the manager as root or where unprivileged user namespaces are enabled"
        )
    row["missing"] = found.missing
    row["tmpMiB"] = sandbox.tmp_mib() if found.mount else None
    registry = roots.registry_dir()
    row["rootsRegistry"] = str(registry) if registry is not None else None
    if registry is None:
        row["missing"].append(f"missing roots registry: {roots.NO_REGISTRY}")
    try:
        row["seatMarked"] = sandbox.carries_seat_mark("self")
    except OSError:
        row["seatMarked"] = False
    if row["seatMarked"]:
        row["missing"].append(
            "this shell runs under no_new_privs, the seat mark: a manager started outside it "
            "refuses this CLI, and a manager started from here cannot tell another root's seats "
            "from its operator by the mark (it refuses only its own seats)"
        )
    return row


def clock_row() -> dict[str, Any]:
    """Whether a resume here can judge a checkpoint's age: never a failure of the check, since
    a host that only cuts needs no synchronized clock."""
    reading = clock.read_clock()
    row: dict[str, Any] = {
        "name": "clock",
        "synchronized": reading.synchronized,
        "source": reading.source,
        "detail": reading.detail,
        "warning": None,
    }
    if reading.source != "kernel":
        row["warning"] = (
            f"{clock.TEST_HOOK_ENV} stands in for the kernel's reading: a test hook, never "
            "for a real destination; unset it"
        )
    elif not reading.synchronized:
        row["warning"] = (
            "a resume or `checkpoint verify` here refuses clock-unsynchronized; start chrony, "
            "ntpd or systemd-timesyncd"
        )
    return row


def render_clock(row: Mapping[str, Any]) -> list[str]:
    state = "synchronized" if row["synchronized"] else "not synchronized"
    lines = [f"clock: {state} ({row['detail']})"]
    if row["warning"]:
        lines.append(f"         warning: {row['warning']}")
    return lines


def render_isolation(row: Mapping[str, Any]) -> list[str]:
    lines = ["", f"seat isolation: {row['mode']} ({row['detail']})"]
    if row.get("tmpMiB"):
        lines.append(f"         private /tmp, /var/tmp, /dev/shm: {row['tmpMiB']} MiB each")
    if row.get("tmpMiB") and row.get("rootsRegistry"):
        lines.append(f"         other roots hidden as named in {row['rootsRegistry']}")
    lines += [f"         {gap}" for gap in row.get("missing", [])]
    if row["warning"]:
        lines.append(f"         warning: {row['warning']}")
    return lines


def check(
    name: str,
    settings: Mapping[str, Any],
    pins: Mapping[str, tools.Pin],
    *,
    configured: bool,
    used_by: list[str] | None = None,
) -> Report:
    try:
        continuity: str = continuity_class(registry.load_connector(name).capabilities)
    except Refusal:
        continuity = "unavailable"
    report = Report(
        name=name,
        continuity=continuity,
        configured=configured,
        used_by=list(used_by or []),
    )
    if continuity == "unavailable":
        report.missing.append(
            Missing(f"the {name} connector cannot be imported in this build", "reinstall cotal")
        )
    checker = {
        "scribe": _check_scribe,
        "pi": _check_pi,
        "claude": _check_claude,
        "jcode": _check_jcode,
        "codex": _check_codex,
    }[name]
    checker(report, settings, pins.get(name))
    return report


# -- per harness ----------------------------------------------------------------------------------


def _check_scribe(report: Report, settings: Mapping[str, Any], pin: tools.Pin | None) -> None:
    # Built in: the program is this interpreter running the package's own module, isolated as
    # the connector launches it, so the probe finds cotal where a seat will.
    program = own_python("connectors.scribe")
    report.installed = True
    report.path = " ".join(program)
    try:
        from importlib.metadata import version

        report.version = f"cotal {version('cotal')}"
    except Exception:
        report.version = "built-in"
    ok, detail = _probe([*program, "--help"], {"PATH": os.environ.get("PATH", "")})
    report.usable = ok
    if not ok:
        report.missing.append(
            Missing(f"scribe does not start: {detail}", "reinstall cotal (`pip install .`)")
        )


def _check_pi(report: Report, settings: Mapping[str, Any], pin: tools.Pin | None) -> None:
    program = _pinned_or_configured(report, settings, pin)
    if program is None:
        return
    node = shutil.which("node")
    if program.endswith((".js", ".mjs")):
        if node is None:
            report.missing.append(
                Missing("node is not on PATH (pi runs on Node.js)", "install Node.js >= 20")
            )
            return
        argv = [node, program]
    else:
        argv = [program]
    with tempfile.TemporaryDirectory(prefix="cotal-doctor-") as tmp:
        env = _base_env(
            PI_CODING_AGENT_DIR=tmp, PI_OFFLINE="1", PI_SKIP_VERSION_CHECK="1", PI_TELEMETRY="0"
        )
        _version_run(report, argv, env)
    if not settings.get("base_url"):
        report.missing.append(
            Missing(
                "pi has no model endpoint configured (agents.pi.base_url)",
                "set agents.pi.base_url and agents.pi.model in cotal.toml",
                "config",
            )
        )
    _key_check(report, settings, default=None)


def _check_claude(report: Report, settings: Mapping[str, Any], pin: tools.Pin | None) -> None:
    program = _pinned_or_configured(report, settings, pin)
    if program is None:
        return
    with tempfile.TemporaryDirectory(prefix="cotal-doctor-") as tmp:
        env = _base_env(
            CLAUDE_CONFIG_DIR=tmp,
            DISABLE_TELEMETRY="1",
            DISABLE_ERROR_REPORTING="1",
            DISABLE_AUTOUPDATER="1",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        )
        _version_run(report, [program], env)
    _claude_credential_check(report, settings)


def _check_codex(report: Report, settings: Mapping[str, Any], pin: tools.Pin | None) -> None:
    from connectors.codex import pinned_program

    # The native program the seat runs, not the node stub the package's `bin` names.
    program = _pinned_or_configured(report, settings, pin, locate=lambda _pin: pinned_program())
    if program is None:
        return
    with tempfile.TemporaryDirectory(prefix="cotal-doctor-") as tmp:
        _version_run(report, [program], _base_env(CODEX_HOME=tmp))
    _codex_key_check(report, settings)


def _check_jcode(report: Report, settings: Mapping[str, Any], pin: tools.Pin | None) -> None:
    binary = settings.get("binary")
    if binary:
        found = binary if os.path.isabs(binary) else shutil.which(binary)
        where = f"agents.jcode.binary ({binary})"
    else:
        found = shutil.which("jcode")
        where = "PATH"
    if not found or not os.path.isfile(found):
        report.missing.append(
            Missing(
                f"jcode is not installed (looked for it on {where})",
                "install jcode with an adapter for cotal's JSON-lines protocol "
                "(connectors/jcode.py) and set agents.jcode.binary",
            )
        )
        return
    report.installed = True
    report.path = found
    _version_run(report, [found], _base_env())


# -- helpers --------------------------------------------------------------------------------------


def _pinned_or_configured(
    report: Report,
    settings: Mapping[str, Any],
    pin: tools.Pin | None,
    *,
    locate: Callable[[tools.Pin], Path] = tools.binary_of,
) -> str | None:
    binary = settings.get("binary")
    if binary:
        if not os.path.isfile(binary):
            report.missing.append(
                Missing(
                    f"agents.{report.name}.binary {binary} does not exist",
                    f"fix agents.{report.name}.binary in cotal.toml or remove it to use the "
                    "pinned install",
                )
            )
            return None
        report.installed = True
        report.path = binary
        return str(binary)
    if pin is None:
        report.missing.append(
            Missing(
                f"{report.name} is not pinned in {tools.pin_file()}",
                "reinstall cotal (the pins ship inside it)",
            )
        )
        return None
    try:
        path = locate(pin)
    except Refusal as exc:
        report.missing.append(
            Missing(exc.message, "run `cotal tools install` (`make harnesses` in a checkout)")
        )
        return None
    report.installed = True
    report.path = str(path)
    report.version = tools.installed_version(pin)
    return str(path)


def _version_run(report: Report, argv: list[str], env: dict[str, str]) -> None:
    ok, detail = _probe([*argv, "--version"], env)
    report.usable = ok
    if ok:
        # The install's own record wins; the program's answer fills in for a configured binary.
        report.version = report.version or detail.splitlines()[0].strip()[:60] or None
    else:
        report.missing.append(
            Missing(
                f"`{report.path} --version` failed: {detail}",
                "reinstall it (`make harnesses` for pinned harnesses) or fix the configured binary",
            )
        )


def _probe(argv: list[str], env: dict[str, str]) -> tuple[bool, str]:
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=tempfile.gettempdir(),
        )
    except subprocess.TimeoutExpired:
        return False, f"no answer within {VERSION_TIMEOUT_S:.0f}s"
    except OSError as exc:
        return False, exc.strerror or str(exc)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        return False, f"exit code {proc.returncode}" + (f": {tail[-1][:200]}" if tail else "")
    return True, proc.stdout.strip()


def _base_env(**extra: str) -> dict[str, str]:
    # Only what a version check needs: no tokens or keys of the operator's environment.
    env = {k: v for k in ("PATH", "LANG", "LC_ALL", "TMPDIR") if (v := os.environ.get(k))}
    env["HOME"] = (
        extra.get("CLAUDE_CONFIG_DIR")
        or extra.get("PI_CODING_AGENT_DIR")
        or extra.get("CODEX_HOME")
        or tempfile.gettempdir()
    )
    env.update(extra)
    return env


def _claude_credential_check(report: Report, settings: Mapping[str, Any]) -> None:
    """A key file, a key variable, an OAuth token or a `claude login` each satisfy Claude Code;
    only the source's name is shown, never the secret the connector resolved."""
    from connectors.claude_code import resolve_credential

    try:
        resolve_credential(settings)
    except Refusal as exc:
        report.missing.append(Missing(exc.message, exc.cure, "config"))


def _codex_key_check(report: Report, settings: Mapping[str, Any]) -> None:
    """The key file or the key variable, read as a spawn reads it; only its source is shown."""
    from connectors.codex import resolve_key

    try:
        resolve_key(settings)
    except Refusal as exc:
        report.missing.append(Missing(exc.message, exc.cure, "config"))


def _key_check(report: Report, settings: Mapping[str, Any], *, default: str | None) -> None:
    var = settings.get("api_key_env") or default
    if var and not os.environ.get(var):
        report.missing.append(
            Missing(
                f"{var} (the API key variable) is not set in this environment",
                f"export {var} before starting the manager, or name another variable with "
                f"agents.{report.name}.api_key_env",
                "config",
            )
        )
