"""The Open Inference Protocol (/v2) with the real tritonclient, against the real API and a real worker.

Every infer is an ordinary job: its results must equal /v1's for the same input.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from inferq.shared import keys
from inferq.shared.rqjson import JSONQueue
from tests.support.models import ROOT
from tests.support.stack import Stack, new_stack, serving

CLASSIFIER_OUTPUTS = ["label", "score", "top_k_labels", "top_k_scores", "result"]
TEXTS = ["Der Hund schläft heute im Garten unter dem Baum", "The weather is nice and the children play outside"]


@pytest.fixture(scope="module")
def v2_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The API and one worker serving digits (image), slow (tensor, no delay) and langid (text); fragile unserved."""
    stack = new_stack(tmp_path_factory.mktemp("v2"), INFERQ_TEST_SLOW_S="0")
    shutil.copytree(ROOT / "models" / "langid", stack.models_dir / "langid", ignore=shutil.ignore_patterns("__py*"))
    with serving(stack) as running:
        running.start_api()
        running.start_worker("digits", "slow", "langid")
        for model in ("digits", "slow", "langid"):
            running.wait_for_worker(model)
        yield running


@pytest.fixture
def client(v2_stack: Stack) -> Iterator[triton.InferenceServerClient]:
    with triton.InferenceServerClient(v2_stack.base.removeprefix("http://"), network_timeout=90) as connected:
        yield connected


def v1_result(stack: Stack, model: str, **request: Any) -> Any:
    response = httpx.post(f"{stack.base}/v1/models/{model}/jobs", headers={"Prefer": "wait=30"}, timeout=60, **request)
    assert response.status_code == 200, response.text
    return response.json()["result"]


def bytes_input(name: str, value: bytes, binary: bool = True) -> triton.InferInput:
    tensor = triton.InferInput(name, [1], "BYTES")
    tensor.set_data_from_numpy(np.array([value], dtype=np.object_), binary_data=binary)
    return tensor


def outputs(names: list[str], binary: bool = True) -> list[triton.InferRequestedOutput]:
    return [triton.InferRequestedOutput(name, binary_data=binary) for name in names]


def texts(result: triton.InferResult, name: str) -> list[str]:
    """A BYTES output's elements: tritonclient gives bytes for binary data, str for JSON data."""
    return [item.decode() if isinstance(item, bytes) else item for item in result.as_numpy(name).tolist()]


def assert_classification(result: triton.InferResult, expected: dict[str, Any]) -> None:
    """Every output of a classifier equals the /v1 result it came from."""
    assert texts(result, "label") == [expected["label"]]
    assert result.as_numpy("score").tolist() == [expected["score"]]
    assert texts(result, "top_k_labels") == [entry["label"] for entry in expected["top_k"]]
    assert result.as_numpy("top_k_scores").tolist() == [entry["score"] for entry in expected["top_k"]]
    assert json.loads(texts(result, "result")[0]) == expected


def test_health_and_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata()["name"] == "inferq"
    assert client.is_model_ready("digits") and client.is_model_ready("langid")
    assert client.is_model_ready("digits", model_version="1")
    assert not client.is_model_ready("fragile")  # configured, but no worker serves it
    assert not client.is_model_ready("nope")
    digits = client.get_model_metadata("digits")
    assert digits["name"] == "digits" and digits["versions"] == ["1"]
    assert digits["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [1]}]
    assert [output["name"] for output in digits["outputs"]] == CLASSIFIER_OUTPUTS
    assert client.get_model_metadata("slow")["inputs"] == [{"name": "tensor", "datatype": "FP32", "shape": [2]}]
    assert [o["name"] for o in client.get_model_metadata("slow")["outputs"]] == ["output", "result"]
    assert client.get_model_metadata("langid")["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [1]}]


def test_digits_image_as_bytes_equals_v1(
    v2_stack: Stack, client: triton.InferenceServerClient, digits_heldout: tuple[Any, Any]
) -> None:
    pngs, labels = digits_heldout
    for png, label in zip(pngs[:4], labels[:4], strict=True):
        expected = v1_result(v2_stack, "digits", files={"file": ("d.png", png, "image/png")})
        result = client.infer("digits", [bytes_input("image", png)], outputs=outputs(CLASSIFIER_OUTPUTS))
        assert_classification(result, expected)
        assert texts(result, "label") == [label]
        # No outputs named: all of them, binary (tritonclient asks for binary_data_output).
        every = client.infer("digits", [bytes_input("image", png)])
        assert [o["name"] for o in every.get_response()["outputs"]] == CLASSIFIER_OUTPUTS
        assert_classification(every, expected)


def test_tensor_model_binary_and_json_equal_v1(v2_stack: Stack, client: triton.InferenceServerClient) -> None:
    values = [0.5, -1.25]
    expected = v1_result(v2_stack, "slow", json={"inputs": values})
    assert expected == {"output": values}
    for binary in (True, False):
        tensor = triton.InferInput("tensor", [2], "FP32")
        tensor.set_data_from_numpy(np.array(values, dtype=np.float32), binary_data=binary)
        result = client.infer("slow", [tensor], outputs=outputs(["output", "result"], binary))
        assert result.as_numpy("output").tolist() == values
        assert json.loads(texts(result, "result")[0]) == expected
        assert result.get_response()["parameters"]["job_id"]
    # A batch axis of 1 is taken and echoed on the outputs.
    batched = triton.InferInput("tensor", [1, 2], "FP32")
    batched.set_data_from_numpy(np.array([values], dtype=np.float32))
    result = client.infer("slow", [batched], outputs=outputs(["output"]), request_id="req-7")
    assert result.as_numpy("output").tolist() == [values]
    assert result.get_response()["id"] == "req-7"


def test_langid_text_as_bytes_equals_v1(v2_stack: Stack, client: triton.InferenceServerClient) -> None:
    labels = []
    for text in TEXTS:
        expected = v1_result(v2_stack, "langid", json={"inputs": text})
        for binary in (True, False):
            result = client.infer(
                "langid", [bytes_input("text", text.encode(), binary)], outputs=outputs(CLASSIFIER_OUTPUTS, binary)
            )
            assert_classification(result, expected)
        labels.append(expected["label"])
    assert labels == ["de", "en"]


def test_errors_are_the_protocols_flat_body(v2_stack: Stack, client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as unknown:
        client.infer("nope", [bytes_input("image", b"x")])
    assert unknown.value.status() == "404"
    assert "no model 'nope'" in str(unknown.value)  # printable: the message is a string
    with pytest.raises(InferenceServerException) as wrong_name:
        client.infer("digits", [bytes_input("picture", b"x")])
    assert wrong_name.value.status() == "422"
    assert "model digits takes one input, 'image' (BYTES, shape [1])" in wrong_name.value.message()
    with pytest.raises(InferenceServerException) as not_image:
        client.infer("digits", [bytes_input("image", b"not an image")])
    assert not_image.value.status() == "415"
    assert "not a decodable image" in not_image.value.message()
    with pytest.raises(InferenceServerException) as wrong_shape:
        tensor = triton.InferInput("tensor", [3], "FP32")
        tensor.set_data_from_numpy(np.zeros(3, dtype=np.float32))
        client.infer("slow", [tensor])
    assert wrong_shape.value.status() == "422" and "shape [3]" in wrong_shape.value.message()
    with pytest.raises(InferenceServerException) as no_output:
        client.infer("slow", [_tensor([1.0, 2.0])], outputs=outputs(["label"]))
    assert "has no output 'label'" in no_output.value.message()
    response = httpx.post(f"{v2_stack.base}/v2/models/digits/infer", content=b"{", timeout=10)
    assert response.status_code == 422
    assert set(response.json()) == {"error"} and isinstance(response.json()["error"], str)
    assert httpx.get(f"{v2_stack.base}/v2/models/digits/versions/2", timeout=10).json() == {
        "error": "model digits has no version '2' (it has: 1)"
    }
    # /v1 keeps its nested body.
    assert httpx.get(f"{v2_stack.base}/v1/models/nope", timeout=10).json()["error"]["code"] == "not_found"


def _tensor(values: list[float]) -> triton.InferInput:
    tensor = triton.InferInput("tensor", [len(values)], "FP32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.float32))
    return tensor


def _request(values: list[float]) -> tuple[bytes, dict[str, str]]:
    body, json_size = triton.InferenceServerClient.generate_request_body([_tensor(values)])
    return body, {"Inference-Header-Content-Length": str(json_size)}


def test_respond_async_answers_202_and_the_job_is_read_through_v1(v2_stack: Stack) -> None:
    body, headers = _request([3.0, 4.0])
    response = httpx.post(
        f"{v2_stack.base}/v2/models/slow/infer",
        content=body,
        headers={**headers, "Prefer": "respond-async"},
        timeout=10,
    )
    assert response.status_code == 202
    job_id = response.json()["id"]
    assert response.json()["enqueued_at"] == response.json()["created_at"] is not None
    assert response.headers["location"] == f"{v2_stack.base}/v1/jobs/{job_id}"
    assert response.headers["preference-applied"] == "respond-async"
    view = httpx.get(response.headers["location"], params={"wait": 30}, timeout=40).json()
    assert view["status"] == "finished" and view["result"] == {"output": [3.0, 4.0]}


def test_an_unfinished_job_is_a_clear_error_with_its_id_and_stays_queued(v2_stack: Stack) -> None:
    body, headers = _request([5.0, 6.0])
    response = httpx.post(
        f"{v2_stack.base}/v2/models/fragile/infer", content=body, headers={**headers, "Prefer": "wait=0.5"}, timeout=10
    )
    assert response.status_code == 504
    error = response.json()
    job_id = error["job_id"]
    assert error["error"].startswith(f"job {job_id} is still queued after 0.5 s")
    assert response.headers["location"] == f"{v2_stack.base}/v1/jobs/{job_id}"
    # An ordinary RQ job on the model's queue, as rq info lists it.
    redis = v2_stack.redis()
    try:
        assert job_id in JSONQueue(keys.queue_name("fragile"), connection=redis).job_ids
    finally:
        redis.close()
    assert httpx.get(response.headers["location"], timeout=10).json()["status"] == "queued"


def test_an_idempotency_key_makes_one_job(v2_stack: Stack) -> None:
    body, headers = _request([7.0, 8.0])
    ids = set()
    for _ in range(2):
        response = httpx.post(
            f"{v2_stack.base}/v2/models/slow/infer",
            content=body,
            headers={**headers, "Idempotency-Key": "v2-once"},
            timeout=60,
        )
        assert response.status_code == 200
        ids.add(
            triton.InferenceServerClient.parse_response_body(
                response.content, header_length=int(response.headers["inference-header-content-length"])
            ).get_response()["parameters"]["job_id"]
        )
    assert len(ids) == 1
