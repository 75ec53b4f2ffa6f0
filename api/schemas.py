"""Request and response shapes: what the API validates and answers, and what /openapi.json says it does."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AnyHttpUrl,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    WithJsonSchema,
    create_model,
)

from inferq.shared.inputs import Input, input_kind
from inferq.shared.models import ModelConfig
from inferq.shared.settings import Settings


class ModelPublic(BaseModel):
    name: str
    description: str
    handler: str
    input: dict[str, Any]
    labels: list[str] | None
    max_batch: int
    queue: str
    queue_length: int


class ModelList(BaseModel):
    models: list[ModelPublic]


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorBody


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (401, 404, 409, 413, 415, 422, 429, 503)
}


# Requests. The API validates every job body with these models and /openapi.json shows their JSON Schema,
# so the two cannot disagree; a model's input kind supplies the schema of the input itself (shared/inputs).

WEBHOOK_MAX_CHARS = 2048
# http(s) without whitespace for the schema; AnyHttpUrl then parses it (host, port) and gives its normal form.
_WEBHOOK_PATTERN = r"^[Hh][Tt][Tt][Pp][Ss]?://\S+$"
_HTTP_URL = TypeAdapter(AnyHttpUrl)


def _http_url(value: str) -> str:
    return str(_HTTP_URL.validate_python(value))


def _whole_float_as_int(value: Any) -> Any:
    # JSON Schema's "integer" counts 60.0 (JSON has one number type); anything else goes to the strict check.
    return int(value) if isinstance(value, float) and value.is_integer() else value


Webhook = Annotated[
    str,
    StringConstraints(max_length=WEBHOOK_MAX_CHARS, pattern=_WEBHOOK_PATTERN),
    Field(json_schema_extra={"format": "uri"}),
    AfterValidator(_http_url),
]


# The lane a job waits in: interactive work goes first, bulk fills in (shared/keys.py LANES).
Priority = Annotated[Literal["interactive", "bulk"], Field(description="the lane the job waits in")]


@dataclass(frozen=True)
class JobBodies:
    """One model's request models and raw-body schemas, for its settings."""

    json: type[BaseModel] | None  # application/json: {"inputs", "webhook", "priority", "result_ttl", "ttl"}
    form: type[BaseModel] | None  # multipart/form-data: file, webhook, priority, result_ttl, ttl (text but the file)
    raw: dict[str, dict[str, Any]]  # other media types: the whole body's schema
    # The most seconds each option takes, for messages.
    limits: dict[str, int]


def job_bodies(config: ModelConfig, settings: Settings) -> JobBodies:
    """The request models of ``config``'s submit path under ``settings`` (built once per distinct pair)."""
    spec = config.input.model_dump_json(by_alias=True)
    return _job_bodies(config.name, spec, settings.max_result_ttl_s, settings.queue_ttl_s)


@lru_cache(maxsize=256)
def _job_bodies(name: str, spec_json: str, max_result_ttl_s: int, queue_ttl_s: int) -> JobBodies:
    spec = TypeAdapter(Input).validate_json(spec_json)
    kind = input_kind(spec)
    schemas = kind.openapi(spec)
    limits = {"result_ttl": max_result_ttl_s, "ttl": queue_ttl_s}
    forbid = ConfigDict(extra="forbid")
    json_model = form_model = None
    if kind.from_json is not None:
        json_fields: dict[str, Any] = {
            "inputs": (Annotated[Any, WithJsonSchema(schemas["application/json"])], ...),
            "webhook": (Webhook | None, None),
            "priority": (Priority | None, None),
            **{
                field: (
                    Annotated[int, Field(strict=True, ge=1, le=most), BeforeValidator(_whole_float_as_int)] | None,
                    None,
                )
                for field, most in limits.items()
            },
        }
        json_model = create_model(f"{name} job", __config__=forbid, **json_fields)
    if kind.multipart:
        # Form values are text: integers are read from it, so not strict.
        form_fields: dict[str, Any] = {
            "file": (Annotated[Any, WithJsonSchema(schemas["multipart/form-data"])], ...),
            "webhook": (Webhook, None),
            "priority": (Priority, None),
            **{field: (Annotated[int, Field(ge=1, le=most)], None) for field, most in limits.items()},
        }
        form_model = create_model(f"{name} job form", __config__=forbid, **form_fields)
    raw = {media_type: schemas[media_type] for media_type in kind.media_types}
    return JobBodies(json_model, form_model, raw, limits)


def request_body(config: ModelConfig, settings: Settings) -> dict[str, Any]:
    """The OpenAPI requestBody of ``config``'s submit path: exactly the bodies the API takes for it."""
    bodies = job_bodies(config, settings)
    content: dict[str, Any] = {}
    if bodies.json is not None:
        content["application/json"] = {"schema": bodies.json.model_json_schema()}
    if bodies.form is not None:
        # The file part holds what a raw body may hold.
        part_types = ", ".join(bodies.raw)
        form = bodies.form.model_json_schema()
        for field in form["properties"].values():
            # A form field is absent or text: a "default": null would only invite clients to send "None".
            field.pop("default", None)
        content["multipart/form-data"] = {
            "schema": form,
            "encoding": {"file": {"contentType": part_types}},
        }
    content.update({media_type: {"schema": schema} for media_type, schema in bodies.raw.items()})
    return {"required": True, "content": content}
