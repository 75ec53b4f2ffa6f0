"""docker-compose.yml and the Dockerfile agree with the CLI (parsed only: no Docker needed)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
import yaml

from inferq.cli import COMMANDS, build_parser
from inferq.shared.connections import parse as parse_redis_url
from inferq.shared.redis_server import default_server, free_port
from inferq.shared.settings import Settings
from tests.support.models import ROOT
from tests.support.waiting import wait_until

SUBCOMMANDS = ("up", "api", "worker", "webhooks", "submit", "models", "batch", "manifests")


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def _services() -> dict[str, dict[str, Any]]:
    services = _compose()["services"]
    assert isinstance(services, dict)
    return services


def _argv(command: str | list[str] | None) -> list[str]:
    if command is None:
        return []
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]


def _inferq_services() -> list[tuple[str, list[str]]]:
    return [(name, argv) for name, svc in _services().items() if (argv := _argv(svc.get("command")))[:1] == ["inferq"]]


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comments dropped and continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            out.append((instruction.upper(), rest.strip()))
    return out


def test_services_exist() -> None:
    assert {"redis", "api", "worker", "webhooks", "dashboard", "prometheus", "grafana"} <= set(_services())


def test_inferq_services_are_the_expected_ones() -> None:
    assert {name for name, _ in _inferq_services()} == {"api", "worker", "webhooks"}


@pytest.mark.parametrize("name", ["api", "worker", "webhooks"])
def test_inferq_commands_parse(name: str) -> None:
    argv = dict(_inferq_services())[name]
    parser = build_parser()
    assert argv[1] in COMMANDS, f"{name}: unknown subcommand {argv[1]!r}"
    try:
        args = parser.parse_args(argv[1:])
    except SystemExit as exc:  # argparse exits on a bad argument list
        pytest.fail(f"{name}: `{shlex.join(argv)}` does not parse (exit {exc.code})")
    assert args.command == argv[1]


def test_inferq_services_share_the_environment() -> None:
    services = _services()
    envs = [services[name]["environment"] for name, _ in _inferq_services()]
    assert all(env == envs[0] for env in envs)
    # The compose Redis unless the shell names another (the ha profile's sentinels).
    assert envs[0]["INFERQ_REDIS_URL"] == "${INFERQ_REDIS_URL:-redis://redis:6379/0}"
    assert "INFERQ_WEBHOOK_SECRET" in envs[0]
    settings = {f"INFERQ_{key.upper()}" for key in Settings.model_fields} | {"INFERQ_LOG_LEVEL"}
    assert set(envs[0]) <= settings | {"OTEL_EXPORTER_OTLP_ENDPOINT"}


def test_api_binds_all_interfaces_and_publishes_its_port() -> None:
    api = _services()["api"]
    args = build_parser().parse_args(_argv(api["command"])[1:])
    assert args.host == "0.0.0.0"
    assert f"{args.port}:{args.port}" in [str(p) for p in api["ports"]]
    assert "/healthz" in json.dumps(api["healthcheck"]["test"])
    assert api["depends_on"]["redis"]["condition"] == "service_healthy"


def test_redis_is_durable_and_never_evicts() -> None:
    redis = _services()["redis"]
    argv = _argv(redis["command"])
    assert argv[0] == "redis-server"
    options = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert options["--appendonly"] == "yes"
    assert options["--maxmemory-policy"] == "noeviction"
    assert options["--appendfsync"] == "everysec"
    assert any(str(v).endswith(":/data") for v in redis["volumes"])
    assert "ping" in _argv(redis["healthcheck"]["test"])
    assert set(_compose()["volumes"]) >= {v.split(":")[0] for v in redis["volumes"]}


def test_worker_reserves_an_nvidia_gpu() -> None:
    worker = _services()["worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    assert "cu" in worker["build"]["args"]["TORCH_INDEX_URL"]
    assert worker["depends_on"]["redis"]["condition"] == "service_healthy"


def test_dashboard_is_behind_a_profile_and_reads_json_jobs() -> None:
    dashboard = _services()["dashboard"]
    assert dashboard.get("profiles")
    env = dashboard["environment"]
    assert env["RQ_DASHBOARD_REDIS_URL"] == "redis://redis:6379/0"
    assert str(env["RQ_DASHBOARD_JSON"]).lower() == "true"


def test_dockerfile_installs_torch_before_the_project() -> None:
    instructions = _dockerfile_instructions()
    assert instructions[0][0] == "FROM" and instructions[0][1].startswith("python:3.11-slim")
    assert ("ARG", 'TORCH_SPEC="torch==2.13.0"') in instructions
    assert any(i == "ARG" and a.startswith("TORCH_INDEX_URL") for i, a in instructions)
    runs = [(n, a) for n, (i, a) in enumerate(instructions) if i == "RUN"]
    torch_at = next((n for n, a in runs if "pip install" in a and "$TORCH_SPEC" in a), None)
    # `pip install .`, `pip install ".[extra]"`, ...: the project from the build context.
    project = [(n, a) for n, a in runs if re.search(r"pip install\b.*\s[\"']?\.(\[[\w,-]*\])?[\"']?(\s|$)", a)]
    assert torch_at is not None and project, runs
    assert torch_at < project[0][0]
    # Runtime extras only (ONNX models are served from the image); never the dev or bench tools.
    extras = {e for _, a in project for e in re.findall(r"\.\[([\w,-]*)\]", a.split("&&")[0]) for e in e.split(",")}
    assert extras <= {"onnx"}, f"only runtime extras in the image, got {extras}"


def test_dockerfile_cmd_names_an_inferq_subcommand() -> None:
    instructions = _dockerfile_instructions()
    cmd = json.loads([a for i, a in instructions if i == "CMD"][-1])
    assert cmd[0] == "inferq" and cmd[1] in COMMANDS
    build_parser().parse_args(cmd[1:])
    assert ("ENV", "INFERQ_MODELS_DIR=/app/models") in instructions
    assert ("WORKDIR", "/app") in instructions
    users = [a for i, a in instructions if i == "USER"]
    assert users and users[-1] not in ("root", "0")


def test_cli_help_lists_every_subcommand() -> None:
    assert set(COMMANDS) == set(SUBCOMMANDS)
    result = subprocess.run(
        [sys.executable, "-m", "inferq", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    # argparse lists the subcommands as {up,api,...} in the usage line and again above their help.
    choices = re.search(r"\{([a-z,]+)\}", result.stdout)
    assert choices, result.stdout
    assert set(choices.group(1).split(",")) == set(SUBCOMMANDS)
    for name in SUBCOMMANDS:
        assert re.search(rf"^\s+{name}\s", result.stdout, re.MULTILINE), f"{name} has no help line"


# --- the ops profile: Prometheus scraping the API, Grafana with the inferq dashboard ---------------


def _ops_service(name: str) -> dict[str, Any]:
    service = _services()[name]
    assert service.get("profiles") == ["ops"], f"{name} runs only with --profile ops"
    return service


def _bind_mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> repository path, for the service's ./ bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target, *_ = str(volume).split(":")
        if source.startswith("./"):
            mounts[target] = source
    return mounts


def _container_ports(service: dict[str, Any]) -> set[int]:
    return {int(str(p).rsplit(":", 1)[-1]) for p in service.get("ports", [])}


def test_ops_profile_has_prometheus_and_grafana_on_pinned_images() -> None:
    ops = {name for name, svc in _services().items() if "ops" in svc.get("profiles", [])}
    assert {"dashboard", "prometheus", "grafana"} <= ops
    for name in ("prometheus", "grafana"):
        image = _ops_service(name)["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{name}: pin a version, not {image!r}"
        # No login on Prometheus, and Grafana's admin password defaults: localhost only.
        assert all(str(p).startswith("127.0.0.1:") for p in _ops_service(name)["ports"])
    assert set(_compose()["volumes"]) >= {"prometheus-data", "grafana-data"}


def test_ops_profile_has_jaeger_and_the_services_export_to_it_only_when_asked() -> None:
    jaeger = _ops_service("jaeger")
    repository, _, tag = jaeger["image"].rpartition(":")
    assert repository == "jaegertracing/jaeger" and re.fullmatch(r"2\.\d+\.\d+", tag), jaeger["image"]
    assert jaeger["ports"] == ["127.0.0.1:16686:16686"]  # the UI, localhost only; OTLP stays on the network
    env = _services()["api"]["environment"]
    # Off unless the shell sets the endpoint (an exporter with nothing to send to would only log failures).
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "${OTEL_EXPORTER_OTLP_ENDPOINT:-}"
    assert (
        "OTEL_EXPORTER_OTLP_ENDPOINT=http://jaeger:4318 docker compose --profile ops up"
        in (ROOT / "docker-compose.yml").read_text()
    )


def test_ops_bind_mounts_exist_in_the_repository() -> None:
    for name in ("prometheus", "grafana"):
        mounts = _bind_mounts(_ops_service(name))
        assert mounts, name
        for target, source in mounts.items():
            assert (ROOT / source).exists(), f"{name}: {source} (mounted on {target}) is not in the repository"
        binds = [str(v) for v in _ops_service(name)["volumes"] if str(v).startswith("./")]
        assert all(v.endswith(":ro") for v in binds), f"{name}: mount the repository's files read-only"


def _prometheus_config() -> tuple[dict[str, Any], dict[str, Any]]:
    prometheus = _ops_service("prometheus")
    flags = dict(str(arg).removeprefix("--").split("=", 1) for arg in prometheus["command"])
    source = _bind_mounts(prometheus)[flags["config.file"]]
    config = yaml.safe_load((ROOT / source).read_text())
    assert isinstance(config, dict)
    return prometheus, config


def test_prometheus_scrapes_the_api_service_on_its_port() -> None:
    _, config = _prometheus_config()
    (job,) = config["scrape_configs"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [target for group in job["static_configs"] for target in group["targets"]]
    api_port = build_parser().parse_args(_argv(_services()["api"]["command"])[1:]).port
    assert targets == [f"api:{api_port}"]
    assert "api" in _services()


def test_grafana_provisions_the_prometheus_service_and_the_dashboard() -> None:
    grafana = _ops_service("grafana")
    mounts = _bind_mounts(grafana)
    provisioning = ROOT / mounts["/etc/grafana/provisioning"]
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    url = source["url"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    assert url.rsplit(":", 1)[0] == "http://prometheus"
    assert int(url.rsplit(":", 1)[1]) in _container_ports(_ops_service("prometheus"))
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "inferq.yml").read_text())["providers"]
    folder = provider["options"]["path"]
    dashboards = ROOT / mounts[folder]
    assert json.loads((dashboards / "inferq.json").read_text())["uid"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(folder + "/") and (dashboards / home.removeprefix(folder + "/")).is_file()
    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true" and env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert "prometheus" in grafana["depends_on"]


def _sentinel_conf(service: dict[str, Any]) -> list[str]:
    """The lines a sentinel service's command writes to its config file."""
    script = _argv(service["command"])[2]
    printed = script.split(" > ", 1)[0].removeprefix("printf '%s\\n' ")
    return shlex.split(printed)


def test_ha_profile_is_a_primary_a_replica_and_three_sentinels_the_documented_url_names() -> None:
    services = _services()
    ha = sorted(name for name, svc in services.items() if "ha" in svc.get("profiles", []))
    assert ha == ["redis-replica", "sentinel-1", "sentinel-2", "sentinel-3"]
    replica = _argv(services["redis-replica"]["command"])
    assert replica[replica.index("--replicaof") + 1 : replica.index("--replicaof") + 3] == ["redis", "6379"]
    assert replica[replica.index("--maxmemory-policy") + 1] == "noeviction"
    header = (ROOT / "docker-compose.yml").read_text().split("\nname:", 1)[0]
    url = re.search(r"INFERQ_REDIS_URL=(\S+)", header)
    assert url is not None
    target = parse_redis_url(url.group(1))
    assert target.service == "inferq"
    assert sorted(target.sentinels) == [(f"sentinel-{n}", 26379) for n in (1, 2, 3)]
    for n in (1, 2, 3):
        conf = _sentinel_conf(services[f"sentinel-{n}"])
        assert "sentinel monitor inferq redis 6379 2" in conf and "port 26379" in conf


def test_the_sentinel_config_starts_a_real_sentinel(tmp_path: Path) -> None:
    """The lines compose writes, with the primary's name pointed at loopback, run in this machine's redis-server."""
    port = free_port()
    conf = [
        line.replace("inferq redis 6379", "inferq 127.0.0.1 6399").replace("port 26379", f"port {port}")
        for line in _sentinel_conf(_services()["sentinel-1"])
    ]
    (tmp_path / "sentinel.conf").write_text("\n".join(conf) + "\n")
    proc = subprocess.Popen(
        [default_server(), str(tmp_path / "sentinel.conf"), "--sentinel"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        client = redis_py.Redis(port=port, socket_timeout=2)
        wait_until(lambda: _answers(client), 15, "the sentinel")
        master = client.execute_command("SENTINEL", "MASTER", "inferq")
        fields = dict(zip(master[::2], master[1::2], strict=True))
        assert fields[b"quorum"] == b"2" and fields[b"down-after-milliseconds"] == b"5000"
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()


def _answers(client: redis_py.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis_py.RedisError:
        return False
