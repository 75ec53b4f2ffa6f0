"""Open Inference Protocol v2 tensors for inferq's models: metadata, infer requests in, infer responses out.

Each model has one input, named after its input kind: a tensor model's ``tensor`` (its dtype, its shape), and
for image, text and json models a ``BYTES`` tensor of one element (the encoded image, UTF-8 text, a JSON
document). A leading batch axis of 1 is accepted and echoed on the outputs; one request is one item (one job).
Outputs come from the job's result: every model has ``result`` (the result as JSON text, exactly what /v1
shows); built-in handlers add named tensors (``label``, ``score``, ``top_k_labels``, ``top_k_scores``;
``embedding``; ``output`` for tensor models, left out of a response whose result has no ``output`` unless
asked for). Numbers go out as FP64, so they equal the /v1 result's.

Binary tensor data (the extension tritonclient uses by default): the JSON header's length travels in
``Inference-Header-Content-Length`` and each binary tensor's bytes follow it in the order the header lists
them; a BYTES element is a 4-byte little-endian length and its bytes.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferq.shared.errors import InvalidInput, UnsupportedMedia
from inferq.shared.models import ModelConfig, TensorInput

HEADER_LENGTH = "Inference-Header-Content-Length"
# Little-endian numpy types of the numeric datatypes; BF16 is read by hand (numpy has no bfloat16).
NUMERIC = {
    "BOOL": "?",
    "UINT8": "<u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "INT8": "<i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
}
# What a tensor model's input may be sent as: its numbers are checked against the model's dtype afterwards.
NUMBERS = {*NUMERIC, "BF16"} - {"BOOL"}
_DATATYPE = {"float32": "FP32", "float64": "FP64", "int64": "INT64"}
_SHARED_MEMORY = "shared memory is not available over inferq's HTTP API: send the tensor in the request"


@dataclass(frozen=True)
class TensorSpec:
    """A tensor as model metadata lists it; -1 marks an axis whose size varies."""

    name: str
    datatype: str
    shape: list[int]

    def public(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": self.shape}


@dataclass(frozen=True)
class OutputSpec(TensorSpec):
    """An output, and how it is read from a job's result."""

    extract: Callable[[Any], Any]


@dataclass(frozen=True)
class InferRequest:
    """A parsed infer request: its one input's value, as the model's input kind takes it, and the outputs wanted."""

    id: str | None
    # bytes for BYTES inputs, nested lists in the model's shape for tensor inputs.
    value: Any
    batched: bool
    # (output, whether its data goes binary), in the order the response lists them.
    outputs: list[tuple[OutputSpec, bool]]
    # Named by the request; otherwise an output the result lacks (a handler of one's own) is left out.
    explicit: bool


def input_spec(config: ModelConfig) -> TensorSpec:
    """The model's one input."""
    spec = config.input
    if isinstance(spec, TensorInput):
        return TensorSpec("tensor", _DATATYPE[spec.dtype], list(spec.shape))
    return TensorSpec(spec.kind, "BYTES", [1])


def _top_k(field: str) -> Callable[[Any], Any]:
    return lambda result: [entry[field] for entry in result["top_k"]]


def output_specs(config: ModelConfig) -> list[OutputSpec]:
    """The model's outputs: ``result`` for every model, named tensors for the built-in handlers' results."""
    outputs = []
    if config.handler in ("image_classifier", "text_classifier"):
        outputs = [
            OutputSpec("label", "BYTES", [1], lambda result: [result["label"]]),
            OutputSpec("score", "FP64", [1], lambda result: [result["score"]]),
            OutputSpec("top_k_labels", "BYTES", [-1], _top_k("label")),
            OutputSpec("top_k_scores", "FP64", [-1], _top_k("score")),
        ]
    elif config.handler in ("image_embedding", "text_embedding"):
        outputs = [OutputSpec("embedding", "FP64", [-1], lambda result: result["embedding"])]
    elif config.handler == "tensor" or isinstance(config.input, TensorInput):
        # A handler of one's own for a tensor model usually keeps TensorHandler's {"output": [...]}.
        outputs = [OutputSpec("output", "FP64", [-1], lambda result: result["output"])]
    return [*outputs, OutputSpec("result", "BYTES", [1], lambda result: [json.dumps(result)])]


def metadata(config: ModelConfig, versions: list[int]) -> dict[str, Any]:
    """The model metadata response: ``config``'s inputs and outputs, and the model's versions."""
    return {
        "name": config.name,
        "versions": [str(v) for v in versions],
        "platform": f"inferq_{config.format}",
        "inputs": [input_spec(config).public()],
        "outputs": [output.public() for output in output_specs(config)],
    }


# Requests.


def _header(body: bytes, header_length: str | None) -> tuple[dict[str, Any], bytes]:
    if header_length is None:
        size = len(body)
    # ASCII digits only: str.isdigit() is true of "²" (a header's byte 0xb2), which int() refuses.
    elif header_length.strip().isascii() and header_length.strip().isdigit() and int(header_length) <= len(body):
        size = int(header_length)
    else:
        raise InvalidInput(f"{HEADER_LENGTH} must be the JSON header's length in bytes (at most {len(body)})")
    try:
        header = json.loads(body[:size], parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"the inference request header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise InvalidInput("the inference request must be a JSON object")
    return header, body[size:]


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _parameters(holder: dict[str, Any], what: str) -> dict[str, Any]:
    parameters = holder.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidInput(f"{what}: parameters must be an object")
    if any(name.startswith("shared_memory") for name in parameters):
        raise UnsupportedMedia(f"{what}: {_SHARED_MEMORY}")
    return parameters


def parse_request(config: ModelConfig, body: bytes, header_length: str | None) -> InferRequest:
    """The model's input from an infer request, its shape checked against the model's; the outputs it asks for."""
    header, binary = _header(body, header_length)
    expected = input_spec(config)
    where = f"model {config.name} takes one input, {expected.name!r} ({expected.datatype}, shape {expected.shape})"
    inputs = header.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise InvalidInput(f"inputs must be a list of one tensor: {where}")
    tensor = inputs[0]
    if tensor.get("name") != expected.name:
        raise InvalidInput(f"no input named {str(tensor.get('name'))[:100]!r}: {where}")
    parameters = _parameters(tensor, f"input {expected.name!r}")
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
        raise InvalidInput(f"input {expected.name!r}: shape must be a list of integers")
    batched = shape == [1, *expected.shape]
    if shape != expected.shape and not batched:
        raise InvalidInput(
            f"input {expected.name!r} has shape {shape[:10]}; {where}, or {[1, *expected.shape]} with a batch axis "
            "of 1. One request is one item: send each item as its own request (the worker batches them)"
        )
    count = math.prod(expected.shape)
    size = parameters.get("binary_data_size")
    if size is None:
        if binary:
            raise InvalidInput(f"{len(binary)} bytes follow the JSON header but no input has binary_data_size")
        flat = _json_data(tensor.get("data"), expected, count)
    else:
        if not isinstance(size, int) or isinstance(size, bool) or size != len(binary):
            raise InvalidInput(
                f"input {expected.name!r}: binary_data_size must be the {len(binary)} bytes after the JSON header"
            )
        flat = _binary_data(binary, tensor.get("datatype"), expected, count)
    if expected.datatype == "BYTES":
        value = flat[0]
    else:
        if tensor.get("datatype") not in NUMBERS:
            raise InvalidInput(f"input {expected.name!r} must be a number type such as {expected.datatype}")
        value = _nest(flat, expected.shape)
    outputs = _outputs(config, header)
    return InferRequest(_request_id(header), value, batched, outputs, header.get("outputs") is not None)


def _request_id(header: dict[str, Any]) -> str | None:
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput("id must be a string")
    return request_id


def _json_data(data: Any, expected: TensorSpec, count: int) -> list[Any]:
    """The elements of a tensor's JSON ``data``, nested as its shape or flat (row-major)."""
    flat: list[Any] = []
    todo = [(data, 0)]
    while todo:
        value, depth = todo.pop()
        if isinstance(value, list):
            if depth > len(expected.shape):
                raise InvalidInput(f"input {expected.name!r}: data is nested deeper than its shape")
            todo += [(item, depth + 1) for item in reversed(value)]
        else:
            flat.append(value)
        if len(flat) > count:
            break
    if len(flat) != count:
        raise InvalidInput(f"input {expected.name!r}: data must hold {count} element(s) for shape {expected.shape}")
    if expected.datatype == "BYTES":
        if not isinstance(flat[0], str):
            raise InvalidInput(f"input {expected.name!r}: BYTES data in JSON is a string; send binary data otherwise")
        return [flat[0].encode("utf-8", "surrogatepass")]
    return flat


def _binary_data(data: bytes, datatype: Any, expected: TensorSpec, count: int) -> list[Any]:
    if datatype != expected.datatype and (expected.datatype == "BYTES" or datatype == "BYTES"):
        raise InvalidInput(f"input {expected.name!r} is {expected.datatype}, got {str(datatype)[:20]}")
    if datatype == "BYTES":
        return _bytes_elements(data, expected.name, count)
    if datatype == "BF16":
        bits = np.frombuffer(data, "<u2") if len(data) == 2 * count else None
        values = None if bits is None else (bits.astype("<u4") << 16).view("<f4")
    elif datatype in NUMERIC:
        itemsize = np.dtype(NUMERIC[datatype]).itemsize
        values = np.frombuffer(data, NUMERIC[datatype]) if len(data) == itemsize * count else None
    else:
        raise InvalidInput(f"input {expected.name!r}: unknown datatype {str(datatype)[:20]!r}")
    if values is None:
        raise InvalidInput(f"input {expected.name!r}: {len(data)} bytes do not hold {count} {datatype} element(s)")
    return list(values.tolist())


def _bytes_elements(data: bytes, name: str, count: int) -> list[bytes]:
    elements, offset = [], 0
    while offset < len(data):
        if offset + 4 > len(data):
            raise InvalidInput(f"input {name!r}: BYTES data ends inside an element's 4-byte length")
        (size,) = struct.unpack_from("<I", data, offset)
        if offset + 4 + size > len(data):
            raise InvalidInput(f"input {name!r}: a BYTES element says {size} bytes, fewer follow")
        elements.append(data[offset + 4 : offset + 4 + size])
        offset += 4 + size
    if len(elements) != count:
        raise InvalidInput(f"input {name!r}: {len(elements)} BYTES elements, the shape holds {count}")
    return elements


def _nest(flat: list[Any], shape: list[int]) -> Any:
    for size in reversed(shape[1:]):
        flat = [flat[i : i + size] for i in range(0, len(flat), size)]
    return flat


def _outputs(config: ModelConfig, header: dict[str, Any]) -> list[tuple[OutputSpec, bool]]:
    specs = {spec.name: spec for spec in output_specs(config)}
    binary_default = _parameters(header, "the request").get("binary_data_output", False) is True
    asked = header.get("outputs")
    if asked is None:
        return [(spec, binary_default) for spec in specs.values()]
    if not isinstance(asked, list) or not all(isinstance(output, dict) for output in asked):
        raise InvalidInput("outputs must be a list of objects")
    chosen = []
    for output in asked:
        spec = specs.get(output.get("name"))  # type: ignore[arg-type]
        if spec is None:
            raise InvalidInput(
                f"model {config.name} has no output {str(output.get('name'))[:100]!r}; it has {list(specs)}"
            )
        parameters = _parameters(output, f"output {spec.name!r}")
        if parameters.get("classification"):
            raise InvalidInput("the classification extension is not supported: ask for top_k_labels and top_k_scores")
        chosen.append((spec, parameters.get("binary_data", binary_default) is True))
    return chosen


# Responses.


def _shape_of(data: Any) -> tuple[list[int], list[Any]]:
    """A regular nested list's shape and its elements in row-major order."""
    shape, level = [], data
    while isinstance(level, list):
        shape.append(len(level))
        level = level[0] if level else None
    flat = data
    for _ in shape[1:]:
        if not all(isinstance(row, list) and len(row) == len(flat[0]) for row in flat):
            raise ValueError("ragged")
        flat = [item for row in flat for item in row]
    if any(isinstance(item, list) for item in flat):
        raise ValueError("ragged")
    return shape, flat


def encode_response(
    config: ModelConfig, request: InferRequest, job_id: str, result: Any
) -> tuple[bytes, dict[str, str]]:
    """The infer response body for a finished job's result, and its headers."""
    tensors, chunks = [], []
    for spec, binary in request.outputs:
        try:
            shape, flat = _shape_of(spec.extract(result))
        except (KeyError, TypeError, IndexError, ValueError):
            if not request.explicit:
                continue
            raise InvalidInput(
                f"job {job_id} finished, but its result does not fit output {spec.name!r}: ask for 'result' (JSON)"
            ) from None
        if request.batched:
            shape = [1, *shape]
        tensor: dict[str, Any] = {"name": spec.name, "datatype": spec.datatype, "shape": shape}
        if binary:
            chunk = _encode(flat, spec.datatype)
            tensor["parameters"] = {"binary_data_size": len(chunk)}
            chunks.append(chunk)
        else:
            tensor["data"] = flat
        tensors.append(tensor)
    response: dict[str, Any] = {"model_name": config.name, "model_version": str(config.version)}
    if request.id is not None:
        response["id"] = request.id
    response |= {"parameters": {"job_id": job_id}, "outputs": tensors}
    header = json.dumps(response, allow_nan=False).encode()
    if not chunks:
        return header, {"Content-Type": "application/json"}
    headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(header))}
    return b"".join([header, *chunks]), headers


def _encode(flat: list[Any], datatype: str) -> bytes:
    if datatype == "BYTES":
        encoded = [str(item).encode() for item in flat]
        return b"".join(struct.pack("<I", len(item)) + item for item in encoded)
    # A NaN score is null in the result: NaN again here.
    return np.asarray([math.nan if item is None else item for item in flat], NUMERIC[datatype]).tobytes()
