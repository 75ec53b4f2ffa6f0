"""A Redis Sentinel group on this machine: a primary, replicas and sentinels, all real redis-server processes
(``redis-server <conf> --sentinel`` from the same binary), on free loopback ports."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from types import TracebackType

import redis as redis_py

from inferq.shared.redis_server import RedisServer, default_server, die_with_parent, free_port
from tests.support.waiting import wait_until

SERVICE = "inferq"


class Sentinel:
    """One sentinel process watching ``SERVICE``."""

    def __init__(self, folder: Path, primary_port: int, quorum: int, down_after_ms: int, failover_timeout_ms: int):
        self.folder = folder
        self.port = free_port()
        folder.mkdir(parents=True, exist_ok=True)
        # Sentinel rewrites its config file as it learns the group: it must be its own, writable file.
        (folder / "sentinel.conf").write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {folder}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} {quorum}\n"
            f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}\n"
            f"sentinel failover-timeout {SERVICE} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with (self.folder / "sentinel.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [default_server(), str(self.folder / "sentinel.conf"), "--sentinel"],
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )
        wait_until(self._answers, 15, f"sentinel on port {self.port}")

    def _answers(self) -> bool:
        try:
            with redis_py.Redis(port=self.port, socket_timeout=1) as client:
                return bool(client.ping())
        except redis_py.RedisError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class SentinelGroup:
    """A primary with ``replicas`` replicas, watched by ``sentinels`` sentinels (quorum: a majority)."""

    def __init__(
        self,
        root: Path,
        replicas: int = 2,
        sentinels: int = 3,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 4000,
        appendonly: bool = True,
    ) -> None:
        self.root = root
        self.servers = [RedisServer(root / "redis-0", appendonly=appendonly)]
        self.replica_count = replicas
        self.appendonly = appendonly
        self.sentinel_count = sentinels
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.sentinels: list[Sentinel] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def __enter__(self) -> SentinelGroup:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        primary = self.servers[0]
        primary.start()
        for n in range(1, self.replica_count + 1):
            replica = RedisServer(
                self.root / f"redis-{n}",
                appendonly=self.appendonly,
                options=("--replicaof", "127.0.0.1", str(primary.port)),
            )
            replica.start()
            self.servers.append(replica)
        wait_until(lambda: self._synced_replicas(primary) == self.replica_count, 30, "the replicas to sync")
        quorum = self.sentinel_count // 2 + 1
        for n in range(self.sentinel_count):
            sentinel = Sentinel(
                self.root / f"sentinel-{n}", primary.port, quorum, self.down_after_ms, self.failover_timeout_ms
            )
            sentinel.start()
            self.sentinels.append(sentinel)
        wait_until(self._all_known, 30, "the sentinels to see every replica and each other")

    def _synced_replicas(self, server: RedisServer) -> int:
        """Replicas whose first full sync is done (state ``online``). A replica is counted as connected as soon as it
        asks for a sync, and the primary waits (repl-diskless-sync-delay, 5 s) before it sends one: a failover
        before then promoted an empty replica, and every job and worker of the test was gone."""
        try:
            with redis_py.Redis(port=server.port, socket_timeout=1) as client:
                info = client.info("replication")
        except redis_py.RedisError:
            return -1
        links = [info[f"slave{n}"] for n in range(int(info.get("connected_slaves", 0)))]
        return sum(1 for link in links if isinstance(link, dict) and link.get("state") == "online")

    def _all_known(self) -> bool:
        for sentinel in self.sentinels:
            with redis_py.Redis(port=sentinel.port, socket_timeout=1) as client:
                master = client.execute_command("SENTINEL", "MASTER", SERVICE)
                fields = dict(zip(master[::2], master[1::2], strict=True))
                if int(fields[b"num-slaves"]) < self.replica_count:
                    return False
                if int(fields[b"num-other-sentinels"]) < self.sentinel_count - 1:
                    return False
        return True

    def primary_port(self) -> int:
        """The primary's port as the first answering sentinel tells it."""
        for sentinel in self.sentinels:
            try:
                with redis_py.Redis(port=sentinel.port, socket_timeout=1) as client:
                    _, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
                    return int(port)
            except redis_py.RedisError:
                continue
        raise AssertionError("no sentinel answers")

    def server_on(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def kill_primary(self) -> int:
        """SIGKILL the primary's process (no AOF flush, no goodbye); its old port."""
        port = self.primary_port()
        server = self.server_on(port)
        assert server.pid is not None
        server._kill()
        return port

    def _ports_told(self) -> set[int]:
        """The primary's port as each answering sentinel tells it (one sentinel leads a failover; the others learn of
        it over their hello channel a moment later)."""
        told = set()
        for sentinel in self.sentinels:
            try:
                with redis_py.Redis(port=sentinel.port, socket_timeout=1) as client:
                    _, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
                    told.add(int(port))
            except redis_py.RedisError:
                continue
        return told

    def wait_for_new_primary(self, old_port: int, timeout_s: float = 60) -> int:
        """Until every answering sentinel names the same new primary, it accepts writes, and the old primary no
        longer does (demoted, or gone); the new one's port. Waiting for the first sentinel only let a client that
        asked another one still be sent to the old primary; and until the old primary is demoted, a client still
        connected to it writes there, and what it writes is lost when it resyncs from the new one (Redis's
        replication is asynchronous: a loaded machine widened that window until a test's job was lost in it)."""

        def promoted() -> bool:
            told = self._ports_told()
            if len(told) != 1 or old_port in told:
                return False
            (port,) = told
            try:
                with redis_py.Redis(port=port, socket_timeout=1) as client:
                    if client.info("replication")["role"] != "master":
                        return False
            except redis_py.RedisError:
                return False
            try:
                with redis_py.Redis(port=old_port, socket_timeout=1) as old:
                    return bool(old.info("replication")["role"] != "master")
            except redis_py.RedisError:
                return True  # killed, frozen or unreachable: it takes no writes

        wait_until(promoted, timeout_s, "a failover")
        return self.primary_port()

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers:
            server.stop(timeout_s=5)
