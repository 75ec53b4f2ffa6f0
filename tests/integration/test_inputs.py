"""Input kinds through the API (httpx.ASGITransport, real redis-server): what is stored, what is refused."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_py

from inferq.api.app import create_app
from inferq.shared import keys
from inferq.shared.errors import ConfigError
from inferq.shared.inputs import KINDS, JsonInput, TensorInput, TextInput
from inferq.shared.inputs.text import SPACE_CLASS, TEXT_PATTERN
from inferq.shared.models import load_model_config
from inferq.shared.settings import Settings
from tests.support.models import write_models

AGE_SCHEMA = {
    "type": "object",
    "required": ["age"],
    "properties": {"age": {"type": "integer", "minimum": 0}, "tags": {"type": "array", "items": {"type": "string"}}},
}
CONFIGS: dict[str, dict[str, Any]] = {
    "sentiment": {
        "handler": "text_classifier",
        "format": "huggingface",
        "weights": "hf",
        "input": {"kind": "text", "max_chars": 50},
    },
    "person": {
        "handler": "tests.support.echo:SlowEcho",
        "weights": "none",
        "input": {"kind": "json", "schema": AGE_SCHEMA},
    },
    "anything": {"handler": "tests.support.echo:SlowEcho", "weights": "none", "input": {"kind": "json"}},
    "pair": {"handler": "tests.support.echo:SlowEcho", "weights": "none", "input": {"kind": "tensor", "shape": [2]}},
}
QUEUES = [f"rq:queue:{keys.queue_name(name)}" for name in CONFIGS]


@pytest.fixture
def settings(tmp_path: Path, redis_url: str) -> Settings:
    # The API reads configs only: no weights are needed in the folders.
    return Settings(redis_url=redis_url, models_dir=write_models(tmp_path / "models", CONFIGS))


def call(settings: Settings, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One request to a fresh app, its lifespan (Redis, event hub) running around it."""

    async def run() -> httpx.Response:
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://inferq") as client:
                return await client.request(method, path, **kwargs)

    return asyncio.run(run())


def submit(settings: Settings, model: str, **kwargs: Any) -> httpx.Response:
    return call(settings, "POST", f"/v1/models/{model}/jobs", **kwargs)


def stored(redis: redis_py.Redis, response: httpx.Response) -> tuple[bytes, bytes]:
    """The accepted job's payload and content type as the worker will read them."""
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    payload = redis.get(keys.payload_key(job_id))
    content_type = redis.hget(keys.info_key(job_id), "content_type")
    assert isinstance(payload, bytes) and isinstance(content_type, bytes)
    return payload, content_type


def assert_refused(redis: redis_py.Redis, response: httpx.Response, status: int, code: str, message: str) -> None:
    assert response.status_code == status, response.text
    assert response.json() == {"error": {"code": code, "message": message}}
    assert [redis.llen(queue) for queue in QUEUES] == [0] * len(QUEUES)
    assert redis.keys(f"{keys.PREFIX}:payload:*") == []


# text


@pytest.mark.parametrize(
    "text",
    ["I loved this film", "  padded, kept as sent  ", "naïve café 日本語 🙂", "x" * 50, "line one\nline two\ttab"],
)
def test_text_in_json_is_stored_as_its_utf8_bytes(settings: Settings, redis: redis_py.Redis, text: str) -> None:
    response = submit(settings, "sentiment", json={"inputs": text})
    assert stored(redis, response) == (text.encode("utf-8"), b"text/plain; charset=utf-8")
    assert response.json()["model"] == "sentiment" and response.json()["status"] == "queued"


def test_text_takes_the_job_options(settings: Settings, redis: redis_py.Redis) -> None:
    settings = settings.model_copy(update={"webhook_allow": ["127.0.0.1"]})
    body = {"inputs": "hello", "webhook": "http://127.0.0.1:9/hook", "result_ttl": 60, "ttl": 30}
    response = submit(settings, "sentiment", json=body)
    assert stored(redis, response) == (b"hello", b"text/plain; charset=utf-8")
    view = call(settings, "GET", f"/v1/jobs/{response.json()['id']}").json()
    assert view["webhook"] == {"url": "http://127.0.0.1:9/hook", "attempts": []}


def test_an_escaped_surrogate_pair_is_one_character(settings: Settings, redis: redis_py.Redis) -> None:
    body = b'{"inputs": "smile \\ud83d\\ude00"}'
    response = submit(settings, "sentiment", content=body, headers={"content-type": "application/json"})
    assert stored(redis, response) == ("smile \U0001f600".encode(), b"text/plain; charset=utf-8")


@pytest.mark.parametrize("content_type", ["text/plain", "text/plain; charset=utf-8", 'Text/Plain; Charset="UTF-8"'])
def test_text_plain_bodies_are_accepted(settings: Settings, redis: redis_py.Redis, content_type: str) -> None:
    text = "ünïcode plain body"
    response = submit(settings, "sentiment", content=text.encode(), headers={"content-type": content_type})
    assert stored(redis, response) == (text.encode(), b"text/plain; charset=utf-8")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"inputs": ["a", "b"]}, "inputs must be a string, got array"),
        ({"inputs": 7}, "inputs must be a string, got number"),
        ({"inputs": None}, "inputs must be a string, got null"),
        ({"inputs": {"text": "hi"}}, "inputs must be a string, got object"),
        ({"inputs": ""}, "the text is empty"),
        ({"inputs": " \n\t\u3000 "}, "the text is only whitespace"),
        ({"inputs": "x" * 51}, "the text is 51 characters long; the limit is 50"),
        ({"inputs": "é" * 60}, "the text is 60 characters long; the limit is 50"),
        ({"inputs": "bad \ud800 half"}, "the text holds a lone surrogate '\\ud800' at character 4"),
        ({"inputs": "nul\x00inside"}, "the text holds a NUL character at character 3"),
        (
            {"text": "hi"},
            "the body must be a JSON object with an 'inputs' field; model sentiment takes "
            "text: a JSON body {'inputs': '...'} or a text/plain body in UTF-8",
        ),
        ({"inputs": "hi", "lang": "en"}, "unknown fields: lang"),
        ({"inputs": "hi", "ttl": 0}, "ttl must be between 1 and 3600 seconds"),
    ],
)
def test_text_refusals(settings: Settings, redis: redis_py.Redis, body: dict[str, Any], message: str) -> None:
    # json.dumps escapes the lone surrogate as \ud800, which json.loads in the API reads back as one.
    response = submit(settings, "sentiment", content=json.dumps(body), headers={"content-type": "application/json"})
    assert_refused(redis, response, 422, "invalid_input", message)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "the text is empty"),
        (b"   \r\n", "the text is only whitespace"),
        (b"caf\xe9", "the body is not valid UTF-8: byte 0xe9 at offset 3"),
        (b"\xff\xfeh\x00i\x00", "the body is not valid UTF-8: byte 0xff at offset 0"),
        (b"a\x00b", "the text holds a NUL character at character 1"),
        (b"y" * 51, "the text is 51 characters long; the limit is 50"),
    ],
)
def test_text_plain_refusals(settings: Settings, redis: redis_py.Redis, body: bytes, message: str) -> None:
    response = submit(settings, "sentiment", content=body, headers={"content-type": "text/plain; charset=utf-8"})
    assert_refused(redis, response, 422, "invalid_input", message)


@pytest.mark.parametrize(
    ("content_type", "message"),
    [
        ("text/plain; charset=iso-8859-1", "model sentiment takes text/plain in UTF-8 only, not charset=iso-8859-1"),
        ("image/png", "model sentiment takes text: a JSON body {'inputs': '...'} or a text/plain body in UTF-8"),
        ("text/html", "model sentiment takes text: a JSON body {'inputs': '...'} or a text/plain body in UTF-8"),
        (
            "multipart/form-data; boundary=x",
            "model sentiment takes text: a JSON body {'inputs': '...'} or a text/plain body in UTF-8",
        ),
    ],
)
def test_text_refuses_other_media(settings: Settings, redis: redis_py.Redis, content_type: str, message: str) -> None:
    response = submit(settings, "sentiment", content=b"hello", headers={"content-type": content_type})
    assert_refused(redis, response, 415, "unsupported_media_type", message)


def test_text_over_the_body_limit_is_413(tmp_path: Path, redis_url: str, redis: redis_py.Redis) -> None:
    configs = {"sentiment": {**CONFIGS["sentiment"], "input": {"kind": "text", "max_chars": 1_000_000}}}
    settings = Settings(redis_url=redis_url, models_dir=write_models(tmp_path, configs), max_body_bytes=1024)
    response = submit(settings, "sentiment", content=b"x" * 2000, headers={"content-type": "text/plain"})
    assert_refused(redis, response, 413, "payload_too_large", "request body is 2000 bytes; the limit is 1024")


# json


def test_a_json_object_is_stored_compactly(settings: Settings, redis: redis_py.Redis) -> None:
    body = b'{"inputs": {"age": 41, "tags": ["a", "\\u00e9"], "extra": {"nested": [1.5, null, true]}}, "ttl": 9}'
    response = submit(settings, "person", content=body, headers={"content-type": "application/json"})
    payload = b'{"age":41,"tags":["a","\\u00e9"],"extra":{"nested":[1.5,null,true]}}'
    assert stored(redis, response) == (payload, b"application/json")


def test_a_json_model_without_a_schema_takes_any_object(settings: Settings, redis: redis_py.Redis) -> None:
    response = submit(settings, "anything", json={"inputs": {}})
    assert stored(redis, response) == (b"{}", b"application/json")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"inputs": {"age": -1}}, "inputs.age: -1 is less than the minimum of 0"),
        ({"inputs": {"age": "41"}}, "inputs.age: '41' is not of type 'integer'"),
        ({"inputs": {}}, "inputs: 'age' is a required property"),
        ({"inputs": {"age": 3, "tags": ["a", 2]}}, "inputs.tags[1]: 2 is not of type 'string'"),
        ({"inputs": [{"age": 3}]}, "inputs must be a JSON object, got array"),
        ({"inputs": "age=3"}, "inputs must be a JSON object, got string"),
        ({"inputs": None}, "inputs must be a JSON object, got null"),
    ],
)
def test_json_refusals(settings: Settings, redis: redis_py.Redis, body: dict[str, Any], message: str) -> None:
    assert_refused(redis, submit(settings, "person", json=body), 422, "invalid_input", message)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"inputs": {"x": NaN}}', "the body is not valid JSON: NaN is not allowed"),
        (b'{"inputs": {"x": -Infinity}}', "the body is not valid JSON: -Infinity is not allowed"),
        (b'{"inputs": {"x": 1e400}}', "inputs holds a number too large for JSON"),
    ],
)
def test_json_refuses_non_finite_numbers(settings: Settings, redis: redis_py.Redis, body: bytes, message: str) -> None:
    response = submit(settings, "anything", content=body, headers={"content-type": "application/json"})
    assert_refused(redis, response, 422, "invalid_input", message)


def test_json_refuses_other_media(settings: Settings, redis: redis_py.Redis) -> None:
    response = submit(settings, "person", content=b'{"age": 3}', headers={"content-type": "text/plain"})
    message = "model person takes a JSON body {'inputs': {...}} holding a JSON object"
    assert_refused(redis, response, 415, "unsupported_media_type", message)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "objekt"}, "not a valid JSON Schema: 'objekt' is not valid under any of the given schemas (at type)"),
        (
            {"properties": {"age": {"minimum": "zero"}}},
            "not a valid JSON Schema: 'zero' is not of type 'number' (at properties.age.minimum)",
        ),
        ({"$ref": "#/$defs/person"}, "the JSON Schema has a $ref that does not resolve within it"),
        (
            {"properties": {"a": {"$ref": "https://example.com/a.json"}}},
            "the JSON Schema has a $ref that does not resolve within it: https://example.com/a.json",
        ),
    ],
)
def test_an_unusable_schema_fails_config_load(tmp_path: Path, schema: dict[str, Any], message: str) -> None:
    write_models(tmp_path, {"bad": {"handler": "x:Y", "input": {"kind": "json", "schema": schema}}})
    with pytest.raises(ConfigError) as raised:
        load_model_config(tmp_path / "bad")
    assert f"config.json: input.json.schema: Value error, {message}" in raised.value.message


def test_schemas_with_local_refs_and_older_drafts_load() -> None:
    local = {"$defs": {"age": {"type": "integer", "minimum": 0}}, "properties": {"age": {"$ref": "#/$defs/age"}}}
    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"n": {"type": "number"}},
              "properties": {"n": {"$ref": "#/definitions/n"}}, "exclusiveMinimum": 0}  # fmt: skip
    for schema in (local, draft7):
        assert JsonInput.model_validate({"kind": "json", "schema": schema}).validator is not None


# what every kind shows


def test_models_list_shows_each_kind(settings: Settings, redis: redis_py.Redis) -> None:
    models = {m["name"]: m["input"] for m in call(settings, "GET", "/v1/models").json()["models"]}
    assert models == {
        "anything": {"kind": "json", "schema": None},
        "pair": {"kind": "tensor", "shape": [2], "dtype": "float32"},
        "person": {"kind": "json", "schema": AGE_SCHEMA},
        "sentiment": {"kind": "text", "max_chars": 50},
    }


def test_the_status_suggests_an_input_each_model_takes(settings: Settings, redis: redis_py.Redis) -> None:
    """The playground's hint: it suggested [[0.1, 0.2]] for every model that takes JSON, an object's too."""
    status = call(settings, "GET", "/v1/status")
    assert status.status_code == 200, status.text
    examples = {m["name"]: m["input_example"] for m in status.json()["models"]}
    assert examples == {"anything": {}, "pair": [0.0, 0.0], "person": {"age": 0, "tags": ["text"]}, "sentiment": None}
    for name in ("anything", "pair", "person"):
        assert stored(redis, submit(settings, name, json={"inputs": examples[name]}))  # the API takes what it suggests


def test_tensor_submissions_are_unchanged(settings: Settings, redis: redis_py.Redis) -> None:
    response = submit(settings, "pair", content=b"1,2", headers={"content-type": "text/plain"})
    assert_refused(redis, response, 415, "unsupported_media_type", "model pair takes a JSON body {'inputs': [...]}")
    response = submit(settings, "pair", json={"inputs": [1, 2, 3]})
    assert_refused(redis, response, 422, "invalid_input", "inputs: expected an array of length 2, got length 3")
    response = submit(settings, "pair", json={"inputs": [1, 2.5]})
    assert stored(redis, response) == (b'{"inputs": [1, 2.5]}', b"application/json")


def test_openapi_gives_each_model_its_own_body(settings: Settings, redis: redis_py.Redis) -> None:
    paths = call(settings, "GET", "/openapi.json").json()["paths"]
    assert "/v1/models/{model}/jobs" not in paths
    bodies = {name: paths[f"/v1/models/{name}/jobs"]["post"]["requestBody"]["content"] for name in CONFIGS}
    assert {name: sorted(body) for name, body in bodies.items()} == {
        "anything": ["application/json"],
        "pair": ["application/json"],
        "person": ["application/json"],
        "sentiment": ["application/json", "text/plain"],
    }
    text = {"type": "string", "minLength": 1, "maxLength": 50, "pattern": TEXT_PATTERN}
    assert bodies["sentiment"]["text/plain"] == {"schema": text}
    sentiment = bodies["sentiment"]["application/json"]["schema"]
    assert {key: sentiment[key] for key in ("required", "additionalProperties")} == {
        "required": ["inputs"],
        "additionalProperties": False,
    }
    assert sentiment["properties"]["inputs"] == {**text, "title": "Inputs"}
    # The documented ttl is there, with the limits the API applies.
    assert sorted(sentiment["properties"]) == ["inputs", "priority", "result_ttl", "ttl", "webhook"]
    assert sentiment["properties"]["priority"]["anyOf"][0]["enum"] == ["interactive", "bulk"]
    assert sentiment["properties"]["ttl"]["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": 3600}
    person = bodies["person"]["application/json"]["schema"]["properties"]["inputs"]
    assert person == {**AGE_SCHEMA, "title": "Inputs"}
    number = {"type": "number", "minimum": -3.4028234663852886e38, "maximum": 3.4028234663852886e38}
    pair = bodies["pair"]["application/json"]["schema"]["properties"]["inputs"]
    assert pair == {"type": "array", "minItems": 2, "maxItems": 2, "items": number, "title": "Inputs"}


def test_each_kind_describes_one_models_input() -> None:
    assert sorted(KINDS) == ["image", "json", "tensor", "text"]
    text = KINDS["text"].openapi(TextInput(max_chars=50))
    assert text["text/plain"] == {"type": "string", "minLength": 1, "maxLength": 50, "pattern": TEXT_PATTERN}
    tensor = KINDS["tensor"].openapi(TensorInput(shape=[2, 3], dtype="int64"))
    number = {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}
    row = {"type": "array", "minItems": 3, "maxItems": 3, "items": number}
    assert tensor["application/json"] == {"type": "array", "minItems": 2, "maxItems": 2, "items": row}
    person = KINDS["json"].openapi(JsonInput.model_validate({"schema": AGE_SCHEMA}))
    assert person["application/json"] == AGE_SCHEMA


def test_the_text_pattern_spells_out_exactly_what_isspace_counts() -> None:
    space = re.compile(f"[{SPACE_CLASS}]")
    every = [chr(point) for point in range(0x110000)]
    assert [char for char in every if space.match(char)] == [char for char in every if char.isspace()]


# tensor numbers the model's dtype cannot hold

RANGED = {
    "counts": {"handler": "tensor", "weights": "none", "input": {"kind": "tensor", "shape": [2, 2], "dtype": "int64"}},
    "wide": {"handler": "tensor", "weights": "none", "input": {"kind": "tensor", "shape": [2], "dtype": "float64"}},
    "pair32": {"handler": "tensor", "weights": "none", "input": {"kind": "tensor", "shape": [2], "dtype": "float32"}},
}
INT64 = "int64 (-9223372036854775808 to 9223372036854775807)"
FLOAT32 = "float32 (magnitude at most 3.4028234663852886e+38)"
FLOAT64 = "float64 (magnitude at most 1.7976931348623157e+308)"


@pytest.fixture
def ranged(tmp_path: Path, redis_url: str) -> Settings:
    return Settings(redis_url=redis_url, models_dir=write_models(tmp_path / "models", RANGED))


@pytest.mark.parametrize(
    ("model", "body", "message"),
    [
        ("counts", b'{"inputs": [[1, 2], [9223372036854775808, 4]]}', f"inputs[1][0] is out of range for {INT64}"),
        ("counts", b'{"inputs": [[1, -9223372036854775809], [3, 4]]}', f"inputs[0][1] is out of range for {INT64}"),
        ("counts", b'{"inputs": [[1, 2], [3, ' + b"9" * 400 + b"]]}", f"inputs[1][1] is out of range for {INT64}"),
        ("counts", b'{"inputs": [[1, 2], [true, 4]]}', "inputs[1][0] must be a number, got boolean"),
        ("counts", b'{"inputs": [[1, 2], [3, false]]}', "inputs[1][1] must be a number, got boolean"),
        ("pair32", b'{"inputs": [true, 1.5]}', "inputs[0] must be a number, got boolean"),
        ("pair32", b'{"inputs": [1.5, 3.5e38]}', f"inputs[1] is out of range for {FLOAT32}"),
        ("pair32", b'{"inputs": [-1e39, 0]}', f"inputs[0] is out of range for {FLOAT32}"),
        ("wide", b'{"inputs": [1, ' + b"9" * 400 + b"]}", f"inputs[1] is out of range for {FLOAT64}"),
    ],
)  # fmt: skip
def test_tensor_numbers_outside_the_dtype_are_refused(
    ranged: Settings, redis: redis_py.Redis, model: str, body: bytes, message: str
) -> None:
    response = submit(ranged, model, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.json() == {"error": {"code": "invalid_input", "message": message}}
    assert [redis.llen(f"rq:queue:{keys.queue_name(name)}") for name in RANGED] == [0, 0, 0]
    assert redis.keys(f"{keys.PREFIX}:payload:*") == []


def test_tensor_numbers_at_the_dtype_limits_are_accepted(ranged: Settings, redis: redis_py.Redis) -> None:
    body = b'{"inputs": [[9223372036854775807, -9223372036854775808], [0, -1]]}'
    response = submit(ranged, "counts", content=body, headers={"content-type": "application/json"})
    assert stored(redis, response) == (body, b"application/json")
    response = submit(ranged, "pair32", json={"inputs": [3.4028234663852886e38, -3.4028234663852886e38]})
    assert stored(redis, response) == (
        b'{"inputs": [3.4028234663852886e+38, -3.4028234663852886e+38]}',
        b"application/json",
    )
    response = submit(ranged, "wide", json={"inputs": [1e308, 10**300]})
    assert stored(redis, response)[0] == b'{"inputs": [1e+308, 1' + b"0" * 300 + b"]}"
