"""The refusal catalogue, the code and docs/cli.md agree, and a code is spelled only there.

The source of protocol/, connectors/ and manager/ is read with `ast` (nothing is imported or
run): every expression that lands in a refusal's code slot is resolved to its literals. A slot
is the first argument of `Refusal(...)` and of its subclasses that take a code, the code a
subclass's `__init__` hands to `super().__init__`, the `code=` of `ErrorBody`, a `"code"` key
of a dict literal, and, transitively, any parameter of a function that reaches one of those
(`_refuse(gate, code, ...)`, `error_reply(id, code, ...)`, `run_git(..., code="git-failed")`).
A slot is resolved through literals, conditional expressions, `or`, parameter defaults, module
constants (`BUSY = Code.CONTROL_BUSY`), local assignments, a module table of `(code, cure)`
tuples read with `.get`, and `canonical(...)` (a peer's older spelling made current). A slot
that hands on another refusal's code (`exc.code`, `failure.get("code")`) is counted where that
refusal was made.

A code is written once, as a member of `protocol.refusals.Code` that carries its spelling,
meaning and cure; a merged code's old name is an alias of that member, and its old spelling
still decodes (`MERGED` below pins the merges). A string literal in a code slot,
or compared with a refusal's `.code`, is a finding of `test_no_code_is_spelled_outside_the_
catalogue` (the one dynamic family, `bad-<argument>`, is KNOWN_UNRESOLVED below).
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from bench import refusal_table
from protocol import control
from protocol.errors import Refusal
from protocol.refusals import CATALOGUE, ENTRIES, OLD_SPELLINGS, Code, canonical

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("protocol", "connectors", "manager")
DOC = ROOT / "docs" / "cli.md"
SECTION = "## Refusal codes"

# Code slots the scan cannot resolve to literals, each with the rule that stands in for it. A
# new slot outside this set fails `test_every_code_slot_resolves`: raise a literal instead, or
# add the slot here with a rule that yields its codes.
KNOWN_UNRESOLVED = {
    # check_strings refuses a bad string argument as `bad-<argument>`; the codes are the
    # control args' string fields, `string_argument_codes()` below.
    ("manager/control/server.py", "f\"bad-{field.name.replace('_', '-')}\""),
}

# Codes in the catalogue that no scanned source raises: codes that only a process outside the
# scan produces, or that are kept for a peer that still sends them. Empty today; a code added
# here needs a comment saying who produces it.
RESERVED: frozenset[str] = frozenset()

CODE_SHAPE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


# -- the scan --------------------------------------------------------------------------------------


@dataclass
class Scan:
    # code -> the raise sites ("path:line") that name it
    codes: dict[str, list[str]] = field(default_factory=dict)
    # "path:line[:column]" -> the code spelled there as a literal rather than a `Code` member
    literals: dict[str, str] = field(default_factory=dict)
    # (path, expression) of each code slot no rule resolved
    unresolved: set[tuple[str, str]] = field(default_factory=set)


@dataclass(frozen=True)
class Sink:
    """Where a callable takes a code: a positional index (None: keyword only) and a keyword."""

    index: int | None
    keyword: str


Function = ast.FunctionDef | ast.AsyncFunctionDef


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _code_arg(call: ast.Call, sink: Sink) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == sink.keyword:
            return kw.value
    if sink.index is not None and sink.index < len(call.args):
        arg = call.args[sink.index]
        return None if isinstance(arg, ast.Starred) else arg
    return None


class Scanner:
    def __init__(self, root: Path) -> None:
        self.modules: list[tuple[str, ast.Module]] = []
        for top in SCANNED:
            for path in sorted((root / top).rglob("*.py")):
                rel = path.relative_to(root).as_posix()
                self.modules.append((rel, ast.parse(path.read_text(), rel)))
        self.consts: dict[str, set[str]] = {}
        self.tuple_tables: dict[str, set[str]] = {}
        # name -> {"path:line": code} where a module constant or table spells a code as a literal
        self.spelled_at: dict[str, dict[str, str]] = {}
        self.refusal_classes = {"Refusal"}
        # Names are matched unqualified: a sink is any callable of that name, so a helper that
        # shares a name with one is scanned too (a false code shows up as uncatalogued, which
        # is loud, rather than a missed one, which is silent).
        self.sinks: dict[str, set[Sink]] = {
            "Refusal": {Sink(0, "code")},
            "ErrorBody": {Sink(None, "code")},
        }
        # One walk of each tree, read by every pass below: `_propagate` reads each function
        # again on every round, and walking the trees each time made this scan seconds of CPU
        # for each test worker that ran one of these tests.
        self.nodes: dict[str, list[ast.AST]] = {}
        self._within: dict[int, list[ast.AST]] = {}
        for rel, tree in self.modules:
            self._index(rel, tree)
        self._module_level()
        self.functions = self._functions()

    def _module_level(self) -> None:
        for rel, tree in self.modules:
            for node in tree.body:
                if isinstance(node, ast.Assign):
                    targets, value = node.targets, node.value
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    targets, value = [node.target], node.value
                else:
                    continue
                for target in targets:
                    if not isinstance(target, ast.Name):
                        continue
                    literal = self.spelled_at.setdefault(target.id, {})
                    if (code := _spelled(value)) is not None:
                        self.consts.setdefault(target.id, set()).add(code)
                        if isinstance(value, ast.Constant):
                            literal[f"{rel}:{value.lineno}"] = code
                    elif isinstance(value, ast.Dict):
                        for v in value.values:
                            if (
                                isinstance(v, ast.Tuple)
                                and v.elts
                                and isinstance(v.elts[0], ast.Constant)
                                and isinstance(v.elts[0].value, str)
                            ):
                                literal[f"{rel}:{v.lineno}"] = v.elts[0].value
                        firsts = {
                            code
                            for v in value.values
                            if isinstance(v, ast.Tuple)
                            and v.elts
                            and (code := _spelled(v.elts[0])) is not None
                        }
                        if firsts:
                            self.tuple_tables[target.id] = firsts
        classes = [
            node
            for nodes in self.nodes.values()
            for node in nodes
            if isinstance(node, ast.ClassDef)
        ]
        grew = True
        while grew:
            grew = False
            for node in classes:
                if node.name in self.refusal_classes:
                    continue
                if any(_name(base) in self.refusal_classes for base in node.bases):
                    self.refusal_classes.add(node.name)
                    grew = True
                    own_init = any(
                        isinstance(item, Function) and item.name == "__init__" for item in node.body
                    )
                    if not own_init:  # Refusal's own signature: the code comes first
                        self.sinks[node.name] = {Sink(0, "code")}

    def _functions(self) -> list[tuple[str, Function, str | None]]:
        """Every function, with the refusal class whose `__init__` it is (else None)."""
        owners: dict[int, str] = {}
        for nodes in self.nodes.values():
            for node in nodes:
                if isinstance(node, ast.ClassDef) and node.name in self.refusal_classes:
                    for item in node.body:
                        if isinstance(item, Function) and item.name == "__init__":
                            owners[id(item)] = node.name
        return [
            (rel, node, owners.get(id(node)))
            for rel, nodes in self.nodes.items()
            for node in nodes
            if isinstance(node, Function)
        ]

    def _index(self, rel: str, tree: ast.Module) -> None:
        """Every node of `tree` in `nodes`, and under each function and each top-level
        statement the calls and dicts it holds (where a slot can be), nested ones included."""
        nodes = self.nodes.setdefault(rel, [])
        enclosing: list[list[ast.AST]] = []

        def visit(node: ast.AST) -> None:
            nodes.append(node)
            if isinstance(node, ast.Call | ast.Dict):
                for held in enclosing:
                    held.append(node)
            opens = isinstance(node, Function) or node in top
            if opens:
                enclosing.append(self._within.setdefault(id(node), []))
            for child in ast.iter_child_nodes(node):
                visit(child)
            if opens:
                enclosing.pop()

        top = set(tree.body)
        visit(tree)

    def _slots(self, body: ast.AST, owner: str | None) -> list[ast.expr]:
        slots: list[ast.expr] = []
        for node in self._within[id(body)]:
            if isinstance(node, ast.Call):
                name = _name(node.func)
                sinks = set(self.sinks.get(name or "", ()))
                if (
                    owner not in (None, "Refusal")  # Refusal's own super() is Exception's
                    and name == "__init__"
                    and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Call)
                    and _name(node.func.value.func) == "super"
                ):
                    sinks.add(Sink(0, "code"))
                for sink in sinks:
                    arg = _code_arg(node, sink)
                    if arg is not None:
                        slots.append(arg)
            elif isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "code":
                        slots.append(value)
        return slots

    def run(self) -> Scan:
        self._propagate()
        scan = Scan()
        for rel, fn, owner in self.functions:
            params = {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
            defaults = _defaults(fn)
            for slot in self._slots(fn, owner):
                self._resolve(rel, fn, slot, params, defaults, scan)
        for rel, tree in self.modules:
            for node in tree.body:
                if not isinstance(node, Function | ast.ClassDef):
                    for slot in self._slots(node, None):
                        self._resolve(rel, None, slot, set(), {}, scan)
        # A slot inside a nested function is seen from its enclosing one too; keep sites once.
        scan.codes = {code: sorted(set(sites)) for code, sites in scan.codes.items()}
        return scan

    def _propagate(self) -> None:
        """A function whose parameter reaches a code slot is itself a sink at that parameter."""
        grew = True
        while grew:
            grew = False
            for _, fn, owner in self.functions:
                params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
                positional = params[1:] if params[:1] in (["self"], ["cls"]) else params
                kwonly = [a.arg for a in fn.args.kwonlyargs]
                for slot in self._slots(fn, owner):
                    for name in _bare_names(slot):
                        if name in positional:
                            sink = Sink(positional.index(name), name)
                        elif name in kwonly:
                            sink = Sink(None, name)
                        else:
                            continue
                        known = self.sinks.setdefault(owner or fn.name, set())
                        if sink not in known:
                            known.add(sink)
                            grew = True

    def _resolve(
        self,
        rel: str,
        fn: Function | None,
        expr: ast.expr,
        params: set[str],
        defaults: dict[str, ast.expr],
        scan: Scan,
    ) -> None:
        def again(sub: ast.expr) -> None:
            self._resolve(rel, fn, sub, params, defaults, scan)

        def found(codes: set[str]) -> None:
            for code in codes:
                scan.codes.setdefault(code, []).append(f"{rel}:{expr.lineno}")

        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            found({expr.value})
            table = getattr(expr, "table", None)
            if table is None:
                scan.literals[f"{rel}:{expr.lineno}:{expr.col_offset}"] = expr.value
            else:
                scan.literals.update(self.spelled_at.get(table, {}))
        elif isinstance(expr, ast.Constant):
            pass  # a number under a "code" key is a peer's (JSON-RPC), not a refusal code
        elif _member(expr) is not None:
            found({_member(expr) or ""})
        elif isinstance(expr, ast.IfExp):
            again(expr.body)
            again(expr.orelse)
        elif isinstance(expr, ast.BoolOp):
            for value in expr.values:
                again(value)
        elif isinstance(expr, ast.Attribute) and expr.attr == "code":
            pass  # another refusal's code, handed on
        elif isinstance(expr, ast.Attribute) and expr.attr in self.consts:
            found(self.consts[expr.attr])
            scan.literals.update(self.spelled_at.get(expr.attr, {}))
        elif isinstance(expr, ast.Call) and _name(expr.func) == "canonical" and expr.args:
            again(expr.args[0])  # an older spelling read from a peer, made current
        elif isinstance(expr, ast.Call) and _name(expr.func) in ("get", "pop"):
            # `failure.get("code", "capture-failed")`, `codes.pop()`: codes handed on, and the
            # default, which is this site's own.
            if _name(expr.func) == "get" and len(expr.args) == 2:
                again(expr.args[1])
        elif isinstance(expr, ast.Name) and expr.id in params:
            # The callers' arguments are resolved at their call sites; the default is here.
            if expr.id in defaults:
                again(defaults[expr.id])
        elif isinstance(expr, ast.Name) and fn is not None and self._assigned(fn, expr.id):
            for value in self._assigned(fn, expr.id):
                again(value)
        elif isinstance(expr, ast.Name) and expr.id in self.consts:
            found(self.consts[expr.id])
            scan.literals.update(self.spelled_at.get(expr.id, {}))
        else:
            scan.unresolved.add((rel, ast.unparse(expr)))

    def _assigned(self, fn: Function, name: str) -> list[ast.expr]:
        """What a local `name` is assigned: a value, one element of an unpacked literal tuple,
        or the code of `(code, cure) = TABLE.get(key, default)` over a module table."""
        values: list[ast.expr] = []
        for node in ast.walk(fn):
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == name:
                    values.append(node.value)
                if not isinstance(target, ast.Tuple):
                    continue
                ids = [t.id if isinstance(t, ast.Name) else None for t in target.elts]
                if name not in ids:
                    continue
                i, value = ids.index(name), node.value
                if isinstance(value, ast.Tuple) and len(value.elts) == len(ids):
                    values.append(value.elts[i])
                elif (
                    i == 0
                    and isinstance(value, ast.Call)
                    and isinstance(value.func, ast.Attribute)
                    and value.func.attr == "get"
                    and isinstance(value.func.value, ast.Name)
                    and value.func.value.id in self.tuple_tables
                ):
                    table = self.tuple_tables[value.func.value.id]
                    for c in sorted(table):
                        entry = ast.copy_location(ast.Constant(c), value)
                        entry.table = value.func.value.id  # type: ignore[attr-defined]
                        values.append(entry)
                    if len(value.args) == 2 and isinstance(value.args[1], ast.Tuple):
                        values.append(value.args[1].elts[0])
                else:
                    values.append(value)
        return values


def _member(expr: ast.expr) -> str | None:
    """The code `Code.NAME` stands for, or None for any other expression."""
    if (
        isinstance(expr, ast.Attribute)
        and isinstance(expr.value, ast.Name)
        and expr.value.id == "Code"
        and expr.attr in Code.__members__
    ):
        return Code[expr.attr].value
    return None


def _spelled(expr: ast.expr) -> str | None:
    """A code as a module constant or a table cell holds it: a literal or a `Code` member."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    return _member(expr)


def _is_code(expr: ast.expr) -> bool:
    return (isinstance(expr, ast.Attribute) and expr.attr == "code") or (
        isinstance(expr, ast.Name) and expr.id == "code"
    )


def compared_literals(root: Path = ROOT) -> dict[str, str]:
    """Literals compared with a refusal's code (`exc.code == "missing"`, `code in {...}`)."""
    out: dict[str, str] = {}
    scanner = checkout_scanner() if root == ROOT else Scanner(root)
    for rel, tree in scanner.modules:
        # A module's sets of literals (`_BROKEN = frozenset({...})`), compared by name below.
        sets: dict[str, list[ast.expr]] = {}
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target, value = stmt.targets[0], stmt.value
                if isinstance(value, ast.Call) and value.args:
                    value = value.args[0]
                if isinstance(target, ast.Name) and isinstance(value, ast.Set | ast.Tuple):
                    sets[target.id] = list(value.elts)
        for node in scanner.nodes[rel]:
            if not (isinstance(node, ast.Compare) and len(node.ops) == 1):
                continue
            left, right = node.left, node.comparators[0]
            if not (_is_code(left) or _is_code(right)):
                continue
            other = right if _is_code(left) else left
            if isinstance(other, ast.Call) and other.args:
                other = other.args[0]  # frozenset({...})
            elts = other.elts if isinstance(other, ast.Set | ast.Tuple | ast.List) else [other]
            if isinstance(other, ast.Name):
                elts = sets.get(other.id, [])
            for elt in elts:
                if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                    out[f"{rel}:{elt.lineno}"] = elt.value
    return out


def _bare_names(expr: ast.expr) -> list[str]:
    if isinstance(expr, ast.Name):
        return [expr.id]
    if isinstance(expr, ast.IfExp):
        return _bare_names(expr.body) + _bare_names(expr.orelse)
    if isinstance(expr, ast.BoolOp):
        return [name for value in expr.values for name in _bare_names(value)]
    return []


def _defaults(fn: Function) -> dict[str, ast.expr]:
    positional = fn.args.posonlyargs + fn.args.args
    with_default = positional[len(positional) - len(fn.args.defaults) :]
    found = {a.arg: d for a, d in zip(with_default, fn.args.defaults, strict=True)}
    for arg, default in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True):
        if default is not None:
            found[arg.arg] = default
    return found


def scan_source(root: Path = ROOT) -> Scan:
    return Scanner(root).run()


@functools.cache
def checkout_scanner() -> Scanner:
    """This checkout's trees, parsed once for the scan and the comparisons alike."""
    return Scanner(ROOT)


def _admits_str(info: Any) -> bool:
    if isinstance(info, msgspec.inspect.StrType):
        return True
    if isinstance(info, msgspec.inspect.UnionType):
        return any(_admits_str(t) for t in info.types)
    if isinstance(info, msgspec.inspect.ListType):
        return _admits_str(info.item_type)
    if isinstance(info, msgspec.inspect.Metadata):
        return _admits_str(info.type)
    return False


def string_argument_codes() -> set[str]:
    """The `bad-<argument>` codes check_strings can raise: one per string (or list of
    strings) field of a control op's argument record."""
    codes: set[str] = set()
    for op in control.OPS.values():
        if not (isinstance(op.args, type) and issubclass(op.args, msgspec.Struct)):
            continue
        for f in msgspec.structs.fields(op.args):
            if _admits_str(msgspec.inspect.type_info(f.type)):
                codes.add("bad-" + f.name.replace("_", "-"))
    return codes


@functools.cache
def source_scan() -> Scan:
    """The scan of this checkout, read once for every test that needs it (not at collection)."""
    return checkout_scanner().run()


def raised() -> set[str]:
    return set(source_scan().codes) | string_argument_codes()


# -- the code and the catalogue --------------------------------------------------------------------


def test_every_raised_code_is_catalogued() -> None:
    missing = {
        code: source_scan().codes.get(code, ["manager/control/server.py (check_strings)"])[:3]
        for code in sorted(raised() - set(CATALOGUE))
    }
    assert missing == {}, "add these codes to protocol/refusals.py (code: first raise sites)"


def test_every_catalogued_code_is_raised() -> None:
    assert sorted(set(CATALOGUE) - raised() - RESERVED) == []
    assert sorted(RESERVED - set(CATALOGUE)) == []
    # A reserved code that is raised after all belongs with the others.
    assert sorted(RESERVED & raised()) == []


def test_every_code_slot_resolves() -> None:
    assert source_scan().unresolved - KNOWN_UNRESOLVED == set()


def test_no_code_is_spelled_outside_the_catalogue() -> None:
    """Raise `Code.NAME`: a literal code at a raise site or in a comparison is a second spelling
    the catalogue cannot see renamed."""
    assert source_scan().literals == {}
    assert compared_literals() == {}


def test_every_member_has_one_entry() -> None:
    fixed = [entry.code for entry in ENTRIES if entry.code in set(Code)]
    assert sorted(fixed) == sorted(Code), "a Code member lacks its entry, or has two"
    for member in Code:
        assert member.name == member.value.upper().replace("-", "_"), member


def test_the_scan_follows_each_way_a_code_travels() -> None:
    """One code per rule, from the real source: if a rule stopped working, the two tests above
    would pass without looking."""
    expected = {
        "no-such-seat": "manager/daemon/core.py",  # Refusal("...")
        "git-failed": "manager/checkpoint/gitstate.py",  # run_git's default code=
        "apply-failed": "manager/checkpoint/restore.py",  # run_git(..., code="...")
        "future-checkpoint": "manager/checkpoint/admit.py",  # _refuse(gate, "...", ...)
        "internal-error": "manager/control/server.py",  # error_reply(id, ...) -> ErrorBody(code=)
        "control-busy": "manager/control/client.py",  # Refusal(Code.CONTROL_BUSY, ...)
        "illegal-transition": "protocol/maintenance.py",  # super().__init__("...")
        "malformed": "protocol/errors.py",  # DecodeError's super().__init__
        "fenced-out": "manager/broker/fence.py",
        "harness-error": "connectors/jsonl_driver.py",  # DriverError(...)
        "error": "manager/control/client.py",  # ControlError(a if b else "...")
        "capture-failed": "manager/daemon/preserve.py",  # {"code": codes.get(n, "...")}
        "cut-incomplete": "manager/coord/cut.py",  # x.pop() if ... else "..."
        "unstable": "connectors/privatefs.py",  # code, cure = _READ_CURES.get(...)
    }
    codes = source_scan().codes
    seen = {code: {site.split(":")[0] for site in codes.get(code, [])} for code in expected}
    assert {c: where in seen[c] for c, where in expected.items()} == dict.fromkeys(expected, True)


def test_the_scan_finds_a_new_code_by_any_route(tmp_path: Path) -> None:
    (tmp_path / "protocol").mkdir()
    (tmp_path / "connectors").mkdir()
    (tmp_path / "manager").mkdir()
    (tmp_path / "protocol" / "x.py").write_text(
        "BUSY = 'const-code'\n"
        "class Sub(Refusal):\n"
        "    def __init__(self, what):\n"
        "        super().__init__('sub-code', what)\n"
        "class Plain(Refusal):\n"
        "    pass\n"
        "def helper(gate, code, text, cure=''):\n"
        "    return Refusal(code, text, cure)\n"
        "def outer(code='default-code'):\n"
        "    return helper('g', code, 't')\n"
        "def f(ok, name):\n"
        "    Plain('plain-code', 'm')\n"
        "    helper('g', 'helper-code' if ok else 'other-code', 't')\n"
        "    outer(code='kw-code')\n"
        "    Refusal(BUSY, 'm')\n"
        "    Refusal(f'bad-{name}', 'm')\n"
        "    Refusal(Code.NO_SUCH_SEAT, 'm')\n"
        "    Refusal(canonical(exc.code), 'm')\n"
    )
    found = scan_source(tmp_path)
    assert sorted(found.codes) == [
        "const-code",
        "default-code",
        "helper-code",
        "kw-code",
        "no-such-seat",
        "other-code",
        "plain-code",
        "sub-code",
    ]
    assert found.unresolved == {("protocol/x.py", "f'bad-{name}'")}
    # Every route but the member is a literal, and each is reported where it is spelled.
    assert "no-such-seat" not in found.literals.values()
    assert sorted(set(found.literals.values())) == sorted(set(found.codes) - {"no-such-seat"})


def test_string_argument_codes_follow_the_control_records() -> None:
    codes = string_argument_codes()
    # Fields that are strings on the wire today; a struct or a number is never a bad-<arg>.
    assert {"bad-name", "bad-cwd", "bad-text", "bad-session-stores"} <= codes
    assert "bad-wait" not in codes and "bad-inventory" not in codes


def test_entries_are_well_formed() -> None:
    assert len(ENTRIES) == len(CATALOGUE), "a code is listed twice in protocol/refusals.py"
    for entry in ENTRIES:
        assert CODE_SHAPE.match(entry.code), entry.code
        for text in (entry.meaning, entry.cure):
            # One table cell each: no pipe, no newline, no leading or trailing space.
            assert text and text == text.strip(), entry.code
            assert "|" not in text and "\n" not in text, entry.code


# -- merged codes ----------------------------------------------------------------------------------


# The merged codes, older spelling -> the code it was merged into. A merge is a decision, so it is
# written here as well as in protocol/refusals.py: two members spelled alike by mistake become an
# alias silently, and this is what notices.
MERGED = {
    "base-absent": "base-missing",
    "driver-stopped": "harness-gone",
    "exists": "checkpoint-exists",
    "harness-refused": "harness-error",
    "internal": "internal-error",
    "principal-live": "uid-live",
    "space-mismatch": "wrong-space",
    "uid-held": "duplicate-principal",
}


def test_every_code_has_its_meaning_and_cure() -> None:
    """Each member carries its spelling, meaning and cure, as one table cell each."""
    for member in Code:
        assert isinstance(member, str) and member == member.value, member.name
        assert CODE_SHAPE.match(member.value), member.name
        for text in (member.meaning, member.cure):
            assert isinstance(text, str) and text and text == text.strip(), member.name
            assert "|" not in text and "\n" not in text, member.name
        entry = CATALOGUE[member.value]
        assert entry.meaning.startswith(member.meaning) and entry.cure == member.cure


def test_the_merged_codes_are_the_decided_ones() -> None:
    assert {old: member.value for old, member in OLD_SPELLINGS.items()} == MERGED


def test_each_alias_resolves_to_its_canonical_member() -> None:
    aliases = {name: m for name, m in Code.__members__.items() if name != m.name}
    assert sorted(aliases) == sorted(old.upper().replace("-", "_") for old in MERGED)
    for name, member in aliases.items():
        old = name.lower().replace("_", "-")
        assert member is Code[MERGED[old].upper().replace("-", "_")], name
        assert member.value == MERGED[old] and member.name != name
        # A raise site that names the alias raises, prints and encodes the canonical spelling.
        refusal = Refusal(getattr(Code, name), "m", "c")
        assert refusal.code == MERGED[old] and f"{refusal.code}" == MERGED[old]
        assert msgspec.json.encode(refusal.code) == msgspec.json.encode(MERGED[old])


def test_old_spellings_decode() -> None:
    for old, new in MERGED.items():
        assert Code(old) is Code(new), old
        assert canonical(old) == new
        # Never printed, never a row of its own, but named in its code's row.
        assert old not in CATALOGUE
        assert f"`{old}`" in CATALOGUE[new].meaning
    # Anything else comes through as it was: a current code, a bad-<argument>, a newer peer's.
    for code in ("no-such-seat", "bad-text", "some-newer-code"):
        assert canonical(code) == code
    for spelling in ("bad-text", "some-newer-code", "BASE_ABSENT", "base_absent", ""):
        with pytest.raises(ValueError):
            Code(spelling)


# -- docs/cli.md -----------------------------------------------------------------------------------


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split(" | ")]


def doc_catalogue() -> list[tuple[str, str, str]]:
    """The rows of docs/cli.md's "Refusal codes" table: (code, meaning, cure)."""
    lines = DOC.read_text().splitlines()
    start = lines.index(SECTION)
    rows: list[tuple[str, str, str]] = []
    in_table = False
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            if in_table:
                break
            continue
        in_table = True
        cells = _cells(line)
        if cells[0] == "code" or set(line) <= set("|-"):
            continue
        assert len(cells) == 3, line
        code = cells[0].strip("`")
        rows.append((code, cells[1], cells[2]))
    return rows


def test_the_docs_table_is_the_catalogue() -> None:
    rows = doc_catalogue()
    codes = [code for code, _, _ in rows]
    assert len(codes) == len(set(codes)), "a code has two rows"
    assert sorted(set(codes) - set(CATALOGUE)) == [], "rows for codes the catalogue lacks"
    assert sorted(set(CATALOGUE) - set(codes)) == [], "catalogue codes with no row"
    drift = {
        code: {
            "docs": (meaning, cure),
            "catalogue": (CATALOGUE[code].meaning, CATALOGUE[code].cure),
        }
        for code, meaning, cure in rows
        if (meaning, cure) != (CATALOGUE[code].meaning, CATALOGUE[code].cure)
    }
    assert drift == {}, "rerun .venv/bin/python bench/refusal_table.py"
    assert codes == sorted(codes)


def test_the_docs_table_is_what_the_renderer_writes() -> None:
    text = DOC.read_text()
    assert refusal_table.render(text) == text


def test_command_sections_name_only_catalogued_codes() -> None:
    """The per-command refusal tables above the catalogue say when a command refuses; each code
    they name must be one the code raises (the drift this test was written for: `unmerged-index`
    and `submodules` where the code says `unmerged` and `submodule`)."""
    lines = DOC.read_text().splitlines()
    named: dict[str, int] = {}
    header: list[str] | None = None
    for number, line in enumerate(lines[: lines.index(SECTION)], start=1):
        if not line.startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = cells
            continue
        if header[0] not in ("refusal", "code") or set(line) <= set("|-"):
            continue
        for code in re.findall(r"`([^`]+)`", cells[0]):
            if CODE_SHAPE.match(code):  # not a flag such as `--since ATTEMPT:`
                named.setdefault(code, number)
    assert named, "no refusal table found above the catalogue"
    # An older spelling is still named in its code's row; the prose should move to the new one.
    unknown = {
        code: line
        for code, line in named.items()
        if code not in CATALOGUE and code not in OLD_SPELLINGS
    }
    assert unknown == {}, "docs/cli.md names codes the code does not raise (code: line)"
