"""The CLI reads control replies as records, never as dictionaries (issue 23, item 2).

Read with `ast` over every module under manager/cli: no raw `.call(` (op by string, reply as
JSON) is left, and every `request(` (the session's, the mesh's, a command's own wrapper) names
its op by an `Op` constant of `protocol/control.py`, or passes on an `Op` its caller named. A
reply typed by its op is decoded strictly into its record, so a `["key"]` on it does not
type-check; the scan is what keeps the string-keyed form from coming back.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from protocol import control

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "manager" / "cli"
OP_CONSTANTS = frozenset(
    name for name, value in vars(control).items() if isinstance(value, control.Op)
)
_OP_ANNOTATION = re.compile(r"(^|\.)Op\[")
# Raw callers still waiting on a change in a file outside this work: (module, function). Each
# must still hold its raw call (checked below), so an entry is removed once its caller is typed.
PENDING: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Finding:
    module: str
    function: str
    line: int
    what: str


@dataclass
class _Scan(ast.NodeVisitor):
    module: str
    findings: list[Finding] = field(default_factory=list)
    # Names bound to the module protocol.control, and Op constants imported by their own name.
    control_aliases: set[str] = field(default_factory=set)
    op_names: set[str] = field(default_factory=set)
    # Per enclosing function: its name, and its parameters annotated as an Op.
    scopes: list[tuple[str, set[str]]] = field(default_factory=list)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == "protocol.control" and alias.asname:
                self.control_aliases.add(alias.asname)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            bound = alias.asname or alias.name
            if node.module == "protocol" and alias.name == "control":
                self.control_aliases.add(bound)
            elif node.module == "protocol.control" and alias.name in OP_CONSTANTS:
                self.op_names.add(bound)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        typed = {
            p.arg
            for p in params
            if p.annotation is not None and _OP_ANNOTATION.search(ast.unparse(p.annotation))
        }
        self.scopes.append((node.name, typed))
        self.generic_visit(node)
        self.scopes.pop()

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def _where(self) -> str:
        return ".".join(name for name, _ in self.scopes) or "<module>"

    def _flag(self, node: ast.AST, what: str) -> None:
        line = getattr(node, "lineno", 0)
        self.findings.append(Finding(self.module, self._where(), line, what))

    def _names_op(self, arg: ast.expr) -> bool:
        if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name):
            return arg.value.id in self.control_aliases and arg.attr in OP_CONSTANTS
        if isinstance(arg, ast.Name):
            passed_on = any(arg.id in typed for _, typed in self.scopes)
            return arg.id in self.op_names or passed_on
        return False

    def visit_Attribute(self, node: ast.Attribute) -> None:
        # A reference counts as much as a call: `eventloop.run(mesh.call, ...)` is one.
        if node.attr == "call":
            self._flag(node, f"raw `{ast.unparse(node)}`")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = (
            func.attr
            if isinstance(func, ast.Attribute)
            else func.id
            if isinstance(func, ast.Name)
            else None
        )
        if name == "call" and isinstance(func, ast.Name):
            self._flag(node, "raw `call(...)`")
        if name is not None and name.endswith("request"):
            if not any(self._names_op(arg) for arg in node.args):
                self._flag(node, f"`{ast.unparse(node)[:80]}` names no Op constant")
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    self._flag(node, f"`{name}` given the op by string {arg.value!r}")
        self.generic_visit(node)


def scan(source: str, module: str) -> list[Finding]:
    scanner = _Scan(module)
    scanner.visit(ast.parse(source))
    return scanner.findings


def _modules() -> Iterator[tuple[str, str]]:
    # The CLI and the coordinators below it, which ask the manager on its behalf.
    for path in sorted([*CLI.rglob("*.py"), *(CLI.parent / "coord").rglob("*.py")]):
        yield path.relative_to(REPO).as_posix(), path.read_text()


def _all_findings() -> list[Finding]:
    return [f for module, source in _modules() for f in scan(source, module)]


def _pending(finding: Finding) -> bool:
    return (finding.module, finding.function.split(".")[0]) in PENDING


def test_no_raw_control_call_is_left_in_manager_cli() -> None:
    left = [f for f in _all_findings() if not _pending(f)]
    assert left == []


def test_each_pending_raw_caller_still_holds_its_raw_call() -> None:
    # A pending entry whose raw call is gone must go too, or it would hide the next one.
    held = {(f.module, f.function.split(".")[0]) for f in _all_findings() if _pending(f)}
    assert held == PENDING


def test_the_cli_asks_through_op_constants_at_all() -> None:
    # The scan is vacuous if it finds no request at all: the CLI's own asks are counted.
    asked = [
        (module, node.lineno)
        for module, source in _modules()
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute | ast.Name)
        and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id).endswith(
            "request"
        )
    ]
    assert len(asked) >= 20
    assert {m for m, _ in asked} >= {
        "manager/coord/cut.py",
        "manager/cli/inbox.py",
        "manager/coord/mesh.py",
        "manager/coord/progress.py",
        "manager/coord/handshake.py",
        "manager/cli/seats.py",
    }


SAMPLE = """
from protocol import control
from protocol.control import PS
import protocol.control as wire


async def raw(session, root):
    rows = await session.call("ps", {})
    eventloop.run(mesh.call, root, "ps", {}, 5.0)
    return call(root, "ps", {})


async def typed(session, root):
    await session.request(control.PS, control.NoArgs())
    await session.request(PS, control.NoArgs())
    await wire_session.request(wire.STATUS, wire.NoArgs())
    await mesh.request(root, control.SPAWN, control.SpawnArgs(name="a"))


async def untyped(session, root, op):
    await session.request("ps", {})
    await session.request(control.NoArgs, {})
    await session.request(op, None)


def passes_on(root, op: control.Op[A, R], args: A) -> R:
    return mesh.run_request(root, op, args)
"""


def test_the_scan_flags_each_raw_form_and_passes_each_typed_one() -> None:
    found = sorted((f.function, f.line, f.what) for f in scan(SAMPLE, "sample.py"))
    assert found == [
        ("raw", 8, "raw `session.call`"),
        ("raw", 9, "raw `mesh.call`"),
        ("raw", 10, "raw `call(...)`"),
        ("untyped", 21, "`request` given the op by string 'ps'"),
        ("untyped", 21, "`session.request('ps', {})` names no Op constant"),
        ("untyped", 22, "`session.request(control.NoArgs, {})` names no Op constant"),
        ("untyped", 23, "`session.request(op, None)` names no Op constant"),
    ]
