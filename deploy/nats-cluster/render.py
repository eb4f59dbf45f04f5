"""Render the three node configs of a cotal NATS cluster.

    python deploy/nats-cluster/render.py --hosts 10.0.0.11,10.0.0.12,10.0.0.13 \
        --user-nkey UXXXX --store-dir /var/lib/nats --out /etc/nats

writes n1.conf, n2.conf, n3.conf (client 4222, cluster 6222, monitoring 8222 on each host).
The user nkey is the public key of the credential every cotal manager connects with
(`cotal broker serve` prints where its seed is; `nk -inkey seed -pubout` gives the public key).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from manager.broker.cluster import Node, render_node  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--hosts", required=True, help="three comma-separated host addresses")
    p.add_argument("--user-nkey", required=True)
    p.add_argument("--store-dir", default="/var/lib/nats")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    if len(hosts) != 3:
        p.error("--hosts takes exactly three addresses")
    nodes = [Node(f"n{i + 1}", h, 4222, 6222, 8222) for i, h in enumerate(hosts)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for node in nodes:
        (out / f"{node.name}.conf").write_text(
            render_node(
                node,
                nodes,
                store_dir=f"{args.store_dir}/{node.name}",
                user_nkey=args.user_nkey,
                bind="0.0.0.0",
            )
        )
    print(f"wrote {', '.join(n.name + '.conf' for n in nodes)} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
