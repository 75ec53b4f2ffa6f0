"""The /v2 tensor codec (api/oip/codec.py) in-process: requests tritonclient encodes in, responses it decodes out."""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton

from inferq.api.oip import codec
from inferq.shared.errors import InvalidInput, UnsupportedMedia
from inferq.shared.models import ModelConfig

COUNTS = ModelConfig.model_validate(
    {"name": "counts", "handler": "tensor", "input": {"kind": "tensor", "shape": [2, 2], "dtype": "int64"}}
)
DIGITS = ModelConfig.model_validate({"name": "digits", "input": {"kind": "image", "mode": "L", "size": [8, 8]}})
OWN = ModelConfig.model_validate({"name": "own", "handler": "pkg.mod:Own", "input": {"kind": "json"}})


def _encoded(tensor: triton.InferInput, outputs: list[triton.InferRequestedOutput] | None = None) -> tuple[bytes, Any]:
    body, json_size = triton.InferenceServerClient.generate_request_body([tensor], outputs=outputs)
    return body, None if json_size is None else str(json_size)


def _input(name: str, shape: list[int], datatype: str, array: np.ndarray, binary: bool = True) -> triton.InferInput:
    tensor = triton.InferInput(name, shape, datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


@pytest.mark.parametrize("binary", [True, False])
def test_a_tensor_reads_as_the_model_shapes_nested_list(binary: bool) -> None:
    array = np.array([[1, -2], [3, 2**40]], dtype=np.int64)
    request = codec.parse_request(COUNTS, *_encoded(_input("tensor", [2, 2], "INT64", array, binary)))
    assert request.value == [[1, -2], [3, 2**40]] and not request.batched
    batched = codec.parse_request(COUNTS, *_encoded(_input("tensor", [1, 2, 2], "INT64", array[None], binary)))
    assert batched.value == request.value and batched.batched


def test_flat_json_data_and_bf16_binary_data_are_taken() -> None:
    body = json.dumps({"inputs": [{"name": "tensor", "shape": [2, 2], "datatype": "INT64", "data": [1, 2, 3, 4]}]})
    assert codec.parse_request(COUNTS, body.encode(), None).value == [[1, 2], [3, 4]]
    bits = (np.array([1.5, -2.0, 0.25, 8.0], dtype=np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
    header = {
        "inputs": [{"name": "tensor", "shape": [2, 2], "datatype": "BF16", "parameters": {"binary_data_size": 8}}]
    }
    text = json.dumps(header).encode()
    assert codec.parse_request(COUNTS, text + bits, str(len(text))).value == [[1.5, -2.0], [0.25, 8.0]]


def _refusal(config: ModelConfig, body: bytes, header_length: str | None) -> str:
    with pytest.raises(InvalidInput) as refused:
        codec.parse_request(config, body, header_length)
    return refused.value.message


def test_malformed_requests_are_refused_with_what_is_wrong() -> None:
    png = _input("image", [1], "BYTES", np.array([b"\x89PNG"], dtype=np.object_))
    body, length = _encoded(png)
    assert "Inference-Header-Content-Length" in _refusal(DIGITS, body, str(len(body) + 1))
    assert "Inference-Header-Content-Length" in _refusal(DIGITS, body, "²")  # isdigit() says yes, int() refuses it
    assert "binary_data_size must be the 3 bytes" in _refusal(DIGITS, body[:-5], length)
    truncated = json.loads(body[: int(length)]) | {}
    truncated["inputs"][0]["parameters"]["binary_data_size"] = 3
    text = json.dumps(truncated).encode()
    assert "ends inside an element's 4-byte length" in _refusal(DIGITS, text + b"\x04\x00\x00", str(len(text)))
    two = _input("image", [2], "BYTES", np.array([b"a", b"b"], dtype=np.object_))
    assert "One request is one item" in _refusal(DIGITS, *_encoded(two))
    floats = _input("tensor", [2, 2], "BYTES", np.array([[b"1", b"2"], [b"3", b"4"]], dtype=np.object_))
    assert "input 'tensor' is INT64, got BYTES" in _refusal(COUNTS, *_encoded(floats))
    assert "not valid JSON" in _refusal(DIGITS, b'{"inputs": [', None)
    shared = {
        "inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "parameters": {"shared_memory_region": "r"}}]
    }
    with pytest.raises(UnsupportedMedia):
        codec.parse_request(DIGITS, json.dumps(shared).encode(), None)


def test_a_classifier_result_comes_back_as_tritonclient_reads_it() -> None:
    png = _input("image", [1, 1], "BYTES", np.array([[b"\x89PNG"]], dtype=np.object_))
    request = codec.parse_request(
        DIGITS,
        *_encoded(
            png, [triton.InferRequestedOutput("score"), triton.InferRequestedOutput("top_k_labels", binary_data=False)]
        ),
    )
    assert request.value == b"\x89PNG" and request.batched
    result = {"label": "7", "score": None, "top_k": [{"label": "7", "score": None}, {"label": "1", "score": 0.25}]}
    body, headers = codec.encode_response(DIGITS, request, "job-1", result)
    decoded = triton.InferenceServerClient.parse_response_body(body, header_length=int(headers[codec.HEADER_LENGTH]))
    assert math.isnan(decoded.as_numpy("score")[0][0]) and decoded.as_numpy("score").shape == (1, 1)
    assert decoded.as_numpy("top_k_labels").tolist() == [["7", "1"]]
    assert decoded.get_response()["parameters"] == {"job_id": "job-1"}


def test_a_handler_of_ones_own_answers_its_result_as_json() -> None:
    document = json.dumps({"a": [1, 2]}).encode()
    request = codec.parse_request(OWN, *_encoded(_input("json", [1], "BYTES", np.array([document], dtype=np.object_))))
    assert request.value == document
    body, headers = codec.encode_response(OWN, request, "job-2", [[1, 2], [3]])  # ragged: no tensor but "result"
    decoded = triton.InferenceServerClient.parse_response_body(body, header_length=int(headers[codec.HEADER_LENGTH]))
    assert [output["name"] for output in decoded.get_response()["outputs"]] == ["result"]
    assert json.loads(decoded.as_numpy("result")[0]) == [[1, 2], [3]]
    assert struct.unpack_from("<I", body, int(headers[codec.HEADER_LENGTH]))[0] == len(b"[[1, 2], [3]]")
