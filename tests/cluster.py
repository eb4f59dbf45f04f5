"""A real 3-node NATS cluster with JetStream on 127.0.0.1, whose nodes can be killed and
restarted."""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import nats

from manager.broker import grants as broker_grants
from manager.broker.cluster import Node, render_node
from manager.broker.embedded import nats_server_binary
from manager.broker.seeds import generate_user_seed


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@dataclass
class Cluster:
    base: Path
    nodes: list[Node] = field(default_factory=list)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    creds: str = ""
    # With grants, each node takes its users from the grant keeper's file, and a keeper process
    # rewrites it from the custody bucket (manager/broker/grants.py).
    grants: bool = False
    keeper: subprocess.Popen[bytes] | None = None

    @property
    def grants_dir(self) -> Path:
        return broker_grants.grants_dir(self.base)

    @property
    def urls(self) -> str:
        return ",".join(n.client_url for n in self.nodes)

    @property
    def monitors(self) -> str:
        return ",".join(n.monitor_url for n in self.nodes)

    def configure(self) -> None:
        ports = free_ports(9)
        self.nodes = [
            Node(f"n{i + 1}", "127.0.0.1", ports[3 * i], ports[3 * i + 1], ports[3 * i + 2])
            for i in range(3)
        ]
        creds = self.base / "auth" / "broker.creds"
        pub = generate_user_seed(creds)
        self.creds = str(creds)
        if self.grants:
            # The cluster's own credential holds no seat: the tests' readiness probes use it.
            broker_grants.prepare(
                self.base, ["main"], [broker_grants.Host(name="cluster", nkey=pub)]
            )
        for node in self.nodes:
            (self.base / node.name).mkdir(parents=True, exist_ok=True)
            (self.base / f"{node.name}.conf").write_text(
                render_node(
                    node,
                    self.nodes,
                    store_dir=str(self.base / node.name),
                    user_nkey=pub,
                    grants=self._grants_of(node),
                )
            )

    def _grants_of(self, node: Node) -> tuple[str, str] | None:
        if not self.grants:
            return None
        include = str(broker_grants.auth_conf(self.grants_dir).relative_to(self.base))
        return include, str(self.grants_dir / f"{node.name}.pid")

    def start_keeper(self) -> None:
        """The grant keeper for every node, outliving a node's restart; after `wait_ready`."""
        targets = [
            broker_grants.Target(url=n.client_url, pid_file=str(self.grants_dir / f"{n.name}.pid"))
            for n in self.nodes
        ]
        config = broker_grants.KeeperConfig(
            version=1, spaces=["main"], replicas=3, targets=targets, exit_with_broker=False
        )
        broker_grants.write_keeper_config(self.grants_dir, config)
        self.keeper = broker_grants.spawn_keeper(self.grants_dir, timeout=60.0)

    def add_host(self, name: str, holders: list[str]) -> str:
        return str(broker_grants.new_host(self.grants_dir, name, holders))

    def start(self, name: str) -> None:
        log = open(self.base / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            self.procs[name] = subprocess.Popen(
                [nats_server_binary(), "-c", str(self.base / f"{name}.conf")],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )
        finally:
            log.close()

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait()

    def stop_all(self) -> None:
        if self.keeper is not None:
            self.keeper.kill()
            self.keeper.wait()
            self.keeper = None
        for name in list(self.procs):
            self.kill(name)

    async def wait_ready(self, timeout: float = 45.0) -> None:
        """JetStream answers through every live node (a meta leader exists), and with all three
        nodes up, the meta group knows every peer: an R3 asset can be placed."""
        with anyio.fail_after(timeout):
            await self._wait_answering()
            if len(self.procs) == len(self.nodes):
                await self._wait_placeable()

    async def _wait_placeable(self) -> None:
        live = [n for n in self.nodes if n.name in self.procs]
        # Under grants no host may delete a stream; the keeper's own user may.
        seed = str(broker_grants.keeper_seed(self.grants_dir)) if self.grants else self.creds
        while True:
            try:
                nc = await nats.connect(
                    live[0].client_url,
                    nkeys_seed=seed,
                    connect_timeout=1,
                    allow_reconnect=False,
                )
            except Exception:
                await anyio.sleep(0.2)
                continue
            try:
                js = nc.jetstream()
                await js.add_stream(name="READY_PROBE", subjects=["ready.probe"], num_replicas=3)
                await js.delete_stream("READY_PROBE")
                return
            except Exception:
                await anyio.sleep(0.3)
            finally:
                await nc.close()

    async def _wait_answering(self) -> None:
        for node in [n for n in self.nodes if n.name in self.procs]:
            while True:
                try:
                    nc = await nats.connect(
                        node.client_url,
                        nkeys_seed=self.creds,
                        connect_timeout=1,
                        allow_reconnect=False,
                    )
                except Exception:
                    await anyio.sleep(0.2)
                    continue
                try:
                    await nc.jetstream().account_info()
                    break
                except Exception:
                    await anyio.sleep(0.2)
                finally:
                    await nc.close()

    def __enter__(self) -> Cluster:
        self.configure()
        for node in self.nodes:
            self.start(node.name)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def wait_port_closed(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return
        time.sleep(0.05)
