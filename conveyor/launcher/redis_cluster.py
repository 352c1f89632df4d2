"""A Redis Cluster on loopback from the embedded valkey-server, with no external tool: N primaries
(`--cluster-enabled yes`), each given a contiguous range of the 16384 hash slots
(`CLUSTER ADDSLOTSRANGE`), introduced to each other (`CLUSTER MEET`), and `replicas` replicas per
primary (`CLUSTER REPLICATE`); ready once every node reports `cluster_state:ok`, knows all the
others, and every replica is in sync with its primary. For tests and benchmarks, with what a fault
test needs: kill a node (SIGKILL), restart it on its port from its own directory (its `nodes.conf`
brings it back into the cluster), a manual `CLUSTER FAILOVER`, and waiting for `cluster_state:ok`.

Without replicas a node that dies takes its slots with it until it is back. With them, its replica
is promoted once the others have not heard from it for `node_timeout_ms` (then marked FAIL, then a
replica's election, about a second more).
"""

from __future__ import annotations

import random
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import redis

from conveyor.launcher.redis_server import EmbeddedRedis, RedisServerError

SLOTS = 16384
BUS_OFFSET = 10_000  # a node's cluster bus listens on its port + 10000
# Long enough that a node on a loaded test machine is not failed over for a slow ping, short enough
# that a test's failover takes a few seconds, not Redis's default 15.
NODE_TIMEOUT_MS = 3000


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


def client_port(node: EmbeddedRedis) -> int:
    """The port a node gives clients in CLUSTER SLOTS and MOVED: its `--cluster-announce-port` (a
    front such as the tests' TLS proxy), else its own."""
    args = list(node.extra_args)
    if "--cluster-announce-port" in args:
        return int(args[args.index("--cluster-announce-port") + 1])
    return node.port


class LocalCluster:
    def __init__(self, data_dir: Path, nodes: int = 3, appendfsync: str = "everysec", replicas: int = 0,
                 node_timeout_ms: int = NODE_TIMEOUT_MS) -> None:
        self.data_dir = Path(data_dir)
        self.primaries = nodes  # at the start; a failover changes which node is one
        self.replicas = replicas  # per primary
        self.nodes = [
            EmbeddedRedis(self.data_dir / f"node{i}", port=cluster_port(), appendfsync=appendfsync,
                          extra_args=(
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(node_timeout_ms),
                # Conveyor's keys of one job live in one slot, its queues in others: a partial cluster
                # would serve half a request.
                "--cluster-require-full-coverage", "yes",
            ))
            for i in range(nodes * (1 + replicas))
        ]

    @property
    def url(self) -> str:
        """Every node as a startup node (the form REDIS_URL takes for a cluster)."""
        return "redis://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes) + "/0"

    @property
    def port(self) -> int:
        return self.nodes[0].port

    def start(self, timeout: float = 60.0) -> LocalCluster:
        try:
            for node in self.nodes:
                node.start()
            primaries = [self.client(n) for n in self.nodes[:self.primaries]]
            per_node = SLOTS // self.primaries
            for i, client in enumerate(primaries):
                last = SLOTS - 1 if i == self.primaries - 1 else (i + 1) * per_node - 1
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * per_node, last)
            for node in self.nodes[1:]:
                primaries[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
            self._until(lambda: all(int(i.get("cluster_known_nodes", 0)) == len(self.nodes)
                                    for i in self._infos()), "every node knows the others", timeout)
            for i, node in enumerate(self.nodes[self.primaries:]):
                primary_id = primaries[i % self.primaries].execute_command("CLUSTER", "MYID")
                with self.client(node) as replica:
                    replica.execute_command("CLUSTER", "REPLICATE", primary_id)
            for client in primaries:
                client.close()
            self.wait_ok(timeout)
            self.wait_in_sync(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def client(self, node: EmbeddedRedis) -> redis.Redis:
        """A plain client of one node (not routed: the node answers for itself)."""
        return redis.Redis(port=node.port, socket_timeout=5, decode_responses=True)

    def live(self) -> list[EmbeddedRedis]:
        return [n for n in self.nodes if n.process is not None and n.process.poll() is None]

    def role(self, node: EmbeddedRedis) -> str:
        """`master` or `slave`, as the node says of itself."""
        with self.client(node) as client:
            return str(client.info("replication")["role"])

    def primary_nodes(self) -> list[EmbeddedRedis]:
        return [n for n in self.live() if self.role(n) == "master"]

    def owner_of(self, key: str) -> EmbeddedRedis:
        """The primary that serves `key`'s slot, as the first live node sees it."""
        with self.client(self.live()[0]) as client:
            slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
        port = next(p for first, last, p in self._slot_owners(self.live()[0]) if first <= slot <= last)
        return next(n for n in self.nodes if client_port(n) == port)

    def replica_of(self, primary: EmbeddedRedis) -> EmbeddedRedis:
        """A live replica of `primary` (the one a failover promotes)."""
        for node in self.live():
            if node is not primary:
                with self.client(node) as client:
                    info = client.info("replication")
                if info["role"] == "slave" and int(info["master_port"]) == primary.port:
                    return node
        raise RedisServerError(f"the primary on port {primary.port} has no live replica")

    def kill(self, node: EmbeddedRedis) -> None:
        """SIGKILL: no goodbye to its clients or its peers."""
        if node.process is not None:
            node.process.send_signal(signal.SIGKILL)
            node.process.wait(10)

    def restart(self, node: EmbeddedRedis) -> EmbeddedRedis:
        """The node again, on its port and from its directory (AOF and nodes.conf), as a supervisor
        would restart it; it rejoins as whatever the cluster made of it meanwhile."""
        fresh = EmbeddedRedis(node.data_dir, port=node.port, appendfsync=node.appendfsync,
                              extra_args=node.extra_args).start()
        self.nodes[self.nodes.index(node)] = fresh
        return fresh

    def failover(self, replica: EmbeddedRedis, timeout: float = 30.0) -> None:
        """A manual `CLUSTER FAILOVER` on `replica`: it catches up with its primary, which stops
        taking writes, then takes over its slots; returns once it says it is the primary."""
        with self.client(replica) as client:
            client.execute_command("CLUSTER", "FAILOVER")
        self._until(lambda: self.role(replica) == "master", f"port {replica.port} promoted", timeout)

    def wait_ok(self, timeout: float = 60.0) -> None:
        """Until every live node reports `cluster_state:ok`, they agree on which primary serves
        each slot (a failover has spread to every node) and each such primary is alive."""
        def ok() -> bool:
            if not all(i.get("cluster_state") == "ok" for i in self._infos()):
                return False
            views = {self._slot_owners(n) for n in self.live()}
            live = {client_port(n) for n in self.live()}
            return len(views) == 1 and all(port in live for _f, _l, port in views.pop())
        self._until(ok, "cluster_state:ok on every live node, one view of the slots, each slot's "
                    "primary alive", timeout)

    def _slot_owners(self, node: EmbeddedRedis) -> frozenset[tuple[int, int, int]]:
        """(first slot, last slot, primary's port) as `node` sees them."""
        with self.client(node) as client:
            try:
                ranges = client.execute_command("CLUSTER", "SLOTS")
            except (redis.RedisError, OSError):
                return frozenset()
        return frozenset((int(r[0]), int(r[1]), int(r[2][1])) for r in ranges)

    def wait_in_sync(self, timeout: float = 60.0) -> None:
        """Until every live replica's link to its primary is up and its first sync is done."""
        self._until(self._in_sync, "every replica in sync with its primary", timeout)

    def _infos(self) -> list[dict[str, str]]:
        out = []
        for node in self.live():
            with self.client(node) as client:
                try:
                    out.append(client.cluster("info"))
                except (redis.RedisError, OSError):  # loading, or not answering yet
                    out.append({})
        return out

    def _in_sync(self) -> bool:
        for node in self.live():
            with self.client(node) as client:
                info = client.info("replication")
            if info["role"] == "slave" and (info.get("master_link_status") != "up"
                                            or int(info.get("master_sync_in_progress", 0))):
                return False
        return True

    def _until(self, condition: Callable[[], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise RedisServerError(f"the cluster on ports {[n.port for n in self.nodes]}: not "
                                       f"{what} after {timeout:.0f} s: {self._infos()}")
            time.sleep(0.05)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
