"""`cotal doctor`: which harnesses this host can run seats with, and what is missing.

For each harness `manager.registry.KNOWN` names, its connector's own `doctor` reports:

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
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from connectors import sandbox
from connectors.base import continuity_class
from connectors.doctorkit import HarnessCheck, Missing, Pins
from manager import registry
from manager.checkpoint import clock
from manager.workspace import roots
from manager.workspace.layout import Layout
from protocol import control
from protocol.errors import Refusal

PS_TIMEOUT_S = 5.0
UNUSED_ABSENT = "not installed (not used by this root)"


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
    pins = Pins.load()
    reports = [
        check(
            name,
            registry.agent_settings(cfg, name),
            pins,
            configured=name in cfg.agents,
            used_by=used_by(name, cfg, seats),
        )
        for name in registry.KNOWN
    ]
    isolation = isolation_row()
    time_row = clock_row(cfg.recency)
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
    reasons = ["default agent"] if name == registry.DEFAULT_AGENT else []
    if name in cfg.agents:
        reasons.append("cotal.toml")
    reasons += [f"seat {seat}" for seat, agent in sorted(seats.items()) if agent == name]
    return reasons


def running_seats(root: Path) -> dict[str, str]:
    """Seat name -> agent of the seats the root's manager holds, or nothing when no manager
    answers: a doctor run must work on a machine where nothing is up."""
    from manager.coord import mesh

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


def clock_row(recency: registry.RecencyConfig) -> dict[str, Any]:
    """Whether a resume here can judge a checkpoint's age: never a failure of the check, since
    a host that only cuts needs no synchronized clock. An operator's declaration is shown with
    its reason beside the kernel's own reading, as every admission it decides prints it."""
    reading = clock.read_clock(registry.trusted_clock_reason(recency))
    row: dict[str, Any] = {
        "name": "clock",
        "synchronized": reading.synchronized,
        "source": reading.source,
        "detail": reading.detail,
        "warning": None,
    }
    if reading.source == clock.TEST_HOOK_ENV:
        row["warning"] = (
            f"{clock.TEST_HOOK_ENV} stands in for the kernel's reading: a test hook, never "
            "for a real destination; unset it"
        )
    elif reading.source == clock.DECLARED:
        row["warning"] = (
            'the kernel says unsynchronized and cotal.toml [recency] clock = "trusted" vouches '
            "for this clock instead: every admission here journals and prints that"
        )
    elif not reading.synchronized:
        row["warning"] = (
            "a resume or `checkpoint verify` here refuses clock-unsynchronized; start chrony, "
            "ntpd or systemd-timesyncd, or, where no time daemon can run (a container), declare "
            '[recency] clock = "trusted" with clock_reason in cotal.toml'
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
    pins: Pins,
    *,
    configured: bool,
    used_by: list[str] | None = None,
) -> Report:
    """One harness's row: its connector's own check, under what this root makes of it."""
    report = Report(
        name=name, continuity="unavailable", configured=configured, used_by=list(used_by or [])
    )
    try:
        connector = registry.load_connector(name)
    except Refusal:
        report.missing.append(
            Missing(f"the {name} connector cannot be imported in this build", "reinstall cotal")
        )
        return report
    report.continuity = continuity_class(connector.capabilities)
    try:
        found = connector.doctor(settings, pins)
    except Refusal as exc:
        # cotal.toml was decoded by this connector's struct already; a refusal here is a
        # setting the connector itself cannot take.
        found = HarnessCheck(missing=[Missing(exc.message, exc.cure, "config")])
    report.installed, report.path, report.version = found.installed, found.path, found.version
    report.usable = found.usable
    report.missing += found.missing
    return report
