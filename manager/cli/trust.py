"""`cotal trust add|list|remove`: the operator's list of checkpoint signers this root admits.

Parsing and printing only; the store and its rules are `manager.workspace.trust`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from manager.workspace import trust
from manager.workspace.layout import Layout

Say = Callable[[str], None]
Emit = Callable[[Any], None]


def run_add(root: Path, key: str, name: str | None, *, as_json: bool, say: Say, emit: Emit) -> int:
    change = trust.add_signer(Layout.at(root), key, name)
    if as_json:
        emit(change.as_dict())
        return 0
    signer = change.signer
    verb = {
        "added": "now trusts",
        "unchanged": "already trusts",
        "renamed": "now names",
    }[change.outcome]
    say(f"{Layout.at(root).root} {verb} signer {signer.name}")
    say(f"  key          {signer.key}")
    say(f"  fingerprint  {signer.fingerprint}")
    return 0


def run_list(root: Path, *, as_json: bool, say: Say, emit: Emit) -> int:
    signers = trust.read_trusted(Layout.at(root))
    if as_json:
        for signer in signers:
            emit(signer.as_dict())
        return 0
    if not signers:
        say("no trusted signers (only this root's own manager key is admitted)")
        say("next: cotal trust add KEY --name HOST, after comparing KEY with `cotal status` there")
        return 0
    width = max(len(s.name) for s in signers)
    say(f"{'NAME'.ljust(width)}  {'FINGERPRINT'.ljust(50)}  KEY")
    for s in signers:
        say(f"{s.name.ljust(width)}  {s.fingerprint.ljust(50)}  {s.key}")
    return 0


def run_remove(root: Path, key_or_name: str, *, as_json: bool, say: Say, emit: Emit) -> int:
    change = trust.remove_signer(Layout.at(root), key_or_name)
    if as_json:
        emit(change.as_dict())
        return 0
    say(f"no longer trusts signer {change.signer.name} ({change.signer.fingerprint})")
    return 0
