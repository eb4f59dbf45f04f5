"""Configuration for a NATS cluster with JetStream: one file per node, routes to the others.

Used by the test harness (three nodes on 127.0.0.1) and by `deploy/nats-cluster/render.py`
for real hosts; the shape is the same, only addresses differ.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Node:
    name: str
    host: str
    client_port: int
    cluster_port: int
    http_port: int

    @property
    def client_url(self) -> str:
        return f"nats://{self.host}:{self.client_port}"

    @property
    def route_url(self) -> str:
        return f"nats://{self.host}:{self.cluster_port}"

    @property
    def monitor_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"


def render_node(
    node: Node,
    peers: list[Node],
    *,
    store_dir: str,
    user_nkey: str,
    cluster_name: str = "cotal",
    bind: str | None = None,
    grants: tuple[str, str] | None = None,
) -> str:
    """One node's config: JetStream on, routes to every peer, the nkey user required. With
    `grants` (the grant keeper's `auth.conf`, as a path relative to this config file, which is
    how nats-server reads an include, and the pid file the keeper signals), the users are the
    keeper's (manager/broker/grants.py)."""
    listen = bind or node.host
    if grants is None:
        auth = ["authorization {", f'  users = [ {{ nkey: "{user_nkey}" }} ]', "}"]
    else:
        include, pid_file = grants
        auth = [f"pid_file: {json.dumps(pid_file)}", f"include {json.dumps(include)}"]
    routes = ", ".join(json.dumps(p.route_url) for p in peers if p.name != node.name)
    return "\n".join(
        [
            f"server_name: {json.dumps(node.name)}",
            f"listen: {listen}:{node.client_port}",
            f"http: {listen}:{node.http_port}",
            "jetstream {",
            f"  store_dir: {json.dumps(store_dir)}",
            "}",
            "cluster {",
            f"  name: {json.dumps(cluster_name)}",
            f"  listen: {listen}:{node.cluster_port}",
            f"  routes: [{routes}]",
            "}",
            *auth,
            "",
        ]
    )
