"""deploy/: the Kubernetes manifests, the KEDA autoscaling and the Grafana dashboard, checked offline.

No cluster, no Docker and no Grafana run here. The manifests are validated against the Kubernetes
OpenAPI schemas that ``kubernetes-validate`` bundles, the ScaledObjects against KEDA's own CRD
schema (vendored in deploy/schemas/keda/), and their contents against what inferq really has: its
queue keys (``shared.lifecycle.layout``), its settings, its CLI and its API's routes. The dashboard's
PromQL is parsed with ``promql-parser`` and its metric names compared to the agreed list.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import promql_parser
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from inferq import manifests
from inferq.api.app import create_app
from inferq.cli import build_parser
from inferq.shared import keys
from inferq.shared.errors import AppError
from inferq.shared.lifecycle import layout
from inferq.shared.settings import PREFIX, Settings, unknown_variables
from tests.support.manifests import K8S, documents, kustomization, objects, of_kind, scaled_object_for, scaled_objects
from tests.support.models import ROOT

KEDA_CRD = ROOT / "deploy" / "schemas" / "keda" / "keda.sh_scaledobjects.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "inferq.json"
MODELS = sorted(path.parent.name for path in (ROOT / "models").glob("*/config.json"))
# An older Kubernetes minor and the newest one kubernetes-validate bundles.
KUBERNETES_VERSIONS = ("1.30", latest_version())
NAMESPACE = "inferq"

# The metric families the API's GET /metrics exposes, as agreed with the metrics work (issue 12).
AGREED_METRICS = {
    "inferq_queue_depth": "gauge",
    "inferq_version_rolled_back": "gauge",
    "inferq_model_unavailable": "gauge",
    "inferq_queue_oldest_age_seconds": "gauge",
    "inferq_jobs_ended_total": "counter",
    "inferq_job_failures_total": "counter",
    "inferq_job_queued_seconds": "histogram",
    "inferq_job_inference_seconds": "histogram",
    "inferq_job_end_to_end_seconds": "histogram",
    "inferq_batch_size": "histogram",
    "inferq_batch_tokens_total": "counter",
    "inferq_batch_padded_tokens_total": "counter",
    "inferq_workers": "gauge",
    "inferq_webhook_deliveries_total": "counter",
    "inferq_webhook_delivery_seconds": "histogram",
    "inferq_http_requests_total": "counter",
    "inferq_http_request_seconds": "histogram",
}
# The names KEDA v2.20.2's Redis scaler reads from a trigger's metadata (pkg/scalers/redis_scaler.go,
# its `keda:"name=..."` tags; `*FromEnv` variants read the target container's environment).
REDIS_SCALER_METADATA = {
    "address", "addresses", "host", "hosts", "port", "ports", "username", "password",
    "sentinelUsername", "sentinelPassword", "sentinelMaster", "unsafeSsl", "enableTLS",
    "listName", "listLength", "activationListLength", "databaseIndex",
}  # fmt: skip
REDIS_SCALER_METADATA |= {f"{name}FromEnv" for name in REDIS_SCALER_METADATA}
# Grafana's own variables, given a duration so that the expressions parse as PromQL.
GRAFANA_DURATIONS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}


def exposed_metric_names() -> set[str]:
    """Every series name GET /metrics carries, read from inferq's own exposition of a cluster where every kind of
    count is present (a failure, a webhook delivery, an API request, a queue, workers): the collector the API serves.
    """
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from inferq.shared import metrics

    totals: metrics.Increments = {}
    metrics.job_increments(totals, "failed", 0.2, 0.03, 0.25, reason="ModelError")
    totals |= metrics.batch_increments(3, tokens=40, padded_tokens=54)  # a sequence model's batch: its token counts
    http = metrics.RequestCounts()
    http.add("/v1/jobs/{job_id}", "GET", 200, 0.004)
    hooks: metrics.Increments = {}
    metrics.count(hooks, "outcome", "delivered")
    metrics.observe(hooks, metrics.WEBHOOK_HISTOGRAM, 0.05, metrics.TIME_BUCKETS_S)
    model = metrics.ModelState(totals=totals, depth={"interactive": 2, "bulk": 1}, oldest_age_s={"interactive": 1.5})
    cluster = metrics.Cluster({"digits": model}, metrics.decode(hooks), http.drain())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.ClusterCollector(lambda: cluster))
    families = text_string_to_metric_families(generate_latest(registry).decode())
    names = {sample.name for family in families for sample in family.samples}
    assert {name for name in names if not name.startswith("inferq_")} == set()
    return names


# --- loading -------------------------------------------------------------------------------------


def _object_id(item: tuple[str, dict[str, Any]]) -> str:
    name, doc = item
    return f"{name}:{doc['kind']}/{doc['metadata']['name']}"


def _find(kind: str, name: str) -> dict[str, Any]:
    found = [doc for _, doc in objects() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def _containers() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) for every container of every Deployment and StatefulSet."""
    for doc in of_kind("Deployment") + of_kind("StatefulSet"):
        for container in doc["spec"]["template"]["spec"]["containers"]:
            yield doc, container


def _inferq_containers() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(doc, c) for doc, c in _containers() if c.get("command", [])[:1] == ["inferq"]]


def _settings_map() -> dict[str, str]:
    """The environment an inferq container gets: the ConfigMap and the Secret it reads."""
    env = dict(_find("ConfigMap", "inferq-settings")["data"])
    env.update(_find("Secret", "inferq-secrets")["stringData"])
    return env


def _strict(schema: Any) -> Any:
    """The schema with unknown fields refused where it lists properties, as `kubectl apply` refuses them."""
    if isinstance(schema, dict):
        out = {key: _strict(value) for key, value in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


def _keda_validator() -> jsonschema.Draft202012Validator:
    (crd,) = documents(KEDA_CRD)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = _strict(version["schema"]["openAPIV3Schema"])
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


# --- the set of manifests ------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (its built-in kustomize) is not installed")
def test_kustomize_renders_the_manifests_with_the_registry_images() -> None:
    result = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    rendered = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert sorted(_object_id(("", d)) for d in rendered) == sorted(_object_id(("", d)) for _, d in objects())
    images = {image["name"]: f"{image['newName']}:{image['newTag']}" for image in kustomization()["images"]}
    for doc in rendered:
        if doc["kind"] == "Deployment":
            for container in doc["spec"]["template"]["spec"]["containers"]:
                assert container["image"] in images.values(), container["image"]


def test_kustomization_applies_every_manifest() -> None:
    files = {path.name for path in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert files, "no manifests"
    assert sorted(kustomization()["resources"]) == sorted(files)
    assert kustomization()["kind"] == "Kustomization"


def test_every_object_is_in_the_namespace() -> None:
    (namespace,) = of_kind("Namespace")
    assert namespace["metadata"]["name"] == NAMESPACE
    for _, doc in objects():
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == NAMESPACE, doc["metadata"]["name"]


def test_the_expected_objects_ship() -> None:
    kinds = {(doc["kind"], doc["metadata"]["name"]) for _, doc in objects()}
    expected = {
        ("Deployment", "api"),
        ("Service", "api"),
        ("Deployment", "webhooks"),
        ("StatefulSet", "redis"),
        ("Service", "redis"),
        ("ConfigMap", "inferq-settings"),
        ("Secret", "inferq-secrets"),
    }
    expected |= {("Deployment", f"worker-{model}") for model in MODELS}
    assert expected <= kinds
    assert len(scaled_objects()) == len(MODELS)


# --- schemas -------------------------------------------------------------------------------------

KUBERNETES_OBJECTS = [item for item in objects() if item[1]["kind"] != "ScaledObject"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("item", KUBERNETES_OBJECTS, ids=[_object_id(item) for item in KUBERNETES_OBJECTS])
def test_manifest_validates_against_the_kubernetes_schema(item: tuple[str, dict[str, Any]], version: str) -> None:
    # strict: a field the schema does not know (a typo) is an error, not silently dropped.
    validated = kubernetes_validate.validate(item[1], version, strict=True)
    assert validated == ".".join(version.split(".")[:2])


def test_the_kubernetes_schema_check_catches_mistakes() -> None:
    deployment = _find("Deployment", "api")
    kubernetes_validate.validate(deployment, latest_version(), strict=True)
    typo = copy.deepcopy(deployment)
    typo["spec"]["replica"] = typo["spec"].pop("replicas")
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "eight thousand"
    for bad in (typo, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, latest_version(), strict=True)


def test_the_vendored_keda_crd_is_the_published_one() -> None:
    source = (KEDA_CRD.parent / "SOURCE.md").read_text()
    digest = re.search(r"sha256: ([0-9a-f]{64})", source)
    assert digest and hashlib.sha256(KEDA_CRD.read_bytes()).hexdigest() == digest.group(1)
    assert "v2.20.2" in source
    (crd,) = documents(KEDA_CRD)
    assert crd["metadata"]["name"] == "scaledobjects.keda.sh"
    assert crd["spec"]["names"]["kind"] == "ScaledObject"


@pytest.mark.parametrize("model", MODELS)
def test_scaled_object_validates_against_the_keda_crd(model: str) -> None:
    scaled = scaled_object_for(model)
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in _keda_validator().iter_errors(scaled)]
    assert errors == []


def test_the_keda_schema_check_catches_mistakes() -> None:
    validator = _keda_validator()
    good = scaled_object_for(MODELS[0])
    assert validator.is_valid(good)
    typo = copy.deepcopy(good)
    typo["spec"]["minReplicas"] = typo["spec"].pop("minReplicaCount")
    number = copy.deepcopy(good)
    number["spec"]["triggers"][0]["metadata"]["listLength"] = 64  # trigger metadata is a map of strings
    no_type = copy.deepcopy(good)
    del no_type["spec"]["triggers"][0]["type"]
    for bad in (typo, number, no_type):
        assert not validator.is_valid(bad)


# --- autoscaling ---------------------------------------------------------------------------------


def _model_config(model: str) -> dict[str, Any]:
    config = json.loads((ROOT / "models" / model / "config.json").read_text())
    assert isinstance(config, dict)
    return config


@pytest.mark.parametrize("model", MODELS)
def test_each_model_has_a_worker_deployment_serving_it(model: str) -> None:
    deployment = _find("Deployment", f"worker-{model}")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["command"][1:])
    assert args.command == "worker"
    assert args.model == [model]
    # KEDA owns the replica count; an apply that set one would fight it.
    assert "replicas" not in deployment["spec"]


@pytest.mark.parametrize("model", MODELS)
def test_scaled_object_scales_the_models_worker_on_both_lanes(model: str) -> None:
    scaled = scaled_object_for(model)
    spec = scaled["spec"]
    target = spec["scaleTargetRef"]
    assert target["name"] == f"worker-{model}"
    assert target.get("kind", "Deployment") == "Deployment"
    assert _find("Deployment", target["name"])  # the target exists
    # Down to zero workers when nothing waits, and back up when a job arrives.
    assert spec["minReplicaCount"] == 0
    assert spec["maxReplicaCount"] >= 1
    assert 1 <= spec["pollingInterval"] <= 30
    assert spec["cooldownPeriod"] >= 60
    triggers = spec["triggers"]
    assert {t["type"] for t in triggers} == {"redis"}
    lists = {t["name"]: t["metadata"]["listName"] for t in triggers}
    # Per lane: the jobs waiting (RQ's queue list, and past its window its fair backlog) and the jobs taken by a
    # worker (its started registry, which holds a worker up while a batch runs and brings one back for a dead
    # worker's batch).
    expected = {}
    for lane in keys.LANES:
        queue = layout.queue_keys(keys.queue_name(model, lane))
        expected |= {lane: queue.queue, f"{lane}-started": queue.started, f"{lane}-backlog": queue.fair_backlog}
    assert lists == expected
    for trigger in triggers:
        metadata = trigger["metadata"]
        assert set(metadata) <= REDIS_SCALER_METADATA
        assert metadata["activationListLength"] == "0"  # one waiting job wakes a worker
        assert int(metadata["listLength"]) >= 1
    by_lane = {t["name"]: t["metadata"] for t in triggers}
    # One worker per full batch of waiting single jobs.
    assert int(by_lane[keys.INTERACTIVE]["listLength"]) == _model_config(model)["max_batch"]


def test_the_scaler_keys_are_rq_keys() -> None:
    # What KEDA counts: RQ's list of waiting job ids (LLEN) and its started registry (a sorted set, ZCARD).
    interactive = layout.queue_keys(keys.queue_name("digits", keys.INTERACTIVE))
    bulk = layout.queue_keys(keys.queue_name("digits", keys.BULK))
    assert (interactive.queue, bulk.queue) == ("rq:queue:inferq.digits", "rq:queue:inferq.digits.bulk")
    assert (interactive.started, bulk.started) == ("rq:wip:inferq.digits", "rq:wip:inferq.digits.bulk")


def test_keda_reaches_the_redis_the_pods_use() -> None:
    service = _find("Service", "redis")
    (port,) = service["spec"]["ports"]
    url = urlsplit(_settings_map()["INFERQ_REDIS_URL"])
    assert url.hostname == service["metadata"]["name"] and url.port == port["port"]
    database = url.path.lstrip("/") or "0"
    # KEDA's operator runs in its own namespace: the address must be the Service's full name.
    address = f"{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local:{port['port']}"
    for scaled in scaled_objects():
        for trigger in scaled["spec"]["triggers"]:
            assert trigger["metadata"]["address"] == address
            assert trigger["metadata"]["databaseIndex"] == database
    statefulset = _find("StatefulSet", "redis")
    assert statefulset["spec"]["template"]["metadata"]["labels"].items() >= service["spec"]["selector"].items()


@pytest.mark.parametrize("model", MODELS)
def test_workers_request_a_gpu_and_finish_their_batch_on_stop(model: str) -> None:
    pod = _find("Deployment", f"worker-{model}")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    resources = container["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 1
    assert resources["requests"]["nvidia.com/gpu"] == 1
    assert build_parser().parse_args(container["command"][1:]).device == "auto"
    # SIGTERM lets a batch finish: the pod's grace must outlast a batch's timeout.
    assert pod["terminationGracePeriodSeconds"] > int(_settings_map()["INFERQ_JOB_TIMEOUT_S"])


# --- what the manifests say about inferq ---------------------------------------------------------


def test_inferq_commands_parse() -> None:
    containers = _inferq_containers()
    commands = {c["command"][1] for _, c in containers}
    assert commands == {"api", "worker", "webhooks"}
    for doc, container in containers:
        try:
            build_parser().parse_args(container["command"][1:])
        except SystemExit:
            pytest.fail(f"{doc['metadata']['name']}: {container['command']} does not parse")


def test_api_probes_and_service_point_at_real_routes() -> None:
    app = create_app(Settings(redis_url="redis://unused.invalid:6379/0", models_dir=ROOT / "models"))
    # The OpenAPI document lists every route the routers declare, with its methods.
    routes = {path for path, operations in app.openapi()["paths"].items() if "get" in operations}
    deployment = _find("Deployment", "api")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    readiness = container["readinessProbe"]["httpGet"]
    liveness = container["livenessProbe"]["httpGet"]
    assert readiness["path"] == "/readyz" and liveness["path"] == "/healthz"
    assert {readiness["path"], liveness["path"]} <= routes
    args = build_parser().parse_args(container["command"][1:])
    assert args.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports[readiness["port"]] == ports[liveness["port"]] == args.port
    service = _find("Service", "api")
    (service_port,) = service["spec"]["ports"]
    assert ports[service_port["targetPort"]] == args.port
    assert deployment["spec"]["template"]["metadata"]["labels"].items() >= service["spec"]["selector"].items()
    # GET /metrics comes with the metrics work (issue 12); until it merges the path is only agreed.
    assert service["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"


def test_the_environment_names_are_inferq_settings() -> None:
    names: set[str] = set(_settings_map())
    for _, container in _containers():
        names |= {item["name"] for item in container.get("env", [])}
    inferq_names = {name for name in names if name.startswith(PREFIX)}
    assert inferq_names
    assert unknown_variables(dict.fromkeys(inferq_names, "")) == {}


def test_the_settings_load(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(PREFIX):
            monkeypatch.delenv(name)
    for name, value in _settings_map().items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.redis_url == _settings_map()["INFERQ_REDIS_URL"]
    # The Dockerfile bakes the models in here.
    assert settings.models_dir == Path("/app/models")
    assert "ENV INFERQ_MODELS_DIR=/app/models" in (ROOT / "Dockerfile").read_text()


def test_every_inferq_container_reads_the_settings_and_runs_unprivileged() -> None:
    for doc, container in _inferq_containers():
        sources = container["envFrom"]
        assert {"configMapRef": {"name": "inferq-settings"}} in sources, doc["metadata"]["name"]
        assert {"secretRef": {"name": "inferq-secrets"}} in sources, doc["metadata"]["name"]
        security = doc["spec"]["template"]["spec"]["securityContext"]
        assert security["runAsNonRoot"] is True and security["runAsUser"] == 10001  # the Dockerfile's user
        assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_images_are_named_in_the_kustomization_or_pinned() -> None:
    named = {image["name"]: image for image in kustomization()["images"]}
    for _, container in _inferq_containers():
        assert container["image"] in named, container["image"]
        assert named[container["image"]]["newTag"]
    others = [c["image"] for _, c in _containers() if c.get("command", [])[:1] != ["inferq"]]
    assert others
    for image in others:
        assert ":" in image and not image.endswith(":latest"), image


def test_redis_is_durable_and_never_evicts() -> None:
    statefulset = _find("StatefulSet", "redis")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    options = dict(zip(args[0::2], args[1::2], strict=True))
    assert options["--appendonly"] == "yes"
    assert options["--maxmemory-policy"] == "noeviction"
    assert options["--appendfsync"] == "everysec"
    (mount,) = container["volumeMounts"]
    assert mount["mountPath"] == "/data"
    assert mount["name"] in {t["metadata"]["name"] for t in statefulset["spec"]["volumeClaimTemplates"]}


# --- Grafana -------------------------------------------------------------------------------------


def _dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # a collapsed row holds its panels
    return out


def _expressions(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for panel in _panels(dashboard) for t in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression (or a Grafana label_values query) selects."""
    label_values = re.fullmatch(r"label_values\(\s*(.+?)\s*,\s*\w+\s*\)", expr.strip())
    if label_values:
        expr = label_values.group(1)
    for variable, duration in GRAFANA_DURATIONS.items():
        expr = expr.replace(variable, duration)
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"a selector without a metric name in {expr!r}"
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def test_promql_metric_names_reads_selectors_only() -> None:
    expr = 'histogram_quantile(0.95, max by (model, le) (rate(a_bucket{model=~"$model"}[$__rate_interval]))) / b'
    assert promql_metric_names(expr) == {"a_bucket", "b"}
    assert promql_metric_names("label_values(inferq_queue_depth, model)") == {"inferq_queue_depth"}
    with pytest.raises(ValueError):
        promql_metric_names("rate(a[5m]")


def test_dashboard_uses_only_the_agreed_metrics() -> None:
    exprs = _expressions(_dashboard())
    assert exprs
    used = set().union(*(promql_metric_names(expr) for expr in exprs))
    assert used <= exposed_metric_names(), sorted(used - exposed_metric_names())


def test_dashboard_shows_every_agreed_metric() -> None:
    exposed = exposed_metric_names()
    families = {name.removesuffix("_bucket") for name in exposed if not name.endswith(("_sum", "_count"))}
    assert families == set(AGREED_METRICS)  # the exposition has exactly the agreed families
    used = set().union(*(promql_metric_names(expr) for expr in _expressions(_dashboard())))
    for family, kind in AGREED_METRICS.items():
        wanted = f"{family}_bucket" if kind == "histogram" else family
        assert wanted in used, f"no panel shows {family}"
    # Mean batch size is sum / count.
    assert {"inferq_batch_size_sum", "inferq_batch_size_count"} <= used


def test_dashboard_latency_panels_are_quantiles_over_bucket_rates() -> None:
    exprs = _expressions(_dashboard())
    for family in ("inferq_job_queued_seconds", "inferq_job_inference_seconds", "inferq_job_end_to_end_seconds"):
        quantiles = {
            float(m.group(1))
            for expr in exprs
            if f"{family}_bucket" in expr
            for m in [re.match(r"histogram_quantile\(([\d.]+),", expr)]
            if m and "rate(" in expr and " le)" in expr
        }
        assert quantiles == {0.5, 0.95}, family


def test_dashboard_filters_by_a_model_variable() -> None:
    dashboard = _dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    model = variables["model"]
    query = model["query"]["query"] if isinstance(model["query"], dict) else model["query"]
    assert re.fullmatch(r"label_values\(inferq_\w+, model\)", query)
    per_model = [f for f, k in AGREED_METRICS.items() if "webhook" not in f and "http" not in f]
    for expr in _expressions(dashboard):
        if any(family in expr for family in per_model) and not expr.startswith("label_values"):
            assert 'model=~"$model"' in expr, expr
    assert dashboard["uid"] and all(panel["id"] for panel in _panels(dashboard))
    assert len({panel["id"] for panel in _panels(dashboard)}) == len(_panels(dashboard))


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) is not installed")
def test_prometheus_accepts_the_config_and_the_dashboard_queries(tmp_path: Path) -> None:
    config = ROOT / "deploy" / "prometheus" / "prometheus.yml"
    checked = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Prometheus's own parser on every dashboard expression: each one a recording rule.
    exprs = [e for e in _expressions(_dashboard()) if not e.startswith("label_values")]
    for variable, duration in GRAFANA_DURATIONS.items():
        exprs = [e.replace(variable, duration) for e in exprs]
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"r:{n}", "expr": e} for n, e in enumerate(exprs)]}]}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    checked = subprocess.run(
        ["promtool", "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"{len(exprs)} rules found" in checked.stdout


# --- a model's further versions (inferq manifests version) --------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_a_versions_manifests_serve_it_apart_and_validate(model: str) -> None:
    """`inferq manifests version MODEL 2`: its own Deployment (--model MODEL@2, pods the model's Deployment does not
    select) and a ScaledObject on version 2's own RQ keys; both valid Kubernetes and KEDA objects."""
    rendered = [doc for doc in yaml.safe_load_all(manifests.render(K8S, model, 2)) if doc]
    deployment, scaled = sorted(rendered, key=lambda doc: str(doc["kind"]))
    assert (deployment["kind"], scaled["kind"]) == ("Deployment", "ScaledObject")
    assert deployment["metadata"]["name"] == scaled["metadata"]["name"] == f"worker-{model}-v2"
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert build_parser().parse_args(container["command"][1:]).model == [f"{model}@2"]
    pods = deployment["spec"]["template"]["metadata"]["labels"]
    first = _find("Deployment", f"worker-{model}")["spec"]["selector"]["matchLabels"]
    assert not first.items() <= pods.items()  # version 1's workers never count version 2's pods as their own
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pods.items()
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    expected = set()
    for lane in keys.LANES:
        queue = layout.queue_keys(keys.queue_name(f"{model}@2", lane))
        expected |= {queue.queue, queue.started, queue.fair_backlog}
    assert {t["metadata"]["listName"] for t in scaled["spec"]["triggers"]} == expected
    assert [f"{'.'.join(map(str, e.path))}: {e.message}" for e in _keda_validator().iter_errors(scaled)] == []
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(deployment, version, strict=True)


def test_manifests_version_write_names_the_file_in_the_kustomization(tmp_path: Path) -> None:
    folder = tmp_path / "kubernetes"
    shutil.copytree(K8S, folder)
    args = build_parser().parse_args(["manifests", "version", "digits", "3", "--dir", str(folder), "--write"])
    assert manifests.cmd_manifests(args) == 0
    assert manifests.cmd_manifests(args) == 0  # again: named once
    listed = yaml.safe_load((folder / "kustomization.yaml").read_text())["resources"]
    assert listed.count("worker-digits-v3.yaml") == 1 and (folder / "worker-digits-v3.yaml").is_file()
    with pytest.raises(AppError, match="version 1 is served by the model's own manifest"):
        manifests.render(folder, "digits", 1)
    with pytest.raises(AppError, match="cannot read"):
        manifests.render(folder, "nosuch", 2)


def test_dashboard_keeps_tenants_apart_when_it_takes_one_replica_of_each_series() -> None:
    """Each API replica exposes the whole cluster, so panels take the max per series: a per-job family's series are
    per tenant too, and a max over tenants would show one tenant's rate, not their sum."""
    per_job = ("inferq_jobs_ended_total", "inferq_job_failures_total", "inferq_job_queued_seconds_bucket")
    per_job += ("inferq_job_inference_seconds_bucket", "inferq_job_end_to_end_seconds_bucket")
    checked = 0
    for expr in _expressions(_dashboard()):
        for clause, selector in re.findall(r"max by \(([^)]*)\) \(rate\((\w+)", expr):
            if selector in per_job:
                assert "tenant" in clause.split(", "), expr
                checked += 1
    assert checked >= 6
