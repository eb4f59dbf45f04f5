"""`cotal trust add|list|remove`: the operator's list of checkpoint signers this root admits.

Parsing and printing only; the store and its rules are `manager.workspace.trust`. `main`
imports every command module to build its parser, so that store (and the Ed25519 code it
brings) is imported by the handler that reads or changes it, not at this module's top.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from manager.cli.args import Subcommands, command, root_of, subcommands
from manager.cli.output import emit_json, say
from manager.workspace.layout import Layout

Say = Callable[[str], None]
Emit = Callable[[Any], None]

# RFC 8032's first test public key: a real Ed25519 key to show the shape of one.
_EXAMPLE_KEY = "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="


def register(sub: Subcommands) -> None:
    trust_cmd = command(
        sub,
        "trust",
        "the checkpoint signers this root admits besides its own manager",
        f"cotal trust add {_EXAMPLE_KEY} --name host-a",
        "cotal trust list",
        "cotal trust remove host-a",
        common_flags=False,
    )
    trust_sub = subcommands(trust_cmd, "trust_command")
    tadd = command(
        trust_sub,
        "add",
        "trust a manager's checkpoint signing key (compare it with `cotal status` there first)",
        f"cotal trust add {_EXAMPLE_KEY} --name host-a",
        f"cotal trust add {_EXAMPLE_KEY} --name host-a --json",
    )
    tadd.add_argument(
        "key",
        metavar="KEY",
        help="the signer's raw Ed25519 public key, base64, as an untrusted-signer refusal or "
        "`cotal status` on the source prints it",
    )
    tadd.add_argument(
        "--name",
        help="a label for the signer, e.g. the source host or its instance id "
        "(default: signer-<hex of the key's digest>)",
    )
    tadd.set_defaults(run=_add)
    tlist = command(
        trust_sub,
        "list",
        "list the trusted signers: name, fingerprint and key",
        "cotal trust list",
        "cotal trust list --json",
    )
    tlist.set_defaults(run=_list)
    tremove = command(
        trust_sub,
        "remove",
        "stop trusting a signer",
        "cotal trust remove host-a",
        f"cotal trust remove {_EXAMPLE_KEY}",
    )
    tremove.add_argument("signer", metavar="KEY|NAME", help="the signer's key or its name")
    tremove.set_defaults(run=_remove)


def _add(args: argparse.Namespace) -> int:
    return run_add(root_of(args), args.key, args.name, as_json=args.json, say=say, emit=emit_json)


def _list(args: argparse.Namespace) -> int:
    return run_list(root_of(args), as_json=args.json, say=say, emit=emit_json)


def _remove(args: argparse.Namespace) -> int:
    return run_remove(root_of(args), args.signer, as_json=args.json, say=say, emit=emit_json)


def run_add(root: Path, key: str, name: str | None, *, as_json: bool, say: Say, emit: Emit) -> int:
    from manager.workspace import trust

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
    from manager.workspace import trust

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
    from manager.workspace import trust

    change = trust.remove_signer(Layout.at(root), key_or_name)
    if as_json:
        emit(change.as_dict())
        return 0
    say(f"no longer trusts signer {change.signer.name} ({change.signer.fingerprint})")
    return 0
