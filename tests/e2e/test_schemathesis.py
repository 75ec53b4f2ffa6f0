"""Property-based tests of the API against its own OpenAPI schema, over real HTTP.

Schemathesis' own engine (the one `st run` drives) runs every phase: schema examples, coverage (boundary
values, each constraint broken on purpose, undeclared methods), fuzzing and stateful sequences, in positive
and negative modes, with every check. The bar: no 5xx, every response as the schema says, every request the
schema allows accepted, every request it forbids refused, and a 405 with Allow for an undeclared method.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import strategies as st
from PIL import Image
from schemathesis.engine import Status, events, from_schema

from tests.support.stack import Stack, new_stack, serving

# Beside the stack's image and tensor models: a text model, a json model with a schema, an int64 tensor.
# The API reads their configs only; no worker serves them, so their jobs stay queued.
EXTRA_MODELS: dict[str, dict[str, Any]] = {
    "sentiment": {
        "handler": "text_classifier",
        "format": "huggingface",
        "weights": "hf",
        "input": {"kind": "text", "max_chars": 50},
    },
    "person": {
        "handler": "tests.support.echo:SlowEcho",
        "weights": "none",
        "input": {
            "kind": "json",
            "schema": {
                "type": "object",
                "required": ["age"],
                "properties": {"age": {"type": "integer", "minimum": 0}, "tags": {"type": "array"}},
            },
        },
    },
    "counts": {
        "handler": "tests.support.echo:SlowEcho",
        "weights": "none",
        "input": {"kind": "tensor", "shape": [2, 2], "dtype": "int64"},
    },
}
SUBMIT_PATHS = {f"/v1/models/{name}/jobs" for name in ("digits", "digits-batch", "slow", "fragile", *EXTRA_MODELS)}
# Nothing listens there; no webhook sender runs. It only has to be a webhook the API takes.
WEBHOOK = "http://127.0.0.1:9/hook"


@pytest.fixture(scope="module")
def api_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # A 1 s cap on waits keeps generated `Prefer: wait=` and `?wait=` requests short.
    stack = new_stack(tmp_path_factory.mktemp("schema"), INFERQ_MAX_WAIT_S="1")
    for name, config in EXTRA_MODELS.items():
        (stack.models_dir / name).mkdir()
        (stack.models_dir / name / "config.json").write_text(json.dumps(config))
    with serving(stack) as running:
        running.start_api()
        running.start_worker("digits")
        yield running


def _image(fmt: str, mode: str, width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (width, height), color=width * height % 256 if mode == "L" else (width, height, 7)).save(
        buffer, format=fmt
    )
    return buffer.getvalue()


def images(fmt: str) -> st.SearchStrategy[bytes]:
    """Small real images in ``fmt``: a schema can say "image/png", not what a PNG is."""
    sizes = st.integers(min_value=1, max_value=32)
    return st.builds(_image, st.just(fmt), st.sampled_from(["L", "RGB"]), sizes, sizes)


def _register_image_media_types() -> None:
    formats = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP", "image/gif": "GIF", "image/bmp": "BMP"}
    for media_type, fmt in formats.items():
        schemathesis.openapi.media_type(media_type, images(fmt))
    # The API reads an application/octet-stream body or part as an image too.
    schemathesis.openapi.media_type("application/octet-stream", st.one_of(*(images(f) for f in formats.values())))


def _outside_world(context: schemathesis.HookContext, case: schemathesis.Case, kwargs: dict[str, Any]) -> None:
    """What a schema cannot say about a valid request, settled for requests meant to be valid."""
    if case.meta is None or not case.meta.generation.mode.is_positive:
        return
    # A webhook host must resolve (no DNS here) to an address the deployment allows (the stack allows loopback).
    if isinstance(case.body, dict) and isinstance(case.body.get("webhook"), str):
        case.body["webhook"] = WEBHOOK
    # A reused Idempotency-Key with another body is refused by design; generated keys collide ("0").
    if case.headers and case.headers.get("idempotency-key"):
        case.headers["idempotency-key"] = f"key-{case.id}"
    # Both edits keep a valid request valid. Said so, as schemathesis would otherwise re-check an edited body and
    # count any body holding a file (multipart) as invalid, then expect the API to refuse it.
    case._sync_validated_hashes()


def _failures(stream: list[events.EngineEvent]) -> tuple[list[str], dict[str, int]]:
    """Every failed check and engine error, readably, and the number of cases run per operation."""
    failures: list[str] = []
    cases: dict[str, int] = {}
    for event in stream:
        if isinstance(event, events.ScenarioFinished):
            recorder = event.recorder
            cases[recorder.label] = cases.get(recorder.label, 0) + len(recorder.cases)
            for checks in recorder.checks.values():
                for node in checks:
                    if node.status == Status.FAILURE and node.failure_info is not None:
                        failure = node.failure_info.failure
                        failures.append(
                            f"[{event.phase.value}] {recorder.label}: {node.name}: {failure.title}\n"
                            f"{failure.message}\n{node.failure_info.code_sample}"
                        )
        elif isinstance(event, events.NonFatalError | events.FatalError):
            failures.append(f"engine error: {event!r}")
        elif isinstance(event, events.EngineFinished):
            failures += [f"after the run: {failure.title}: {failure.message}" for failure in event.failures]
    return failures, cases


@pytest.mark.timeout(300)
def test_the_api_does_what_its_schema_says(api_stack: Stack) -> None:
    _register_image_media_types()
    config = schemathesis.Config.from_dict(
        {
            "seed": 20240909,
            "workers": 1,
            "request-timeout": 15,
            # A job's event stream stays open until the job ends (most never do here): its first event will do.
            "max-stream-events": 1,
            "generation": {"mode": "all", "max-examples": 20, "database": "none"},
            # Every check schemathesis has, among them not_a_server_error, status_code_conformance,
            # content_type_conformance, response_schema_conformance, positive_data_acceptance,
            # negative_data_rejection and unsupported_method (405 with Allow).
            "checks": {"enabled": True},
            "phases": {name: {"enabled": True} for name in ("examples", "coverage", "fuzzing", "stateful")},
            "operations": [
                {
                    # A bulk upload is JSONL: the schema can only say "a string" (or a file); its lines are
                    # checked one by one as single submits are, so a schema-valid body may still hold no item.
                    "include-path": "/v1/models/{model}/batches",
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "401", "403", "404", "409", "413", "422", "429"]
                        }
                    },
                }
            ],
        }
    )
    schema = schemathesis.openapi.from_url(f"{api_stack.base}/openapi.json", config=config)
    schemathesis.hook("before_call")(_outside_world)
    try:
        stream = list(from_schema(schema).execute())
    finally:
        schemathesis.hooks.GLOBAL_HOOK_DISPATCHER.unregister(_outside_world)
    failures, cases = _failures(stream)
    assert failures == [], "\n\n".join(failures)
    # Every operation ran, each with more than a handful of requests: the run was not vacuous.
    submits = {label for label in cases if label.startswith("POST /v1/models/") and label.endswith("/jobs")}
    assert submits == {f"POST {path}" for path in SUBMIT_PATHS}
    assert len(cases) >= len(SUBMIT_PATHS) + 7
    batches = {"POST /v1/models/{model}/batches", "GET /v1/batches/{batch_id}", "GET /v1/batches/{batch_id}/results"}
    assert batches | {"POST /v1/batches/{batch_id}/cancel"} <= set(cases)
    assert all(count >= 5 for label, count in cases.items() if label != "Stateful tests"), cases
