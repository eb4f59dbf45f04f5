"""`cotal checkpoint verify|pack|list|discard`: sealed checkpoints. The admission gates are
`manager/coord/verify.py`; packing, listing and discarding are `manager/coord/checkpoints.py`;
what each prints is `results.py`.

`main` imports every command module to build its parser, so those coordinators (the broker
client, the signing and admission code) are imported by the handler that runs one."""

from __future__ import annotations

import argparse

from manager.cli.args import (
    CREDS_HELP,
    MAP_HELP,
    STALE_HELP,
    TRUST_HELP,
    Subcommands,
    command,
    root_of,
    subcommands,
)


def register(sub: Subcommands) -> None:
    ckpt = command(
        sub,
        "checkpoint",
        "sealed checkpoints",
        "cotal checkpoint verify /carried/20261129T142434Z-9356e4ba --server URL --creds FILE",
        common_flags=False,
    )
    ckpt_sub = subcommands(ckpt, "checkpoint_command")
    _register_verify(ckpt_sub)
    _register_pack(ckpt_sub)
    _register_list_and_discard(ckpt_sub)


def _register_verify(ckpt_sub: Subcommands) -> None:
    verify = command(
        ckpt_sub,
        "verify",
        "run the admission gates; change nothing",
        "cotal checkpoint verify /carried/20261129T142434Z-9356e4ba --server nats://10.0.0.5:4222"
        " --creds broker.creds",
        "cotal checkpoint verify .cotal/maintenance/v1/checkpoints/20261129T142434Z-9356e4ba"
        " --json --server nats://10.0.0.5:4222 --creds broker.creds",
    )
    verify.add_argument("dir", metavar="DIR", help="the sealed attempt directory")
    verify.add_argument("--accept-stale-checkpoint", action="store_true", help=STALE_HELP)
    verify.add_argument("--server", help="the broker to ask whether each uid is live")
    verify.add_argument("--trust-signer", action="append", metavar="KEY", help=TRUST_HELP)
    verify.add_argument(
        "--space",
        default="main",
        help="the space whose instance key pins a root's own cut (default: %(default)s)",
    )
    verify.add_argument("--creds", help=CREDS_HELP)
    verify.add_argument("--map", action="append", metavar="OLD=NEW", help=MAP_HELP)
    verify.set_defaults(run=run_verify)


def _register_pack(ckpt_sub: Subcommands) -> None:
    pack = command(
        ckpt_sub,
        "pack",
        "pack a sealed cut into one file to carry away, and hand its seats off: this root will"
        " not resume them from it (--take-back overrides)",
        "cotal checkpoint pack .cotal/maintenance/v1/checkpoints/20261129T142434Z-9356e4ba"
        " -o /carried/20261129T142434Z-9356e4ba.tar",
        "cotal checkpoint pack .cotal/maintenance/v1/checkpoints/20261129T142434Z-9356e4ba"
        " -o ckpt.tar --server nats://10.0.0.5:4222 --creds broker.creds --json",
        "cotal checkpoint pack .cotal/maintenance/v1/checkpoints/20261129T142434Z-9356e4ba"
        " -o /carried/ckpt.sealed --to x25519:dVHsg43vg6RBMkRDMfz9FTAAZI71UZpyh76xelK0T1s",
    )
    pack.add_argument("dir", metavar="DIR", help="the sealed attempt directory this root cut")
    pack.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE",
        help="the packed file to write (never overwritten); its sha256 is printed",
    )
    pack.add_argument(
        "--server",
        help="the broker that holds these seats' custody (default: the one this root's mesh "
        "record names; an embedded one is started briefly from this root's store)",
    )
    pack.add_argument("--creds", help=CREDS_HELP)
    pack.add_argument(
        "--to",
        metavar="KEY",
        help="seal the file to one destination root: its box key (x25519:...) as `cotal status` "
        "prints it there; only that root can open and resume it (default: not sealed, any root "
        "trusting this signer can)",
    )
    pack.add_argument(
        "--space",
        default="main",
        help="the space whose instance key pins this root's own cut (default: %(default)s)",
    )
    pack.set_defaults(run=run_pack)


def _register_list_and_discard(ckpt_sub: Subcommands) -> None:
    clist = command(
        ckpt_sub,
        "list",
        "list this root's checkpoints: state, seats, bytes, created, hand-off and journal",
        "cotal checkpoint list",
        "cotal checkpoint list --json",
    )
    clist.set_defaults(run=run_list)
    cdiscard = command(
        ckpt_sub,
        "discard",
        "remove a sealed or failed checkpoint of this root (and the journal of a sealed cut"
        " not restored); refused while an attempt under way still needs it",
        "cotal checkpoint discard 20261129T142434Z-9356e4ba",
        "cotal checkpoint discard 20261129T142434Z-9356e4ba.partial-20261129T142500Z --json",
    )
    cdiscard.add_argument(
        "attempt",
        metavar="ATTEMPT",
        help="the checkpoint's name as `cotal checkpoint list` shows it",
    )
    cdiscard.set_defaults(run=run_discard)


def run_verify(args: argparse.Namespace) -> int:
    from manager import eventloop
    from manager.cli import results
    from manager.coord import verify
    from manager.coord.requests import VerifyRequest

    req = VerifyRequest(
        dir=args.dir,
        space=args.space,
        server=args.server,
        creds=args.creds,
        map=tuple(args.map or ()),
        trust_signer=tuple(args.trust_signer or ()),
        accept_stale_checkpoint=args.accept_stale_checkpoint,
    )
    results.verified(args.json, eventloop.run(verify.verify, req, root_of(args)))
    return 0


def run_pack(args: argparse.Namespace) -> int:
    from manager import eventloop
    from manager.cli import results
    from manager.coord import checkpoints
    from manager.coord.requests import PackRequest

    req = PackRequest(
        dir=args.dir,
        output=args.output,
        to=args.to,
        space=args.space,
        server=args.server,
        creds=args.creds,
    )
    results.packed(args.json, eventloop.run(checkpoints.pack, req, root_of(args)))
    return 0


def run_list(args: argparse.Namespace) -> int:
    from manager.cli import results
    from manager.coord import checkpoints

    results.listed(args.json, checkpoints.gather(root_of(args)))
    return 0


def run_discard(args: argparse.Namespace) -> int:
    from manager.cli import results
    from manager.coord import checkpoints

    results.discarded(args.json, checkpoints.discard(root_of(args), args.attempt))
    return 0
