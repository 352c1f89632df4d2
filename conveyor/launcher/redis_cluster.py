"""A Redis Cluster on loopback from the embedded valkey-server, with no external tool: N primaries
(`--cluster-enabled yes`), each given a contiguous range of the 16384 hash slots
(`CLUSTER ADDSLOTSRANGE`), introduced to each other (`CLUSTER MEET`), ready once every node reports
`cluster_state:ok` and knows all the others. For tests and benchmarks (no replicas: a node that
dies takes its slots with it).
"""

from __future__ import annotations

import random
import socket
import time
from pathlib import Path

import redis

from conveyor.launcher.redis_server import EmbeddedRedis, RedisServerError

SLOTS = 16384
BUS_OFFSET = 10_000  # a node's cluster bus listens on its port + 10000


def cluster_port() -> int:
    """A free port whose bus port (+10000) is free too, so at most 55535."""
    for _ in range(200):
        port = random.randint(20_000, 55_535)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + BUS_OFFSET))
            return port
        except OSError:
            continue
    raise RedisServerError("no free port pair (port, port + 10000) for a cluster node on loopback")


class LocalCluster:
    def __init__(self, data_dir: Path, nodes: int = 3, appendfsync: str = "everysec") -> None:
        self.data_dir = Path(data_dir)
        self.nodes = [
            EmbeddedRedis(self.data_dir / f"node{i}", port=cluster_port(), appendfsync=appendfsync,
                          extra_args=(
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "5000",
                # Sharded pub/sub and scripts are what Conveyor needs; no replica would take over anyway.
                "--cluster-require-full-coverage", "yes",
            ))
            for i in range(nodes)
        ]

    @property
    def url(self) -> str:
        """Every node as a startup node (the form REDIS_URL takes for a cluster)."""
        return "redis://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes) + "/0"

    @property
    def port(self) -> int:
        return self.nodes[0].port

    def start(self, timeout: float = 30.0) -> LocalCluster:
        try:
            for node in self.nodes:
                node.start()
            clients = [redis.Redis(port=n.port, socket_timeout=5) for n in self.nodes]
            per_node = SLOTS // len(self.nodes)
            for i, client in enumerate(clients):
                last = SLOTS - 1 if i == len(clients) - 1 else (i + 1) * per_node - 1
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * per_node, last)
            for node in self.nodes[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
            self._wait_ok(clients, timeout)
            for client in clients:
                client.close()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ok(self, clients: list[redis.Redis], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            infos = [client.cluster("info") for client in clients]
            if all(info.get("cluster_state") == "ok"
                   and int(info.get("cluster_known_nodes", 0)) == len(clients) for info in infos):
                return
            if time.monotonic() > deadline:
                raise RedisServerError(f"the cluster on ports {[n.port for n in self.nodes]} is not ok "
                                       f"after {timeout:.0f} s: {infos}")
            time.sleep(0.05)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
