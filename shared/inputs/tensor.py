"""The ``tensor`` input kind: a JSON array of a fixed shape and dtype."""

from __future__ import annotations

import json
import math
import sys
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from inferq.shared.errors import InvalidInput
from inferq.shared.inputs.base import InputKind, JsonBound, Payload, json_type
from inferq.shared.settings import Settings

# What the worker's torch.tensor(..., dtype) can hold. Past these, int64 and float64 raise in the
# worker (one failed job, after queueing), and float32 silently turns the number into infinity.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FLOAT_MAX = {"float32": 3.4028234663852886e38, "float64": sys.float_info.max}

# What one tensor's JSON may take, however it is formatted (json_bound). A number's shortest repr is at most
# 24 characters (-1.7976931348623157e+308; int64's longest is 20); 48 leaves room for fixed-precision writers.
# Each number and each array (its opening and its closing) may sit on a line of its own, with a separator and
# up to 16 columns of indentation per nesting level: json.dumps(..., indent=4) needs a quarter of that.
NUMBER_CHARS = 48
LINE_CHARS = 8
INDENT_CHARS = 16


class TensorInput(BaseModel):
    """A JSON array of the given shape (one item, no batch axis) and dtype."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["tensor"] = "tensor"
    shape: list[int]
    dtype: Literal["float32", "float64", "int64"] = "float32"


def check_tensor(value: Any, shape: list[int], dtype: str, where: str = "inputs") -> None:
    """Check a nested JSON list against the model's shape from the outside in, failing at the first misfit.

    Top-down, so a 10 MiB list for a 2-number model is refused at its length, and nesting deeper than
    the model's rank is refused at the first extra level (no recursion past the shape's depth).
    """
    if shape:
        if not isinstance(value, list) or len(value) != shape[0]:
            got = f"length {len(value)}" if isinstance(value, list) else json_type(value)
            raise InvalidInput(f"{where}: expected an array of length {shape[0]}, got {got}")
        for i, item in enumerate(value):
            check_tensor(item, shape[1:], dtype, f"{where}[{i}]")
        return
    _check_number(value, dtype, where)


def _check_number(value: Any, dtype: str, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{where} must be a number, got {json_type(value)}")
    # 3.0 is an integer to JSON Schema (and to JSON, which has one number type); 3.5 is not.
    if dtype == "int64" and not (isinstance(value, int) or value.is_integer()):
        raise InvalidInput(f"{where} must be an integer for an int64 model")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInput(f"{where} is not a finite number")
    if dtype == "int64" and not INT64_MIN <= value <= INT64_MAX:
        raise InvalidInput(f"{where} is out of range for int64 ({INT64_MIN} to {INT64_MAX})")
    if dtype in FLOAT_MAX and abs(value) > FLOAT_MAX[dtype]:
        # Compared exactly: an int too large for any float is refused, never converted.
        raise InvalidInput(f"{where} is out of range for {dtype} (magnitude at most {FLOAT_MAX[dtype]!r})")


def from_json(spec: TensorInput, inputs: Any, model: str, settings: Settings) -> Payload:
    """The array re-serialized as ``{"inputs": [...]}``, once its shape and numbers fit the model."""
    check_tensor(inputs, spec.shape, spec.dtype)
    return Payload(json.dumps({"inputs": inputs}).encode(), "application/json")


def json_bound(spec: TensorInput) -> JsonBound:
    """The most characters a legitimate ``inputs`` value of this shape takes, pretty-printed or not."""
    chars = 0
    nodes = 1  # arrays (then numbers) at this nesting level
    for depth, size in enumerate(spec.shape):
        chars += nodes * 2 * (LINE_CHARS + INDENT_CHARS * (depth + 1))
        nodes *= max(size, 0)
    chars += nodes * (NUMBER_CHARS + LINE_CHARS + INDENT_CHARS * (len(spec.shape) + 1))
    return JsonBound(chars, f"{nodes} number{'' if nodes == 1 else 's'} (a tensor of shape {spec.shape})")


# A tensor of more numbers than this has no example to show: a hint, not a page of zeros.
EXAMPLE_NUMBERS_MAX = 16


def example(spec: TensorInput) -> Any:
    """Zeros of the spec's shape and dtype, or None past ``EXAMPLE_NUMBERS_MAX`` numbers."""
    if math.prod(spec.shape) > EXAMPLE_NUMBERS_MAX:
        return None
    value: Any = 0 if spec.dtype == "int64" else 0.0
    for size in reversed(spec.shape):
        value = [value] * size
    return value


def openapi(spec: TensorInput) -> dict[str, dict[str, Any]]:
    if spec.dtype == "int64":
        schema: dict[str, Any] = {"type": "integer", "minimum": INT64_MIN, "maximum": INT64_MAX}
    else:
        schema = {"type": "number", "minimum": -FLOAT_MAX[spec.dtype], "maximum": FLOAT_MAX[spec.dtype]}
    for size in reversed(spec.shape):
        schema = {"type": "array", "minItems": size, "maxItems": size, "items": schema}
    return {"application/json": schema}


KIND = InputKind(
    name="tensor",
    config=TensorInput,
    takes="a JSON body {'inputs': [...]}",
    openapi=openapi,
    from_json=from_json,
    json_bound=json_bound,
    example=example,
)
